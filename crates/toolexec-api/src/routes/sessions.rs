//! Sessions: create, list, show, close.
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use toolexec_core::ProblemCode;
use toolexec_core::{NewSession, Session};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::SharedState;
use crate::auth::AuthTenant;
use crate::extract::{ApiJson, ApiQuery};
use crate::problem::{ApiError, Problem, or_not_found};
use crate::session_path::SessionPath;

pub fn router() -> OpenApiRouter<SharedState> {
    OpenApiRouter::new()
        .routes(routes!(create_session, list_sessions))
        .routes(routes!(get_session, close_session))
}

/// Default page size of `GET /v1/sessions`.
const DEFAULT_PAGE: u32 = 50;

/// Create a session.
///
/// Create a session: a fresh workspace (optionally seeded with `files`), a policy and a tool set.
#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", security(("bearer" = [])),
    request_body = NewSession,
    responses(
        (status = 201, description = "Created", body = Session),
        (status = 409, description = "The tenant already has as many open sessions as the operator allows (`too_many_open_sessions`, `limits.max_open_sessions_per_tenant`); close sessions it no longer needs and retry", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Unknown tool in `tools`, a policy above the operator's ceiling, a bad seed path or env name, a NUL character in `metadata` (`unknown_tool`, `policy_above_ceiling`, `invalid_seed_file`, `invalid_env`, `invalid_metadata`, `invalid_request`); an `environment.image` the operator does not allow, that the registry does not have, for another platform, too large or not a valid image (`image_not_allowed`, `image_not_found`, `image_wrong_platform`, `image_too_large`, `invalid_image`)", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "The image's registry refused the pull or could not be reached (`registry_unauthorized`, `registry_unreachable`); nothing was created", body = Problem, content_type = "application/problem+json"),
    ))]
async fn create_session(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    ApiJson(new): ApiJson<NewSession>,
) -> Result<(StatusCode, Json<Session>), ApiError> {
    let session = state.engine.create_session(tenant.id, new).await?;
    Ok((StatusCode::CREATED, Json(session)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Page size (1–200, default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    #[param(format = Uuid)]
    pub cursor: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionList {
    /// Newest first. A session larger than the page's bound alone shows the beginnings of its
    /// `tools`, `env` and `metadata` only, with `truncated`.
    pub sessions: Vec<Session>,
    /// Pass as `cursor` for the next page; `null` on the last page. A page ends early, with
    /// this cursor, where the next session would take it over the service's
    /// `limits.page_bytes`.
    pub next_cursor: Option<String>,
}

/// List sessions.
///
/// The caller's sessions, newest first, cursor-paginated: at most `limit` of them and at most
/// the service's `limits.page_bytes` of JSON (a session larger than that alone is shown
/// truncated, and `GET /v1/sessions/{id}` serves it whole).
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", security(("bearer" = [])),
    params(ListQuery),
    responses((status = 200, description = "A page of sessions", body = SessionList)))]
async fn list_sessions(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<axum::response::Response, ApiError> {
    let before = match q.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => Some(Uuid::parse_str(c).map_err(|_| {
            ApiError::new(
                ProblemCode::InvalidQuery,
                "cursor: pass the next_cursor of a previous page",
            )
        })?),
    };
    let page = state
        .engine
        .streams()
        .list_sessions(tenant.id, before, q.limit.unwrap_or(DEFAULT_PAGE))
        .await?;
    let next = match page.next_before {
        Some(id) => format!("\"{id}\""),
        None => "null".into(),
    };
    // Each session is serialized as the body is sent, and dropped once it is.
    let sessions = page.sessions.into_iter().enumerate().map(|(i, s)| {
        let mut json = if i == 0 { String::new() } else { ",".into() };
        json.push_str(&serde_json::to_string(&s).unwrap_or_else(|_| "null".into()));
        json
    });
    Ok(super::log::json_body(
        std::iter::once("{\"sessions\":[".to_owned())
            .chain(sessions)
            .chain(std::iter::once(format!("],\"next_cursor\":{next}}}"))),
    ))
}

/// One session.
///
/// Its status, policy, tools, environment and metadata, when it was created and closed, and the
/// seq of its last event.
#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The session", body = Session),
        (status = 404, description = "No such session for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_session(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
) -> Result<Json<Session>, ApiError> {
    Ok(Json(
        state
            .engine
            .get_session(tenant.id, id)
            .await
            .map_err(or_not_found("session"))?,
    ))
}

/// Close a session.
///
/// Close a session: its workspace is removed; its log stays readable. Closing twice is fine.
#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The closed session", body = Session),
        (status = 404, description = "No such session for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn close_session(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
) -> Result<Json<Session>, ApiError> {
    let closed = state
        .engine
        .close_session(tenant.id, id)
        .await
        .map_err(or_not_found("session"))?;
    // Its terminals ended with it: the names its SWE-ReX clients gave them go too.
    crate::swerex::names::forget_session(id);
    Ok(Json(closed))
}
