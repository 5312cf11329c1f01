//! Running one call: claiming its id on this node, refusing what may not run (an unknown or
//! disallowed tool, invalid arguments, a call whose batch was stopped before its turn) with a
//! record, making a mutating call's start durable before its tool runs (cancellable by its
//! invocation id from just before), and adding what the workspace scan found to its changes.
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use futures::future::Either;
use toolexec_core::{Call, CallResult, CallStatus, Capability, FileRead, Session, new_id};
use toolexec_store::{NewInvocation, Write, WriteError};
use toolexec_tools::{Resolved, ToolContext, ToolOutput};

use super::Calls;
use super::cancel::{BatchControl, Stop};
use super::commit::{closed, key_of};
use super::inflight::{Claim, InflightGuard, wait_slot};
use super::outcome::{NewInvocationRef, output_limit};
use crate::canonical::{nul_pointer, without_nul};
use crate::runtimes::SessionRuntime;
use crate::scans::ContentLease;
use crate::{Engine, EngineError, Result};
use toolexec_core::OutputLimit;

/// What one call is, before it runs: enough to record it whatever happens next.
pub(super) struct Pending<'a> {
    pub call: &'a Call,
    pub invocation: NewInvocation,
    pub limit: OutputLimit,
    pub guard: InflightGuard,
    pub t0: Instant,
}

/// A call whose start is recorded: enough to run it and record its end.
pub(super) struct Started<'a> {
    pub call: &'a Call,
    pub invocation_id: uuid::Uuid,
    pub limit: OutputLimit,
    pub guard: InflightGuard,
    pub t0: Instant,
}

impl Calls {
    /// Runs one call of a batch with its resolved tool and records it (see the module docs of
    /// `calls` for the recording rules). A call whose batch is stopped before its tool starts
    /// — while it waits for its turn — is recorded `cancelled` and nothing of it runs.
    #[allow(clippy::too_many_arguments)] // the engine it runs in is the eighth
    pub(super) async fn run_one(
        &self,
        engine: &Engine,
        session: &Session,
        rt: &Arc<SessionRuntime>,
        call: &Call,
        tool: Option<&Resolved>,
        args_hash: &str,
        control: &BatchControl,
    ) -> Result<CallResult> {
        let guard = match self.inflight.claim(session.id, &call.id)? {
            Claim::Wait(rx) => return wait_slot(rx).await,
            Claim::Mine(g) => g,
        };
        let pending = Pending {
            call,
            invocation: self.new_invocation(engine, session, call, tool, args_hash),
            limit: output_limit(tool.map(Resolved::tool), session, &call.name),
            guard,
            t0: Instant::now(),
        };
        // Refusals before anything runs are recorded like any call, in one write; so is a call
        // whose batch was stopped before it came to it.
        let refusal = match control.stopped() {
            Some(stop) => Some(ToolOutput::cancelled(stop.not_started())),
            None => self.refusal(engine, session, call, tool),
        };
        let tool = match (tool, refusal) {
            (Some(tool), None) => tool,
            (_, Some(out)) => return self.record_at_once(engine, rt, pending, out).await,
            (None, None) => return Err(EngineError::Internal("unreachable".into())),
        };
        // A call the session's policy makes wait for a person is recorded waiting, and answered
        // so at once. A replay's too: an approval was given for one run of a call, so its
        // re-run waits for a person again (what was denied never started in the source, so it
        // is not replayed).
        if let Some(policy) = &session.policy.approval {
            let reasons = policy.reasons(&call.name, &tool.spec().capabilities);
            if !reasons.is_empty() {
                let gate = super::approval::Gate {
                    policy,
                    reasons,
                    replay_of: control.replay_of(),
                };
                return engine
                    .approvals
                    .request_approval(engine, session, rt, pending, gate, args_hash)
                    .await;
            }
        }
        let read_only = tool.spec().read_only;
        // Its turn: a mutating call has the session alone; a read-only one shares it with
        // other reads. A batch stopped meanwhile means the call never starts.
        let turn = if read_only {
            take_turn(control, async { Either::Left(rt.schedule.read().await) }).await
        } else {
            take_turn(control, async { Either::Right(rt.schedule.write().await) }).await
        };
        let Some(turn) = turn else {
            let stop = control.stopped().unwrap_or(Stop::Session);
            let out = ToolOutput::cancelled(stop.not_started());
            return self.record_at_once(engine, rt, pending, out).await;
        };
        let mut ctx = engine.runtimes.tool_context(engine, session, rt);
        let network = tool.spec().has(Capability::Network);
        if let (true, Some(recorded)) = (network, control.replay_of()) {
            ctx.observed = engine
                .history
                .observed_for(engine, session, recorded, call, args_hash)
                .await?;
        }
        // A call that reaches the outside world has its start recorded first, like a mutating
        // one: a request the service sent is never missing from the log, even after a crash.
        if read_only && !network && !engine.config.durable_start_for_read_only {
            // Not visible while it runs (nothing is recorded yet), so only a cancel of the
            // session's pending calls reaches it.
            ctx.cancel = control.call_token();
            let (out, reads) = self
                .run_tool(engine, tool.tool().as_ref(), ctx, call.arguments.clone())
                .await;
            drop(turn);
            return self.record_ran(engine, rt, pending, out, reads).await;
        }
        self.run_with_durable_start(engine, session, rt, pending, tool, ctx, args_hash, control)
            .await
    }

    /// The invocation a call is recorded as (its id, identity and what its tool declares).
    fn new_invocation(
        &self,
        engine: &Engine,
        session: &Session,
        call: &Call,
        tool: Option<&Resolved>,
        args_hash: &str,
    ) -> NewInvocation {
        NewInvocation {
            id: new_id(),
            session_id: session.id,
            call_id: call.id.clone(),
            name: call.name.clone(),
            // Recorded without NUL characters (no database text type holds them); the hash is
            // of the arguments as sent, so a retry is still recognised.
            arguments: without_nul(&call.arguments),
            arguments_sha256: args_hash.to_owned(),
            read_only: tool.is_none_or(|t| t.spec().read_only),
            capabilities: tool
                .map(|t| t.spec().capabilities.clone())
                .unwrap_or_default(),
            node: engine.config.node.clone(),
            started_at: chrono::Utc::now(),
        }
    }

    /// Why a call may not run at all — an unknown tool, one the session does not allow,
    /// arguments its schema refuses — as the output it is recorded with; `None` if it may.
    fn refusal(
        &self,
        engine: &Engine,
        session: &Session,
        call: &Call,
        tool: Option<&Resolved>,
    ) -> Option<ToolOutput> {
        let refused = |status, content| {
            Some(ToolOutput {
                status,
                content,
                changes: Vec::new(),
                events: Vec::new(),
                structured: None,
            })
        };
        let Some(tool) = tool else {
            return refused(
                CallStatus::UnknownTool,
                format!(
                    "Unknown tool '{}'. Available tools: {}.",
                    call.name,
                    self.tools_for(engine, session).join(", ")
                ),
            );
        };
        if !session.allows_tool(&call.name) {
            return refused(
                CallStatus::Denied,
                format!(
                    "Tool '{}' is not enabled for this session. Enabled tools: {}.",
                    call.name,
                    self.tools_for(engine, session).join(", ")
                ),
            );
        }
        if let Some(at) = nul_pointer(&call.arguments, String::new()) {
            return refused(
                CallStatus::InvalidArguments,
                format!(
                    "Invalid arguments for {}: arguments{at} contains a NUL character (\\u0000), which no argument may hold (in a path it makes an invalid path). Remove it and call again.",
                    call.name
                ),
            );
        }
        match tool.validate(&call.arguments) {
            Err(e) => refused(CallStatus::InvalidArguments, e.to_model_text(&call.name)),
            Ok(()) => None,
        }
    }

    /// Records a call that never ran in one write.
    pub(super) async fn record_at_once(
        &self,
        engine: &Engine,
        rt: &SessionRuntime,
        p: Pending<'_>,
        out: ToolOutput,
    ) -> Result<CallResult> {
        self.record_ran(engine, rt, p, out, Vec::new()).await
    }

    /// Records a call that ran without a start record in one write, with what it read.
    async fn record_ran(
        &self,
        engine: &Engine,
        rt: &SessionRuntime,
        p: Pending<'_>,
        out: ToolOutput,
        reads: Vec<FileRead>,
    ) -> Result<CallResult> {
        let mut recorded = self.outcome(engine, p.limit, &p.invocation, out, p.t0);
        recorded.outcome.reads = reads;
        self.commit_record(engine, p.guard, rt, p.call, p.invocation, recorded)
            .await
    }

    /// A mutating call (or a read with `durable_start_for_read_only`): its start is durable
    /// before its tool runs, it is cancellable by its invocation id from just before, and what
    /// the workspace scan finds afterwards joins its changes.
    #[expect(
        clippy::too_many_arguments,
        reason = "one call's parts, each used once"
    )]
    async fn run_with_durable_start(
        &self,
        engine: &Engine,
        session: &Session,
        rt: &Arc<SessionRuntime>,
        p: Pending<'_>,
        tool: &Resolved,
        ctx: ToolContext,
        args_hash: &str,
        control: &BatchControl,
    ) -> Result<CallResult> {
        if tool.spec().capabilities.contains(&Capability::Process) {
            rt.ensure_baseline(&engine.inotify, crate::scans::budget(&engine.config.limits))
                .await?;
        }
        let Pending {
            call,
            invocation,
            limit,
            guard,
            t0,
        } = p;
        let invocation_id = invocation.id;
        let key = key_of(&invocation);
        // Registered before the start is recorded: a cancel that finds the invocation running
        // in the store then always finds it here too.
        let cancel = control.call_token();
        let _cancellable =
            self.cancels
                .register_call(invocation_id, session.tenant_id, cancel.clone());
        match engine.recorder.write(Write::Start { invocation }).await {
            Err(e) => return Err(e.into()),
            Ok(Err(WriteError::DuplicateCall(other))) => {
                drop(guard);
                return self
                    .adopt_recorded(engine, rt, call, args_hash, other)
                    .await;
            }
            Ok(Err(WriteError::SessionNotActive)) => return Err(closed(session.id)),
            Ok(Err(e)) => return Err(EngineError::Internal(e.to_string())),
            Ok(Ok(_)) => rt.remember(key),
        }
        let started = Started {
            call,
            invocation_id,
            limit,
            guard,
            t0,
        };
        self.run_started(engine, session, rt, started, tool, ctx, control, cancel)
            .await
    }

    /// Runs a call whose start is durable (its invocation is `running` in the store) and
    /// records its end: the tool, then — for a mutating one — the workspace scan.
    #[expect(
        clippy::too_many_arguments,
        reason = "one call's parts, each used once"
    )]
    pub(super) async fn run_started(
        &self,
        engine: &Engine,
        session: &Session,
        rt: &Arc<SessionRuntime>,
        started: Started<'_>,
        tool: &Resolved,
        mut ctx: ToolContext,
        control: &BatchControl,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<CallResult> {
        let spec = tool.spec();
        let Started {
            call,
            invocation_id,
            limit,
            guard,
            t0,
        } = started;
        // The node's content budget the scan's kept contents hold until they are committed.
        let mut lease = None;
        let (out, reads) = if cancel.is_cancelled() {
            // Cancelled between its start record and now: its tool never ran.
            let stop = if control.session_cancelled() {
                Stop::Session
            } else {
                Stop::Invocation
            };
            (ToolOutput::cancelled(stop.not_started()), Vec::new())
        } else {
            ctx.cancel = cancel;
            let (mut out, reads) = self
                .run_tool(engine, tool.tool().as_ref(), ctx, call.arguments.clone())
                .await;
            if !spec.read_only {
                lease = self.record_workspace_changes(engine, rt, &mut out).await;
            }
            (out, reads)
        };
        let stub = NewInvocationRef {
            id: invocation_id,
            call_id: &call.id,
            name: &call.name,
        };
        let mut recorded = self.outcome_for(engine, limit, stub, out, t0);
        recorded.outcome.reads = reads;
        let committed = self
            .commit_finish(engine, guard, session.id, invocation_id, recorded)
            .await;
        drop(lease);
        committed
    }

    /// Adds to a mutating call's changes whatever else changed in the workspace since the last
    /// scan: everything a shell command did, and what background processes did meanwhile. The
    /// tool's own account of a path wins over the scan's. Sessions that never ran a command
    /// have no baseline and skip this.
    ///
    /// The contents the scan keeps come out of the node's budget
    /// (`limits.node_content_budget_bytes`): the lease returned holds them until it is dropped,
    /// after the call's record is committed.
    pub(crate) async fn record_workspace_changes(
        &self,
        engine: &Engine,
        rt: &SessionRuntime,
        out: &mut ToolOutput,
    ) -> Option<ContentLease> {
        let mut guard = rt.snapshot.lock().await;
        let mut snap = guard.take()?;
        let ws = rt.workspace.clone();
        let mut budget = crate::scans::budget(&engine.config.limits);
        let mut lease = engine.contents.take(budget.content_bytes);
        budget.content_bytes = lease.bytes();
        let t0 = Instant::now();
        // Nothing queued on the workspace's watches (a command that only read): no change,
        // told here, without a blocking thread's round trip.
        let quiet = snap.rescan_if_quiet(&ws);
        let is_quiet = quiet.is_some();
        let scanned = match quiet {
            Some(report) => Ok((snap, Ok(report))),
            None => {
                tokio::task::spawn_blocking(move || {
                    let report = snap.rescan_within(&ws, &budget);
                    (snap, report)
                })
                .await
            }
        };
        let mode = match &scanned {
            Ok(_) if is_quiet => "quiet".to_owned(),
            Ok((_, Ok(report))) => match report.full_walk {
                None => "events".to_owned(),
                Some(reason) => format!("{reason:?}"),
            },
            _ => "failed".to_owned(),
        };
        engine
            .metrics
            .workspace_scan(&mode, t0.elapsed().as_secs_f64());
        match scanned {
            Ok((snap, Ok(report))) => {
                *guard = Some(snap);
                lease.keep(report.kept_bytes);
                let budgeted = report
                    .changes
                    .iter()
                    .filter(|c| {
                        use toolexec_core::UnstoredReason::*;
                        matches!(
                            c.change.after_unstored,
                            Some(ContentBudget | HashBudget | TimeBudget)
                        )
                    })
                    .count();
                if budgeted > 0 {
                    tracing::info!(session = %rt.session.id, files = budgeted, hashed_bytes = report.hashed_bytes, kept_bytes = report.kept_bytes, "workspace scan budget reached: files recorded without contents (after_unstored)");
                }
                // By name as recorded: a display form alone could match a tool's UTF-8 path
                // spelled like an escaped name that is not UTF-8.
                let own: std::collections::HashSet<(String, Option<String>)> = out
                    .changes
                    .iter()
                    .map(|c| (c.change.path.clone(), c.change.path_b64.clone()))
                    .collect();
                out.changes.extend(report.changes.into_iter().filter(|c| {
                    !own.contains(&(c.change.path.clone(), c.change.path_b64.clone()))
                }));
            }
            Ok((snap, Err(e))) => {
                *guard = Some(snap);
                tracing::error!(error = %e, session = %rt.session.id, "workspace scan failed; this call's side effects may be incomplete in the log");
                out.content.push_str(&format!(
                    "\n[warning: the workspace could not be scanned for changes ({e}); the log may miss some of this call's file changes]"
                ));
            }
            Err(e) => {
                tracing::error!(error = %e, "workspace scan task failed");
            }
        }
        Some(lease)
    }

    fn tools_for(&self, engine: &Engine, session: &Session) -> Vec<String> {
        engine
            .registry
            .names()
            .filter(|n| session.allows_tool(n))
            .map(str::to_owned)
            .collect()
    }
}

/// Waits for a call's turn (the session's scheduling lock), unless its batch is stopped first:
/// `None` then, and the call must not start.
async fn take_turn<G>(control: &BatchControl, lock: impl Future<Output = G>) -> Option<G> {
    tokio::select! {
        biased;
        () = control.stopping() => None,
        g = lock => control.stopped().is_none().then_some(g),
    }
}
