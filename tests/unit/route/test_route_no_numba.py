"""The router in HTTP-index mode loads no numba (the index's hashing needs it; the router
sends token ids and lets `kvscope index` hash them): building the app and routing a
request (to a closed port) leaves `numba` out of `sys.modules`. In a fresh interpreter, so
modules other tests imported cannot hide a result."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import asyncio, sys
import httpx
from kvscope.local.broker import free_port
from kvscope.route.app import build_app
from kvscope.route.config import EngineSpec, RouteConfig

engines = (EngineSpec("e", f"http://127.0.0.1:{free_port()}"),)
config = RouteConfig(engines=engines, index_url=f"http://127.0.0.1:{free_port()}")
app = build_app(config)

async def main():
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://r") as client:
        answer = await client.post("/v1/completions", json={"model": "m", "prompt": [1, 2]})
        assert answer.status_code == 503, answer.text

asyncio.run(main())
print(sorted(m for m in ("numba", "kvscope.index.hashing", "kvscope.index.state")
             if m in sys.modules))
"""


def test_the_http_index_router_imports_no_numba() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"
