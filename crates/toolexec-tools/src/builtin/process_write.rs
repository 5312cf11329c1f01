//! `process_write`: send input to a background process's stdin.
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};

use super::shell::no_sandbox;
use crate::{Tool, ToolContext, ToolOutput, parse_args};

const DESCRIPTION: &str = "\
Writes text to the standard input of a background process (started with shell and background: \
true), for example an answer to a prompt or a command for a REPL.

Nothing is added: include the newline (\"\\n\") if the program reads lines. Then call process_read \
(with wait_ms) to see its answer.

Example: {\"process_id\": \"p2\", \"input\": \"yes\\n\"}

Limits: 64 KiB per call; fails if the process has exited or does not read its input within 5 s.";

pub struct ProcessWrite {
    spec: ToolSpec,
}

impl Default for ProcessWrite {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessWrite {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "process_write".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: false,
                capabilities: vec![Capability::Process],
                output_limit: OutputLimit::new(1_000, TruncationMode::Tail),
            },
        }
    }
}

/// `process_write`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The id shell returned ("p1").
    #[schemars(length(min = 1, max = 64))]
    process_id: String,
    /// The text to write to its stdin, newline included if needed.
    #[schemars(length(max = 65_536))]
    input: String,
}

#[async_trait]
impl Tool for ProcessWrite {
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
        match table.write(&args.process_id, args.input.as_bytes()).await {
            Ok(()) => ToolOutput::ok(format!(
                "Wrote {} bytes to process {}. Use process_read with wait_ms to see its response.",
                args.input.len(),
                args.process_id
            )),
            Err(m) => ToolOutput::error(m),
        }
    }
}
