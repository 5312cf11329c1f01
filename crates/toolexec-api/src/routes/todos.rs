//! A session's todos: the steps of its plan and its tasks, as its log has them now.
use axum::Json;
use axum::extract::State;
use serde::Serialize;
use toolexec_core::todo::Todo;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::SharedState;
use crate::auth::AuthTenant;
use crate::problem::{ApiError, Problem, or_not_found};
use crate::session_path::SessionPath;

pub fn router() -> OpenApiRouter<SharedState> {
    OpenApiRouter::new().routes(routes!(get_todos))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionTodos {
    pub session_id: Uuid,
    /// The plan's steps in plan order (`source: "plan"`, from `update_plan`), then the tasks in
    /// the order they were created (`source: "task"`, from `TaskCreate`). Deleted ones are
    /// gone; the `todo.*` events of the log have their history.
    pub todos: Vec<Todo>,
}

/// A session's plan and tasks.
///
/// The session's current plan and tasks, folded from its `todo.*` events (any node, also after
/// the session closed).
#[utoipa::path(get, path = "/v1/sessions/{id}/todos", tag = "sessions", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Session id")),
    responses(
        (status = 200, description = "The current plan and tasks", body = SessionTodos),
        (status = 404, description = "No such session for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn get_todos(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
) -> Result<Json<SessionTodos>, ApiError> {
    let todos = state
        .engine
        .todos_of(&tenant.id, id)
        .await
        .map_err(or_not_found("session"))?;
    Ok(Json(SessionTodos {
        session_id: id,
        todos: todos.items,
    }))
}
