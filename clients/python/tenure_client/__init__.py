"""Python client of the Tenure team service.

from tenure_client import Tenure
with Tenure("http://127.0.0.1:8000", api_key="tnr_...") as tenure:
    print(tenure.recall("how do we cache sessions?", scopes=["project:payments"]).injection.text)
"""

from tenure_client import models
from tenure_client.client import AsyncTenure, Tenure, chunked
from tenure_client.errors import (
    AuthenticationFailed,
    BadRequest,
    Conflict,
    ConnectionFailed,
    IncompleteAnswer,
    NotFound,
    PermissionDenied,
    RateLimited,
    RequestTimeout,
    ServiceUnavailable,
    TenureError,
    UnexpectedAnswer,
)

__all__ = [
    "AsyncTenure",
    "AuthenticationFailed",
    "BadRequest",
    "Conflict",
    "ConnectionFailed",
    "IncompleteAnswer",
    "NotFound",
    "PermissionDenied",
    "RateLimited",
    "RequestTimeout",
    "ServiceUnavailable",
    "Tenure",
    "TenureError",
    "UnexpectedAnswer",
    "chunked",
    "models",
]
