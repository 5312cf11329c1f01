//! The names of the bash sessions this node serves, per toolexec session: name → terminal.
//!
//! Kept by the node (the terminals live in the session's runtime on the node that serves it,
//! and end with it: a name whose terminal ended is a session that does not exist). Bounded:
//! names of at most [`MAX_NAME_CHARS`] characters, at most [`MAX_SHELLS`] names per toolexec
//! session (refused past it), and at most [`MAX_TRACKED_SESSIONS`] toolexec sessions; past
//! that the names of a session are dropped — the least recently used session of the tenant
//! that has the most sessions tracked, so that one tenant opening sessions by the thousand
//! drops its own names, not another tenant's. A dropped session's terminals are not touched:
//! they end with their session or at its idle timeout, and its client is told its bash
//! session does not exist. A session's names also go when it is closed through this node
//! (`DELETE /v1/sessions/{id}`).
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};

use uuid::Uuid;

/// Most named bash sessions one toolexec session may have (its terminals are capped too).
pub(super) const MAX_SHELLS: usize = 64;

/// Longest name of a bash session, in characters.
pub(super) const MAX_NAME_CHARS: usize = 256;

/// Most toolexec sessions whose names one node keeps.
pub(super) const MAX_TRACKED_SESSIONS: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Shell {
    pub terminal: u64,
    /// The key of the request that created it (a repeat of that request is answered, not
    /// refused as a session that exists).
    pub created_by: String,
}

/// Why a name was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Refused {
    /// Another request made a bash session of that name (first, when two race).
    Exists,
    /// The toolexec session has [`MAX_SHELLS`] already.
    Full,
}

#[derive(Debug, Default)]
struct Names {
    sessions: HashMap<Uuid, Tracked>,
    /// Bumped at every use, to find the least recently used session.
    clock: u64,
}

#[derive(Debug, Default)]
struct Tracked {
    tenant: Uuid,
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

    /// Takes `name` for `shell` unless another request has it or the session is full — in one
    /// step, so that of two requests racing for a name exactly one gets it.
    fn insert(
        &mut self,
        tenant: Uuid,
        session: Uuid,
        name: String,
        shell: Shell,
        cap: usize,
    ) -> Result<(), Refused> {
        if let Some(t) = self.sessions.get(&session) {
            match t.shells.get(&name) {
                Some(s) if s.created_by != shell.created_by => return Err(Refused::Exists),
                Some(_) => {}
                None if t.shells.len() >= MAX_SHELLS => return Err(Refused::Full),
                None => {}
            }
        } else if self.sessions.len() >= cap {
            self.drop_one();
        }
        self.clock += 1;
        let now = self.clock;
        let tracked = self.sessions.entry(session).or_insert_with(|| Tracked {
            tenant,
            ..Tracked::default()
        });
        tracked.used = now;
        tracked.shells.insert(name, shell);
        Ok(())
    }

    /// Drops the least recently used session of the tenant with the most sessions tracked.
    fn drop_one(&mut self) {
        let mut per_tenant: HashMap<Uuid, usize> = HashMap::new();
        for t in self.sessions.values() {
            *per_tenant.entry(t.tenant).or_default() += 1;
        }
        let Some((&busiest, _)) = per_tenant.iter().max_by_key(|(_, n)| **n) else {
            return;
        };
        let oldest = self
            .sessions
            .iter()
            .filter(|(_, t)| t.tenant == busiest)
            .min_by_key(|(_, t)| t.used)
            .map(|(id, _)| *id);
        if let Some(oldest) = oldest {
            self.sessions.remove(&oldest);
        }
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

pub(super) fn insert(
    tenant: Uuid,
    session: Uuid,
    name: String,
    shell: Shell,
) -> Result<(), Refused> {
    names().insert(tenant, session, name, shell, MAX_TRACKED_SESSIONS)
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
        let tenant = Uuid::new_v4();
        let ids: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
        m.insert(tenant, ids[0], "a".into(), shell(1), 2).unwrap();
        m.insert(tenant, ids[1], "b".into(), shell(2), 2).unwrap();
        // ids[0] used again: ids[1] is now the least recently used.
        assert!(m.touch(ids[0]).is_some());
        m.insert(tenant, ids[2], "c".into(), shell(3), 2).unwrap();
        assert_eq!(m.sessions.len(), 2);
        assert!(m.sessions.contains_key(&ids[0]));
        assert!(!m.sessions.contains_key(&ids[1]));
        assert_eq!(m.sessions[&ids[2]].shells["c"], shell(3));
        // A session already tracked never evicts another.
        m.insert(tenant, ids[2], "d".into(), shell(4), 2).unwrap();
        assert_eq!(m.sessions.len(), 2);
    }

    /// A tenant that opens sessions by the thousand drops its own names, not another's.
    #[test]
    fn past_the_cap_the_busiest_tenant_loses_its_names_first() {
        let mut m = Names::default();
        let (quiet, busy) = (Uuid::new_v4(), Uuid::new_v4());
        let kept = Uuid::new_v4();
        m.insert(quiet, kept, "main".into(), shell(1), 4).unwrap();
        for n in 0..100 {
            m.insert(busy, Uuid::new_v4(), "x".into(), shell(n + 2), 4)
                .unwrap();
        }
        assert_eq!(m.sessions.len(), 4);
        assert_eq!(m.sessions[&kept].shells["main"], shell(1));
    }

    /// Of two requests racing for one name, one gets it; the same request again is answered;
    /// a full session refuses a new name.
    #[test]
    fn a_name_is_taken_once_and_a_session_holds_a_bounded_number() {
        let mut m = Names::default();
        let (tenant, id) = (Uuid::new_v4(), Uuid::new_v4());
        m.insert(tenant, id, "a".into(), shell(1), 8).unwrap();
        assert_eq!(
            m.insert(tenant, id, "a".into(), shell(2), 8),
            Err(Refused::Exists)
        );
        assert_eq!(m.insert(tenant, id, "a".into(), shell(1), 8), Ok(()));
        for n in 1..MAX_SHELLS {
            m.insert(tenant, id, format!("s{n}"), shell(n as u64 + 10), 8)
                .unwrap();
        }
        assert_eq!(
            m.insert(tenant, id, "one-more".into(), shell(99), 8),
            Err(Refused::Full)
        );
    }

    #[test]
    fn a_session_goes_with_its_last_name() {
        let mut m = Names::default();
        let (tenant, id) = (Uuid::new_v4(), Uuid::new_v4());
        m.insert(tenant, id, "a".into(), shell(1), 8).unwrap();
        m.insert(tenant, id, "b".into(), shell(2), 8).unwrap();
        m.remove(id, "a");
        assert!(m.sessions.contains_key(&id));
        m.remove(id, "b");
        assert!(m.sessions.is_empty());
    }
}
