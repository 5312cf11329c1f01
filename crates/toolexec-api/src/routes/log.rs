//! The recorded log: a session's events, one invocation with its side effects, its full output.
use std::convert::Infallible;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use toolexec_core::{Event, Invocation, ProblemCode};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::SharedState;
use crate::auth::AuthTenant;
use crate::extract::{ApiQuery, parse_id};
use crate::problem::{ApiError, Problem, or_not_found};
use crate::session_path::SessionPath;

pub fn router() -> OpenApiRouter<SharedState> {
    OpenApiRouter::new()
        .routes(routes!(list_events))
        .routes(routes!(get_event))
        .routes(routes!(get_invocation))
        .routes(routes!(get_output))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Return events with `seq` greater than this (default 0: from the start).
    #[param(minimum = 0)]
    pub after: Option<i64>,
    /// Page size (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EventPage {
    /// In `seq` order. An event larger than the page's bound alone shows the beginning of its
    /// data, with `truncated`.
    pub events: Vec<Event>,
    /// Pass as `after` for the next page; `null` when this page reached the end of the log so
    /// far. A page ends early, with this cursor, where the next event would take it over the
    /// service's `limits.page_bytes`.
    pub next_after: Option<i64>,
}

/// A session's log.
///
/// A session's log, in order. Event kinds: `session.created`, `session.closed`,
/// `invocation.started`, `invocation.finished`, `file.created`, `file.modified`, `file.deleted`,
/// `files.changed` (a call's file changes beyond `limits.max_file_events_per_call`, summed up,
/// each listed in the manifest blob it names), `plan.updated`, `process.started`,
/// `process.exited`. A read-only call that ends with no side effect is one event, its
/// `invocation.finished`, which then also carries the start's `arguments`, `read_only` and
/// `capabilities`; every other call has `invocation.started` … `invocation.finished`.
///
/// A page holds at most `limit` events and at most the service's `limits.page_bytes` (4 MiB by
/// default) of JSON: it ends early where the next event would not fit, and `next_after` says
/// where to go on. An event larger than that alone comes with the beginning of its data only
/// (cut to valid JSON, a string cut short ending with `…`) and `truncated`: its size and the
/// path that serves it whole (`GET /v1/sessions/{id}/events/{seq}`).
#[utoipa::path(get, path = "/v1/sessions/{id}/events", tag = "log", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Session id"), EventsQuery),
    responses(
        (status = 200, description = "A page of events", body = EventPage),
        (status = 404, description = "No such session for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_events(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
    ApiQuery(q): ApiQuery<EventsQuery>,
) -> Result<Response, ApiError> {
    let page = state
        .engine
        .streams()
        .event_page(tenant.id, id, q.after.unwrap_or(0), q.limit)
        .await
        .map_err(or_not_found("session"))?;
    let next = match page.next_after {
        Some(seq) => seq.to_string(),
        None => "null".into(),
    };
    // Each event is rendered as the body is sent, and dropped once it is.
    let events = page.events.into_iter().enumerate().map(|(i, e)| {
        let mut json = if i == 0 { String::new() } else { ",".into() };
        json.push_str(&e.to_json());
        json
    });
    Ok(json_body(
        std::iter::once("{\"events\":[".to_owned())
            .chain(events)
            .chain(std::iter::once(format!("],\"next_after\":{next}}}"))),
    ))
}

/// A JSON answer sent piece by piece, each made when the connection takes it.
pub(crate) fn json_body(pieces: impl Iterator<Item = String> + Send + 'static) -> Response {
    let stream = futures::stream::iter(pieces.map(|p| Ok::<_, Infallible>(Bytes::from(p))));
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Get one event whole.
///
/// One event of a session, whole: what the `truncated.full` of an event in a page or a
/// stream points at (its data can be as large as a request body).
#[utoipa::path(get, path = "/v1/sessions/{id}/events/{seq}", tag = "log", security(("bearer" = [])),
    params(
        ("id" = Uuid, Path, description = "Session id"),
        ("seq" = i64, Path, description = "The event's `seq`", minimum = 1),
    ),
    responses(
        (status = 200, description = "The event, its data whole", body = Event),
        (status = 404, description = "No such session for this tenant, or no such event in it (`not_found`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_event(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
    Path((_, seq)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let seq: i64 = seq.parse().map_err(|_| {
        ApiError::new(
            ProblemCode::NotFound,
            format!(
                "no event '{seq}' in this session: an event is named by its seq, a whole number"
            ),
        )
    })?;
    let event = state
        .engine
        .streams()
        .event(tenant.id, id, seq)
        .await
        .map_err(or_not_found("session"))?;
    Ok(json_body(event.into_json_parts().into_iter()))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InvocationQuery {
    /// Side effects with `seq` greater than this (default 0: from the first). Pass the
    /// previous page's `side_effects_next_after`.
    #[param(minimum = 0)]
    pub after: Option<i64>,
    /// Side effects per page (1–1000, default 1000).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// Seconds to wait for the invocation to end (not `running`, not `pending_approval`)
    /// before answering (0–300, default 0: at once). The answer comes as soon as it ends, or
    /// with the invocation as it is when the wait is over. A wait follows the session's live
    /// log and counts as one of the tenant's event streams.
    #[param(minimum = 0, maximum = 300)]
    pub wait: Option<u64>,
}

/// One invocation.
///
/// One invocation: its call, status, what the model was shown, timings, the capabilities it
/// claimed and a page of its side effects (`side_effects_total` says how many there are;
/// `side_effects_next_after` is the `after` of the next page).
#[utoipa::path(get, path = "/v1/invocations/{id}", tag = "log", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Invocation id"), InvocationQuery),
    responses(
        (status = 200, description = "The invocation", body = Invocation),
        (status = 404, description = "No such invocation for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_invocation(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<InvocationQuery>,
) -> Result<Json<Invocation>, ApiError> {
    let id = parse_id(&id, "invocation")?;
    Ok(Json(
        state
            .engine
            .streams()
            .wait_invocation(
                tenant.id,
                id,
                std::time::Duration::from_secs(q.wait.unwrap_or(0).min(300)),
                q.after,
                q.limit,
            )
            .await
            .map_err(or_not_found("invocation"))?,
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OutputQuery {
    /// First character to return (default 0).
    #[param(minimum = 0, maximum = 9_007_199_254_740_991_i64)]
    pub offset: Option<usize>,
    /// Characters to return (default 50,000, at most 1,000,000).
    #[param(minimum = 1, maximum = 1_000_000)]
    pub limit: Option<usize>,
}

/// A slice of an invocation's full, untruncated output.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutputSlice {
    pub invocation_id: Uuid,
    pub offset: usize,
    pub total_chars: usize,
    /// Where the next slice starts; `null` at the end.
    pub next_offset: Option<usize>,
    pub content: String,
    /// `false` when the service recorded only the beginning and the end of this output (it was
    /// over `limits.max_stored_output_bytes`): the text then has a marker, where the middle was
    /// dropped, saying how much. `total_chars` counts the stored text.
    pub complete: bool,
    /// Length of the output the tool produced, in characters.
    pub output_chars: usize,
}

/// An invocation's full output.
///
/// The full output of an invocation (what the model saw may have been truncated), as recorded:
/// an output over the service's `limits.max_stored_output_bytes` is recorded as its beginning
/// and end (`complete: false`).
#[utoipa::path(get, path = "/v1/invocations/{id}/output", tag = "log", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Invocation id"), OutputQuery),
    responses(
        (status = 200, description = "A slice of the full output", body = OutputSlice),
        (status = 404, description = "No such invocation for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_output(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<OutputQuery>,
) -> Result<Json<OutputSlice>, ApiError> {
    let id = parse_id(&id, "invocation")?;
    let s = state
        .engine
        .streams()
        .invocation_output(tenant.id, id, q.offset, q.limit)
        .await
        .map_err(or_not_found("invocation"))?;
    Ok(Json(OutputSlice {
        invocation_id: s.invocation_id,
        offset: s.offset,
        total_chars: s.total_chars,
        next_offset: s.next_offset,
        content: s.content,
        complete: s.complete,
        output_chars: s.output_chars,
    }))
}
