//! The tool catalog, in toolexec's shape or in another ecosystem's tool-definition shape.
use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolexec_core::ToolSpec;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::SharedState;
use crate::auth::AuthTenant;
use crate::extract::ApiQuery;
use crate::problem::ApiError;

pub fn router() -> OpenApiRouter<SharedState> {
    OpenApiRouter::new()
        .routes(routes!(list_tools))
        .routes(routes!(get_tool))
}

#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CatalogFormat {
    /// toolexec's own shape (`ToolSpec`).
    #[default]
    Toolexec,
    /// OpenAI Chat Completions `tools`: `{"type":"function","function":{name,description,parameters}}`.
    Openai,
    /// Anthropic Messages `tools`: `{name, description, input_schema}`.
    Anthropic,
    /// MCP `tools/list` entries: `{name, description, inputSchema, annotations}`.
    Mcp,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CatalogQuery {
    /// Shape of each entry; default toolexec's own.
    #[serde(default)]
    pub format: CatalogFormat,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Catalog {
    /// `ToolSpec` objects, or the requested ecosystem's definitions.
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
}

fn render(spec: &ToolSpec, format: CatalogFormat) -> Value {
    match format {
        CatalogFormat::Toolexec => serde_json::to_value(spec).unwrap_or_default(),
        CatalogFormat::Openai => json!({
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": spec.input_schema,
            }
        }),
        CatalogFormat::Anthropic => json!({
            "name": spec.name,
            "description": spec.description,
            "input_schema": spec.input_schema,
        }),
        CatalogFormat::Mcp => json!({
            "name": spec.name,
            "description": spec.description,
            "inputSchema": spec.input_schema,
            "annotations": {
                "readOnlyHint": spec.read_only,
                "destructiveHint": !spec.read_only,
                "openWorldHint": spec.has(toolexec_core::Capability::Network),
            }
        }),
    }
}

/// The tool catalog.
#[utoipa::path(get, path = "/v1/tools", tag = "tools", params(CatalogQuery), security(("bearer" = [])),
    responses((status = 200, description = "The catalog", body = Catalog)))]
async fn list_tools(
    State(state): State<SharedState>,
    _tenant: AuthTenant,
    ApiQuery(q): ApiQuery<CatalogQuery>,
) -> Json<Catalog> {
    let tools = state
        .engine
        .registry()
        .specs()
        .map(|s| render(s, q.format))
        .collect();
    Json(Catalog { tools })
}

/// One tool.
#[utoipa::path(get, path = "/v1/tools/{name}", tag = "tools", security(("bearer" = [])),
    params(("name" = String, Path, description = "Tool name"), CatalogQuery),
    responses(
        (status = 200, description = "The tool (a `ToolSpec` unless `format` says otherwise)", body = ToolSpec),
        (status = 404, description = "No such tool (`not_found`)", body = crate::problem::Problem, content_type = "application/problem+json"),
    ))]
async fn get_tool(
    State(state): State<SharedState>,
    _tenant: AuthTenant,
    Path(name): Path<String>,
    ApiQuery(q): ApiQuery<CatalogQuery>,
) -> Result<Json<Value>, ApiError> {
    let tool = state
        .engine
        .registry()
        .get(&name)
        .ok_or_else(|| ApiError::not_found(&format!("tool '{name}'")))?;
    Ok(Json(render(tool.spec(), q.format)))
}
