"""`kvscope serve`: the collector plus a read-only HTTP API and live dashboard in one process.

`service` runs both on one ClickHouse client; `app` is the HTTP side, `api` what it
answers, `static/` the dashboard; `state` and `access` let `kvscope query`/`report` read
through a live serve; `remote` is their HTTP client.
"""
