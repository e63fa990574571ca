"""Storage administration: the ClickHouse target URL, migrations and the table catalogue."""
