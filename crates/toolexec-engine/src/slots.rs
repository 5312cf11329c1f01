//! Per-tenant caps on long-lived work a node does for a tenant (event streams, replays): a slot
//! is taken when the work starts and given back when its guard is dropped, so that one tenant
//! cannot hold every stream or replay a node can serve.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use toolexec_core::ProblemCode;
use uuid::Uuid;

use crate::{EngineError, Result};

pub(crate) struct TenantSlots {
    /// What the slots are for, as the error names it (`event streams`).
    what: &'static str,
    /// The operator's key, named in the error.
    key: &'static str,
    cap: usize,
    taken: Mutex<HashMap<Uuid, usize>>,
}

/// A slot in use; dropping it gives it back.
pub(crate) struct Slot {
    slots: Arc<TenantSlots>,
    tenant: Uuid,
}

impl TenantSlots {
    pub(crate) fn new(what: &'static str, key: &'static str, cap: usize) -> Arc<Self> {
        Arc::new(Self {
            what,
            key,
            cap,
            taken: Mutex::new(HashMap::new()),
        })
    }

    /// A slot of `tenant`, or 429 `too_many_concurrent` when it holds them all.
    pub(crate) fn take(self: &Arc<Self>, tenant: Uuid) -> Result<Slot> {
        let mut taken = self
            .taken
            .lock()
            .map_err(|_| EngineError::Internal("tenant slots poisoned".into()))?;
        let n = taken.entry(tenant).or_insert(0);
        if *n >= self.cap {
            return Err(EngineError::Conflict {
                code: ProblemCode::TooManyConcurrent,
                detail: format!(
                    "this tenant already has {} {} on this node, the most it may ({}); end one and retry",
                    self.cap, self.what, self.key
                ),
            });
        }
        *n += 1;
        Ok(Slot {
            slots: self.clone(),
            tenant,
        })
    }

    /// An admission for the commands of `tenant`'s sessions: each takes one of its slots while
    /// it runs, and is refused with a sentence for the model when they are all taken.
    pub(crate) fn admission(self: &Arc<Self>, tenant: Uuid) -> toolexec_sandbox::Admission {
        let slots = self.clone();
        Arc::new(move || {
            slots
                .take(tenant)
                .map(|slot| Box::new(slot) as Box<dyn std::any::Any + Send + Sync>)
                .map_err(|_| {
                    format!(
                        "Not started: this tenant's sessions already run {} commands on this \
                         node (foreground and background), the most the operator allows ({}). \
                         Wait for one to finish, or stop a background process you no longer need \
                         with process_kill, then run it again.",
                        slots.cap, slots.key
                    )
                })
        })
    }

    #[cfg(test)]
    fn held(&self, tenant: Uuid) -> usize {
        self.taken
            .lock()
            .map(|t| t.get(&tenant).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut taken) = self.slots.taken.lock()
            && let Some(n) = taken.get_mut(&self.tenant)
        {
            *n -= 1;
            if *n == 0 {
                taken.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_tenant_holds_at_most_its_cap_and_others_are_not_affected() {
        let slots = TenantSlots::new("event streams", "limits.max_streams_per_tenant", 2);
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let one = slots.take(a).unwrap();
        let _two = slots.take(a).unwrap();
        let err = slots.take(a).err().unwrap();
        assert!(
            matches!(&err, EngineError::Conflict { code: ProblemCode::TooManyConcurrent, detail } if detail.contains("limits.max_streams_per_tenant")),
            "{err:?}"
        );
        let _other = slots.take(b).unwrap();
        drop(one);
        assert_eq!(slots.held(a), 1);
        let _again = slots.take(a).unwrap();
        assert_eq!(slots.held(a), 2);
    }
}
