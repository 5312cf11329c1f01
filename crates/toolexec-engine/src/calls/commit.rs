//! Committing a call's record: in one write for a call that ran here before anything was
//! recorded (`Write::Record`), or as the finish of a call whose start is already durable
//! (`Write::Finish`), which must land whatever it takes — retried through store outages, and
//! replaced by a failed call when the store refuses it — while the client waits a bounded time.
use std::time::Duration;

use toolexec_core::ProblemCode;
use toolexec_core::{Call, CallResult};
use toolexec_store::{Assigned, CallKey, NewInvocation, Outcome, Write, WriteError};
use tracing::Instrument;
use uuid::Uuid;

use super::Calls;
use super::inflight::InflightGuard;
use super::outcome::Recorded;
use crate::metrics::Metrics;
use crate::runtimes::SessionRuntime;
use crate::storable;
use crate::{Engine, EngineError, Result};

/// How long a request waits for a finish record after its first attempt failed (store blip)
/// before answering 503; the write keeps being retried in the background. A first attempt that
/// is merely slow (a big change set going to the store) is waited for in full.
const FINISH_GRACE: Duration = Duration::from_secs(10);

impl Calls {
    /// Records a call that started and finished here in one write.
    pub(super) async fn commit_record(
        &self,
        engine: &Engine,
        guard: InflightGuard,
        rt: &SessionRuntime,
        call: &Call,
        invocation: NewInvocation,
        mut rec: Recorded,
    ) -> Result<CallResult> {
        let session_id = invocation.session_id;
        let key = key_of(&invocation);
        self.blob_budget(engine, &mut rec);
        let write = Write::Record {
            invocation,
            outcome: rec.outcome,
            side_effects: rec.side_effects,
            blobs: rec.blobs,
        };
        let (mut recorded, mut back) = engine.recorder.write_back(write).await;
        let mut result = rec.result;
        // A write the store cannot hold is recorded as a failed call instead (nothing to retry).
        if let (Ok(Err(WriteError::Refused(reason))), Some(original)) = (&recorded, back.take()) {
            tracing::error!(%reason, call_id = %call.id, "the store refused a call's record; recording it as failed");
            for (fallback, outcome) in storable::fallbacks(&original, reason) {
                recorded = engine.recorder.write(fallback).await;
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
                Ok(finish(&engine.metrics, guard, result, a))
            }
            Ok(Err(WriteError::DuplicateCall(other))) => {
                drop(guard);
                self.adopt_recorded(engine, rt, call, &key.arguments_sha256, other)
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
    pub(super) async fn commit_finish(
        &self,
        engine: &Engine,
        guard: InflightGuard,
        session_id: Uuid,
        invocation_id: Uuid,
        mut rec: Recorded,
    ) -> Result<CallResult> {
        self.blob_budget(engine, &mut rec);
        let write = Write::Finish {
            session_id,
            invocation_id,
            outcome: rec.outcome,
            side_effects: rec.side_effects,
            blobs: rec.blobs,
        };
        let recorder = engine.recorder.clone();
        let metrics = engine.metrics.clone();
        let result = rec.result;
        let (done_tx, mut done_rx) = tokio::sync::oneshot::channel();
        let (failed_tx, failed_rx) = tokio::sync::oneshot::channel();
        // Its own task: the record must land even if the client goes away meanwhile. In the
        // call's span, so that its store writes show as the call's.
        tokio::spawn(
            async move {
                if let Some((result, a)) =
                    record_finish(&recorder, write, result, invocation_id, failed_tx).await
                {
                    let _ = done_tx.send(finish(&metrics, guard, result, a));
                }
            }
            .in_current_span(),
        );
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
    fn blob_budget(&self, engine: &Engine, rec: &mut Recorded) {
        let max = engine.config.limits.max_blob_bytes_per_call;
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
    result.structured = None;
    result
}

pub(super) fn finish(
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

pub(super) fn key_of(inv: &NewInvocation) -> CallKey {
    CallKey {
        call_id: inv.call_id.clone(),
        name: inv.name.clone(),
        arguments_sha256: inv.arguments_sha256.clone(),
        invocation_id: inv.id,
    }
}

pub(crate) fn closed(session_id: Uuid) -> EngineError {
    EngineError::Conflict {
        code: ProblemCode::SessionClosed,
        detail: format!("session {session_id} is closed"),
    }
}
