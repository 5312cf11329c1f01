/**
 * Every problem code of docs/problems.md as an error class, under five bases.
 *
 *     ToolexecError
 *     ├── ApiError              the service answered a problem (code, detail, status, requestId)
 *     │   ├── InvalidRequestError   400, 408, 413, 415, 422: fix the request
 *     │   ├── AuthError             401, 403
 *     │   ├── NotFoundError         404, 405
 *     │   ├── ConflictError         409: the state forbids it; never retried
 *     │   └── UnavailableError      429, 500, 502, 503: retried where safe
 *     ├── ConnectionFailed      no answer (refused, reset) after the retries
 *     └── DeadlineExceeded      the retries' total deadline passed
 *
 * A tool that fails is not an error: it is a CallResult with `is_error` set.
 */
import type { ProblemCode } from "./schema.js";
/** Anything this client throws. */
export declare class ToolexecError extends Error {
    name: string;
}
/** The service could not be reached, or the connection broke, and retrying did not help. */
export declare class ConnectionFailed extends ToolexecError {
    name: string;
}
/** The total deadline of a request (with its retries) passed. */
export declare class DeadlineExceeded extends ToolexecError {
    name: string;
}
export interface ProblemInit {
    code: string;
    detail: string;
    status: number;
    requestId?: string | null;
    title?: string;
    retryAfter?: number | null;
    problem?: Record<string, unknown>;
}
/** The service answered `application/problem+json`. */
export declare class ApiError extends ToolexecError {
    static readonly code: string;
    readonly code: string;
    readonly detail: string;
    readonly status: number;
    readonly requestId: string | null;
    readonly title: string;
    readonly retryAfter: number | null;
    readonly problem: Record<string, unknown>;
    constructor(init: ProblemInit);
}
/** The request is malformed or refused as it is (400, 408, 413, 415, 422). */
export declare class InvalidRequestError extends ApiError {
}
/** No valid API key, or a request from somewhere the service does not admit (401, 403). */
export declare class AuthError extends ApiError {
}
/** No such session, invocation, tool or endpoint for this tenant (404, 405). */
export declare class NotFoundError extends ApiError {
}
/** The state forbids it (409). Never retried. */
export declare class ConflictError extends ApiError {
}
/** The service cannot serve it now (429, 500, 502, 503); `retryAfter` says when to try again. */
export declare class UnavailableError extends ApiError {
}
/** `malformed_json` (400): Malformed JSON. */
export declare class MalformedJson extends InvalidRequestError {
    static readonly code = "malformed_json";
}
/** `invalid_query` (400): Invalid query parameter. */
export declare class InvalidQuery extends InvalidRequestError {
    static readonly code = "invalid_query";
}
/** `unreadable_body` (400): Unreadable body. */
export declare class UnreadableBody extends InvalidRequestError {
    static readonly code = "unreadable_body";
}
/** `unauthorized` (401): Unauthorized. */
export declare class Unauthorized extends AuthError {
    static readonly code = "unauthorized";
}
/** `forbidden` (403): Forbidden. */
export declare class Forbidden extends AuthError {
    static readonly code = "forbidden";
}
/** `not_found` (404): Not found. */
export declare class NotFound extends NotFoundError {
    static readonly code = "not_found";
}
/** `no_route` (404): No such endpoint. */
export declare class NoRoute extends NotFoundError {
    static readonly code = "no_route";
}
/** `method_not_allowed` (405): Method not allowed. */
export declare class MethodNotAllowed extends NotFoundError {
    static readonly code = "method_not_allowed";
}
/** `request_timeout` (408): Request timeout. */
export declare class RequestTimeout extends InvalidRequestError {
    static readonly code = "request_timeout";
}
/** `call_id_reused` (409): Call id reused. */
export declare class CallIdReused extends ConflictError {
    static readonly code = "call_id_reused";
}
/** `session_closed` (409): Session closed. */
export declare class SessionClosed extends ConflictError {
    static readonly code = "session_closed";
}
/** `not_running_here` (409): Not running on this node. */
export declare class NotRunningHere extends ConflictError {
    static readonly code = "not_running_here";
}
/** `unrestorable` (409): Not restorable from the log. */
export declare class Unrestorable extends ConflictError {
    static readonly code = "unrestorable";
}
/** `content_not_recorded` (409): Content not recorded. */
export declare class ContentNotRecorded extends ConflictError {
    static readonly code = "content_not_recorded";
}
/** `state_too_large` (409): State too large to rebuild. */
export declare class StateTooLarge extends ConflictError {
    static readonly code = "state_too_large";
}
/** `replay_running` (409): A replay is running in this session. */
export declare class ReplayRunning extends ConflictError {
    static readonly code = "replay_running";
}
/** `already_decided` (409): Already decided. */
export declare class AlreadyDecided extends ConflictError {
    static readonly code = "already_decided";
}
/** `too_many_open_sessions` (409): Too many open sessions. */
export declare class TooManyOpenSessions extends ConflictError {
    static readonly code = "too_many_open_sessions";
}
/** `archive_not_applied` (409): Archive not applied. */
export declare class ArchiveNotApplied extends ConflictError {
    static readonly code = "archive_not_applied";
}
/** `archive_too_large` (413): Archive too large. */
export declare class ArchiveTooLarge extends InvalidRequestError {
    static readonly code = "archive_too_large";
}
/** `body_too_large` (413): Body too large. */
export declare class BodyTooLarge extends InvalidRequestError {
    static readonly code = "body_too_large";
}
/** `unsupported_media_type` (415): Unsupported media type. */
export declare class UnsupportedMediaType extends InvalidRequestError {
    static readonly code = "unsupported_media_type";
}
/** `invalid_request` (422): Invalid request. */
export declare class InvalidRequest extends InvalidRequestError {
    static readonly code = "invalid_request";
}
/** `empty_batch` (422): Empty batch. */
export declare class EmptyBatch extends InvalidRequestError {
    static readonly code = "empty_batch";
}
/** `batch_too_large` (422): Batch too large. */
export declare class BatchTooLarge extends InvalidRequestError {
    static readonly code = "batch_too_large";
}
/** `invalid_call_id` (422): Invalid call id. */
export declare class InvalidCallId extends InvalidRequestError {
    static readonly code = "invalid_call_id";
}
/** `invalid_tool_name` (422): Invalid tool name. */
export declare class InvalidToolName extends InvalidRequestError {
    static readonly code = "invalid_tool_name";
}
/** `invalid_metadata` (422): Invalid metadata. */
export declare class InvalidMetadata extends InvalidRequestError {
    static readonly code = "invalid_metadata";
}
/** `invalid_env` (422): Invalid environment. */
export declare class InvalidEnv extends InvalidRequestError {
    static readonly code = "invalid_env";
}
/** `unknown_tool` (422): Unknown tool. */
export declare class UnknownTool extends InvalidRequestError {
    static readonly code = "unknown_tool";
}
/** `policy_above_ceiling` (422): Policy above the operator's ceiling. */
export declare class PolicyAboveCeiling extends InvalidRequestError {
    static readonly code = "policy_above_ceiling";
}
/** `seq_out_of_range` (422): Seq out of range. */
export declare class SeqOutOfRange extends InvalidRequestError {
    static readonly code = "seq_out_of_range";
}
/** `policy_not_tighter` (422): Policy not tighter. */
export declare class PolicyNotTighter extends InvalidRequestError {
    static readonly code = "policy_not_tighter";
}
/** `too_many_files` (422): Too many seed files. */
export declare class TooManyFiles extends InvalidRequestError {
    static readonly code = "too_many_files";
}
/** `invalid_seed_file` (422): Invalid seed file. */
export declare class InvalidSeedFile extends InvalidRequestError {
    static readonly code = "invalid_seed_file";
}
/** `invalid_archive` (422): Invalid archive. */
export declare class InvalidArchive extends InvalidRequestError {
    static readonly code = "invalid_archive";
}
/** `image_not_allowed` (422): Image not allowed. */
export declare class ImageNotAllowed extends InvalidRequestError {
    static readonly code = "image_not_allowed";
}
/** `image_not_found` (422): Image not found. */
export declare class ImageNotFound extends InvalidRequestError {
    static readonly code = "image_not_found";
}
/** `image_wrong_platform` (422): Image for another platform. */
export declare class ImageWrongPlatform extends InvalidRequestError {
    static readonly code = "image_wrong_platform";
}
/** `image_too_large` (422): Image too large. */
export declare class ImageTooLarge extends InvalidRequestError {
    static readonly code = "image_too_large";
}
/** `invalid_image` (422): Invalid image. */
export declare class InvalidImage extends InvalidRequestError {
    static readonly code = "invalid_image";
}
/** `rate_limited` (429): Rate limited. */
export declare class RateLimited extends UnavailableError {
    static readonly code = "rate_limited";
}
/** `too_many_auth_failures` (429): Too many failed authentications. */
export declare class TooManyAuthFailures extends UnavailableError {
    static readonly code = "too_many_auth_failures";
}
/** `too_many_concurrent` (429): Too many at once. */
export declare class TooManyConcurrent extends UnavailableError {
    static readonly code = "too_many_concurrent";
}
/** `internal` (500): Internal error. */
export declare class Internal extends UnavailableError {
    static readonly code = "internal";
}
/** `registry_unauthorized` (502): Registry refused the pull. */
export declare class RegistryUnauthorized extends UnavailableError {
    static readonly code = "registry_unauthorized";
}
/** `registry_unreachable` (502): Registry unreachable. */
export declare class RegistryUnreachable extends UnavailableError {
    static readonly code = "registry_unreachable";
}
/** `unavailable` (503): Unavailable. */
export declare class Unavailable extends UnavailableError {
    static readonly code = "unavailable";
}
/** `still_running` (503): Still running. */
export declare class StillRunning extends UnavailableError {
    static readonly code = "still_running";
}
/** `overloaded` (503): Overloaded. */
export declare class Overloaded extends UnavailableError {
    static readonly code = "overloaded";
}
/** Each problem code's class. */
export declare const BY_CODE: Record<ProblemCode, typeof ApiError>;
/** The error for a problem answer (or any other non-2xx answer). */
export declare function fromProblem(status: number, body: unknown, requestId: string | null, retryAfter: number | null): ApiError;
