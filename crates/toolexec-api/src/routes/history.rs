//! Time travel: a session's workspace at any event (tree, files), rewind, fork, verify replay,
//! and its log as a live stream.
use std::convert::Infallible;

use axum::Json;
use axum::extract::{OriginalUri, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use toolexec_core::{
    ForkRequest, Forked, ProblemCode, Replay, ReplayMode, ReplayStatus, RewindRequest,
    RewindResult, Tree, TreeEntryKind,
};
use utoipa::{IntoParams, OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::SharedState;
use crate::auth::AuthTenant;
use crate::extract::{ApiJson, ApiQuery, parse_id};
use crate::problem::{ApiError, Problem, or_not_found};
use crate::session_path::SessionPath;

/// A file's bytes, as they are (text or not).
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct FileBytes(#[allow(dead_code, reason = "a schema only")] Vec<u8>);

/// The path of `GET …/files/{path}` as axum routes it (the rest of the path is the file's).
const FILES_ROUTE: &str = "/v1/sessions/{id}/files/{*path}";

#[derive(OpenApi)]
#[openapi(paths(get_file))]
struct FilesDoc;

pub fn router() -> OpenApiRouter<SharedState> {
    OpenApiRouter::with_openapi(FilesDoc::openapi())
        .routes(routes!(get_tree))
        .routes(routes!(rewind))
        .routes(routes!(fork))
        .routes(routes!(start_replay))
        .routes(routes!(get_replay))
        .routes(routes!(stream_events))
        .route(FILES_ROUTE, axum::routing::get(get_file))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TreeQuery {
    /// The state right after this event (default: the session's last).
    #[param(minimum = 1)]
    pub at: Option<i64>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Entries per page (1–10000, default 1000).
    #[param(minimum = 1, maximum = 10000)]
    pub limit: Option<u32>,
}

/// The workspace at an event: its tree.
///
/// The workspace as it was right after event `at`: every file and symlink with its size, hash,
/// mode and symlink target, rebuilt from the log alone — also for a closed session whose
/// workspace is gone. `restorable: false` marks files the log holds by hash and size only.
#[utoipa::path(get, path = "/v1/sessions/{id}/tree", tag = "history", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Session id"), TreeQuery),
    responses(
        (status = 200, description = "A page of the workspace's entries, in byte order of their paths", body = Tree),
        (status = 404, description = "No such session for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`at` is not an event of the session (`seq_out_of_range`), or the cursor is not one this endpoint gave (`invalid_request`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_tree(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
    ApiQuery(q): ApiQuery<TreeQuery>,
) -> Result<Json<Tree>, ApiError> {
    let limit = q.limit.unwrap_or(toolexec_engine::DEFAULT_TREE_PAGE);
    Ok(Json(
        state
            .engine
            .tree(tenant.id, id, q.at, q.cursor.as_deref(), limit)
            .await
            .map_err(or_not_found("session"))?,
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FileQuery {
    /// The state right after this event (default: the session's last).
    #[param(minimum = 1)]
    pub at: Option<i64>,
}

/// The workspace at an event: one file.
///
/// One file of the workspace as it was right after event `at`: its bytes, with its hash in
/// `x-toolexec-sha256` (and as the `ETag`), its mode in `x-toolexec-mode` (octal), the event
/// that last changed it in `x-toolexec-seq`, and its kind in `x-toolexec-kind` — a symlink's
/// body is its target text. The path is workspace-relative; percent-encode bytes that are not
/// UTF-8 (the tree's `path_b64` gives them).
#[utoipa::path(get, path = "/v1/sessions/{id}/files/{path}", tag = "history", security(("bearer" = [])),
    params(
        ("id" = Uuid, Path, description = "Session id"),
        ("path" = String, Path, description = "Workspace-relative path of the file (slashes included)"),
        FileQuery,
    ),
    responses(
        (status = 200, description = "The file's bytes: `text/plain; charset=utf-8` when they are UTF-8, else `application/octet-stream`",
            content((FileBytes = "text/plain"), (FileBytes = "application/octet-stream")),
            headers(
                ("ETag" = String, description = "The contents' SHA-256 (hex), quoted"),
                ("x-toolexec-sha256" = String, description = "The contents' SHA-256 (hex)"),
                ("x-toolexec-kind" = String, description = "`file`, or `symlink` (the body is its target)"),
                ("x-toolexec-mode" = String, description = "The permission bits, octal (`644`)"),
                ("x-toolexec-seq" = i64, description = "The event that last changed the file"),
                ("x-toolexec-at" = i64, description = "The event whose state this is (`at`, or the session's last)"),
            )),
        (status = 404, description = "No such session for this tenant, or no such file at that point (`not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The file was there, but the log holds its hash and size only (`content_not_recorded`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`at` is not an event of the session (`seq_out_of_range`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_file(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
    OriginalUri(uri): OriginalUri,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> Result<Response, ApiError> {
    // From the URI itself: the file's path may hold percent-encoded bytes that are not UTF-8,
    // which axum's path extractors refuse.
    let raw = uri
        .path()
        .split_once("/files/")
        .map(|(_, path)| percent_decode(path))
        .unwrap_or_default();
    let file = state
        .engine
        .file_at(tenant.id, id, q.at, &raw)
        .await
        .map_err(or_not_found("session"))?;
    let mut headers = HeaderMap::new();
    let content_type = if std::str::from_utf8(&file.bytes).is_ok() {
        "text/plain; charset=utf-8"
    } else {
        "application/octet-stream"
    };
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    let kind = match file.kind {
        TreeEntryKind::File => "file",
        TreeEntryKind::Symlink => "symlink",
    };
    headers.insert("x-toolexec-kind", HeaderValue::from_static(kind));
    if let Some(sha) = &file.sha256
        && let Ok(v) = HeaderValue::from_str(sha)
    {
        headers.insert("x-toolexec-sha256", v);
        if let Ok(etag) = HeaderValue::from_str(&format!("\"{sha}\"")) {
            headers.insert(header::ETAG, etag);
        }
    }
    if let Ok(v) = HeaderValue::from_str(&format!("{:o}", file.mode)) {
        headers.insert("x-toolexec-mode", v);
    }
    headers.insert("x-toolexec-seq", HeaderValue::from(file.seq));
    headers.insert("x-toolexec-at", HeaderValue::from(file.at));
    Ok((StatusCode::OK, headers, file.bytes).into_response())
}

/// `%2F`-style escapes to bytes (anything malformed is kept as it is).
fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// Rewind the workspace to an event.
///
/// Put the live workspace back to its state right after event `to_seq`: files created later are
/// removed, modified and deleted ones restored (contents, modes, symlinks), background processes
/// started later are stopped, and the session's read-before-write knowledge of every path it
/// changed is reset (read those files again before writing them). Waits for the session's
/// calls in flight. The rewind is itself recorded: a `workspace.rewound` event, then a `file.*`
/// event per change; later events stay, so the log still explains every byte.
#[utoipa::path(post, path = "/v1/sessions/{id}/rewind", tag = "history", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Session id")),
    request_body = RewindRequest,
    responses(
        (status = 200, description = "Rewound: what changed", body = RewindResult),
        (status = 404, description = "No such session for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The session is closed (`session_closed`), or the state has files whose contents the log does not hold and `allow_partial: true` was not sent (`unrestorable`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The to_seq given is not an event of the session (`seq_out_of_range`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn rewind(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
    ApiJson(req): ApiJson<RewindRequest>,
) -> Result<Json<RewindResult>, ApiError> {
    Ok(Json(
        state
            .engine
            .rewind(tenant.id, id, req)
            .await
            .map_err(or_not_found("session"))?,
    ))
}

/// Fork a session at an event.
///
/// A new session of the same tenant whose workspace starts as this one's was right after event
/// `at_seq` (default: its last). Its `origin` (and its `session.created` event) names the
/// source and the seq. It takes the source's environment, and its policy and tools unless
/// tighter ones are given. Forks of one state share its contents (an overlay on one copy of
/// it) where the service can mount overlayfs, else each gets a copy (`shares_contents`).
#[utoipa::path(post, path = "/v1/sessions/{id}/fork", tag = "history", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "The source session's id")),
    request_body = ForkRequest,
    responses(
        (status = 201, description = "The fork", body = Forked),
        (status = 404, description = "No such session for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The state has files whose contents the log does not hold and `allow_partial: true` was not sent (`unrestorable`), or the tenant has too many open sessions (`too_many_open_sessions`)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The at_seq given is not an event of the source (`seq_out_of_range`); the policy or tools would loosen the source's (`policy_not_tighter`), or break the operator's rules (`policy_above_ceiling`, `unknown_tool`, `invalid_metadata`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn fork(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
    ApiJson(req): ApiJson<ForkRequest>,
) -> Result<(StatusCode, Json<Forked>), ApiError> {
    let forked = state
        .engine
        .fork(tenant.id, id, req)
        .await
        .map_err(or_not_found("session"))?;
    Ok((StatusCode::CREATED, Json(forked)))
}

/// The body of `POST /v1/sessions/{id}/replay`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    /// `verify` (the default): re-run and compare.
    #[serde(default)]
    pub mode: ReplayMode,
}

/// Replay a session and compare.
///
/// Re-run a session: a new session starts from this one's initial state (right before its first
/// call) and re-executes its recorded calls and rewinds in order, with the recorded call ids.
/// The report says per call whether the status, the output and the side effects matched, and
/// for each that did not, the first difference (the output line, the file). Ids and reported
/// times are not differences. Answers when the replay is done (200), or after the request
/// limit with the report so far (202, `running`): `GET /v1/replays/{id}` has it as it goes.
#[utoipa::path(post, path = "/v1/sessions/{id}/replay", tag = "history", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "The recorded session's id")),
    request_body = ReplayRequest,
    responses(
        (status = 200, description = "The replay, done: its report", body = Replay),
        (status = 202, description = "Still running after the request limit: the report so far", body = Replay),
        (status = 404, description = "No such session for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The initial state has files whose contents the log does not hold (`unrestorable`), or the tenant has too many open sessions (`too_many_open_sessions`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn start_replay(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
    ApiJson(req): ApiJson<ReplayRequest>,
) -> Result<(StatusCode, Json<Replay>), ApiError> {
    let replay = state
        .engine
        .replay(tenant.id, id, req.mode)
        .await
        .map_err(or_not_found("session"))?;
    let status = if replay.status == ReplayStatus::Running {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(replay)))
}

/// A replay's report.
///
/// A replay's report, as it is now (`running` while calls are being re-run).
#[utoipa::path(get, path = "/v1/replays/{id}", tag = "history", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Replay id")),
    responses(
        (status = 200, description = "The replay", body = Replay),
        (status = 404, description = "No such replay for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_replay(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    Path(id): Path<String>,
) -> Result<Json<Replay>, ApiError> {
    let id = parse_id(&id, "replay")?;
    Ok(Json(
        state
            .engine
            .get_replay(tenant.id, id)
            .await
            .map_err(or_not_found("replay"))?,
    ))
}

/// One Server-Sent Event of `GET /v1/sessions/{id}/events/stream`, as its fields arrive.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamEvent {
    /// The event's `seq` (absent on `stream.overflow` and `stream.error`): send it back as
    /// `Last-Event-ID` to resume after it.
    pub id: Option<String>,
    /// The event's kind (`session.created`, `invocation.started`, …), or `stream.overflow` /
    /// `stream.error` (`{"reason", "resume_after"}`).
    pub event: String,
    /// The event as JSON (an `Event`, as `GET …/events` returns them).
    pub data: String,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// Send events with `seq` greater than this (default 0: the whole log, then live). A
    /// `Last-Event-ID` header, which a reconnecting EventSource sends, takes precedence.
    #[param(minimum = 0)]
    pub after: Option<i64>,
}

/// A session's log, live (Server-Sent Events).
///
/// The log, live, as Server-Sent Events: each event as `id: <seq>`, `event: <kind>`,
/// `data: <the event as JSON>`, in order, then new ones as they are recorded (on any replica).
/// Reconnect with `Last-Event-ID` (or `?after=`) to resume: no event is lost or sent twice.
/// Heartbeats (`: ping` comments) every 15 s. A reader that falls more than the service's
/// `limits.stream_buffer_bytes` (512 KiB by default) or 1,024 events behind gets a final
/// `stream.overflow` event (`{"resume_after": seq}`) and is disconnected; a store failure ends
/// it with `stream.error` the same way. An event larger than that buffer is sent truncated,
/// as a page shows it (`truncated.full` serves it whole). The stream ends after
/// `session.closed`. A node serves at most `limits.max_streams_per_node` streams (503
/// `unavailable` beyond).
#[utoipa::path(get, path = "/v1/sessions/{id}/events/stream", tag = "log", security(("bearer" = [])),
    params(
        ("id" = Uuid, Path, description = "Session id"),
        ("Last-Event-ID" = Option<i64>, Header, description = "The `id` of the last event received"),
        StreamQuery,
    ),
    responses(
        (status = 200, description = "An event stream: one `StreamEvent` per log event (and `stream.overflow` or `stream.error` last, when a reader is cut off)", content_type = "text/event-stream", body = StreamEvent),
        (status = 400, description = "`Last-Event-ID` is not a seq (`invalid_query`)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such session for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "The tenant follows `limits.max_streams_per_tenant` streams on this node already (`too_many_concurrent`)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The node serves `limits.max_streams_per_node` streams already (`unavailable`, with `Retry-After`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn stream_events(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<StreamQuery>,
) -> Result<Response, ApiError> {
    let after = match headers.get("last-event-id") {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .filter(|s| *s >= 0)
            .ok_or_else(|| {
                ApiError::new(
                    ProblemCode::InvalidQuery,
                    "Last-Event-ID: expected the seq of an event (a whole number)",
                )
            })?,
        None => q.after.unwrap_or(0),
    };
    let stream = state
        .engine
        .streams()
        .stream(tenant.id, id, after)
        .await
        .map_err(or_not_found("session"))?;
    let events = stream.map(|item| Ok::<_, Infallible>(sse_event(item)));
    let mut resp = Sse::new(events)
        .keep_alive(
            KeepAlive::new()
                .interval(std::time::Duration::from_secs(15))
                .text("ping"),
        )
        .into_response();
    // Proxies (nginx) pass the events on as they come instead of buffering them.
    resp.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(resp)
}

fn sse_event(item: toolexec_engine::StreamItem) -> SseEvent {
    use toolexec_engine::StreamItem;
    match item {
        StreamItem::Event(event) => SseEvent::default()
            .id(event.seq.to_string())
            .event(event.kind.as_str())
            .data(&event.json),
        StreamItem::Overflow { last_seq } => SseEvent::default().event("stream.overflow").data(
            serde_json::json!({
                "reason": "this reader fell too far behind the log and was disconnected",
                "resume_after": last_seq,
            })
            .to_string(),
        ),
        StreamItem::Failed { last_seq, detail } => SseEvent::default()
            .event("stream.error")
            .data(serde_json::json!({"reason": detail, "resume_after": last_seq}).to_string()),
    }
}
