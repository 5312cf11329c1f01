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

mod dir;
mod paths;
mod sys;
#[cfg(test)]
mod tests;
mod workspace;

use paths::*;
pub use sys::human_bytes;
use sys::*;
pub(crate) use sys::{errno_to_jail, give_to, openat2_retry, owner_of_new, sync_dir};

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
