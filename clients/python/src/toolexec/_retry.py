"""Which failures are retried, and how long to wait: one decision, used by both clients.

Retried, with exponential backoff (and the server's `Retry-After` when it sends one), within
one total deadline per request:
- a connection that could not be made (nothing was sent: any request);
- a connection that broke after the request went out, for requests that are safe to send again:
  reads, a session's close, approvals, archive uploads, and tool calls — a call id the service
  has recorded is answered from the record, never run twice;
- 503 `unavailable`/`overloaded` and 429 `rate_limited`/`too_many_concurrent`/`too_many_auth_failures`
  (nothing was run), and 503 `still_running` (the same call ids are sent again: recorded
  results come back, a running call is waited for).
Never retried: a 409 (the state forbids it; sending it again cannot help), a 4xx, a 500.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import httpx2

from .errors import ApiError

_RETRIED_CODES = frozenset(
    {
        "unavailable",
        "overloaded",
        "still_running",
        "rate_limited",
        "too_many_concurrent",
        "too_many_auth_failures",
    }
)


@dataclass(frozen=True)
class Retry:
    """How a request is retried. `deadline` (seconds) bounds a request and all its retries."""

    attempts: int = 8
    backoff: float = 0.2
    max_backoff: float = 10.0
    deadline: float = 1800.0

    def wait(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait before retry number `attempt` (1, 2, …)."""
        delay = min(self.max_backoff, self.backoff * 2.0 ** (attempt - 1))
        delay = delay / 2 + random.random() * delay / 2
        return max(delay, retry_after or 0.0)


NO_RETRY = Retry(attempts=1)


def retryable(error: BaseException, idempotent: bool) -> bool:
    """Whether sending the same request again is safe and may succeed."""
    if isinstance(error, ApiError):
        return error.code in _RETRIED_CODES
    if isinstance(error, (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)):
        return True  # nothing reached the service
    if isinstance(error, httpx2.TransportError):
        return idempotent  # it may have run: only where running twice is impossible
    return False


def retry_after(response: httpx2.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
