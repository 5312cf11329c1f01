//! `process_kill`: stop a background process and everything it started.
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use toolexec_core::{Capability, EventKind, OutputLimit, ToolSpec, TruncationMode};
use toolexec_sandbox::{ProcessState, ProcessTable};

use super::shell::no_sandbox;
use crate::{Tool, ToolContext, ToolEvent, ToolOutput, parse_args};

const DESCRIPTION: &str = "\
Stops a background process (started with shell and background: true) and every process it \
started.

The signal (default TERM) goes to the process and its children; whatever has not exited 2 seconds \
later is killed. KILL stops everything at once. Closing the session stops all its background \
processes too.

Example: {\"process_id\": \"p1\"}

Limits: none; stopping an exited process just reports how it ended.";

pub struct ProcessKill {
    spec: ToolSpec,
}

impl Default for ProcessKill {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessKill {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "process_kill".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: false,
                capabilities: vec![Capability::Process],
                output_limit: OutputLimit::new(1_000, TruncationMode::Tail),
            },
        }
    }
}

/// The signals `process_kill` sends first.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
enum FirstSignal {
    #[serde(rename = "TERM")]
    Term,
    #[serde(rename = "INT")]
    Int,
    #[serde(rename = "HUP")]
    Hup,
    #[serde(rename = "KILL")]
    Kill,
}

/// `process_kill`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The id shell returned ("p1").
    #[schemars(length(min = 1, max = 64))]
    process_id: String,
    /// Signal to send first (default TERM).
    signal: Option<FirstSignal>,
}

/// A process state in words.
pub(crate) fn describe_state(state: &ProcessState) -> String {
    match state {
        ProcessState::Running => "running".to_owned(),
        ProcessState::Exited {
            exit_code,
            signal,
            killed_by,
        } => {
            let how = match (exit_code, signal) {
                (Some(c), _) => format!("exited with code {c}"),
                (None, Some(s)) => format!("killed by signal {s}"),
                (None, None) => "exited".to_owned(),
            };
            match killed_by {
                Some(by) => format!("{how}, stopped by {by}"),
                None => how,
            }
        }
    }
}

/// For an id this node does not know: if the session's log says the process was started (by an
/// earlier run of the service, which took it down when it stopped), the answer says so and the
/// first call to ask records its `process.exited` as interrupted.
pub(crate) async fn unknown_process(
    ctx: &ToolContext,
    table: &ProcessTable,
    id: &str,
    message: String,
) -> ToolOutput {
    let Some(started) = ctx.outputs.process_started(ctx.session_id, id).await else {
        return ToolOutput::error(message);
    };
    let mut out = ToolOutput::error(format!(
        "Process {id} is not running: the service restarted after it was started, and background processes do not survive a restart. Start it again with shell and background: true if you still need it."
    ));
    if table.first_report_of_gone(id) {
        out.events.push(ToolEvent {
            blob: None,
            kind: EventKind::ProcessExited,
            data: json!({
                "process_id": id,
                "command": started["command"],
                "state": {"state": "interrupted", "reason": "the service restarted"},
            }),
        });
    }
    out
}

/// `process.exited`, if this call is the first to see the process's exit.
pub(crate) fn exit_event(table: &ProcessTable, id: &str) -> Option<ToolEvent> {
    let info = table.take_exit(id)?;
    Some(ToolEvent {
        blob: None,
        kind: EventKind::ProcessExited,
        data: json!({
            "process_id": info.id,
            "command": info.command,
            "state": info.state,
            "output_bytes": info.output_bytes,
        }),
    })
}

#[async_trait]
impl Tool for ProcessKill {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        use rustix::process::Signal;
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(out) => return out,
        };
        let Some(table) = ctx.processes.clone() else {
            return no_sandbox();
        };
        let signal = match args.signal {
            None | Some(FirstSignal::Term) => Signal::TERM,
            Some(FirstSignal::Int) => Signal::INT,
            Some(FirstSignal::Hup) => Signal::HUP,
            Some(FirstSignal::Kill) => Signal::KILL,
        };
        match table.kill(&args.process_id, signal).await {
            Ok(state) => {
                let mut out = ToolOutput::ok(format!(
                    "Process {}: {}.",
                    args.process_id,
                    describe_state(&state)
                ));
                out.events.extend(exit_event(&table, &args.process_id));
                out
            }
            Err(m) => unknown_process(ctx, &table, &args.process_id, m).await,
        }
    }
}
