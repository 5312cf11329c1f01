//! Running a batch of calls. The jobs, one module each:
//!
//! - `envelope`: what a batch must satisfy before anything of it runs, and its plan — retries
//!   answered from the record, ids repeated within the batch, each call's tool resolved once;
//! - scheduling (here): read-only calls of a batch run together, a mutating call runs alone and
//!   in order;
//! - `inflight`: the calls running on this node, so that a concurrent retry waits for the result;
//! - `cancel`: the batches and cancellable calls of this node, and what stops them (a cancel of
//!   one call or of a session's pending calls, a client that went away);
//! - `recorded`: retries of calls already recorded, here or elsewhere;
//! - `run`: running one call, with its refusals and its workspace scan;
//! - `outcome`: the result for the model (truncated) and the record (blobs, side effects);
//! - `commit`: writing the record, whatever the store does meanwhile.
//!
//! Recording rules: a mutating call's `invocation.started` is durable before the tool runs
//! (`Write::Start`), its side effects and `invocation.finished` after (`Write::Finish`). A
//! read-only call has no side effect to guard, so by default it is recorded in one write after it
//! ran (`Write::Record`; `EngineConfig::durable_start_for_read_only` makes it take the two-write
//! path too) — and in every case no result reaches the client before it is durable. A read that
//! ends with no side effect is then one event, its `invocation.finished` carrying its start
//! (SPEC §6; `toolexec_store::Write::Record`).
mod approval;
mod cancel;
mod commit;
mod envelope;
mod inflight;
mod outcome;
mod recorded;
mod run;

use std::sync::Arc;

use futures::future::join_all;
use toolexec_core::{Call, CallResult};
use tracing::Instrument;
use uuid::Uuid;

pub use approval::{Approvals, Decision};
pub(crate) use cancel::Cancels;
pub use cancel::{CANCEL_WAIT, CancelledCalls, CancelledInvocation};
pub(crate) use commit::closed;
pub(crate) use inflight::Inflight;

use crate::{Engine, EngineError, Result};
use cancel::BatchControl;
use envelope::{Plan, check_envelope};

/// A batch as the API hands it over: its envelope checked once, where it is made
/// ([`CallBatch::new`]: batch size, call ids, tool names), never again on its way down.
#[derive(Debug, Clone)]
pub struct CallBatch {
    calls: Vec<Call>,
    /// Set by a verify replay for its re-run of the recorded invocation it names: the batch's
    /// web calls are served that invocation's recorded observations (never the network).
    replay_of: Option<Uuid>,
}

impl CallBatch {
    /// A client's batch, if its envelope passes the checks that do not depend on the store
    /// (`max_calls`: `limits.max_calls_per_batch`).
    pub fn new(calls: Vec<Call>, max_calls: usize) -> Result<Self> {
        check_envelope(&calls, max_calls)?;
        Ok(Self {
            calls,
            replay_of: None,
        })
    }

    /// A verify replay's re-run of the recorded invocation `of` (its call was recorded, so its
    /// envelope was checked when it first ran).
    pub(crate) fn replaying(call: Call, of: Uuid) -> Self {
        Self {
            calls: vec![call],
            replay_of: Some(of),
        }
    }
}

/// The session a batch runs in, as the request that carries it found it: its tenant and id
/// (parsed once, where the request came in) and this node's lease of it when routing the
/// request took it ([`Route::Here`]), so that the batch does not check the lease again.
///
/// [`Route::Here`]: crate::Route::Here
#[derive(Debug, Clone)]
pub struct SessionRef {
    pub tenant_id: Uuid,
    pub id: Uuid,
    lease: Option<crate::cluster::RoutedLease>,
}

impl SessionRef {
    pub fn new(tenant_id: Uuid, id: Uuid) -> Self {
        Self {
            tenant_id,
            id,
            lease: None,
        }
    }

    /// With the lease routing took for the request, if it took one.
    #[must_use]
    pub fn with_lease(mut self, lease: Option<crate::cluster::RoutedLease>) -> Self {
        self.lease = lease;
        self
    }
}

/// The span of one call run here, a child of its request's: named after its tool
/// (`call shell`), with the tool, session, tenant and call id; its status once it is recorded.
/// Its children are the tool's run (`tool`, with the sandbox's own `sandbox.*` spans) and the
/// store writes it waits for (`store.write`).
fn call_span(tenant_id: Uuid, session_id: Uuid, call: &Call) -> tracing::Span {
    tracing::info_span!(
        "call",
        otel.name = %format_args!("call {}", call.name),
        otel.status_code = tracing::field::Empty,
        tool = %call.name,
        session.id = %session_id,
        tenant.id = %tenant_id,
        call.id = %call.id,
        invocation.id = tracing::field::Empty,
        status = tracing::field::Empty,
    )
}

/// A call's recorded status on its span; a call that could not be recorded (an engine error,
/// answered as a 5xx or 503) is an error span.
fn record_outcome(span: &tracing::Span, r: &Result<CallResult>) {
    match r {
        Ok(r) => {
            span.record("status", r.status.as_str());
            span.record("invocation.id", tracing::field::display(r.invocation_id));
        }
        Err(e) => {
            span.record("status", "unrecorded");
            span.record("otel.status_code", "ERROR");
            tracing::warn!(parent: span, error = %e, "the call could not be run or recorded");
        }
    }
}

/// Running batches of calls on this node: a batch planned (validated, checked against the
/// session's policy and its recorded calls), its calls run in order (or waiting for approval),
/// each recorded with the workspace changes it made, and cancelled on request. Owns the calls
/// running here (a retry of one waits for it) and what a cancel stops.
pub struct Calls {
    /// Calls running on this node, by (session, call id): a retry of a running call waits here.
    inflight: Inflight,
    /// Batches and cancellable calls running on this node: what a cancel stops.
    cancels: Cancels,
}

impl Calls {
    pub(crate) fn new() -> Self {
        Self {
            inflight: Inflight::default(),
            cancels: Cancels::default(),
        }
    }

    /// Claims running `call_id` of `session` on this node (see [`Inflight::claim`]).
    fn claim(&self, session: Uuid, call_id: &str) -> Result<inflight::Claim> {
        self.inflight.claim(session, call_id)
    }

    /// Makes a batch one a cancel stops, while the registration lives.
    fn register_batch(&self, batch: Arc<BatchControl>) -> cancel::BatchRegistration {
        self.cancels.register_batch(batch)
    }

    /// Makes a call one a cancel of its invocation stops, while the registration lives.
    fn register_call(
        &self,
        invocation_id: Uuid,
        tenant_id: Uuid,
        token: tokio_util::sync::CancellationToken,
    ) -> cancel::CallRegistration {
        self.cancels.register_call(invocation_id, tenant_id, token)
    }
}

impl Calls {
    /// Runs a batch of calls for a session and returns one result per call, in request order.
    ///
    /// The batch runs in a task of its own: if this future is dropped (the client went away),
    /// no call is cut in half. The call running then finishes and is recorded, and the calls
    /// that had not started are recorded `cancelled` without running (see `cancel`).
    pub async fn run_calls(
        &self,
        engine: &Arc<Engine>,
        session: SessionRef,
        batch: CallBatch,
    ) -> Result<Vec<CallResult>> {
        let (tenant_id, session_id) = (session.tenant_id, session.id);
        if batch.replay_of.is_none() && engine.history.replay_running(session_id) {
            return Err(EngineError::Conflict {
                code: toolexec_core::ProblemCode::ReplayRunning,
                detail: format!(
                    "session {session_id} is a replay's, and the replay is still re-running its calls; nothing else may run in it until the replay ends (see GET /v1/replays/{{id}}). Nothing ran."
                ),
            });
        }
        let control = Arc::new(
            BatchControl::new(tenant_id, session_id, batch.calls.len()).replaying(batch.replay_of),
        );
        let registration = self.cancels.register_batch(control.clone());
        // Cancelled when this future is dropped before the batch is done: what has not started
        // then must not start.
        let client = control.client_gone().clone().drop_guard();
        let task_engine = engine.clone();
        // In the request's span: the calls' spans are its children, in the logs and traces.
        let mut task = tokio::spawn(
            async move {
                let _registration = registration;
                task_engine
                    .calls
                    .run_batch(&task_engine, &session, &batch.calls, &control)
                    .await
            }
            .in_current_span(),
        );
        let waited = std::time::Duration::from_millis(engine.config.limits.request_timeout_ms);
        match tokio::time::timeout(waited, &mut task).await {
            Ok(done) => {
                done.map_err(|e| EngineError::Internal(format!("the batch's task failed: {e}")))?
            }
            Err(_) => {
                // The request stops waiting, the batch does not: its calls run and are recorded
                // as if the client were still there, for the retry to collect.
                client.disarm();
                Err(EngineError::StillRunning(format!(
                    "this batch has run longer than the service's request limit of {} s and goes on; send the same calls again (same ids) to get their results as they are recorded — none runs twice",
                    waited.as_secs()
                )))
            }
        }
    }

    async fn run_batch(
        &self,
        engine: &Engine,
        session_ref: &SessionRef,
        calls: &[Call],
        control: &BatchControl,
    ) -> Result<Vec<CallResult>> {
        let planned = self.plan_batch(engine, session_ref, calls).await?;
        let (session, rt, plans, hashes) = (
            &planned.session,
            &planned.runtime,
            &planned.plans,
            &planned.hashes,
        );
        control.planned(plans.iter().map(|p| matches!(p, Plan::Run(_))).collect());
        let mut results: Vec<Option<CallResult>> = vec![None; calls.len()];
        let mut i = 0;
        while i < calls.len() {
            // A run of calls that do not mutate goes together; a mutating call goes alone.
            let mut j = i + 1;
            if !plans[i].is_mutating() {
                while j < calls.len() && !plans[j].is_mutating() {
                    j += 1;
                }
            }
            let group = (i..j).filter(|k| !matches!(plans[*k], Plan::Alias(_)));
            let futures = group.map(|k| async move {
                let r = match &plans[k] {
                    // Nobody waits for the answer any more: a retry's record need not be
                    // waited for (the calls after it are what must be recorded).
                    Plan::Recorded(inv) => tokio::select! {
                        r = self.recorded_result(engine, session.tenant_id, inv) => r.map(Some),
                        () = control.client_gone().cancelled() => Ok(None),
                    },
                    Plan::Run(tool) => match rt {
                        Some(rt) => {
                            let span = call_span(session.tenant_id, session.id, &calls[k]);
                            let r = self
                                .run_one(
                                    engine,
                                    session,
                                    rt,
                                    &calls[k],
                                    tool.as_ref(),
                                    &hashes[k],
                                    control,
                                )
                                .instrument(span.clone())
                                .await;
                            record_outcome(&span, &r);
                            r.map(Some)
                        }
                        None => Err(EngineError::Internal("no runtime".into())),
                    },
                    Plan::Alias(_) => Err(EngineError::Internal("alias scheduled".into())),
                };
                (k, r)
            });
            for (k, r) in join_all(futures).await {
                let r = r?;
                if let (Some(r), Plan::Run(_)) = (&r, &plans[k]) {
                    control.ended(k, r);
                }
                results[k] = r;
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
            .map(|r| {
                r.ok_or_else(|| {
                    EngineError::Unavailable("the client went away before the batch ended".into())
                })
            })
            .collect()
    }
}
