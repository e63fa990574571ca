"""`post_json` tells an engine's refusal (an HTTP error: it saw the request) from no answer
(a timeout or a closed port: it may still serve the request), for callers that must know
whether a request was served. A real HTTP server on loopback answers each case."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest
from kvscope.collector.errors import EngineError, EngineRefused
from kvscope.local.broker import free_port
from kvscope.local.pd_pair import post_json


class _Handler(http.server.BaseHTTPRequestHandler):
    """Answers /ok with the body it got, /status/N with status N and a reason."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/ok":
            answer, status = body, 200
        else:
            status = int(self.path.rsplit("/", 1)[1])
            answer = json.dumps({"error": f"refused with {status}"}).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        """Quiet: the test reads the answers."""


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_an_answer_is_decoded(server: str) -> None:
    assert post_json(f"{server}/ok", {"prompt": "é", "n": [1, 2]}) == {"prompt": "é", "n": [1, 2]}


@pytest.mark.parametrize("status", [400, 404, 429, 500, 503])
def test_an_http_error_is_a_refusal_with_its_status(server: str, status: int) -> None:
    with pytest.raises(EngineRefused) as raised:
        post_json(f"{server}/status/{status}", {})
    assert raised.value.status == status
    assert f"refused with {status}" in str(raised.value)


def test_no_answer_is_an_engine_error_but_no_refusal() -> None:
    with pytest.raises(EngineError) as raised:
        post_json(f"http://127.0.0.1:{free_port()}/v1/completions", {})
    assert not isinstance(raised.value, EngineRefused)
    assert "unreachable" in str(raised.value)
