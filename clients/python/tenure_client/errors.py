"""Every failure the client reports is a :class:`TenureError`.

An API error keeps what the server said (``code``, ``message``, ``details``, ``request_id``, the
HTTP ``status``); a connection failure names the URL it could not reach. Subclasses by status let a
caller catch exactly what it can handle.
"""

from __future__ import annotations

from typing import Any

import httpx


class TenureError(Exception):
    """Base of every error raised by the client."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "client_error",
        status: int | None = None,
        details: Any = None,
        request_id: str | None = None,
        retry_after_s: float | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.details = details
        self.request_id = request_id
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        where = f" (request {self.request_id})" if self.request_id else ""
        status = f"{self.status} " if self.status else ""
        return f"{status}{self.code}: {self.message}{where}"

    def to_dict(self) -> dict[str, Any]:
        """The service's error shape, for tools that print errors as JSON."""
        return {
            "error": {
                "code": self.code,
                "message": self.message,
                "details": self.details,
                "request_id": self.request_id,
            }
        }


class ConnectionFailed(TenureError):
    """The server could not be reached (refused, DNS, timeout): ``url`` says where."""

    def __init__(self, url: str, reason: str):
        super().__init__(f"cannot reach {url}: {reason}", code="connection_error")
        self.url = url


class IncompleteAnswer(ConnectionFailed):
    """A streamed answer (a JSONL export) was cut off part-way: the server failed after it had
    started answering (a store outage mid-export) or the connection broke. What arrived before is
    incomplete; ``lines`` says how much of it there was."""

    def __init__(self, url: str, reason: str, lines: int):
        TenureError.__init__(
            self,
            f"the answer from {url} was cut off after {lines} lines: {reason} (what arrived is incomplete)",
            code="incomplete_answer",
        )
        self.url = url
        self.lines = lines


class UnexpectedAnswer(TenureError):
    """An answer that is not the API's: a redirect (a TLS proxy's from ``http://`` to
    ``https://``; the client follows none, so a credential never goes where the caller did not
    send it) or a success whose body the client cannot read (a web page: the base URL reaches
    another server). ``url`` is the request's, ``details["location"]`` a redirect's target."""

    def __init__(self, url: str, message: str, *, status: int | None = None, details: Any = None):
        super().__init__(message, code="unexpected_answer", status=status, details=details)
        self.url = url


class BadRequest(TenureError):
    """400 / 405 / 413 / 422 (any other 4xx): the request itself is wrong; ``details`` carries
    field paths."""


class AuthenticationFailed(TenureError):
    """401: missing, malformed, expired or revoked credentials."""


class PermissionDenied(TenureError):
    """403: the credential lacks the role or grant."""


class NotFound(TenureError):
    """404: missing, or not visible to this credential (the two are indistinguishable)."""


class Conflict(TenureError):
    """409: conflicts with the current state (e.g. the id exists)."""


class RateLimited(TenureError):
    """429: the credential's budget is spent; ``retry_after_s`` says for how long."""


class RequestTimeout(TenureError):
    """408: the request's headers or body did not reach the server in time (a stalled network, a
    slow upload), and it closed the connection. The server did nothing with it (the API's routes
    act only on a whole request; RFC 9110 lets a client repeat it), so the client sends it again,
    whatever it is, within ``max_retries``; this is raised once they are spent."""


class ServiceUnavailable(TenureError):
    """5xx: a backing store or the model upstream is unavailable."""


_BY_STATUS: dict[int, type[TenureError]] = {
    401: AuthenticationFailed,
    403: PermissionDenied,
    404: NotFound,
    408: RequestTimeout,
    409: Conflict,
    429: RateLimited,
}


def retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def from_response(response: httpx.Response) -> TenureError:
    """The error a failed response stands for (the service's shape, or the OpenAI one)."""
    try:
        payload = response.json()
    except ValueError:
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code") or error.get("type") or "http_error")
        message = str(error.get("message") or response.reason_phrase)
        details = error.get("details")
        request_id = error.get("request_id")
    else:
        code, message, details, request_id = "http_error", response.text[:500] or response.reason_phrase, None, None
    status = response.status_code
    cls = _BY_STATUS.get(status) or (ServiceUnavailable if status >= 500 else BadRequest)
    return cls(
        message,
        code=code,
        status=status,
        details=details,
        request_id=request_id or response.headers.get("x-request-id"),
        retry_after_s=retry_after(response),
    )


def unexpected_answer(response: httpx.Response) -> UnexpectedAnswer:
    """What a redirect, or a success the client cannot read, stands for."""
    try:
        url = str(response.request.url.copy_with(query=None))
    except RuntimeError:  # a response made without its request
        url = "the server"
    status = response.status_code
    location = response.headers.get("location")
    if 300 <= status < 400:
        message = (
            f"{url} answered {status} {response.reason_phrase}, a redirect to {location or 'nowhere'}: the client "
            "follows no redirect; use the base URL the redirect names (https:// behind a TLS proxy)"
        )
        return UnexpectedAnswer(url, message, status=status, details={"location": location})
    kind = response.headers.get("content-type") or "no content type"
    message = f"the answer of {url} ({status}, {kind}) is not the Tenure API's: is the base URL the API's?"
    return UnexpectedAnswer(url, message, status=status)
