"""Every problem code of docs/problems.md as an exception class, under five bases.

    ToolexecError
    ├── ApiError              the service answered a problem (code, detail, status, request_id)
    │   ├── InvalidRequestError   400, 408, 413, 415, 422: fix the request
    │   ├── AuthError             401, 403
    │   ├── NotFoundError         404, 405
    │   ├── ConflictError         409: the state forbids it; never retried
    │   └── UnavailableError      429, 500, 502, 503: retried where safe (toolexec.Retry)
    ├── ConnectionFailed      no answer (refused, reset, timed out) after the retries
    └── DeadlineExceeded      the retries' total deadline passed

A tool that fails is not an exception: it is a CallResult with `is_error` set.
"""
from __future__ import annotations

from typing import Any


class ToolexecError(Exception):
    """Anything this client raises."""


class ConnectionFailed(ToolexecError):
    """The service could not be reached, or the connection broke, and retrying did not help."""


class DeadlineExceeded(ToolexecError):
    """The total deadline of a request (with its retries) passed."""


class ApiError(ToolexecError):
    """The service answered `application/problem+json`."""

    code: str = ""

    def __init__(
        self,
        code: str,
        detail: str,
        status: int,
        request_id: str | None = None,
        title: str = "",
        retry_after: float | None = None,
        problem: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {detail}" + (f" (request {request_id})" if request_id else ""))
        self.code = code
        self.detail = detail
        self.status = status
        self.request_id = request_id
        self.title = title
        self.retry_after = retry_after
        self.problem = problem or {}


class InvalidRequestError(ApiError):
    """The request is malformed or refused as it is (400, 408, 413, 415, 422)."""


class AuthError(ApiError):
    """No valid API key, or a request from somewhere the service does not admit (401, 403)."""


class NotFoundError(ApiError):
    """No such session, invocation, tool or endpoint for this tenant (404, 405)."""


class ConflictError(ApiError):
    """The state forbids it (409). Never retried: sending it again cannot change the answer."""


class UnavailableError(ApiError):
    """The service cannot serve it now (429, 500, 502, 503); `retry_after` says when to try again."""


class MalformedJson(InvalidRequestError):
    """`malformed_json` (400): Malformed JSON."""

    code = "malformed_json"

class InvalidQuery(InvalidRequestError):
    """`invalid_query` (400): Invalid query parameter."""

    code = "invalid_query"

class UnreadableBody(InvalidRequestError):
    """`unreadable_body` (400): Unreadable body."""

    code = "unreadable_body"

class Unauthorized(AuthError):
    """`unauthorized` (401): Unauthorized."""

    code = "unauthorized"

class Forbidden(AuthError):
    """`forbidden` (403): Forbidden."""

    code = "forbidden"

class NotFound(NotFoundError):
    """`not_found` (404): Not found."""

    code = "not_found"

class NoRoute(NotFoundError):
    """`no_route` (404): No such endpoint."""

    code = "no_route"

class MethodNotAllowed(NotFoundError):
    """`method_not_allowed` (405): Method not allowed."""

    code = "method_not_allowed"

class RequestTimeout(InvalidRequestError):
    """`request_timeout` (408): Request timeout."""

    code = "request_timeout"

class CallIdReused(ConflictError):
    """`call_id_reused` (409): Call id reused."""

    code = "call_id_reused"

class SessionClosed(ConflictError):
    """`session_closed` (409): Session closed."""

    code = "session_closed"

class NotRunningHere(ConflictError):
    """`not_running_here` (409): Not running on this node."""

    code = "not_running_here"

class Unrestorable(ConflictError):
    """`unrestorable` (409): Not restorable from the log."""

    code = "unrestorable"

class ContentNotRecorded(ConflictError):
    """`content_not_recorded` (409): Content not recorded."""

    code = "content_not_recorded"

class StateTooLarge(ConflictError):
    """`state_too_large` (409): State too large to rebuild."""

    code = "state_too_large"

class ReplayRunning(ConflictError):
    """`replay_running` (409): A replay is running in this session."""

    code = "replay_running"

class AlreadyDecided(ConflictError):
    """`already_decided` (409): Already decided."""

    code = "already_decided"

class TooManyOpenSessions(ConflictError):
    """`too_many_open_sessions` (409): Too many open sessions."""

    code = "too_many_open_sessions"

class ArchiveNotApplied(ConflictError):
    """`archive_not_applied` (409): Archive not applied."""

    code = "archive_not_applied"

class ArchiveTooLarge(InvalidRequestError):
    """`archive_too_large` (413): Archive too large."""

    code = "archive_too_large"

class BodyTooLarge(InvalidRequestError):
    """`body_too_large` (413): Body too large."""

    code = "body_too_large"

class UnsupportedMediaType(InvalidRequestError):
    """`unsupported_media_type` (415): Unsupported media type."""

    code = "unsupported_media_type"

class InvalidRequest(InvalidRequestError):
    """`invalid_request` (422): Invalid request."""

    code = "invalid_request"

class EmptyBatch(InvalidRequestError):
    """`empty_batch` (422): Empty batch."""

    code = "empty_batch"

class BatchTooLarge(InvalidRequestError):
    """`batch_too_large` (422): Batch too large."""

    code = "batch_too_large"

class InvalidCallId(InvalidRequestError):
    """`invalid_call_id` (422): Invalid call id."""

    code = "invalid_call_id"

class InvalidToolName(InvalidRequestError):
    """`invalid_tool_name` (422): Invalid tool name."""

    code = "invalid_tool_name"

class InvalidMetadata(InvalidRequestError):
    """`invalid_metadata` (422): Invalid metadata."""

    code = "invalid_metadata"

class InvalidEnv(InvalidRequestError):
    """`invalid_env` (422): Invalid environment."""

    code = "invalid_env"

class UnknownTool(InvalidRequestError):
    """`unknown_tool` (422): Unknown tool."""

    code = "unknown_tool"

class PolicyAboveCeiling(InvalidRequestError):
    """`policy_above_ceiling` (422): Policy above the operator's ceiling."""

    code = "policy_above_ceiling"

class SeqOutOfRange(InvalidRequestError):
    """`seq_out_of_range` (422): Seq out of range."""

    code = "seq_out_of_range"

class PolicyNotTighter(InvalidRequestError):
    """`policy_not_tighter` (422): Policy not tighter."""

    code = "policy_not_tighter"

class TooManyFiles(InvalidRequestError):
    """`too_many_files` (422): Too many seed files."""

    code = "too_many_files"

class InvalidSeedFile(InvalidRequestError):
    """`invalid_seed_file` (422): Invalid seed file."""

    code = "invalid_seed_file"

class InvalidArchive(InvalidRequestError):
    """`invalid_archive` (422): Invalid archive."""

    code = "invalid_archive"

class ImageNotAllowed(InvalidRequestError):
    """`image_not_allowed` (422): Image not allowed."""

    code = "image_not_allowed"

class ImageNotFound(InvalidRequestError):
    """`image_not_found` (422): Image not found."""

    code = "image_not_found"

class ImageWrongPlatform(InvalidRequestError):
    """`image_wrong_platform` (422): Image for another platform."""

    code = "image_wrong_platform"

class ImageTooLarge(InvalidRequestError):
    """`image_too_large` (422): Image too large."""

    code = "image_too_large"

class InvalidImage(InvalidRequestError):
    """`invalid_image` (422): Invalid image."""

    code = "invalid_image"

class RateLimited(UnavailableError):
    """`rate_limited` (429): Rate limited."""

    code = "rate_limited"

class TooManyAuthFailures(UnavailableError):
    """`too_many_auth_failures` (429): Too many failed authentications."""

    code = "too_many_auth_failures"

class TooManyConcurrent(UnavailableError):
    """`too_many_concurrent` (429): Too many at once."""

    code = "too_many_concurrent"

class Internal(UnavailableError):
    """`internal` (500): Internal error."""

    code = "internal"

class RegistryUnauthorized(UnavailableError):
    """`registry_unauthorized` (502): Registry refused the pull."""

    code = "registry_unauthorized"

class RegistryUnreachable(UnavailableError):
    """`registry_unreachable` (502): Registry unreachable."""

    code = "registry_unreachable"

class Unavailable(UnavailableError):
    """`unavailable` (503): Unavailable."""

    code = "unavailable"

class StillRunning(UnavailableError):
    """`still_running` (503): Still running."""

    code = "still_running"

class Overloaded(UnavailableError):
    """`overloaded` (503): Overloaded."""

    code = "overloaded"

BY_CODE: dict[str, type[ApiError]] = {
    "malformed_json": MalformedJson,
    "invalid_query": InvalidQuery,
    "unreadable_body": UnreadableBody,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "no_route": NoRoute,
    "method_not_allowed": MethodNotAllowed,
    "request_timeout": RequestTimeout,
    "call_id_reused": CallIdReused,
    "session_closed": SessionClosed,
    "not_running_here": NotRunningHere,
    "unrestorable": Unrestorable,
    "content_not_recorded": ContentNotRecorded,
    "state_too_large": StateTooLarge,
    "replay_running": ReplayRunning,
    "already_decided": AlreadyDecided,
    "too_many_open_sessions": TooManyOpenSessions,
    "archive_not_applied": ArchiveNotApplied,
    "archive_too_large": ArchiveTooLarge,
    "body_too_large": BodyTooLarge,
    "unsupported_media_type": UnsupportedMediaType,
    "invalid_request": InvalidRequest,
    "empty_batch": EmptyBatch,
    "batch_too_large": BatchTooLarge,
    "invalid_call_id": InvalidCallId,
    "invalid_tool_name": InvalidToolName,
    "invalid_metadata": InvalidMetadata,
    "invalid_env": InvalidEnv,
    "unknown_tool": UnknownTool,
    "policy_above_ceiling": PolicyAboveCeiling,
    "seq_out_of_range": SeqOutOfRange,
    "policy_not_tighter": PolicyNotTighter,
    "too_many_files": TooManyFiles,
    "invalid_seed_file": InvalidSeedFile,
    "invalid_archive": InvalidArchive,
    "image_not_allowed": ImageNotAllowed,
    "image_not_found": ImageNotFound,
    "image_wrong_platform": ImageWrongPlatform,
    "image_too_large": ImageTooLarge,
    "invalid_image": InvalidImage,
    "rate_limited": RateLimited,
    "too_many_auth_failures": TooManyAuthFailures,
    "too_many_concurrent": TooManyConcurrent,
    "internal": Internal,
    "registry_unauthorized": RegistryUnauthorized,
    "registry_unreachable": RegistryUnreachable,
    "unavailable": Unavailable,
    "still_running": StillRunning,
    "overloaded": Overloaded,
}
_BY_STATUS: dict[int, type[ApiError]] = {
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    405: NotFoundError,
    409: ConflictError,
    429: UnavailableError,
}


def from_problem(
    status: int, body: Any, request_id: str | None, retry_after: float | None
) -> ApiError:
    """The exception for a problem answer (or for any other non-2xx answer)."""
    problem = body if isinstance(body, dict) else {}
    code = str(problem.get("code") or "")
    cls = BY_CODE.get(code)
    if cls is None:
        cls = _BY_STATUS.get(status) or (
            UnavailableError if status >= 500 else InvalidRequestError
        )
    detail = str(problem.get("detail") or (body if isinstance(body, str) else "") or "")
    return cls(
        code or f"http_{status}",
        detail,
        status,
        request_id=request_id,
        title=str(problem.get("title") or ""),
        retry_after=retry_after,
        problem=problem,
    )
