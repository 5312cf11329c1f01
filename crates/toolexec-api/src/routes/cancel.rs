//! Cancelling what runs: one invocation, or every pending call of a session.
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Serialize;
use toolexec_core::{CallResult, Invocation};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::SharedState;
use crate::auth::AuthTenant;
use crate::extract::parse_id;
use crate::problem::{ApiError, Problem, or_not_found};
use crate::session_path::SessionPath;

pub fn router() -> OpenApiRouter<SharedState> {
    OpenApiRouter::new()
        .routes(routes!(cancel_invocation))
        .routes(routes!(cancel_session_calls))
}

/// 200 once everything stopped has ended and is recorded; 202 while something is still ending.
fn status_of(ended: bool) -> StatusCode {
    if ended {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    }
}

/// Cancel a running call.
///
/// A running `shell` command is killed with every process it started, and the call is recorded
/// `cancelled` with the output it printed so far and the files it changed before (found by the
/// workspace scan, like any command's). Another tool stops the way its time limit stops it: if
/// it has not begun changing the workspace it is abandoned (`cancelled`, nothing changed); if
/// its change is under way, the change is finished and the call keeps its real result. A call
/// that had not started yet is recorded `cancelled` and never runs. The batch that sent the
/// call goes on with its next call.
///
/// The answer is the invocation once it has ended and is recorded (200), waiting up to 10 s;
/// if it is still ending then (a change under way, its record waiting for the store), 202 with
/// the invocation as it is: `GET /v1/invocations/{id}` shows when it ends. Cancelling an
/// invocation that has already ended changes nothing and returns it (200), so repeating a
/// cancel is harmless. A retry of a cancelled call id returns the cancelled record.
///
/// Only calls with a recorded start have an invocation id while they run: mutating calls, and
/// read-only ones when the operator set `durable_start_for_read_only`. Other read-only calls are
/// stopped by `POST /v1/sessions/{id}/cancel`.
#[utoipa::path(post, path = "/v1/invocations/{id}/cancel", tag = "calls", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Invocation id")),
    responses(
        (status = 200, description = "The invocation, ended: `cancelled` with what had happened so far, or the result it had already reached", body = Invocation),
        (status = 202, description = "Cancelled, but still ending after 10 s (a change under way is finished, not cut; or its record waits for the store); the invocation as it is now", body = Invocation),
        (status = 404, description = "No such invocation for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The invocation runs on another node than the one that got the request (`not_running_here`); send `POST /v1/sessions/{id}/cancel` for its session, which a gateway routing by session id delivers to that node", body = Problem, content_type = "application/problem+json"),
    ))]
async fn cancel_invocation(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Invocation>), ApiError> {
    let id = parse_id(&id, "invocation")?;
    let cancelled = state
        .engine
        .cancel_invocation(tenant.id, id)
        .await
        .map_err(or_not_found("invocation"))?;
    Ok((status_of(cancelled.ended), Json(cancelled.invocation)))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionCancel {
    pub session_id: Uuid,
    /// The calls of the session that had not ended when the cancel came, batch by batch in
    /// request order, as they ended: `cancelled` (with the output so far of a stopped command,
    /// or "nothing ran" for a call that had not started), or the real result of a change that
    /// was under way. Empty when nothing was pending.
    pub results: Vec<CallResult>,
    /// `false` when some call was still ending after 10 s (answer 202): its batch's response and
    /// the log have its result.
    pub ended: bool,
}

/// Cancel every pending call of a session.
///
/// Every call of the session still running on this node is stopped as
/// `POST /v1/invocations/{id}/cancel` stops one, and every call still waiting in one of its
/// batches never starts: it is recorded `cancelled` ("nothing ran"), so that a retry of its call
/// id returns that record and runs nothing. The requests that sent the batches get their
/// results as usual. Background processes are not touched (`process_kill` or closing the
/// session stops them). A session with nothing pending, or closed, gives an empty report.
#[utoipa::path(post, path = "/v1/sessions/{id}/cancel", tag = "calls", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "Everything pending was stopped, has ended and is recorded", body = SessionCancel),
        (status = 202, description = "Stopped, but some call was still ending after 10 s (a change under way is finished, not cut; or its record waits for the store)", body = SessionCancel),
        (status = 404, description = "No such session for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn cancel_session_calls(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
) -> Result<(StatusCode, Json<SessionCancel>), ApiError> {
    let cancelled = state
        .engine
        .cancel_session_calls(tenant.id, id)
        .await
        .map_err(or_not_found("session"))?;
    Ok((
        status_of(cancelled.ended),
        Json(SessionCancel {
            session_id: id,
            results: cancelled.results,
            ended: cancelled.ended,
        }),
    ))
}
