"""A small ClickHouse HTTP interface in front of chDB, so the server code path runs in CI.

No ClickHouse server installs where kvscope is built, but chDB is the ClickHouse engine.
This front speaks enough of ClickHouse's HTTP protocol for clickhouse-connect's HTTP
client (what kvscope uses for `http(s)://` targets): the query text (URL `query` and/or
the body), `param_*` query parameters, `database`, and every other URL parameter as a
setting (`SET name = 'value'` on a fresh connection, as the server applies URL settings
to the request), including `insert_deduplication_token`. Results come back in the format
the query names, unchanged. An insert whose rows are in the body (`INSERT ... FORMAT X`
in `query`) is the one rewrite: chDB has no request body, so the rows are written to a
temp file and the statement becomes `INSERT ... FROM INFILE 'file' FORMAT X`.

What it does not reproduce is listed in docs/collector.md (a fake only where no real
server can run; the engine behind it is real).
"""

from __future__ import annotations

import http.server
import os
import re
import tempfile
import threading
import urllib.parse
from typing import Any

import chdb

TRANSPORT = {
    "query",
    "database",
    "session_id",
    "session_timeout",
    "session_check",
    "query_id",
    "default_format",
    "wait_end_of_query",
    "send_progress_in_http_headers",
    "http_headers_progress_interval_ms",
    "enable_http_compression",
    "compress",
    "decompress",
    "user",
    "password",
}
"""URL parameters ClickHouse's HTTP handler consumes itself (not query settings)."""
_TRAILING_FORMAT = re.compile(r"\s+FORMAT\s+(\w+)\s*;?\s*$", re.IGNORECASE)
_INLINE_ROWS = re.compile(rb"(?is)(\s*INSERT\b.*?\bFORMAT\s+\w+)[ \t]*\r?\n(.+)")


def _read_body(request: http.server.BaseHTTPRequestHandler) -> bytes:
    """The request body, with or without chunked transfer encoding."""
    if request.headers.get("Transfer-Encoding", "").lower() != "chunked":
        length = int(request.headers.get("Content-Length") or 0)
        return request.rfile.read(length) if length else b""
    chunks = []
    while True:
        size = int(request.rfile.readline().split(b";")[0].strip(), 16)
        if size == 0:
            request.rfile.readline()
            return b"".join(chunks)
        chunks.append(request.rfile.read(size))
        request.rfile.readline()


def _decode(body: bytes, encoding: str) -> bytes:
    """Undo the request's Content-Encoding (clickhouse-connect compresses inserts)."""
    if not encoding or encoding == "identity":
        return body
    if encoding == "lz4":
        import lz4.frame

        return lz4.frame.decompress(body)
    if encoding == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    if encoding in ("gzip", "deflate"):
        import zlib

        return zlib.decompress(body, 47 if encoding == "gzip" else 15)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


class ChdbHttpFront:
    """`with ChdbHttpFront(path) as front:` serves chDB data dir `path` on `front.url`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.requests: list[dict[str, Any]] = []
        """Every request seen: its SQL as run and its settings (tests may inspect them)."""
        self._lock = threading.Lock()
        self._conn: Any = None
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                front.handle(self)

            def do_POST(self) -> None:
                front.handle(self)

            def log_message(self, *args: Any) -> None:
                """Quiet: the test output is not the place for an access log."""

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """`http://127.0.0.1:port` of the front."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ChdbHttpFront:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        if self._conn is not None:
            self._conn.close()

    def _connection(self) -> Any:
        """One chDB connection for every request (opening one per request re-reads the
        whole directory's metadata: seconds per request late in a test session)."""
        if self._conn is None:
            self._conn = chdb.connect(self.path)
        return self._conn

    def handle(self, request: http.server.BaseHTTPRequestHandler) -> None:
        """Run one HTTP request's statement on chDB and answer like ClickHouse does."""
        url = urllib.parse.urlsplit(request.path)
        args = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        try:
            body = _decode(_read_body(request), request.headers.get("Content-Encoding", ""))
            status, fmt, data = 200, *self._run(args, body)
        except Exception as exc:  # the engine's error text goes back as the server's would
            status, fmt, data = 500, "", f"Code: 1000. DB::Exception: {exc}".encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/octet-stream")
        request.send_header("Content-Length", str(len(data)))
        request.send_header("X-ClickHouse-Timezone", "UTC")
        request.send_header("X-ClickHouse-Server-Display-Name", "chdb-http-front")
        if fmt:
            request.send_header("X-ClickHouse-Format", fmt)
        if status != 200:
            request.send_header("X-ClickHouse-Exception-Code", "1000")
        request.end_headers()
        request.wfile.write(data)

    def _run(self, args: dict[str, str], body: bytes) -> tuple[str, bytes]:
        settings = {
            k: v for k, v in args.items() if k not in TRANSPORT and not k.startswith("param_")
        }
        params = {k[len("param_") :]: v for k, v in args.items() if k.startswith("param_")}
        if "query" in args and body:
            sql, rows = args["query"], body
        else:  # the statement in the body, an insert's rows inline after its FORMAT line
            whole = args.get("query", "").encode() + body
            inline = _INLINE_ROWS.match(whole)
            sql, rows = (
                (inline.group(1).decode(), inline.group(2)) if inline else (whole.decode(), b"")
            )
        infile = None
        if rows:
            match = _TRAILING_FORMAT.search(sql)
            assert match, f"an insert with rows in the body must name its format: {sql[:200]}"
            with tempfile.NamedTemporaryFile(suffix=".rows", delete=False) as tmp:
                tmp.write(rows)
                infile = tmp.name
            sql = f"{sql[: match.start()]} FROM INFILE '{infile}' FORMAT {match.group(1)}"
        match = _TRAILING_FORMAT.search(sql)
        fmt = match.group(1) if match else args.get("default_format", "TabSeparated")
        try:
            with self._lock:
                self.requests.append({"sql": sql, "settings": settings})
                conn = self._connection()
                database = args.get("database") or "default"
                conn.query(f"USE `{database.replace('`', '')}`")
                for name in settings:
                    assert re.fullmatch(r"\w+", name), f"bad setting name {name!r}"
                try:
                    for name, value in settings.items():
                        escaped = value.replace("\\", "\\\\").replace("'", "\\'")
                        conn.query(f"SET {name} = '{escaped}'")
                    result = conn.query(sql, fmt, params=params or None)
                    data = bytes(result.bytes()) if result is not None else b""
                finally:  # the settings were this request's only, as on a server
                    for name in settings:
                        conn.query(f"SET {name} = DEFAULT")
        finally:
            if infile is not None:
                os.unlink(infile)
        return ("" if infile else fmt), data
