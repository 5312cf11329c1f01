//! The calls running on this node, by (session, call id): a concurrent retry of a call waits for
//! its result here instead of running it again.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use toolexec_core::CallResult;
use uuid::Uuid;

use crate::{EngineError, Result};

/// How long a retry waits for a call that is still running (here or on another instance).
pub(super) const FOREIGN_WAIT: Duration = Duration::from_secs(900);

pub(super) type Slot = watch::Receiver<Option<CallResult>>;

#[derive(Default)]
pub(crate) struct Inflight {
    map: Arc<Mutex<HashMap<(Uuid, String), Slot>>>,
}

pub(super) enum Claim {
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
    pub(super) fn publish(&self, result: &CallResult) {
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
    /// The call is this task's to run, or another task runs it already (wait for its slot).
    pub(super) fn claim(&self, session: Uuid, call_id: &str) -> Result<Claim> {
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

    /// The slot of a call running here, if it is.
    pub(super) fn peek(&self, session: Uuid, call_id: &str) -> Option<Slot> {
        self.map
            .lock()
            .ok()?
            .get(&(session, call_id.to_owned()))
            .cloned()
    }
}

/// Waits for the result of the same call running here, as long as a call may run
/// ([`FOREIGN_WAIT`]): a retry never hangs, even while the store is down and the finish waits
/// for it.
pub(super) async fn wait_slot(mut rx: Slot) -> Result<CallResult> {
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
