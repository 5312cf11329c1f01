//! The agent ecosystems' shapes of a tool and of a tool's result: OpenAI (Responses and Chat
//! Completions), Anthropic Messages and MCP. Tool definitions are in each provider's strict
//! form (`toolexec_tools::schema::strict_schema`): a provider in strict mode accepts them as
//! they are. Results are what the provider expects back in the next request.
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolexec_core::{CallResult, Capability, ToolSpec};
use toolexec_tools::schema::{Dialect, strict_schema};
use utoipa::ToSchema;

/// OpenAI Responses API `tools` entry (strict mode).
#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiTool {
    /// Always `function`.
    #[schema(value_type = String, example = "function")]
    pub r#type: &'static str,
    pub name: String,
    pub description: String,
    /// The arguments' JSON Schema in OpenAI's strict form: closed objects, every property
    /// required, optional ones nullable (`null` means "not given").
    #[schema(value_type = Object)]
    pub parameters: Value,
    /// Always `true`.
    pub strict: bool,
}

/// OpenAI Chat Completions `tools` entry (strict mode).
#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiChatTool {
    /// Always `function`.
    #[schema(value_type = String, example = "function")]
    pub r#type: &'static str,
    pub function: OpenAiChatFunction,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenAiChatFunction {
    pub name: String,
    pub description: String,
    /// As [`OpenAiTool::parameters`].
    #[schema(value_type = Object)]
    pub parameters: Value,
    /// Always `true`.
    pub strict: bool,
}

/// Anthropic Messages `tools` entry (strict tool use).
#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AnthropicTool {
    pub name: String,
    pub description: String,
    /// The arguments' JSON Schema in Anthropic's strict form (as OpenAI's, without the
    /// numeric and length constraints it does not take: the descriptions say them, and the
    /// service enforces them).
    #[schema(value_type = Object)]
    pub input_schema: Value,
    /// Always `true`.
    pub strict: bool,
}

/// An MCP `tools/list` entry.
#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct McpTool {
    pub name: String,
    pub description: String,
    /// toolexec's own form of the schema (MCP has no strict mode).
    #[serde(rename = "inputSchema")]
    #[schema(value_type = Object)]
    pub input_schema: Value,
    pub annotations: McpAnnotations,
}

/// What an MCP client is told about a tool's effects.
#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct McpAnnotations {
    /// It changes nothing (files, processes).
    #[serde(rename = "readOnlyHint")]
    pub read_only_hint: bool,
    /// It may overwrite or delete what is there (files, processes, the session's plan): every
    /// tool that is not read-only here.
    #[serde(rename = "destructiveHint")]
    pub destructive_hint: bool,
    /// It reaches outside the session: the network (in the catalog, tools with the `network`
    /// capability; on a session's MCP endpoint also the tools that run processes when the
    /// session's policy allows the network).
    #[serde(rename = "openWorldHint")]
    pub open_world_hint: bool,
}

pub fn openai(spec: &ToolSpec) -> OpenAiTool {
    OpenAiTool {
        r#type: "function",
        name: spec.name.clone(),
        description: spec.description.clone(),
        parameters: strict_schema(&spec.input_schema, Dialect::OpenAi),
        strict: true,
    }
}

pub fn openai_chat(spec: &ToolSpec) -> OpenAiChatTool {
    OpenAiChatTool {
        r#type: "function",
        function: OpenAiChatFunction {
            name: spec.name.clone(),
            description: spec.description.clone(),
            parameters: strict_schema(&spec.input_schema, Dialect::OpenAi),
            strict: true,
        },
    }
}

pub fn anthropic(spec: &ToolSpec) -> AnthropicTool {
    AnthropicTool {
        name: spec.name.clone(),
        description: spec.description.clone(),
        input_schema: strict_schema(&spec.input_schema, Dialect::Anthropic),
        strict: true,
    }
}

pub fn mcp(spec: &ToolSpec) -> McpTool {
    McpTool {
        name: spec.name.clone(),
        description: spec.description.clone(),
        input_schema: spec.input_schema.clone(),
        annotations: mcp_annotations(spec, false),
    }
}

/// What an MCP client is told about a tool's effects, from what the tool declares (never from
/// its name): read-only tools are `readOnlyHint`; every other tool may overwrite or delete
/// (files, processes, the session's plan), so it is `destructiveHint`; a tool with the
/// `network` capability is `openWorldHint`, and so is a tool that runs processes
/// (`process`) in a session whose policy lets commands reach the network (`session_network`).
pub fn mcp_annotations(spec: &ToolSpec, session_network: bool) -> McpAnnotations {
    McpAnnotations {
        read_only_hint: spec.read_only,
        destructive_hint: !spec.read_only,
        open_world_hint: spec.has(Capability::Network)
            || (session_network && spec.has(Capability::Process)),
    }
}

/// The MCP SDK's shape of a tool (`tools/list` of the MCP endpoint): the same name,
/// description, schema and annotations as [`mcp`].
pub fn mcp_tool(spec: &ToolSpec, session_network: bool) -> rmcp::model::Tool {
    let a = mcp_annotations(spec, session_network);
    let schema = match &spec.input_schema {
        Value::Object(map) => map.clone(),
        _ => serde_json::Map::new(),
    };
    rmcp::model::Tool::new(spec.name.clone(), spec.description.clone(), schema).with_annotations(
        rmcp::model::ToolAnnotations::new()
            .read_only(a.read_only_hint)
            .destructive(a.destructive_hint)
            .open_world(a.open_world_hint),
    )
}

/// A call's result as an MCP `CallToolResult`: the content the model reads as one text block,
/// `isError` for every status but `ok`. No tool declares an output schema, so there is no
/// `structuredContent`. `_meta` says where the call is in the record (`toolexec/invocation_id`,
/// `toolexec/status`, `toolexec/seq`). `resultType` is `complete` (2026-07-28); the SDK drops it
/// for peers of older versions, and the REST rendering leaves it out.
pub fn mcp_result(result: &CallResult) -> rmcp::model::CallToolResult {
    let content = vec![rmcp::model::ContentBlock::text(result.content.clone())];
    let mut out = if result.is_error {
        rmcp::model::CallToolResult::error(content)
    } else {
        rmcp::model::CallToolResult::success(content)
    };
    let mut meta = rmcp::model::MetaObject::new();
    meta.0.insert(
        "toolexec/invocation_id".into(),
        json!(result.invocation_id.to_string()),
    );
    meta.0
        .insert("toolexec/status".into(), json!(result.status.as_str()));
    meta.0.insert("toolexec/seq".into(), json!(result.seq));
    out.meta = Some(meta);
    out
}

/// A shape a call's result can be rendered in (`?format=` of the calls endpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResultFormat {
    /// OpenAI Responses `function_call_output` item.
    Openai,
    /// OpenAI Chat Completions `tool` message.
    OpenaiChat,
    /// Anthropic `tool_result` content block.
    Anthropic,
    /// MCP `CallToolResult`.
    Mcp,
}

/// `result` as `format` expects it back. OpenAI has no error flag: the content says it (every
/// failed call's content says what went wrong), and it is prefixed with its status.
pub fn render_result(result: &CallResult, format: ResultFormat) -> Value {
    match format {
        ResultFormat::Openai => json!({
            "type": "function_call_output",
            "call_id": result.call_id,
            "output": flagged(result),
        }),
        ResultFormat::OpenaiChat => json!({
            "role": "tool",
            "tool_call_id": result.call_id,
            "content": flagged(result),
        }),
        ResultFormat::Anthropic => json!({
            "type": "tool_result",
            "tool_use_id": result.call_id,
            "content": result.content,
            "is_error": result.is_error,
        }),
        ResultFormat::Mcp => {
            let mut r = mcp_result(result);
            r.result_type = None;
            serde_json::to_value(r).unwrap_or_default()
        }
    }
}

/// The content for a dialect without an error flag: a failed call's says so first.
fn flagged(result: &CallResult) -> String {
    if result.is_error {
        format!("[{}] {}", result.status.as_str(), result.content)
    } else {
        result.content.clone()
    }
}
