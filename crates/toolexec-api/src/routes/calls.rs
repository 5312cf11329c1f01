//! Running a batch of tool calls.
use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use toolexec_core::{Call, CallResult};
use toolexec_engine::{CallBatch, SessionRef};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::SharedState;
use crate::auth::AuthTenant;
use crate::dialects::{
    ApplyPatchCallItem, ResultFormat, ShellCallItem, apply_patch_output, operation_patch,
    render_result, shell_output,
};
use crate::extract::{ApiJson, ApiQuery};
use crate::problem::{ApiError, Problem, or_not_found};
use crate::session_path::{Routed, SessionPath};

pub fn router() -> OpenApiRouter<SharedState> {
    OpenApiRouter::new().routes(routes!(run_calls))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CallsRequest {
    /// The model's tool calls, in the order it emitted them. Each tool's argument schema is in
    /// the components as `tool.<name>.arguments` and at `GET /v1/tools`. At least one;
    /// at most `limits.max_calls_per_batch` (64 by default), counting each command of a
    /// `shell_call` as a call. With `?format=openai`, the Responses API's `shell_call` and
    /// `apply_patch_call` output items may be given as they are, among the calls.
    #[schema(min_items = 1)]
    pub calls: Vec<CallItem>,
}

/// A tool call, or (with `?format=openai`) an OpenAI Responses output item the client runs.
#[derive(Debug, Clone, ToSchema)]
#[serde(untagged)]
pub enum CallItem {
    Call(Call),
    ShellCall(ShellCallItem),
    ApplyPatchCall(ApplyPatchCallItem),
}

impl<'de> Deserialize<'de> for CallItem {
    /// By the item's `type`: a call has none. (The body was checked against the schema first,
    /// which names the field that is wrong.)
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = serde_json::Value::deserialize(d)?;
        let kind = value.get("type").and_then(serde_json::Value::as_str);
        match kind {
            None => serde_json::from_value(value).map(CallItem::Call),
            Some("shell_call") => serde_json::from_value(value).map(CallItem::ShellCall),
            Some("apply_patch_call") => serde_json::from_value(value).map(CallItem::ApplyPatchCall),
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "unknown item type {other:?} (a call has no type; the OpenAI items taken \
                     are shell_call and apply_patch_call)"
                )));
            }
        }
        .map_err(D::Error::custom)
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CallsResponse {
    /// One result per call (or OpenAI item), in request order.
    pub results: Vec<ItemResultOut>,
}

/// The result of a call, or of an OpenAI Responses item.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ItemResultOut {
    Call(CallResultOut),
    Item(OpenAiItemResultOut),
}

/// What a `shell_call` or `apply_patch_call` item did: the calls it ran, and the output item
/// to hand back to the Responses API.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiItemResultOut {
    /// The item's `type`: `shell_call` or `apply_patch_call`.
    #[schema(example = "shell_call")]
    pub r#type: String,
    /// The item's `call_id`.
    pub call_id: String,
    /// The calls it ran, in order, as recorded: a `shell` call per command (ids
    /// `{call_id}#1`, `{call_id}#2`, …), or one `apply_patch` call (id `call_id`). Empty when
    /// the item was refused before anything ran (a diff with another file's header).
    pub calls: Vec<CallResult>,
    /// `shell_call_output {call_id, max_output_length, output: [{stdout, stderr, outcome}]}`
    /// (one entry per command, `outcome` `{"type": "exit", "exit_code"}` or
    /// `{"type": "timeout"}`), or `apply_patch_call_output {call_id, status: completed |
    /// failed, output}`.
    #[schema(value_type = Object)]
    pub rendered: serde_json::Value,
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
    SessionPath(id): SessionPath,
    Routed(lease): Routed,
    ApiQuery(q): ApiQuery<CallsQuery>,
    ApiJson(req): ApiJson<CallsRequest>,
) -> Result<Json<CallsResponse>, ApiError> {
    let openai = q.format == Some(ResultFormat::Openai);
    let plan = Plan::of(
        req.calls,
        openai,
        state.engine.config().limits.max_timeout_ms,
    )?;
    let results = if plan.calls.is_empty() {
        // Every item was refused before running (an apply_patch_call naming other files):
        // nothing to run, but the session must be there.
        state
            .engine
            .get_session(tenant.id, id)
            .await
            .map_err(or_not_found("session"))?;
        Vec::new()
    } else {
        let limits = &state.engine.config().limits;
        let batch = CallBatch::new(plan.calls, limits.max_calls_per_batch)?;
        state
            .engine
            .run_calls(SessionRef::new(tenant.id, id).with_lease(lease), batch)
            .await
            .map_err(or_not_found("session"))?
    };
    let mut results = results.into_iter();
    let mut out = Vec::with_capacity(plan.items.len());
    for item in plan.items {
        match item {
            Planned::Call => {
                let Some(result) = results.next() else { break };
                out.push(ItemResultOut::Call(CallResultOut {
                    rendered: q.format.map(|f| render_result(&result, f)),
                    result,
                }));
            }
            Planned::Shell {
                call_id,
                commands,
                max_output_length,
            } => {
                let calls: Vec<CallResult> = results.by_ref().take(commands).collect();
                out.push(ItemResultOut::Item(OpenAiItemResultOut {
                    r#type: "shell_call".to_owned(),
                    rendered: shell_output(&call_id, max_output_length, &calls),
                    call_id,
                    calls,
                }));
            }
            Planned::Patch { call_id, refused } => {
                let calls: Vec<CallResult> = match &refused {
                    Some(_) => Vec::new(),
                    None => results.next().into_iter().collect(),
                };
                let rendered = match (&refused, calls.first()) {
                    (Some(why), _) => apply_patch_output(&call_id, Err(why)),
                    (None, Some(result)) => apply_patch_output(&call_id, Ok(result)),
                    (None, None) => break,
                };
                out.push(ItemResultOut::Item(OpenAiItemResultOut {
                    r#type: "apply_patch_call".to_owned(),
                    call_id,
                    calls,
                    rendered,
                }));
            }
        }
    }
    Ok(Json(CallsResponse { results: out }))
}

/// A request's items as the engine's calls, and how to give each item its result back.
struct Plan {
    calls: Vec<Call>,
    items: Vec<Planned>,
}

enum Planned {
    /// One call, one result.
    Call,
    /// A shell_call: `commands` results, one `shell` call each.
    Shell {
        call_id: String,
        commands: usize,
        max_output_length: Option<u64>,
    },
    /// An apply_patch_call: one `apply_patch` call, or none when refused before running.
    Patch {
        call_id: String,
        refused: Option<String>,
    },
}

impl Plan {
    /// `max_timeout_ms`: the operator's ceiling, which a shell_call's `timeout_ms` is held to
    /// (the model asked for it without knowing this service's ceiling).
    fn of(items: Vec<CallItem>, openai: bool, max_timeout_ms: u64) -> Result<Self, ApiError> {
        let mut plan = Plan {
            calls: Vec::with_capacity(items.len()),
            items: Vec::with_capacity(items.len()),
        };
        for (index, item) in items.into_iter().enumerate() {
            let native = |what: &str| {
                ApiError::new(
                    toolexec_core::ProblemCode::InvalidRequest,
                    format!(
                        "request body at '/calls/{index}': a {what} item is OpenAI's, and \
                         answered in OpenAI's shape: send the batch with ?format=openai"
                    ),
                )
            };
            match item {
                CallItem::Call(call) => {
                    plan.calls.push(call);
                    plan.items.push(Planned::Call);
                }
                CallItem::ShellCall(shell) => {
                    if !openai {
                        return Err(native("shell_call"));
                    }
                    let environment = shell
                        .environment
                        .as_ref()
                        .filter(|e| !e.is_null())
                        .map(|e| e.get("type").and_then(serde_json::Value::as_str));
                    if let Some(kind) = environment
                        && kind != Some("local")
                    {
                        return Err(ApiError::new(
                            toolexec_core::ProblemCode::InvalidRequest,
                            format!(
                                "request body at '/calls/{index}/environment': a shell_call in \
                                 a {} environment runs in OpenAI's hosted container, not here; \
                                 only calls with no environment or a local one are the \
                                 client's to run",
                                kind.unwrap_or("typeless")
                            ),
                        ));
                    }
                    let commands = shell.action.commands.len();
                    for (n, command) in shell.action.commands.into_iter().enumerate() {
                        let mut arguments = serde_json::json!({ "command": command });
                        if let Some(t) = shell.action.timeout_ms {
                            arguments["timeout_ms"] = t.clamp(1, max_timeout_ms).into();
                        }
                        plan.calls.push(Call {
                            id: format!("{}#{}", shell.call_id, n + 1),
                            name: "shell".to_owned(),
                            arguments,
                        });
                    }
                    plan.items.push(Planned::Shell {
                        call_id: shell.call_id,
                        commands,
                        max_output_length: shell.action.max_output_length,
                    });
                }
                CallItem::ApplyPatchCall(patch) => {
                    if !openai {
                        return Err(native("apply_patch_call"));
                    }
                    let refused = match operation_patch(&patch.operation) {
                        Ok(text) => {
                            plan.calls.push(Call {
                                id: patch.call_id.clone(),
                                name: "apply_patch".to_owned(),
                                arguments: serde_json::json!({ "patch": text }),
                            });
                            None
                        }
                        Err(why) => Some(why),
                    };
                    plan.items.push(Planned::Patch {
                        call_id: patch.call_id,
                        refused,
                    });
                }
            }
        }
        Ok(plan)
    }
}
