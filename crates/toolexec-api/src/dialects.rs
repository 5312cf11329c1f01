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
    /// It may overwrite or delete what is there (files, processes): every tool that is not
    /// read-only here.
    #[serde(rename = "destructiveHint")]
    pub destructive_hint: bool,
    /// It reaches outside the session (the network).
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
        annotations: McpAnnotations {
            read_only_hint: spec.read_only,
            destructive_hint: !spec.read_only,
            open_world_hint: spec.has(Capability::Network),
        },
    }
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
        ResultFormat::Mcp => json!({
            "content": [{"type": "text", "text": result.content}],
            "isError": result.is_error,
        }),
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
