//! A tool call's wall-clock deadline (the operator's `limits.tool_timeout_ms`), shared by the
//! engine that enforces it and the tool code that checks it.
//!
//! Two ways a call ends at its deadline:
//!
//! - **The tool stops itself** (the normal case). Long loops — tree walks, the regex search
//!   inside a file, reading many files, near-match scans — poll [`Deadline::expired`] and return
//!   what they have with status `timed_out` and a note saying the result is partial. The
//!   blocking thread is then free: nothing keeps running once the call is answered.
//! - **The engine stops waiting**, [`STOP_GRACE`] after the deadline, for a tool stuck where it
//!   cannot look at the clock (a read on storage that hangs). The call is recorded `timed_out`
//!   without output, and the deadline is marked abandoned so that the tool, when it wakes up,
//!   stops at its next check and changes nothing.
//!
//! A change must never be left half made or made without a record, so tools that change the
//! workspace call [`Deadline::commit_change`] just before their first change: once it has
//! answered `true` the engine waits for the tool however long it takes (the change itself —
//! writing and renaming files already verified — is short); once the deadline has passed or was
//! abandoned it answers `false` and the tool changes nothing. What is interruptible is thus
//! everything before a tool's first change (reading, searching, verifying a patch), and what is
//! not is the change itself. Tools that record what the session has read (grep, read_file,
//! read_many_files) do it in their async part, after the blocking work has returned: the engine
//! drops a call it stops waiting for, so a result nobody sees never counts as read.
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// How long after its deadline the engine still waits for a tool to return what it has: the
/// checks in the walks and searches come every few milliseconds, so a tool that has not
/// answered by then is stuck where it cannot check.
pub const STOP_GRACE: Duration = Duration::from_secs(1);

const RUNNING: u8 = 0;
/// The tool is making its change or delivering its result: it must be waited for.
const COMMITTED: u8 = 1;
/// The engine gave up waiting: the tool must not change anything or record reads.
const ABANDONED: u8 = 2;

/// A call's deadline; cheap to clone (clones share the state). [`Deadline::none`] never
/// expires (tools run outside the service, commands with their own timeout).
#[derive(Debug, Clone, Default)]
pub struct Deadline {
    inner: Option<Arc<Inner>>,
}

#[derive(Debug)]
struct Inner {
    at: Instant,
    budget: Duration,
    state: AtomicU8,
}

impl Deadline {
    /// No deadline.
    pub fn none() -> Self {
        Self::default()
    }

    /// A deadline `budget` from now.
    pub fn after(budget: Duration) -> Self {
        Self {
            inner: Some(Arc::new(Inner {
                at: Instant::now() + budget,
                budget,
                state: AtomicU8::new(RUNNING),
            })),
        }
    }

    /// The time the call was given, if it has a deadline.
    pub fn budget(&self) -> Option<Duration> {
        self.inner.as_ref().map(|i| i.budget)
    }

    /// Time left before the deadline (zero once it has passed); `None` without a deadline.
    pub fn remaining(&self) -> Option<Duration> {
        self.inner
            .as_ref()
            .map(|i| i.at.saturating_duration_since(Instant::now()))
    }

    /// Whether the call should stop now: its time is up, or the engine stopped waiting for it.
    /// Cheap enough to call for every entry of a walk (one read of the monotonic clock).
    pub fn expired(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(|i| i.state.load(Ordering::Acquire) == ABANDONED || Instant::now() >= i.at)
    }

    /// Called by a tool just before its first change to the workspace: `true` means go ahead
    /// (the engine now waits for the tool to finish, whatever the time), `false` means the
    /// deadline has passed and nothing may be changed. Without a deadline, always `true`.
    pub fn commit_change(&self) -> bool {
        let Some(inner) = &self.inner else {
            return true;
        };
        if Instant::now() >= inner.at {
            // Past the deadline before anything changed: stop here, and make sure the engine
            // does not wait for a change that will not come.
            let _ = inner.state.compare_exchange(
                RUNNING,
                ABANDONED,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            return inner.state.load(Ordering::Acquire) == COMMITTED;
        }
        self.claim()
    }

    /// Marks the call as one the engine must wait for, unless the engine already stopped
    /// waiting (`false`).
    fn claim(&self) -> bool {
        let Some(inner) = &self.inner else {
            return true;
        };
        match inner
            .state
            .compare_exchange(RUNNING, COMMITTED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state == COMMITTED,
        }
    }

    /// Called by the engine when it stops waiting: `true` if the tool had not committed (it
    /// will now change and record nothing), `false` if it had (the engine must wait for it).
    pub fn abandon(&self) -> bool {
        let Some(inner) = &self.inner else {
            return false;
        };
        match inner
            .state
            .compare_exchange(RUNNING, ABANDONED, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(state) => state == ABANDONED,
        }
    }
}

/// `2.5 s`, `300 ms`: a time limit as the model is told it.
pub fn human_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_deadline_never_expires_and_always_commits() {
        let d = Deadline::none();
        assert!(!d.expired());
        assert!(d.commit_change());
        assert!(!d.abandon());
    }

    #[test]
    fn a_change_committed_in_time_cannot_be_abandoned() {
        let d = Deadline::after(Duration::from_secs(60));
        assert!(!d.expired());
        assert!(d.commit_change());
        assert!(!d.abandon(), "the engine must wait for a change under way");
        assert!(d.commit_change());
    }

    #[test]
    fn an_abandoned_call_changes_and_records_nothing() {
        let d = Deadline::after(Duration::from_secs(60));
        assert!(d.abandon());
        assert!(d.expired());
        assert!(!d.commit_change());
    }

    #[test]
    fn past_the_deadline_a_change_is_refused_and_not_waited_for() {
        let d = Deadline::after(Duration::ZERO);
        assert!(d.expired());
        assert!(!d.commit_change());
        // The refusal marked it abandoned: the engine does not wait for a change.
        assert!(d.abandon());
    }

    #[test]
    fn durations_read_as_a_person_would_write_them() {
        assert_eq!(human_duration(Duration::from_millis(300)), "300 ms");
        assert_eq!(human_duration(Duration::from_secs(60)), "60 s");
        assert_eq!(human_duration(Duration::from_millis(2500)), "2.5 s");
    }
}
