//! Running a batch of tool calls.
use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use toolexec_core::{Call, CallResult};
use toolexec_engine::CallBatch;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::SharedState;
use crate::auth::AuthTenant;
use crate::dialects::{ResultFormat, render_result};
use crate::extract::{ApiJson, ApiQuery, parse_id};
use crate::problem::{ApiError, Problem, or_not_found};

pub fn router() -> OpenApiRouter<SharedState> {
    OpenApiRouter::new().routes(routes!(run_calls))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CallsRequest {
    /// The model's tool calls, in the order it emitted them. Each tool's argument schema is in
    /// the components as `tool.<name>.arguments` and at `GET /v1/tools`. At least one;
    /// at most `limits.max_calls_per_batch` (64 by default).
    #[schema(min_items = 1)]
    pub calls: Vec<Call>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CallsResponse {
    /// One result per call, in request order.
    pub results: Vec<CallResultOut>,
}

/// A call's result, and with `?format=` the same result as that ecosystem expects it back in
/// the model's next request.
#[derive(Debug, Serialize, ToSchema)]
pub struct CallResultOut {
    #[serde(flatten)]
    pub result: CallResult,
    /// The result in the shape `format` asked for: OpenAI's `function_call_output` item
    /// (`openai`; no error flag there, so a failed call's output starts with its status in
    /// brackets), a Chat Completions `tool` message (`openai_chat`), an Anthropic
    /// `tool_result` block with `is_error` (`anthropic`), an MCP `CallToolResult` with
    /// `isError` (`mcp`). Absent without `format`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>, nullable = false)]
    pub rendered: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CallsQuery {
    /// Also give each result in this ecosystem's shape (`rendered`).
    #[param(inline)]
    pub format: Option<ResultFormat>,
}

/// Run a batch of tool calls.
///
/// Read-only calls of a batch run concurrently; a mutating call waits for everything before it
/// and holds back everything after it. A call id already recorded in this session returns the
/// recorded result without running again (a retry of a still-running call waits for it); the same
/// id with other arguments is a 409. A failing tool is not an HTTP error: its result has
/// `is_error: true` and a `content` telling the model what went wrong and how to recover.
///
/// The batch does not depend on this request staying open: if the client disconnects, the call
/// running then finishes and is recorded, and the calls that had not started are recorded
/// `cancelled` without running; a retry of the batch returns those records. To stop calls, use
/// `POST /v1/invocations/{id}/cancel` or `POST /v1/sessions/{id}/cancel`.
#[utoipa::path(post, path = "/v1/sessions/{id}/calls", tag = "calls", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Session id"), CallsQuery),
    request_body = CallsRequest,
    responses(
        (status = 200, description = "One result per call, in request order", body = CallsResponse),
        (status = 404, description = "No such session for this tenant (`not_found`)", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A call id reused with other arguments (`call_id_reused`), or the session is closed (`session_closed`); nothing ran", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`still_running`: the batch ran longer than `limits.request_timeout_ms` and goes on — send the same calls again (same ids) to collect their results; or `unavailable` / `overloaded` (nothing ran). Retry after `Retry-After` seconds.", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Bad envelope: JSON the `CallsRequest` schema refuses — an empty batch, a call id of the wrong length, a call that is not an object — is `invalid_request` with a JSON pointer in the detail; a call id or tool name holding NUL is `invalid_call_id` or `invalid_tool_name`; more calls than `limits.max_calls_per_batch` is `batch_too_large`", body = Problem, content_type = "application/problem+json"),
    ))]
async fn run_calls(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<CallsQuery>,
    ApiJson(req): ApiJson<CallsRequest>,
) -> Result<Json<CallsResponse>, ApiError> {
    let id = parse_id(&id, "session")?;
    let results = state
        .engine
        .run_calls(tenant.id, id, CallBatch::new(req.calls))
        .await
        .map_err(or_not_found("session"))?;
    Ok(Json(CallsResponse {
        results: results
            .into_iter()
            .map(|result| CallResultOut {
                rendered: q.format.map(|f| render_result(&result, f)),
                result,
            })
            .collect(),
    }))
}
