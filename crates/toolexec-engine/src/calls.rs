//! Running a batch of calls: envelope checks, idempotency by call id, scheduling (read-only calls
//! of a batch run together, a mutating call runs alone and in order), truncation and recording.
//!
//! Recording rules: a mutating call's `invocation.started` is durable before the tool runs
//! (`Write::Start`), its side effects and `invocation.finished` after (`Write::Finish`). A
//! read-only call has no side effect to guard, so by default it is recorded in one write after it
//! ran (`Write::Record`; `EngineConfig::durable_start_for_read_only` makes it take the two-write
//! path too) — and in every case no result reaches the client before it is durable.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use tokio::sync::watch;
use toolexec_core::{
    Call, CallResult, CallStatus, Capability, Invocation, Session, SessionStatus, new_id, truncate,
};
use toolexec_store::{Assigned, Blob, CallKey, NewInvocation, Outcome, Write, WriteError};
use toolexec_tools::ToolOutput;
use uuid::Uuid;

use crate::canonical::{arguments_sha256, nul_pointer, without_nul};
use crate::metrics::Metrics;
use crate::sessions::{SessionRuntime, invalid};
use crate::storable;
use crate::{Engine, EngineError, Result};

/// How long a request waits for a finish record after its first attempt failed (store blip)
/// before answering 503; the write keeps being retried in the background. A first attempt that
/// is merely slow (a big change set going to the store) is waited for in full.
const FINISH_GRACE: Duration = Duration::from_secs(10);
/// How long a retry waits for a call that another instance is still running.
const FOREIGN_WAIT: Duration = Duration::from_secs(900);
/// Longest call id accepted: model tool-call ids are short; this bounds index keys.
pub const MAX_CALL_ID_BYTES: usize = 256;

/// A batch as the API hands it over.
#[derive(Debug, Clone)]
pub struct CallBatch {
    pub calls: Vec<Call>,
}

type Slot = watch::Receiver<Option<CallResult>>;

/// Calls running on this node, so that a concurrent retry of the same call id waits for the
/// result instead of running it again.
#[derive(Default)]
pub(crate) struct Inflight {
    map: Arc<Mutex<HashMap<(Uuid, String), Slot>>>,
}

enum Claim {
    Mine(InflightGuard),
    Wait(Slot),
}

/// Owned by the task that runs a call; publishing the result wakes every waiter. Dropping it
/// without a result (the call could not be recorded) wakes them with an error.
pub(crate) struct InflightGuard {
    key: (Uuid, String),
    tx: watch::Sender<Option<CallResult>>,
    map: Arc<Mutex<HashMap<(Uuid, String), Slot>>>,
}

impl InflightGuard {
    fn publish(&self, result: &CallResult) {
        let _ = self.tx.send(Some(result.clone()));
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        if let Ok(mut m) = self.map.lock() {
            m.remove(&self.key);
        }
    }
}

impl Inflight {
    fn claim(&self, session: Uuid, call_id: &str) -> Result<Claim> {
        let mut m = self
            .map
            .lock()
            .map_err(|_| EngineError::Internal("inflight map poisoned".into()))?;
        let key = (session, call_id.to_owned());
        if let Some(rx) = m.get(&key) {
            return Ok(Claim::Wait(rx.clone()));
        }
        let (tx, rx) = watch::channel(None);
        m.insert(key.clone(), rx);
        Ok(Claim::Mine(InflightGuard {
            key,
            tx,
            map: self.map.clone(),
        }))
    }
}

/// Waits for the result of the same call running here, as long as a call may run
/// ([`FOREIGN_WAIT`]): a retry never hangs, even while the store is down and the finish waits
/// for it.
async fn wait_slot(mut rx: Slot) -> Result<CallResult> {
    match tokio::time::timeout(FOREIGN_WAIT, rx.wait_for(Option::is_some)).await {
        Ok(Ok(v)) => v
            .clone()
            .ok_or_else(|| EngineError::Internal("empty slot".into())),
        Ok(Err(_)) => Err(EngineError::Unavailable(
            "the earlier attempt of this call could not be recorded; retry the same call".into(),
        )),
        Err(_) => Err(EngineError::Unavailable(
            "the call is still running or its result is still being recorded; retry the same call id later".into(),
        )),
    }
}

/// How each call of a batch is handled.
enum Plan {
    /// Already recorded (or running elsewhere): return what the record says.
    Recorded(Box<Invocation>),
    /// Same id as an earlier call of this batch (same arguments): mirror its result.
    Alias(usize),
    /// Run it. `mutating` decides the scheduling.
    Run { mutating: bool },
}

impl Engine {
    /// Runs a batch of calls for a session and returns one result per call, in request order.
    pub async fn run_calls(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        batch: CallBatch,
    ) -> Result<Vec<CallResult>> {
        let calls = batch.calls;
        let limits = &self.config.limits;
        if calls.is_empty() {
            return Err(invalid(
                "empty_batch",
                "calls: send at least one call".into(),
            ));
        }
        if calls.len() > limits.max_calls_per_batch {
            return Err(invalid(
                "batch_too_large",
                format!(
                    "calls: at most {} calls per request; split the batch",
                    limits.max_calls_per_batch
                ),
            ));
        }
        for (i, c) in calls.iter().enumerate() {
            if c.id.is_empty() || c.id.len() > MAX_CALL_ID_BYTES {
                return Err(invalid(
                    "invalid_call_id",
                    format!("calls/{i}/id: must be 1 to {MAX_CALL_ID_BYTES} bytes"),
                ));
            }
            // No database text type holds NUL, and unlike arguments these cannot be recorded
            // with a replacement character: the id is the call's identity, the name its tool.
            if c.id.contains('\0') {
                return Err(invalid(
                    "invalid_call_id",
                    format!("calls/{i}/id: must not contain a NUL character (\\u0000)"),
                ));
            }
            if c.name.contains('\0') {
                return Err(invalid(
                    "invalid_tool_name",
                    format!("calls/{i}/name: must not contain a NUL character (\\u0000)"),
                ));
            }
        }
        let hashes: Vec<String> = calls
            .iter()
            .map(|c| arguments_sha256(&c.arguments))
            .collect();

        // Same id twice in one batch: fine if it is the same call, a conflict otherwise.
        let mut first: HashMap<&str, usize> = HashMap::new();
        let mut plans: Vec<Option<Plan>> = Vec::with_capacity(calls.len());
        for (i, c) in calls.iter().enumerate() {
            match first.get(c.id.as_str()) {
                Some(&j) => {
                    if hashes[i] != hashes[j] || calls[j].name != c.name {
                        return Err(reused(&c.id));
                    }
                    plans.push(Some(Plan::Alias(j)));
                }
                None => {
                    first.insert(&c.id, i);
                    plans.push(None);
                }
            }
        }
        let ids: Vec<String> = first.keys().map(|s| (*s).to_owned()).collect();
        let (session, existing, cached) = match self.cached_runtime(tenant_id, session_id)? {
            // The node serving the session knows every call id recorded for it: only retries
            // need a store read.
            Some(rt) => {
                let mut hits = Vec::new();
                for (i, c) in calls.iter().enumerate() {
                    if plans[i].is_some() {
                        continue;
                    }
                    if let Some(k) = rt.known(&c.id) {
                        if k.name != c.name || k.arguments_sha256 != hashes[i] {
                            return Err(reused(&c.id));
                        }
                        hits.push(c.id.clone());
                    }
                }
                let existing = if hits.is_empty() {
                    Vec::new()
                } else {
                    self.store
                        .lookup_calls(tenant_id, session_id, &hits)
                        .await?
                        .1
                };
                (rt.session.clone(), existing, Some(rt))
            }
            None => {
                let (session, existing) =
                    self.store.lookup_calls(tenant_id, session_id, &ids).await?;
                (session, existing, None)
            }
        };
        let mut existing: HashMap<String, Invocation> = existing
            .into_iter()
            .map(|inv| (inv.call_id.clone(), inv))
            .collect();

        let mut needs_run = false;
        for (i, c) in calls.iter().enumerate() {
            if plans[i].is_some() {
                continue;
            }
            if let Some(inv) = existing.remove(&c.id) {
                if inv.name != c.name || inv.arguments_sha256 != hashes[i] {
                    return Err(reused(&c.id));
                }
                plans[i] = Some(Plan::Recorded(Box::new(inv)));
            } else {
                needs_run = true;
                let mutating = self
                    .registry
                    .get(&c.name)
                    .is_some_and(|t| !t.spec().read_only);
                plans[i] = Some(Plan::Run { mutating });
            }
        }
        let rt = if needs_run {
            if session.status != SessionStatus::Active {
                return Err(EngineError::Conflict {
                    code: "session_closed",
                    detail: format!(
                        "session {session_id} is closed; create a new session (or fork this one) to run more calls"
                    ),
                });
            }
            Some(match cached {
                Some(rt) => rt,
                None => self.runtime(&session).await?,
            })
        } else {
            None
        };

        let plans: Vec<Plan> = plans.into_iter().flatten().collect();
        let mut results: Vec<Option<CallResult>> = vec![None; calls.len()];
        let mut i = 0;
        while i < calls.len() {
            // A run of calls that do not mutate goes together; a mutating call goes alone.
            let mut j = i + 1;
            if !matches!(plans[i], Plan::Run { mutating: true }) {
                while j < calls.len() && !matches!(plans[j], Plan::Run { mutating: true }) {
                    j += 1;
                }
            }
            let group = (i..j).filter(|k| !matches!(plans[*k], Plan::Alias(_)));
            let futures = group.map(|k| {
                let rt = rt.clone();
                let session = &session;
                let call = &calls[k];
                let plan = &plans[k];
                let hash = &hashes[k];
                async move {
                    let r = match plan {
                        Plan::Recorded(inv) => self.recorded_result(session.tenant_id, inv).await,
                        Plan::Run { .. } => match rt {
                            Some(rt) => self.run_one(session, &rt, call, hash).await,
                            None => Err(EngineError::Internal("no runtime".into())),
                        },
                        Plan::Alias(_) => Err(EngineError::Internal("alias scheduled".into())),
                    };
                    (k, r)
                }
            });
            for (k, r) in join_all(futures).await {
                results[k] = Some(r?);
            }
            for k in i..j {
                if let Plan::Alias(src) = plans[k] {
                    results[k] = results[src].clone();
                }
            }
            i = j;
        }
        results
            .into_iter()
            .map(|r| r.ok_or_else(|| EngineError::Internal("missing result".into())))
            .collect()
    }

    /// The result of an invocation that is already recorded, waiting if it is still running.
    async fn recorded_result(&self, tenant_id: Uuid, inv: &Invocation) -> Result<CallResult> {
        if let Some(r) = result_of(inv) {
            return Ok(r);
        }
        if let Ok(Claim::Wait(rx)) = self.peek_inflight(inv.session_id, &inv.call_id) {
            return wait_slot(rx).await;
        }
        self.poll_until_finished(tenant_id, inv.id).await
    }

    fn peek_inflight(&self, session: Uuid, call_id: &str) -> Result<Claim> {
        let m = self
            .inflight
            .map
            .lock()
            .map_err(|_| EngineError::Internal("inflight map poisoned".into()))?;
        match m.get(&(session, call_id.to_owned())) {
            Some(rx) => Ok(Claim::Wait(rx.clone())),
            None => Err(EngineError::NotFound),
        }
    }

    /// A call found recorded only when writing it (another task or instance recorded the id
    /// first): the same call waits for that record; another call under the same id is a conflict.
    async fn adopt_recorded(
        &self,
        rt: &SessionRuntime,
        call: &Call,
        args_hash: &str,
        other: Uuid,
    ) -> Result<CallResult> {
        // Its status and result only: the side effects are not needed here.
        let inv = self
            .store
            .invocation_page(rt.session.tenant_id, other, 0, 0)
            .await?;
        if inv.name != call.name || inv.arguments_sha256 != args_hash {
            return Err(reused(&call.id));
        }
        rt.remember(CallKey {
            call_id: call.id.clone(),
            name: call.name.clone(),
            arguments_sha256: args_hash.to_owned(),
            invocation_id: other,
        });
        match result_of(&inv) {
            Some(r) => Ok(r),
            None => self.poll_until_finished(rt.session.tenant_id, other).await,
        }
    }

    /// Waits for an invocation that another instance runs (or ran) to finish.
    async fn poll_until_finished(&self, tenant_id: Uuid, id: Uuid) -> Result<CallResult> {
        let deadline = Instant::now() + FOREIGN_WAIT;
        let mut delay = Duration::from_millis(20);
        loop {
            let inv = self.store.invocation_page(tenant_id, id, 0, 0).await?;
            if let Some(r) = result_of(&inv) {
                return Ok(r);
            }
            if Instant::now() > deadline {
                return Err(EngineError::Unavailable(
                    "the call is still running elsewhere; retry the same call id later".into(),
                ));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    async fn run_one(
        &self,
        session: &Session,
        rt: &Arc<SessionRuntime>,
        call: &Call,
        args_hash: &str,
    ) -> Result<CallResult> {
        let guard = match self.inflight.claim(session.id, &call.id)? {
            Claim::Wait(rx) => return wait_slot(rx).await,
            Claim::Mine(g) => g,
        };
        let t0 = Instant::now();
        let started_at = chrono::Utc::now();
        let tool = self.registry.get(&call.name).cloned();
        let invocation = NewInvocation {
            id: new_id(),
            session_id: session.id,
            call_id: call.id.clone(),
            name: call.name.clone(),
            // Recorded without NUL characters (no database text type holds them); the hash is
            // of the arguments as sent, so a retry is still recognised.
            arguments: without_nul(&call.arguments),
            arguments_sha256: args_hash.to_owned(),
            read_only: tool.as_ref().is_none_or(|t| t.spec().read_only),
            capabilities: tool
                .as_ref()
                .map(|t| t.spec().capabilities.clone())
                .unwrap_or_default(),
            node: self.config.node.clone(),
            started_at,
        };

        // Refusals before anything runs are recorded like any call, in one write.
        let refusal = match &tool {
            None => Some((
                CallStatus::UnknownTool,
                format!(
                    "Unknown tool '{}'. Available tools: {}.",
                    call.name,
                    self.tools_for(session).join(", ")
                ),
            )),
            Some(_) if !session.allows_tool(&call.name) => Some((
                CallStatus::Denied,
                format!(
                    "Tool '{}' is not enabled for this session. Enabled tools: {}.",
                    call.name,
                    self.tools_for(session).join(", ")
                ),
            )),
            Some(_) => match (
                nul_pointer(&call.arguments, String::new()),
                self.registry.validate(&call.name, &call.arguments),
            ) {
                (Some(at), _) => Some((
                    CallStatus::InvalidArguments,
                    format!(
                        "Invalid arguments for {}: arguments{at} contains a NUL character (\\u0000), which no argument may hold (in a path it makes an invalid path). Remove it and call again.",
                        call.name
                    ),
                )),
                (None, Some(Err(e))) => {
                    Some((CallStatus::InvalidArguments, e.to_model_text(&call.name)))
                }
                _ => None,
            },
        };
        let tool = match (tool, refusal) {
            (Some(tool), None) => tool,
            (_, Some((status, content))) => {
                let out = ToolOutput {
                    status,
                    content,
                    changes: Vec::new(),
                    events: Vec::new(),
                };
                let recorded = self.outcome(session, &invocation, out, t0);
                return self
                    .commit_record(guard, rt, call, invocation, recorded)
                    .await;
            }
            (None, None) => return Err(EngineError::Internal("unreachable".into())),
        };
        let ctx = self.tool_context(session, rt);
        let read_only = tool.spec().read_only;
        if read_only && !self.config.durable_start_for_read_only {
            let out = {
                let _shared = rt.schedule.read().await;
                self.run_tool(tool.as_ref(), ctx, call.arguments.clone())
                    .await
            };
            let recorded = self.outcome(session, &invocation, out, t0);
            return self
                .commit_record(guard, rt, call, invocation, recorded)
                .await;
        }
        // A mutating call runs alone; a read-only one (recorded durably first only because the
        // operator asked for it) still shares the session with other reads.
        let (_shared, _alone) = if read_only {
            (Some(rt.schedule.read().await), None)
        } else {
            (None, Some(rt.schedule.write().await))
        };
        if tool.spec().capabilities.contains(&Capability::Process) {
            rt.ensure_baseline(&self.inotify, crate::scans::budget(&self.config.limits))
                .await?;
        }
        let invocation_id = invocation.id;
        let key = key_of(&invocation);
        match self.recorder.write(Write::Start { invocation }).await {
            Err(e) => return Err(e.into()),
            Ok(Err(WriteError::DuplicateCall(other))) => {
                drop(guard);
                return self.adopt_recorded(rt, call, args_hash, other).await;
            }
            Ok(Err(WriteError::SessionNotActive)) => return Err(closed(session.id)),
            Ok(Err(e)) => return Err(EngineError::Internal(e.to_string())),
            Ok(Ok(_)) => rt.remember(key),
        }
        let mut out = self
            .run_tool(tool.as_ref(), ctx, call.arguments.clone())
            .await;
        if !read_only {
            self.record_workspace_changes(rt, &mut out).await;
        }
        let stub = NewInvocationRef {
            id: invocation_id,
            call_id: &call.id,
            name: &call.name,
        };
        let recorded = self.outcome_for(session, stub, out, t0);
        self.commit_finish(guard, session.id, invocation_id, recorded)
            .await
    }

    /// Adds to a mutating call's changes whatever else changed in the workspace since the last
    /// scan: everything a shell command did, and what background processes did meanwhile. The
    /// tool's own account of a path wins over the scan's. Sessions that never ran a command
    /// have no baseline and skip this.
    async fn record_workspace_changes(&self, rt: &SessionRuntime, out: &mut ToolOutput) {
        let mut guard = rt.snapshot.lock().await;
        let Some(mut snap) = guard.take() else {
            return;
        };
        let ws = rt.workspace.clone();
        let budget = crate::scans::budget(&self.config.limits);
        let t0 = Instant::now();
        let scanned = tokio::task::spawn_blocking(move || {
            let report = snap.rescan_within(&ws, &budget);
            (snap, report)
        })
        .await;
        let mode = match &scanned {
            Ok((_, Ok(report))) => match report.full_walk {
                None => "events".to_owned(),
                Some(reason) => format!("{reason:?}"),
            },
            _ => "failed".to_owned(),
        };
        self.metrics
            .workspace_scan(&mode, t0.elapsed().as_secs_f64());
        match scanned {
            Ok((snap, Ok(report))) => {
                *guard = Some(snap);
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
    }

    fn tools_for(&self, session: &Session) -> Vec<String> {
        self.registry
            .names()
            .filter(|n| session.allows_tool(n))
            .map(str::to_owned)
            .collect()
    }

    fn outcome(
        &self,
        session: &Session,
        inv: &NewInvocation,
        out: ToolOutput,
        t0: Instant,
    ) -> Recorded {
        self.outcome_for(
            session,
            NewInvocationRef {
                id: inv.id,
                call_id: &inv.call_id,
                name: &inv.name,
            },
            out,
            t0,
        )
    }

    /// Truncates the output for the model, keeps the full output as a blob when cut, and turns
    /// file changes into side-effect events with their blobs.
    fn outcome_for(
        &self,
        session: &Session,
        inv: NewInvocationRef<'_>,
        out: ToolOutput,
        t0: Instant,
    ) -> Recorded {
        let mut limit = self
            .registry
            .get(inv.name)
            .map(|t| t.spec().output_limit)
            .unwrap_or(toolexec_core::OutputLimit::new(
                50_000,
                toolexec_core::TruncationMode::HeadTail,
            ));
        if let Some(chars) = session.policy.output_limits.get(inv.name) {
            limit.max_chars = *chars;
        }
        let limits = &self.config.limits;
        // File changes first: past the per-call cap they are summed up, and the model is told.
        let mut blobs = Vec::new();
        let mut files = crate::effects::FileEvents::new(limits.max_file_events_per_call);
        for change in out.changes {
            let (event, blob) = self.change_event(change);
            files.push(event);
            blobs.extend(blob);
        }
        let (mut side_effects, manifest, files_note) = files.finish();
        blobs.extend(manifest);
        crate::effects::dedup_blobs(&mut blobs);
        let mut full = out.content;
        full.extend(files_note);
        // Text with NUL cannot be stored (nor is it useful to a model): shown as U+FFFD.
        if full.contains('\0') {
            full = full.replace('\0', "\u{FFFD}");
        }
        let hint = if full.len() <= limits.max_stored_output_bytes {
            format!(
                "call read_output with invocation_id \"{}\" to page through the full output",
                inv.id
            )
        } else {
            format!(
                "call read_output with invocation_id \"{}\" to page through the recorded output \
                 (only its first and last {} bytes are kept: it is over the service's {}-byte \
                 limit for a recorded output)",
                inv.id,
                limits.max_stored_output_bytes / 2,
                limits.max_stored_output_bytes
            )
        };
        let (content, truncated) = truncate(&full, limit, &hint);
        let output_sha256 = truncated.as_ref().map(|_| {
            let stored = crate::effects::stored_output(full, limits.max_stored_output_bytes);
            let blob = Blob::new(stored.into_bytes());
            let sha = blob.sha256.clone();
            blobs.push(blob);
            sha
        });
        side_effects.extend(out.events.into_iter().map(|e| toolexec_store::NewEvent {
            kind: e.kind,
            data: e.data,
        }));
        let duration_ms = t0.elapsed().as_secs_f64() * 1000.0;
        let output_chars = truncated
            .as_ref()
            .map_or_else(|| content.chars().count(), |t| t.total_chars);
        Recorded {
            result: CallResult {
                call_id: inv.call_id.to_owned(),
                invocation_id: inv.id,
                name: inv.name.to_owned(),
                status: out.status,
                is_error: out.status.is_error(),
                content: content.clone(),
                truncated: truncated.clone(),
                duration_ms,
                seq: 0,
            },
            outcome: Outcome {
                status: out.status,
                content,
                truncated,
                output_chars: i64::try_from(output_chars).unwrap_or(i64::MAX),
                output_sha256,
                finished_at: chrono::Utc::now(),
                duration_ms,
            },
            side_effects,
            blobs,
        }
    }

    /// Records a call that started and finished here in one write.
    async fn commit_record(
        &self,
        guard: InflightGuard,
        rt: &SessionRuntime,
        call: &Call,
        invocation: NewInvocation,
        mut rec: Recorded,
    ) -> Result<CallResult> {
        let session_id = invocation.session_id;
        let key = key_of(&invocation);
        self.blob_budget(&mut rec);
        let write = Write::Record {
            invocation,
            outcome: rec.outcome,
            side_effects: rec.side_effects,
            blobs: rec.blobs,
        };
        let (mut recorded, mut back) = self.recorder.write_back(write).await;
        let mut result = rec.result;
        // A write the store cannot hold is recorded as a failed call instead (nothing to retry).
        if let (Ok(Err(WriteError::Refused(reason))), Some(original)) = (&recorded, back.take()) {
            tracing::error!(%reason, call_id = %call.id, "the store refused a call's record; recording it as failed");
            for (fallback, outcome) in storable::fallbacks(&original, reason) {
                recorded = self.recorder.write(fallback).await;
                if !matches!(recorded, Ok(Err(WriteError::Refused(_)))) {
                    result = refused_result(result, &outcome);
                    break;
                }
            }
        }
        match recorded {
            // Nothing with a side effect ran yet: the client retries and it runs again.
            Err(e) => Err(e.into()),
            Ok(Ok(a)) => {
                rt.remember(key);
                Ok(finish(&self.metrics, guard, result, a))
            }
            Ok(Err(WriteError::DuplicateCall(other))) => {
                drop(guard);
                self.adopt_recorded(rt, call, &key.arguments_sha256, other)
                    .await
            }
            Ok(Err(WriteError::SessionNotActive)) => Err(closed(session_id)),
            Ok(Err(e)) => Err(EngineError::Internal(e.to_string())),
        }
    }

    /// Records the end of a mutating call. Its effects already happened, so it is recorded
    /// whatever it takes: a store failure is retried in the background (with backoff, holding
    /// one copy of the write) until it lands, and a write the store refuses is recorded as a
    /// failed call instead. The request waits for the first attempt, then up to
    /// [`FINISH_GRACE`] for the retries; a retry of the call meanwhile waits for the record.
    async fn commit_finish(
        &self,
        guard: InflightGuard,
        session_id: Uuid,
        invocation_id: Uuid,
        mut rec: Recorded,
    ) -> Result<CallResult> {
        self.blob_budget(&mut rec);
        let write = Write::Finish {
            session_id,
            invocation_id,
            outcome: rec.outcome,
            side_effects: rec.side_effects,
            blobs: rec.blobs,
        };
        let recorder = self.recorder.clone();
        let metrics = self.metrics.clone();
        let result = rec.result;
        let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
        let (failed_tx, failed_rx) = tokio::sync::oneshot::channel();
        // Its own task: the record must land even if the client goes away meanwhile.
        tokio::spawn(async move {
            if let Some((result, a)) =
                record_finish(&recorder, write, result, invocation_id, failed_tx).await
            {
                let _ = done_tx.send(finish(&metrics, guard, result, a));
            }
        });
        let done = tokio::select! {
            biased;
            done = &mut done_rx => Ok(done),
            // The first attempt failed (or the task ended): the grace starts now.
            _ = failed_rx => tokio::time::timeout(FINISH_GRACE, done_rx).await,
        };
        match done {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err(EngineError::Internal(format!(
                "the finish of invocation {invocation_id} could not be recorded"
            ))),
            Err(_) => Err(EngineError::Unavailable(
                "the call ran but its result is not recorded yet (the store is unavailable); retry the same call id to get it".into(),
            )),
        }
    }

    /// Holds a call's stored contents to `limits.max_blob_bytes_per_call`.
    fn blob_budget(&self, rec: &mut Recorded) {
        let max = self.config.limits.max_blob_bytes_per_call;
        let dropped = storable::apply_blob_budget(&mut rec.side_effects, &mut rec.blobs, max);
        if dropped > 0 {
            tracing::info!(
                dropped,
                max,
                invocation = %rec.result.invocation_id,
                "file contents beyond the call's blob budget recorded by hash only"
            );
        }
    }
}

/// Writes a finish until it is recorded: store failures are retried with backoff (up to 5 s
/// apart), the first of them signalled on `failed`; a refusal moves on to what
/// [`storable::fallbacks`] records in its place. `None` when nothing could be recorded (the
/// invocation is not running any more, or every fallback was refused), which the log explains.
async fn record_finish(
    recorder: &crate::recorder::Recorder,
    write: Write,
    mut result: CallResult,
    invocation_id: Uuid,
    failed: tokio::sync::oneshot::Sender<()>,
) -> Option<(CallResult, Assigned)> {
    let mut failed = Some(failed);
    let mut current = write;
    let mut ladder: Option<std::vec::IntoIter<(Write, Outcome)>> = None;
    let mut delay = Duration::from_millis(50);
    loop {
        let (recorded, back) = recorder.write_back(current).await;
        match recorded {
            Ok(Ok(a)) => return Some((result, a)),
            Ok(Err(WriteError::Refused(reason))) => {
                tracing::error!(%reason, %invocation_id, "the store refused a finish; recording the call as failed");
                if ladder.is_none() {
                    let original = back?;
                    ladder = Some(storable::fallbacks(&original, &reason).into_iter());
                }
                let (next, outcome) = ladder.as_mut()?.next()?;
                result = refused_result(result, &outcome);
                current = next;
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, %invocation_id, "finish refused by the store");
                return None;
            }
            Err(e) => {
                // Kept once (handed back by the recorder), retried until the store is back.
                tracing::warn!(error = %e, %invocation_id, "finish not recorded yet; retrying");
                if let Some(failed) = failed.take() {
                    let _ = failed.send(());
                }
                current = back?;
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// A call's result as recorded in place of one the store refused.
fn refused_result(mut result: CallResult, outcome: &Outcome) -> CallResult {
    result.status = outcome.status;
    result.is_error = outcome.status.is_error();
    result.content = outcome.content.clone();
    result.truncated = None;
    result
}

/// The parts of an invocation needed to build its result.
struct NewInvocationRef<'a> {
    id: Uuid,
    call_id: &'a str,
    name: &'a str,
}

struct Recorded {
    result: CallResult,
    outcome: Outcome,
    side_effects: Vec<toolexec_store::NewEvent>,
    blobs: Vec<Blob>,
}

fn finish(
    metrics: &Metrics,
    guard: InflightGuard,
    mut result: CallResult,
    a: Assigned,
) -> CallResult {
    result.seq = a.finished_seq.unwrap_or(a.started_seq);
    metrics.call(
        &result.name,
        result.status.as_str(),
        result.duration_ms / 1000.0,
    );
    guard.publish(&result);
    result
}

fn key_of(inv: &NewInvocation) -> CallKey {
    CallKey {
        call_id: inv.call_id.clone(),
        name: inv.name.clone(),
        arguments_sha256: inv.arguments_sha256.clone(),
        invocation_id: inv.id,
    }
}

fn result_of(inv: &Invocation) -> Option<CallResult> {
    let status = inv.status.finished()?;
    Some(CallResult {
        call_id: inv.call_id.clone(),
        invocation_id: inv.id,
        name: inv.name.clone(),
        status,
        is_error: status.is_error(),
        content: inv.content.clone().unwrap_or_default(),
        truncated: inv.truncated.clone(),
        duration_ms: inv.duration_ms.unwrap_or(0.0),
        seq: inv.finished_seq.unwrap_or(inv.started_seq),
    })
}

fn reused(call_id: &str) -> EngineError {
    EngineError::Conflict {
        code: "call_id_reused",
        detail: format!(
            "call id '{call_id}' was already used in this session with other arguments; use a new id for a new call"
        ),
    }
}

fn closed(session_id: Uuid) -> EngineError {
    EngineError::Conflict {
        code: "session_closed",
        detail: format!("session {session_id} is closed"),
    }
}
