//! What the workspace scans of a node may cost, from the operator's `[limits]`: the budget of one
//! scan, and the node's share of the host's inotify instances and watches.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use toolexec_workspace::scan::{InotifyPool, ScanBudget};

use crate::Limits;

/// Used when `/proc/sys/fs/inotify/max_user_instances` cannot be read: half the kernel's
/// default of 128.
const FALLBACK_INSTANCES: usize = 64;
/// Used when `/proc/sys/fs/inotify/max_user_watches` cannot be read: half the kernel's smallest
/// default (8,192 before Linux 5.11).
const FALLBACK_WATCHES: usize = 4_096;

/// The node's budget of retained scan contents (`limits.node_content_budget_bytes`): every scan
/// takes its share before it runs and gives back what it did not keep at once, the rest when
/// the call's record is committed (the lease is dropped).
#[derive(Debug)]
pub(crate) struct ContentPool {
    available: AtomicU64,
}

impl ContentPool {
    pub(crate) fn new(bytes: u64) -> Arc<Self> {
        Arc::new(Self {
            available: AtomicU64::new(bytes),
        })
    }

    /// Up to `wanted` bytes of what is left (possibly none), without waiting.
    pub(crate) fn take(self: &Arc<Self>, wanted: u64) -> ContentLease {
        let mut granted = 0;
        let _ = self
            .available
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                granted = left.min(wanted);
                Some(left - granted)
            });
        ContentLease {
            pool: self.clone(),
            bytes: granted,
        }
    }

    #[cfg(test)]
    pub(crate) fn available(&self) -> u64 {
        self.available.load(Ordering::Acquire)
    }
}

/// Bytes of the node's content budget held by one call; given back when dropped.
#[derive(Debug)]
pub(crate) struct ContentLease {
    pool: Arc<ContentPool>,
    bytes: u64,
}

impl ContentLease {
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Gives back all but `kept` bytes now.
    pub(crate) fn keep(&mut self, kept: u64) {
        let back = self.bytes.saturating_sub(kept);
        self.bytes -= back;
        self.pool.available.fetch_add(back, Ordering::AcqRel);
    }
}

impl Drop for ContentLease {
    fn drop(&mut self) {
        self.pool.available.fetch_add(self.bytes, Ordering::AcqRel);
    }
}

/// The budget of one scan (a rescan after a mutating call, or the baseline).
pub(crate) fn budget(limits: &Limits) -> ScanBudget {
    ScanBudget {
        keep_up_to: limits.max_blob_bytes,
        content_bytes: limits.scan_content_budget_bytes,
        hash_bytes: limits.scan_hash_budget_bytes,
        time: Duration::from_millis(limits.scan_time_budget_ms),
    }
}

/// The node's inotify pool: the configured caps, or half of the per-user kernel limits (which
/// every process of the service's user shares: the other half stays for them).
pub(crate) fn inotify_pool(limits: &Limits) -> Arc<InotifyPool> {
    let half_of = |name: &str, fallback: usize| {
        std::fs::read_to_string(format!("/proc/sys/fs/inotify/{name}"))
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .map_or(fallback, |limit| (limit / 2).max(1))
    };
    let instances = limits
        .max_inotify_instances
        .unwrap_or_else(|| half_of("max_user_instances", FALLBACK_INSTANCES));
    let watches = limits
        .max_inotify_watches
        .unwrap_or_else(|| half_of("max_user_watches", FALLBACK_WATCHES));
    tracing::debug!(instances, watches, "inotify caps for workspace scans");
    InotifyPool::new(instances, watches)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_share_the_node_budget_and_give_back_what_they_do_not_keep() {
        let pool = ContentPool::new(100);
        let mut a = pool.take(64);
        assert_eq!(a.bytes(), 64);
        let b = pool.take(64);
        assert_eq!(b.bytes(), 36, "what is left");
        assert_eq!(pool.take(64).bytes(), 0);
        a.keep(10);
        assert_eq!(pool.available(), 54);
        drop(b);
        drop(a);
        assert_eq!(pool.available(), 100);
    }
}
