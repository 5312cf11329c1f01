//! Stopping what runs: the batches and the running calls of this node, so that a client can
//! cancel one call (`POST /v1/invocations/{id}/cancel`) or every pending call of a session
//! (`POST /v1/sessions/{id}/cancel`), and so that a batch whose client went away knows it.
//!
//! A batch has two signals: `stop` (the client cancelled the session's pending calls: running
//! calls are stopped, queued ones never start) and `client_gone` (the request was dropped:
//! queued calls never start, a running call finishes and is recorded). Each call that runs gets a
//! child of `stop`, registered by invocation id while it runs, which a cancel of that one call
//! cancels. What a stopped call records is decided where it runs (`run`): a call stopped before
//! its tool started is recorded `cancelled` with "nothing ran"; a running one ends the way its
//! tool stops (a command killed with its output so far, a tool abandoned unless its change had
//! begun).
//!
//! This module only keeps the tables and the signals; it must not record anything itself.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use toolexec_core::ProblemCode;
use toolexec_core::{CallResult, Invocation};
use uuid::Uuid;

use super::Calls;
use super::inflight::wait_slot;
use crate::{Engine, EngineError, Result};

/// How long a cancel request waits for what it stopped to end and be recorded. A command dies
/// within a second; what can take longer is a change that had begun (it is finished, not cut)
/// or a finish record waiting for the store: the answer then says the call is still ending.
pub const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// Why a call did not start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// `POST /v1/sessions/{id}/cancel`.
    Session,
    /// `POST /v1/invocations/{id}/cancel`, before its tool started.
    Invocation,
    /// The request that sent the batch went away before the call's turn.
    ClientGone,
}

impl Stop {
    /// What the model reads for a call that never started.
    pub(super) fn not_started(self) -> String {
        let why = match self {
            Stop::Session => "the client cancelled this session's pending calls",
            Stop::Invocation => "the client cancelled this call",
            Stop::ClientGone => {
                "the client that sent this batch disconnected before this call's turn came"
            }
        };
        format!(
            "Cancelled before it started: {why}. Nothing ran. Call the tool again, with a new call id, if it is still needed."
        )
    }
}

/// One batch of calls being run on this node.
pub(crate) struct BatchControl {
    tenant_id: Uuid,
    session_id: Uuid,
    /// Cancelled by a session-level cancel; every running call's token is a child of it.
    stop: CancellationToken,
    /// Cancelled when the request that sent the batch goes away.
    client_gone: CancellationToken,
    state: Mutex<BatchState>,
    done: watch::Sender<bool>,
    /// The recorded invocation a verify replay re-runs with this batch (`CallBatch::replay_of`).
    replay_of: Option<Uuid>,
}

/// Which calls of a batch this node runs and how they ended, for the report of a cancel.
struct BatchState {
    /// Per call: does the batch run it (`false` for retries answered from the record and ids
    /// repeated within the batch)? `None` until the batch is planned.
    runs: Option<Vec<bool>>,
    ended: Vec<bool>,
    /// Kept only for calls that end after a cancel (the only ones a report shows), so that a
    /// batch nobody cancels holds no second copy of its outputs.
    results: Vec<Option<CallResult>>,
}

impl BatchControl {
    pub(super) fn new(tenant_id: Uuid, session_id: Uuid, calls: usize) -> Self {
        Self {
            tenant_id,
            session_id,
            stop: CancellationToken::new(),
            client_gone: CancellationToken::new(),
            state: Mutex::new(BatchState {
                runs: None,
                ended: vec![false; calls],
                results: vec![None; calls],
            }),
            done: watch::Sender::new(false),
            replay_of: None,
        }
    }

    /// The batch as a replay's re-run of `recorded`.
    pub(super) fn replaying(mut self, recorded: Option<Uuid>) -> Self {
        self.replay_of = recorded;
        self
    }

    /// See [`Self::replaying`].
    pub(super) fn replay_of(&self) -> Option<Uuid> {
        self.replay_of
    }

    /// Why a call of this batch that has not started must not start, if it must not.
    pub(super) fn stopped(&self) -> Option<Stop> {
        if self.stop.is_cancelled() {
            Some(Stop::Session)
        } else if self.client_gone.is_cancelled() {
            Some(Stop::ClientGone)
        } else {
            None
        }
    }

    /// Whether the session's pending calls were cancelled (not only one call, nor the client
    /// gone).
    pub(super) fn session_cancelled(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Resolves once a call of this batch that has not started must not start.
    pub(super) async fn stopping(&self) {
        tokio::select! {
            () = self.stop.cancelled() => {}
            () = self.client_gone.cancelled() => {}
        }
    }

    pub(super) fn client_gone(&self) -> &CancellationToken {
        &self.client_gone
    }

    /// A token for one call of the batch: cancelled with the batch, or on its own.
    pub(super) fn call_token(&self) -> CancellationToken {
        self.stop.child_token()
    }

    pub(super) fn planned(&self, runs: Vec<bool>) {
        if let Ok(mut s) = self.state.lock() {
            s.runs = Some(runs);
        }
    }

    pub(super) fn ended(&self, k: usize, result: &CallResult) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        if let Some(ended) = s.ended.get_mut(k) {
            *ended = true;
        }
        // Under the lock, like the cancel's snapshot: a call that ends after it is kept.
        if self.stop.is_cancelled()
            && let Some(slot) = s.results.get_mut(k)
        {
            *slot = Some(result.clone());
        }
    }

    /// Stops the batch; the calls that had not ended then (their positions).
    fn cancel(&self) -> Vec<usize> {
        let Ok(s) = self.state.lock() else {
            self.stop.cancel();
            return Vec::new();
        };
        let pending = (0..s.ended.len())
            .filter(|k| !s.ended[*k])
            .filter(|k| s.runs.as_ref().is_none_or(|r| r[*k]))
            .collect();
        // Under the lock: every call that ends from here on keeps its result for the report.
        self.stop.cancel();
        pending
    }

    /// Waits until the batch has ended.
    async fn done(&self) {
        let mut rx = self.done.subscribe();
        // An error means the sender is gone, which also means the batch has ended.
        let _ = rx.wait_for(|d| *d).await;
    }

    /// Waits until the batch has ended (at most `limit`); whether it did.
    async fn wait_done(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.done()).await.is_ok()
    }

    /// The results of calls at `positions` that the batch ran, in order.
    fn results_at(&self, positions: &[usize]) -> Vec<CallResult> {
        let Ok(s) = self.state.lock() else {
            return Vec::new();
        };
        positions
            .iter()
            .filter(|k| s.runs.as_ref().is_some_and(|r| r[**k]))
            .filter_map(|k| s.results[*k].clone())
            .collect()
    }
}

/// A call of this node whose invocation id is visible (its start is recorded, or about to be).
struct RunningCall {
    tenant_id: Uuid,
    cancel: CancellationToken,
}

/// The batches and running calls of this node.
#[derive(Default)]
pub(crate) struct Cancels {
    batches: Arc<Mutex<HashMap<Uuid, Vec<Arc<BatchControl>>>>>,
    calls: Arc<Mutex<HashMap<Uuid, RunningCall>>>,
}

/// Held by the task that runs a batch: dropping it unregisters the batch and tells whoever
/// waits for its end.
pub(super) struct BatchRegistration {
    batch: Arc<BatchControl>,
    batches: Arc<Mutex<HashMap<Uuid, Vec<Arc<BatchControl>>>>>,
}

impl Drop for BatchRegistration {
    fn drop(&mut self) {
        if let Ok(mut m) = self.batches.lock()
            && let Some(list) = m.get_mut(&self.batch.session_id)
        {
            list.retain(|b| !Arc::ptr_eq(b, &self.batch));
            if list.is_empty() {
                m.remove(&self.batch.session_id);
            }
        }
        self.batch.done.send_replace(true);
    }
}

/// Held while a call with a visible invocation id runs: dropping it unregisters the call.
pub(super) struct CallRegistration {
    invocation_id: Uuid,
    calls: Arc<Mutex<HashMap<Uuid, RunningCall>>>,
}

impl Drop for CallRegistration {
    fn drop(&mut self) {
        if let Ok(mut m) = self.calls.lock() {
            m.remove(&self.invocation_id);
        }
    }
}

impl Cancels {
    pub(super) fn register_batch(&self, batch: Arc<BatchControl>) -> BatchRegistration {
        if let Ok(mut m) = self.batches.lock() {
            m.entry(batch.session_id).or_default().push(batch.clone());
        }
        BatchRegistration {
            batch,
            batches: self.batches.clone(),
        }
    }

    /// Registers a call under its invocation id before its start is recorded, so that a cancel
    /// that sees the start always finds the call.
    pub(super) fn register_call(
        &self,
        invocation_id: Uuid,
        tenant_id: Uuid,
        cancel: CancellationToken,
    ) -> CallRegistration {
        if let Ok(mut m) = self.calls.lock() {
            m.insert(invocation_id, RunningCall { tenant_id, cancel });
        }
        CallRegistration {
            invocation_id,
            calls: self.calls.clone(),
        }
    }

    /// Cancels a call running here; `false` if this node does not run it.
    fn cancel_call(&self, tenant_id: Uuid, invocation_id: Uuid) -> bool {
        let Ok(m) = self.calls.lock() else {
            return false;
        };
        match m.get(&invocation_id) {
            Some(c) if c.tenant_id == tenant_id => {
                c.cancel.cancel();
                true
            }
            _ => false,
        }
    }

    fn all_batches(&self) -> Vec<Arc<BatchControl>> {
        self.batches
            .lock()
            .map(|m| m.values().flatten().cloned().collect())
            .unwrap_or_default()
    }

    fn batches_of(&self, tenant_id: Uuid, session_id: Uuid) -> Vec<Arc<BatchControl>> {
        self.batches
            .lock()
            .ok()
            .and_then(|m| m.get(&session_id).cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|b| b.tenant_id == tenant_id)
            .collect()
    }
}

/// What a cancel of one invocation found.
#[derive(Debug)]
pub struct CancelledInvocation {
    /// The invocation as recorded after the cancel (with its first page of side effects).
    pub invocation: Invocation,
    /// `false` when it had not ended within [`CANCEL_WAIT`]: a change under way is finished
    /// rather than cut, or its record waits for the store. It ends without another request.
    pub ended: bool,
}

/// What a cancel of a session's pending calls found.
#[derive(Debug)]
pub struct CancelledCalls {
    /// The calls that had not ended when the cancel came, as they ended, batch by batch in
    /// request order: `cancelled`, or the real result of a change that was under way.
    pub results: Vec<CallResult>,
    /// `false` when some batch had not ended within [`CANCEL_WAIT`] (its results are missing
    /// here; the batch's own response and the log have them).
    pub ended: bool,
}

impl Calls {
    /// Cancels one invocation of this tenant. A finished one is returned as it is (a cancel
    /// changes nothing then, so repeating it is harmless); a running one is stopped and returned
    /// once recorded. Errors: not found (also another tenant's), or running on another node.
    pub async fn cancel_invocation(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<CancelledInvocation> {
        let inv = engine.store.invocation_page(tenant_id, id, 0, 0).await?;
        if inv.status == toolexec_core::InvocationStatus::PendingApproval {
            // A call that waits for a person: cancelled, it will never run, so it is denied.
            engine
                .approvals
                .cancel_waiting(engine, tenant_id, &inv)
                .await?;
        } else if inv.status.finished().is_none() {
            let here = self.cancels.cancel_call(tenant_id, id);
            // Not registered any more but still here: its record is being written.
            let slot = self.inflight.peek(inv.session_id, &inv.call_id);
            match (here, slot) {
                (_, Some(rx)) => {
                    // The result is read from the store below; an error here (the record
                    // could not be written yet) only means it is still ending.
                    let _ = tokio::time::timeout(CANCEL_WAIT, wait_slot(rx)).await;
                }
                (true, None) => {}
                (false, None) => {
                    return Err(EngineError::Conflict {
                        code: ProblemCode::NotRunningHere,
                        detail: format!(
                            "invocation {id} is running, but not on this node ('{}'): a call can only be stopped by the node that runs it, the one serving its session. Send POST /v1/sessions/{}/cancel, which a gateway routing by session id delivers to that node (it stops every pending call of the session)",
                            engine.config.node, inv.session_id
                        ),
                    });
                }
            }
        }
        let invocation = engine.streams.invocation(tenant_id, id, None, None).await?;
        let ended = invocation.status.finished().is_some();
        Ok(CancelledInvocation { invocation, ended })
    }

    /// Waits until no batch runs on this node. A batch outlives the request that sent it, so a
    /// service shutting down waits here, after its last request, for batches whose clients went
    /// away: their running call is recorded as it ended, not left to be marked `interrupted`.
    pub async fn wait_for_batches(&self) {
        loop {
            let batches = self.cancels.all_batches();
            if batches.is_empty() {
                return;
            }
            for b in batches {
                b.done().await;
            }
        }
    }

    /// Cancels every pending call of a session on this node: running calls are stopped, queued
    /// ones never start; all are recorded. Returns what the stopped calls ended with. A session
    /// with nothing pending (or closed) gives an empty report. Error: not found.
    pub async fn cancel_session_calls(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        session_id: Uuid,
    ) -> Result<CancelledCalls> {
        // Tenancy first: another tenant's session is not found, whatever runs here.
        if engine
            .runtimes
            .cached_runtime(tenant_id, session_id)?
            .is_none()
        {
            engine.store.get_session(tenant_id, session_id).await?;
        }
        let batches = self.cancels.batches_of(tenant_id, session_id);
        let stopped: Vec<(Arc<BatchControl>, Vec<usize>)> = batches
            .into_iter()
            .map(|b| {
                let pending = b.cancel();
                (b, pending)
            })
            .collect();
        let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
        let mut results = Vec::new();
        let mut ended = true;
        for (batch, pending) in stopped {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            ended &= batch.wait_done(left).await;
            results.extend(batch.results_at(&pending));
        }
        Ok(CancelledCalls { results, ended })
    }
}
