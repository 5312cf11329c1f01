//! Where a node's workspaces live and who owns them: making a session's workspace (owned by the
//! sandbox user, so that sandboxed commands can write in it and files the service writes inherit
//! that owner), opening it again after a restart, and removing it when the session closes —
//! and the layers that let hundreds of forks of one state share its contents.
//!
//! Layout, beneath the workspace root:
//!
//! - `<session id>/` — a session's workspace: a plain directory, or, for a fork made on
//!   layers, the mount point of an overlay;
//! - `.layers/` (mode 0700, the service's: the sandbox user cannot enter it) —
//!   - `base-<key>/`: a state rebuilt from the log once (`key` names the session and seq it is
//!     the state of), the read-only lower layer of every fork of that state;
//!   - `<session id>.upper/`, `<session id>.work/`: a fork's own changes (overlayfs upper and
//!     work directories), and `<session id>.base`, the key of its base.
//!
//! **Why overlayfs.** A fork must start as its source was at some event, and hundreds of forks
//! of one state must not cost hundreds of copies. The filesystems this runs on (ext4 here) have
//! no reflinks, and hard links would let a write in place (`echo >> f`) in one fork change
//! every other. An overlay shares the base's files until a fork writes one (copied up then,
//! into that fork's upper directory alone). The overlay is mounted by the service (root) in
//! its own mount namespace, `nosuid,nodev`, with the layers beneath a directory the sandbox user
//! cannot enter; the sandbox binds the merged directory like any workspace, and the jail opens
//! it like any workspace (one mount, so `RESOLVE_NO_XDEV` holds beneath it). Where overlayfs
//! cannot be mounted (a service that is not root, a kernel or container without it), a fork
//! gets a copy of the state instead ([`Workspaces::shares_contents`] says which).
//!
//! Mounts outlive the process: they are unmounted when the session closes, and (lazily) when
//! the [`Workspaces`] is dropped; a fork whose overlay is not mounted (after a restart in a new
//! mount namespace) is mounted again when it is opened. A base no fork uses any more is removed
//! with the last fork, and at start-up.
#![allow(
    clippy::disallowed_methods,
    reason = "this module manages the service's own directories (the workspace root, the layers, \
              whole workspaces), never a path a model named"
)]
use std::collections::HashSet;
use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// How old a half-built or unused base must be before a start-up removes it.
const LEFTOVER_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

use crate::Workspace;

/// The filesystem magic of overlayfs (`statfs`' `f_type`).
const OVERLAYFS_SUPER_MAGIC: i64 = 0x794c_7630;

/// The directory holding every session's workspace on this node (`<root>/<session id>`).
#[derive(Debug, Clone)]
pub struct Workspaces {
    root: PathBuf,
    /// The user and group that must own a workspace, when commands run as another user than
    /// the service.
    owner: Option<(u32, u32)>,
    layers: Arc<Layers>,
    /// Each session's own filesystem of a fixed size, when a disk quota is set.
    disks: Option<crate::disk::Disks>,
}

/// The overlay side: whether it works here, the mounts this process made (unmounted on drop),
/// and a lock that keeps a base from being removed while a fork is being put on it.
#[derive(Debug)]
struct Layers {
    dir: PathBuf,
    available: bool,
    mounted: Mutex<HashSet<PathBuf>>,
    bases: Mutex<()>,
}

impl Drop for Layers {
    fn drop(&mut self) {
        if let Ok(mounted) = self.mounted.lock() {
            for target in mounted.iter() {
                let _ = rustix::mount::unmount(target, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
}

/// A base being made: fill [`BaseBuilder::workspace`], then [`Workspaces::finish_base`].
#[derive(Debug)]
pub struct BaseBuilder {
    key: String,
    dir: PathBuf,
    workspace: Arc<Workspace>,
}

impl BaseBuilder {
    pub fn workspace(&self) -> Arc<Workspace> {
        self.workspace.clone()
    }
}

impl Workspaces {
    /// The workspaces beneath `root` (created if missing), owned by `owner` if given. Forks
    /// share their base's contents through overlayfs when `layers` is true and the service
    /// can mount it here (checked by mounting one).
    pub fn new(root: impl Into<PathBuf>, owner: Option<(u32, u32)>) -> io::Result<Self> {
        Self::with_layers(root, owner, true)
    }

    /// Like [`Workspaces::new`]; `layers: false` makes every fork a copy.
    pub fn with_layers(
        root: impl Into<PathBuf>,
        owner: Option<(u32, u32)>,
        layers: bool,
    ) -> io::Result<Self> {
        let root = root.into();
        // Not std::fs::create_dir_all on a workspace path: the root is the operator's.
        std::fs::create_dir_all(&root)?;
        let dir = root.join(".layers");
        make_private_dir(&dir)?;
        let available = layers && probe_overlay(&dir);
        let workspaces = Self {
            root,
            owner,
            layers: Arc::new(Layers {
                dir,
                available,
                mounted: Mutex::new(HashSet::new()),
                bases: Mutex::new(()),
            }),
            disks: None,
        };
        workspaces.sweep();
        Ok(workspaces)
    }

    /// Gives every session made from now on a filesystem of `bytes` of its own (see
    /// [`crate::disk`]); an error when that cannot be enforced here.
    pub fn with_disk_quota(mut self, bytes: u64) -> io::Result<Self> {
        let owner = self.owner.unwrap_or_else(|| {
            (
                rustix::process::geteuid().as_raw(),
                rustix::process::getegid().as_raw(),
            )
        });
        self.disks = Some(crate::disk::Disks::new(&self.root, bytes, owner)?);
        Ok(self)
    }

    /// The per-session disk quota, bytes, if one is set.
    pub fn disk_quota(&self) -> Option<u64> {
        self.disks.as_ref().map(crate::disk::Disks::bytes)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether forks share their base's contents (overlayfs) rather than copy them.
    pub fn shares_contents(&self) -> bool {
        self.layers.available
    }

    /// Where the workspace of `session` is.
    pub fn dir(&self, session: &str) -> PathBuf {
        self.root.join(session)
    }

    /// Makes the workspace of a new session and hands it to the sandbox user. Nothing is left
    /// behind when that fails.
    pub fn create(&self, session: &str) -> io::Result<Workspace> {
        let dir = self.dir(session);
        if let Some(disks) = &self.disks
            && let Err(e) = disks.make(session, &dir)
        {
            self.remove(session);
            return Err(e);
        }
        let made = Workspace::create(&dir).and_then(|ws| {
            self.give(&dir)?;
            Ok(ws)
        });
        if made.is_err() {
            self.remove(session);
        }
        made
    }

    /// Opens the workspace of an existing session (after a restart, or when its runtime was
    /// dropped), mounting a fork's overlay again if it is not mounted.
    pub fn open(&self, session: &str) -> io::Result<Workspace> {
        let dir = self.dir(session);
        let base = self.base_of(session);
        if let Some(disks) = &self.disks
            && disks.has(session)
        {
            // Clippy's redundant_clone is wrong here: `dir` is used after this.
            #[allow(clippy::redundant_clone)]
            let target = match base {
                Some(_) => disks.fork_mount(session),
                None => dir.clone(),
            };
            disks.mount(session, &target)?;
        }
        if let Some(key) = base {
            self.mount_fork(session, &key)?;
        }
        Workspace::open(&dir)
    }

    /// The base of state `key`, if one was made already.
    pub fn existing_base(&self, key: &str) -> Option<PathBuf> {
        let dir = self.base_dir(key);
        dir.is_dir().then_some(dir)
    }

    /// Starts making the base of state `key`: an empty directory (owned like a workspace) to
    /// fill, which [`Workspaces::finish_base`] then puts in place.
    pub fn begin_base(&self, key: &str) -> io::Result<BaseBuilder> {
        check_key(key)?;
        let dir = self
            .layers
            .dir
            .join(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
        let workspace = Arc::new(Workspace::create(&dir)?);
        self.give(&dir)?;
        Ok(BaseBuilder {
            key: key.to_owned(),
            dir,
            workspace,
        })
    }

    /// Puts a filled base in place (or keeps the one another fork put there meanwhile); its
    /// directory.
    pub fn finish_base(&self, builder: BaseBuilder) -> io::Result<PathBuf> {
        let BaseBuilder {
            key,
            dir,
            workspace,
        } = builder;
        drop(workspace);
        let target = self.base_dir(&key);
        match rustix::fs::rename(&dir, &target) {
            Ok(()) => Ok(target),
            Err(rustix::io::Errno::EXIST | rustix::io::Errno::NOTEMPTY) => {
                remove_tree(&dir);
                Ok(target)
            }
            Err(e) => {
                remove_tree(&dir);
                Err(e.into())
            }
        }
    }

    /// Drops a base that was being made.
    pub fn abandon_base(&self, builder: BaseBuilder) {
        let BaseBuilder { dir, workspace, .. } = builder;
        drop(workspace);
        remove_tree(&dir);
    }

    /// Makes the workspace of a fork on the base of state `key` (made by
    /// [`Workspaces::finish_base`]): an overlay with the base below and an empty upper layer.
    /// Only when [`Workspaces::shares_contents`].
    pub fn create_on(&self, session: &str, key: &str) -> io::Result<Workspace> {
        check_key(key)?;
        let made = (|| {
            let _bases = self.layers.bases.lock().map_err(|_| poisoned())?;
            if !self.base_dir(key).is_dir() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no base {key}"),
                ));
            }
            if let Some(disks) = &self.disks {
                disks.make(session, &disks.fork_mount(session))?;
            }
            let upper = self.upper(session);
            let work = self.work(session);
            make_private_dir(&work)?;
            std::fs::create_dir(&upper)?;
            // The merged root's owner and mode are the upper directory's.
            self.give(&upper)?;
            set_mode(&upper, 0o755)?;
            std::fs::write(self.layer(session, "base"), key)?;
            std::fs::create_dir(self.dir(session))?;
            self.mount_fork(session, key)?;
            Workspace::open(&self.dir(session))
        })();
        if made.is_err() {
            self.remove(session);
        }
        made
    }

    /// Removes a session's workspace, if it is there (unmounting a fork's overlay, and its
    /// base when no other fork uses it). A failure is logged, not returned: the session is
    /// closed either way, and the directory can be removed by hand.
    pub fn remove(&self, session: &str) {
        let dir = self.dir(session);
        let base = self.base_of(session);
        if base.is_some() || is_overlay(&dir) {
            self.unmount(&dir);
        }
        if let Some(disks) = &self.disks {
            // The image's data goes with it: nothing in the upper layer or the workspace needs
            // deleting file by file.
            // Clippy's redundant_clone is wrong here: `dir` is used after this.
            #[allow(clippy::redundant_clone)]
            let target = match base {
                Some(_) => disks.fork_mount(session),
                None => dir.clone(),
            };
            disks.release(session, &target);
            let _ = std::fs::remove_dir(disks.fork_mount(session));
        }
        if dir.exists() {
            // remove_dir_all does not follow symlinks out of the tree (CVE-2022-21658, fixed in
            // Rust 1.58.1), so a symlink a command left in the workspace cannot redirect it.
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "could not remove workspace");
            }
        }
        if let Some(key) = base {
            remove_tree(&self.upper(session));
            remove_tree(&self.work(session));
            let _bases = self.layers.bases.lock();
            remove_tree(&self.layer(session, "base"));
            if !self.base_in_use(&key) {
                remove_tree(&self.base_dir(&key));
            }
        }
    }

    /// At start-up: bases no fork uses and half-made ones go.
    /// Removes what a crashed service left in the layers: half-built bases and bases no fork
    /// uses, once they are [`LEFTOVER_AGE`] old.
    fn sweep(&self) {
        // Archive uploads a crashed service was spooling (`.uploads/`, see the engine's
        // `archive` module): an hour old, no replica is still receiving them.
        if let Ok(spooled) = std::fs::read_dir(self.root.join(".uploads")) {
            for entry in spooled.flatten() {
                if is_stale(&entry) {
                    remove_tree(&entry.path());
                }
            }
        }
        let Ok(entries) = std::fs::read_dir(&self.layers.dir) else {
            return;
        };
        // Another replica on the same storage may be building a base, or about to mount one it
        // just made: only what has been left for an hour is taken for a leftover.
        let mut used = HashSet::new();
        let mut bases = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("tmp-") {
                if is_stale(&entry) {
                    remove_tree(&entry.path());
                }
            } else if let Some(key) = name.strip_prefix("base-") {
                if is_stale(&entry) {
                    bases.push(key.to_owned());
                }
            } else if name.ends_with(".base")
                && let Ok(key) = std::fs::read_to_string(entry.path())
            {
                used.insert(key);
            }
        }
        for key in bases {
            if !used.contains(&key) {
                remove_tree(&self.base_dir(&key));
            }
        }
    }

    fn base_in_use(&self, key: &str) -> bool {
        let Ok(entries) = std::fs::read_dir(&self.layers.dir) else {
            return true;
        };
        entries.flatten().any(|e| {
            e.file_name().to_string_lossy().ends_with(".base") && {
                let k = std::fs::read_to_string(e.path());
                k.is_ok_and(|k| k == key)
            }
        })
    }

    /// The base key of a fork made on layers.
    fn base_of(&self, session: &str) -> Option<String> {
        std::fs::read_to_string(self.layer(session, "base")).ok()
    }

    fn base_dir(&self, key: &str) -> PathBuf {
        self.layers.dir.join(format!("base-{key}"))
    }

    /// A fork's upper layer: on its own disk when a quota is set (its writes are what counts).
    fn upper(&self, session: &str) -> PathBuf {
        match &self.disks {
            Some(d) if d.has(session) => d.fork_mount(session).join("upper"),
            _ => self.layer(session, "upper"),
        }
    }

    fn work(&self, session: &str) -> PathBuf {
        match &self.disks {
            Some(d) if d.has(session) => d.fork_mount(session).join("work"),
            _ => self.layer(session, "work"),
        }
    }

    fn layer(&self, session: &str, what: &str) -> PathBuf {
        self.layers.dir.join(format!("{session}.{what}"))
    }

    /// Mounts a fork's overlay on its workspace directory, unless it is mounted.
    fn mount_fork(&self, session: &str, key: &str) -> io::Result<()> {
        let target = self.dir(session);
        if is_overlay(&target) {
            return Ok(());
        }
        if !self.layers.available {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this fork's workspace is an overlay, and overlayfs cannot be mounted here",
            ));
        }
        let lower = self.base_dir(key);
        let upper = self.upper(session);
        let work = self.work(session);
        mount_overlay(&lower, &upper, &work, &target)?;
        if let Ok(mut mounted) = self.layers.mounted.lock() {
            mounted.insert(target);
        }
        Ok(())
    }

    fn unmount(&self, target: &Path) {
        if let Err(e) = rustix::mount::unmount(target, rustix::mount::UnmountFlags::DETACH)
            && e != rustix::io::Errno::INVAL
        {
            tracing::warn!(dir = %target.display(), error = %e, "could not unmount a fork's overlay");
        }
        if let Ok(mut mounted) = self.layers.mounted.lock() {
            mounted.remove(target);
        }
    }

    fn give(&self, dir: &Path) -> io::Result<()> {
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
        }
        Ok(())
    }
}

/// Keys name a session and a seq: nothing that could leave `.layers` or break mount options.
fn check_key(key: &str) -> io::Result<()> {
    if key.is_empty()
        || key.len() > 100
        || !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'@')
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a base key: {key:?}"),
        ));
    }
    Ok(())
}

/// Whether `entry` was last changed [`LEFTOVER_AGE`] ago or longer.
pub(crate) fn is_stale(entry: &std::fs::DirEntry) -> bool {
    entry
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age >= LEFTOVER_AGE)
}

fn poisoned() -> io::Error {
    io::Error::other("the layers lock is poisoned")
}

fn make_private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    set_mode(dir, 0o700)
}

fn set_mode(dir: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

fn remove_tree(path: &Path) {
    let removed = if path.is_dir() && !path.is_symlink() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    if let Err(e) = removed
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "could not remove a layer");
    }
}

fn is_overlay(dir: &Path) -> bool {
    rustix::fs::statfs(dir).is_ok_and(|st| st.f_type == OVERLAYFS_SUPER_MAGIC)
}

/// `mount -t overlay -o lowerdir=…,upperdir=…,workdir=…,nosuid,nodev`. Paths with characters
/// that mount options give a meaning (`,`, `:`, `\`) are refused.
fn mount_overlay(lower: &Path, upper: &Path, work: &Path, target: &Path) -> io::Result<()> {
    let mut options = String::new();
    for (name, path) in [("lowerdir", lower), ("upperdir", upper), ("workdir", work)] {
        let text = path.to_str().ok_or_else(|| bad_path(path))?;
        if text.contains([',', ':', '\\']) {
            return Err(bad_path(path));
        }
        if !options.is_empty() {
            options.push(',');
        }
        options.push_str(name);
        options.push('=');
        options.push_str(text);
    }
    // No metadata-only copy-up (a fork's upper layer holds whole files), no redirects.
    options.push_str(",metacopy=off,redirect_dir=off");
    let data = CString::new(options).map_err(|_| bad_path(lower))?;
    rustix::mount::mount(
        "toolexec-fork",
        target,
        "overlay",
        rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
        data.as_c_str(),
    )
    .map_err(io::Error::from)
}

fn bad_path(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!(
            "{} cannot be named in overlay mount options (',', ':' or '\\\\')",
            path.display()
        ),
    )
}

/// Whether an overlay can be mounted in `dir` (mounts and unmounts one).
fn probe_overlay(dir: &Path) -> bool {
    if !rustix::process::geteuid().is_root() {
        return false;
    }
    let probe = dir.join(format!("probe-{}", uuid::Uuid::new_v4().simple()));
    let parts = ["lower", "upper", "work", "merged"].map(|p| probe.join(p));
    let made = parts.iter().all(|p| std::fs::create_dir_all(p).is_ok());
    let ok = made && mount_overlay(&parts[0], &parts[1], &parts[2], &parts[3]).is_ok() && {
        let _ = rustix::mount::unmount(&parts[3], rustix::mount::UnmountFlags::DETACH);
        true
    };
    remove_tree(&probe);
    if !ok {
        tracing::info!(dir = %dir.display(), "overlayfs cannot be mounted here: forks copy their base");
    }
    ok
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests look at the result on the host"
)]
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

    /// Fills a file until the disk refuses; the bytes that fit.
    fn fill(path: &Path) -> (u64, io::Error) {
        use std::io::Write;
        let mut f = std::fs::File::create(path).unwrap();
        let chunk = vec![1u8; 1 << 20];
        let mut written = 0;
        loop {
            if let Err(e) = f.write_all(&chunk).and_then(|()| f.sync_data()) {
                return (written, e);
            }
            written += chunk.len() as u64;
            assert!(written <= 64 << 20, "past the quota");
        }
    }

    #[test]
    fn with_a_disk_quota_sessions_and_forks_each_fill_only_their_own_disk() {
        if !rustix::process::geteuid().is_root() {
            // The quota needs root; `with_disk_quota` says so (checked by the e2e suite).
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let ws = Workspaces::new(root.path().join("workspaces"), None)
            .unwrap()
            .with_disk_quota(16 << 20)
            .unwrap();
        assert_eq!(ws.disk_quota(), Some(16 << 20));
        let s1 = ws.create("s1").unwrap();
        let (written, err) = fill(&ws.dir("s1").join("big"));
        assert_eq!(
            err.raw_os_error(),
            Some(rustix::io::Errno::NOSPC.raw_os_error())
        );
        assert!((8 << 20..=16 << 20).contains(&written), "{written}");
        // Through the jail, the model reads why.
        let refused = s1.write("more.txt", &vec![0u8; 1 << 20]).unwrap_err();
        assert!(
            refused.model_message().contains("disk quota"),
            "{refused:?}"
        );
        // Another session is untouched by the first one's full disk.
        let s2 = ws.create("s2").unwrap();
        s2.write("a.txt", b"fine").unwrap();

        if ws.shares_contents() {
            let builder = ws.begin_base("s2@1").unwrap();
            builder
                .workspace()
                .restore_file(b"a.txt", b"base\n", 0o644)
                .unwrap();
            ws.finish_base(builder).unwrap();
            let f = ws.create_on("f1", "s2@1").unwrap();
            assert_eq!(
                std::fs::read(ws.dir("f1").join("a.txt")).unwrap(),
                b"base\n"
            );
            let (written, _) = fill(&ws.dir("f1").join("big"));
            assert!(written <= 16 << 20);
            drop(f);
            // After a restart (its mounts gone), the fork opens on its disk again.
            ws.unmount(&ws.dir("f1"));
            let disks = ws.disks.clone().unwrap();
            rustix::mount::unmount(disks.fork_mount("f1"), rustix::mount::UnmountFlags::DETACH)
                .unwrap();
            ws.open("f1").unwrap();
            assert!(std::fs::metadata(ws.dir("f1").join("big")).is_ok());
            ws.remove("f1");
            assert!(!disks.has("f1"));
            assert!(!disks.fork_mount("f1").exists());
        }

        // After a restart, a session's workspace is its disk again.
        drop(s1);
        rustix::mount::unmount(ws.dir("s1"), rustix::mount::UnmountFlags::DETACH).unwrap();
        assert!(!crate::disk::is_mount_point(&ws.dir("s1")));
        ws.open("s1").unwrap();
        assert!(crate::disk::is_mount_point(&ws.dir("s1")));
        assert!(std::fs::metadata(ws.dir("s1").join("big")).is_ok());
        for s in ["s1", "s2"] {
            ws.remove(s);
            assert!(!ws.dir(s).exists());
        }
        let left: Vec<_> = std::fs::read_dir(root.path().join("workspaces/.disks"))
            .unwrap()
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn forks_on_one_base_share_it_and_write_apart() {
        let root = tempfile::tempdir().unwrap();
        let ws = Workspaces::new(root.path().join("workspaces"), None).unwrap();
        if !ws.shares_contents() {
            // Not root here: forks are copies (tested by the engine's fork tests).
            assert!(!rustix::process::geteuid().is_root());
            return;
        }
        let builder = ws.begin_base("src@7").unwrap();
        builder
            .workspace()
            .restore_file(b"a.txt", b"base\n", 0o644)
            .unwrap();
        let base = ws.finish_base(builder).unwrap();
        assert_eq!(ws.existing_base("src@7"), Some(base.clone()));
        let f1 = ws.create_on("f1", "src@7").unwrap();
        let f2 = ws.create_on("f2", "src@7").unwrap();
        assert_eq!(
            std::fs::read(ws.dir("f1").join("a.txt")).unwrap(),
            b"base\n"
        );
        f1.restore_file(b"a.txt", b"one\n", 0o644).unwrap();
        // Written in place by a process (not through the jail): still only that fork's.
        std::fs::write(ws.dir("f2").join("a.txt"), b"two\n").unwrap();
        assert_eq!(std::fs::read(ws.dir("f1").join("a.txt")).unwrap(), b"one\n");
        assert_eq!(std::fs::read(ws.dir("f2").join("a.txt")).unwrap(), b"two\n");
        assert_eq!(std::fs::read(base.join("a.txt")).unwrap(), b"base\n");
        drop((f1, f2));
        ws.remove("f1");
        assert!(base.is_dir(), "f2 still uses the base");
        ws.remove("f2");
        assert!(!base.exists(), "the last fork took its base with it");
        assert!(!ws.dir("f2").exists());
    }
}
