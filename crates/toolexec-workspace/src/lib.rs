//! A session's workspace, as its own room: everything that touches a workspace directory on the
//! host lives here, so that the engine does no filesystem work and the tools crate holds tools.
//!
//! - [`jail`]: every path a tool names is resolved by the kernel beneath a handle of the
//!   workspace (`openat2` with `RESOLVE_BENEATH`), reads and writes included;
//! - [`scan`]: what a process (a sandboxed command) changed in the workspace since the last scan;
//! - [`lifecycle`]: making a session's workspace, handing it to the sandbox user, removing it.
#![forbid(unsafe_code)]

pub mod disk;
pub mod history;
pub mod jail;
pub mod lifecycle;
mod restore;
pub mod scan;
pub mod sparse;

pub use jail::{JailError, Workspace};
pub use lifecycle::Workspaces;

use toolexec_core::FileChange;

/// One file change, with the new contents so that they can be stored as a blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedChange {
    pub change: FileChange,
    /// The contents after the change (`None` for deletions).
    pub after: Option<Vec<u8>>,
}
