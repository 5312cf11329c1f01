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

/// An Anthropic Messages `tools` entry for a tool Anthropic defines itself: its type and name,
/// no schema (the model knows the tool's arguments).
#[derive(Debug, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AnthropicNativeTool {
    pub r#type: AnthropicNativeType,
    /// `bash` or `str_replace_based_edit_tool`.
    pub name: String,
}

/// The Anthropic-defined tool types this service runs. A closed set in the document, so that a
/// generated client tells an entry of this shape from an OpenAI `function` entry (both have a
/// `type` and a `name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub enum AnthropicNativeType {
    /// The persistent shell, `bash`.
    #[serde(rename = "bash_20250124")]
    Bash20250124,
    /// The text editor, `str_replace_based_edit_tool`.
    #[serde(rename = "text_editor_20250728")]
    TextEditor20250728,
}

/// The Anthropic-defined tool type of a catalog tool, by its name: the tools that take
/// exactly Anthropic's arguments under Anthropic's name (SPEC §4).
pub fn anthropic_native_type(name: &str) -> Option<AnthropicNativeType> {
    match name {
        "bash" => Some(AnthropicNativeType::Bash20250124),
        "str_replace_based_edit_tool" => Some(AnthropicNativeType::TextEditor20250728),
        _ => None,
    }
}

/// `spec` as Anthropic's own tool type, when it is one of them.
pub fn anthropic_native(spec: &ToolSpec) -> Option<AnthropicNativeTool> {
    anthropic_native_type(&spec.name).map(|r#type| AnthropicNativeTool {
        r#type,
        name: spec.name.clone(),
    })
}

/// An OpenAI Responses API `shell_call` output item, as the model emitted it: commands for the
/// client to run (here, in the session's sandbox with the `shell` tool). Other fields of the
/// item (`id`, `status`, `caller`, `created_by`) are accepted and ignored.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ShellCallItem {
    /// Always `shell_call`.
    #[schema(value_type = String, pattern = "^shell_call$")]
    pub r#type: String,
    /// The model's id for the call; the commands are recorded as `shell` calls with ids
    /// `{call_id}#1`, `{call_id}#2`, ….
    #[schema(min_length = 1, max_length = 250)]
    pub call_id: String,
    pub action: ShellAction,
    /// Where the model meant the commands to run: absent or `{"type": "local"}` (the client's
    /// own environment, this service). A hosted container is OpenAI's to run, and refused.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub environment: Option<Value>,
}

/// What a `shell_call` asks to run.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ShellAction {
    /// Each a bash command line, run one after another in order (as `shell` calls); at most
    /// as many as a batch may hold.
    #[schema(min_items = 1)]
    pub commands: Vec<String>,
    /// Each command's time limit (the `shell` tool's `timeout_ms`; above the service's ceiling,
    /// the ceiling). Default: the session's default timeout.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub timeout_ms: Option<u64>,
    /// Characters of each command's stdout and of its stderr handed back (the beginning);
    /// echoed in the output item. Default: all the `shell` result holds.
    #[serde(default)]
    #[schema(minimum = 0)]
    pub max_output_length: Option<u64>,
}

/// An OpenAI Responses API `apply_patch_call` output item: one file operation, run here as an
/// `apply_patch` call with the same id. Other fields (`id`, `status`, `caller`, `created_by`)
/// are accepted and ignored.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ApplyPatchCallItem {
    /// Always `apply_patch_call`.
    #[schema(value_type = String, pattern = "^apply_patch_call$")]
    pub r#type: String,
    #[schema(min_length = 1, max_length = 256)]
    pub call_id: String,
    pub operation: PatchOperation,
}

/// The file operation of an `apply_patch_call`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct PatchOperation {
    /// `create_file`, `update_file` or `delete_file`.
    #[schema(value_type = String, pattern = "^(create_file|update_file|delete_file)$")]
    pub r#type: String,
    /// The file, relative to /workspace or absolute under it.
    #[schema(min_length = 1)]
    pub path: String,
    /// In OpenAI's V4A form: for `create_file` every line starts with `+`; for `update_file`
    /// `@@` hunks of ` ` context, `-` removed and `+` added lines. Not given for `delete_file`.
    #[serde(default)]
    pub diff: Option<String>,
}

/// `operation` as an `apply_patch` patch, or why it cannot be one (the model's text for a
/// `failed` output). The path and the diff must stay inside the one operation: no line break
/// in the path, no `***` header line in the diff but `*** End of File`.
pub fn operation_patch(op: &PatchOperation) -> Result<String, String> {
    if op.path.contains(['\n', '\r']) {
        return Err("The path contains a line break; give the file's path on one line.".into());
    }
    let diff = op.diff.as_deref().unwrap_or("");
    if let Some(line) = diff
        .lines()
        .find(|l| l.starts_with("***") && l.trim_end() != "*** End of File")
    {
        return Err(format!(
            "The diff has a header line ({:?}); an apply_patch_call changes one file: give \
             only its hunks.",
            toolexec_core::names::shown_line(line)
        ));
    }
    let body = diff.strip_suffix('\n').unwrap_or(diff);
    let header = match op.r#type.as_str() {
        "create_file" => "Add File",
        "update_file" => "Update File",
        "delete_file" => {
            return Ok(format!(
                "*** Begin Patch\n*** Delete File: {}\n*** End Patch\n",
                op.path
            ));
        }
        other => return Err(format!("Unknown operation type {other:?}.")),
    };
    if op.diff.is_none() {
        return Err(format!("{} needs a diff.", op.r#type));
    }
    Ok(format!(
        "*** Begin Patch\n*** {header}: {}\n{body}\n*** End Patch\n",
        op.path
    ))
}

/// The `apply_patch_call_output` item answering `call_id` with the `apply_patch` call's result
/// (`None`: the operation was refused before anything ran, `refusal` says why).
pub fn apply_patch_output(call_id: &str, result: Result<&CallResult, &str>) -> Value {
    let (status, output) = match result {
        Ok(r) if !r.is_error => ("completed", r.content.as_str()),
        Ok(r) => ("failed", r.content.as_str()),
        Err(refusal) => ("failed", refusal),
    };
    json!({
        "type": "apply_patch_call_output",
        "call_id": call_id,
        "status": status,
        "output": output,
    })
}

/// The `shell_call_output` item answering `call_id`: one entry per command, from the `shell`
/// calls' results. stdout and stderr are the command's own streams, from the `shell` tool's
/// structured result (so output that prints `--- stderr ---` is just output), which the record
/// keeps for a retry of the same call id; a result without one (recorded before the record kept
/// it) is taken apart by its sections.
/// A command that did not run (refused, waiting for approval) has its result as stderr and exit
/// code 1.
pub fn shell_output(
    call_id: &str,
    max_output_length: Option<u64>,
    results: &[CallResult],
) -> Value {
    let cut = |s: String| match max_output_length.and_then(|n| usize::try_from(n).ok()) {
        Some(n) => s.chars().take(n).collect(),
        None => s,
    };
    let output: Vec<Value> = results
        .iter()
        .map(|r| {
            let run = ShellRun::of(r);
            let outcome = if run.timed_out {
                json!({"type": "timeout"})
            } else {
                json!({"type": "exit", "exit_code": run.exit_code})
            };
            json!({"stdout": cut(run.stdout), "stderr": cut(run.stderr), "outcome": outcome})
        })
        .collect();
    let mut item = json!({
        "type": "shell_call_output",
        "call_id": call_id,
        "output": output,
    });
    if let Some(n) = max_output_length {
        item["max_output_length"] = json!(n);
    }
    item
}

/// A `shell` result taken apart: from the tool's structured result (the live one, or the one
/// its `invocation.finished` event recorded); else (a record made before it kept one) from its
/// text: its status line, then `--- stdout ---` and `--- stderr ---` sections (see the `shell`
/// tool), where a stdout that itself prints a line `--- stderr ---` is split there.
#[derive(Debug, Default, PartialEq)]
struct ShellRun {
    stdout: String,
    stderr: String,
    exit_code: i64,
    timed_out: bool,
}

impl ShellRun {
    fn of(r: &CallResult) -> Self {
        let timed_out = r.status == toolexec_core::CallStatus::TimedOut;
        if let Some(s) = &r.structured
            && let (Some(stdout), Some(stderr)) = (s["stdout"].as_str(), s["stderr"].as_str())
        {
            return Self {
                stdout: stdout.to_owned(),
                stderr: format!("{}{stderr}", s["note"].as_str().unwrap_or_default()),
                exit_code: s["exit_code"]
                    .as_i64()
                    .unwrap_or(if r.is_error { 1 } else { 0 }),
                timed_out: s["timed_out"].as_bool().unwrap_or(timed_out),
            };
        }
        let mut text = r.content.as_str();
        let mut notes = String::new();
        // The note of an unsandboxed service comes first.
        if text.starts_with("[UNSANDBOXED")
            && let Some((note, rest)) = text.split_once('\n')
        {
            notes.push_str(note);
            notes.push('\n');
            text = rest;
        }
        let Some((status, body)) = text
            .split_once('\n')
            .filter(|(status, _)| Self::is_status(status))
        else {
            // Not a command's result: the call did not run.
            return Self {
                stderr: r.content.clone(),
                exit_code: 1,
                timed_out,
                ..Self::default()
            };
        };
        let exit_code = Self::number_after(status, "[exit code ")
            .or_else(|| Self::number_after(status, "killed by signal ").map(|s| 128 + s))
            .unwrap_or(if r.is_error { 1 } else { 0 });
        let body = body.strip_prefix("(no output)\n").unwrap_or(body);
        const STDERR: &str = "\n--- stderr ---\n";
        let (stdout, stderr) = match body.strip_prefix("--- stdout ---\n") {
            Some(rest) => match rest.find(STDERR) {
                Some(at) => (&rest[..=at], &rest[at + STDERR.len()..]),
                None => (rest, ""),
            },
            None => ("", body.strip_prefix(&STDERR[1..]).unwrap_or(body)),
        };
        // Why the command stopped, when it did not simply exit (a time limit, the memory
        // limit, a signal): the model should see it with the output.
        let mut stderr_all = notes;
        if !status.starts_with("[exit code ") || status.contains(':') {
            stderr_all.push_str(status);
            stderr_all.push('\n');
        }
        stderr_all.push_str(stderr);
        Self {
            stdout: stdout.to_owned(),
            stderr: stderr_all,
            exit_code,
            timed_out,
        }
    }

    fn is_status(line: &str) -> bool {
        [
            "[exit code ",
            "[timed out ",
            "[stopped",
            "[cancelled ",
            "[killed by signal ",
            "[ended ",
        ]
        .iter()
        .any(|p| line.starts_with(p))
    }

    fn number_after(line: &str, marker: &str) -> Option<i64> {
        let at = line.find(marker)? + marker.len();
        let digits: String = line[at..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '-')
            .collect();
        digits.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolexec_core::CallStatus;

    fn shell(status: CallStatus, content: &str) -> CallResult {
        CallResult {
            call_id: "c#1".into(),
            invocation_id: uuid::Uuid::nil(),
            name: "shell".into(),
            status,
            is_error: status.is_error(),
            content: content.into(),
            truncated: None,
            duration_ms: 1.0,
            seq: 1,
            structured: None,
        }
    }

    #[test]
    fn the_structured_streams_are_taken_as_they_are() {
        let mut r = shell(
            CallStatus::Error,
            "[exit code 3 after 0.01 s]\n--- stdout ---\na\n--- stderr ---\nb\n--- stderr ---\nc\n",
        );
        r.structured = Some(serde_json::json!({
            "stdout": "a\n--- stderr ---\nb\n", "stderr": "c\n", "exit_code": 3,
            "timed_out": false, "note": "",
        }));
        let run = ShellRun::of(&r);
        assert_eq!(
            (run.stdout.as_str(), run.stderr.as_str(), run.exit_code),
            ("a\n--- stderr ---\nb\n", "c\n", 3)
        );
    }

    #[test]
    fn a_shell_result_comes_apart_into_its_streams_and_outcome() {
        let run = ShellRun::of(&shell(
            CallStatus::Error,
            "[exit code 2 after 0.01 s]\n--- stdout ---\nout\n--- stderr ---\nerr\n",
        ));
        assert_eq!(
            (run.stdout.as_str(), run.stderr.as_str()),
            ("out\n", "err\n")
        );
        assert_eq!((run.exit_code, run.timed_out), (2, false));
        let quiet = ShellRun::of(&shell(
            CallStatus::Ok,
            "[exit code 0 after 0.01 s]\n(no output)\n",
        ));
        assert_eq!(quiet, ShellRun::default());
        let only_err = ShellRun::of(&shell(
            CallStatus::Error,
            "[exit code 1 after 0.01 s]\n--- stderr ---\nboom\n",
        ));
        assert_eq!(
            (only_err.stdout.as_str(), only_err.stderr.as_str()),
            ("", "boom\n")
        );
    }

    #[test]
    fn a_timeout_a_signal_and_a_refusal_each_say_so() {
        let slow = ShellRun::of(&shell(
            CallStatus::TimedOut,
            "[timed out after 1000 ms: killed]\n--- stdout ---\npartial\n",
        ));
        assert!(slow.timed_out);
        assert_eq!(slow.stdout, "partial\n");
        assert!(slow.stderr.starts_with("[timed out"), "{}", slow.stderr);
        let killed = ShellRun::of(&shell(
            CallStatus::Error,
            "[killed by signal 9 after 1.00 s]\n(no output)\n",
        ));
        assert_eq!(killed.exit_code, 137);
        let refused = ShellRun::of(&shell(CallStatus::Denied, "Tool 'shell' is not allowed."));
        assert_eq!(
            (refused.exit_code, refused.stderr.as_str()),
            (1, "Tool 'shell' is not allowed.")
        );
        let out = shell_output(
            "c",
            Some(3),
            &[shell(
                CallStatus::Ok,
                "[exit code 0 after 0.01 s]\n--- stdout ---\nabcdef\n",
            )],
        );
        assert_eq!(out["output"][0]["stdout"], "abc");
        assert_eq!(out["max_output_length"], 3);
    }

    #[test]
    fn an_operation_becomes_a_patch_of_that_one_file() {
        let op = |t: &str, path: &str, diff: Option<&str>| PatchOperation {
            r#type: t.into(),
            path: path.into(),
            diff: diff.map(Into::into),
        };
        assert_eq!(
            operation_patch(&op("create_file", "a.txt", Some("+x\n"))).unwrap(),
            "*** Begin Patch\n*** Add File: a.txt\n+x\n*** End Patch\n"
        );
        assert_eq!(
            operation_patch(&op("delete_file", "a.txt", None)).unwrap(),
            "*** Begin Patch\n*** Delete File: a.txt\n*** End Patch\n"
        );
        assert!(
            operation_patch(&op("update_file", "a\n*** Delete File: b", Some("@@\n"))).is_err()
        );
        assert!(
            operation_patch(&op("update_file", "a", Some("@@\n+x\n*** Add File: b\n+y"))).is_err()
        );
        assert!(
            operation_patch(&op(
                "update_file",
                "a",
                Some("@@\n x\n+y\n*** End of File\n")
            ))
            .is_ok()
        );
        assert!(operation_patch(&op("update_file", "a", None)).is_err());
    }
}
