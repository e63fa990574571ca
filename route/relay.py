"""The response that relays an engine's answer to the client, and drops the connection
when the engine broke the answer off (Starlette's own would end it cleanly, and a client
would take a cut-off answer for a complete one)."""

from __future__ import annotations

from kvscope.route.proxy import BrokenOff, Opened
from starlette.responses import StreamingResponse
from starlette.types import Send


class Relayed(StreamingResponse):
    """An `Opened` answer, streamed; on `BrokenOff` the response is never completed, so the
    server closes the connection and the client sees an incomplete answer."""

    def __init__(self, opened: Opened) -> None:
        super().__init__(opened.body, opened.status, headers=opened.headers)

    async def stream_response(self, send: Send) -> None:
        """Starlette's, except that a break-off returns without the final empty body."""
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})  # fmt: skip
        try:
            async for chunk in self.body_iterator:
                body = chunk if isinstance(chunk, bytes | memoryview) else chunk.encode()
                await send({"type": "http.response.body", "body": body, "more_body": True})
        except BrokenOff:
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})
