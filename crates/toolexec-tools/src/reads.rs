//! Read-before-write: which files this session has read, and what they held when it did.
//!
//! Writing or deleting an existing file is allowed only if the session read it and it has not
//! changed since (compared by SHA-256 of the contents). New files are always allowed.
use std::collections::HashMap;
use std::sync::Mutex;

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
}
