"""Does a connected socket answer as a Kafka broker? One ApiVersions request tells.

Commands check their bootstrap servers before they start; a port of some other service
(an HTTP server, say) accepts the TCP connection and then never answers the Kafka
client, which gives up only after its 40 s request timeout. ApiVersions v0 is the
request every Kafka broker answers first, before any SASL exchange; the request and
its response are aiokafka's own protocol structs.
"""

from __future__ import annotations

import io
import socket
import struct

from aiokafka.protocol.admin import ApiVersionRequest_v0, ApiVersionResponse_v0
from aiokafka.protocol.api import ResponseHeader_v0

CORRELATION_ID = 0x6B76
"""The id the probe's request carries; a broker's response repeats it."""
MAX_RESPONSE_BYTES = 1 << 20
"""An ApiVersions response holds a few dozen API ranges; a larger length is not Kafka."""
ACCEPTED_ERRORS = (0, 35)
"""None, or UNSUPPORTED_VERSION (a broker that has dropped v0 still answers, with its
ranges, in that form)."""
NOT_KAFKA = "its reply is not a Kafka response"
CLOSED = "it closed the connection without a Kafka response"


def request_frame() -> bytes:
    """An ApiVersions v0 request, size-prefixed as on the wire."""
    request = ApiVersionRequest_v0()
    header = request.build_request_header(CORRELATION_ID, "kvscope-check")
    message = header.encode() + request.encode()
    return struct.pack(">i", len(message)) + message


def problem(conn: socket.socket, timeout_s: float) -> str | None:
    """None when the peer of `conn` answers the probe as a Kafka broker, else why not."""
    conn.settimeout(timeout_s)
    try:
        conn.sendall(request_frame())
        size = struct.unpack(">i", _read(conn, 4))[0]
        if not 0 < size <= MAX_RESPONSE_BYTES:
            return NOT_KAFKA
        body = io.BytesIO(_read(conn, size))
    except TimeoutError:
        return f"no Kafka response within {timeout_s:g} s"
    except ConnectionError:  # closed or reset, before or after the request arrived
        return CLOSED
    except OSError as exc:
        return str(exc.strerror or exc)
    try:
        correlation_id = ResponseHeader_v0.decode(body).correlation_id
        error_code = ApiVersionResponse_v0.decode(body).error_code
    except Exception:  # any way a foreign reply fails to parse means the same
        return NOT_KAFKA
    if correlation_id != CORRELATION_ID:
        return NOT_KAFKA
    return None if error_code in ACCEPTED_ERRORS else f"Kafka error code {error_code}"


def _read(conn: socket.socket, n: int) -> bytes:
    """Exactly `n` bytes from `conn` (ConnectionError when the peer closes first)."""
    chunks = []
    while n:
        chunk = conn.recv(n)
        if not chunk:
            raise ConnectionError(CLOSED)
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
