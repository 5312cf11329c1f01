//! The service's share of file descriptors: every open session it serves holds a few (its
//! workspace directory, its inotify instance, an egress socket), every connection one, and the
//! common default soft limit (1,024) is far below what a node with thousands of sessions needs.
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Descriptors one cached session holds at most: the workspace directory, the inotify instance
/// of its change scans, the egress proxy's listening socket, and its resident sandbox's (the
/// agent's socket, its pidfd, the spare's pidfd).
pub const FDS_PER_SESSION: u64 = 6;

/// Descriptors kept for everything else besides connections: the database pool, the SQLite
/// file, listeners, pipes of running commands, files the tools open while they run.
pub const RESERVED_FDS: u64 = 512;

/// The open-file limits after [`raise_open_files_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (what an unprivileged process may do
/// itself), so the service does not fail with "too many open files" at the common soft default
/// of 1,024 while the hard limit allows far more.
pub fn raise_open_files_limit() -> OpenFiles {
    let current = getrlimit(Resource::Nofile);
    let unlimited = u64::from(u32::MAX);
    let hard = current.maximum.unwrap_or(unlimited);
    let soft = current.current.unwrap_or(unlimited);
    if soft < hard {
        let raised = Rlimit {
            current: Some(hard),
            maximum: current.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => {
                tracing::info!(from = soft, to = hard, "raised the soft open-file limit");
                return OpenFiles { soft: hard, hard };
            }
            Err(e) => tracing::warn!(error = %e, soft, hard, "could not raise the open-file limit"),
        }
    }
    OpenFiles { soft, hard }
}

/// How many sessions' runtimes fit in `open_files` descriptors next to `connections` in-flight
/// requests and the reserve (at least 16, so that a tiny limit still serves a few sessions).
pub fn session_budget(open_files: u64, connections: usize) -> usize {
    let spare = open_files
        .saturating_sub(RESERVED_FDS)
        .saturating_sub(connections as u64);
    usize::try_from(spare / FDS_PER_SESSION)
        .unwrap_or(usize::MAX)
        .max(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_budget_leaves_room_for_connections_and_the_reserve() {
        assert_eq!(session_budget(1024, 1024), 16);
        assert_eq!(session_budget(20_000, 1024), 3_077);
        assert_eq!(session_budget(1 << 20, 1024), 174_506);
    }
}
