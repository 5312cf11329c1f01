/** Anything this client throws. */
export class ToolexecError extends Error {
    name = "ToolexecError";
}
/** The service could not be reached, or the connection broke, and retrying did not help. */
export class ConnectionFailed extends ToolexecError {
    name = "ConnectionFailed";
}
/** The total deadline of a request (with its retries) passed. */
export class DeadlineExceeded extends ToolexecError {
    name = "DeadlineExceeded";
}
/** The service answered `application/problem+json`. */
export class ApiError extends ToolexecError {
    static code = "";
    code;
    detail;
    status;
    requestId;
    title;
    retryAfter;
    problem;
    constructor(init) {
        super(`${init.status} ${init.code}: ${init.detail}${init.requestId ? ` (request ${init.requestId})` : ""}`);
        this.name = new.target.name;
        this.code = init.code;
        this.detail = init.detail;
        this.status = init.status;
        this.requestId = init.requestId ?? null;
        this.title = init.title ?? "";
        this.retryAfter = init.retryAfter ?? null;
        this.problem = init.problem ?? {};
    }
}
/** The request is malformed or refused as it is (400, 408, 413, 415, 422). */
export class InvalidRequestError extends ApiError {
}
/** No valid API key, or a request from somewhere the service does not admit (401, 403). */
export class AuthError extends ApiError {
}
/** No such session, invocation, tool or endpoint for this tenant (404, 405). */
export class NotFoundError extends ApiError {
}
/** The state forbids it (409). Never retried. */
export class ConflictError extends ApiError {
}
/** The service cannot serve it now (429, 500, 502, 503); `retryAfter` says when to try again. */
export class UnavailableError extends ApiError {
}
/** `malformed_json` (400): Malformed JSON. */
export class MalformedJson extends InvalidRequestError {
    static code = "malformed_json";
}
/** `invalid_query` (400): Invalid query parameter. */
export class InvalidQuery extends InvalidRequestError {
    static code = "invalid_query";
}
/** `unreadable_body` (400): Unreadable body. */
export class UnreadableBody extends InvalidRequestError {
    static code = "unreadable_body";
}
/** `unauthorized` (401): Unauthorized. */
export class Unauthorized extends AuthError {
    static code = "unauthorized";
}
/** `forbidden` (403): Forbidden. */
export class Forbidden extends AuthError {
    static code = "forbidden";
}
/** `not_found` (404): Not found. */
export class NotFound extends NotFoundError {
    static code = "not_found";
}
/** `no_route` (404): No such endpoint. */
export class NoRoute extends NotFoundError {
    static code = "no_route";
}
/** `method_not_allowed` (405): Method not allowed. */
export class MethodNotAllowed extends NotFoundError {
    static code = "method_not_allowed";
}
/** `request_timeout` (408): Request timeout. */
export class RequestTimeout extends InvalidRequestError {
    static code = "request_timeout";
}
/** `call_id_reused` (409): Call id reused. */
export class CallIdReused extends ConflictError {
    static code = "call_id_reused";
}
/** `session_closed` (409): Session closed. */
export class SessionClosed extends ConflictError {
    static code = "session_closed";
}
/** `not_running_here` (409): Not running on this node. */
export class NotRunningHere extends ConflictError {
    static code = "not_running_here";
}
/** `unrestorable` (409): Not restorable from the log. */
export class Unrestorable extends ConflictError {
    static code = "unrestorable";
}
/** `content_not_recorded` (409): Content not recorded. */
export class ContentNotRecorded extends ConflictError {
    static code = "content_not_recorded";
}
/** `state_too_large` (409): State too large to rebuild. */
export class StateTooLarge extends ConflictError {
    static code = "state_too_large";
}
/** `replay_running` (409): A replay is running in this session. */
export class ReplayRunning extends ConflictError {
    static code = "replay_running";
}
/** `already_decided` (409): Already decided. */
export class AlreadyDecided extends ConflictError {
    static code = "already_decided";
}
/** `too_many_open_sessions` (409): Too many open sessions. */
export class TooManyOpenSessions extends ConflictError {
    static code = "too_many_open_sessions";
}
/** `archive_not_applied` (409): Archive not applied. */
export class ArchiveNotApplied extends ConflictError {
    static code = "archive_not_applied";
}
/** `archive_too_large` (413): Archive too large. */
export class ArchiveTooLarge extends InvalidRequestError {
    static code = "archive_too_large";
}
/** `body_too_large` (413): Body too large. */
export class BodyTooLarge extends InvalidRequestError {
    static code = "body_too_large";
}
/** `unsupported_media_type` (415): Unsupported media type. */
export class UnsupportedMediaType extends InvalidRequestError {
    static code = "unsupported_media_type";
}
/** `invalid_request` (422): Invalid request. */
export class InvalidRequest extends InvalidRequestError {
    static code = "invalid_request";
}
/** `empty_batch` (422): Empty batch. */
export class EmptyBatch extends InvalidRequestError {
    static code = "empty_batch";
}
/** `batch_too_large` (422): Batch too large. */
export class BatchTooLarge extends InvalidRequestError {
    static code = "batch_too_large";
}
/** `invalid_call_id` (422): Invalid call id. */
export class InvalidCallId extends InvalidRequestError {
    static code = "invalid_call_id";
}
/** `invalid_tool_name` (422): Invalid tool name. */
export class InvalidToolName extends InvalidRequestError {
    static code = "invalid_tool_name";
}
/** `invalid_metadata` (422): Invalid metadata. */
export class InvalidMetadata extends InvalidRequestError {
    static code = "invalid_metadata";
}
/** `invalid_env` (422): Invalid environment. */
export class InvalidEnv extends InvalidRequestError {
    static code = "invalid_env";
}
/** `unknown_tool` (422): Unknown tool. */
export class UnknownTool extends InvalidRequestError {
    static code = "unknown_tool";
}
/** `policy_above_ceiling` (422): Policy above the operator's ceiling. */
export class PolicyAboveCeiling extends InvalidRequestError {
    static code = "policy_above_ceiling";
}
/** `seq_out_of_range` (422): Seq out of range. */
export class SeqOutOfRange extends InvalidRequestError {
    static code = "seq_out_of_range";
}
/** `policy_not_tighter` (422): Policy not tighter. */
export class PolicyNotTighter extends InvalidRequestError {
    static code = "policy_not_tighter";
}
/** `too_many_files` (422): Too many seed files. */
export class TooManyFiles extends InvalidRequestError {
    static code = "too_many_files";
}
/** `invalid_seed_file` (422): Invalid seed file. */
export class InvalidSeedFile extends InvalidRequestError {
    static code = "invalid_seed_file";
}
/** `invalid_archive` (422): Invalid archive. */
export class InvalidArchive extends InvalidRequestError {
    static code = "invalid_archive";
}
/** `image_not_allowed` (422): Image not allowed. */
export class ImageNotAllowed extends InvalidRequestError {
    static code = "image_not_allowed";
}
/** `image_not_found` (422): Image not found. */
export class ImageNotFound extends InvalidRequestError {
    static code = "image_not_found";
}
/** `image_wrong_platform` (422): Image for another platform. */
export class ImageWrongPlatform extends InvalidRequestError {
    static code = "image_wrong_platform";
}
/** `image_too_large` (422): Image too large. */
export class ImageTooLarge extends InvalidRequestError {
    static code = "image_too_large";
}
/** `invalid_image` (422): Invalid image. */
export class InvalidImage extends InvalidRequestError {
    static code = "invalid_image";
}
/** `rate_limited` (429): Rate limited. */
export class RateLimited extends UnavailableError {
    static code = "rate_limited";
}
/** `too_many_auth_failures` (429): Too many failed authentications. */
export class TooManyAuthFailures extends UnavailableError {
    static code = "too_many_auth_failures";
}
/** `too_many_concurrent` (429): Too many at once. */
export class TooManyConcurrent extends UnavailableError {
    static code = "too_many_concurrent";
}
/** `internal` (500): Internal error. */
export class Internal extends UnavailableError {
    static code = "internal";
}
/** `registry_unauthorized` (502): Registry refused the pull. */
export class RegistryUnauthorized extends UnavailableError {
    static code = "registry_unauthorized";
}
/** `registry_unreachable` (502): Registry unreachable. */
export class RegistryUnreachable extends UnavailableError {
    static code = "registry_unreachable";
}
/** `unavailable` (503): Unavailable. */
export class Unavailable extends UnavailableError {
    static code = "unavailable";
}
/** `still_running` (503): Still running. */
export class StillRunning extends UnavailableError {
    static code = "still_running";
}
/** `overloaded` (503): Overloaded. */
export class Overloaded extends UnavailableError {
    static code = "overloaded";
}
/** Each problem code's class. */
export const BY_CODE = {
    malformed_json: MalformedJson,
    invalid_query: InvalidQuery,
    unreadable_body: UnreadableBody,
    unauthorized: Unauthorized,
    forbidden: Forbidden,
    not_found: NotFound,
    no_route: NoRoute,
    method_not_allowed: MethodNotAllowed,
    request_timeout: RequestTimeout,
    call_id_reused: CallIdReused,
    session_closed: SessionClosed,
    not_running_here: NotRunningHere,
    unrestorable: Unrestorable,
    content_not_recorded: ContentNotRecorded,
    state_too_large: StateTooLarge,
    replay_running: ReplayRunning,
    already_decided: AlreadyDecided,
    too_many_open_sessions: TooManyOpenSessions,
    archive_not_applied: ArchiveNotApplied,
    archive_too_large: ArchiveTooLarge,
    body_too_large: BodyTooLarge,
    unsupported_media_type: UnsupportedMediaType,
    invalid_request: InvalidRequest,
    empty_batch: EmptyBatch,
    batch_too_large: BatchTooLarge,
    invalid_call_id: InvalidCallId,
    invalid_tool_name: InvalidToolName,
    invalid_metadata: InvalidMetadata,
    invalid_env: InvalidEnv,
    unknown_tool: UnknownTool,
    policy_above_ceiling: PolicyAboveCeiling,
    seq_out_of_range: SeqOutOfRange,
    policy_not_tighter: PolicyNotTighter,
    too_many_files: TooManyFiles,
    invalid_seed_file: InvalidSeedFile,
    invalid_archive: InvalidArchive,
    image_not_allowed: ImageNotAllowed,
    image_not_found: ImageNotFound,
    image_wrong_platform: ImageWrongPlatform,
    image_too_large: ImageTooLarge,
    invalid_image: InvalidImage,
    rate_limited: RateLimited,
    too_many_auth_failures: TooManyAuthFailures,
    too_many_concurrent: TooManyConcurrent,
    internal: Internal,
    registry_unauthorized: RegistryUnauthorized,
    registry_unreachable: RegistryUnreachable,
    unavailable: Unavailable,
    still_running: StillRunning,
    overloaded: Overloaded,
};
const BY_STATUS = {
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    405: NotFoundError,
    409: ConflictError,
    429: UnavailableError,
};
/** The error for a problem answer (or any other non-2xx answer). */
export function fromProblem(status, body, requestId, retryAfter) {
    const problem = (body && typeof body === "object" ? body : {});
    const code = typeof problem.code === "string" ? problem.code : "";
    const cls = BY_CODE[code] ??
        BY_STATUS[status] ??
        (status >= 500 ? UnavailableError : InvalidRequestError);
    const detail = typeof problem.detail === "string" ? problem.detail : typeof body === "string" ? body : "";
    return new cls({
        code: code || `http_${status}`,
        detail,
        status,
        requestId,
        title: typeof problem.title === "string" ? problem.title : "",
        retryAfter,
        problem,
    });
}
//# sourceMappingURL=errors.js.map