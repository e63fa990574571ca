"""`Client`: the part of a clickhouse-connect client kvscope's storage code calls.

A structural type only (no import of clickhouse-connect or pyarrow at run time), so the
modules that take a client can name its type without loading the driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa


class Client(Protocol):
    """A clickhouse-connect client (`HttpClient`, `ChdbClient`) or a wrapper of one."""

    @property
    def database(self) -> str | None:
        """The default database of every query."""

    def command(self, cmd: str, *args: Any, **kwargs: Any) -> Any:
        """Run a statement."""

    def query(self, query: str, *args: Any, **kwargs: Any) -> Any:
        """Run a query; `.result_rows` holds the rows."""

    def query_arrow(self, query: str, *args: Any, **kwargs: Any) -> pa.Table:
        """Run a query; the rows as an Arrow table."""

    def insert(self, table: str, data: Any, *args: Any, **kwargs: Any) -> Any:
        """Insert rows (a sequence of row sequences)."""

    def insert_arrow(self, table: str, arrow_table: pa.Table, *args: Any, **kwargs: Any) -> Any:
        """Insert an Arrow table."""

    def close(self) -> None:
        """Close the connection."""
