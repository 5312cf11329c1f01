"""toolexec: sandboxed, recorded tool execution for LLM agent loops.

    from toolexec import Client
    with Client().session() as s:             # TOOLEXEC_URL, TOOLEXEC_API_KEY
        print(s.shell("ls -la").content)

See clients/python/README.md for the whole surface.
"""
from . import errors, models
from ._client import (
    DEFAULT_URL,
    Approvals,
    AsyncApprovals,
    AsyncClient,
    AsyncSession,
    AsyncTerminal,
    CallResult,
    Client,
    ItemResult,
    Result,
    Session,
    Terminal,
)
from ._retry import NO_RETRY, Retry
from .errors import *  # noqa: F403  (every problem code's class)
from .errors import (
    ApiError,
    AuthError,
    ConflictError,
    ConnectionFailed,
    DeadlineExceeded,
    InvalidRequestError,
    NotFoundError,
    ToolexecError,
    UnavailableError,
)

__version__ = "0.1.0"
"""The client's version: the API's (openapi/openapi.json `info.version`)."""

__all__ = [
    "DEFAULT_URL",
    "NO_RETRY",
    "ApiError",
    "Approvals",
    "AsyncApprovals",
    "AsyncClient",
    "AsyncSession",
    "AsyncTerminal",
    "AuthError",
    "CallResult",
    "ItemResult",
    "Result",
    "Client",
    "ConflictError",
    "ConnectionFailed",
    "DeadlineExceeded",
    "InvalidRequestError",
    "NotFoundError",
    "Retry",
    "Session",
    "Terminal",
    "ToolexecError",
    "UnavailableError",
    "errors",
    "models",
]
