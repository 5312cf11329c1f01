//! The names of the bash sessions this node serves, per toolexec session: name → terminal.
//!
//! Kept by the node (the terminals live in the session's runtime on the node that serves it,
//! and end with it: a name whose terminal ended is a session that does not exist). Bounded two
//! ways: at most [`MAX_SHELLS`] names per toolexec session (refused past it), and at most
//! [`MAX_TRACKED_SESSIONS`] toolexec sessions; past that the names of the session used least
//! recently are dropped (its terminals are not touched: they end with their session or at its
//! idle timeout, and its client is told its bash session does not exist). A session's names
//! also go when it is closed through this node (`DELETE /v1/sessions/{id}`).
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};

use uuid::Uuid;

/// Most named bash sessions one toolexec session may have (its terminals are capped too).
pub(super) const MAX_SHELLS: usize = 64;

/// Most toolexec sessions whose names one node keeps.
pub(super) const MAX_TRACKED_SESSIONS: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Shell {
    pub terminal: u64,
    /// The key of the request that created it (a repeat of that request is answered, not
    /// refused as a session that exists).
    pub created_by: String,
}

#[derive(Debug, Default)]
struct Names {
    sessions: HashMap<Uuid, Tracked>,
    /// Bumped at every use, to find the least recently used session.
    clock: u64,
}

#[derive(Debug, Default)]
struct Tracked {
    shells: HashMap<String, Shell>,
    used: u64,
}

impl Names {
    fn touch(&mut self, session: Uuid) -> Option<&mut Tracked> {
        self.clock += 1;
        let now = self.clock;
        let tracked = self.sessions.get_mut(&session)?;
        tracked.used = now;
        Some(tracked)
    }

    fn insert(&mut self, session: Uuid, name: String, shell: Shell, cap: usize) {
        if !self.sessions.contains_key(&session) && self.sessions.len() >= cap {
            let oldest = self
                .sessions
                .iter()
                .min_by_key(|(_, t)| t.used)
                .map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                self.sessions.remove(&oldest);
            }
        }
        self.clock += 1;
        let now = self.clock;
        let tracked = self.sessions.entry(session).or_default();
        tracked.used = now;
        tracked.shells.insert(name, shell);
    }

    fn remove(&mut self, session: Uuid, name: &str) {
        if let Some(t) = self.sessions.get_mut(&session) {
            t.shells.remove(name);
            if t.shells.is_empty() {
                self.sessions.remove(&session);
            }
        }
    }
}

static NAMES: LazyLock<Mutex<Names>> = LazyLock::new(|| Mutex::new(Names::default()));

fn names() -> MutexGuard<'static, Names> {
    // The map stays consistent whatever panicked while holding it: each change is one step.
    NAMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The bash session `name` of `session`, if this node knows it.
pub(super) fn shell(session: Uuid, name: &str) -> Option<Shell> {
    names()
        .touch(session)
        .and_then(|t| t.shells.get(name).cloned())
}

/// The names of `session`'s bash sessions.
pub(super) fn all(session: Uuid) -> Vec<String> {
    names()
        .touch(session)
        .map(|t| t.shells.keys().cloned().collect())
        .unwrap_or_default()
}

pub(super) fn insert(session: Uuid, name: String, shell: Shell) {
    names().insert(session, name, shell, MAX_TRACKED_SESSIONS);
}

pub(super) fn forget(session: Uuid, name: &str) {
    names().remove(session, name);
}

/// Drops every name of `session` (it was closed).
pub(crate) fn forget_session(session: Uuid) {
    names().sessions.remove(&session);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(n: u64) -> Shell {
        Shell {
            terminal: n,
            created_by: format!("k{n}"),
        }
    }

    #[test]
    fn past_the_cap_the_least_recently_used_session_is_dropped() {
        let mut m = Names::default();
        let ids: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
        m.insert(ids[0], "a".into(), shell(1), 2);
        m.insert(ids[1], "b".into(), shell(2), 2);
        // ids[0] used again: ids[1] is now the least recently used.
        assert!(m.touch(ids[0]).is_some());
        m.insert(ids[2], "c".into(), shell(3), 2);
        assert_eq!(m.sessions.len(), 2);
        assert!(m.sessions.contains_key(&ids[0]));
        assert!(!m.sessions.contains_key(&ids[1]));
        assert_eq!(m.sessions[&ids[2]].shells["c"], shell(3));
        // A session already tracked never evicts another.
        m.insert(ids[2], "d".into(), shell(4), 2);
        assert_eq!(m.sessions.len(), 2);
    }

    #[test]
    fn a_session_goes_with_its_last_name() {
        let mut m = Names::default();
        let id = Uuid::new_v4();
        m.insert(id, "a".into(), shell(1), 8);
        m.insert(id, "b".into(), shell(2), 8);
        m.remove(id, "a");
        assert!(m.sessions.contains_key(&id));
        m.remove(id, "b");
        assert!(m.sessions.is_empty());
    }
}
