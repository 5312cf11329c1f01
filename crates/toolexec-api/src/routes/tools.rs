//! The tool catalog, in toolexec's shape or in another ecosystem's tool-definition shape.
use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use toolexec_core::ToolSpec;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::SharedState;
use crate::auth::AuthTenant;
use crate::dialects;
use crate::extract::ApiQuery;
use crate::problem::ApiError;
use crate::session_path::SessionPath;

pub fn router() -> OpenApiRouter<SharedState> {
    OpenApiRouter::new()
        .routes(routes!(list_tools))
        .routes(routes!(get_tool))
        .routes(routes!(session_tools))
}

#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CatalogFormat {
    /// toolexec's own shape (`ToolSpec` and what this service says of it).
    #[default]
    Toolexec,
    /// OpenAI Responses `tools`: `{"type":"function", name, description, parameters, "strict":true}`,
    /// the schema in OpenAI's strict form.
    Openai,
    /// OpenAI Chat Completions `tools`: `{"type":"function","function":{name, description, parameters, "strict":true}}`.
    OpenaiChat,
    /// Anthropic Messages `tools`: `{name, description, input_schema, "strict":true}`, the schema
    /// in Anthropic's strict form; the tools Anthropic defines itself (`bash`,
    /// `str_replace_based_edit_tool`) as their native types unless `native=false`.
    Anthropic,
    /// MCP `tools/list` entries: `{name, description, inputSchema, annotations}`.
    Mcp,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CatalogQuery {
    /// Shape of each entry; default toolexec's own.
    #[serde(default)]
    #[param(inline)]
    pub format: CatalogFormat,
    /// With `format=anthropic`: list the tools Anthropic defines itself as their native types,
    /// `{"type": "bash_20250124", "name": "bash"}` and `{"type": "text_editor_20250728",
    /// "name": "str_replace_based_edit_tool"}`, which the model is trained on (default `true`).
    /// `false` lists them as function tools with their schemas like every other tool.
    #[serde(default = "yes")]
    #[param(default = true)]
    pub native: bool,
}

fn yes() -> bool {
    true
}

/// A tool as toolexec's catalog shows it: its spec, and whether this service can run it.
#[derive(Debug, Serialize, ToSchema)]
pub struct CatalogEntry {
    #[serde(flatten)]
    pub spec: ToolSpec,
    /// False when the service cannot run the tool (a provider it needs is not configured);
    /// its calls then fail saying so. The other formats leave such tools out of the list.
    pub available: bool,
    /// Why it is not available.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub unavailable_reason: Option<String>,
    /// For tools that reach the network (`web_fetch`, `web_search`): whether a session needs
    /// `policy.network: "allow"` to use them (`true`), or this service lets them reach the
    /// public internet in every session (`false`: the operator's
    /// `web.public_when_network_none`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub requires_session_network: Option<bool>,
}

/// One tool in the shape `format` asks for.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum ToolDefinition {
    Toolexec(CatalogEntry),
    Openai(dialects::OpenAiTool),
    OpenaiChat(dialects::OpenAiChatTool),
    Anthropic(dialects::AnthropicTool),
    AnthropicNative(dialects::AnthropicNativeTool),
    Mcp(dialects::McpTool),
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Catalog {
    /// `ToolSpec` objects, or the requested ecosystem's definitions.
    pub tools: Vec<ToolDefinition>,
}

/// What this service says of a tool besides its spec.
struct Deployment {
    unavailable: Option<String>,
    /// `web.public_when_network_none`.
    web_without_session_network: bool,
}

impl Deployment {
    fn of(state: &SharedState, name: &str) -> Self {
        Self {
            unavailable: state.engine.unavailable(name),
            web_without_session_network: state.engine.config().web.public_when_network_none,
        }
    }
}

fn render(spec: &ToolSpec, here: Deployment, q: &CatalogQuery) -> ToolDefinition {
    match q.format {
        CatalogFormat::Toolexec => ToolDefinition::Toolexec(CatalogEntry {
            spec: spec.clone(),
            available: here.unavailable.is_none(),
            unavailable_reason: here.unavailable,
            requires_session_network: spec
                .has(toolexec_core::Capability::Network)
                .then_some(!here.web_without_session_network),
        }),
        CatalogFormat::Openai => ToolDefinition::Openai(dialects::openai(spec)),
        CatalogFormat::OpenaiChat => ToolDefinition::OpenaiChat(dialects::openai_chat(spec)),
        CatalogFormat::Anthropic => match dialects::anthropic_native(spec).filter(|_| q.native) {
            Some(native) => ToolDefinition::AnthropicNative(native),
            None => ToolDefinition::Anthropic(dialects::anthropic(spec)),
        },
        CatalogFormat::Mcp => ToolDefinition::Mcp(dialects::mcp(spec)),
    }
}

/// The tool catalog.
///
/// The tool catalog. In toolexec's shape every tool is listed, each saying whether this service
/// can run it (`available`); the other shapes list only the tools it can run.
#[utoipa::path(get, path = "/v1/tools", tag = "tools", params(CatalogQuery), security(("bearer" = [])),
    responses((status = 200, description = "The catalog", body = Catalog)))]
async fn list_tools(
    State(state): State<SharedState>,
    _tenant: AuthTenant,
    ApiQuery(q): ApiQuery<CatalogQuery>,
) -> Json<Catalog> {
    Json(catalog(&state, &q, |_| true))
}

/// One tool.
/// The catalog's tools that `include` names, in `format`.
fn catalog(state: &SharedState, q: &CatalogQuery, include: impl Fn(&str) -> bool) -> Catalog {
    let tools = state
        .engine
        .registry()
        .specs()
        .filter(|s| include(&s.name))
        .filter_map(|s| {
            let here = Deployment::of(state, &s.name);
            // A definition handed to a model is a tool it may call: not one that can only fail.
            (here.unavailable.is_none() || matches!(q.format, CatalogFormat::Toolexec))
                .then(|| render(s, here, q))
        })
        .collect();
    Catalog { tools }
}

/// The tools a session may call.
///
/// The tools a session may call — its allow-list (all the catalog's when it has none), as
/// `GET /v1/tools` shows them, in any format: what to hand that session's model.
#[utoipa::path(get, path = "/v1/sessions/{id}/tools", tag = "tools", security(("bearer" = [])),
    params(("id" = uuid::Uuid, Path, description = "Session id"), CatalogQuery),
    responses(
        (status = 200, description = "The session's tools", body = Catalog),
        (status = 404, description = "No such session for this tenant (`not_found`)", body = crate::problem::Problem, content_type = "application/problem+json"),
    ))]
async fn session_tools(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    SessionPath(id): SessionPath,
    ApiQuery(q): ApiQuery<CatalogQuery>,
) -> Result<Json<Catalog>, ApiError> {
    let session = state
        .engine
        .get_session(tenant.id, id)
        .await
        .map_err(crate::problem::or_not_found("session"))?;
    Ok(Json(catalog(&state, &q, |name| session.allows_tool(name))))
}

/// One tool of the catalog.
///
/// Its manual and JSON Schema and whether this service can run it (`available`), in toolexec's
/// shape (a `ToolSpec`), or as a provider takes it (`format`).
#[utoipa::path(get, path = "/v1/tools/{name}", tag = "tools", security(("bearer" = [])),
    params(("name" = String, Path, description = "Tool name (the catalog's names are listed in this parameter's schema)"), CatalogQuery),
    responses(
        (status = 200, description = "The tool (a `ToolSpec` unless `format` says otherwise)", body = ToolDefinition),
        (status = 404, description = "No such tool (`not_found`)", body = crate::problem::Problem, content_type = "application/problem+json"),
    ))]
async fn get_tool(
    State(state): State<SharedState>,
    _tenant: AuthTenant,
    Path(name): Path<String>,
    ApiQuery(q): ApiQuery<CatalogQuery>,
) -> Result<Json<ToolDefinition>, ApiError> {
    let tool = state
        .engine
        .registry()
        .get(&name)
        .ok_or_else(|| ApiError::not_found(&format!("tool '{name}'")))?;
    Ok(Json(render(tool.spec(), Deployment::of(&state, &name), &q)))
}
