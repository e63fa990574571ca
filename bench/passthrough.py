"""A bare pass-through proxy: the CPU baseline of bench/route_compare.py.

Each request goes to the next engine in turn, its body and answer streamed through
unchanged, through httpx (the baseline issue 46 names: "a bare httpx pass-through"; the
timeout and connection limits `kvscope route` had while it used httpx, no added
`Accept-Encoding`) and `kvscope route`'s server (`kvscope.web.server`: uvicorn on a socket
with TCP_NODELAY). It does no routing work at all, so what `kvscope route` costs beyond it
is the routing and its HTTP client (aiohttp since 2026-11-29, docs/routing.md).

    python bench/passthrough.py --engines URL,URL,... --port P
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from typing import Any

import httpx
from kvscope.route.config import RouteConfig
from kvscope.web.server import listen, serve

HOP_BY_HOP = {b"host", b"content-length", b"connection", b"transfer-encoding"}


def build_app(engines: list[str]) -> Any:
    """A raw ASGI app forwarding every request to `engines` in turn."""
    defaults = RouteConfig  # the router's defaults, read from its config class
    timeout = httpx.Timeout(
        defaults.request_timeout_s, connect=defaults.connect_timeout_s, pool=None
    )
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    client = httpx.AsyncClient(timeout=timeout, limits=limits)
    del client.headers["accept-encoding"]
    turn = itertools.cycle(engines)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = [(k, v) for k, v in scope["headers"] if k not in HOP_BY_HOP]
        request = client.build_request(
            scope["method"], next(turn) + scope["path"], headers=headers, content=body
        )
        answer = await client.send(request, stream=True)
        try:
            kept = [(k, v) for k, v in answer.headers.raw if k.lower() not in HOP_BY_HOP]
            await send({"type": "http.response.start", "status": answer.status_code,
                        "headers": kept})  # fmt: skip
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await answer.aclose()

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", required=True, help="URL,URL,...")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    sock = listen("127.0.0.1", args.port)
    asyncio.run(serve(build_app(args.engines.split(",")), sock, "127.0.0.1"))


if __name__ == "__main__":
    main()
