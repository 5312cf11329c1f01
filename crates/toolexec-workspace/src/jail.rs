//! The workspace jail: every file access a tool makes, resolved by the kernel beneath one
//! directory.
//!
//! A [`Workspace`] opens its root once, as a file descriptor, and resolves every path relative to
//! that descriptor with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`. The
//! kernel walks the path atomically, so `..`, absolute symlinks, symlinks that lead out,
//! `/proc/*/root`-style magic links and mount crossings are refused at the moment of the open:
//! there is no check-then-open gap for a swapped-in symlink to slip through. Symlinks that stay
//! inside the workspace are followed.
//!
//! On top of the kernel's resolution this module adds what it does not give: a regular-file check
//! (FIFOs, sockets and devices are never opened for reading), refusal of hard-linked files (a link
//! to a file outside, planted by a shell command), a size cap, and writes that replace the target
//! by `renameat` of a fresh temp file, so a write never goes through a symlink or into an inode
//! that another path shares.
//!
//! Deleting ([`Workspace::remove_file_if`]) unlinks one regular file relative to its parent's
//! descriptor, never a directory or what a symlink points to. Copying
//! ([`Workspace::copy_file_if`]) streams a file of any size into a fresh temp file renamed over
//! the destination, hashing on the way. Walking ([`WorkspaceDir::open_child`],
//! [`WorkspaceDir::read_child`]) goes one real directory or file at a time, symlinks refused;
//! the workspace scanner ([`crate::scan`]) walks with [`Workspace::open_dir_exact`],
//! [`WorkspaceDir::stat_child`], [`WorkspaceDir::hash_child`] and [`WorkspaceDir::link_target`].
//!
//! Ownership: sandboxed commands run as an unprivileged user that owns the workspace, and must be
//! able to change what the service wrote. So when the service runs as root, a file it writes
//! (a fresh inode, renamed over the target) gets the owner and group of the file it replaces, and
//! a new file or directory gets those of the directory it is created in; the `chown` is made on
//! the new descriptor, never by name. A hard-linked target's owner is not copied (the link may
//! lead to a file from outside the workspace). A service that is not root changes no owners.
//!
//! This module must not build host paths from workspace paths and open them with `std::fs`: the
//! only `std::fs` call is [`Workspace::create`]'s `mkdir -p` of the root itself.
use std::convert::Infallible;
use std::ffi::CString;
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;
use toolexec_core::sha256_hex;

/// The largest file read whole, in bytes: big enough for any source file or log a model should
/// page through, small enough that a planted multi-gigabyte (or sparse) file cannot exhaust memory.
pub const MAX_READ_BYTES: u64 = 10 * 1024 * 1024;

/// Longest accepted path, in bytes (Linux `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;

/// Longest accepted path component, in bytes (Linux `NAME_MAX`).
pub const MAX_COMPONENT_BYTES: usize = 255;

/// The directory the model sees the workspace as. Absolute paths must lie under it.
pub const VIRTUAL_ROOT: &str = "/workspace";

/// How often an `openat2` that failed with `EAGAIN` is retried. The kernel returns `EAGAIN` for
/// `RESOLVE_BENEATH` lookups that raced a rename or mount; a few retries ride that out.
const EAGAIN_RETRIES: usize = 4;

/// Permission bits of files the jail creates (before the umask).
const NEW_FILE_MODE: u32 = 0o644;

/// Permission bits of directories the jail creates (before the umask).
const NEW_DIR_MODE: u32 = 0o755;

/// The resolution every lookup uses: stay beneath the root, no `/proc` magic links, no mount
/// crossings.
pub(crate) const JAIL: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// For single components inside a directory the jail already holds (a created parent, a child
/// while walking a tree, the target of a write): no symlinks at all.
pub(crate) const JAIL_NO_SYMLINKS: ResolveFlags = JAIL.union(ResolveFlags::NO_SYMLINKS);

/// Why a path was refused or an access failed. [`JailError::model_message`] is the sentence the
/// model reads; `Display` is the short form for logs.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("{path:?} is outside the workspace")]
    OutsideWorkspace { path: String },
    #[error("{path:?} does not exist")]
    NotFound { path: String },
    #[error("{path:?} is {kind}, not a regular file")]
    NotARegularFile { path: String, kind: &'static str },
    #[error("{path:?} is a directory")]
    IsADirectory { path: String },
    #[error("{path:?}: not a directory")]
    NotADirectory { path: String },
    #[error("{path:?} has more than one hard link")]
    HardLink { path: String },
    #[error("{path:?} is {size} bytes, over the {limit}-byte read limit")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("{path:?}: too many levels of symbolic links")]
    SymlinkLoop { path: String },
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: String },
    #[error("{op} {path:?}: {source}")]
    Io {
        path: String,
        op: &'static str,
        #[source]
        source: io::Error,
    },
}

impl JailError {
    /// Whether this is a guardrail refusal (the path is off limits) rather than a plain failure.
    /// Tools report guardrail refusals with the `denied` status.
    pub fn is_guardrail(&self) -> bool {
        matches!(
            self,
            JailError::OutsideWorkspace { .. } | JailError::HardLink { .. }
        )
    }

    /// The sentence for the model: what went wrong and what to do instead.
    pub fn model_message(&self) -> String {
        // The path came from the model or from the filesystem: escaped like every name a tool
        // prints, so that it cannot forge lines or send escape sequences.
        let path = toolexec_core::names::shown_name(self.path());
        match self {
            JailError::OutsideWorkspace { .. } => format!(
                "Path '{path}' is outside the workspace (or leads out of it through '..' or a \
                 symlink; absolute symlinks are never followed). Use a path under /workspace \
                 (absolute, like /workspace/src/main.rs, or relative, like src/main.rs)."
            ),
            JailError::NotFound { .. } => format!(
                "'{path}' does not exist. Check the path with list_dir or glob and try again."
            ),
            JailError::NotARegularFile { kind, .. } => format!(
                "'{path}' is {kind}, not a regular file. The file tools only read and write \
                 regular files; use the shell to inspect it if you must."
            ),
            JailError::IsADirectory { .. } => format!(
                "'{path}' is a directory, not a file. Use list_dir to see what it contains, \
                 or give the path of a file inside it."
            ),
            JailError::NotADirectory { .. } => format!(
                "'{path}' is not a directory (or one of its parent components is a file). \
                 Check the path with list_dir."
            ),
            JailError::HardLink { .. } => format!(
                "'{path}' has more than one hard link, so it may be a file from outside the \
                 workspace; the file tools do not read such files. Replace it with a new file \
                 (delete it with the shell, then write it) if you need to change it."
            ),
            JailError::TooLarge { size, limit, .. } => format!(
                "'{path}' is {} ({size} bytes), over the {} limit for reading a whole file. \
                 Use grep to find the lines you need, or the shell to print part of it \
                 (sed -n '100,200p' '{path}', head, tail).",
                human_bytes(*size),
                human_bytes(*limit)
            ),
            JailError::SymlinkLoop { .. } => format!(
                "'{path}' could not be resolved: too many levels of symbolic links (a symlink \
                 loop, or a symlink where none is allowed). Use the path of the real file."
            ),
            JailError::InvalidPath { reason, .. } => format!(
                "Invalid path '{path}': {reason}. Use a path relative to /workspace, \
                 like src/main.rs."
            ),
            JailError::Io { op, source, .. }
                if matches!(
                    source.raw_os_error(),
                    Some(e) if e == rustix::io::Errno::NOSPC.raw_os_error()
                        || e == rustix::io::Errno::DQUOT.raw_os_error()
                ) =>
            {
                format!(
                    "Could not {op} '{path}': the session's workspace is full (its disk quota is \
                     used up). Delete what you no longer need (build outputs, caches, large \
                     logs) with the shell, then try again."
                )
            }
            JailError::Io { op, source, .. } => {
                format!("Could not {op} '{path}': {source}.")
            }
        }
    }

    /// The path the error is about, as recorded in it.
    pub fn path(&self) -> &str {
        match self {
            JailError::OutsideWorkspace { path }
            | JailError::NotFound { path }
            | JailError::NotARegularFile { path, .. }
            | JailError::IsADirectory { path }
            | JailError::NotADirectory { path }
            | JailError::HardLink { path }
            | JailError::TooLarge { path, .. }
            | JailError::SymlinkLoop { path }
            | JailError::InvalidPath { path, .. }
            | JailError::Io { path, .. } => path,
        }
    }
}

/// A file read whole through the jail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileContents {
    /// Where the file actually is: workspace-relative, `/`-separated, symlinks resolved.
    pub path: String,
    pub bytes: Vec<u8>,
    /// Lowercase hex SHA-256 of `bytes`.
    pub sha256: String,
}

/// What was at a write's target before the write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Before {
    /// Nothing: the write creates the file.
    Absent,
    /// A regular file, read whole.
    File {
        sha256: String,
        size: u64,
        bytes: Vec<u8>,
    },
    /// A regular file the jail would not read: it has other hard links (it may be a file from
    /// outside the workspace) or is over [`MAX_READ_BYTES`]. Its contents are unknown.
    Unread { size: u64, reason: UnreadReason },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnreadReason {
    HardLink,
    TooLarge,
}

impl Before {
    pub fn exists(&self) -> bool {
        !matches!(self, Before::Absent)
    }

    pub fn sha256(&self) -> Option<&str> {
        match self {
            Before::File { sha256, .. } => Some(sha256),
            _ => None,
        }
    }

    pub fn size(&self) -> Option<u64> {
        match self {
            Before::Absent => None,
            Before::File { size, .. } | Before::Unread { size, .. } => Some(*size),
        }
    }
}

/// The result of a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// Where the file actually is: workspace-relative, `/`-separated, symlinked parents resolved.
    pub path: String,
    pub before: Before,
    /// SHA-256 and size of the new contents.
    pub sha256: String,
    pub size: u64,
    /// Permission bits of the file now (`st_mode & 0o7777`).
    pub mode: u32,
    /// False when the file already held exactly these bytes (nothing was written).
    pub changed: bool,
}

/// The result of a deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    /// Where the file was: workspace-relative, `/`-separated, symlinked parents resolved.
    pub path: String,
    /// What was deleted (never [`Before::Absent`]).
    pub before: Before,
}

/// The result of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Where the source actually is (workspace-relative, symlinks resolved).
    pub source: String,
    /// The destination as a write: its path, what it replaced, and the copied bytes' hash.
    pub written: Written,
    /// The copied bytes, when there were at most the `keep_up_to` asked for.
    pub kept: Option<Vec<u8>>,
}

/// What a directory entry is, as seen without following symlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// FIFO, socket or device.
    Other,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The name, lossily decoded if it is not UTF-8.
    pub name: String,
    pub kind: EntryKind,
    raw: CString,
}

impl Entry {
    /// The name as the kernel has it (not necessarily UTF-8).
    pub fn name_bytes(&self) -> &[u8] {
        self.raw.to_bytes()
    }
}

/// An entry's metadata as `lstat` sees it (a symlink itself, never what it points to), from
/// [`WorkspaceDir::stat_child`] or, for an opened file, [`HashedFile::stat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildStat {
    pub kind: EntryKind,
    pub dev: u64,
    pub ino: u64,
    /// File type and permission bits (`st_mode`).
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    /// Size in bytes (for a symlink, the length of its target text).
    pub size: u64,
    /// Last modification, nanoseconds since the Unix epoch.
    pub mtime_ns: i128,
    /// Last status change (any write, chmod, link count change, rename), nanoseconds since the
    /// Unix epoch. Unlike the mtime, the kernel always sets it to the current time: a process
    /// cannot backdate it.
    pub ctime_ns: i128,
}

impl ChildStat {
    #[allow(
        clippy::useless_conversion,
        reason = "the widths of the stat fields differ between architectures"
    )]
    fn from_stat(st: &Stat) -> Self {
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => EntryKind::File,
            FileType::Directory => EntryKind::Dir,
            FileType::Symlink => EntryKind::Symlink,
            _ => EntryKind::Other,
        };
        const NANOS: i128 = 1_000_000_000;
        Self {
            kind,
            dev: u64::from(st.st_dev),
            ino: u64::from(st.st_ino),
            mode: u32::from(st.st_mode),
            nlink: u64::from(st.st_nlink),
            uid: st.st_uid,
            gid: st.st_gid,
            size: file_size(st),
            mtime_ns: i128::from(st.st_mtime) * NANOS + i128::from(st.st_mtime_nsec),
            ctime_ns: i128::from(st.st_ctime) * NANOS + i128::from(st.st_ctime_nsec),
        }
    }
}

/// A regular file hashed by [`WorkspaceDir::hash_child`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashedFile {
    /// Lowercase hex SHA-256 of the `size` bytes read.
    pub sha256: String,
    /// Bytes read and hashed: the size the file had when it was opened (less if it shrank while
    /// it was read; a file growing meanwhile is read only up to that size).
    pub size: u64,
    /// The bytes, when there were at most the `keep_up_to` asked for.
    pub kept: Option<Vec<u8>>,
    /// The metadata of the file that was opened and read, taken before reading.
    pub stat: ChildStat,
}

/// A directory inside the workspace, held open for listing and for walking down without
/// following symlinks.
#[derive(Debug)]
pub struct WorkspaceDir {
    fd: OwnedFd,
    path: String,
}

/// A jail over one directory. See the module docs.
pub struct Workspace {
    root: OwnedFd,
    root_path: PathBuf,
}

impl fmt::Debug for Workspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workspace")
            .field("root_path", &self.root_path)
            .finish_non_exhaustive()
    }
}

impl Workspace {
    /// Creates the directory (and its parents) if needed, then opens it.
    #[expect(
        clippy::disallowed_methods,
        reason = "the workspace root itself is a host path the operator configured, not a model's path"
    )]
    pub fn create(path: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(path)?;
        Self::open(path)
    }

    /// Opens an existing directory as a workspace root (not through a symlink: the last
    /// component must be the directory itself). Fails if `openat2` with the jail's
    /// resolve flags is unavailable (old kernel, or a seccomp filter that refuses it): the jail
    /// fails closed rather than resolve paths in user space.
    pub fn open(path: &Path) -> io::Result<Self> {
        let root = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        // Probe: the first real lookup must not be the one that discovers openat2 is missing.
        openat2_retry(
            root.as_fd(),
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            JAIL,
        )
        .map_err(|e| match e {
            // Only these say the kernel (or a seccomp filter) lacks openat2; anything else —
            // out of descriptors, say — is what it is.
            rustix::io::Errno::NOSYS | rustix::io::Errno::PERM | rustix::io::Errno::INVAL => io::Error::new(
                io::ErrorKind::Unsupported,
                format!("openat2 with RESOLVE_BENEATH is unavailable ({e}); the workspace jail needs Linux 5.6 or later"),
            ),
            other => other.into(),
        })?;
        Ok(Self {
            root,
            root_path: path.to_path_buf(),
        })
    }

    /// The host directory this workspace jails (as given to [`Workspace::open`]).
    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// The root's descriptor, for the other modules of the crate that work beneath it.
    pub(crate) fn root_fd(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Reads a regular file whole. Refuses anything that is not a regular file, hard-linked files
    /// and files over [`MAX_READ_BYTES`].
    pub fn read(&self, path: &str) -> Result<FileContents, JailError> {
        let target = parse_path(path)?;
        let shown = &target.display;
        let (fd, _) = self.open_for_reading(&target, check_readable)?;
        let resolved = self
            .relative_path_of(fd.as_fd())
            .unwrap_or_else(|| shown.clone());
        let bytes = read_capped(fd, &resolved)?;
        Ok(FileContents {
            sha256: sha256_hex(&bytes),
            path: resolved,
            bytes,
        })
    }

    /// Writes `contents` to `path` atomically, creating missing parent directories.
    pub fn write(&self, path: &str, contents: &[u8]) -> Result<Written, JailError> {
        match self.write_if(path, contents, |_, _| Ok::<(), Infallible>(()))? {
            Ok(written) => Ok(written),
            Err(never) => match never {},
        }
    }

    /// Like [`Workspace::write`], but first calls `check` with the resolved workspace-relative
    /// path and what is there now; if `check` refuses, nothing is written (parent directories
    /// may already have been created) and its error is returned.
    ///
    /// The target is replaced by renaming a fresh temp file over it, so a symlink or a hard link
    /// at the target is never written through. A symlink at the target is refused outright;
    /// an existing file's permission bits are kept, and when the service runs as root so is its
    /// owner (a new file, and every directory created on the way, gets the owner of the
    /// directory it is created in; see the module docs).
    pub fn write_if<E>(
        &self,
        path: &str,
        contents: &[u8],
        check: impl FnOnce(&str, &Before) -> Result<(), E>,
    ) -> Result<Result<Written, E>, JailError> {
        let target = parse_path(path)?;
        let shown = &target.display;
        let (parent_kernel, name) = split_parent(&target)?;
        let parent = self.open_or_create_parent(parent_kernel, shown)?;
        let resolved = self.resolved_child(&parent, name, shown);

        let (before, keep) = self.existing_target(&parent, name, &resolved)?;
        if let Err(refused) = check(&resolved, &before) {
            return Ok(Err(refused));
        }
        let sha256 = sha256_hex(contents);
        let size = contents.len() as u64;
        if before.sha256() == Some(sha256.as_str()) {
            return Ok(Ok(Written {
                path: resolved,
                before,
                sha256,
                size,
                mode: keep
                    .as_ref()
                    .map_or(NEW_FILE_MODE, |st| st.st_mode & 0o7777),
                changed: false,
            }));
        }
        let mode = replace_file(&parent, name, contents, keep.as_ref(), &resolved)?;
        Ok(Ok(Written {
            path: resolved,
            before,
            sha256,
            size,
            mode,
            changed: true,
        }))
    }

    /// Opens a directory for listing. Symlinks on the way are followed (within the workspace);
    /// walking further down with [`WorkspaceDir::open_child`] never follows symlinks.
    pub fn open_dir(&self, path: &str) -> Result<WorkspaceDir, JailError> {
        let target = parse_path(path)?;
        let shown = &target.display;
        let fd = self.open_beneath_root(
            &target.kernel,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NONBLOCK | OFlags::CLOEXEC,
            shown,
            "open directory",
        )?;
        let resolved = self
            .relative_path_of(fd.as_fd())
            .unwrap_or_else(|| shown.clone());
        Ok(WorkspaceDir { fd, path: resolved })
    }

    /// Opens a directory by a workspace-relative path built from entry names while walking
    /// ([`Entry::name_bytes`] joined with `/`; empty or `.` for the root), following no symlink
    /// anywhere on the path, not even one that stays inside, and crossing no mount. Unlike
    /// [`Workspace::open_dir`], this is for walkers that keep paths rather than descriptors: the
    /// directory reached is the one at that path now, or an error (a component turned into a
    /// symlink or a file is [`JailError::SymlinkLoop`] or [`JailError::NotADirectory`]).
    pub fn open_dir_exact(&self, path: &[u8]) -> Result<WorkspaceDir, JailError> {
        let kernel: &[u8] = if path.is_empty() { b"." } else { path };
        let shown = String::from_utf8_lossy(kernel).into_owned();
        if kernel.contains(&0) {
            return Err(JailError::InvalidPath {
                path: shorten(&shown.replace('\0', "\\0")),
                reason: "it contains a NUL byte".to_owned(),
            });
        }
        let fd = openat2_retry(
            self.root.as_fd(),
            kernel,
            OFlags::RDONLY
                | OFlags::DIRECTORY
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::CLOEXEC,
            Mode::empty(),
            JAIL_NO_SYMLINKS,
        )
        .map_err(|e| errno_to_jail(e, &shown, "open directory"))?;
        Ok(WorkspaceDir { fd, path: shown })
    }

    /// Deletes one regular file. See [`Workspace::remove_file_if`].
    pub fn remove_file(&self, path: &str) -> Result<Removed, JailError> {
        match self.remove_file_if(path, |_, _| Ok::<(), Infallible>(()))? {
            Ok(removed) => Ok(removed),
            Err(never) => match never {},
        }
    }

    /// Deletes one regular file, after `check` has seen the resolved path and what is there
    /// (read whole, like a write's [`Before`]); if `check` refuses, nothing is deleted.
    ///
    /// The parent directory is resolved beneath the root like any lookup (symlinked directories
    /// inside the workspace are followed, ones that lead out are refused); the file itself is
    /// removed with `unlinkat` relative to that directory's descriptor, so the name that was
    /// checked is the name that goes. Directories, symlinks (wherever they point), FIFOs, sockets
    /// and devices are refused: only a regular file is ever unlinked. A hard-linked file is
    /// offered to `check` as [`Before::Unread`]; unlinking it would only drop the workspace's
    /// name for it.
    pub fn remove_file_if<E>(
        &self,
        path: &str,
        check: impl FnOnce(&str, &Before) -> Result<(), E>,
    ) -> Result<Result<Removed, E>, JailError> {
        let target = parse_path(path)?;
        let shown = &target.display;
        let (parent_kernel, name) = split_parent(&target)?;
        let parent = self.open_beneath_root(
            parent_kernel,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            shown,
            "open the parent directory of",
        )?;
        let resolved = self.resolved_child(&parent, name, shown);
        let (before, _) = self.existing_target(&parent, name, &resolved)?;
        if !before.exists() {
            return Err(JailError::NotFound { path: resolved });
        }
        if let Err(refused) = check(&resolved, &before) {
            return Ok(Err(refused));
        }
        // Without AT_REMOVEDIR, unlinkat refuses a directory swapped in since the check; a
        // symlink swapped in is removed itself, never what it points to.
        rustix::fs::unlinkat(&parent, name, AtFlags::empty())
            .map_err(|e| errno_to_jail(e, &resolved, "delete"))?;
        sync_dir(&parent);
        Ok(Ok(Removed {
            path: resolved,
            before,
        }))
    }

    /// Copies a regular file of any size to `dest`, streaming it (never whole in memory), and
    /// keeps the copied bytes in [`Copied::kept`] only when there are at most `keep_up_to` of
    /// them. `check` sees the destination's resolved path and what is there first, as for
    /// [`Workspace::write_if`]; if it refuses, nothing is written.
    ///
    /// The source is opened like [`Workspace::read`] opens a file (regular files only, hard
    /// links refused, beneath the root) but without the size cap. The destination is replaced
    /// atomically by renaming a fully written temp file over it.
    pub fn copy_file_if<E>(
        &self,
        source: &str,
        dest: &str,
        keep_up_to: u64,
        check: impl FnOnce(&str, &Before) -> Result<(), E>,
    ) -> Result<Result<Copied, E>, JailError> {
        let src_target = parse_path(source)?;
        let src_shown = &src_target.display;
        let (src_fd, src_stat) = self.open_for_reading(&src_target, check_streamable)?;
        let source_path = self
            .relative_path_of(src_fd.as_fd())
            .unwrap_or_else(|| src_shown.clone());

        let target = parse_path(dest)?;
        let shown = &target.display;
        let (parent_kernel, name) = split_parent(&target)?;
        let parent = self.open_or_create_parent(parent_kernel, shown)?;
        let resolved = self.resolved_child(&parent, name, shown);
        let (before, keep) = self.existing_target(&parent, name, &resolved)?;
        if let Err(refused) = check(&resolved, &before) {
            return Ok(Err(refused));
        }
        let same_file = keep
            .as_ref()
            .is_some_and(|st| st.st_dev == src_stat.st_dev && st.st_ino == src_stat.st_ino);
        if same_file {
            let size = file_size(&src_stat);
            let kept = match &before {
                Before::File { bytes, .. } if size <= keep_up_to => Some(bytes.clone()),
                _ => None,
            };
            let sha256 = match &before {
                Before::File { sha256, .. } => sha256.clone(),
                _ => hash_stream(File::from(src_fd), &resolved)?,
            };
            return Ok(Ok(Copied {
                source: source_path,
                written: Written {
                    path: resolved,
                    before,
                    sha256,
                    size,
                    mode: src_stat.st_mode & 0o7777,
                    changed: false,
                },
                kept,
            }));
        }
        let before_sha = before.sha256().map(str::to_owned);
        let ((sha256, size, kept), mode) =
            replace_file_with(&parent, name, keep.as_ref(), &resolved, |out| {
                let copied = stream_copy(File::from(src_fd), out, keep_up_to, &resolved)?;
                let changed = before_sha.as_deref() != Some(copied.0.as_str());
                Ok((copied, changed))
            })?;
        let changed = before.sha256() != Some(sha256.as_str());
        Ok(Ok(Copied {
            source: source_path,
            written: Written {
                path: resolved,
                before,
                sha256,
                size,
                mode,
                changed,
            },
            kept,
        }))
    }

    /// The workspace-relative form of a path as the model gave it (`/workspace/src/./a.rs` →
    /// `src/a.rs`), without touching the filesystem. `..` is folded lexically, so this is a
    /// display form only: symlinks can make the kernel's answer differ, which is why the jail's
    /// operations report the resolved path instead.
    pub fn display_path(path: &str) -> Result<String, JailError> {
        parse_path(path).map(|t| t.display)
    }

    /// Opens a file for reading beneath the root, checked by `check` twice: first through an
    /// O_PATH descriptor, which never opens the object itself (a FIFO, socket or device is
    /// refused without side effects), then on what was actually opened, since the path may have
    /// been swapped in between. O_NONBLOCK keeps a FIFO swapped in from hanging the open.
    fn open_for_reading(
        &self,
        target: &Target,
        check: fn(&Stat, &str) -> Result<(), JailError>,
    ) -> Result<(OwnedFd, Stat), JailError> {
        let shown = &target.display;
        let probe = self.open_beneath_root(
            &target.kernel,
            OFlags::PATH | OFlags::CLOEXEC,
            shown,
            "open",
        )?;
        check(&fstat(&probe, shown)?, shown)?;
        drop(probe);
        let fd = self.open_beneath_root(
            &target.kernel,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            shown,
            "open",
        )?;
        let st = fstat(&fd, shown)?;
        check(&st, shown)?;
        Ok((fd, st))
    }

    fn open_beneath_root(
        &self,
        kernel_path: &str,
        flags: OFlags,
        shown: &str,
        op: &'static str,
    ) -> Result<OwnedFd, JailError> {
        openat2_retry(self.root.as_fd(), kernel_path, flags, Mode::empty(), JAIL)
            .map_err(|e| errno_to_jail(e, shown, op))
    }

    /// Opens the parent directory of a write target, creating missing components one at a time.
    fn open_or_create_parent(&self, parent: &str, shown: &str) -> Result<OwnedFd, JailError> {
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        match openat2_retry(self.root.as_fd(), parent, dir_flags, Mode::empty(), JAIL) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(errno_to_jail(e, shown, "open the parent directory of")),
        }
        let components: Vec<&str> = parent
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        // The deepest prefix that exists, resolved from the root like any other lookup.
        let mut current = self.open_beneath_root(".", dir_flags, shown, "open")?;
        let mut existing = 0;
        while existing < components.len() {
            let prefix = components[..=existing].join("/");
            match openat2_retry(self.root.as_fd(), &prefix, dir_flags, Mode::empty(), JAIL) {
                Ok(fd) => {
                    current = fd;
                    existing += 1;
                }
                Err(Errno::NOENT) => break,
                Err(e) => return Err(errno_to_jail(e, shown, "open the parent directory of")),
            }
        }
        let missing = &components[existing..];
        if missing.contains(&"..") {
            return Err(JailError::InvalidPath {
                path: shown.to_owned(),
                reason: "'..' follows a directory that does not exist".to_owned(),
            });
        }
        for component in missing {
            let created = match rustix::fs::mkdirat(
                &current,
                *component,
                Mode::from_raw_mode(NEW_DIR_MODE),
            ) {
                Ok(()) => true,
                Err(Errno::EXIST) => false,
                Err(e) => return Err(errno_to_jail(e, shown, "create a parent directory of")),
            };
            // Something raced into the name we just created: NO_SYMLINKS refuses a symlink.
            let child = openat2_retry(
                current.as_fd(),
                *component,
                dir_flags | OFlags::NOFOLLOW,
                Mode::empty(),
                JAIL_NO_SYMLINKS,
            )
            .map_err(|e| errno_to_jail(e, shown, "open a parent directory of"))?;
            if created {
                // Changed on the descriptor just opened (a real directory, no symlink), never
                // by name: a name swapped since the mkdir cannot redirect the chown.
                if let Some(owner) = owner_of_new(&current) {
                    give_to(child.as_fd(), owner, shown);
                }
            }
            current = child;
        }
        Ok(current)
    }

    /// What is at `name` in `parent` now, without following a symlink there, and the metadata to
    /// carry over to the replacement.
    fn existing_target(
        &self,
        parent: &OwnedFd,
        name: &str,
        shown: &str,
    ) -> Result<(Before, Option<Stat>), JailError> {
        let st = match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok((Before::Absent, None)),
            Err(e) => return Err(errno_to_jail(e, shown, "inspect")),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {}
            FileType::Directory => {
                return Err(JailError::IsADirectory {
                    path: shown.to_owned(),
                });
            }
            other => {
                return Err(JailError::NotARegularFile {
                    path: shown.to_owned(),
                    kind: describe(other),
                });
            }
        }
        let size = file_size(&st);
        if st.st_nlink > 1 {
            let reason = UnreadReason::HardLink;
            return Ok((Before::Unread { size, reason }, Some(st)));
        }
        if size > MAX_READ_BYTES {
            let reason = UnreadReason::TooLarge;
            return Ok((Before::Unread { size, reason }, Some(st)));
        }
        let fd = openat2_retry(
            parent.as_fd(),
            name,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            JAIL_NO_SYMLINKS,
        )
        .map_err(|e| errno_to_jail(e, shown, "open"))?;
        let opened = fstat(&fd, shown)?;
        if FileType::from_raw_mode(opened.st_mode) != FileType::RegularFile || opened.st_nlink > 1 {
            // Swapped between the stat and the open; let the caller retry from the top.
            return Err(JailError::Io {
                path: shown.to_owned(),
                op: "write",
                source: io::Error::other("the file changed while it was being replaced; try again"),
            });
        }
        let bytes = read_capped(fd, shown)?;
        let before = Before::File {
            sha256: sha256_hex(&bytes),
            size: bytes.len() as u64,
            bytes,
        };
        Ok((before, Some(opened)))
    }

    /// The resolved workspace-relative path of `name` inside an opened parent directory.
    fn resolved_child(&self, parent: &OwnedFd, name: &str, shown: &str) -> String {
        match self.relative_path_of(parent.as_fd()) {
            Some(dir) if dir == "." => name.to_owned(),
            Some(dir) => format!("{dir}/{name}"),
            None => shown.to_owned(),
        }
    }

    /// The workspace-relative path of an open descriptor, from the kernel's own record of it
    /// (`/proc/self/fd`). `None` if /proc is unavailable or the descriptor is not under the root.
    fn relative_path_of(&self, fd: BorrowedFd<'_>) -> Option<String> {
        let root = proc_fd_path(self.root.as_fd())?;
        let path = proc_fd_path(fd)?;
        if path == root {
            return Some(".".to_owned());
        }
        let prefix = if root.ends_with('/') {
            root
        } else {
            format!("{root}/")
        };
        path.strip_prefix(&prefix).map(str::to_owned)
    }
}

impl WorkspaceDir {
    /// Workspace-relative path of this directory (`.` for the root).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The entries, sorted by name, without `.` and `..`.
    pub fn entries(&self) -> Result<Vec<Entry>, JailError> {
        self.entries_up_to(usize::MAX).map(|(entries, _)| entries)
    }

    /// At most `max` entries, sorted by name, and whether that is all of them. The directory is
    /// read no further than needed: a directory of a million entries costs what `max` of them
    /// cost (which ones come first is the filesystem's order, so a cut listing is a sample).
    pub fn entries_up_to(&self, max: usize) -> Result<(Vec<Entry>, bool), JailError> {
        let io_err = |e: Errno| errno_to_jail(e, &self.path, "list");
        let dir = Dir::read_from(&self.fd).map_err(io_err)?;
        let mut entries = Vec::new();
        let mut complete = true;
        for entry in dir {
            let entry = entry.map_err(io_err)?;
            if entries.len() == max {
                let raw = entry.file_name().to_bytes();
                if raw != b"." && raw != b".." {
                    complete = false;
                    break;
                }
                continue;
            }
            let raw = entry.file_name();
            if raw.to_bytes() == b"." || raw.to_bytes() == b".." {
                continue;
            }
            let file_type = match entry.file_type() {
                FileType::Unknown => rustix::fs::statat(&self.fd, raw, AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| FileType::from_raw_mode(st.st_mode))
                    .unwrap_or(FileType::Unknown),
                known => known,
            };
            let kind = match file_type {
                FileType::RegularFile => EntryKind::File,
                FileType::Directory => EntryKind::Dir,
                FileType::Symlink => EntryKind::Symlink,
                _ => EntryKind::Other,
            };
            entries.push(Entry {
                name: raw.to_string_lossy().into_owned(),
                kind,
                raw: raw.to_owned(),
            });
        }
        entries.sort_by(|a, b| a.raw.cmp(&b.raw));
        Ok((entries, complete))
    }

    /// Opens a subdirectory. Refuses symlinks (and mount points): a walk never leaves the tree
    /// it started in.
    pub fn open_child(&self, entry: &Entry) -> Result<WorkspaceDir, JailError> {
        let path = self.child_path(entry);
        let fd = openat2_retry(
            self.fd.as_fd(),
            entry.raw.as_c_str(),
            OFlags::RDONLY
                | OFlags::DIRECTORY
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::CLOEXEC,
            Mode::empty(),
            JAIL_NO_SYMLINKS,
        )
        .map_err(|e| errno_to_jail(e, &path, "open directory"))?;
        Ok(WorkspaceDir { fd, path })
    }

    /// Reads a regular file entry whole, without following a symlink at its name, with the
    /// same refusals as [`Workspace::read`] (hard links, over [`MAX_READ_BYTES`]).
    pub fn read_child(&self, entry: &Entry) -> Result<FileContents, JailError> {
        let path = self.child_path(entry);
        // O_NONBLOCK: a FIFO swapped in since the listing must not hang the open.
        let fd = openat2_retry(
            self.fd.as_fd(),
            entry.raw.as_c_str(),
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            JAIL_NO_SYMLINKS,
        )
        .map_err(|e| errno_to_jail(e, &path, "open"))?;
        check_readable(&fstat(&fd, &path)?, &path)?;
        let bytes = read_capped(fd, &path)?;
        Ok(FileContents {
            sha256: sha256_hex(&bytes),
            path,
            bytes,
        })
    }

    /// When an entry was last modified (not following a symlink), if it can be inspected.
    pub fn modified(&self, entry: &Entry) -> Option<SystemTime> {
        let st =
            rustix::fs::statat(&self.fd, entry.raw.as_c_str(), AtFlags::SYMLINK_NOFOLLOW).ok()?;
        let secs = u64::try_from(st.st_mtime).ok()?;
        let nanos = u32::try_from(st.st_mtime_nsec).unwrap_or(0);
        UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
    }

    /// Workspace-relative path of an entry of this directory.
    pub fn path_of(&self, entry: &Entry) -> String {
        self.child_path(entry)
    }

    /// The target text of a symlink entry (not followed).
    pub fn read_link(&self, entry: &Entry) -> Option<String> {
        rustix::fs::readlinkat(&self.fd, entry.raw.as_c_str(), Vec::new())
            .ok()
            .map(|target| target.to_string_lossy().into_owned())
    }

    /// The metadata of this directory itself.
    pub fn stat(&self) -> Result<ChildStat, JailError> {
        fstat(&self.fd, &self.path).map(|st| ChildStat::from_stat(&st))
    }

    /// The metadata of an entry as it is now, with one `statat(AT_SYMLINK_NOFOLLOW)` relative
    /// to this directory: a symlink is described, never followed, and nothing is opened.
    pub fn stat_child(&self, entry: &Entry) -> Result<ChildStat, JailError> {
        rustix::fs::statat(&self.fd, entry.raw.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
            .map(|st| ChildStat::from_stat(&st))
            .map_err(|e| errno_to_jail(e, &self.child_path(entry), "inspect"))
    }

    /// The entry called `name` in this directory and its metadata, with one
    /// `statat(AT_SYMLINK_NOFOLLOW)`: for walkers told a name by something other than a listing
    /// (the scanner's inotify events). `name` is one component: not empty, `.` or `..`, no `/`
    /// and no NUL ([`JailError::InvalidPath`] otherwise).
    pub fn child(&self, name: &[u8]) -> Result<(Entry, ChildStat), JailError> {
        let shown = String::from_utf8_lossy(name).into_owned();
        if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
            return Err(JailError::InvalidPath {
                path: shorten(&shown),
                reason: "it is not the name of a directory entry".to_owned(),
            });
        }
        let raw = CString::new(name).map_err(|_| JailError::InvalidPath {
            path: shorten(&shown.replace('\0', "\\0")),
            reason: "it contains a NUL byte".to_owned(),
        })?;
        let mut entry = Entry {
            name: shown,
            kind: EntryKind::Other,
            raw,
        };
        let st = self.stat_child(&entry)?;
        entry.kind = st.kind;
        Ok((entry, st))
    }

    /// The directory's descriptor, for the scanner to watch it with inotify
    /// (`/proc/self/fd/N`): the directory watched is the one this jail opened.
    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Hashes a regular file entry, streaming it (never whole in memory unless it is kept), and
    /// keeps its bytes in [`HashedFile::kept`] only when there are at most `keep_up_to` of them.
    ///
    /// The entry is opened relative to this directory without following a symlink at its name,
    /// non-blocking, and checked on the opened descriptor before anything is read: FIFOs,
    /// sockets, devices and directories are refused ([`JailError::NotARegularFile`],
    /// [`JailError::IsADirectory`]), and so are files with more than one hard link
    /// ([`JailError::HardLink`]: one may be a file from outside the workspace), and files over
    /// `max_bytes` ([`JailError::TooLarge`]). At most the size seen at the open is read, so a
    /// file that keeps growing cannot keep the hash going; and reading stops when `deadline`
    /// passes (checked between chunks of 256 KiB), as a [`JailError::Io`] of kind
    /// [`io::ErrorKind::TimedOut`].
    pub fn hash_child(
        &self,
        entry: &Entry,
        keep_up_to: usize,
        max_bytes: u64,
        deadline: Option<Instant>,
    ) -> Result<HashedFile, JailError> {
        let path = self.child_path(entry);
        let fd = openat2_retry(
            self.fd.as_fd(),
            entry.raw.as_c_str(),
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            JAIL_NO_SYMLINKS,
        )
        .map_err(|e| errno_to_jail(e, &path, "open"))?;
        let st = fstat(&fd, &path)?;
        check_streamable(&st, &path)?;
        let stat = ChildStat::from_stat(&st);
        if stat.size > max_bytes {
            return Err(JailError::TooLarge {
                path,
                size: stat.size,
                limit: max_bytes,
            });
        }
        let (sha256, size, kept) =
            hash_prefix(File::from(fd), stat.size, keep_up_to, deadline, &path)?;
        Ok(HashedFile {
            sha256,
            size,
            kept,
            stat,
        })
    }

    /// The target of a symlink entry as raw bytes (not followed). A name that is not a symlink
    /// (any more) is an error.
    pub fn link_target(&self, entry: &Entry) -> Result<Vec<u8>, JailError> {
        rustix::fs::readlinkat(&self.fd, entry.raw.as_c_str(), Vec::new())
            .map(std::ffi::CString::into_bytes)
            .map_err(|e| errno_to_jail(e, &self.child_path(entry), "read the symlink"))
    }

    fn child_path(&self, entry: &Entry) -> String {
        if self.path == "." {
            entry.name.clone()
        } else {
            format!("{}/{}", self.path, entry.name)
        }
    }
}

/// A path as the model gave it, checked and split into what the kernel resolves and what the
/// model is shown.
struct Target {
    /// Relative to the root, as given (the kernel folds `..` and symlinks).
    kernel: String,
    /// Lexically normalised, for messages.
    display: String,
}

fn parse_path(input: &str) -> Result<Target, JailError> {
    let invalid = |reason: String| JailError::InvalidPath {
        path: shorten(&input.replace('\0', "\\0")),
        reason,
    };
    if input.is_empty() {
        return Err(invalid("the path is empty".to_owned()));
    }
    if input.contains('\0') {
        return Err(invalid("it contains a NUL byte".to_owned()));
    }
    if input.len() > MAX_PATH_BYTES {
        return Err(invalid(format!(
            "it is {} bytes long; the limit is {MAX_PATH_BYTES}",
            input.len()
        )));
    }
    let relative = match input.strip_prefix('/') {
        None => input,
        Some(rest) => match rest.strip_prefix(VIRTUAL_ROOT.trim_start_matches('/')) {
            Some("") => ".",
            Some(under) if under.starts_with('/') => match under.trim_start_matches('/') {
                "" => ".",
                r => r,
            },
            _ => {
                return Err(JailError::OutsideWorkspace {
                    path: shorten(input),
                });
            }
        },
    };
    if let Some(long) = relative.split('/').find(|c| c.len() > MAX_COMPONENT_BYTES) {
        return Err(invalid(format!(
            "a component is {} bytes long; the limit is {MAX_COMPONENT_BYTES}",
            long.len()
        )));
    }
    Ok(Target {
        kernel: relative.to_owned(),
        display: normalize(relative),
    })
}

/// `a/./b//c/../d` → `a/b/d`; `.` for the root. Leading `..` stay (the kernel refuses them).
fn normalize(relative: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for component in relative.split('/') {
        match component {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    if parts.is_empty() {
        ".".to_owned()
    } else {
        parts.join("/")
    }
}

/// Splits a write target into its parent (as the kernel resolves it) and its final name.
fn split_parent(target: &Target) -> Result<(&str, &str), JailError> {
    let kernel = target.kernel.as_str();
    let (parent, name) = match kernel.rsplit_once('/') {
        Some((parent, name)) => (if parent.is_empty() { "." } else { parent }, name),
        None => (".", kernel),
    };
    match name {
        "" => Err(JailError::InvalidPath {
            path: shorten(&target.display),
            reason: "it ends with '/'; give the path of a file".to_owned(),
        }),
        "." | ".." => Err(JailError::IsADirectory {
            path: target.display.clone(),
        }),
        _ => Ok((parent, name)),
    }
}

pub(crate) fn openat2_retry(
    dir: BorrowedFd<'_>,
    path: impl rustix::path::Arg + Copy,
    flags: OFlags,
    mode: Mode,
    resolve: ResolveFlags,
) -> Result<OwnedFd, Errno> {
    let mut attempt = 0;
    loop {
        match rustix::fs::openat2(dir, path, flags, mode, resolve) {
            Err(Errno::AGAIN | Errno::INTR) if attempt < EAGAIN_RETRIES => attempt += 1,
            result => return result,
        }
    }
}

pub(crate) fn errno_to_jail(e: Errno, path: &str, op: &'static str) -> JailError {
    let path = path.to_owned();
    match e {
        Errno::XDEV => JailError::OutsideWorkspace { path },
        Errno::NOENT => JailError::NotFound { path },
        Errno::NOTDIR => JailError::NotADirectory { path },
        Errno::ISDIR => JailError::IsADirectory { path },
        Errno::LOOP => JailError::SymlinkLoop { path },
        Errno::NXIO => JailError::NotARegularFile {
            path,
            kind: "a socket or device",
        },
        Errno::NAMETOOLONG => JailError::InvalidPath {
            path: shorten(&path),
            reason: "it is too long".to_owned(),
        },
        other => JailError::Io {
            path,
            op,
            source: other.into(),
        },
    }
}

fn fstat(fd: &OwnedFd, shown: &str) -> Result<Stat, JailError> {
    rustix::fs::fstat(fd).map_err(|e| errno_to_jail(e, shown, "inspect"))
}

fn check_readable(st: &Stat, shown: &str) -> Result<(), JailError> {
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {}
        FileType::Directory => {
            return Err(JailError::IsADirectory {
                path: shown.to_owned(),
            });
        }
        other => {
            return Err(JailError::NotARegularFile {
                path: shown.to_owned(),
                kind: describe(other),
            });
        }
    }
    if st.st_nlink > 1 {
        return Err(JailError::HardLink {
            path: shown.to_owned(),
        });
    }
    let size = file_size(st);
    if size > MAX_READ_BYTES {
        return Err(JailError::TooLarge {
            path: shown.to_owned(),
            size,
            limit: MAX_READ_BYTES,
        });
    }
    Ok(())
}

/// Like [`check_readable`] without the size cap: for sources that are streamed, not loaded.
fn check_streamable(st: &Stat, shown: &str) -> Result<(), JailError> {
    match check_readable(st, shown) {
        Err(JailError::TooLarge { .. }) => Ok(()),
        other => other,
    }
}

/// Reads at most [`MAX_READ_BYTES`]; a file that grew past it since the `fstat` is refused too.
fn read_capped(fd: OwnedFd, shown: &str) -> Result<Vec<u8>, JailError> {
    let mut bytes = Vec::new();
    File::from(fd)
        .take(MAX_READ_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| JailError::Io {
            path: shown.to_owned(),
            op: "read",
            source,
        })?;
    if bytes.len() as u64 > MAX_READ_BYTES {
        return Err(JailError::TooLarge {
            path: shown.to_owned(),
            size: bytes.len() as u64,
            limit: MAX_READ_BYTES,
        });
    }
    Ok(bytes)
}

/// Writes a temp file next to the target and renames it over the target.
fn replace_file(
    parent: &OwnedFd,
    name: &str,
    contents: &[u8],
    keep: Option<&Stat>,
    shown: &str,
) -> Result<u32, JailError> {
    replace_file_with(parent, name, keep, shown, |file| {
        file.write_all(contents).map_err(|source| JailError::Io {
            path: shown.to_owned(),
            op: "write",
            source,
        })?;
        Ok(((), true))
    })
    .map(|((), mode)| mode)
}

/// Creates a temp file next to the target, lets `fill` write it, and renames it over the
/// target. `fill` answers whether to go ahead: `false` (the contents turned out identical to
/// what is there) removes the temp file and leaves the target alone. Returns `fill`'s value
/// and the permission bits the file has (the new file's, or the target's when left alone).
fn replace_file_with<T>(
    parent: &OwnedFd,
    name: &str,
    keep: Option<&Stat>,
    shown: &str,
    fill: impl FnOnce(&mut File) -> Result<(T, bool), JailError>,
) -> Result<(T, u32), JailError> {
    let io_err = |op: &'static str| {
        move |source: io::Error| JailError::Io {
            path: shown.to_owned(),
            op,
            source,
        }
    };
    let temp = temp_name(name);
    let mode = keep.map_or(NEW_FILE_MODE, |st| st.st_mode & 0o777);
    let fd = openat2_retry(
        parent.as_fd(),
        temp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
        JAIL_NO_SYMLINKS,
    )
    .map_err(|e| errno_to_jail(e, shown, "create a temp file for"))?;
    let result = (|| {
        // A service running as root hands the new inode to the replaced file's owner, or for a
        // new file to its directory's owner, so that an unprivileged sandboxed process (the
        // owner of the workspace) can go on changing what the service wrote. A hard-linked
        // target's owner is not trusted (it may be a file from outside the workspace): the
        // replacement then gets the directory's owner too.
        let owner = match keep {
            Some(st) if st.st_nlink <= 1 => running_as_root().then_some((st.st_uid, st.st_gid)),
            _ => owner_of_new(parent),
        };
        if let Some(owner) = owner {
            give_to(fd.as_fd(), owner, shown);
        }
        if keep.is_some() {
            // The umask applied to the create (and a chown may clear set-id bits); the old
            // permission bits are restored exactly.
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
                .map_err(|e| io_err("set permissions of")(e.into()))?;
        }
        let written_mode = rustix::fs::fstat(&fd)
            .map(|st| st.st_mode & 0o7777)
            .unwrap_or(mode);
        let mut file = File::from(fd);
        let (value, go_ahead) = fill(&mut file)?;
        if !go_ahead {
            return Ok((value, false, written_mode));
        }
        file.sync_all().map_err(io_err("sync"))?;
        rustix::fs::renameat(parent, temp.as_str(), parent, name)
            .map_err(|e| errno_to_jail(e, shown, "replace"))?;
        Ok((value, true, written_mode))
    })();
    let kept_mode = keep.map_or(NEW_FILE_MODE, |st| st.st_mode & 0o7777);
    match result {
        Ok((value, true, written_mode)) => {
            sync_dir(parent);
            Ok((value, written_mode))
        }
        Ok((value, false, _)) => {
            let _ = rustix::fs::unlinkat(parent, temp.as_str(), AtFlags::empty());
            Ok((value, kept_mode))
        }
        Err(e) => {
            let _ = rustix::fs::unlinkat(parent, temp.as_str(), AtFlags::empty());
            Err(e)
        }
    }
}

/// Whether the service runs as root. Only then does the jail change owners (see
/// [`owner_of_new`]); otherwise everything it creates simply belongs to the service's user.
pub(crate) fn running_as_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The owner (uid, gid) a file or directory created in `dir` is given: `dir`'s own, when the
/// service runs as root; `None` (no chown at all) otherwise or if `dir` cannot be inspected.
pub(crate) fn owner_of_new(dir: &OwnedFd) -> Option<(u32, u32)> {
    if !running_as_root() {
        return None;
    }
    rustix::fs::fstat(dir).ok().map(|st| (st.st_uid, st.st_gid))
}

/// Changes the owner of an open file or directory (`O_PATH` descriptors too). A failure is
/// logged, not fatal: the write itself succeeded, only the sandbox may not be able to change it.
pub(crate) fn give_to(fd: BorrowedFd<'_>, (uid, gid): (u32, u32), shown: &str) {
    let result = rustix::fs::chownat(
        fd,
        c"",
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
        AtFlags::EMPTY_PATH,
    );
    if let Err(e) = result {
        tracing::warn!(path = shown, uid, gid, error = %e, "could not change the owner");
    }
}

/// Makes a rename or unlink in `dir` durable; a failure here loses nothing already visible.
pub(crate) fn sync_dir(dir: &OwnedFd) {
    if let Ok(readable) = openat2_retry(
        dir.as_fd(),
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        JAIL,
    ) {
        let _ = rustix::fs::fsync(&readable);
    }
}

/// Buffer for streamed copies: large enough that a big copy is a few thousand syscalls, small
/// enough to sit on any worker thread.
const COPY_BUFFER_BYTES: usize = 256 * 1024;

/// Copies `source` into `out`, hashing as it goes; keeps the bytes while there are at most
/// `keep_up_to` of them. Returns (SHA-256, size, kept bytes).
fn stream_copy(
    mut source: File,
    out: &mut File,
    keep_up_to: u64,
    shown: &str,
) -> Result<(String, u64, Option<Vec<u8>>), JailError> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; COPY_BUFFER_BYTES];
    let mut size: u64 = 0;
    let mut kept = Some(Vec::new());
    loop {
        let n = match source.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(JailError::Io {
                    path: shown.to_owned(),
                    op: "read the source of",
                    source,
                });
            }
        };
        let chunk = &buf[..n];
        hasher.update(chunk);
        out.write_all(chunk).map_err(|source| JailError::Io {
            path: shown.to_owned(),
            op: "write",
            source,
        })?;
        size += n as u64;
        if size > keep_up_to {
            kept = None;
        } else if let Some(kept) = kept.as_mut() {
            kept.extend_from_slice(chunk);
        }
    }
    Ok((hex::encode(hasher.finalize()), size, kept))
}

/// SHA-256 of everything `source` holds, streamed.
fn hash_stream(mut source: File, shown: &str) -> Result<String, JailError> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    io::copy(&mut source, &mut hasher).map_err(|source| JailError::Io {
        path: shown.to_owned(),
        op: "read",
        source,
    })?;
    Ok(hex::encode(hasher.finalize()))
}

/// SHA-256 of the first `limit` bytes of `source` (fewer if it ends first), streamed; the bytes
/// are kept when `limit` is at most `keep_up_to`. Returns (SHA-256, bytes hashed, kept bytes).
/// Stops with [`io::ErrorKind::TimedOut`] when `deadline` passes while streaming (bytes that are
/// kept are at most `keep_up_to` and read at once).
///
/// Holes (the ranges of a sparse file with no data, found with `SEEK_DATA`/`SEEK_HOLE`) are
/// hashed as the zeros they read as, without reading them: the kernel makes a zeroed page-cache
/// page for every 4 KiB of a hole read, which cost more CPU than SHA-256 itself (1.4 s of system
/// time per GiB against 0.8 s of user time, docs/benchmarks.md) and fills the page cache with
/// zeros. A filesystem without holes reports data everywhere: then every byte is read.
fn hash_prefix(
    source: File,
    limit: u64,
    keep_up_to: usize,
    deadline: Option<Instant>,
    shown: &str,
) -> Result<(String, u64, Option<Vec<u8>>), JailError> {
    use rustix::fs::SeekFrom;
    use sha2::Digest;
    /// Hashed for holes (never written: a shared read-only zero page).
    static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
    let read_err = |source: io::Error| JailError::Io {
        path: shown.to_owned(),
        op: "read",
        source,
    };
    let seek_err = |e: Errno| read_err(e.into());
    let timed_out = || read_err(io::ErrorKind::TimedOut.into());
    let past_deadline = || deadline.is_some_and(|d| Instant::now() >= d);
    if let Ok(small) = usize::try_from(limit)
        && small <= keep_up_to
    {
        let mut bytes = Vec::with_capacity(small);
        (&source)
            .take(limit)
            .read_to_end(&mut bytes)
            .map_err(read_err)?;
        return Ok((sha256_hex(&bytes), bytes.len() as u64, Some(bytes)));
    }
    let mut hasher = sha2::Sha256::new();
    let buffer_len = usize::try_from(limit).map_or(COPY_BUFFER_BYTES, |l| l.min(COPY_BUFFER_BYTES));
    let mut buf = vec![0u8; buffer_len.max(1)];
    // Bytes hashed so far: the offset in the file.
    let mut pos: u64 = 0;
    while pos < limit {
        // Where the next data is; past the last data, the rest of the file is a hole up to its
        // end (which may be before `limit` if the file shrank since it was opened).
        let data = match rustix::fs::seek(&source, SeekFrom::Data(pos)) {
            Ok(data) => data.min(limit),
            Err(Errno::NXIO) => rustix::fs::seek(&source, SeekFrom::End(0))
                .map_err(seek_err)?
                .clamp(pos, limit),
            Err(e) => return Err(seek_err(e)),
        };
        while pos < data {
            if past_deadline() {
                return Err(timed_out());
            }
            let n = usize::try_from(data - pos).map_or(ZEROS.len(), |n| n.min(ZEROS.len()));
            hasher.update(&ZEROS[..n]);
            pos += n as u64;
        }
        if pos >= limit {
            break;
        }
        let hole = match rustix::fs::seek(&source, SeekFrom::Hole(pos)) {
            Ok(hole) => hole.min(limit),
            // Shrank to before `pos` meanwhile: what was hashed is all there is.
            Err(Errno::NXIO) => break,
            Err(e) => return Err(seek_err(e)),
        };
        rustix::fs::seek(&source, SeekFrom::Start(pos)).map_err(seek_err)?;
        while pos < hole {
            if past_deadline() {
                return Err(timed_out());
            }
            let want = usize::try_from(hole - pos).map_or(buf.len(), |n| n.min(buf.len()));
            match (&source).read(&mut buf[..want]) {
                // Shrank while it was read.
                Ok(0) => return Ok((hex::encode(hasher.finalize()), pos, None)),
                Ok(n) => {
                    hasher.update(&buf[..n]);
                    pos += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(read_err(e)),
            }
        }
    }
    Ok((hex::encode(hasher.finalize()), pos, None))
}

/// `.<name>.toolexec-<random>.tmp`, kept within `NAME_MAX`.
fn temp_name(name: &str) -> String {
    let mut stem_len = name.len().min(MAX_COMPONENT_BYTES - 40);
    while !name.is_char_boundary(stem_len) {
        stem_len -= 1;
    }
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!(".{}.toolexec-{}.tmp", &name[..stem_len], &random[..16])
}

fn proc_fd_path(fd: BorrowedFd<'_>) -> Option<String> {
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::fs::readlinkat(CWD, link.as_str(), Vec::new())
        .ok()?
        .into_string()
        .ok()
}

fn file_size(st: &Stat) -> u64 {
    u64::try_from(st.st_size).unwrap_or(0)
}

fn describe(file_type: FileType) -> &'static str {
    match file_type {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO (named pipe)",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        _ => "a special file",
    }
}

fn shorten(path: &str) -> String {
    const SHOWN_CHARS: usize = 200;
    if path.chars().count() <= SHOWN_CHARS {
        path.to_owned()
    } else {
        let head: String = path.chars().take(SHOWN_CHARS).collect();
        format!("{head}…")
    }
}

/// `10 MiB`, `1.5 KiB`, `12 bytes`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests build their fixtures on the host"
)]
mod tests {
    use super::*;

    fn workspace() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        (dir, ws)
    }

    #[test]
    fn virtual_root_paths_are_stripped_to_workspace_relative_ones() {
        let cases = [
            ("/workspace/src/a.rs", "src/a.rs"),
            ("/workspace", "."),
            ("/workspace/", "."),
            ("src/./a.rs", "src/a.rs"),
            ("src//lib/../a.rs", "src/a.rs"),
            ("./", "."),
        ];
        for (input, expected) in cases {
            assert_eq!(Workspace::display_path(input).unwrap(), expected, "{input}");
        }
    }

    #[test]
    fn other_absolute_paths_are_outside_the_workspace() {
        for input in [
            "/etc/passwd",
            "/workspaces/x",
            "/work",
            "//workspace/x",
            "/proc/self/root",
        ] {
            assert!(
                matches!(
                    Workspace::display_path(input),
                    Err(JailError::OutsideWorkspace { .. })
                ),
                "{input}"
            );
        }
    }

    #[test]
    fn empty_nul_and_over_long_paths_are_invalid() {
        let long_component = "a".repeat(MAX_COMPONENT_BYTES + 1);
        let long_path = "a/".repeat(MAX_PATH_BYTES / 2 + 1);
        for input in ["", "a\0b", &long_component, &long_path] {
            assert!(
                matches!(
                    Workspace::display_path(input),
                    Err(JailError::InvalidPath { .. })
                ),
                "{input:?}"
            );
        }
    }

    #[test]
    fn sparse_files_hash_like_the_zeros_their_holes_read_as() {
        use std::io::{Seek, SeekFrom};
        use std::os::unix::fs::FileExt;
        let (dir, ws) = workspace();
        const MIB: u64 = 1024 * 1024;
        // Holes at the start, between data and at the end; data at the end; all hole; none.
        /// A name, a size, and the bytes written at offsets (the rest is holes).
        type Layout<'a> = (&'a str, u64, &'a [(u64, &'a [u8])]);
        let layouts: [Layout; 5] = [
            (
                "islands",
                9 * MIB + 5,
                &[(3 * MIB + 1, b"island"), (7 * MIB, b"x")],
            ),
            ("data-at-end", 2 * MIB, &[(2 * MIB - 3, b"end")]),
            ("data-at-start", 3 * MIB, &[(0, b"start")]),
            ("all-hole", 5 * MIB + 7, &[]),
            ("dense", MIB + 1, &[(0, &[7u8; 1024 * 1024 + 1])]),
        ];
        for (name, size, data) in layouts {
            let file = std::fs::File::create(dir.path().join(name)).unwrap();
            file.set_len(size).unwrap();
            for (offset, bytes) in data {
                file.write_at(bytes, *offset).unwrap();
            }
            file.sync_all().unwrap();
            let mut all = Vec::new();
            let mut file = std::fs::File::open(dir.path().join(name)).unwrap();
            file.seek(SeekFrom::Start(0)).unwrap();
            file.read_to_end(&mut all).unwrap();
            assert_eq!(all.len() as u64, size);

            let root = ws.open_dir_exact(b"").unwrap();
            let (entry, _) = root.child(name.as_bytes()).unwrap();
            let hashed = root.hash_child(&entry, 0, u64::MAX, None).unwrap();
            assert_eq!(hashed.sha256, sha256_hex(&all), "{name}");
            assert_eq!(hashed.size, size, "{name}");
            assert_eq!(hashed.kept, None);
            // Past the deadline: stopped, not a wrong hash.
            let past = Instant::now();
            let stopped = root.hash_child(&entry, 0, u64::MAX, Some(past));
            assert!(
                matches!(&stopped, Err(JailError::Io { source, .. }) if source.kind() == io::ErrorKind::TimedOut),
                "{name}: {stopped:?}"
            );
        }
    }

    #[test]
    fn a_written_file_reads_back_with_its_hash() {
        let (_dir, ws) = workspace();
        let written = ws.write("/workspace/a/b/c.txt", b"hello\n").unwrap();
        assert_eq!(written.path, "a/b/c.txt");
        assert_eq!(written.before, Before::Absent);
        assert!(written.changed);
        let read = ws.read("a/b/c.txt").unwrap();
        assert_eq!(read.bytes, b"hello\n");
        assert_eq!(read.sha256, written.sha256);
        assert_eq!(read.path, "a/b/c.txt");
    }

    #[test]
    fn overwriting_reports_the_before_state_and_keeps_the_permission_bits() {
        use std::os::unix::fs::PermissionsExt;
        let (dir, ws) = workspace();
        std::fs::write(dir.path().join("run.sh"), "old").unwrap();
        std::fs::set_permissions(
            dir.path().join("run.sh"),
            std::fs::Permissions::from_mode(0o750),
        )
        .unwrap();
        let written = ws.write("run.sh", b"new").unwrap();
        assert_eq!(written.before.sha256(), Some(sha256_hex(b"old").as_str()));
        assert_eq!(written.before.size(), Some(3));
        let mode = std::fs::metadata(dir.path().join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o750);
        assert_eq!(std::fs::read(dir.path().join("run.sh")).unwrap(), b"new");
    }

    #[test]
    fn writing_identical_contents_changes_nothing() {
        let (_dir, ws) = workspace();
        ws.write("a.txt", b"same").unwrap();
        let again = ws.write("a.txt", b"same").unwrap();
        assert!(!again.changed);
    }

    #[test]
    fn a_refused_check_writes_nothing() {
        let (dir, ws) = workspace();
        std::fs::write(dir.path().join("a.txt"), "keep").unwrap();
        let outcome = ws
            .write_if("a.txt", b"clobber", |path, before| {
                assert_eq!(path, "a.txt");
                assert!(before.exists());
                Err("no")
            })
            .unwrap();
        assert_eq!(outcome, Err("no"));
        assert_eq!(std::fs::read(dir.path().join("a.txt")).unwrap(), b"keep");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temp file is left behind");
    }

    #[test]
    fn a_path_through_a_symlinked_directory_reports_where_the_file_really_is() {
        let (dir, ws) = workspace();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("alias")).unwrap();
        let written = ws.write("alias/f.txt", b"x").unwrap();
        assert_eq!(written.path, "real/f.txt");
        assert_eq!(ws.read("alias/f.txt").unwrap().path, "real/f.txt");
    }

    #[test]
    fn writing_a_directory_or_a_trailing_slash_is_refused() {
        let (dir, ws) = workspace();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        assert!(matches!(
            ws.write("d", b""),
            Err(JailError::IsADirectory { .. })
        ));
        assert!(matches!(
            ws.write(".", b""),
            Err(JailError::IsADirectory { .. })
        ));
        assert!(matches!(
            ws.write("e/", b""),
            Err(JailError::InvalidPath { .. })
        ));
    }

    #[test]
    fn a_file_in_the_way_of_a_parent_directory_is_reported() {
        let (dir, ws) = workspace();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        assert!(matches!(
            ws.write("f/g.txt", b""),
            Err(JailError::NotADirectory { .. })
        ));
    }

    #[test]
    fn dot_dot_after_a_missing_directory_is_refused_before_anything_is_created() {
        let (dir, ws) = workspace();
        assert!(matches!(
            ws.write("new/../x.txt", b""),
            Err(JailError::InvalidPath { .. })
        ));
        assert!(!dir.path().join("new").exists());
    }

    #[test]
    fn entries_are_sorted_and_typed_without_following_symlinks() {
        let (dir, ws) = workspace();
        std::fs::create_dir(dir.path().join("b")).unwrap();
        std::fs::write(dir.path().join("a"), "").unwrap();
        std::os::unix::fs::symlink("b", dir.path().join("c")).unwrap();
        let root = ws.open_dir(".").unwrap();
        let entries = root.entries().unwrap();
        let seen: Vec<_> = entries.iter().map(|e| (e.name.as_str(), e.kind)).collect();
        assert_eq!(
            seen,
            [
                ("a", EntryKind::File),
                ("b", EntryKind::Dir),
                ("c", EntryKind::Symlink)
            ]
        );
        assert_eq!(root.read_link(&entries[2]).as_deref(), Some("b"));
        assert!(matches!(
            root.open_child(&entries[2]),
            Err(JailError::SymlinkLoop { .. } | JailError::NotADirectory { .. })
        ));
        assert_eq!(root.open_child(&entries[1]).unwrap().path(), "b");
    }

    #[test]
    fn removing_a_file_reports_what_was_there_and_leaves_the_directory() {
        let (dir, ws) = workspace();
        ws.write("d/a.txt", b"gone").unwrap();
        let removed = ws.remove_file("/workspace/d/./a.txt").unwrap();
        assert_eq!(removed.path, "d/a.txt");
        assert_eq!(removed.before.sha256(), Some(sha256_hex(b"gone").as_str()));
        assert!(!dir.path().join("d/a.txt").exists());
        assert!(dir.path().join("d").is_dir());
        assert!(matches!(
            ws.remove_file("d/a.txt"),
            Err(JailError::NotFound { .. })
        ));
    }

    #[test]
    fn a_refused_removal_deletes_nothing() {
        let (dir, ws) = workspace();
        ws.write("a.txt", b"keep").unwrap();
        let outcome = ws.remove_file_if("a.txt", |_, _| Err("no")).unwrap();
        assert_eq!(outcome, Err("no"));
        assert!(dir.path().join("a.txt").exists());
    }

    #[test]
    fn a_copy_streams_the_bytes_and_keeps_them_only_when_small() {
        let (dir, ws) = workspace();
        let big: Vec<u8> = (0..3 * COPY_BUFFER_BYTES + 17).map(|i| i as u8).collect();
        std::fs::write(dir.path().join("big.bin"), &big).unwrap();
        let allow = |_: &str, _: &Before| Ok::<(), ()>(());
        let copied = ws
            .copy_file_if("big.bin", "sub/copy.bin", 1024, allow)
            .unwrap()
            .unwrap();
        assert_eq!(copied.source, "big.bin");
        assert_eq!(copied.written.path, "sub/copy.bin");
        assert_eq!(copied.written.sha256, sha256_hex(&big));
        assert_eq!(copied.written.size, big.len() as u64);
        assert!(copied.written.changed);
        assert_eq!(copied.kept, None);
        assert_eq!(std::fs::read(dir.path().join("sub/copy.bin")).unwrap(), big);

        let small = ws
            .copy_file_if("sub/copy.bin", "again.bin", u64::MAX, allow)
            .unwrap()
            .unwrap();
        assert_eq!(small.kept.as_deref(), Some(big.as_slice()));
    }

    #[test]
    fn copying_over_a_file_with_the_same_bytes_or_onto_itself_changes_nothing() {
        let (_dir, ws) = workspace();
        ws.write("a", b"same").unwrap();
        ws.write("b", b"same").unwrap();
        let allow = |_: &str, _: &Before| Ok::<(), ()>(());
        let onto_twin = ws.copy_file_if("a", "b", 1024, allow).unwrap().unwrap();
        assert!(!onto_twin.written.changed);
        let onto_itself = ws.copy_file_if("a", "a", 1024, allow).unwrap().unwrap();
        assert!(!onto_itself.written.changed);
        assert_eq!(onto_itself.kept.as_deref(), Some(&b"same"[..]));
    }

    #[test]
    fn a_file_over_the_read_limit_can_still_be_copied() {
        let (dir, ws) = workspace();
        let file = std::fs::File::create(dir.path().join("huge.img")).unwrap();
        file.set_len(MAX_READ_BYTES + 1).unwrap();
        drop(file);
        assert!(matches!(
            ws.read("huge.img"),
            Err(JailError::TooLarge { .. })
        ));
        let copied = ws
            .copy_file_if("huge.img", "copy.img", 1024, |_, _| Ok::<(), ()>(()))
            .unwrap()
            .unwrap();
        assert_eq!(copied.written.size, MAX_READ_BYTES + 1);
        assert_eq!(copied.kept, None);
        let len = std::fs::metadata(dir.path().join("copy.img"))
            .unwrap()
            .len();
        assert_eq!(len, MAX_READ_BYTES + 1);
    }

    #[test]
    fn a_child_is_read_without_following_a_symlink_at_its_name() {
        let (dir, ws) = workspace();
        std::fs::write(dir.path().join("real"), "x").unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("link")).unwrap();
        let root = ws.open_dir(".").unwrap();
        let entries = root.entries().unwrap();
        let link = entries.iter().find(|e| e.name == "link").unwrap();
        let real = entries.iter().find(|e| e.name == "real").unwrap();
        assert!(root.read_child(link).is_err());
        assert_eq!(root.read_child(real).unwrap().bytes, b"x");
        assert!(root.modified(real).is_some());
    }

    #[test]
    fn as_root_what_the_jail_creates_goes_to_the_directorys_owner_and_rewrites_keep_theirs() {
        use std::os::unix::fs::MetadataExt;
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: only a service running as root changes owners");
            return;
        }
        let chown = |path: &Path, uid: u32, gid: u32| {
            let fd =
                rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).unwrap();
            rustix::fs::fchown(
                &fd,
                Some(rustix::fs::Uid::from_raw(uid)),
                Some(rustix::fs::Gid::from_raw(gid)),
            )
            .unwrap();
        };
        let (dir, ws) = workspace();
        let owner = |rel: &str| {
            let meta = std::fs::symlink_metadata(dir.path().join(rel)).unwrap();
            (meta.uid(), meta.gid())
        };
        chown(dir.path(), 65534, 65534);
        std::fs::write(dir.path().join("theirs.txt"), "old").unwrap();
        chown(&dir.path().join("theirs.txt"), 1234, 5678);
        std::fs::write(dir.path().join("root.txt"), "old").unwrap();

        ws.write("new/sub/file.txt", b"new").unwrap();
        ws.write("theirs.txt", b"rewritten").unwrap();
        ws.write("root.txt", b"rewritten").unwrap();
        assert_eq!(owner("new"), (65534, 65534));
        assert_eq!(owner("new/sub"), (65534, 65534));
        assert_eq!(owner("new/sub/file.txt"), (65534, 65534));
        assert_eq!(
            owner("theirs.txt"),
            (1234, 5678),
            "a rewrite keeps the owner"
        );
        assert_eq!(owner("root.txt"), (0, 0), "a rewrite keeps the owner");

        // A copy lands in a directory with another owner; a hard-linked target's owner is not
        // copied (the link may lead out of the workspace): its directory's owner is used.
        std::fs::create_dir(dir.path().join("other")).unwrap();
        chown(&dir.path().join("other"), 4321, 4321);
        let allow = |_: &str, _: &Before| Ok::<(), ()>(());
        ws.copy_file_if("theirs.txt", "other/copy.txt", 0, allow)
            .unwrap()
            .unwrap();
        assert_eq!(owner("other/copy.txt"), (4321, 4321));
        std::fs::hard_link(
            dir.path().join("theirs.txt"),
            dir.path().join("other/linked.txt"),
        )
        .unwrap();
        ws.write("other/linked.txt", b"replaced").unwrap();
        assert_eq!(owner("other/linked.txt"), (4321, 4321));
        assert_eq!(owner("theirs.txt"), (1234, 5678));
    }

    #[test]
    fn model_messages_say_what_to_do() {
        let e = JailError::OutsideWorkspace {
            path: "/etc/passwd".into(),
        };
        assert_eq!(
            e.model_message(),
            "Path '/etc/passwd' is outside the workspace (or leads out of it through '..' or \
             a symlink; absolute symlinks are never followed). Use a path under /workspace \
             (absolute, like /workspace/src/main.rs, or relative, like src/main.rs)."
        );
        let e = JailError::TooLarge {
            path: "big.log".into(),
            size: 20 * 1024 * 1024,
            limit: MAX_READ_BYTES,
        };
        assert!(e.model_message().contains("20 MiB"));
        assert!(e.model_message().contains("grep"));
    }

    #[test]
    fn sizes_are_shown_in_binary_units() {
        assert_eq!(human_bytes(12), "12 bytes");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(MAX_READ_BYTES), "10 MiB");
    }
}
