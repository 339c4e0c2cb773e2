"""uvicorn HTTP protocols that answer an unparseable request in the service's JSON error shape.

A request the HTTP parser itself refuses (a control character in a header value, a space in a
header name, a broken request line) never reaches the ASGI app, so uvicorn answers it with its
own ``text/plain`` 400. These subclasses replace only that answer: same status, same connection
close, but the error body every other failure of that route has (the service's shape; on the
proxy's routes their SDK's, when the request line was read before the fault, which the httptools
parser tells), with code ``bad_request`` and a request id. Served with
``uvicorn --http service.api.http_protocol:JsonErrorHttpProtocol``.

They also keep an idle keep-alive connection open for at least :data:`MIN_KEEP_ALIVE_S`, whatever
``--timeout-keep-alive`` says below that. uvicorn's default, 5 s, equals httpx's idle expiry (the
SDK's, the OpenAI and Anthropic SDKs'): a client that reuses a connection idle for almost 5 s
sends its request just as the server closes it, and the request is lost (``ReadError``, connection
reset) without reaching the app. The server must be the side that waits longer
(docs/operations.md, "Keep-alive").
"""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import urlsplit

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.api.errors import error_body
from service.errors import ErrorCode

REQUEST_ID_HEADER = b"x-request-id"

# Longer than every client's idle expiry we know of (httpx 5 s) and than a load balancer's usual
# 60 s idle timeout, so the client or the balancer always drops an idle connection first.
MIN_KEEP_ALIVE_S = 65


def uvicorn_http_option() -> str:
    """What ``uvicorn --http`` takes to serve with :data:`JsonErrorHttpProtocol`."""
    return f"{__name__}:JsonErrorHttpProtocol"


def keep_alive_s(configured: int) -> int:
    """The idle keep-alive timeout a connection gets: uvicorn's setting, never below the floor."""
    return max(configured, MIN_KEEP_ALIVE_S)


def bad_request_body(message: str, path: str = "") -> tuple[str, bytes]:
    """A fresh request id and the JSON error body for an unparseable request to ``path`` (empty
    when the request line itself could not be read)."""
    request_id = f"req-{uuid.uuid4().hex}"
    message = f"malformed HTTP request: {message}"
    body = error_body(ErrorCode.BAD_REQUEST, message, None, request_id, path=path, status=400)
    return request_id, json.dumps(body).encode()


def _path_of(target: bytes) -> str:
    try:
        return urlsplit(target.decode("latin-1")).path
    except ValueError:
        return ""


class JsonErrorH11Protocol(H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = keep_alive_s(self.timeout_keep_alive)

    def send_400_response(self, msg: str) -> None:
        request_id, body = bad_request_body(msg)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (REQUEST_ID_HEADER, request_id.encode()),
            (b"connection", b"close"),
        ]
        self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers, reason=b"Bad Request")))
        self.transport.write(self.conn.send(h11.Data(data=body)))
        self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools ships with uvicorn[standard]
    JsonErrorHttpProtocol: type = JsonErrorH11Protocol
else:

    class JsonErrorHttpToolsProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.timeout_keep_alive = keep_alive_s(self.timeout_keep_alive)

        def send_400_response(self, msg: str) -> None:
            # the request target as far as the parser got (a header fault comes after it)
            request_id, body = bad_request_body(msg, _path_of(getattr(self, "url", b"") or b""))
            head = [b"HTTP/1.1 400 Bad Request\r\n"]
            for name, value in self.server_state.default_headers:
                head.extend([name, b": ", value, b"\r\n"])
            head.extend(
                [
                    b"content-type: application/json\r\n",
                    b"content-length: " + str(len(body)).encode() + b"\r\n",
                    REQUEST_ID_HEADER + b": " + request_id.encode() + b"\r\n",
                    b"connection: close\r\n\r\n",
                ]
            )
            self.transport.write(b"".join(head) + body)
            self.transport.close()

    JsonErrorHttpProtocol = JsonErrorHttpToolsProtocol
