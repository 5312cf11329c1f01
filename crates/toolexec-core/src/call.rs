//! A call as the client sends it and its result as the model reads it.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::truncate::Truncation;

/// One tool call, as emitted by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Call {
    /// The model's tool-call id; unique within a session. A repeated id returns the recorded
    /// result instead of running again. 1 to 256 characters.
    #[schema(example = "toolu_01", min_length = 1, max_length = 256)]
    pub id: String,
    /// Tool name from the catalog.
    #[schema(example = "read_file")]
    pub name: String,
    /// The tool's arguments, validated against its `input_schema`.
    #[serde(default = "empty_object")]
    #[schema(value_type = Object, example = json!({"file_path": "src/main.rs"}))]
    pub arguments: serde_json::Value,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

/// How a call ended. Everything but `ok` is an error the model should read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    Ok,
    Error,
    InvalidArguments,
    UnknownTool,
    /// Refused by policy or a guardrail (path outside the workspace, unread file, …).
    Denied,
    TimedOut,
    Cancelled,
    /// The service stopped while the call ran; its effects, if any, are in the log.
    Interrupted,
    /// Not run yet: the session's policy makes this call wait for a person's decision
    /// (`POST /v1/invocations/{id}/approve` or `/deny`). Not a final status: wait for the
    /// invocation (`GET /v1/invocations/{id}?wait=SECONDS`) and hand the model its result then.
    PendingApproval,
}

impl CallStatus {
    /// Whether the model should read this result as a failure. A call still waiting for
    /// approval has not failed (it has not run).
    pub fn is_error(self) -> bool {
        !matches!(self, CallStatus::Ok | CallStatus::PendingApproval)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            CallStatus::Ok => "ok",
            CallStatus::Error => "error",
            CallStatus::InvalidArguments => "invalid_arguments",
            CallStatus::UnknownTool => "unknown_tool",
            CallStatus::Denied => "denied",
            CallStatus::TimedOut => "timed_out",
            CallStatus::Cancelled => "cancelled",
            CallStatus::Interrupted => "interrupted",
            CallStatus::PendingApproval => "pending_approval",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ok" => CallStatus::Ok,
            "error" => CallStatus::Error,
            "invalid_arguments" => CallStatus::InvalidArguments,
            "unknown_tool" => CallStatus::UnknownTool,
            "denied" => CallStatus::Denied,
            "timed_out" => CallStatus::TimedOut,
            "cancelled" => CallStatus::Cancelled,
            "interrupted" => CallStatus::Interrupted,
            "pending_approval" => CallStatus::PendingApproval,
            _ => return None,
        })
    }
}

/// The state of a recorded invocation: still running, or finished with a [`CallStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum InvocationStatus {
    Running,
    /// Waiting for a person's decision; it has not run.
    PendingApproval,
    Ok,
    Error,
    InvalidArguments,
    UnknownTool,
    Denied,
    TimedOut,
    Cancelled,
    Interrupted,
}

impl InvocationStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            InvocationStatus::Running => "running",
            InvocationStatus::PendingApproval => "pending_approval",
            other => other
                .finished()
                .map(CallStatus::as_str)
                .unwrap_or("running"),
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        if s == "running" {
            return Some(InvocationStatus::Running);
        }
        CallStatus::parse(s).map(Self::from)
    }

    /// The final status, or `None` while running or waiting for approval.
    pub fn finished(self) -> Option<CallStatus> {
        Some(match self {
            InvocationStatus::Running | InvocationStatus::PendingApproval => return None,
            InvocationStatus::Ok => CallStatus::Ok,
            InvocationStatus::Error => CallStatus::Error,
            InvocationStatus::InvalidArguments => CallStatus::InvalidArguments,
            InvocationStatus::UnknownTool => CallStatus::UnknownTool,
            InvocationStatus::Denied => CallStatus::Denied,
            InvocationStatus::TimedOut => CallStatus::TimedOut,
            InvocationStatus::Cancelled => CallStatus::Cancelled,
            InvocationStatus::Interrupted => CallStatus::Interrupted,
        })
    }
}

impl From<CallStatus> for InvocationStatus {
    fn from(s: CallStatus) -> Self {
        match s {
            CallStatus::Ok => InvocationStatus::Ok,
            CallStatus::Error => InvocationStatus::Error,
            CallStatus::InvalidArguments => InvocationStatus::InvalidArguments,
            CallStatus::UnknownTool => InvocationStatus::UnknownTool,
            CallStatus::Denied => InvocationStatus::Denied,
            CallStatus::TimedOut => InvocationStatus::TimedOut,
            CallStatus::Cancelled => InvocationStatus::Cancelled,
            CallStatus::Interrupted => InvocationStatus::Interrupted,
            CallStatus::PendingApproval => InvocationStatus::PendingApproval,
        }
    }
}

/// The result of one call, ready to hand to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CallResult {
    pub call_id: String,
    pub invocation_id: Uuid,
    pub name: String,
    pub status: CallStatus,
    pub is_error: bool,
    /// What the model should read — for errors too: what went wrong and how to recover.
    pub content: String,
    /// Set when `content` was cut to the tool's output limit; the full output is at
    /// `GET /v1/invocations/{invocation_id}/output` and through the `read_output` tool.
    pub truncated: Option<Truncation>,
    pub duration_ms: f64,
    /// The `seq` of this invocation's `invocation.finished` event.
    pub seq: i64,
    /// The tool's machine-readable parts of the result (see `ToolOutput::structured`), for the
    /// service's own renderings of it (`shell_call_output`): recorded as the `structured` of the
    /// call's `invocation.finished` event (a retry answered from the record reads it back), not
    /// part of the API's result.
    #[serde(skip)]
    pub structured: Option<serde_json::Value>,
}
