//! What the workspace scans of a node may cost, from the operator's `[limits]`: the budget of one
//! scan, and the node's share of the host's inotify instances and watches.
use std::sync::Arc;
use std::time::Duration;

use toolexec_workspace::scan::{InotifyPool, ScanBudget};

use crate::Limits;

/// Used when `/proc/sys/fs/inotify/max_user_instances` cannot be read: half the kernel's
/// default of 128.
const FALLBACK_INSTANCES: usize = 64;
/// Used when `/proc/sys/fs/inotify/max_user_watches` cannot be read: half the kernel's smallest
/// default (8,192 before Linux 5.11).
const FALLBACK_WATCHES: usize = 4_096;

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
