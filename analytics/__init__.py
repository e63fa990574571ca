"""Analytics over the stored tables: the named queries of sql/queries and the report."""
