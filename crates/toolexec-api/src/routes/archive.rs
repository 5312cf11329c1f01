//! Getting a project in and out: `PUT /v1/sessions/{id}/archive` takes a tar or tar.gz stream
//! into the workspace (checked whole first, recorded as file events), `GET` streams the
//! workspace as the log has it at a step back as tar. See `toolexec_engine::archive`.
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use toolexec_core::ProblemCode;
use toolexec_core::history::ArchiveUploaded;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::SharedState;
use crate::auth::AuthTenant;
use crate::extract::ApiQuery;
use crate::problem::{ApiError, Problem, or_not_found};
use crate::session_path::SessionPath;

pub fn router() -> OpenApiRouter<SharedState> {
    OpenApiRouter::new().routes(routes!(put_archive, get_archive))
}

/// A tar stream (gzipped or not), as bytes.
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct TarStream(#[allow(dead_code, reason = "a schema only")] Vec<u8>);

/// When to try a transfer refused for the uploads under way again: about what a large one
/// takes.
const RETRY_AFTER_SECS: u32 = 5;

/// A refusal for the transfers a tenant has under way, with when to try again.
fn retry_later(e: toolexec_engine::EngineError) -> ApiError {
    ApiError {
        retry_after: Some(RETRY_AFTER_SECS),
        ..ApiError::from(e)
    }
}

/// Longest an upload may go without a byte arriving: a slow link is fine, a stalled one is not.
pub(crate) const UPLOAD_IDLE: Duration = Duration::from_secs(60);
/// Longest a whole upload may take to arrive (1 GiB at ~600 KiB/s).
pub(crate) const UPLOAD_TOTAL: Duration = Duration::from_secs(30 * 60);

/// Upload a project (tar or tar.gz) into the workspace.
///
/// Unpacks a tar (or gzipped tar) stream into the session's workspace. Everything is checked
/// before the first entry is written, so a refused archive changes nothing: each entry — a
/// relative path without `..`, every name within 255 bytes and the path within 4,095, a regular
/// file (at most 100 MiB), a directory or a symlink (no hard links, devices or FIFOs), within
/// `limits.max_archive_files` and `limits.max_archive_unpacked_bytes` (checked on each header,
/// before its bytes are inflated); the archive as a whole — no path twice or as two things,
/// every symlink resolved through the links of the archive and the workspace and staying inside;
/// and the workspace — no directory where the archive has a file, no file or symlink where it
/// needs a directory, room for its blocks and files (its disk quota). It is then written
/// through the workspace jail while no call runs in the session, each file streamed to its
/// place, and recorded as file events (contents as blobs) with no invocation. Directories are
/// not recorded (the log holds files and symlinks); file modes keep their permission bits. The
/// body may be up to `limits.max_archive_bytes` and may arrive slowly, but not stall for more
/// than 60 s.
#[utoipa::path(put, path = "/v1/sessions/{id}/archive", tag = "sessions", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Session id")),
    request_body(content = TarStream, description = "A tar stream, gzipped or not (detected by its magic bytes); sent with any content type (`application/x-tar`, `application/gzip`, `application/octet-stream`)", content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "Unpacked and recorded", body = ArchiveUploaded),
        (status = 404, description = "No such session for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body stalled for 60 s (`request_timeout`); nothing was written", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The session is closed (`session_closed`), or the workspace cannot take it (`archive_not_applied`)", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Over `limits.max_archive_bytes` (`archive_too_large`); nothing was written", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not an archive the workspace may take (`invalid_archive`): the detail names the entry; nothing was written", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "This tenant has `limits.max_archive_transfers_per_tenant` transfers under way on this node (`too_many_concurrent`), or its request rate is over `rate_limit_per_second` (`rate_limited`); retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "This node has `limits.max_concurrent_archive_uploads` uploads under way, or more requests in flight than `max_concurrent_requests` (`overloaded`): the body was not read; or the store or the session's node cannot serve it now (`unavailable`). Retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json"),
    ))]
async fn put_archive(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
    body: Body,
) -> Result<Json<ArchiveUploaded>, ApiError> {
    // Known before the body is read: another tenant's session costs no upload.
    state
        .engine
        .get_session(tenant.id, id)
        .await
        .map_err(or_not_found("session"))?;
    let _slot = state
        .engine
        .archives()
        .archive_slot(tenant.id)
        .map_err(retry_later)?;
    let Some(_upload) = state.engine.archives().archive_upload() else {
        return Err(ApiError {
            retry_after: Some(RETRY_AFTER_SECS),
            ..ApiError::new(
                ProblemCode::Overloaded,
                format!(
                    "this node has {} archive uploads under way, the most it takes at once \
                     (limits.max_concurrent_archive_uploads); nothing was read. Retry after \
                     {RETRY_AFTER_SECS} s",
                    state.engine.config().limits.max_concurrent_archive_uploads
                ),
            )
        });
    };
    let max = state.engine.config().limits.max_archive_bytes;
    // However slowly it may arrive, an upload ends: a body that trickles forever would hold its
    // request slot and spool space forever.
    let deadline = tokio::time::Instant::now() + UPLOAD_TOTAL;
    let (spool, file) = state.engine.archives().archive_spool().map_err(|e| {
        tracing::error!(error = %e, "cannot spool an archive upload");
        ApiError::internal()
    })?;
    let mut file = tokio::fs::File::from_std(file);
    let mut stream = body.into_data_stream();
    let mut total = 0u64;
    loop {
        let wait = UPLOAD_IDLE.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        let chunk = match tokio::time::timeout(wait, stream.next()).await {
            Err(_) => {
                return Err(ApiError::new(
                    ProblemCode::RequestTimeout,
                    format!(
                        "the archive did not arrive (no byte for {} s, or not all of it within {} \
                         minutes); nothing was written. Send it again",
                        UPLOAD_IDLE.as_secs(),
                        UPLOAD_TOTAL.as_secs() / 60
                    ),
                ));
            }
            Ok(None) => break,
            Ok(Some(Err(_))) => {
                return Err(ApiError::new(
                    ProblemCode::UnreadableBody,
                    "the archive could not be read to its end; nothing was written",
                ));
            }
            Ok(Some(Ok(chunk))) => chunk,
        };
        total += chunk.len() as u64;
        if total > max {
            return Err(ApiError::new(
                ProblemCode::ArchiveTooLarge,
                format!(
                    "the archive is over {max} bytes, the most one upload may be \
                     (limits.max_archive_bytes); nothing was written. Upload the project in parts"
                ),
            ));
        }
        file.write_all(&chunk).await.map_err(|e| {
            tracing::error!(error = %e, "cannot spool an archive upload");
            ApiError::internal()
        })?;
    }
    file.flush().await.map_err(|_| ApiError::internal())?;
    drop(file);
    if total == 0 {
        return Err(ApiError::new(
            ProblemCode::InvalidArchive,
            "the body is empty: send the archive as a tar or tar.gz stream (for example \
             `git archive --format=tar.gz HEAD | curl -X PUT --data-binary @- …`)",
        ));
    }
    // In a task of its own: a client that goes away does not stop an upload halfway (between
    // a batch written and its record).
    let engine = state.engine.clone();
    let uploaded = tokio::spawn(async move { engine.upload_archive(tenant.id, id, spool).await })
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "an archive upload task failed");
            ApiError::internal()
        })?
        .map_err(or_not_found("session"))?;
    Ok(Json(uploaded))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ArchiveQuery {
    /// The step whose workspace to send (an event's seq); default: the session's last.
    pub at: Option<i64>,
    /// Leave out files whose contents the log holds by hash only (how many is the
    /// `x-toolexec-missing` header; `GET …/tree?at=` names them) instead of answering 409
    /// `unrestorable`.
    pub allow_partial: Option<bool>,
}

/// The workspace at an event, as tar.
///
/// The session's workspace as its log has it right after event `at` (its last by default), as a
/// tar stream: files with their permission bits and symlinks, in path order, timestamps zero
/// (the same state gives the same bytes). The `x-toolexec-seq` header says which step it is.
#[utoipa::path(get, path = "/v1/sessions/{id}/archive", tag = "sessions", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Session id"), ArchiveQuery),
    responses(
        (status = 200, description = "The workspace as tar", content_type = "application/x-tar", body = TarStream,
            headers(
                ("x-toolexec-seq" = i64, description = "The event whose state this is (`at`, or the session's last)"),
                ("x-toolexec-missing" = u64, description = "With `allow_partial=true`: how many files were left out because the log holds them by hash only (absent when none)"),
                ("Content-Disposition" = String, description = "`attachment; filename=\"session-<id>-<seq>.tar\"`"),
            )),
        (status = 404, description = "No such session for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Files of that state are in the log by hash only (`unrestorable`); send `allow_partial=true` to leave them out", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`at` is not an event of the session (`seq_out_of_range`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_archive(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
    ApiQuery(q): ApiQuery<ArchiveQuery>,
) -> Result<Response, ApiError> {
    let _slot = state
        .engine
        .archives()
        .archive_slot(tenant.id)
        .map_err(retry_later)?;
    let (spool, at, missing) = state
        .engine
        .archive_at(tenant.id, id, q.at, q.allow_partial.unwrap_or(false))
        .await
        .map_err(or_not_found("session"))?;
    let file = tokio::fs::File::open(spool.path()).await.map_err(|e| {
        tracing::error!(error = %e, "cannot read an archive spool");
        ApiError::internal()
    })?;
    let len = file.metadata().await.map(|m| m.len()).ok();
    // Open, the spool can go: the descriptor keeps its bytes until the stream ends.
    drop(spool);
    let mut resp = Body::from_stream(tokio_util::io::ReaderStream::new(file)).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/x-tar"),
    );
    if let Some(len) = len {
        headers.insert(header::CONTENT_LENGTH, len.into());
    }
    if let Ok(v) = format!("attachment; filename=\"session-{id}-{at}.tar\"").parse() {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    headers.insert("x-toolexec-seq", at.into());
    if !missing.is_empty() {
        headers.insert("x-toolexec-missing", missing.len().into());
    }
    Ok(resp)
}
