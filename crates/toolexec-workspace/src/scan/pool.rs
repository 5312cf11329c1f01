//! The service's share of the host's inotify instances and watches.
//!
//! `fs.inotify.max_user_instances` (128 by default) and `fs.inotify.max_user_watches` are
//! per-user limits: the service runs as root, so every instance and watch it holds is one fewer
//! for every other root process of the host (systemd, container runtimes, editors). A pool counts
//! what the snapshots of one service hold and refuses beyond its caps; a snapshot refused an
//! instance or a watch works without inotify (its rescans walk the workspace).
//!
//! When every instance is taken, a new one may take the place of a watcher that has been idle
//! for [`FULL_WALK_INTERVAL`]: the pool closes it, and its snapshot's next rescan walks (it would
//! have walked anyway: that long after the last full walk, a rescan walks for
//! [`FullWalkReason::Periodic`](super::FullWalkReason::Periodic)). A watcher in use by a scan is
//! never closed.
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::fs::inotify::{self, CreateFlags};
use rustix::io::Errno;

use super::FULL_WALK_INTERVAL;

/// Counts and caps the inotify instances and watches of the snapshots that share it (one pool
/// per service). See the module docs.
#[derive(Debug)]
pub struct InotifyPool {
    max_instances: usize,
    max_watches: usize,
    /// How long a watcher must have been idle before its instance may go to another snapshot.
    reclaim_after: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    /// Watches charged to all open instances.
    watches: usize,
    open: HashMap<u64, Slot>,
}

#[derive(Debug)]
struct Slot {
    /// The instance. A scan holds a second reference while it runs: an instance with one
    /// reference (this one) is idle.
    fd: Arc<OwnedFd>,
    /// Watches charged to this instance.
    watches: usize,
    /// When a scan last started or ended with it.
    last_used: Instant,
}

/// Why no instance was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// The pool's cap: every instance is in use or was used recently.
    Full,
    /// The kernel refused (the per-user limit, or no inotify at all).
    Kernel(Errno),
}

/// One snapshot's instance in the pool. Dropping it closes the instance (unless the pool
/// closed it already) and returns its watches to the pool.
#[derive(Debug)]
pub(super) struct Lease {
    pool: Arc<InotifyPool>,
    id: u64,
}

impl InotifyPool {
    /// A pool of at most `max_instances` instances holding `max_watches` watches together.
    pub fn new(max_instances: usize, max_watches: usize) -> Arc<Self> {
        Arc::new(Self {
            max_instances,
            max_watches,
            reclaim_after: FULL_WALK_INTERVAL,
            state: Mutex::new(State::default()),
        })
    }

    /// No caps beyond the kernel's (a snapshot used on its own, as in tests and tools).
    pub fn unlimited() -> Arc<Self> {
        Self::new(usize::MAX, usize::MAX)
    }

    /// Tests: idle watchers may be closed for another snapshot after `after`.
    #[cfg(test)]
    pub(super) fn reclaiming_after(max_instances: usize, after: Duration) -> Arc<Self> {
        Arc::new(Self {
            max_instances,
            max_watches: usize::MAX,
            reclaim_after: after,
            state: Mutex::new(State::default()),
        })
    }

    /// Instances open now.
    pub fn instances(&self) -> usize {
        self.lock().open.len()
    }

    /// Watches held now (an upper bound: a watch the kernel removed with its directory counts
    /// until the scan that hears of it).
    pub fn watches(&self) -> usize {
        self.lock().watches
    }

    pub fn max_instances(&self) -> usize {
        self.max_instances
    }

    pub fn max_watches(&self) -> usize {
        self.max_watches
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is counters and descriptors, consistent after every statement that
        // changes it: a panic elsewhere while it was held leaves nothing half done.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens an instance, in use by the caller's scan (the returned descriptor), closing the
    /// least recently used idle one first if the pool is full.
    pub(super) fn open(self: &Arc<Self>) -> Result<(Lease, Arc<OwnedFd>), Refused> {
        let mut state = self.lock();
        if state.open.len() >= self.max_instances && !self.reclaim(&mut state) {
            return Err(Refused::Full);
        }
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
            .map(Arc::new)
            .map_err(Refused::Kernel)?;
        let id = state.next_id;
        state.next_id += 1;
        state.open.insert(
            id,
            Slot {
                fd: fd.clone(),
                watches: 0,
                last_used: Instant::now(),
            },
        );
        Ok((
            Lease {
                pool: self.clone(),
                id,
            },
            fd,
        ))
    }

    /// Closes the idle instance used longest ago, if one has been idle long enough.
    fn reclaim(&self, state: &mut State) -> bool {
        let victim = state
            .open
            .iter()
            .filter(|(_, slot)| {
                Arc::strong_count(&slot.fd) == 1 && slot.last_used.elapsed() >= self.reclaim_after
            })
            .min_by_key(|(_, slot)| slot.last_used)
            .map(|(id, _)| *id);
        let Some(slot) = victim.and_then(|id| state.open.remove(&id)) else {
            return false;
        };
        state.watches = state.watches.saturating_sub(slot.watches);
        tracing::debug!(
            watches = slot.watches,
            "closed an idle session's inotify instance for another session; its next scan walks its workspace"
        );
        // Dropping the last reference closes the instance and every watch of it.
        drop(slot);
        true
    }
}

impl Lease {
    /// The instance, for a scan that starts now; `None` when the pool closed it for another
    /// snapshot (the watches are gone: the scan must walk).
    pub(super) fn attach(&self) -> Option<Arc<OwnedFd>> {
        let mut state = self.pool.lock();
        let slot = state.open.get_mut(&self.id)?;
        slot.last_used = Instant::now();
        Some(slot.fd.clone())
    }

    /// [`Lease::attach`] for a caller that must not wait (an async worker): `None` also when
    /// another thread holds the pool — it may be closing an instance with many watches, which
    /// takes a while.
    pub(super) fn try_attach(&self) -> Option<Arc<OwnedFd>> {
        let mut state = match self.pool.state.try_lock() {
            Ok(state) => state,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let slot = state.open.get_mut(&self.id)?;
        slot.last_used = Instant::now();
        Some(slot.fd.clone())
    }

    /// Runs `f` while this thread holds the pool, as another thread closing an instance would.
    #[cfg(test)]
    pub(super) fn while_pool_busy<R>(&self, f: impl FnOnce() -> R) -> R {
        let _held = self.pool.lock();
        f()
    }

    /// After a scan: the instance holds `watches` watches now (the scan's own count, which
    /// also drops the watches the kernel removed with their directories).
    pub(super) fn detach(&self, watches: usize) {
        let mut state = self.pool.lock();
        let State {
            watches: total,
            open,
            ..
        } = &mut *state;
        if let Some(slot) = open.get_mut(&self.id) {
            *total = total.saturating_sub(slot.watches).saturating_add(watches);
            slot.watches = watches;
            slot.last_used = Instant::now();
        }
    }

    /// Charges one new watch of this instance; false at the pool's cap.
    pub(super) fn charge_watch(&self) -> bool {
        let mut state = self.pool.lock();
        if state.watches >= self.pool.max_watches {
            return false;
        }
        let Some(slot) = state.open.get_mut(&self.id) else {
            return false;
        };
        slot.watches += 1;
        state.watches += 1;
        true
    }

    /// Returns a watch charged but not added (the directory had its watch, or the kernel
    /// refused).
    pub(super) fn refund_watch(&self) {
        let mut state = self.pool.lock();
        if let Some(slot) = state.open.get_mut(&self.id)
            && slot.watches > 0
        {
            slot.watches -= 1;
            state.watches = state.watches.saturating_sub(1);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut state = self.pool.lock();
        if let Some(slot) = state.open.remove(&self.id) {
            state.watches = state.watches.saturating_sub(slot.watches);
        }
    }
}
