//! Running one tool within the operator's per-call time limit (`limits.tool_timeout_ms`). The
//! mechanics — tools that stop themselves with what they have, the engine that stops waiting a
//! grace period later, changes that are never cut in half — are `toolexec_tools::deadline`'s;
//! this module only decides the budget, and starts the clock when the tool starts (not while
//! the call waits for its turn in the session).
use std::time::Duration;

use toolexec_core::FileRead;
use toolexec_tools::{Tool, ToolContext, ToolOutput};
use tracing::Instrument;

use crate::Engine;
use crate::calls::Calls;

impl Calls {
    /// Runs `tool` with `ctx`, its deadline starting now. Also returns what the call read (and
    /// wrote, and deleted) for read-before-write, which its record keeps.
    pub(crate) async fn run_tool(
        &self,
        engine: &Engine,
        tool: &dyn Tool,
        mut ctx: ToolContext,
        args: serde_json::Value,
    ) -> (ToolOutput, Vec<FileRead>) {
        let limit = Duration::from_millis(engine.config.limits.tool_timeout_ms);
        ctx.deadline = toolexec_tools::deadline_for(tool.spec(), limit);
        let journal = ctx.journal.clone();
        let reads = ctx.reads.clone();
        // The tool's own time, apart from waiting for its turn and recording its result.
        let span = tracing::info_span!("tool", otel.name = %format_args!("tool {}", tool.spec().name), tool = %tool.spec().name, status = tracing::field::Empty);
        let mut out = toolexec_tools::run_within_deadline(tool, &ctx, args)
            .instrument(span.clone())
            .await;
        span.record("status", out.status.as_str());
        // What a web tool sent and got before it was abandoned (cancelled, or stuck past its
        // deadline) is recorded too; a tool that returned has taken its own already.
        journal.abandoned();
        out.events.extend(journal.drain_events());
        // Taken now: a tool abandoned at its deadline that records a read later (it cannot:
        // reads are recorded as a result is delivered) would only be missing from the log,
        // which then counts less as read, never more.
        (out, reads.take())
    }
}
