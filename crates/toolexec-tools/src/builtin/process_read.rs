//! `process_read`: new output of a background process since a cursor, and its state.
use std::time::Duration;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};

use super::process_kill::{describe_state, exit_event, unknown_process};
use super::shell::no_sandbox;
use crate::{Tool, ToolContext, ToolOutput, parse_args};

const DESCRIPTION: &str = "\
Shows what a background process (started with shell and background: true) printed, and whether \
it still runs.

Output is read by cursor: the first call without `after` returns everything kept so far; each \
answer ends with the cursor to pass as `after` next time, so you only see new output. With \
`wait_ms` the call waits up to that long (at most 30000) for new output when there is none yet, \
or for the process to exit — use it instead of polling in a loop. stdout and stderr of a \
background process are one stream.

Example: {\"process_id\": \"p1\", \"after\": 2048, \"wait_ms\": 5000}

Limits: at most 64 KiB per call (call again with the returned cursor for more); the service keeps \
the last 1 MiB of a process's output, and says how much older output was dropped.";

pub struct ProcessRead {
    spec: ToolSpec,
}

impl Default for ProcessRead {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessRead {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "process_read".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: true,
                capabilities: vec![Capability::Process],
                output_limit: OutputLimit::new(70_000, TruncationMode::Tail),
            },
        }
    }
}

/// `process_read`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The id shell returned ("p1").
    #[schemars(length(min = 1, max = 64))]
    process_id: String,
    /// Cursor from the previous process_read: only output after it is returned.
    #[schemars(range(min = 0))]
    after: Option<u64>,
    /// Wait up to this long for new output (or the exit) when there is none yet. Default 0.
    #[schemars(range(min = 0, max = 30_000))]
    wait_ms: Option<u64>,
}

#[async_trait]
impl Tool for ProcessRead {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(out) => return out,
        };
        let Some(table) = ctx.processes.clone() else {
            return no_sandbox();
        };
        let wait = Duration::from_millis(args.wait_ms.unwrap_or(0));
        // A cancel stops the wait, not the read: what there is at that moment comes back.
        let mut cancelled = false;
        let read = tokio::select! {
            r = table.read(&args.process_id, args.after, wait) => r,
            () = ctx.cancel.cancelled() => {
                cancelled = true;
                table.read(&args.process_id, args.after, Duration::ZERO).await
            }
        };
        let read = match read {
            Ok(r) => r,
            Err(m) => return unknown_process(ctx, &table, &args.process_id, m).await,
        };
        let mut text = format!(
            "[process {}: {}; output bytes {}..{}{}; next: after={}]\n",
            args.process_id,
            describe_state(&read.state),
            read.next - read.output.len() as u64,
            read.next,
            if read.more {
                ", more available now"
            } else {
                ""
            },
            read.next
        );
        if read.dropped > 0 {
            text.push_str(&format!(
                "[{} older bytes were dropped from the kept window]\n",
                read.dropped
            ));
        }
        if read.output.is_empty() {
            text.push_str("(no new output)\n");
        } else {
            text.push_str(&String::from_utf8_lossy(&read.output));
        }
        let mut out = if cancelled {
            ToolOutput::cancelled(format!(
                "[cancelled by the client while waiting for output; the process itself was not stopped]\n{text}"
            ))
        } else {
            ToolOutput::ok(text)
        };
        out.events.extend(exit_event(&table, &args.process_id));
        out
    }
}
