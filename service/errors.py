"""The single error hierarchy. Every failure the service reports carries a stable code.

Services and the storage layer raise these; the HTTP layer renders them once (one JSON shape).
Nothing below the API layer knows about HTTP beyond the status hint each code carries.
"""

from __future__ import annotations

from enum import Enum
from typing import Any


class ErrorCode(str, Enum):
    """Stable machine-readable codes, each with the HTTP status it maps to."""

    VALIDATION_ERROR = "validation_error"
    BAD_REQUEST = "bad_request"  # an HTTP request the server could not parse at all
    REQUEST_TIMEOUT = "request_timeout"  # a request's headers or body did not arrive in time
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"
    FORBIDDEN = "forbidden"
    UNAUTHENTICATED = "unauthenticated"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    RATE_LIMITED = "rate_limited"
    MODEL_NOT_SUPPORTED = "model_not_supported"
    UPSTREAM_ERROR = "upstream_error"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    UPSTREAM_NOT_CONFIGURED = "upstream_not_configured"  # the proxy has no model provider to forward to
    # the upstream's answer passed what the proxy holds of one (TENURE_LOOP_UPSTREAM_MAX_*)
    UPSTREAM_ANSWER_TOO_LARGE = "upstream_answer_too_large"
    STORE_UNAVAILABLE = "store_unavailable"
    INTERNAL = "internal_error"
    # a retry of a turn whose extraction did not fail (pending, running, done, skipped); last, so
    # a plain 409 still maps to ``conflict`` when codes are looked up by status
    TURN_NOT_FAILED = "turn_not_failed"

    @property
    def http_status(self) -> int:
        return _STATUS[self]


_STATUS: dict[ErrorCode, int] = {
    ErrorCode.VALIDATION_ERROR: 422,
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.CONFLICT: 409,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.MODEL_NOT_SUPPORTED: 422,
    ErrorCode.UPSTREAM_ERROR: 502,
    ErrorCode.UPSTREAM_TIMEOUT: 504,
    ErrorCode.UPSTREAM_NOT_CONFIGURED: 503,
    ErrorCode.UPSTREAM_ANSWER_TOO_LARGE: 502,
    ErrorCode.STORE_UNAVAILABLE: 503,
    ErrorCode.INTERNAL: 500,
    ErrorCode.TURN_NOT_FAILED: 409,
}


class TenureError(Exception):
    """Base of every error the service raises on purpose."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, *, details: Any = None, code: ErrorCode | None = None):
        super().__init__(message)
        self.message = message
        self.details = details
        if code is not None:
            self.code = code


class ValidationFailed(TenureError):
    code = ErrorCode.VALIDATION_ERROR


class NotFound(TenureError):
    code = ErrorCode.NOT_FOUND


class Conflict(TenureError):
    code = ErrorCode.CONFLICT


class Unreadable(Conflict):
    """A stored document the current model cannot load (quarantined): reads skip it, a read of
    it by id is this 409, and an admin can list and erase it (``/v1/admin/quarantine``)."""


class Forbidden(TenureError):
    code = ErrorCode.FORBIDDEN


class Unauthenticated(TenureError):
    code = ErrorCode.UNAUTHENTICATED


class InvalidCredential(Unauthenticated):
    """A credential that can never become valid: an unknown key id, a wrong secret, a bad
    signature, an expired or malformed token. Same code and status as any 401 (a client learns
    nothing more); the server may remember it in its negative cache."""


class StoreUnavailable(TenureError):
    """OpenSearch (or Redis) cannot be reached; callers should retry later."""

    code = ErrorCode.STORE_UNAVAILABLE

    def __init__(self, message: str, *, retry_after_s: int = 5, details: Any = None):
        super().__init__(message, details=details)
        self.retry_after_s = retry_after_s


class RateLimited(TenureError):
    """The credential spent its request budget; callers should retry after ``retry_after_s``."""

    code = ErrorCode.RATE_LIMITED

    def __init__(self, message: str, *, retry_after_s: int, details: Any = None):
        super().__init__(message, details=details)
        self.retry_after_s = retry_after_s
