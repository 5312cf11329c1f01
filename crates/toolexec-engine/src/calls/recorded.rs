//! Calls whose id is already recorded: a retry returns the record, waiting while the call is
//! still running — here (its in-flight slot) or on another instance (polling the store).
use std::time::{Duration, Instant};

use toolexec_core::{Call, CallResult, Invocation};
use toolexec_store::CallKey;
use uuid::Uuid;

use super::Calls;
use super::envelope::reused;
use super::inflight::{FOREIGN_WAIT, wait_slot};
use crate::runtimes::SessionRuntime;
use crate::{Engine, EngineError, Result};

impl Calls {
    /// The result of an invocation that is already recorded, waiting if it is still running.
    pub(super) async fn recorded_result(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        inv: &Invocation,
    ) -> Result<CallResult> {
        if let Some(r) = self.answer_from_record(engine, tenant_id, inv).await? {
            return Ok(r);
        }
        if let Some(rx) = self.inflight.peek(inv.session_id, &inv.call_id) {
            return wait_slot(rx).await;
        }
        self.poll_until_finished(engine, tenant_id, inv.id).await
    }

    /// A call found recorded only when writing it (another task or instance recorded the id
    /// first): the same call waits for that record; another call under the same id is a conflict.
    pub(super) async fn adopt_recorded(
        &self,
        engine: &Engine,
        rt: &SessionRuntime,
        call: &Call,
        args_hash: &str,
        other: Uuid,
    ) -> Result<CallResult> {
        // Its status and result only: the side effects are not needed here.
        let inv = engine
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
        match self
            .answer_from_record(engine, rt.session.tenant_id, &inv)
            .await?
        {
            Some(r) => Ok(r),
            None => {
                self.poll_until_finished(engine, rt.session.tenant_id, other)
                    .await
            }
        }
    }

    /// The result a finished invocation gave, as [`result_of`], with the tool's structured
    /// result read back from its `invocation.finished` event: a retry renders exactly what the
    /// first answer did (`shell_call_output`'s streams, not a split of the text).
    async fn answer_from_record(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        inv: &Invocation,
    ) -> Result<Option<CallResult>> {
        let Some(mut r) = result_of(inv) else {
            return Ok(None);
        };
        if let Some(seq) = inv.finished_seq {
            let finished = engine
                .store
                .events(tenant_id, inv.session_id, seq - 1, 1)
                .await?;
            r.structured = finished
                .into_iter()
                .find(|e| e.seq == seq)
                .and_then(|e| e.data.get("structured").cloned());
        }
        Ok(Some(r))
    }

    /// Waits for an invocation that another instance runs (or ran) to finish.
    pub(super) async fn poll_until_finished(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<CallResult> {
        let deadline = Instant::now() + FOREIGN_WAIT;
        let mut delay = Duration::from_millis(20);
        loop {
            let inv = engine.store.invocation_page(tenant_id, id, 0, 0).await?;
            if let Some(r) = self.answer_from_record(engine, tenant_id, &inv).await? {
                return Ok(r);
            }
            // Waiting for a node that is gone would wait the whole FOREIGN_WAIT: this node takes
            // its session over instead, which records the call interrupted.
            if delay >= Duration::from_secs(1) {
                engine
                    .cluster
                    .take_over_if_orphaned(engine, tenant_id, inv.session_id)
                    .await?;
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
}

/// The result a finished invocation gave (`None` while it runs); a call waiting for approval
/// answers that it waits.
pub(super) fn result_of(inv: &Invocation) -> Option<CallResult> {
    if inv.status == toolexec_core::InvocationStatus::PendingApproval {
        return Some(super::approval::pending_result(inv));
    }
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
        structured: None,
    })
}
