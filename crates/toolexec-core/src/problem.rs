//! Every problem the API can answer with, in one table: its stable `code`, HTTP status, title
//! and when it happens. The handlers build their errors from it, and the OpenAPI document (the
//! `code` enum of `Problem`, the error responses of each operation) and docs/problems.md are
//! generated from it, so none of them can name a code the others do not know.
//!
//! A tool that fails is not here: it is a result with an error status (SPEC §3).
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

macro_rules! problem_codes {
    ($($variant:ident => ($code:literal, $status:literal, $title:literal, $when:literal),)*) => {
        /// A problem's stable code (`Problem.code`, and the last part of `Problem.type`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum ProblemCode {
            $($variant,)*
        }

        impl ProblemCode {
            /// Every code, in the table's order (by status).
            pub const ALL: &'static [ProblemCode] = &[$(ProblemCode::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self { $(ProblemCode::$variant => $code,)* }
            }

            /// The HTTP status it is answered with.
            pub fn status(self) -> u16 {
                match self { $(ProblemCode::$variant => $status,)* }
            }

            /// A short, fixed title for the problem type.
            pub fn title(self) -> &'static str {
                match self { $(ProblemCode::$variant => $title,)* }
            }

            /// When it happens and what to do about it.
            pub fn when(self) -> &'static str {
                match self { $(ProblemCode::$variant => $when,)* }
            }
        }
    };
}

problem_codes! {
    MalformedJson => ("malformed_json", 400, "Malformed JSON",
        "The body is not valid JSON."),
    InvalidQuery => ("invalid_query", 400, "Invalid query parameter",
        "A query parameter is unknown, repeated, of the wrong type or out of its documented range; the detail names it."),
    UnreadableBody => ("unreadable_body", 400, "Unreadable body",
        "The body could not be read to its end (the connection broke)."),
    Unauthorized => ("unauthorized", 401, "Unauthorized",
        "No API key, or one the service does not know (or that was revoked): send `Authorization: Bearer <key>`."),
    Forbidden => ("forbidden", 403, "Forbidden",
        "Refused for where it comes from, before anything else (DNS rebinding): its `Host` is none of the service's own addresses, loopback names or `allowed_hosts`, or a browser page's `Origin` is neither the service's own nor in `allowed_origins`. The detail names the setting that admits it."),
    NotFound => ("not_found", 404, "Not found",
        "No such session, invocation or tool for this tenant — another tenant's ids are not found either."),
    NoRoute => ("no_route", 404, "No such endpoint",
        "No endpoint has this path; /docs lists them."),
    MethodNotAllowed => ("method_not_allowed", 405, "Method not allowed",
        "The endpoint does not take this method."),
    RequestTimeout => ("request_timeout", 408, "Request timeout",
        "The request body did not arrive in full within `body_read_timeout_ms`; nothing was acted on."),
    CallIdReused => ("call_id_reused", 409, "Call id reused",
        "A call id already recorded in this session (or earlier in the batch) came with another tool or other arguments; use a new id for a new call. Nothing ran."),
    SessionClosed => ("session_closed", 409, "Session closed",
        "The session is closed: new calls cannot run (recorded ones can still be read and retried)."),
    NotRunningHere => ("not_running_here", 409, "Not running on this node",
        "The invocation to cancel runs on another node of the service; cancel it with POST /v1/sessions/{id}/cancel, which the gateway routes to the session's node."),
    Unrestorable => ("unrestorable", 409, "Not restorable from the log",
        "The state asked for has files the log holds by hash and size only (over `limits.max_blob_bytes`, past a scan budget, hard-linked); the detail names them. Send `allow_partial: true` to go ahead without them."),
    ContentNotRecorded => ("content_not_recorded", 409, "Content not recorded",
        "The file existed at that point, but the log has its hash and size only (over `limits.max_blob_bytes`, past a scan budget, hard-linked); `GET …/tree?at=` shows what is known of it."),
    StateTooLarge => ("state_too_large", 409, "State too large to rebuild",
        "The state asked for has more files and symlinks than `limits.max_state_entries`, more than the service rebuilds from a log in memory; the detail says how many."),
    ReplayRunning => ("replay_running", 409, "A replay is running in this session",
        "The session is a verify replay's, and the replay is still re-running its calls; nothing else may run in it until it ends (GET /v1/replays/{id} shows when). Nothing ran."),
    AlreadyDecided => ("already_decided", 409, "Already decided",
        "The invocation is not waiting for approval: it was approved or denied before (the detail says how and by whom; the same decision again is answered 200), or it never waited."),
    TooManyOpenSessions => ("too_many_open_sessions", 409, "Too many open sessions",
        "The tenant holds `limits.max_open_sessions_per_tenant` open sessions; close some (DELETE /v1/sessions/{id})."),
    ArchiveNotApplied => ("archive_not_applied", 409, "Archive not applied",
        "The archive is valid but the session's workspace cannot take it, found before anything is written: a directory of the workspace where the archive has a file, a file or symlink where it needs a directory (the detail names it: remove or rename it, then upload again), or not enough free blocks or inodes (within its disk quota). Rarely, a write failed partway (an I/O error, or space a background process took meanwhile): the detail says what was written and recorded before the failure."),
    ArchiveTooLarge => ("archive_too_large", 413, "Archive too large",
        "The archive upload is over `limits.max_archive_bytes`; nothing was written. Upload the project in parts."),
    BodyTooLarge => ("body_too_large", 413, "Body too large",
        "The body (or its declared Content-Length) is over `body_limit_bytes`; send fewer or smaller calls."),
    UnsupportedMediaType => ("unsupported_media_type", 415, "Unsupported media type",
        "The body is not sent as `Content-Type: application/json`."),
    InvalidRequest => ("invalid_request", 422, "Invalid request",
        "The body is JSON the OpenAPI document's schema refuses (a wrong type, a missing or unknown field, an empty batch, …); the detail points at the field."),
    EmptyBatch => ("empty_batch", 422, "Empty batch",
        "A batch with no calls (callers of the engine other than the HTTP API; over HTTP the schema refuses it as invalid_request)."),
    BatchTooLarge => ("batch_too_large", 422, "Batch too large",
        "More calls than `limits.max_calls_per_batch` in one request; split the batch."),
    InvalidCallId => ("invalid_call_id", 422, "Invalid call id",
        "A call id is empty, longer than 256 characters or holds a NUL character."),
    InvalidToolName => ("invalid_tool_name", 422, "Invalid tool name",
        "A tool name holds a NUL character."),
    InvalidMetadata => ("invalid_metadata", 422, "Invalid metadata",
        "Session metadata holds a NUL character in a key or a string."),
    InvalidEnv => ("invalid_env", 422, "Invalid environment",
        "A session's `env` has a name that is not a variable name, a value with NUL, a dynamic-loader or C-library variable (LD_*, GLIBC_TUNABLES, …) or a start-up hook of a shell, an interpreter or a tool (BASH_ENV, ENV, PS4, PYTHONPATH, NODE_OPTIONS, GIT_CONFIG_*, …; docs/security.md, \"A session's env\"), which must be set in the command instead. The detail names the variable and why."),
    UnknownTool => ("unknown_tool", 422, "Unknown tool",
        "A session's tool allow-list or output limits name a tool the catalog does not have."),
    PolicyAboveCeiling => ("policy_above_ceiling", 422, "Policy above the operator's ceiling",
        "A session's policy asks for more than the operator allows (a timeout, an output limit, network when egress is off)."),
    SeqOutOfRange => ("seq_out_of_range", 422, "Seq out of range",
        "The seq given (`at`, `to_seq`, `at_seq`) is not an event of the session: it must be between 1 and the session's `last_seq`."),
    PolicyNotTighter => ("policy_not_tighter", 422, "Policy not tighter",
        "A fork may only tighten its source's policy and tool allow-list (less network, shorter timeouts, smaller outputs, fewer tools); the detail names what loosens it."),
    TooManyFiles => ("too_many_files", 422, "Too many seed files",
        "More seed files than `limits.max_seed_files` in `POST /v1/sessions`."),
    InvalidSeedFile => ("invalid_seed_file", 422, "Invalid seed file",
        "A seed file could not be written (its path is outside the workspace, say); the detail says why."),
    InvalidArchive => ("invalid_archive", 422, "Invalid archive",
        "The uploaded archive is not a tar (or gzipped tar) stream the workspace may take: an absolute path or '..', a NUL, a name over 255 bytes or a path over 4,095, a hard link, a device, a FIFO, a sparse entry, a path given twice or as both a file and a directory, an entry beneath one of its own symlinks, a symlink that leads out of the workspace (as text, or resolved through the links of the archive and the workspace), a file over 100 MiB, more entries than `limits.max_archive_files` or more bytes than `limits.max_archive_unpacked_bytes` (checked on each header, before its bytes are inflated). The detail names the entry; nothing was written."),
    ImageNotAllowed => ("image_not_allowed", 422, "Image not allowed",
        "The session's `environment.image` is neither a name of the operator's `environments.images` nor a reference to a registry in `environments.allow_registries` (or the service has no environments configured); the detail lists the configured names. Ask the operator to configure the image or allow its registry. Also when the registry (or a token realm or redirect it sends the pull to) is at an address the egress classification refuses — loopback, a private or link-local network, this host's own addresses, a `localhost` name — that `environments.allow_cidrs` does not name: the detail names the address class, not the address; the operator adds the registry's address or network to `environments.allow_cidrs` (a `localhost` name is refused whatever it says: name the registry by its address)."),
    ImageNotFound => ("image_not_found", 422, "Image not found",
        "The registry has no such repository, tag or digest (or hides it from an anonymous pull); check the reference (`toolexec images pull` on the service's host shows the same answer)."),
    ImageWrongPlatform => ("image_wrong_platform", 422, "Image for another platform",
        "The image (or every manifest of its index) is for another OS or architecture than the service's host (`linux/amd64`, say); the detail lists the platforms it has. Build or pick the image for the host's platform."),
    ImageTooLarge => ("image_too_large", 422, "Image too large",
        "The image is over `limits.max_image_bytes` (its layers as downloaded, or its files unpacked) or over `limits.max_image_entries` files; nothing was kept. Use a smaller image, or ask the operator to raise the limit."),
    InvalidImage => ("invalid_image", 422, "Invalid image",
        "The image reference is not one (`host/repo:tag` or `host/repo@sha256:…`), or what the registry served is not an image the service runs: a blob that does not match its digest, an unreadable manifest or config, a layer of an unsupported media type or one the unpacking refuses. The detail names the part."),
    RateLimited => ("rate_limited", 429, "Rate limited",
        "The tenant's request rate is over `rate_limit_per_second`; retry after `Retry-After` seconds."),
    TooManyAuthFailures => ("too_many_auth_failures", 429, "Too many failed authentications",
        "Too many API keys the service does not know came from this client's address (`auth_failure_rate_per_second`); retry after `Retry-After` seconds with a valid key. Keys the service has verified before are not affected."),
    TooManyConcurrent => ("too_many_concurrent", 429, "Too many at once",
        "The tenant already has `max_concurrent_requests_per_tenant` requests in flight on this node (retry after `Retry-After` seconds, when one has been answered), follows `limits.max_streams_per_tenant` event streams, runs `limits.max_replays_per_tenant` replays there, or has `limits.max_pulls_per_tenant` image pulls under way (`POST /v1/environments`; a pull counts until it ends, also after its client went away); close a stream or wait for a replay or a pull to finish, then retry."),
    Internal => ("internal", 500, "Internal error",
        "A fault of the service; its log has the cause under the request id in the detail."),
    RegistryUnauthorized => ("registry_unauthorized", 502, "Registry refused the pull",
        "The image's registry answered 401 or 403 to the service's pull (an image that needs credentials, or credentials it no longer takes). Ask the operator to give the service credentials for that registry; nothing was pulled."),
    RegistryUnreachable => ("registry_unreachable", 502, "Registry unreachable",
        "The image's registry could not be reached (name resolution, connection, TLS, a 5xx answer, or the pull outlived `limits.image_pull_timeout_ms`); nothing was kept. Retry later; if it lasts, check the registry and the service's network (`environments.insecure_registries` for one served over plain HTTP). For an existing session the detail names the digest to restore (`toolexec images pull host/repo@sha256:…`, or push it back to the registry)."),
    Unavailable => ("unavailable", 503, "Unavailable",
        "The store or the session's node cannot serve the request now (or the node is out of descriptors); nothing was run. Retry after `Retry-After` seconds."),
    StillRunning => ("still_running", 503, "Still running",
        "The batch ran longer than `limits.request_timeout_ms`; it goes on. Send the same calls again (same ids) to get their results: recorded ones are returned, a running one is waited for, none runs twice."),
    Overloaded => ("overloaded", 503, "Overloaded",
        "More requests in flight than `max_concurrent_requests` on this node (or, for the public routes together, than one tenant's share); retry after `Retry-After` seconds."),
}

impl std::fmt::Display for ProblemCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_serialize_as_their_names() {
        let mut seen = std::collections::HashSet::new();
        for code in ProblemCode::ALL {
            assert!(seen.insert(code.as_str()), "{code} twice");
            assert_eq!(
                serde_json::to_value(code).ok(),
                Some(serde_json::Value::from(code.as_str()))
            );
            assert!((400..600).contains(&code.status()));
        }
    }
}
