//! Where a node's workspaces live and who owns them: making a session's workspace (owned by the
//! sandbox user, so that sandboxed commands can write in it and files the service writes inherit
//! that owner), opening it again after a restart, and removing it when the session closes.
use std::io;
use std::path::{Path, PathBuf};

use crate::Workspace;

/// The directory holding every session's workspace on this node (`<root>/<session id>`).
#[derive(Debug, Clone)]
pub struct Workspaces {
    root: PathBuf,
    /// The user and group that must own a workspace, when commands run as another user than
    /// the service.
    owner: Option<(u32, u32)>,
}

impl Workspaces {
    /// The workspaces beneath `root` (created if missing), owned by `owner` if given.
    pub fn new(root: impl Into<PathBuf>, owner: Option<(u32, u32)>) -> io::Result<Self> {
        let root = root.into();
        // Not std::fs::create_dir_all on a workspace path: the root is the operator's.
        #[expect(
            clippy::disallowed_methods,
            reason = "the root itself, not a path inside a workspace"
        )]
        std::fs::create_dir_all(&root)?;
        Ok(Self { root, owner })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the workspace of `session` is.
    pub fn dir(&self, session: &str) -> PathBuf {
        self.root.join(session)
    }

    /// Makes the workspace of a new session and hands it to the sandbox user. Nothing is left
    /// behind when that fails.
    pub fn create(&self, session: &str) -> io::Result<Workspace> {
        let dir = self.dir(session);
        let made = Workspace::create(&dir).and_then(|ws| {
            if let Some((uid, gid)) = self.owner {
                std::os::unix::fs::chown(&dir, Some(uid), Some(gid))?;
            }
            Ok(ws)
        });
        if made.is_err() {
            self.remove(session);
        }
        made
    }

    /// Opens the workspace of an existing session (after a restart, or when its runtime was
    /// dropped).
    pub fn open(&self, session: &str) -> io::Result<Workspace> {
        Workspace::open(&self.dir(session))
    }

    /// Removes a session's workspace, if it is there. A failure is logged, not returned: the
    /// session is closed either way, and the directory can be removed by hand.
    pub fn remove(&self, session: &str) {
        let dir = self.dir(session);
        if !dir.exists() {
            return;
        }
        // remove_dir_all does not follow symlinks out of the tree (CVE-2022-21658, fixed in
        // Rust 1.58.1), so a symlink a command left in the workspace cannot redirect it.
        #[expect(
            clippy::disallowed_methods,
            reason = "removing a whole workspace is this module's job"
        )]
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "could not remove workspace");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_is_made_opened_and_removed_beneath_the_root() {
        let root = tempfile::tempdir().unwrap();
        let ws = Workspaces::new(root.path().join("workspaces"), None).unwrap();
        let made = ws.create("s1").unwrap();
        assert_eq!(made.root_path(), ws.dir("s1"));
        assert!(ws.open("s1").is_ok());
        ws.remove("s1");
        assert!(!ws.dir("s1").exists());
        assert!(ws.open("s1").is_err());
        // Removing what is not there is not an error.
        ws.remove("s1");
    }
}
