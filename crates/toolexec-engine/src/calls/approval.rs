//! Calls that wait for a person (a session's `policy.approval`).
//!
//! A call the policy gates passes every check a call must pass (known, allowed, valid
//! arguments) and is then recorded `pending_approval` with an `approval.requested` event, and
//! answered at once: it has not run. A decision is one store transaction under the session's
//! lock ([`toolexec_store::Approvals::decide_approval`]): `approval.decided` (who, why), then, for
//! an approval, its `invocation.started` — the call then runs on this node like any mutating
//! call, in the session's order from then on, and its end is recorded as usual; for a denial,
//! its `invocation.finished`, `denied`, without running. Only one decision is ever recorded:
//! the same decision again answers as the first did (a retried approve is harmless), the other
//! one is a conflict. A call nobody decides is denied when its wait ends, by a timer of the node
//! that recorded it (re-armed from the store when the node starts, and by a node that takes
//! the session over).
use std::sync::{Arc, Weak};
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde_json::json;
use toolexec_core::{
    ApprovalPolicy, Call, CallResult, CallStatus, EventKind, Invocation, InvocationStatus,
    ProblemCode, Session,
};
use toolexec_store::{Outcome, Waiters, WriteError};
use toolexec_tools::Resolved;
use uuid::Uuid;

use super::cancel::BatchControl;
use super::commit::{closed, key_of};
use super::inflight::Claim;
use super::run::{Pending, Started};
use crate::runtimes::SessionRuntime;
use crate::{Engine, EngineError, Result};

/// A person's (or the clock's) decision on a waiting call.
#[derive(Debug, Clone)]
pub struct Decision {
    pub approve: bool,
    /// Who decided, as recorded: the tenant whose key made the request, and the name the
    /// request gave.
    pub by: serde_json::Value,
    pub reason: Option<String>,
    /// Nobody decided in time.
    pub expired: bool,
}

/// What the client reads of a call that waits: it has not run, and how to go on.
fn pending_text(invocation_id: Uuid) -> String {
    format!(
        "This call waits for a person's approval (the session's policy.approval) and has not run. \
         Approve it with POST /v1/invocations/{invocation_id}/approve or deny it with \
         POST /v1/invocations/{invocation_id}/deny; GET /v1/invocations/{invocation_id}?wait=60 \
         returns once it is decided and has run. A call nobody decides in time is denied."
    )
}

/// The result of a call recorded waiting (what a retry of its id answers too).
pub(super) fn pending_result(inv: &Invocation) -> CallResult {
    CallResult {
        call_id: inv.call_id.clone(),
        invocation_id: inv.id,
        name: inv.name.clone(),
        status: CallStatus::PendingApproval,
        is_error: false,
        content: pending_text(inv.id),
        truncated: None,
        duration_ms: 0.0,
        seq: inv.started_seq,
        structured: None,
    }
}

/// Why a call waits for a person.
pub(super) struct Gate<'a> {
    pub(super) policy: &'a ApprovalPolicy,
    /// What of the policy gates it (`tool:shell`, `capability:process`).
    pub(super) reasons: Vec<String>,
    /// The recorded invocation a verify replay re-runs with this call: the request names it,
    /// and an approval serves the call's web observations from its record.
    pub(super) replay_of: Option<Uuid>,
}

/// The calls a person must approve: recording one as waiting, timing its wait (and denying it
/// when the wait ends), recording a decision, and running an approved call in a task of its
/// own. Writes `approval.requested` and `approval.decided` (through the store's approval
/// methods), and the call's end.
pub struct Approvals {
    /// The calls waiting for approval whose expiry this node times.
    timers: std::sync::Mutex<std::collections::HashMap<Uuid, tokio::task::AbortHandle>>,
    /// The engine, for the tasks approvals start on their own (timers, approved calls) without
    /// keeping it alive.
    me: std::sync::OnceLock<Weak<Engine>>,
}

impl Approvals {
    pub(crate) fn new() -> Self {
        Self {
            timers: std::sync::Mutex::new(std::collections::HashMap::new()),
            me: std::sync::OnceLock::new(),
        }
    }

    /// Gives the timers the engine they decide in.
    pub(crate) fn wire(&self, engine: &Arc<Engine>) {
        let _ = self.me.set(Arc::downgrade(engine));
    }
}

impl Approvals {
    /// Records a call the policy gates as waiting, and answers so. A session where
    /// `limits.max_waiting_approvals_per_session` calls wait already gets the call recorded
    /// `denied` instead, saying why.
    pub(super) async fn request_approval(
        &self,
        engine: &Engine,
        session: &Session,
        rt: &Arc<SessionRuntime>,
        pending: Pending<'_>,
        gate: Gate<'_>,
        args_hash: &str,
    ) -> Result<CallResult> {
        // The default wait, when the policy gives none, within the operator's ceiling too.
        let timeout_ms = gate
            .policy
            .timeout_ms()
            .min(engine.config.limits.max_approval_wait_ms);
        let expires_at = Utc::now()
            + chrono::Duration::milliseconds(i64::try_from(timeout_ms).unwrap_or(i64::MAX / 2));
        let mut data = json!({
            "reasons": gate.reasons,
            "timeout_ms": timeout_ms,
            "expires_at": expires_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        });
        if let Some(recorded) = gate.replay_of {
            data["replay_of"] = json!(recorded);
        }
        let key = key_of(&pending.invocation);
        let id = pending.invocation.id;
        let max = engine.config.limits.max_waiting_approvals_per_session;
        match engine
            .store
            .request_approval(pending.invocation.clone(), data, max)
            .await?
        {
            Ok(seq) => {
                rt.remember(key);
                engine.streams.notify(session.id);
                self.arm_expiry(session.tenant_id, id, expires_at);
                let call = pending.call;
                let result = CallResult {
                    call_id: call.id.clone(),
                    invocation_id: id,
                    name: call.name.clone(),
                    status: CallStatus::PendingApproval,
                    is_error: false,
                    content: pending_text(id),
                    truncated: None,
                    duration_ms: 0.0,
                    seq,
                    structured: None,
                };
                // A retry of the id that came meanwhile waits on this slot: it gets the same.
                pending.guard.publish(&result);
                Ok(result)
            }
            Err(WriteError::TooManyWaiting(n)) => {
                let out = toolexec_tools::ToolOutput::denied(format!(
                    "Denied without asking: {n} calls of this session already wait for a person's approval (limits.max_waiting_approvals_per_session). Wait for them to be decided, then call again."
                ));
                engine.calls.record_at_once(engine, rt, pending, out).await
            }
            Err(WriteError::DuplicateCall(other)) => {
                let call = pending.call;
                drop(pending.guard);
                engine
                    .calls
                    .adopt_recorded(engine, rt, call, args_hash, other)
                    .await
            }
            Err(WriteError::SessionNotActive) => Err(closed(session.id)),
            Err(e) => Err(EngineError::Internal(e.to_string())),
        }
    }

    /// A `pending_approval` result once its call is decided and has ended, waiting up to
    /// `wait` (for doors whose clients cannot be answered "later", such as MCP's `tools/call`);
    /// any other result as it is. Still undecided after `wait` (or the wait cannot be
    /// followed): the pending result.
    pub async fn after_approval(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        result: CallResult,
        wait: std::time::Duration,
    ) -> CallResult {
        if result.status != CallStatus::PendingApproval {
            return result;
        }
        match engine
            .streams
            .wait_invocation(tenant_id, result.invocation_id, wait, None, Some(1))
            .await
        {
            Ok(inv) if inv.status.finished().is_some() => {
                super::recorded::result_of(&inv).unwrap_or(result)
            }
            _ => result,
        }
    }

    /// Decides a waiting call (`POST /v1/invocations/{id}/approve|deny`, or its expiry) and
    /// returns the invocation as it is then. An approved call starts running on this node
    /// before this returns; wait for its end with [`Streams::wait_invocation`](crate::Streams::wait_invocation).
    ///
    /// For an approval, the session is made this node's (its lease held, a take-over done)
    /// and the call registered as cancellable before the decision is recorded: what a
    /// take-over interrupts is never the call just approved, and a cancel from the moment it
    /// is approved reaches it.
    pub async fn decide(
        &self,
        engine: &Arc<Engine>,
        tenant_id: Uuid,
        invocation_id: Uuid,
        decision: Decision,
    ) -> Result<Invocation> {
        let inv = engine
            .store
            .invocation_page(tenant_id, invocation_id, 0, 0)
            .await?;
        if inv.status == InvocationStatus::PendingApproval {
            let prepared = match decision.approve {
                true => Some(self.prepare_approved(engine, tenant_id, &inv).await?),
                false => None,
            };
            match self
                .record_decision(engine, tenant_id, &inv, &decision)
                .await?
            {
                Ok(done) => {
                    if let Some(prepared) = prepared {
                        self.spawn_approved(engine, prepared, inv);
                    }
                    tracing::info!(invocation = %invocation_id, session = %done.session_id, approved = decision.approve, expired = decision.expired, "approval decided");
                    return Ok(engine
                        .store
                        .invocation_page(tenant_id, invocation_id, 0, 0)
                        .await?);
                }
                Err(WriteError::NotPending(_)) => {}
                Err(WriteError::WaitEnded(at)) => {
                    // Too late: the wait ended (its timer is late, or on a node that is gone).
                    // It is denied as expired now, and the approval says so.
                    let _ = self
                        .record_decision(engine, tenant_id, &inv, &expiry())
                        .await?;
                    return Err(EngineError::Conflict {
                        code: ProblemCode::AlreadyDecided,
                        detail: format!(
                            "invocation {invocation_id} waited for approval until {at}; nobody decided in time, so it is recorded denied and did not run"
                        ),
                    });
                }
                Err(WriteError::SessionNotActive) => return Err(closed(inv.session_id)),
                Err(e) => return Err(EngineError::Internal(e.to_string())),
            }
        }
        // Decided before (or never waiting): the same decision answers as the first did.
        let inv = engine
            .store
            .invocation_page(tenant_id, invocation_id, 0, 0)
            .await?;
        match self.recorded_decision(engine, tenant_id, &inv).await? {
            Some(d)
                if d["decision"]
                    == if decision.approve {
                        "approved"
                    } else {
                        "denied"
                    } =>
            {
                Ok(inv)
            }
            Some(d) => Err(EngineError::Conflict {
                code: ProblemCode::AlreadyDecided,
                detail: format!(
                    "invocation {invocation_id} was already {} (by {}{}); a decision is final",
                    d["decision"].as_str().unwrap_or("decided"),
                    d["by"],
                    if d["expired"] == true {
                        ", its wait having ended"
                    } else {
                        ""
                    }
                ),
            }),
            None => Err(EngineError::Conflict {
                code: ProblemCode::AlreadyDecided,
                detail: format!(
                    "invocation {invocation_id} never waited for approval (it is {}); only a call answered pending_approval can be approved or denied",
                    inv.status.as_str()
                ),
            }),
        }
    }

    /// Records a decision on `inv` (one store transaction; see the module docs), and stops
    /// its timer when it is recorded.
    async fn record_decision(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        inv: &Invocation,
        decision: &Decision,
    ) -> Result<std::result::Result<toolexec_store::Decided, WriteError>> {
        let data = json!({
            "call_id": inv.call_id,
            "decision": if decision.approve { "approved" } else { "denied" },
            "by": decision.by,
            "reason": decision.reason,
            "expired": decision.expired,
        });
        let denied = (!decision.approve).then(|| denial(inv, decision));
        let done = engine
            .store
            .decide_approval(tenant_id, inv.id, data, denied, &engine.config.node)
            .await?;
        if let Ok(d) = &done {
            engine.streams.notify(d.session_id);
            self.disarm_expiry(inv.id);
        }
        Ok(done)
    }

    /// The `approval.decided` event of an invocation decided before: the event just before its
    /// `invocation.started` (approved) or its `invocation.finished` (denied).
    async fn recorded_decision(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        inv: &Invocation,
    ) -> Result<Option<serde_json::Value>> {
        for seq in [
            Some(inv.started_seq + 1),
            Some(inv.started_seq),
            inv.finished_seq,
        ]
        .into_iter()
        .flatten()
        {
            let found = engine
                .store
                .events_of_kinds(
                    tenant_id,
                    inv.session_id,
                    &[EventKind::ApprovalDecided],
                    seq - 2,
                    seq - 1,
                    1,
                )
                .await?;
            if let Some(e) = found.into_iter().find(|e| e.invocation_id == Some(inv.id)) {
                return Ok(Some(e.data));
            }
        }
        Ok(None)
    }

    /// Makes an approved call's session this node's and registers the call, before the
    /// approval is recorded (see [`Engine::decide`]). An error here records nothing: the call
    /// still waits.
    async fn prepare_approved(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        inv: &Invocation,
    ) -> Result<Approved> {
        let session = engine.store.get_session(tenant_id, inv.session_id).await?;
        if session.status != toolexec_core::SessionStatus::Active {
            return Err(closed(session.id));
        }
        let Some(tool) = engine.registry.resolve(&inv.name) else {
            return Err(EngineError::Unavailable(format!(
                "tool {} is not in this node's catalog any more, so the call cannot run here; deny it",
                inv.name
            )));
        };
        let observed = self
            .replayed_observations(engine, &session, inv, &tool)
            .await?;
        let (lease, previous) = engine.cluster.hold(session.id).await?;
        if previous.is_some() {
            engine.runtimes.forget_runtime(session.id);
        }
        let rt = engine
            .runtimes
            .runtime(engine, &session, previous.as_deref())
            .await?;
        let control = Arc::new(BatchControl::new(tenant_id, session.id, 1));
        control.planned(vec![true]);
        let registration = engine.calls.register_batch(control.clone());
        let cancel = control.call_token();
        let cancellable = engine
            .calls
            .register_call(inv.id, tenant_id, cancel.clone());
        Ok(Approved {
            session,
            rt,
            tool,
            observed,
            control,
            cancel,
            _lease: lease,
            _registration: registration,
            _cancellable: cancellable,
        })
    }

    /// For a call of a replay session that reaches the outside world, the observations of
    /// the recorded call its `approval.requested` says it re-runs (`replay_of`): a replayed
    /// call approved again is served from the record like any replayed call.
    async fn replayed_observations(
        &self,
        engine: &Engine,
        session: &Session,
        inv: &Invocation,
        tool: &Resolved,
    ) -> Result<toolexec_tools::observe::Observed> {
        let live = toolexec_tools::observe::Observed::Live;
        let replay = session
            .origin
            .is_some_and(|o| o.kind == toolexec_core::OriginKind::Replay);
        if !replay || !tool.spec().has(toolexec_core::Capability::Network) {
            return Ok(live);
        }
        let requested = engine
            .store
            .events_of_kinds(
                session.tenant_id,
                session.id,
                &[EventKind::ApprovalRequested],
                inv.started_seq - 1,
                inv.started_seq,
                1,
            )
            .await?;
        let Some(recorded) = requested
            .iter()
            .find(|e| e.invocation_id == Some(inv.id))
            .and_then(|e| e.data["replay_of"].as_str())
            .and_then(|id| Uuid::parse_str(id).ok())
        else {
            return Ok(live);
        };
        let call = Call {
            id: inv.call_id.clone(),
            name: inv.name.clone(),
            arguments: serde_json::Value::Null,
        };
        engine
            .history
            .observed_for(engine, session, recorded, &call, &inv.arguments_sha256)
            .await
    }

    /// Runs an approved call in a task of its own: the decision is recorded whatever happens to
    /// the request that made it.
    fn spawn_approved(&self, engine: &Arc<Engine>, approved: Approved, inv: Invocation) {
        let engine = engine.clone();
        tokio::spawn(async move {
            let id = inv.id;
            let tenant_id = approved.session.tenant_id;
            let call = Call {
                id: inv.call_id.clone(),
                name: inv.name.clone(),
                arguments: inv.arguments.clone(),
            };
            let guard = match engine.calls.claim(approved.session.id, &call.id) {
                Ok(Claim::Mine(g)) => g,
                // Already running here (it cannot be: one decision is recorded), or a poisoned
                // map: nothing ran, and it says so.
                Ok(Claim::Wait(_)) => return,
                Err(e) => {
                    engine
                        .approvals
                        .fail_approved(&engine, tenant_id, id, &e)
                        .await;
                    return;
                }
            };
            match engine
                .approvals
                .run_approved(&engine, &approved, &call, guard, id)
                .await
            {
                Ok(result) => approved.control.ended(0, &result),
                // Its tool ran (or was being run): its end is recorded by the finish path,
                // which retries until the store takes it.
                Err(e) => {
                    tracing::error!(error = %e, invocation = %id, "an approved call's end could not be recorded yet");
                }
            }
        });
    }

    async fn run_approved(
        &self,
        engine: &Engine,
        a: &Approved,
        call: &Call,
        guard: super::inflight::InflightGuard,
        invocation_id: Uuid,
    ) -> Result<CallResult> {
        // Its turn, in the session's order from now: a mutating call has the session alone.
        let _turn = if a.tool.spec().read_only {
            futures::future::Either::Left(a.rt.schedule.read().await)
        } else {
            futures::future::Either::Right(a.rt.schedule.write().await)
        };
        if a.tool
            .spec()
            .capabilities
            .contains(&toolexec_core::Capability::Process)
            && let Err(e) =
                a.rt.ensure_baseline(&engine.inotify, crate::scans::budget(&engine.config.limits))
                    .await
        {
            // Nothing ran: recorded failed, so that nobody waits for it.
            drop(guard);
            self.fail_approved(engine, a.session.tenant_id, invocation_id, &e)
                .await;
            return Err(e);
        }
        let started = Started {
            call,
            invocation_id,
            limit: super::outcome::output_limit(Some(a.tool.tool()), &a.session, &call.name),
            guard,
            t0: Instant::now(),
        };
        let mut ctx = engine.runtimes.tool_context(engine, &a.session, &a.rt);
        ctx.observed = a.observed.clone();
        engine
            .calls
            .run_started(
                engine,
                &a.session,
                &a.rt,
                started,
                &a.tool,
                ctx,
                &a.control,
                a.cancel.clone(),
            )
            .await
    }

    /// An approved call that could not be started is recorded failed, so that nobody waits
    /// for it.
    async fn fail_approved(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        invocation_id: Uuid,
        e: &EngineError,
    ) {
        let Ok(inv) = engine
            .store
            .invocation_page(tenant_id, invocation_id, 0, 0)
            .await
        else {
            return;
        };
        if inv.status != InvocationStatus::Running {
            return;
        }
        let content = format!(
            "This call was approved but could not be started ({}); it did not run. Send it again with a new call id.",
            client_detail(e)
        );
        let write = toolexec_store::Write::Finish {
            session_id: inv.session_id,
            invocation_id,
            outcome: Outcome {
                status: CallStatus::Error,
                output_chars: content.chars().count() as i64,
                content,
                truncated: None,
                output_sha256: None,
                finished_at: Utc::now(),
                duration_ms: 0.0,
                reads: Vec::new(),
                structured: None,
            },
            side_effects: Vec::new(),
            blobs: Vec::new(),
        };
        if let Err(e) = engine.recorder.write(write).await {
            tracing::error!(error = %e, invocation = %invocation_id, "the failure of an approved call could not be recorded");
        }
    }

    /// Denies `invocation_id` when its wait ends, unless someone decides first (which stops
    /// the timer).
    pub(crate) fn arm_expiry(&self, tenant_id: Uuid, invocation_id: Uuid, at: DateTime<Utc>) {
        let Some(engine) = self.me.get().cloned() else {
            return;
        };
        let Ok(mut armed) = self.timers.lock() else {
            return;
        };
        if armed.contains_key(&invocation_id) {
            return;
        }
        let task = tokio::spawn(expire(engine, tenant_id, invocation_id, at));
        armed.insert(invocation_id, task.abort_handle());
    }

    fn disarm_expiry(&self, invocation_id: Uuid) {
        if let Ok(mut armed) = self.timers.lock()
            && let Some(task) = armed.remove(&invocation_id)
        {
            task.abort();
        }
    }

    /// Arms the timers of waiting calls: those this node recorded (at start-up), or those of a
    /// session (one this node takes over). Errors are logged: a call left unarmed is still
    /// decided by a person, denied if approved after its wait, or timed by the next start.
    pub(crate) async fn arm_pending(&self, engine: &Engine, of: Waiters<'_>) {
        match engine.store.pending_approvals(of).await {
            Ok(found) => {
                for p in found {
                    self.arm_expiry(
                        p.tenant_id,
                        p.invocation_id,
                        p.expires_at.unwrap_or_else(Utc::now),
                    );
                }
            }
            Err(e) => {
                tracing::error!(error = %e, ?of, "the calls waiting for approval could not be read; their waits are not timed until the next start");
            }
        }
    }

    /// Denies every call of a session that waits, with `why` (the session is being closed, or
    /// rewound: a call asked for in a state that is gone).
    pub(crate) async fn deny_waiting_of_session(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        session_id: Uuid,
        why: &str,
    ) {
        let found = match engine
            .store
            .pending_approvals(Waiters::Session(session_id))
            .await
        {
            Ok(found) => found,
            Err(e) => {
                tracing::error!(error = %e, session = %session_id, "the calls waiting for approval could not be read; they are denied when their wait ends");
                return;
            }
        };
        let decision = Decision {
            approve: false,
            by: json!({"service": "toolexec"}),
            reason: Some(why.to_owned()),
            expired: false,
        };
        for p in found.into_iter().filter(|p| p.tenant_id == tenant_id) {
            let Ok(inv) = engine
                .store
                .invocation_page(tenant_id, p.invocation_id, 0, 0)
                .await
            else {
                continue;
            };
            if let Err(e) = self
                .record_decision(engine, tenant_id, &inv, &decision)
                .await
            {
                tracing::error!(error = %e, invocation = %p.invocation_id, "a waiting call could not be denied");
            }
        }
    }

    /// `POST /v1/invocations/{id}/cancel` of a call that waits for approval: it is denied (it
    /// will never run), by the tenant that cancelled it.
    pub(crate) async fn cancel_waiting(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        inv: &Invocation,
    ) -> Result<()> {
        let decision = Decision {
            approve: false,
            by: json!({"tenant_id": tenant_id}),
            reason: Some("cancelled (POST /v1/invocations/{id}/cancel)".into()),
            expired: false,
        };
        match self
            .record_decision(engine, tenant_id, inv, &decision)
            .await?
        {
            Ok(_) | Err(WriteError::NotPending(_)) => Ok(()),
            Err(e) => Err(EngineError::Internal(e.to_string())),
        }
    }
}

/// What an approved call runs with, made ready before its approval is recorded.
struct Approved {
    session: Session,
    rt: Arc<SessionRuntime>,
    tool: Resolved,
    /// Where its observations of the outside world come from: the record, for a call a
    /// verify replay re-runs.
    observed: toolexec_tools::observe::Observed,
    control: Arc<BatchControl>,
    cancel: tokio_util::sync::CancellationToken,
    _lease: crate::leases::LeaseGuard,
    _registration: super::cancel::BatchRegistration,
    _cancellable: super::cancel::CallRegistration,
}

/// The clock's decision on a call whose wait ended.
fn expiry() -> Decision {
    Decision {
        approve: false,
        by: json!({"service": "toolexec"}),
        reason: Some("its wait for approval ended".into()),
        expired: true,
    }
}

/// What a client may read of an engine error (store and internal faults say no more).
fn client_detail(e: &EngineError) -> String {
    match e {
        EngineError::Conflict { detail, .. }
        | EngineError::Invalid { detail, .. }
        | EngineError::Unavailable(detail)
        | EngineError::Missing(detail) => detail.clone(),
        EngineError::NotFound => "its session is gone".into(),
        _ => "a fault of the service, in its log".into(),
    }
}

/// The outcome a denial records: what the model reads.
fn denial(inv: &Invocation, decision: &Decision) -> Outcome {
    let why = decision
        .reason
        .as_deref()
        .map(|r| format!(" Reason given: {r}"))
        .unwrap_or_default();
    let content = if decision.expired {
        format!(
            "Denied: nobody approved this {} call in time, so it did not run.{why} Do not retry it as it is; ask the user, or do the task another way.",
            inv.name
        )
    } else {
        format!(
            "Denied: a person reviewing this {} call refused it, so it did not run.{why} Do not retry it as it is; ask the user, or do the task another way.",
            inv.name
        )
    };
    let waited = (Utc::now() - inv.started_at)
        .to_std()
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0);
    Outcome {
        status: CallStatus::Denied,
        output_chars: content.chars().count() as i64,
        content,
        truncated: None,
        output_sha256: None,
        finished_at: Utc::now(),
        duration_ms: waited,
        reads: Vec::new(),
        structured: None,
    }
}

/// The timer of one waiting call.
async fn expire(engine: Weak<Engine>, tenant_id: Uuid, invocation_id: Uuid, at: DateTime<Utc>) {
    let wait = (at - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait).await;
    let Some(engine) = engine.upgrade() else {
        return;
    };
    if let Ok(mut armed) = engine.approvals.timers.lock() {
        armed.remove(&invocation_id);
    }
    let Ok(inv) = engine
        .store
        .invocation_page(tenant_id, invocation_id, 0, 0)
        .await
    else {
        return;
    };
    if inv.status != InvocationStatus::PendingApproval {
        return;
    }
    if let Err(e) = engine
        .approvals
        .record_decision(&engine, tenant_id, &inv, &expiry())
        .await
    {
        tracing::error!(error = %e, invocation = %invocation_id, "an expired approval could not be recorded denied; the next start retries");
    }
}
