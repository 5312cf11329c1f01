//! Read-before-write: which files this session has read, and what they held when it did.
//!
//! Writing or deleting an existing file is allowed only if the session read it and it has not
//! changed since (compared by SHA-256 of the contents). New files are always allowed.
//!
//! [`ReadTracker`] is the session's state on the node serving it; [`CallReads`] is one call's
//! view of it, which also keeps what the call read, in order, for its record in the log: a node
//! that builds the session's runtime again folds the state from there.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use toolexec_core::FileRead;

#[derive(Debug, Default)]
pub struct ReadTracker {
    seen: Mutex<HashMap<String, String>>,
}

/// Why a write to an existing file is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteCheck {
    Allowed,
    NeverRead,
    /// Read, but the file changed since; holds the hash seen at read time.
    Stale,
}

impl ReadTracker {
    /// Records that the session has seen `path` with contents hashing to `sha256`.
    pub fn record(&self, path: &str, sha256: &str) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.insert(path.to_owned(), sha256.to_owned());
        }
    }

    /// Checks a write to an existing file whose current contents hash to `current_sha256`.
    pub fn check(&self, path: &str, current_sha256: &str) -> WriteCheck {
        let Ok(seen) = self.seen.lock() else {
            return WriteCheck::NeverRead;
        };
        match seen.get(path) {
            None => WriteCheck::NeverRead,
            Some(h) if h == current_sha256 => WriteCheck::Allowed,
            Some(_) => WriteCheck::Stale,
        }
    }

    pub fn forget(&self, path: &str) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.remove(path);
        }
    }

    /// Replaces the whole state (path → SHA-256), as rebuilt from the log.
    pub fn replace(&self, seen: HashMap<String, String>) {
        if let Ok(mut now) = self.seen.lock() {
            *now = seen;
        }
    }

    /// How many files count as read.
    pub fn len(&self) -> usize {
        self.seen.lock().map_or(0, |s| s.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One call's view of the session's read-state: checks and records go to the session's
/// [`ReadTracker`] at once (a later call of the same batch sees them), and what the call
/// recorded or forgot is also kept, in order, for the `reads` of its `invocation.finished`.
#[derive(Debug, Clone)]
pub struct CallReads {
    session: Arc<ReadTracker>,
    call: Arc<Mutex<Vec<FileRead>>>,
}

impl CallReads {
    pub fn new(session: Arc<ReadTracker>) -> Self {
        Self {
            session,
            call: Arc::default(),
        }
    }

    /// Records that the session has seen `path` with contents hashing to `sha256`.
    pub fn record(&self, path: &str, sha256: &str) {
        self.session.record(path, sha256);
        self.keep(path, Some(sha256));
    }

    /// Checks a write to an existing file whose current contents hash to `current_sha256`.
    pub fn check(&self, path: &str, current_sha256: &str) -> WriteCheck {
        self.session.check(path, current_sha256)
    }

    /// The file is gone (the call deleted it): what was read of it no longer counts.
    pub fn forget(&self, path: &str) {
        self.session.forget(path);
        self.keep(path, None);
    }

    /// What this call read (or wrote, or deleted), in order; taken once, when its record is
    /// made.
    pub fn take(&self) -> Vec<FileRead> {
        self.call
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default()
    }

    /// The session's read-state.
    pub fn session(&self) -> &Arc<ReadTracker> {
        &self.session
    }

    fn keep(&self, path: &str, sha256: Option<&str>) {
        if let Ok(mut call) = self.call.lock() {
            call.push(FileRead {
                path: path.to_owned(),
                sha256: sha256.map(str::to_owned),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_needs_a_read_of_the_current_contents() {
        let t = ReadTracker::default();
        assert_eq!(t.check("a", "h1"), WriteCheck::NeverRead);
        t.record("a", "h1");
        assert_eq!(t.check("a", "h1"), WriteCheck::Allowed);
        assert_eq!(t.check("a", "h2"), WriteCheck::Stale);
    }

    #[test]
    fn a_call_keeps_what_it_read_and_deleted_in_order_for_its_record() {
        let session = Arc::new(ReadTracker::default());
        let call = CallReads::new(session.clone());
        call.record("a", "h1");
        call.forget("b");
        call.record("a", "h2");
        assert_eq!(session.check("a", "h2"), WriteCheck::Allowed);
        let read = |path: &str, sha: Option<&str>| FileRead {
            path: path.into(),
            sha256: sha.map(Into::into),
        };
        assert_eq!(
            call.take(),
            vec![
                read("a", Some("h1")),
                read("b", None),
                read("a", Some("h2"))
            ]
        );
        assert!(call.take().is_empty(), "taken once");
        // Another call of the session sees the state, not this call's list.
        let other = CallReads::new(session);
        assert_eq!(other.check("a", "h2"), WriteCheck::Allowed);
        assert!(other.take().is_empty());
    }
}
