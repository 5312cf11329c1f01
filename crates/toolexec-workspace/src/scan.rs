//! The workspace scanner: what a process changed in the workspace, recorded like the file tools'
//! changes.
//!
//! After a mutating call that the jail did not see file by file (a sandboxed `shell` command),
//! the engine asks a [`Snapshot`] of the workspace what was created, modified and deleted since
//! the last scan. A snapshot keeps, for every regular file and symlink, its metadata (device,
//! inode, size, mtime and ctime to the nanosecond, mode, link count) and the SHA-256 of its
//! contents, and a rescan hashes again only the entries whose metadata changed.
//!
//! **What a rescan looks at.** A capture puts an inotify watch on every directory of the
//! workspace, and a rescan on every directory that appeared since. Inotify watches inodes, so
//! what a sandboxed process does through its own mount of the workspace is reported too. A
//! rescan reads the events queued since the last scan and inspects only the names they give (one
//! `statat(AT_SYMLINK_NOFOLLOW)` each), walks the directories that appeared or were moved in
//! (watching them before listing them), and drops the records below those that went away: an
//! unchanged workspace costs one read of the event queue, whatever its size. It also inspects,
//! events or not:
//!
//! - files with more than one hard link: a write through another of their names is reported on
//!   that name's directory only (which may be outside the workspace);
//! - the racily clean entries of the previous scan (below), and the entries it could not inspect.
//!
//! It walks the whole workspace instead (one `statat` per entry, hashing only what changed;
//! [`ScanReport::full_walk`] says so and why, see [`FullWalkReason`]) when the events cannot be
//! trusted to tell everything:
//!
//! - the snapshot has no inotify instance (it could not be created, or a watch could not be
//!   added, as at the per-user limits), or the event queue overflowed;
//! - a directory went unwatched: the previous scan could not open, list or watch it (or it is
//!   too deep to open), or its watch went away while it may still be there;
//! - a hard link may have hidden a write. A file's link count is its own attribute: making or
//!   removing a link tells the directory of the file's other names nothing, and a write through
//!   the link is reported on the link's directory only. So a rescan walks when a file gained a
//!   link (its other names may be anywhere), when a name made since the last scan was deleted or
//!   replaced (a temporary file, or a link written through and removed), and when a directory
//!   was made or moved in (it was not watched while it was filled);
//! - [`FULL_WALK_INTERVAL`] passed since the last full walk: inotify reports no write through a
//!   shared memory mapping until the mapping goes away, and no hard link made to a workspace
//!   file from outside the workspace.
//!
//! Renamed directories, files written in place or replaced by a rename (editors, `sed -i`,
//! bytecode caches) and deletions of files the last scan recorded are followed from the events.
//! A snapshot without inotify always walks.
//!
//! **Racily clean files.** Timestamps are coarse (the kernel stamps files from a clock that
//! advances once per tick, and some filesystems keep whole seconds only), so a file rewritten
//! with the same size just after it was scanned can keep exactly the metadata the scan recorded.
//! Like git's index, the scanner does not trust the metadata of a file whose mtime or ctime is not
//! older than the start of the scan that recorded it (minus [`RACY_MARGIN`], or two seconds for
//! a timestamp with no sub-second part): such a file is hashed again at the next rescan even if
//! its metadata looks unchanged. Any change to a file sets its ctime to the current time, and a
//! process cannot backdate the ctime, so every change made after a scan started is caught by the
//! next rescan at the latest (assuming file timestamps and the service's clock agree within the
//! margin, which holds on one kernel).
//!
//! **Against a hostile process.** The sandboxed process may still be changing the tree while it
//! is scanned. The walk never follows a symlink and never leaves the workspace: directories are
//! opened beneath the workspace root with no symlink allowed anywhere on the path
//! ([`Workspace::open_dir_exact`]), entries are inspected relative to their directory's
//! descriptor, and a file is opened non-blocking without following a symlink at its name and
//! checked on the opened descriptor before a byte is read. A watch is added through the
//! descriptor the walk opened (`/proc/self/fd/N`), never by path, so the directory watched is the
//! one listed. An event only says which name to look at again: what is recorded is what the
//! inspection finds. What is recorded:
//!
//! - Regular files, with the SHA-256 of their contents, hashed streaming (at most the size seen at
//!   the open is read, so a file that keeps growing cannot keep the scan going; the holes of a
//!   sparse file are hashed as zeros without being read). Their contents are returned only
//!   within the budget ([`ScanBudget`], below).
//! - **Files with more than one hard link are never read**: a hard link may lead to a file from
//!   outside the workspace. They are recorded by metadata only, with no hash and no contents
//!   (`after_sha256` absent), and reported modified when their inode, size or mtime changes. The
//!   same goes for files over [`MAX_HASH_BYTES`] (a sparse file can claim terabytes), files
//!   beyond the scan's hash or time budget, and files the service may not read;
//!   [`FileChange::after_unstored`] says which.
//! - Symlinks, never followed: their target text is the contents (hashed, returned as `after`,
//!   and given in [`FileChange::symlink_target`]). A change between a regular file and a symlink
//!   at the same path is reported as `modified`.
//! - Names (and symlink targets) exactly: one that is not UTF-8 is reported as a display form
//!   with `\xHH` for each invalid byte and its bytes in base64 ([`FileChange::path_b64`]), so two
//!   names never share a record. Changes come sorted by the raw bytes of their paths.
//! - Not directories themselves, only what is in them: a directory that appears or disappears
//!   shows as its files created or deleted (a renamed one as deletions and creations).
//!   Everything is walked, `.git`, `node_modules` and `target` included: replaying a session
//!   needs all of it.
//! - Not FIFOs, sockets and devices: they are ignored (never opened).
//!
//! A race never fails the scan: an entry that disappears between the listing and its inspection
//! is gone, a directory that disappears or turns into a symlink or file before it is opened has
//! its previous contents reported deleted, and an entry that changes type between its `stat` and
//! its open is left as the previous scan saw it (its new metadata differs, so the next rescan
//! looks again: the change also queued an event). A directory or entry that cannot be inspected
//! for another reason (permissions, a mount point, a path over `PATH_MAX`) also keeps its
//! previous records rather than reporting them deleted. Only an unusable workspace root is an
//! error.
//!
//! **What a scan may cost.** A scan runs on the service's memory and CPU, after the command and
//! outside its limits, so a rescan takes a [`ScanBudget`] (the engine's `[limits]`): the contents
//! it returns for the log (in total: past it a file is reported by hash and size, and a smaller
//! file takes the place of larger ones kept before it, so the small files are the ones kept),
//! the bytes it hashes, and how long it hashes (checked between chunks of a file). A file beyond
//! the hash or time budget is recorded by its metadata alone, like a hard-linked one: it is not
//! read again while its metadata stays the same, and its next change is reported when the
//! metadata shows it. Racily clean files (read again only because their timestamps cannot be
//! trusted yet) are read last, so they never take the budget of files that did change; one the
//! budget cannot cover any more is followed by its metadata from then on. The walk itself (one
//! `statat` per entry looked at) always completes: a creation or deletion is never missed. The
//! capture takes the same hash and time budgets.
//!
//! **Inotify is shared with the host.** Instances and watches are per-user kernel limits: a
//! snapshot takes its instance from an [`InotifyPool`], which caps what one service holds. A
//! snapshot refused an instance, or whose new watch is refused, walks the workspace at every
//! rescan ([`FullWalkReason::NoInotify`]) and asks again later (at every rescan for an instance;
//! a minute after a refused watch). The pool may close an instance idle for
//! [`FULL_WALK_INTERVAL`] for another snapshot: its next rescan walks
//! ([`FullWalkReason::InotifyReclaimed`]), as it would have for [`FullWalkReason::Periodic`].
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::mem::MaybeUninit;
use std::ops::Bound;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::fs::inotify::{self, ReadFlags, WatchFlags};
use rustix::io::Errno;
use toolexec_core::names::RecordedName;
use toolexec_core::{Capability, FileChange, FileChangeKind, UnstoredReason, sha256_hex};

use crate::RecordedChange;
use crate::jail::{
    ChildStat, Entry, EntryKind, JailError, MAX_PATH_BYTES, Workspace, WorkspaceDir,
};

mod pool;

pub use pool::InotifyPool;
use pool::{Lease, Refused};

/// How much older than the start of a scan a file's mtime and ctime must be for its metadata to
/// be trusted at the next rescan: more than a kernel tick of the coarse clock files are stamped
/// from (up to 10 ms at `HZ=100`), with room to spare.
pub const RACY_MARGIN: Duration = Duration::from_millis(50);

/// The margin for a timestamp with no sub-second part, which suggests a filesystem that keeps
/// whole seconds (two for FAT).
const COARSE_MARGIN: Duration = Duration::from_secs(2);

/// Files larger than this are recorded by metadata only, never hashed: a sparse file can claim
/// terabytes, and hashing it would stall the session.
pub const MAX_HASH_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// How long a snapshot relies on inotify alone: the first rescan this long after the last full
/// walk walks the whole workspace again. Inotify reports no write through a shared memory
/// mapping until the mapping goes away (a background process may keep one for hours), and no
/// hard link made to a workspace file from outside the workspace; this bounds how late such a
/// change is found.
pub const FULL_WALK_INTERVAL: Duration = Duration::from_secs(60);

/// What a directory's watch reports: names created, deleted and moved in it, files in it written
/// or changed (permissions, timestamps, link count through this name), and the directory itself
/// deleted or moved. `IN_EXCL_UNLINK`: nothing about a file once unlinked (writing to a deleted
/// file still open changes nothing in the workspace). No `IN_DONT_FOLLOW`: the watch is added
/// through `/proc/self/fd/N`, a link that must be followed to the directory the walk opened.
const WATCH_MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::DELETE)
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::CLOSE_WRITE)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::MOVE_SELF)
    .union(WatchFlags::ONLYDIR)
    .union(WatchFlags::EXCL_UNLINK);

/// Events that make or remove a name. On a directory (`IN_ISDIR`), what is below the name is
/// looked at again: walked if it is a directory now, forgotten otherwise.
const STRUCTURAL: ReadFlags = ReadFlags::CREATE
    .union(ReadFlags::DELETE)
    .union(ReadFlags::MOVED_FROM)
    .union(ReadFlags::MOVED_TO);

/// Bytes read from the inotify descriptor at once (an event is 16 bytes and its name).
const EVENT_BUFFER_BYTES: usize = 64 * 1024;

/// Events one rescan reads at most (the kernel queues 16,384 by default, but a process can queue
/// them as fast as they are read): past this the rescan walks the whole workspace.
const MAX_EVENTS: usize = 1 << 20;

/// What one scan may cost the service (it runs after the command, outside the sandbox's limits,
/// on the service's memory and CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanBudget {
    /// Largest file whose contents a rescan returns ([`RecordedChange::after`]); larger ones are
    /// hashed only ([`UnstoredReason::TooLarge`]).
    pub keep_up_to: usize,
    /// Contents one rescan returns in total. Past it a changed file is hashed only
    /// ([`UnstoredReason::ContentBudget`]); a smaller file takes the place of larger ones kept
    /// before it, so the small files (sources, configuration) are the ones kept.
    pub content_bytes: u64,
    /// Bytes one scan hashes in total. A file that does not fit is recorded by its metadata
    /// only, with no hash ([`UnstoredReason::HashBudget`]), like a file over
    /// [`MAX_HASH_BYTES`].
    pub hash_bytes: u64,
    /// How long one scan may spend hashing. Past it the files not hashed yet (and the one being
    /// hashed) are recorded by metadata only ([`UnstoredReason::TimeBudget`]). The walk itself
    /// (one `statat` per entry looked at) always completes: deletions and creations are never
    /// missed.
    pub time: Duration,
}

impl ScanBudget {
    /// Only the per-file limit on returned contents.
    pub fn unlimited(keep_up_to: usize) -> Self {
        Self {
            keep_up_to,
            content_bytes: u64::MAX,
            hash_bytes: u64::MAX,
            time: Duration::MAX,
        }
    }
}

/// A path relative to the workspace root as raw bytes, components joined with `/`.
type Key = Box<[u8]>;

type Sha = [u8; 32];

/// What the last scan saw of the workspace: every regular file and symlink with its metadata and
/// content hash, and the inotify watches of its directories. [`Snapshot::default`] is an empty
/// workspace without inotify (a rescan of it reports every file as created). It is `Send`: it
/// can be kept between calls and moved to a blocking thread for a rescan.
#[derive(Debug, Default)]
pub struct Snapshot {
    entries: BTreeMap<Key, Record>,
    /// When the scan that recorded `entries` started, nanoseconds since the Unix epoch.
    started_ns: i128,
    /// Counts the scans.
    generation: u64,
    /// The directory watches; `None` without inotify (it could not be set up, a watch could not
    /// be added, the pool closed it, or the snapshot is a default or a clone), and then every
    /// rescan walks.
    watcher: Option<Watcher>,
    /// Where instances come from; `None`: never watched (a default or a clone).
    pool: Option<Arc<InotifyPool>>,
    /// Without a watcher: why (the reason the next rescan walks), and when to ask the pool for an
    /// instance again (after the kernel refused one or a watch could not be added, not before
    /// [`FULL_WALK_INTERVAL`]: trying means watching every directory again).
    unwatched: Option<(FullWalkReason, Option<Instant>)>,
}

impl Clone for Snapshot {
    /// The same records without inotify (two snapshots cannot share one event queue): the
    /// clone's rescans walk the whole workspace.
    fn clone(&self) -> Self {
        Self {
            entries: self.entries.clone(),
            started_ns: self.started_ns,
            generation: self.generation,
            watcher: None,
            pool: None,
            unwatched: None,
        }
    }
}

/// What a rescan found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanReport {
    /// The files and symlinks created, modified and deleted since the previous scan, sorted by
    /// path, with capability [`Capability::Process`].
    pub changes: Vec<RecordedChange>,
    /// Regular files and symlinks in the workspace now.
    pub files: usize,
    /// Entries whose contents were read by this rescan (files hashed, symlinks read).
    pub hashed: usize,
    /// Bytes of regular files hashed ([`ScanBudget::hash_bytes`]).
    pub hashed_bytes: u64,
    /// Bytes of contents returned in [`RecordedChange::after`] ([`ScanBudget::content_bytes`]).
    pub kept_bytes: u64,
    /// Why this rescan walked the whole workspace (one `statat` per entry) rather than look only
    /// at what inotify reported; `None` when it did not.
    pub full_walk: Option<FullWalkReason>,
}

/// Why a rescan walked the whole workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FullWalkReason {
    /// The snapshot has no inotify instance: it could not be created (the service's cap,
    /// [`InotifyPool`], or the per-user instance limit, `fs.inotify.max_user_instances`), a
    /// watch could not be added (the pool's cap, or the per-user watch limit,
    /// `fs.inotify.max_user_watches`), or the snapshot is a default or a clone.
    NoInotify,
    /// The pool closed the snapshot's idle inotify instance to give it to another session.
    InotifyReclaimed,
    /// Events were lost: the kernel's queue overflowed (`IN_Q_OVERFLOW`), could not be read, or
    /// held more than one rescan reads.
    EventsLost,
    /// A directory was not watched: the previous scan could not open, list or watch it, or its
    /// watch went away while it may still be there (the root's, an unmount).
    Unwatched,
    /// A file gained a hard link: its other names, anywhere in the workspace, are looked at too.
    HardLink,
    /// A directory was made (or moved in from outside the watched tree): it was not watched
    /// while it was filled, and a hard link made and removed in it would have gone unnoticed.
    NewDirectory,
    /// A file made since the previous scan was deleted or replaced: it may have been a hard link
    /// to a file elsewhere in the workspace, written through and removed.
    TransientFile,
    /// [`FULL_WALK_INTERVAL`] passed since the last full walk.
    Periodic,
}

/// One entry of a [`Snapshot`], as its last scan saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeenEntry<'a> {
    /// A regular file: its SHA-256 (absent when it was not read: hard-linked, over a budget),
    /// size and permission bits.
    File {
        sha256: Option<String>,
        size: u64,
        mode: u32,
    },
    Symlink {
        target: &'a [u8],
    },
}

/// The metadata compared between scans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Meta {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    mode: u32,
    nlink: u64,
}

impl From<&ChildStat> for Meta {
    fn from(st: &ChildStat) -> Self {
        Self {
            dev: st.dev,
            ino: st.ino,
            size: st.size,
            mtime_ns: st.mtime_ns,
            ctime_ns: st.ctime_ns,
            mode: st.mode,
            nlink: st.nlink,
        }
    }
}

impl Meta {
    /// Whether the contents may have changed since without the metadata showing it (a racily
    /// clean entry): its mtime or ctime is not older than the start of the scan that saw it,
    /// minus the margin.
    fn racy(&self, scan_started_ns: i128) -> bool {
        [self.mtime_ns, self.ctime_ns]
            .into_iter()
            .any(|t| t.saturating_add(margin_ns(t)) >= scan_started_ns)
    }

    /// Whether the next rescan inspects the entry even if no event names it: a file with more
    /// than one link (written through another name, its directory hears nothing), or a racily
    /// clean one.
    fn recheck(&self, scan_started_ns: i128) -> bool {
        self.nlink > 1 || self.racy(scan_started_ns)
    }
}

fn margin_ns(timestamp_ns: i128) -> i128 {
    let margin = if timestamp_ns % 1_000_000_000 == 0 {
        COARSE_MARGIN
    } else {
        RACY_MARGIN
    };
    i128::try_from(margin.as_nanos()).unwrap_or(i128::MAX)
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    meta: Meta,
    content: Content,
    /// The generation of the last scan that saw the entry.
    seen: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Content {
    /// A regular file read and hashed.
    File { sha256: Sha, size: u64 },
    /// A symlink: its target text, not followed.
    Symlink { target: Box<[u8]>, sha256: Sha },
    /// A regular file whose contents were not read (or not to the end), and why: more than one
    /// hard link, over [`MAX_HASH_BYTES`], a scan budget used up, or unreadable.
    Unread(UnstoredReason),
}

impl Record {
    fn sha256(&self) -> Option<String> {
        match &self.content {
            Content::File { sha256, .. } | Content::Symlink { sha256, .. } => {
                Some(hex::encode(sha256))
            }
            Content::Unread(_) => None,
        }
    }

    fn size(&self) -> u64 {
        match &self.content {
            Content::File { size, .. } => *size,
            Content::Symlink { target, .. } => target.len() as u64,
            Content::Unread(_) => self.meta.size,
        }
    }

    fn symlink_target(&self) -> Option<&[u8]> {
        match &self.content {
            Content::Symlink { target, .. } => Some(target),
            _ => None,
        }
    }

    /// The permission bits of a regular file (`None` for a symlink, whose mode means nothing).
    fn perm(&self) -> Option<u32> {
        match self.content {
            Content::Symlink { .. } => None,
            Content::File { .. } | Content::Unread(_) => Some(self.meta.mode & 0o7777),
        }
    }

    /// Whether two records hold the same contents. Unread files are compared by identity, size
    /// and mtime, the best there is without reading them.
    fn same_contents(&self, other: &Record) -> bool {
        match (&self.content, &other.content) {
            (Content::File { sha256: a, .. }, Content::File { sha256: b, .. })
            | (Content::Symlink { sha256: a, .. }, Content::Symlink { sha256: b, .. }) => a == b,
            (Content::Unread(_), Content::Unread(_)) => {
                let (a, b) = (&self.meta, &other.meta);
                (a.dev, a.ino, a.size, a.mtime_ns) == (b.dev, b.ino, b.size, b.mtime_ns)
            }
            _ => false,
        }
    }
}

/// The inotify side of a snapshot: one instance, a watch on every directory of the workspace.
#[derive(Debug)]
struct Watcher {
    /// The instance's place in the pool, which keeps the instance between scans (and may close
    /// it then, for another snapshot).
    lease: Lease,
    /// The instance, while a scan runs ([`Watcher::attach`]).
    fd: Option<Arc<OwnedFd>>,
    /// Watch descriptor → the workspace-relative path of the directory it watches (empty for the
    /// root), where the walk that added the watch found it.
    dirs: HashMap<i32, Key>,
    /// The reverse: the watched directories.
    wds: BTreeMap<Key, i32>,
    /// Watches taken out of the maps during a scan: removed at its end unless a walk found their
    /// directory again (a moved directory keeps its watch, under its new path).
    orphans: BTreeSet<i32>,
    /// Paths whose watches were forgotten during this scan (to be found again by a walk):
    /// watching the directory there again most likely adds no watch.
    forgotten: BTreeSet<Key>,
    /// Entries the next rescan inspects whatever the events say (see [`Meta::recheck`]), and
    /// entries this one could not inspect.
    recheck: BTreeSet<Key>,
    /// Set when the next rescan cannot trust the events alone.
    walk_next: Option<FullWalkReason>,
    /// A watch could not be added: the snapshot drops its inotify instance after this scan.
    failed: bool,
    last_full_walk: Instant,
}

/// What the events say to look at.
#[derive(Debug, Default)]
struct Plan {
    /// Directory → names in it to inspect → whether a directory was created, deleted or moved at
    /// the name (then what is below it is looked at again too).
    dirs: BTreeMap<Key, BTreeMap<Key, bool>>,
    /// The previous scan's entries to inspect again ([`Watcher::recheck`]).
    carried: Vec<Key>,
}

impl Plan {
    fn touch(&mut self, dir: &[u8], name: &[u8], structural: bool) {
        let names = match self.dirs.get_mut(dir) {
            Some(names) => names,
            None => self.dirs.entry(dir.into()).or_default(),
        };
        match names.get_mut(name) {
            Some(flag) => *flag |= structural,
            None => {
                names.insert(name.into(), structural);
            }
        }
    }
}

impl Watcher {
    /// A new instance from the pool, attached for the scan that asks for it. Nothing is
    /// watched yet: that scan walks for `reason`.
    fn open(pool: &Arc<InotifyPool>, reason: FullWalkReason) -> Result<Self, Refused> {
        let (lease, fd) = pool.open()?;
        Ok(Self {
            lease,
            fd: Some(fd),
            dirs: HashMap::new(),
            wds: BTreeMap::new(),
            orphans: BTreeSet::new(),
            forgotten: BTreeSet::new(),
            recheck: BTreeSet::new(),
            walk_next: Some(reason),
            failed: false,
            last_full_walk: Instant::now(),
        })
    }

    /// Takes the instance for a scan; false if the pool closed it meanwhile.
    fn attach(&mut self) -> bool {
        self.fd = self.lease.attach();
        self.fd.is_some()
    }

    /// Gives the instance back to the pool after a scan, with the count of its watches.
    fn detach(&mut self) {
        self.fd = None;
        self.forgotten.clear();
        self.lease.detach(self.dirs.len());
    }

    /// Watches an open directory (or finds its watch), known by `path` from now on.
    fn watch(&mut self, dir: &WorkspaceDir, path: &[u8]) {
        if self.failed {
            return;
        }
        // Only a new watch is charged to the pool, and before it is added (the service never
        // holds more than its cap), unless the directory was watched at this path already: then
        // the kernel hands back its watch (a walk watches every directory again), and a new one
        // is charged after the fact (the directory was replaced since: rare).
        let expected = self.wds.contains_key(path) || self.forgotten.contains(path);
        let reserved = !expected && self.lease.charge_watch();
        if !expected && !reserved {
            return self.cap_reached();
        }
        match self.add_watch(dir) {
            Ok(wd) => {
                let known = self.dirs.contains_key(&wd) || self.orphans.contains(&wd);
                if known && reserved {
                    self.lease.refund_watch();
                } else if !known && !reserved && !self.lease.charge_watch() {
                    if let Some(fd) = self.fd.as_deref() {
                        let _ = inotify::remove_watch(fd, wd);
                    }
                    return self.cap_reached();
                }
                self.map(wd, path);
            }
            Err(e) => {
                if reserved {
                    self.lease.refund_watch();
                }
                tracing::warn!(
                    error = %e,
                    "a workspace directory cannot be watched (fs.inotify.max_user_watches?): every rescan of this workspace walks all of it for a while"
                );
                self.failed = true;
            }
        }
    }

    fn cap_reached(&mut self) {
        tracing::warn!(
            "the service's share of inotify watches is used up (limits.max_inotify_watches): every rescan of this workspace walks all of it for a while"
        );
        self.failed = true;
    }

    fn add_watch(&mut self, dir: &WorkspaceDir) -> Result<i32, Errno> {
        let Some(fd) = self.fd.as_deref() else {
            return Err(Errno::BADF);
        };
        let by_fd = format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd());
        inotify::add_watch(fd, by_fd.as_str(), WATCH_MASK)
    }

    /// Records that `wd` watches the directory at `path`, and nothing else watches it (a
    /// directory found again at a new path keeps its watch descriptor).
    fn map(&mut self, wd: i32, path: &[u8]) {
        if let Some(old_path) = self.dirs.get(&wd) {
            if **old_path == *path {
                return;
            }
            if self.wds.get(&**old_path) == Some(&wd) {
                self.wds.remove(&**old_path);
            }
        }
        if let Some(old_wd) = self.wds.get(path).copied()
            && old_wd != wd
            && self.dirs.get(&old_wd).is_some_and(|p| **p == *path)
        {
            self.dirs.remove(&old_wd);
            self.orphans.insert(old_wd);
        }
        self.dirs.insert(wd, path.into());
        self.wds.insert(path.into(), wd);
    }

    /// Forgets the directory at `path` and every one below it.
    fn forget_below(&mut self, path: &[u8]) {
        if path.is_empty() {
            return self.forget_all();
        }
        let (start, end) = subtree_bounds(path);
        let mut gone: Vec<Key> = self
            .wds
            .range::<[u8], _>((Bound::Included(&start[..]), Bound::Excluded(&end[..])))
            .map(|(key, _)| key.clone())
            .collect();
        gone.push(path.into());
        for key in gone {
            if let Some(wd) = self.wds.remove(&key)
                && self.dirs.get(&wd) == Some(&key)
            {
                self.dirs.remove(&wd);
                self.orphans.insert(wd);
                self.forgotten.insert(key);
            }
        }
    }

    fn forget_all(&mut self) {
        self.orphans.extend(self.dirs.drain().map(|(wd, _)| wd));
        self.forgotten
            .extend(std::mem::take(&mut self.wds).into_keys());
    }

    /// Removes the watches no directory was found for again.
    fn release_orphans(&mut self) {
        let Some(fd) = self.fd.as_deref() else {
            return;
        };
        for wd in std::mem::take(&mut self.orphans) {
            if !self.dirs.contains_key(&wd) {
                // A watch whose directory was deleted is gone already (EINVAL): nothing to do.
                let _ = inotify::remove_watch(fd, wd);
            }
        }
    }

    /// Reads every queued event: what to inspect, or why the whole workspace must be walked.
    /// `entries`: the previous scan's records (the workspace as the watches' paths describe it).
    fn drain(&mut self, entries: &BTreeMap<Key, Record>) -> Result<Plan, FullWalkReason> {
        let mut untrusted = self.walk_next.take();
        if untrusted.is_none() && self.last_full_walk.elapsed() >= FULL_WALK_INTERVAL {
            untrusted = Some(FullWalkReason::Periodic);
        }
        let mut plan = Plan::default();
        let mut names = Names::default();
        let mut buf = vec![MaybeUninit::<u8>::uninit(); EVENT_BUFFER_BYTES];
        let Self { fd, dirs, wds, .. } = self;
        let Some(fd) = fd.as_deref() else {
            return Err(untrusted.unwrap_or(FullWalkReason::NoInotify));
        };
        let mut reader = inotify::Reader::new(fd, &mut buf);
        let mut count = 0usize;
        // Even when the events will not be used, the queue is emptied: what they report is
        // covered by the walk that follows.
        loop {
            let event = match reader.next() {
                Ok(event) => event,
                Err(Errno::AGAIN) => break,
                Err(Errno::INTR) => continue,
                Err(_) => {
                    untrusted.get_or_insert(FullWalkReason::EventsLost);
                    break;
                }
            };
            count += 1;
            if count > MAX_EVENTS {
                untrusted.get_or_insert(FullWalkReason::EventsLost);
                break;
            }
            let mask = event.events();
            if mask.contains(ReadFlags::QUEUE_OVERFLOW) {
                untrusted.get_or_insert(FullWalkReason::EventsLost);
                continue;
            }
            if untrusted.is_some() {
                continue;
            }
            let wd = event.wd();
            // Not mapped: a watch forgotten (its directory went away, or is watched under a new
            // path); whatever it reports is seen from the directory's current parent.
            if !dirs.contains_key(&wd) {
                continue;
            }
            if mask.contains(ReadFlags::UNMOUNT) {
                untrusted = Some(FullWalkReason::Unwatched);
                continue;
            }
            if mask.contains(ReadFlags::DELETE_SELF) {
                names.deleted_dirs.insert(wd);
                continue;
            }
            if mask.contains(ReadFlags::IGNORED) {
                // The watch went away: its directory was deleted (its parent reports that too),
                // or is still there, unwatched for a while (a filesystem unmounted).
                if !names.deleted_dirs.contains(&wd) {
                    untrusted = Some(FullWalkReason::Unwatched);
                    continue;
                }
                if let Some(path) = dirs.remove(&wd) {
                    if wds.get(&path) == Some(&wd) {
                        wds.remove(&path);
                    }
                    if path.is_empty() {
                        untrusted = Some(FullWalkReason::Unwatched);
                        continue;
                    }
                    let (parent, name) = split(&path);
                    plan.touch(parent, name, true);
                }
                continue;
            }
            // Events on the directory itself (attributes, moved) need nothing more: its parent
            // reports the name moved.
            let (Some(dir), Some(name)) = (dirs.get(&wd), event.file_name()) else {
                continue;
            };
            let name = name.to_bytes();
            let structural = mask.intersects(STRUCTURAL);
            if structural
                && let Err(reason) = names.follow(entries, dir, name, mask, event.cookie())
            {
                untrusted = Some(reason);
                continue;
            }
            plan.touch(dir, name, structural && mask.contains(ReadFlags::ISDIR));
        }
        if untrusted.is_none() {
            untrusted = names.finish().err();
        }
        if let Some(reason) = untrusted {
            return Err(reason);
        }
        for key in std::mem::take(&mut self.recheck) {
            let (dir, name) = split(&key);
            plan.touch(dir, name, false);
            plan.carried.push(key);
        }
        Ok(plan)
    }
}

/// What may hold a name, as far as the events read so far tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Occupant {
    /// What the previous scan recorded there (a file whose other links, if any, are inspected
    /// at every rescan), nothing since a deletion, or a file moved from such a name.
    Known,
    /// Something the previous scan did not record (nothing then, or not a file or symlink).
    Unrecorded,
    /// Made since (`IN_CREATE`, or moved from a name that was not [`Occupant::Known`]): a new
    /// file, or a hard link to a file anywhere in the workspace.
    Fresh,
}

/// Follows the names made, deleted and moved while the events are read, to tell when something
/// may have happened that no event reports: a file written through a hard link that was made
/// and removed since the previous scan (the link count is the file's own attribute: its
/// directory hears nothing), or anything done in a new directory before it was watched.
#[derive(Debug, Default)]
struct Names {
    occupants: HashMap<Key, Occupant>,
    /// Files being moved, by cookie: whether what moved was [`Occupant::Known`].
    moving: HashMap<u32, bool>,
    /// Directories being moved (within the watched tree), by cookie.
    moving_dirs: BTreeSet<u32>,
    /// Watches whose directory was deleted (`IN_DELETE_SELF`).
    deleted_dirs: BTreeSet<i32>,
}

impl Names {
    fn follow(
        &mut self,
        entries: &BTreeMap<Key, Record>,
        dir: &[u8],
        name: &[u8],
        mask: ReadFlags,
        cookie: u32,
    ) -> Result<(), FullWalkReason> {
        if mask.contains(ReadFlags::ISDIR) {
            // A directory made here was not watched until now: anything could have happened in
            // it, a hard link made and removed included. One moved from elsewhere in the tree
            // was watched all along.
            if mask.contains(ReadFlags::CREATE) {
                return Err(FullWalkReason::NewDirectory);
            }
            if mask.contains(ReadFlags::MOVED_FROM) {
                self.moving_dirs.insert(cookie);
            }
            if mask.contains(ReadFlags::MOVED_TO) && !self.moving_dirs.remove(&cookie) {
                return Err(FullWalkReason::NewDirectory);
            }
            return Ok(());
        }
        let path: Key = join(dir, name).into();
        let occupant = self.occupants.get(&path).copied().unwrap_or_else(|| {
            if entries.contains_key(&path) {
                Occupant::Known
            } else {
                Occupant::Unrecorded
            }
        });
        if mask.contains(ReadFlags::CREATE) {
            self.occupants.insert(path, Occupant::Fresh);
        } else if mask.contains(ReadFlags::DELETE) {
            if occupant != Occupant::Known {
                return Err(FullWalkReason::TransientFile);
            }
            self.occupants.insert(path, Occupant::Known);
        } else if mask.contains(ReadFlags::MOVED_FROM) {
            self.moving.insert(cookie, occupant == Occupant::Known);
            self.occupants.insert(path, Occupant::Known);
        } else if mask.contains(ReadFlags::MOVED_TO) {
            // Replaced: what was made here lost this name.
            if occupant == Occupant::Fresh {
                return Err(FullWalkReason::TransientFile);
            }
            let known = self.moving.remove(&cookie) == Some(true);
            let occupant = if known {
                Occupant::Known
            } else {
                Occupant::Fresh
            };
            self.occupants.insert(path, occupant);
        }
        Ok(())
    }

    /// After the last event: a file moved out of the watched tree may have been a link.
    fn finish(self) -> Result<(), FullWalkReason> {
        if self.moving.values().any(|known| !known) {
            return Err(FullWalkReason::TransientFile);
        }
        Ok(())
    }
}

/// An entry's path from its directory's and its name.
fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(dir.len() + 1 + name.len());
    if !dir.is_empty() {
        path.extend_from_slice(dir);
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// The directory and the name of an entry's path.
fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(slash) => (&path[..slash], &path[slash + 1..]),
        None => (&[], path),
    }
}

/// The bounds of the keys below the directory `dir` (not the root): from `dir/` to `dir0`.
fn subtree_bounds(dir: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut start = dir.to_vec();
    start.push(b'/');
    let mut end = dir.to_vec();
    end.push(b'/' + 1);
    (start, end)
}

/// Whether `path` is one of the directories walked, or below one.
fn within(walked: &BTreeSet<Key>, path: &[u8]) -> bool {
    !walked.is_empty()
        && (walked.contains(path)
            || path
                .iter()
                .enumerate()
                .any(|(i, &b)| b == b'/' && walked.contains(&path[..i])))
}

/// How a rescan proceeds.
enum Mode {
    /// Inspect what the events say.
    Events(Plan),
    /// Walk everything, from the root's listing.
    Full(FullWalkReason, Vec<Entry>),
}

impl Snapshot {
    /// The baseline of the workspace as it is now (every regular file hashed, every directory
    /// watched), with an inotify instance of its own and no budget. Reports nothing.
    pub fn capture(ws: &Workspace) -> Result<Self, JailError> {
        Self::capture_within(
            ws,
            Some(&InotifyPool::unlimited()),
            &ScanBudget::unlimited(0),
        )
    }

    /// [`Snapshot::capture`] with its inotify instance from `pool` (`None`: without inotify)
    /// and within `budget`'s hash and time budgets: a file beyond them is recorded by its
    /// metadata only, and a later change to it is found when its metadata changes.
    pub fn capture_within(
        ws: &Workspace,
        pool: Option<&Arc<InotifyPool>>,
        budget: &ScanBudget,
    ) -> Result<Self, JailError> {
        let mut snapshot = Self {
            pool: pool.cloned(),
            ..Self::default()
        };
        snapshot.scan(ws, budget, false)?;
        Ok(snapshot)
    }

    /// Finds what changed since the last capture or rescan (from the inotify events, or by
    /// walking the workspace again), returns it, and becomes the new baseline. The contents of
    /// created and modified files (and the target text of symlinks) are returned in
    /// [`RecordedChange::after`] when there are at most `keep_up_to` bytes of them. No other
    /// budget: see [`Snapshot::rescan_within`].
    pub fn rescan(&mut self, ws: &Workspace, keep_up_to: usize) -> Result<ScanReport, JailError> {
        self.scan(ws, &ScanBudget::unlimited(keep_up_to), true)
    }

    /// [`Snapshot::rescan`] within a budget for what it keeps, hashes and how long it hashes;
    /// every file beyond is still reported, by hash and size or by its metadata only, with
    /// [`FileChange::after_unstored`] saying why.
    pub fn rescan_within(
        &mut self,
        ws: &Workspace,
        budget: &ScanBudget,
    ) -> Result<ScanReport, JailError> {
        self.scan(ws, budget, true)
    }

    /// How many regular files and symlinks the snapshot holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// What the snapshot holds, path by path (raw bytes, in byte order): what the workspace
    /// looked like at its last scan.
    pub fn entries(&self) -> impl Iterator<Item = (&[u8], SeenEntry<'_>)> {
        self.entries.iter().map(|(key, record)| {
            let seen = match &record.content {
                Content::File { sha256, size } => SeenEntry::File {
                    sha256: Some(hex::encode(sha256)),
                    size: *size,
                    mode: record.meta.mode & 0o7777,
                },
                Content::Unread(_) => SeenEntry::File {
                    sha256: None,
                    size: record.meta.size,
                    mode: record.meta.mode & 0o7777,
                },
                Content::Symlink { target, .. } => SeenEntry::Symlink { target },
            };
            (&key[..], seen)
        })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether the snapshot watches the workspace with inotify (its rescans inspect what the
    /// events name rather than walk everything).
    pub fn is_watching(&self) -> bool {
        self.watcher.is_some()
    }

    /// A scan with the inotify instance taken from the pool for its duration (a snapshot without
    /// one asks for one first), given back at its end.
    fn scan(
        &mut self,
        ws: &Workspace,
        budget: &ScanBudget,
        report: bool,
    ) -> Result<ScanReport, JailError> {
        self.attach_watcher();
        let scanned = self.scan_attached(ws, budget, report);
        if let Some(watcher) = self.watcher.as_mut() {
            watcher.detach();
        }
        scanned
    }

    fn attach_watcher(&mut self) {
        if let Some(watcher) = self.watcher.as_mut() {
            if watcher.attach() {
                return;
            }
            // Closed by the pool for another session, with all its watches: this scan walks,
            // and watches again if an instance can be had.
            self.watcher = None;
            self.unwatched = Some((FullWalkReason::InotifyReclaimed, None));
        }
        let Some(pool) = self.pool.as_ref() else {
            return;
        };
        let (reason, retry_at) = self.unwatched.unwrap_or((FullWalkReason::NoInotify, None));
        if retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        match Watcher::open(pool, reason) {
            Ok(watcher) => {
                self.watcher = Some(watcher);
                self.unwatched = None;
            }
            // Every instance of the pool is in use: the next scan asks again (it costs a lock).
            Err(Refused::Full) => self.unwatched = Some((reason, retry_at)),
            Err(Refused::Kernel(e)) => {
                tracing::warn!(
                    error = %e,
                    "inotify is unavailable (fs.inotify.max_user_instances?): rescans of this workspace walk all of it for a while"
                );
                let retry_at = Instant::now().checked_add(FULL_WALK_INTERVAL);
                self.unwatched = Some((FullWalkReason::NoInotify, retry_at));
            }
        }
    }

    /// Updates the records in place: an unchanged entry costs nothing (events) or one `statat`
    /// and one lookup (a walk), no allocation. Entries looked for and not found are deleted.
    /// `report`: whether changes are reported (a rescan) or not (a capture, which keeps no
    /// contents).
    fn scan_attached(
        &mut self,
        ws: &Workspace,
        budget: &ScanBudget,
        report: bool,
    ) -> Result<ScanReport, JailError> {
        let started_ns = now_ns();
        let deadline = Instant::now().checked_add(budget.time);
        // The root is the one thing that must work; nothing is changed before it does.
        let root = ws.open_dir_exact(b"")?;
        if root.stat()?.nlink == 0 {
            return Err(JailError::NotFound {
                path: root.path().to_owned(),
            });
        }
        // The events are read before anything is inspected: a change made after an inspection
        // started queues an event for the next rescan.
        let drained = match self.watcher.as_mut() {
            Some(watcher) => watcher.drain(&self.entries),
            None => {
                let (reason, retry_at) =
                    self.unwatched.unwrap_or((FullWalkReason::NoInotify, None));
                // Reported once: later walks without a watcher are for having none.
                self.unwatched = Some((FullWalkReason::NoInotify, retry_at));
                Err(reason)
            }
        };
        let mode = match drained {
            Ok(plan) => Mode::Events(plan),
            Err(reason) => {
                if let Some(watcher) = self.watcher.as_mut() {
                    // Every directory is watched again as the walk finds it (a watched one keeps
                    // its watch); the watches not found again are removed at the end.
                    watcher.forget_all();
                    watcher.watch(&root, b"");
                }
                match root.entries() {
                    Ok(entries) => Mode::Full(reason, entries),
                    Err(e) => {
                        if let Some(watcher) = self.watcher.as_mut() {
                            watcher.walk_next = Some(reason);
                        }
                        return Err(e);
                    }
                }
            }
        };
        self.generation += 1;
        let mut walk = Walk {
            ws,
            entries: &mut self.entries,
            generation: self.generation,
            previous_started_ns: self.started_ns,
            started_ns,
            report,
            keep_up_to: budget.keep_up_to,
            content_left: budget.content_bytes,
            hash_left: budget.hash_bytes,
            deadline,
            kept: BinaryHeap::new(),
            changes: Vec::new(),
            hashed: 0,
            hashed_bytes: 0,
            path: Vec::new(),
            watcher: self.watcher.as_mut(),
            walk_next: None,
            new_link: false,
            recheck: Vec::new(),
            deferred: Vec::new(),
            sweep_keys: Vec::new(),
            sweep_below: Vec::new(),
        };
        let (full_walk, carried) = match mode {
            Mode::Full(reason, root_entries) => {
                walk.full(&root, &root_entries);
                (Some(reason), Vec::new())
            }
            Mode::Events(plan) => {
                let carried = walk.incremental(plan);
                // A file gained a link: its other names may be anywhere in the workspace, and
                // nothing told their directories (the link count is the file's own attribute).
                let full =
                    (walk.new_link && walk.full_again(&root)).then_some(FullWalkReason::HardLink);
                (full, carried)
            }
        };
        walk.reread_deferred();
        let Walk {
            mut changes,
            hashed,
            hashed_bytes,
            walk_next,
            recheck,
            sweep_keys,
            sweep_below,
            ..
        } = walk;
        let generation = self.generation;
        let mut deleted = |key: &[u8], record: &Record| {
            if report {
                let gone = change(FileChangeKind::Deleted, key, Some(record), None, Err(None));
                changes.push((key.into(), gone));
            }
        };
        if full_walk.is_some() {
            self.entries.retain(|key, record| {
                let seen = record.seen == generation;
                if !seen {
                    deleted(key, record);
                }
                seen
            });
        } else {
            // Only where the events led: the names inspected, and below the directories that
            // went away or were walked again.
            let mut gone: Vec<Key> = sweep_keys
                .into_iter()
                .filter(|key| self.entries.get(key).is_some_and(|r| r.seen != generation))
                .collect();
            for dir in sweep_below {
                let (start, end) = subtree_bounds(&dir);
                gone.extend(
                    self.entries
                        .range::<[u8], _>((Bound::Included(&start[..]), Bound::Excluded(&end[..])))
                        .filter(|(_, record)| record.seen != generation)
                        .map(|(key, _)| key.clone()),
                );
            }
            for key in gone {
                if let Some(record) = self.entries.remove(&key) {
                    deleted(&key, &record);
                }
            }
        }
        if let Some(watcher) = self.watcher.as_mut() {
            if watcher.failed {
                // Closing the instance frees its watches (for other sessions). Watching again
                // means adding every watch again: not before the next periodic walk.
                self.watcher = None;
                let retry_at = Instant::now().checked_add(FULL_WALK_INTERVAL);
                self.unwatched = Some((FullWalkReason::NoInotify, retry_at));
            } else {
                watcher.release_orphans();
                let entries = &self.entries;
                let mut next: BTreeSet<Key> = recheck
                    .into_iter()
                    .filter(|key| entries.contains_key(key))
                    .collect();
                // Those this rescan could not get to (their directory could not be opened).
                next.extend(
                    carried
                        .into_iter()
                        .filter(|key| entries.get(key).is_some_and(|r| r.seen != generation)),
                );
                watcher.recheck = next;
                watcher.walk_next = walk_next;
                if full_walk.is_some() {
                    watcher.last_full_walk = Instant::now();
                }
            }
        }
        self.started_ns = started_ns;
        // Byte order of the raw paths.
        changes.sort_by(|a, b| a.0.cmp(&b.0));
        let changes: Vec<RecordedChange> = changes.into_iter().map(|(_, c)| c).collect();
        let kept_bytes = changes
            .iter()
            .filter_map(|c| c.after.as_ref())
            .map(|after| after.len() as u64)
            .sum();
        Ok(ScanReport {
            changes,
            files: self.entries.len(),
            hashed,
            hashed_bytes,
            kept_bytes,
            full_walk,
        })
    }
}

/// One scan of the workspace, updating the records of the previous scan.
struct Walk<'a> {
    ws: &'a Workspace,
    entries: &'a mut BTreeMap<Key, Record>,
    /// Records seen by this scan carry this generation; those looked for and not seen are
    /// deleted after it.
    generation: u64,
    /// When the previous scan started (for the racy check).
    previous_started_ns: i128,
    /// When this scan started (which entries the next rescan inspects anyway).
    started_ns: i128,
    /// Whether changes are reported; a capture reports none and keeps no contents.
    report: bool,
    /// The budget ([`ScanBudget`]): the largest file whose contents are kept, what is left of
    /// the contents and hash budgets, and when hashing stops.
    keep_up_to: usize,
    content_left: u64,
    hash_left: u64,
    deadline: Option<Instant>,
    /// The changes whose contents are kept, largest first: (bytes, index in `changes`).
    kept: BinaryHeap<(usize, usize)>,
    /// The changes found, with their raw paths (the order of the report).
    changes: Vec<(Key, RecordedChange)>,
    hashed: usize,
    hashed_bytes: u64,
    /// The path of the entry being visited (reused between entries).
    path: Vec<u8>,
    /// Where the directories walked are watched.
    watcher: Option<&'a mut Watcher>,
    /// Why the next rescan must walk everything.
    walk_next: Option<FullWalkReason>,
    /// A file was seen with more than one link at a name that had not recorded that file with
    /// more than one link.
    new_link: bool,
    /// Entries the next rescan inspects anyway.
    recheck: Vec<Key>,
    /// Racily clean files, read at the end of the scan ([`Walk::reread_deferred`]).
    deferred: Vec<Key>,
    /// From events: names inspected and directories walked or gone, below which records not
    /// seen by this scan are deleted.
    sweep_keys: Vec<Key>,
    sweep_below: Vec<Key>,
}

impl Walk<'_> {
    /// Everything, from the root (watched, then listed, by the caller).
    fn full(&mut self, root: &WorkspaceDir, root_entries: &[Entry]) {
        let mut pending = Vec::new();
        self.visit_dir(root, b"", root_entries, &mut pending);
        self.walk(pending);
    }

    /// After events, the whole workspace again, in the same generation: what the events led to
    /// is not inspected twice. False if the root cannot be listed (the next rescan walks).
    fn full_again(&mut self, root: &WorkspaceDir) -> bool {
        if let Some(watcher) = self.watcher.as_deref_mut() {
            watcher.forget_all();
        }
        self.watch(root, b"");
        match root.entries() {
            Ok(entries) => {
                self.full(root, &entries);
                true
            }
            Err(_) => {
                self.walk_next = Some(FullWalkReason::HardLink);
                false
            }
        }
    }

    /// Depth first, one open directory at a time: each directory is opened by its path from the
    /// root with no symlink allowed on the way, so deep trees cost no descriptors. Each is
    /// watched before it is listed: a change after the listing queues an event.
    fn walk(&mut self, mut pending: Vec<Vec<u8>>) {
        while let Some(dir_path) = pending.pop() {
            let dir = match self.ws.open_dir_exact(&dir_path) {
                Ok(dir) => dir,
                // Removed, or replaced by a symlink or a file, since its parent was listed: what
                // it held is gone (the entry itself is seen by the next rescan).
                Err(
                    JailError::NotFound { .. }
                    | JailError::NotADirectory { .. }
                    | JailError::SymlinkLoop { .. },
                ) => continue,
                Err(_) => {
                    self.unwalkable(&dir_path);
                    continue;
                }
            };
            self.watch(&dir, &dir_path);
            match dir.entries() {
                Ok(entries) => self.visit_dir(&dir, &dir_path, &entries, &mut pending),
                Err(_) => self.unwalkable(&dir_path),
            }
        }
    }

    /// A directory that could not be opened or listed keeps its records, and is not watched:
    /// the next rescan walks everything.
    fn unwalkable(&mut self, dir_path: &[u8]) {
        self.keep_below(dir_path);
        self.walk_next.get_or_insert(FullWalkReason::Unwatched);
    }

    fn watch(&mut self, dir: &WorkspaceDir, path: &[u8]) {
        if let Some(watcher) = self.watcher.as_deref_mut() {
            watcher.watch(dir, path);
        }
    }

    /// What the events name, by directory (parents before children).
    fn incremental(&mut self, plan: Plan) -> Vec<Key> {
        let mut walked: BTreeSet<Key> = BTreeSet::new();
        for (dir_path, names) in plan.dirs {
            if within(&walked, &dir_path) {
                continue;
            }
            let dir = match self.ws.open_dir_exact(&dir_path) {
                Ok(dir) => dir,
                // Gone since (or never there: a stale path): its parent's events say what
                // became of it, at this rescan or the next.
                Err(
                    JailError::NotFound { .. }
                    | JailError::NotADirectory { .. }
                    | JailError::SymlinkLoop { .. },
                ) => continue,
                Err(_) => {
                    self.walk_next.get_or_insert(FullWalkReason::Unwatched);
                    continue;
                }
            };
            for (name, structural) in names {
                self.path = join(&dir_path, &name);
                self.inspect(&dir, &name, structural, &mut walked);
            }
        }
        plan.carried
    }

    /// Looks at the name `name` of `dir` (at `self.path`) as it is now. `structural`: a
    /// directory was created, deleted or moved at the name, so what is below it is looked at
    /// again.
    fn inspect(
        &mut self,
        dir: &WorkspaceDir,
        name: &[u8],
        structural: bool,
        walked: &mut BTreeSet<Key>,
    ) {
        let path: Key = self.path.as_slice().into();
        let watched = self
            .watcher
            .as_deref()
            .is_some_and(|w| w.wds.contains_key(&path));
        // Whatever is found, a record at the name that is not seen again is gone.
        self.sweep_keys.push(path.clone());
        match dir.child(name) {
            Ok((entry, st)) => match st.kind {
                EntryKind::File | EntryKind::Symlink => {
                    if watched || structural {
                        self.forget_below(&path);
                    }
                    self.visit_entry(dir, &entry, &st);
                }
                // A known directory whose name did not change: its own watch reports what
                // happens in it.
                EntryKind::Dir if watched && !structural => {}
                EntryKind::Dir => {
                    self.forget_below(&path);
                    if path.len() < MAX_PATH_BYTES {
                        self.walk(vec![path.to_vec()]);
                        walked.insert(path);
                    } else {
                        self.keep_below(&path);
                        self.walk_next.get_or_insert(FullWalkReason::Unwatched);
                    }
                }
                EntryKind::Other => {
                    if watched || structural {
                        self.forget_below(&path);
                    }
                }
            },
            Err(JailError::NotFound { .. }) => {
                if watched || structural {
                    self.forget_below(&path);
                }
            }
            Err(_) => self.keep(),
        }
    }

    /// The directory at `path` is gone or is to be walked again: its watches are forgotten, and
    /// the records below it not seen again by this scan are deleted.
    fn forget_below(&mut self, path: &[u8]) {
        if let Some(watcher) = self.watcher.as_deref_mut() {
            watcher.forget_below(path);
        }
        self.sweep_below.push(path.into());
    }

    fn visit_dir(
        &mut self,
        dir: &WorkspaceDir,
        dir_path: &[u8],
        entries: &[Entry],
        pending: &mut Vec<Vec<u8>>,
    ) {
        for entry in entries {
            self.path.clear();
            if !dir_path.is_empty() {
                self.path.extend_from_slice(dir_path);
                self.path.push(b'/');
            }
            self.path.extend_from_slice(entry.name_bytes());
            let st = match dir.stat_child(entry) {
                Ok(st) => st,
                Err(JailError::NotFound { .. }) => continue,
                Err(_) => {
                    self.keep();
                    continue;
                }
            };
            match st.kind {
                EntryKind::Dir if self.path.len() < MAX_PATH_BYTES => {
                    pending.push(self.path.clone());
                }
                // Too deep to open by path: what is below stays as the last scan saw it. It is
                // not watched either: a hard link could be made, written through and removed
                // there unnoticed, so rescans walk while it is there.
                EntryKind::Dir => {
                    let path = std::mem::take(&mut self.path);
                    self.keep_below(&path);
                    self.path = path;
                    self.walk_next.get_or_insert(FullWalkReason::Unwatched);
                }
                EntryKind::File | EntryKind::Symlink => self.visit_entry(dir, entry, &st),
                EntryKind::Other => {}
            }
        }
    }

    /// Records the file or symlink at `self.path`, reading it only if its metadata changed (or
    /// cannot be trusted yet).
    fn visit_entry(&mut self, dir: &WorkspaceDir, entry: &Entry, st: &ChildStat) {
        let meta = Meta::from(st);
        if let Some(old) = self.entries.get_mut(self.path.as_slice()) {
            // Inspected by this scan already (a walk after the events): any later change
            // queued an event for the next rescan.
            if old.seen == self.generation {
                return;
            }
            // An unread file is compared by its metadata alone: reading it again because its
            // timestamps are racy would find nothing to compare its contents with.
            let unread = matches!(old.content, Content::Unread(_));
            if old.meta == meta && (unread || !old.meta.racy(self.previous_started_ns)) {
                old.seen = self.generation;
                if meta.recheck(self.started_ns) {
                    self.recheck.push(self.path.as_slice().into());
                }
                return;
            }
            // Racily clean: read again, but after every entry whose metadata changed, so that
            // files most likely unchanged never take the budget of files that did change.
            if old.meta == meta && st.kind == EntryKind::File {
                old.seen = self.generation;
                self.deferred.push(self.path.as_slice().into());
                return;
            }
        }
        if st.nlink > 1
            && !self.entries.get(self.path.as_slice()).is_some_and(|old| {
                old.meta.nlink > 1 && (old.meta.dev, old.meta.ino) == (st.dev, st.ino)
            })
        {
            self.new_link = true;
        }
        self.record(dir, entry, st);
    }

    /// Reads the file or symlink at `self.path` and records it, reporting a change.
    fn record(&mut self, dir: &WorkspaceDir, entry: &Entry, st: &ChildStat) {
        // Only a file whose metadata changed may take the place of contents kept before it: one
        // read again because its timestamps are racy has most likely not changed.
        let changed = self
            .entries
            .get(self.path.as_slice())
            .is_none_or(|old| old.meta != Meta::from(st));
        let Some((record, after)) = self.read(dir, entry, st, changed) else {
            return;
        };
        if record.meta.recheck(self.started_ns) {
            self.recheck.push(self.path.as_slice().into());
        }
        let key: Key = self.path.as_slice().into();
        match self.entries.get(&key) {
            // A chmod alone is a change too: a rebuild restores modes.
            Some(old) if old.same_contents(&record) && old.perm() == record.perm() => {
                self.unkeep(after)
            }
            // Read again only because its timestamps were racy, and not to the end within the
            // budget: nothing says it changed. From now on it is followed by its metadata.
            Some(_) if !changed && matches!(record.content, Content::Unread(_)) => {}
            Some(old) => {
                let modified = change(
                    FileChangeKind::Modified,
                    &key,
                    Some(old),
                    Some(&record),
                    after.map_err(Some),
                );
                self.push_change(key.clone(), modified);
            }
            None => {
                let created = change(
                    FileChangeKind::Created,
                    &key,
                    None,
                    Some(&record),
                    after.map_err(Some),
                );
                self.push_change(key.clone(), created);
            }
        }
        self.entries.insert(key, record);
    }

    /// Reads the racily clean files put off by [`Walk::visit_entry`], with what is left of the
    /// budget.
    fn reread_deferred(&mut self) {
        let mut by_dir: BTreeMap<Key, Vec<Key>> = BTreeMap::new();
        for key in std::mem::take(&mut self.deferred) {
            let (dir, name) = split(&key);
            by_dir.entry(dir.into()).or_default().push(name.into());
        }
        for (dir_path, names) in by_dir {
            let dir = self.ws.open_dir_exact(&dir_path).ok();
            for name in names {
                self.path = join(&dir_path, &name);
                let found = dir
                    .as_ref()
                    .and_then(|dir| dir.child(&name).ok().map(|(entry, st)| (dir, entry, st)));
                match found {
                    Some((dir, entry, st)) if st.kind == EntryKind::File => {
                        self.record(dir, &entry, &st);
                    }
                    // Gone or changed since it was seen: the change queued an event, and the
                    // record is looked at again next time in any case.
                    _ => self.recheck.push(self.path.as_slice().into()),
                }
            }
        }
    }

    /// Reports a change (a rescan), remembering where contents are kept.
    fn push_change(&mut self, key: Key, change: RecordedChange) {
        if !self.report {
            return;
        }
        if let Some(after) = &change.after {
            self.kept.push((after.len(), self.changes.len()));
        }
        self.changes.push((key, change));
    }

    /// Contents read but not reported (the file's contents did not change): back to the budget.
    fn unkeep(&mut self, after: After) {
        if let Ok(bytes) = after {
            self.content_left = self.content_left.saturating_add(bytes.len() as u64);
        }
    }

    /// How many bytes of a file of `size` bytes may be kept, making room (if `evict`) by dropping
    /// the contents of larger files kept before it (so that the budget keeps the small files,
    /// and as many of them as it can); the reason when none.
    fn allowance(&mut self, size: u64, evict: bool) -> Result<usize, UnstoredReason> {
        if !self.report || size > self.keep_up_to as u64 {
            return Err(UnstoredReason::TooLarge);
        }
        while self.content_left < size {
            match self.kept.peek() {
                Some(&(largest, _)) if evict && largest as u64 > size => {}
                _ => return Err(UnstoredReason::ContentBudget),
            }
            if let Some((_, index)) = self.kept.pop()
                && let Some((_, dropped)) = self.changes.get_mut(index)
                && let Some(bytes) = dropped.after.take()
            {
                dropped.change.after_stored = false;
                dropped.change.after_unstored = Some(UnstoredReason::ContentBudget);
                self.content_left = self.content_left.saturating_add(bytes.len() as u64);
            }
        }
        // Room for the file as it is now; a file grown since its `stat` is kept if it still fits.
        Ok(usize::try_from(self.content_left)
            .unwrap_or(usize::MAX)
            .min(self.keep_up_to))
    }

    fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }
    /// Reads an entry whose metadata changed (or cannot be trusted yet). `None` when it vanished
    /// (then it is deleted) or changed type since its `stat` (then its previous record is kept,
    /// and the next rescan looks again: its metadata differs). `evict`: whether its contents may
    /// take the place of contents kept before it.
    fn read(
        &mut self,
        dir: &WorkspaceDir,
        entry: &Entry,
        st: &ChildStat,
        evict: bool,
    ) -> Option<(Record, After)> {
        let meta = Meta::from(st);
        let seen = self.generation;
        let unread = |meta, why| {
            let record = Record {
                meta,
                content: Content::Unread(why),
                seen,
            };
            Some((record, Err(why)))
        };
        if st.kind == EntryKind::Symlink {
            // A target is at most `PATH_MAX` bytes, read with one system call: symlinks are
            // read whatever is left of the hash and time budgets.
            return match dir.link_target(entry) {
                Ok(target) => {
                    self.hashed += 1;
                    let sha256 = sha256_bytes(&target);
                    let after = match self.allowance(target.len() as u64, evict) {
                        Ok(room) if target.len() <= room => {
                            self.content_left -= target.len() as u64;
                            Ok(target.clone())
                        }
                        Ok(_) => Err(UnstoredReason::ContentBudget),
                        Err(why) => Err(why),
                    };
                    let content = Content::Symlink {
                        target: target.into_boxed_slice(),
                        sha256,
                    };
                    Some((
                        Record {
                            meta,
                            content,
                            seen,
                        },
                        after,
                    ))
                }
                Err(JailError::NotFound { .. }) => None,
                Err(_) => {
                    self.keep();
                    None
                }
            };
        }
        // Never opened: a hard link may lead out of the workspace.
        if st.nlink > 1 {
            return unread(meta, UnstoredReason::HardLink);
        }
        if st.size > MAX_HASH_BYTES {
            return unread(meta, UnstoredReason::TooLargeToHash);
        }
        if self.past_deadline() {
            return unread(meta, UnstoredReason::TimeBudget);
        }
        if st.size > self.hash_left {
            return unread(meta, UnstoredReason::HashBudget);
        }
        let allowance = self.allowance(st.size, evict);
        let keep = allowance.unwrap_or(0);
        let max_bytes = MAX_HASH_BYTES.min(self.hash_left);
        match dir.hash_child(entry, keep, max_bytes, self.deadline) {
            Ok(hashed) => {
                self.hashed += 1;
                self.hashed_bytes += hashed.size;
                self.hash_left = self.hash_left.saturating_sub(hashed.size);
                let after = match hashed.kept {
                    Some(bytes) => {
                        self.content_left = self.content_left.saturating_sub(bytes.len() as u64);
                        Ok(bytes)
                    }
                    None if hashed.size > self.keep_up_to as u64 => Err(UnstoredReason::TooLarge),
                    None => Err(allowance.err().unwrap_or(UnstoredReason::ContentBudget)),
                };
                let content = Content::File {
                    sha256: sha256_from_hex(&hashed.sha256),
                    size: hashed.size,
                };
                let meta = Meta::from(&hashed.stat);
                Some((
                    Record {
                        meta,
                        content,
                        seen,
                    },
                    after,
                ))
            }
            Err(JailError::NotFound { .. }) => None,
            // Hard-linked or grown past a limit since the stat, out of time, or unreadable
            // (permissions).
            Err(JailError::HardLink { .. }) => unread(meta, UnstoredReason::HardLink),
            Err(JailError::TooLarge { size, .. }) if size > MAX_HASH_BYTES => {
                unread(meta, UnstoredReason::TooLargeToHash)
            }
            Err(JailError::TooLarge { .. }) => unread(meta, UnstoredReason::HashBudget),
            Err(JailError::Io { source, .. }) if source.kind() == std::io::ErrorKind::TimedOut => {
                unread(meta, UnstoredReason::TimeBudget)
            }
            Err(JailError::Io { .. }) => unread(meta, UnstoredReason::Unreadable),
            // Not a regular file any more.
            Err(_) => {
                self.keep();
                None
            }
        }
    }

    /// Keeps the previous record of the entry at `self.path`, which could not be inspected (the
    /// next rescan tries again).
    fn keep(&mut self) {
        if let Some(old) = self.entries.get_mut(self.path.as_slice()) {
            old.seen = self.generation;
            self.recheck.push(self.path.as_slice().into());
        }
    }

    /// Keeps the previous records below a directory that could not be walked.
    fn keep_below(&mut self, dir: &[u8]) {
        let (start, end) = subtree_bounds(dir);
        let range = (Bound::Included(&start[..]), Bound::Excluded(&end[..]));
        for (_, record) in self.entries.range_mut::<[u8], _>(range) {
            record.seen = self.generation;
        }
    }
}

/// The contents of a file after a change, or why they are not kept.
type After = Result<Vec<u8>, UnstoredReason>;

/// A change of the entry at `key`, from `before` to `after` (`contents`: `Err(None)` for a
/// deletion).
fn change(
    kind: FileChangeKind,
    key: &[u8],
    before: Option<&Record>,
    after: Option<&Record>,
    contents: Result<Vec<u8>, Option<UnstoredReason>>,
) -> RecordedChange {
    let (contents, unstored) = match contents {
        Ok(bytes) => (Some(bytes), None),
        Err(why) => (None, why),
    };
    let path = RecordedName::new(key);
    let target = after
        .and_then(Record::symlink_target)
        .map(RecordedName::new);
    RecordedChange {
        change: FileChange {
            kind,
            path: path.display,
            path_b64: path.base64,
            before_sha256: before.and_then(Record::sha256),
            after_sha256: after.and_then(Record::sha256),
            before_size: before.map(Record::size),
            after_size: after.map(Record::size),
            after_stored: contents.is_some(),
            after_unstored: after.and(unstored),
            after_mode: after.and_then(Record::perm),
            capability: Capability::Process,
            symlink_target: target.as_ref().map(|t| t.display.clone()),
            symlink_target_b64: target.and_then(|t| t.base64),
        },
        after: contents,
    }
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX))
}

fn sha256_bytes(bytes: &[u8]) -> Sha {
    sha256_from_hex(&sha256_hex(bytes))
}

fn sha256_from_hex(hex_digest: &str) -> Sha {
    let mut sha = [0u8; 32];
    // The jail's hashes are always 64 hex digits.
    let _ = hex::decode_to_slice(hex_digest, &mut sha);
    sha
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests build their fixtures on the host"
)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use super::*;

    struct Fixture {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        outside: PathBuf,
        ws: Workspace,
    }

    impl Fixture {
        fn new() -> Self {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path().join("ws");
            let outside = tmp.path().join("outside");
            fs::create_dir_all(&outside).unwrap();
            fs::write(outside.join("secret"), SECRET).unwrap();
            let ws = Workspace::create(&root).unwrap();
            Self {
                _tmp: tmp,
                root,
                outside,
                ws,
            }
        }

        fn path(&self, rel: &str) -> PathBuf {
            self.root.join(rel)
        }

        fn write(&self, rel: &str, contents: &[u8]) {
            let path = self.path(rel);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, contents).unwrap();
        }

        fn rescan(&self, snapshot: &mut Snapshot) -> ScanReport {
            snapshot.rescan(&self.ws, 1024).unwrap()
        }
    }

    const SECRET: &[u8] = b"TOP SECRET: outside the workspace\n";

    fn kinds(report: &ScanReport) -> Vec<(FileChangeKind, &str)> {
        report
            .changes
            .iter()
            .map(|c| (c.change.kind, c.change.path.as_str()))
            .collect()
    }

    fn change<'a>(report: &'a ScanReport, path: &str) -> &'a RecordedChange {
        report
            .changes
            .iter()
            .find(|c| c.change.path == path)
            .unwrap_or_else(|| panic!("no change at {path}: {:?}", kinds(report)))
    }

    /// Lets the racy window of everything written so far pass, so the next scan trusts it.
    fn settle() {
        std::thread::sleep(RACY_MARGIN + Duration::from_millis(30));
    }

    use FileChangeKind::{Created, Deleted, Modified};

    #[test]
    fn a_capture_reports_nothing_and_a_rescan_reports_created_modified_and_deleted_files() {
        let f = Fixture::new();
        f.write("keep.txt", b"same");
        f.write("edit.txt", b"old contents");
        f.write("gone.txt", b"bye");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        assert_eq!(snapshot.len(), 3);

        f.write("new.txt", b"hello");
        f.write("edit.txt", b"new contents, longer");
        fs::remove_file(f.path("gone.txt")).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(
            kinds(&report),
            [
                (Modified, "edit.txt"),
                (Deleted, "gone.txt"),
                (Created, "new.txt")
            ]
        );
        assert_eq!(report.files, 3);

        let edit = change(&report, "edit.txt");
        assert_eq!(
            edit.change.before_sha256.as_deref(),
            Some(sha256_hex(b"old contents").as_str())
        );
        assert_eq!(
            edit.change.after_sha256.as_deref(),
            Some(sha256_hex(b"new contents, longer").as_str())
        );
        assert_eq!(edit.change.before_size, Some(12));
        assert_eq!(edit.change.after_size, Some(20));
        assert!(edit.change.after_stored);
        assert_eq!(edit.after.as_deref(), Some(&b"new contents, longer"[..]));
        assert_eq!(edit.change.capability, Capability::Process);
        assert_eq!(edit.change.symlink_target, None);

        let gone = change(&report, "gone.txt");
        assert_eq!(
            gone.change.before_sha256.as_deref(),
            Some(sha256_hex(b"bye").as_str())
        );
        assert_eq!(gone.change.after_sha256, None);
        assert_eq!(gone.change.after_size, None);
        assert!(!gone.change.after_stored);
        assert_eq!(gone.after, None);

        let new = change(&report, "new.txt");
        assert_eq!(new.change.before_sha256, None);
        assert_eq!(new.after.as_deref(), Some(&b"hello"[..]));

        // Nothing changed since: nothing reported.
        assert!(f.rescan(&mut snapshot).changes.is_empty());
    }

    #[test]
    fn an_empty_snapshot_reports_every_file_as_created() {
        let f = Fixture::new();
        f.write("a", b"1");
        f.write("d/b", b"2");
        let mut snapshot = Snapshot::default();
        let report = f.rescan(&mut snapshot);
        assert_eq!(kinds(&report), [(Created, "a"), (Created, "d/b")]);
    }

    #[test]
    fn a_rename_is_a_deletion_and_a_creation_of_the_same_contents() {
        let f = Fixture::new();
        f.write("src/old.rs", b"fn main() {}\n");
        f.write("dir1/x", b"x");
        f.write("dir1/sub/y", b"y");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        fs::rename(f.path("src/old.rs"), f.path("src/new.rs")).unwrap();
        fs::rename(f.path("dir1"), f.path("dir2")).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(
            kinds(&report),
            [
                (Deleted, "dir1/sub/y"),
                (Deleted, "dir1/x"),
                (Created, "dir2/sub/y"),
                (Created, "dir2/x"),
                (Created, "src/new.rs"),
                (Deleted, "src/old.rs"),
            ]
        );
        assert_eq!(
            change(&report, "src/old.rs").change.before_sha256,
            change(&report, "src/new.rs").change.after_sha256
        );
    }

    #[test]
    fn nested_directories_are_walked_and_removing_one_deletes_its_files() {
        let f = Fixture::new();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        f.write("a/b/c/d/deep.txt", b"deep");
        f.write("a/b/mid.txt", b"mid");
        f.write(".git/objects/ab/cdef", b"object");
        f.write("node_modules/pkg/index.js", b"js");
        f.write("target/debug/app", b"\x7fELF");
        fs::create_dir_all(f.path("empty/dir")).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(
            kinds(&report),
            [
                (Created, ".git/objects/ab/cdef"),
                (Created, "a/b/c/d/deep.txt"),
                (Created, "a/b/mid.txt"),
                (Created, "node_modules/pkg/index.js"),
                (Created, "target/debug/app"),
            ]
        );
        fs::remove_dir_all(f.path("a")).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(
            kinds(&report),
            [(Deleted, "a/b/c/d/deep.txt"), (Deleted, "a/b/mid.txt")]
        );
    }

    #[test]
    fn symlinks_are_recorded_by_their_target_text_and_never_followed() {
        let f = Fixture::new();
        f.write("sub/f", b"in sub");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        symlink("target.txt", f.path("dangling")).unwrap();
        symlink(&f.outside, f.path("out")).unwrap();
        symlink(f.outside.join("secret"), f.path("secret")).unwrap();
        symlink("sub", f.path("alias")).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(
            kinds(&report),
            [
                (Created, "alias"),
                (Created, "dangling"),
                (Created, "out"),
                (Created, "secret"),
            ]
        );
        let dangling = change(&report, "dangling");
        assert_eq!(
            dangling.change.symlink_target.as_deref(),
            Some("target.txt")
        );
        assert_eq!(
            dangling.change.after_sha256.as_deref(),
            Some(sha256_hex(b"target.txt").as_str())
        );
        assert_eq!(dangling.change.after_size, Some(10));
        assert_eq!(dangling.after.as_deref(), Some(&b"target.txt"[..]));
        let secret = change(&report, "secret");
        let target = f.outside.join("secret");
        assert_eq!(secret.change.symlink_target.as_deref(), target.to_str());
        assert_ne!(secret.after.as_deref(), Some(SECRET));

        // Retargeted (a new symlink renamed over the old one), then removed.
        symlink("other.txt", f.path("tmp-link")).unwrap();
        fs::rename(f.path("tmp-link"), f.path("dangling")).unwrap();
        fs::remove_file(f.path("alias")).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(kinds(&report), [(Deleted, "alias"), (Modified, "dangling")]);
        let retargeted = change(&report, "dangling");
        assert_eq!(
            retargeted.change.before_sha256.as_deref(),
            Some(sha256_hex(b"target.txt").as_str())
        );
        assert_eq!(
            retargeted.change.after_sha256.as_deref(),
            Some(sha256_hex(b"other.txt").as_str())
        );
        assert_eq!(
            retargeted.change.symlink_target.as_deref(),
            Some("other.txt")
        );
        let alias = change(&report, "alias");
        assert_eq!(alias.change.symlink_target, None);
        assert_eq!(
            alias.change.before_sha256.as_deref(),
            Some(sha256_hex(b"sub").as_str())
        );
    }

    #[test]
    fn a_file_replaced_by_a_directory_and_back_and_by_a_symlink() {
        let f = Fixture::new();
        f.write("a", b"file a");
        f.write("b/y", b"y");
        f.write("b/z", b"z");
        f.write("c/f", b"f");
        f.write("d", b"file d");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        fs::remove_file(f.path("a")).unwrap();
        f.write("a/x", b"x");
        fs::remove_dir_all(f.path("b")).unwrap();
        f.write("b", b"file b");
        fs::remove_dir_all(f.path("c")).unwrap();
        symlink("elsewhere", f.path("c")).unwrap();
        fs::remove_file(f.path("d")).unwrap();
        symlink("a/x", f.path("d")).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(
            kinds(&report),
            [
                (Deleted, "a"),
                (Created, "a/x"),
                (Created, "b"),
                (Deleted, "b/y"),
                (Deleted, "b/z"),
                (Created, "c"),
                (Deleted, "c/f"),
                (Modified, "d"),
            ]
        );
        let d = change(&report, "d");
        assert_eq!(
            d.change.before_sha256.as_deref(),
            Some(sha256_hex(b"file d").as_str())
        );
        assert_eq!(d.change.symlink_target.as_deref(), Some("a/x"));
        assert_eq!(
            change(&report, "c").change.symlink_target.as_deref(),
            Some("elsewhere")
        );

        // And a symlink replaced by a regular file.
        fs::remove_file(f.path("d")).unwrap();
        f.write("d", b"file d again");
        let report = f.rescan(&mut snapshot);
        assert_eq!(kinds(&report), [(Modified, "d")]);
        assert_eq!(change(&report, "d").change.symlink_target, None);
        assert_eq!(
            change(&report, "d").after.as_deref(),
            Some(&b"file d again"[..])
        );
    }

    #[test]
    fn a_same_size_rewrite_right_after_a_scan_is_still_seen() {
        let f = Fixture::new();
        f.write("racy.txt", b"aaaa");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        // In place (same inode), same size, at once: the mtime and ctime may well be the ones
        // the capture saw, since the kernel stamps files from a coarse clock.
        fs::write(f.path("racy.txt"), b"bbbb").unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(kinds(&report), [(Modified, "racy.txt")]);
        assert_eq!(
            change(&report, "racy.txt").after.as_deref(),
            Some(&b"bbbb"[..])
        );
        fs::write(f.path("racy.txt"), b"cccc").unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(kinds(&report), [(Modified, "racy.txt")]);
        assert_eq!(
            change(&report, "racy.txt").change.after_sha256.as_deref(),
            Some(sha256_hex(b"cccc").as_str())
        );
    }

    #[test]
    fn racily_clean_metadata_is_not_trusted_but_settled_metadata_is() {
        let f = Fixture::new();
        f.write("racy.txt", b"aaaa");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        fs::write(f.path("racy.txt"), b"bbbb").unwrap();
        // Pretend the rewrite kept every timestamp (a coarse clock that did not tick): the
        // recorded metadata now matches the file exactly.
        let now = f.ws.open_dir_exact(b"").unwrap();
        let entry = now
            .entries()
            .unwrap()
            .into_iter()
            .find(|e| e.name == "racy.txt")
            .unwrap();
        let current = Meta::from(&now.stat_child(&entry).unwrap());
        let record = snapshot.entries.get_mut(&b"racy.txt"[..]).unwrap();
        record.meta = current;
        let mut trusting = snapshot.clone();

        // The file was stamped within the margin of the capture's start: hashed again.
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.hashed, 1);
        assert_eq!(kinds(&report), [(Modified, "racy.txt")]);

        // Had the capture started well after the file's timestamps, the metadata would be
        // trusted: that is what the racy check guards against.
        trusting.started_ns = now_ns() + 3_600_000_000_000;
        let report = f.rescan(&mut trusting);
        assert_eq!(report.hashed, 0);
        assert!(report.changes.is_empty());
    }

    #[test]
    fn a_touch_rehashes_but_reports_nothing_and_a_chmod_is_a_modification() {
        use std::os::unix::fs::PermissionsExt;
        let f = Fixture::new();
        f.write("a.txt", b"contents");
        settle();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        let file = fs::File::options()
            .write(true)
            .open(f.path("a.txt"))
            .unwrap();
        file.set_modified(SystemTime::now()).unwrap();
        drop(file);
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.hashed, 1);
        assert!(report.changes.is_empty());
        // The mode is part of what a rebuild restores: a chmod alone is recorded.
        fs::set_permissions(f.path("a.txt"), fs::Permissions::from_mode(0o755)).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(kinds(&report), [(Modified, "a.txt")]);
        let c = &report.changes[0].change;
        assert_eq!(c.after_mode, Some(0o755));
        assert_eq!(c.before_sha256, c.after_sha256);
    }

    #[test]
    fn hard_linked_files_are_recorded_without_being_read() {
        let f = Fixture::new();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        fs::hard_link(f.outside.join("secret"), f.path("planted")).unwrap();
        f.write("twin1", b"inside");
        fs::hard_link(f.path("twin1"), f.path("twin2")).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(
            kinds(&report),
            [(Created, "planted"), (Created, "twin1"), (Created, "twin2")]
        );
        assert_eq!(report.hashed, 0);
        for c in &report.changes {
            assert_eq!(c.change.after_sha256, None, "{}", c.change.path);
            assert_eq!(c.after, None);
            assert!(!c.change.after_stored);
            assert_eq!(c.change.after_unstored, Some(UnstoredReason::HardLink));
        }
        assert_eq!(
            change(&report, "planted").change.after_size,
            Some(SECRET.len() as u64)
        );

        // The outside file changes: the link is reported modified, still unread.
        settle();
        let _ = f.rescan(&mut snapshot);
        fs::write(f.outside.join("secret"), b"changed outside").unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(kinds(&report), [(Modified, "planted")]);
        let planted = change(&report, "planted");
        assert_eq!(planted.change.before_sha256, None);
        assert_eq!(planted.change.after_sha256, None);
        assert_eq!(planted.after, None);

        // Down to one link: now it is read.
        fs::remove_file(f.path("twin2")).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(kinds(&report), [(Modified, "twin1"), (Deleted, "twin2")]);
        assert_eq!(
            change(&report, "twin1").after.as_deref(),
            Some(&b"inside"[..])
        );
    }

    #[test]
    fn fifos_and_sockets_are_ignored_and_never_opened() {
        let f = Fixture::new();
        f.write("was-a-file", b"x");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            f.path("pipe").as_path(),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(f.path("sock")).unwrap();
        fs::remove_file(f.path("was-a-file")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            f.path("was-a-file").as_path(),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        // Opening the FIFO for reading would block forever: the scan returning is the test.
        let report = f.rescan(&mut snapshot);
        assert_eq!(kinds(&report), [(Deleted, "was-a-file")]);
        assert_eq!(report.files, 0);
    }

    #[test]
    fn contents_are_kept_up_to_the_limit_and_bigger_files_are_hashed_streaming() {
        let f = Fixture::new();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        let big: Vec<u8> = (0..3 * 256 * 1024 + 17).map(|i| (i % 251) as u8).collect();
        f.write("big.bin", &big);
        f.write("exact.bin", &[7u8; 1024]);
        f.write("over.bin", &[7u8; 1025]);
        f.write("empty", b"");
        let report = snapshot.rescan(&f.ws, 1024).unwrap();
        let big_change = change(&report, "big.bin");
        assert_eq!(
            big_change.change.after_sha256.as_deref(),
            Some(sha256_hex(&big).as_str())
        );
        assert_eq!(big_change.change.after_size, Some(big.len() as u64));
        assert!(!big_change.change.after_stored);
        assert_eq!(
            big_change.change.after_unstored,
            Some(UnstoredReason::TooLarge)
        );
        assert_eq!(big_change.after, None);
        assert_eq!(
            change(&report, "exact.bin").after.as_deref(),
            Some(&[7u8; 1024][..])
        );
        let over = change(&report, "over.bin");
        assert_eq!(over.after, None);
        assert_eq!(
            over.change.after_sha256.as_deref(),
            Some(sha256_hex(&[7u8; 1025]).as_str())
        );
        let empty = change(&report, "empty");
        assert_eq!(empty.after.as_deref(), Some(&b""[..]));
        assert!(empty.change.after_stored);
        assert_eq!(empty.change.after_unstored, None);
        assert_eq!(report.hashed, 4);
    }

    #[test]
    fn names_that_are_not_utf8_are_recorded_exactly() {
        use std::os::unix::ffi::OsStrExt;
        let raw = |bytes: &[u8]| std::ffi::OsStr::from_bytes(bytes).to_owned();
        let f = Fixture::new();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        fs::write(f.root.join(raw(b"bad\xff")), b"ff").unwrap();
        fs::write(f.root.join(raw(b"bad\xfe")), b"fe").unwrap();
        // Spelled like the display form of the first, but UTF-8: a third, distinct name.
        fs::write(f.path("bad\\xff"), b"literal").unwrap();
        symlink(raw(b"caf\xe9"), f.root.join(raw(b"dir\x80link"))).unwrap();
        let report = f.rescan(&mut snapshot);
        let names: Vec<_> = report
            .changes
            .iter()
            .map(|c| {
                let c = &c.change;
                (c.path.as_str(), c.path_b64.as_deref())
            })
            .collect();
        // In byte order of the raw names.
        assert_eq!(
            names,
            [
                ("bad\\xff", None),
                ("bad\\xfe", Some("YmFk/g==")),
                ("bad\\xff", Some("YmFk/w==")),
                ("dir\\x80link", Some("ZGlygGxpbms=")),
            ]
        );
        assert_eq!(
            report.changes[1].after.as_deref(),
            Some(&b"fe"[..]),
            "each keeps its own contents"
        );
        let link = &report.changes[3];
        assert_eq!(link.change.symlink_target.as_deref(), Some("caf\\xe9"));
        assert_eq!(link.change.symlink_target_b64.as_deref(), Some("Y2Fm6Q=="));
        assert_eq!(link.after.as_deref(), Some(&b"caf\xe9"[..]));
        // Written as UTF-8: no base64 beside the names.
        fs::remove_file(f.root.join(raw(b"dir\x80link"))).unwrap();
        symlink("plain", f.path("link")).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(
            kinds(&report),
            [(Deleted, "dir\\x80link"), (Created, "link")]
        );
        let json = serde_json::to_value(&report.changes[1].change).unwrap();
        assert_eq!(json["symlink_target"], "plain");
        assert!(json.get("path_b64").is_none() && json.get("symlink_target_b64").is_none());
        assert_eq!(
            serde_json::to_value(&report.changes[0].change).unwrap()["path_b64"],
            "ZGlygGxpbms="
        );
    }

    /// A budget of `content` bytes of contents (files up to 1 KiB) and `hash` bytes hashed.
    fn budget(content: u64, hash: u64) -> ScanBudget {
        ScanBudget {
            content_bytes: content,
            hash_bytes: hash,
            ..ScanBudget::unlimited(1024)
        }
    }

    fn unstored(report: &ScanReport, path: &str) -> Option<UnstoredReason> {
        change(report, path).change.after_unstored
    }

    #[test]
    fn past_the_content_budget_files_are_hashed_only_and_the_smallest_are_kept() {
        let f = Fixture::new();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        // Found in byte order of their names (the events of one directory): larger files
        // first, then smaller ones that take their place.
        f.write("a-900", &[1u8; 900]);
        f.write("b-800", &[2u8; 800]);
        f.write("c-2000", &[3u8; 2000]);
        f.write("d-300", &[4u8; 300]);
        f.write("e-300", &[5u8; 300]);
        f.write("f-0", b"");
        f.write("g-1000", &[6u8; 1000]);
        let report = snapshot
            .rescan_within(&f.ws, &budget(1500, u64::MAX))
            .unwrap();
        // 900 + 800 do not fit: the 800 takes the place of the 900; the 300s and the empty file
        // fit beside it; the 1000 does not, and nothing kept is larger. Over 1 KiB: too large.
        let kept: Vec<&str> = report
            .changes
            .iter()
            .filter(|c| c.after.is_some())
            .map(|c| c.change.path.as_str())
            .collect();
        assert_eq!(kept, ["b-800", "d-300", "e-300", "f-0"]);
        assert_eq!(report.kept_bytes, 1400);
        assert_eq!(
            unstored(&report, "a-900"),
            Some(UnstoredReason::ContentBudget)
        );
        assert_eq!(
            unstored(&report, "g-1000"),
            Some(UnstoredReason::ContentBudget)
        );
        assert_eq!(unstored(&report, "c-2000"), Some(UnstoredReason::TooLarge));
        for c in &report.changes {
            // Every file is hashed all the same, and says whether its contents are stored.
            assert!(c.change.after_sha256.is_some(), "{}", c.change.path);
            assert_eq!(c.change.after_stored, c.after.is_some());
            assert_eq!(c.change.after_unstored.is_none(), c.after.is_some());
        }
        let a = change(&report, "a-900");
        assert_eq!(
            a.change.after_sha256.as_deref(),
            Some(sha256_hex(&[1u8; 900]).as_str())
        );
        assert_eq!(a.change.after_size, Some(900));
        let json = serde_json::to_value(&a.change).unwrap();
        assert_eq!(json["after_unstored"], "content_budget");
        assert_eq!(json["after_stored"], false);

        // A budget per scan: the next one keeps contents again.
        f.write("a-900", &[7u8; 900]);
        let report = snapshot
            .rescan_within(&f.ws, &budget(1500, u64::MAX))
            .unwrap();
        assert_eq!(kinds(&report), [(Modified, "a-900")]);
        assert_eq!(
            report.changes[0].after.as_deref(),
            Some(&[7u8; 900][..]),
            "{:?}",
            report.changes[0].change
        );
    }

    #[test]
    fn past_the_hash_budget_files_are_recorded_by_metadata_and_later_changes_still_found() {
        let f = Fixture::new();
        f.write("old", b"old contents");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        f.write("a", &[1u8; 6000]);
        f.write("b", &[2u8; 6000]);
        f.write("c", &[3u8; 3000]);
        f.write("old", &[4u8; 5000]);
        let report = snapshot
            .rescan_within(&f.ws, &budget(u64::MAX, 10_000))
            .unwrap();
        assert!(report.hashed_bytes <= 10_000, "{}", report.hashed_bytes);
        assert_eq!(report.hashed_bytes, 9000);
        assert_eq!(
            kinds(&report),
            [
                (Created, "a"),
                (Created, "b"),
                (Created, "c"),
                (Modified, "old")
            ]
        );
        // a and c fit; b and old did not.
        for (path, hashed) in [("a", true), ("b", false), ("c", true), ("old", false)] {
            let c = change(&report, path);
            assert_eq!(c.change.after_sha256.is_some(), hashed, "{path}");
            assert_eq!(c.after, None, "over 1 KiB: {path}");
            let why = if hashed {
                UnstoredReason::TooLarge
            } else {
                UnstoredReason::HashBudget
            };
            assert_eq!(c.change.after_unstored, Some(why), "{path}");
        }
        let old = change(&report, "old");
        assert_eq!(
            old.change.before_sha256.as_deref(),
            Some(sha256_hex(b"old contents").as_str())
        );
        assert_eq!(old.change.after_size, Some(5000));

        // Not read again while their metadata stays the same, even racily clean: the budget
        // is not spent on them at every scan, and nothing is reported. (The racily clean files
        // that were hashed are hashed again, and found unchanged.)
        let report = f.rescan(&mut snapshot);
        assert!(report.changes.is_empty(), "{:?}", kinds(&report));
        assert_eq!(report.hashed_bytes, 9000);
        // A later change is found by the metadata, and read when the budget allows.
        settle();
        f.write("b", &[9u8; 6001]);
        let report = f.rescan(&mut snapshot);
        assert_eq!(kinds(&report), [(Modified, "b")]);
        let b = change(&report, "b");
        assert_eq!(b.change.before_sha256, None);
        assert_eq!(b.change.before_size, Some(6000));
        assert_eq!(
            b.change.after_sha256.as_deref(),
            Some(sha256_hex(&[9u8; 6001]).as_str())
        );
        // A full walk agrees (the records are kept as they were).
        let mut walking = snapshot.clone();
        assert!(f.rescan(&mut walking).changes.is_empty());

        // The capture has the same budget: a file beyond it is recorded by metadata only.
        let budgeted = budget(0, 5000);
        let mut captured = Snapshot::capture_within(&f.ws, None, &budgeted).unwrap();
        assert_eq!(captured.len(), 4);
        f.write("old", b"changed");
        let report = f.rescan(&mut captured);
        assert_eq!(kinds(&report), [(Modified, "old")]);
    }

    #[test]
    fn racily_clean_files_are_read_again_after_the_changed_ones() {
        let f = Fixture::new();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        f.write("a-big", &[1u8; 8000]);
        let report = snapshot
            .rescan_within(&f.ws, &budget(u64::MAX, 8000))
            .unwrap();
        assert_eq!(kinds(&report), [(Created, "a-big")]);
        // Written just before that scan: its metadata is not trusted yet. Read again first, it
        // would take the whole budget and leave the new file without a hash.
        f.write("z-small", b"small");
        let report = snapshot
            .rescan_within(&f.ws, &budget(u64::MAX, 8004))
            .unwrap();
        assert_eq!(kinds(&report), [(Created, "z-small")]);
        assert_eq!(
            change(&report, "z-small").change.after_sha256.as_deref(),
            Some(sha256_hex(b"small").as_str())
        );
        assert_eq!(report.hashed_bytes, 5);
        // Not read again within the budget: followed by its metadata from now on.
        settle();
        f.write("a-big", &[2u8; 8000]);
        let report = f.rescan(&mut snapshot);
        assert_eq!(kinds(&report), [(Modified, "a-big")]);
        let big = change(&report, "a-big");
        assert_eq!(big.change.before_sha256, None);
        assert_eq!(
            big.change.after_sha256.as_deref(),
            Some(sha256_hex(&[2u8; 8000]).as_str())
        );
        // With the budget for it, the racily clean file is read again at the end of the scan.
        let report = f.rescan(&mut snapshot);
        assert!(report.changes.is_empty());
        assert_eq!(report.hashed_bytes, 8000);
    }

    #[test]
    fn hashing_stops_at_the_deadline_and_the_rest_is_recorded_by_metadata() {
        let f = Fixture::new();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        f.write("small", b"small");
        // Sparse: a second of hashing at least, on any machine this runs on.
        let sparse = fs::File::create(f.path("sparse")).unwrap();
        sparse.set_len(2 << 30).unwrap();
        drop(sparse);
        symlink("small", f.path("link")).unwrap();
        let started = Instant::now();
        let report = snapshot
            .rescan_within(
                &f.ws,
                &ScanBudget {
                    time: Duration::from_millis(100),
                    ..ScanBudget::unlimited(1024)
                },
            )
            .unwrap();
        let elapsed = started.elapsed();
        assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
        assert_eq!(
            kinds(&report),
            [(Created, "link"), (Created, "small"), (Created, "sparse")]
        );
        let sparse = change(&report, "sparse");
        assert_eq!(sparse.change.after_sha256, None);
        assert_eq!(sparse.change.after_size, Some(2 << 30));
        assert_eq!(
            sparse.change.after_unstored,
            Some(UnstoredReason::TimeBudget)
        );

        // Out of time from the start: files are recorded by metadata, symlinks still read.
        f.write("small", b"small, changed");
        f.write("new", b"new");
        let report = snapshot
            .rescan_within(
                &f.ws,
                &ScanBudget {
                    time: Duration::ZERO,
                    ..ScanBudget::unlimited(1024)
                },
            )
            .unwrap();
        assert_eq!(kinds(&report), [(Created, "new"), (Modified, "small")]);
        for c in &report.changes {
            assert_eq!(c.change.after_unstored, Some(UnstoredReason::TimeBudget));
            assert_eq!(c.change.after_sha256, None);
        }
        assert_eq!(report.hashed_bytes, 0);
    }

    #[test]
    fn a_no_change_rescan_of_ten_thousand_files_hashes_nothing() {
        let f = Fixture::new();
        for dir in 0..100 {
            for file in 0..100 {
                f.write(
                    &format!("d{dir:03}/f{file:03}.txt"),
                    format!("{dir}/{file}\n").as_bytes(),
                );
            }
        }
        settle();
        let started = Instant::now();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        eprintln!("capture of 10,000 files: {:?}", started.elapsed());
        assert_eq!(snapshot.len(), 10_000);
        assert!(snapshot.is_watching());
        // The same records without inotify: its rescans walk (what they cost without events).
        let mut walking = snapshot.clone();
        let mut best = Duration::MAX;
        let mut best_walk = Duration::MAX;
        for _ in 0..5 {
            let started = Instant::now();
            let report = snapshot.rescan(&f.ws, 1024).unwrap();
            let elapsed = started.elapsed();
            best = best.min(elapsed);
            eprintln!("no-change rescan of 10,000 files (inotify): {elapsed:?}");
            assert!(report.changes.is_empty());
            assert_eq!(report.hashed, 0);
            assert_eq!(report.files, 10_000);
            assert_eq!(report.full_walk, None, "the tree was not walked");

            let started = Instant::now();
            let report = walking.rescan(&f.ws, 1024).unwrap();
            let elapsed = started.elapsed();
            best_walk = best_walk.min(elapsed);
            eprintln!("no-change rescan of 10,000 files (full walk): {elapsed:?}");
            assert!(report.changes.is_empty());
            assert_eq!(report.hashed, 0);
            assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
        }
        eprintln!(
            "best no-change rescan of 10,000 files: {best:?} (inotify), {best_walk:?} (full walk)"
        );

        f.write("d050/f050.txt", b"changed\n");
        let report = snapshot.rescan(&f.ws, 1024).unwrap();
        assert_eq!(kinds(&report), [(Modified, "d050/f050.txt")]);
        assert_eq!(report.hashed, 1);
        assert_eq!(report.full_walk, None);
        let report = walking.rescan(&f.ws, 1024).unwrap();
        assert_eq!(kinds(&report), [(Modified, "d050/f050.txt")]);
    }

    #[test]
    fn a_tree_changing_during_the_scan_never_fails_it_or_leads_outside() {
        let f = Fixture::new();
        fs::create_dir_all(f.outside.join("dir")).unwrap();
        fs::write(f.outside.join("dir/secret"), SECRET).unwrap();
        f.write(".real/inner", b"inner");
        symlink(f.outside.join("dir"), f.path(".link")).unwrap();
        f.write("file", b"regular");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            f.path(".fifo").as_path(),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let root = f.root.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let at = |name: &str| root.join(name);
                while !stop.load(Ordering::Relaxed) {
                    // `x` is a real directory, then a symlink to a directory outside; `file`
                    // is a regular file, then a FIFO, then a directory.
                    let _ = fs::rename(at(".real"), at("x"));
                    let _ = fs::rename(at("file"), at(".file"));
                    let _ = fs::rename(at(".fifo"), at("file"));
                    let _ = fs::rename(at("x"), at(".real"));
                    let _ = fs::rename(at(".link"), at("x"));
                    let _ = fs::rename(at("file"), at(".fifo"));
                    let _ = fs::rename(at(".real"), at("file"));
                    let _ = fs::rename(at("x"), at(".link"));
                    let _ = fs::rename(at("file"), at(".real"));
                    let _ = fs::rename(at(".file"), at("file"));
                }
            })
        };
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut scans = 0;
        while Instant::now() < deadline && scans < 500 {
            let report = snapshot.rescan(&f.ws, 1 << 20).unwrap();
            for c in &report.changes {
                assert!(!c.change.path.contains("secret"), "{:?}", c.change);
                assert_ne!(c.after.as_deref(), Some(SECRET));
            }
            scans += 1;
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        assert!(scans > 0);
        // Once the tree holds still, a rescan agrees with a fresh capture.
        let _ = snapshot.rescan(&f.ws, 0).unwrap();
        let fresh = Snapshot::capture(&f.ws).unwrap();
        settle();
        let report = snapshot.rescan(&f.ws, 0).unwrap();
        assert!(report.changes.is_empty(), "{:?}", kinds(&report));
        assert_eq!(
            snapshot.entries.keys().collect::<Vec<_>>(),
            fresh.entries.keys().collect::<Vec<_>>()
        );
    }

    #[test]
    fn an_unusable_root_is_an_error() {
        let f = Fixture::new();
        f.write("a", b"a");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        fs::remove_dir_all(&f.root).unwrap();
        assert!(matches!(
            snapshot.rescan(&f.ws, 0),
            Err(JailError::NotFound { .. })
        ));
        assert_eq!(snapshot.len(), 1, "a failed rescan changes nothing");
    }

    // ---- inotify ----

    fn watcher(snapshot: &Snapshot) -> &Watcher {
        snapshot.watcher.as_ref().expect("the snapshot watches")
    }

    /// The snapshot's inotify instance (kept by the pool between scans).
    fn inotify_fd(snapshot: &Snapshot) -> Arc<OwnedFd> {
        watcher(snapshot)
            .lease
            .attach()
            .expect("the instance is open")
    }

    fn sh(dir: &std::path::Path, script: &str) {
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .status()
            .unwrap();
        assert!(status.success(), "{script}");
    }

    /// The rescan looked only where the events led.
    #[track_caller]
    fn incremental(report: &ScanReport) {
        assert_eq!(report.full_walk, None, "walked: {:?}", kinds(report));
    }

    #[test]
    fn a_change_deep_down_is_found_from_its_directory_s_events() {
        let f = Fixture::new();
        f.write("a/b/c/d/e/f/g/h/deep.txt", b"deep");
        f.write("a/b/c/d/e/f/g/h/same.txt", b"same");
        f.write("a/top.txt", b"top");
        settle();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        assert_eq!(watcher(&snapshot).dirs.len(), 9);
        f.write("a/b/c/d/e/f/g/h/deep.txt", b"changed");
        f.write("a/b/c/d/e/f/g/h/new.txt", b"new");
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(
            kinds(&report),
            [
                (Modified, "a/b/c/d/e/f/g/h/deep.txt"),
                (Created, "a/b/c/d/e/f/g/h/new.txt")
            ]
        );
        assert_eq!(report.hashed, 2);
        assert_eq!(report.files, 4);
        settle();
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert!(report.changes.is_empty());
    }

    #[test]
    fn a_directory_made_by_a_process_after_the_capture_is_walked_and_watched() {
        let f = Fixture::new();
        f.write("keep.txt", b"keep");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        sh(
            &f.root,
            "mkdir -p new/sub/deeper && echo one > new/one && echo two > new/sub/two \
             && echo three > new/sub/deeper/three",
        );
        let report = f.rescan(&mut snapshot);
        // Not watched while it was filled: the whole workspace is walked once.
        assert_eq!(report.full_walk, Some(FullWalkReason::NewDirectory));
        assert_eq!(
            kinds(&report),
            [
                (Created, "new/one"),
                (Created, "new/sub/deeper/three"),
                (Created, "new/sub/two")
            ]
        );
        assert!(watcher(&snapshot).wds.contains_key(&b"new/sub/deeper"[..]));
        // Its directories are watched now: what happens in them is found from their own events.
        sh(
            &f.root,
            "echo changed > new/sub/deeper/three && echo four > new/sub/four && rm new/one",
        );
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(
            kinds(&report),
            [
                (Deleted, "new/one"),
                (Modified, "new/sub/deeper/three"),
                (Created, "new/sub/four")
            ]
        );
    }

    #[test]
    fn files_made_in_new_directories_while_they_are_walked_are_all_found() {
        let f = Fixture::new();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        let root = f.root.clone();
        let writer = std::thread::spawn(move || {
            for i in 0..60 {
                let dir = root.join(format!("d{i}"));
                fs::create_dir_all(dir.join("sub")).unwrap();
                for j in 0..20 {
                    fs::write(dir.join(format!("f{j}")), format!("{i}/{j}")).unwrap();
                    fs::write(dir.join("sub").join(format!("g{j}")), b"g").unwrap();
                }
                if i % 7 == 3 {
                    fs::rename(&dir, root.join(format!("moved{i}"))).unwrap();
                }
            }
        });
        let mut scans = 0;
        while !writer.is_finished() {
            let _ = f.rescan(&mut snapshot);
            scans += 1;
        }
        writer.join().unwrap();
        let _ = f.rescan(&mut snapshot);
        let fresh = Snapshot::capture(&f.ws).unwrap();
        assert_eq!(fresh.len(), 60 * 40);
        assert_eq!(
            snapshot.entries.keys().collect::<Vec<_>>(),
            fresh.entries.keys().collect::<Vec<_>>(),
            "after {scans} scans"
        );
        settle();
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert!(report.changes.is_empty(), "{:?}", kinds(&report));
    }

    #[test]
    fn a_deleted_directory_tree_is_reported_deleted_and_its_watches_removed() {
        let f = Fixture::new();
        f.write("tree/a/b/c/1", b"1");
        f.write("tree/a/b/2", b"2");
        f.write("tree/a/3", b"3");
        f.write("tree/x/4", b"4");
        f.write("other/5", b"5");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        assert_eq!(watcher(&snapshot).dirs.len(), 7);
        fs::remove_dir_all(f.path("tree")).unwrap();
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(
            kinds(&report),
            [
                (Deleted, "tree/a/3"),
                (Deleted, "tree/a/b/2"),
                (Deleted, "tree/a/b/c/1"),
                (Deleted, "tree/x/4"),
            ]
        );
        let w = watcher(&snapshot);
        assert_eq!(
            w.wds.keys().map(|k| &k[..]).collect::<Vec<_>>(),
            [&b""[..], b"other"]
        );
        assert_eq!(w.dirs.len(), 2);
        // A directory of the same name again: new, watched anew.
        f.write("tree/a/3", b"3 again");
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::NewDirectory));
        assert_eq!(kinds(&report), [(Created, "tree/a/3")]);
        f.write("tree/a/3", b"3 changed");
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(kinds(&report), [(Modified, "tree/a/3")]);
    }

    #[test]
    fn a_renamed_directory_is_deletions_and_creations_and_stays_watched_at_its_new_path() {
        let f = Fixture::new();
        f.write("dir1/x", b"x");
        f.write("dir1/sub/y", b"y");
        f.write("p/q", b"q");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        fs::rename(f.path("dir1"), f.path("dir2")).unwrap();
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(
            kinds(&report),
            [
                (Deleted, "dir1/sub/y"),
                (Deleted, "dir1/x"),
                (Created, "dir2/sub/y"),
                (Created, "dir2/x"),
            ]
        );
        // The watches moved with it: an event from inside it names the new path.
        f.write("dir2/sub/y", b"y changed");
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(kinds(&report), [(Modified, "dir2/sub/y")]);

        // Two directories swapped, and one moved back where it was (the same file at the same
        // path: no change).
        fs::rename(f.path("dir2"), f.path("tmp")).unwrap();
        fs::rename(f.path("p"), f.path("dir2")).unwrap();
        fs::rename(f.path("tmp"), f.path("p")).unwrap();
        fs::rename(f.path("p/sub"), f.path("dir2/sub")).unwrap();
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(
            kinds(&report),
            [
                (Created, "dir2/q"),
                (Deleted, "dir2/x"),
                (Deleted, "p/q"),
                (Created, "p/x"),
            ]
        );
        f.write("dir2/sub/y", b"y changed again");
        f.write("p/x", b"x changed");
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(
            kinds(&report),
            [(Modified, "dir2/sub/y"), (Modified, "p/x")]
        );

        // Out of the workspace: deleted, and what happens to it there is not reported.
        fs::rename(f.path("dir2"), f.outside.join("moved")).unwrap();
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(
            kinds(&report),
            [(Deleted, "dir2/q"), (Deleted, "dir2/sub/y")]
        );
        assert_eq!(watcher(&snapshot).dirs.len(), 2, "root and p");
        fs::write(f.outside.join("moved/sub/y"), b"outside").unwrap();
        fs::write(f.outside.join("moved/new"), b"outside").unwrap();
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert!(report.changes.is_empty(), "{:?}", kinds(&report));
        // And back in: not watched while it was away.
        fs::rename(f.outside.join("moved"), f.path("p/back")).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::NewDirectory));
        assert_eq!(
            kinds(&report),
            [
                (Created, "p/back/new"),
                (Created, "p/back/q"),
                (Created, "p/back/sub/y")
            ]
        );
        let fresh = Snapshot::capture(&f.ws).unwrap();
        assert_eq!(
            snapshot.entries.keys().collect::<Vec<_>>(),
            fresh.entries.keys().collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_file_written_through_a_hard_link_in_another_directory_is_found() {
        let f = Fixture::new();
        f.write("a/file", b"one");
        f.write("b/other", b"other");
        fs::hard_link(f.path("a/file"), f.path("b/link")).unwrap();
        settle();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        settle();
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert!(report.changes.is_empty());
        // Written in place through b/link: only b's watch hears of it.
        let mut file = fs::File::options()
            .write(true)
            .truncate(true)
            .open(f.path("b/link"))
            .unwrap();
        std::io::Write::write_all(&mut file, b"two, longer").unwrap();
        drop(file);
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(kinds(&report), [(Modified, "a/file"), (Modified, "b/link")]);
        assert_eq!(
            change(&report, "a/file").change.after_size,
            Some("two, longer".len() as u64)
        );
    }

    #[test]
    fn a_hard_link_made_after_the_capture_walks_once_to_find_the_file_s_other_names() {
        let f = Fixture::new();
        f.write("a/file", b"one");
        f.write("b/other", b"other");
        settle();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        fs::hard_link(f.path("a/file"), f.path("b/link")).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::HardLink));
        // a/file: its link count changed, nothing told a's watch.
        assert_eq!(kinds(&report), [(Modified, "a/file"), (Created, "b/link")]);
        assert_eq!(change(&report, "a/file").change.after_sha256, None);
        settle();
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert!(report.changes.is_empty());
        fs::write(f.path("b/link"), b"two, longer").unwrap();
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(kinds(&report), [(Modified, "a/file"), (Modified, "b/link")]);
        // Down to one link again: read again, found from a's own events... and from the list of
        // multi-linked files.
        fs::remove_file(f.path("b/link")).unwrap();
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(kinds(&report), [(Modified, "a/file"), (Deleted, "b/link")]);
        assert_eq!(
            change(&report, "a/file").after.as_deref(),
            Some(&b"two, longer"[..])
        );
    }

    #[test]
    fn a_file_written_through_a_hard_link_made_and_removed_since_the_last_scan_is_found() {
        let f = Fixture::new();
        f.write("a/file", b"one");
        f.write("b/other", b"other");
        f.write("c", b"c");
        settle();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        // Nothing tells a's watch: the link's directory hears of a new name, a write, and the
        // name removed.
        sh(&f.root, "ln a/file b/x && printf two > b/x && rm b/x");
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::TransientFile));
        assert_eq!(kinds(&report), [(Modified, "a/file")]);
        assert_eq!(
            change(&report, "a/file").after.as_deref(),
            Some(&b"two"[..])
        );

        // The link replaced by another file rather than removed.
        sh(&f.root, "ln a/file b/x && printf three > b/x && mv c b/x");
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::TransientFile));
        assert_eq!(
            kinds(&report),
            [(Modified, "a/file"), (Created, "b/x"), (Deleted, "c")]
        );

        // Moved first, then removed.
        sh(
            &f.root,
            "ln a/file b/y && mv b/y b/z && printf four > b/z && rm b/z",
        );
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::TransientFile));
        assert_eq!(kinds(&report), [(Modified, "a/file")]);

        // In a directory made for it (not watched yet), removed with it.
        sh(
            &f.root,
            "mkdir n && ln a/file n/x && printf five > n/x && rm -r n",
        );
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::NewDirectory));
        assert_eq!(kinds(&report), [(Modified, "a/file")]);

        // Made before a rescan, removed after it: found by the next.
        settle();
        sh(&f.root, "ln a/file b/w");
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::HardLink));
        sh(&f.root, "printf six > b/w && rm b/w");
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(kinds(&report), [(Modified, "a/file"), (Deleted, "b/w")]);
    }

    #[test]
    fn files_replaced_through_a_temporary_name_do_not_make_a_full_walk() {
        let f = Fixture::new();
        f.write("src/main.rs", b"fn main() {}\n");
        f.write("README", b"readme");
        settle();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        // What editors, `sed -i`, Python's bytecode cache and git's index do: write a temporary
        // file, rename it over the file or to its final name.
        sh(
            &f.root,
            "printf 'fn main() { run() }' > src/.main.rs.tmp && mv src/.main.rs.tmp src/main.rs \
             && printf new > .new.tmp && mv .new.tmp new && sed -i s/readme/README/ README",
        );
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(
            kinds(&report),
            [
                (Modified, "README"),
                (Created, "new"),
                (Modified, "src/main.rs")
            ]
        );
        // A temporary file removed, though, could have been a hard link.
        sh(&f.root, "printf tmp > src/scratch && rm src/scratch");
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::TransientFile));
        assert!(report.changes.is_empty());
        // One made before the last scan is not.
        f.write("src/scratch", b"tmp");
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        fs::remove_file(f.path("src/scratch")).unwrap();
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(kinds(&report), [(Deleted, "src/scratch")]);
    }

    #[test]
    fn changes_made_through_a_bind_mount_in_another_mount_namespace_are_seen() {
        let f = Fixture::new();
        f.write("deep/dir/file", b"before");
        f.write("gone", b"gone");
        settle();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        let mnt = f._tmp.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        // As the sandbox sees the workspace: a bind mount, in a mount namespace of its own.
        let script = format!(
            "mount --bind '{root}' '{mnt}' && printf after > '{mnt}/deep/dir/file' \
             && printf new > '{mnt}/deep/new' && rm '{mnt}/gone'",
            root = f.root.display(),
            mnt = mnt.display()
        );
        let out = std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .output();
        match out {
            Ok(out) if out.status.success() => {}
            other => {
                eprintln!("skipped: no bind mount in a new mount namespace here: {other:?}");
                return;
            }
        }
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(
            kinds(&report),
            [
                (Modified, "deep/dir/file"),
                (Created, "deep/new"),
                (Deleted, "gone")
            ]
        );
        assert_eq!(
            change(&report, "deep/dir/file").after.as_deref(),
            Some(&b"after"[..])
        );
    }

    #[test]
    fn without_inotify_every_rescan_walks_and_finds_the_same() {
        let f = Fixture::new();
        f.write("a/b", b"b");
        f.write("c", b"c");
        let mut without = Snapshot::capture_within(&f.ws, None, &ScanBudget::unlimited(0)).unwrap();
        assert!(!without.is_watching());
        let mut default = Snapshot::default();
        let report = f.rescan(&mut default);
        assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
        assert_eq!(kinds(&report), [(Created, "a/b"), (Created, "c")]);
        fs::remove_dir_all(f.path("a")).unwrap();
        f.write("d/e", b"e");
        for snapshot in [&mut without, &mut default] {
            let report = f.rescan(snapshot);
            assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
            assert_eq!(kinds(&report), [(Deleted, "a/b"), (Created, "d/e")]);
        }
    }

    #[test]
    fn when_a_watch_cannot_be_added_the_snapshot_stops_watching_and_walks() {
        let limited = |f: &Fixture, watches| {
            let pool = InotifyPool::new(usize::MAX, watches);
            let snapshot =
                Snapshot::capture_within(&f.ws, Some(&pool), &ScanBudget::unlimited(0)).unwrap();
            (pool, snapshot)
        };
        // At the capture: five directories, three watches.
        let f = Fixture::new();
        for dir in ["a", "b", "c", "d"] {
            f.write(&format!("{dir}/f"), b"f");
        }
        let (pool, mut snapshot) = limited(&f, 3);
        assert!(!snapshot.is_watching());
        // The instance is closed, with its watches.
        assert_eq!((pool.instances(), pool.watches()), (0, 0));
        assert_eq!(snapshot.len(), 4);
        f.write("d/f", b"changed");
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
        assert_eq!(kinds(&report), [(Modified, "d/f")]);

        // At a rescan: the new directories are walked all the same, the next rescan walks.
        // Exactly as many watches as directories: a full walk watching them again needs none.
        let (pool, mut snapshot) = limited(&f, 5);
        assert!(snapshot.is_watching());
        assert_eq!((pool.instances(), pool.watches()), (1, 5));
        watcher_mut(&mut snapshot).walk_next = Some(FullWalkReason::Periodic);
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::Periodic));
        assert!(snapshot.is_watching());
        assert_eq!(pool.watches(), 5);
        f.write("e/g/h", b"h");
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::NewDirectory));
        assert_eq!(kinds(&report), [(Created, "e/g/h")]);
        assert!(!snapshot.is_watching());
        assert_eq!((pool.instances(), pool.watches()), (0, 0));
        f.write("e/g/h", b"h changed");
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
        assert_eq!(kinds(&report), [(Modified, "e/g/h")]);
    }

    #[test]
    fn an_event_queue_overflow_makes_a_full_walk() {
        let max_queued: usize = fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(usize::MAX);
        if max_queued > 100_000 {
            eprintln!("skipped: the inotify queue holds {max_queued} events here");
            return;
        }
        let f = Fixture::new();
        f.write("dir/existing", b"x");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        // One IN_CREATE at least per file (distinct names are never merged).
        let files = max_queued + 10;
        for i in 0..files {
            fs::write(f.path(&format!("dir/{i}")), b"").unwrap();
        }
        let report = snapshot.rescan(&f.ws, 0).unwrap();
        assert_eq!(report.full_walk, Some(FullWalkReason::EventsLost));
        assert_eq!(report.changes.len(), files);
        assert_eq!(report.files, files + 1);
        // Watching again from there.
        fs::write(f.path("dir/existing"), b"changed").unwrap();
        let report = snapshot.rescan(&f.ws, 0).unwrap();
        incremental(&report);
        assert_eq!(kinds(&report), [(Modified, "dir/existing")]);
    }

    #[test]
    fn a_watch_that_goes_away_is_made_again() {
        let f = Fixture::new();
        f.write("a/b/f", b"f");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        let a = watcher(&snapshot).wds[&b"a"[..]];
        // As if "a" were on a filesystem unmounted: IN_IGNORED with the directory still there,
        // unwatched for a while. Everything is walked (and "a" watched again).
        inotify::remove_watch(&*inotify_fd(&snapshot), a).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::Unwatched));
        assert!(report.changes.is_empty());
        assert!(watcher(&snapshot).wds.contains_key(&b"a"[..]));
        f.write("a/new", b"new");
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(kinds(&report), [(Created, "a/new")]);

        // The root's: the next rescan walks.
        let root = watcher(&snapshot).wds[&b""[..]];
        inotify::remove_watch(&*inotify_fd(&snapshot), root).unwrap();
        f.write("a/b/f", b"changed");
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::Unwatched));
        assert_eq!(kinds(&report), [(Modified, "a/b/f")]);
        f.write("root", b"root");
        let report = f.rescan(&mut snapshot);
        incremental(&report);
        assert_eq!(kinds(&report), [(Created, "root")]);
    }

    #[test]
    fn a_rescan_long_after_the_last_full_walk_walks() {
        let f = Fixture::new();
        f.write("a", b"a");
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        incremental(&f.rescan(&mut snapshot));
        if let Some(w) = snapshot.watcher.as_mut() {
            w.last_full_walk = Instant::now()
                .checked_sub(FULL_WALK_INTERVAL)
                .unwrap_or(w.last_full_walk);
        }
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::Periodic));
        incremental(&f.rescan(&mut snapshot));
        // Asked for by the previous scan (a directory it could not walk):
        watcher_mut(&mut snapshot).walk_next = Some(FullWalkReason::Unwatched);
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::Unwatched));
        incremental(&f.rescan(&mut snapshot));
    }

    #[test]
    fn past_the_pool_s_cap_snapshots_walk_and_watch_again_when_an_instance_is_free() {
        let pool = InotifyPool::new(2, usize::MAX);
        let fixtures: Vec<Fixture> = (0..3).map(|_| Fixture::new()).collect();
        let mut snapshots: Vec<Snapshot> = fixtures
            .iter()
            .map(|f| {
                f.write("a/f", b"f");
                Snapshot::capture_within(&f.ws, Some(&pool), &ScanBudget::unlimited(0)).unwrap()
            })
            .collect();
        let watching = |snapshots: &[Snapshot]| -> Vec<bool> {
            snapshots.iter().map(Snapshot::is_watching).collect()
        };
        assert_eq!(watching(&snapshots), [true, true, false]);
        assert_eq!((pool.instances(), pool.watches()), (2, 4));
        // Every change is found all the same; the third walks.
        for round in 0..2 {
            for (f, snapshot) in fixtures.iter().zip(snapshots.iter_mut()) {
                f.write("a/f", format!("round {round}").as_bytes());
                let report = f.rescan(snapshot);
                assert_eq!(kinds(&report), [(Modified, "a/f")]);
                let walked = !snapshot.is_watching();
                assert_eq!(
                    report.full_walk,
                    walked.then_some(FullWalkReason::NoInotify)
                );
            }
        }
        // An instance freed (a session gone): the snapshot without one takes it at its next
        // rescan, walking once more, then goes by the events.
        drop(snapshots.remove(0));
        let (f, snapshot) = (&fixtures[2], &mut snapshots[1]);
        assert_eq!((pool.instances(), pool.watches()), (1, 2));
        f.write("a/g", b"g");
        let report = f.rescan(snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
        assert_eq!(kinds(&report), [(Created, "a/g")]);
        assert!(snapshot.is_watching());
        assert_eq!((pool.instances(), pool.watches()), (2, 4));
        f.write("a/g", b"changed");
        let report = f.rescan(snapshot);
        incremental(&report);
        assert_eq!(kinds(&report), [(Modified, "a/g")]);
        drop(snapshots);
        assert_eq!((pool.instances(), pool.watches()), (0, 0));
    }

    #[test]
    fn an_idle_watcher_is_closed_for_another_snapshot_and_its_next_rescan_walks() {
        let idle = Duration::from_millis(100);
        let pool = InotifyPool::reclaiming_after(1, idle);
        let (f1, f2) = (Fixture::new(), Fixture::new());
        f1.write("d/one", b"1");
        f2.write("d/two", b"2");
        let budget = ScanBudget::unlimited(1024);
        let mut s1 = Snapshot::capture_within(&f1.ws, Some(&pool), &budget).unwrap();
        // The first was used a moment ago: the second does without.
        let mut s2 = Snapshot::capture_within(&f2.ws, Some(&pool), &budget).unwrap();
        assert!(s1.is_watching() && !s2.is_watching());
        std::thread::sleep(idle + Duration::from_millis(20));
        // Idle long enough: its instance goes to the second.
        f2.write("d/two", b"2 changed");
        let report = f2.rescan(&mut s2);
        assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
        assert_eq!(kinds(&report), [(Modified, "d/two")]);
        assert!(s2.is_watching());
        assert_eq!(pool.instances(), 1);
        // The first's events are gone with its instance: it walks, and finds every change.
        f1.write("d/one", b"1 changed");
        f1.write("d/new", b"new");
        let report = f1.rescan(&mut s1);
        assert_eq!(report.full_walk, Some(FullWalkReason::InotifyReclaimed));
        assert_eq!(kinds(&report), [(Created, "d/new"), (Modified, "d/one")]);
        // The second was used just now: the first stays without, and walks.
        assert!(!s1.is_watching());
        f1.write("d/one", b"1 changed again");
        let report = f1.rescan(&mut s1);
        assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
        assert_eq!(kinds(&report), [(Modified, "d/one")]);
        // A watcher in use by a scan is never taken (its descriptor is held).
        let held = inotify_fd(&s2);
        std::thread::sleep(idle + Duration::from_millis(20));
        f1.write("d/one", b"once more");
        let report = f1.rescan(&mut s1);
        assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
        assert!(!s1.is_watching());
        drop(held);
        let report = f1.rescan(&mut s1);
        assert!(s1.is_watching());
        assert!(report.changes.is_empty());
        assert_eq!(pool.instances(), 1);
        let report = f2.rescan(&mut s2);
        assert_eq!(report.full_walk, Some(FullWalkReason::InotifyReclaimed));
    }

    fn watcher_mut(snapshot: &mut Snapshot) -> &mut Watcher {
        snapshot.watcher.as_mut().expect("the snapshot watches")
    }

    #[test]
    fn the_snapshot_can_be_moved_to_another_thread() {
        fn send<T: Send + 'static>(_: &T) {}
        let f = Fixture::new();
        let snapshot = Snapshot::capture(&f.ws).unwrap();
        send(&snapshot);
    }

    /// Operations on a small tree, between rescans.
    #[derive(Debug, Clone)]
    enum Op {
        Write(usize, u8),
        Append(usize),
        Remove(usize),
        Mkdir(usize),
        Rename(usize, usize),
        Symlink(usize, usize),
        HardLink(usize, usize),
        Chmod(usize),
        Scan,
    }

    const NAMES: [&str; 9] = [
        "a", "b", "a/a", "a/b", "b/a", "a/a/a", "a/a/b", "b/a/a", "c",
    ];

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let name = 0..NAMES.len();
        prop_oneof![
            (name.clone(), 0u8..3).prop_map(|(p, c)| Op::Write(p, c)),
            name.clone().prop_map(Op::Append),
            name.clone().prop_map(Op::Remove),
            name.clone().prop_map(Op::Mkdir),
            (name.clone(), name.clone()).prop_map(|(a, b)| Op::Rename(a, b)),
            (name.clone(), name.clone()).prop_map(|(a, b)| Op::Symlink(a, b)),
            (name.clone(), name.clone()).prop_map(|(a, b)| Op::HardLink(a, b)),
            name.prop_map(Op::Chmod),
            Just(Op::Scan),
        ]
    }

    fn apply(root: &std::path::Path, op: &Op) {
        use std::os::unix::fs::PermissionsExt;
        let at = |i: usize| root.join(NAMES[i]);
        let parent = |i: usize| {
            let _ = fs::create_dir_all(at(i).parent().unwrap());
        };
        match *op {
            Op::Write(p, c) => {
                parent(p);
                let _ = fs::write(at(p), [b'x', c].repeat(usize::from(c) + 1));
            }
            Op::Append(p) => {
                if let Ok(mut file) = fs::File::options().append(true).open(at(p)) {
                    let _ = std::io::Write::write_all(&mut file, b"+");
                }
            }
            Op::Remove(p) => {
                if fs::remove_file(at(p)).is_err() {
                    let _ = fs::remove_dir_all(at(p));
                }
            }
            Op::Mkdir(p) => {
                let _ = fs::create_dir_all(at(p));
            }
            Op::Rename(a, b) => {
                parent(b);
                let _ = fs::rename(at(a), at(b));
            }
            Op::Symlink(a, b) => {
                parent(a);
                let _ = symlink(NAMES[b], at(a));
            }
            Op::HardLink(a, b) => {
                parent(b);
                let _ = fs::hard_link(at(a), at(b));
            }
            Op::Chmod(p) => {
                let _ = fs::set_permissions(at(p), fs::Permissions::from_mode(0o600));
            }
            Op::Scan => {}
        }
    }

    fn summary(report: &ScanReport) -> Vec<(FileChangeKind, String, Option<String>, Option<u64>)> {
        report
            .changes
            .iter()
            .map(|c| {
                (
                    c.change.kind,
                    c.change.path.clone(),
                    c.change.after_sha256.clone(),
                    c.change.after_size,
                )
            })
            .collect()
    }

    /// Applies `ops` to a tree made by `setup`, rescanning with a watching snapshot and a walking
    /// one at each [`Op::Scan`] and at the end: both must report the same and keep the same
    /// records. Returns how many rescans there were and how many went by the events alone.
    fn rescans_agree(
        setup: &[Op],
        ops: &[Op],
    ) -> Result<(usize, usize), proptest::test_runner::TestCaseError> {
        use proptest::{prop_assert, prop_assert_eq};
        let f = Fixture::new();
        // The directories exist mostly (a directory made means a full walk).
        fs::create_dir_all(f.path("a/a")).unwrap();
        fs::create_dir_all(f.path("b/a")).unwrap();
        for op in setup {
            apply(&f.root, op);
        }
        let mut watching = Snapshot::capture(&f.ws).unwrap();
        let mut walking = watching.clone();
        // Everything here is racily clean (written a moment ago), so every rescan would look at
        // every file again. The watching snapshot is made to trust metadata and to recheck only
        // multi-linked files: it finds changes from the events alone. (No operation rewrites a
        // file with other contents of the same size.)
        let events_only = |snapshot: &mut Snapshot| {
            snapshot.started_ns = now_ns() + 3_600_000_000_000;
            let entries = &snapshot.entries;
            if let Some(w) = snapshot.watcher.as_mut() {
                w.recheck
                    .retain(|key| entries.get(key).is_some_and(|r| r.meta.nlink > 1));
            }
        };
        let records = |snapshot: &Snapshot| {
            snapshot
                .entries
                .iter()
                .map(|(key, r)| (key.clone(), r.meta, r.content.clone()))
                .collect::<Vec<_>>()
        };
        events_only(&mut watching);
        let (mut scans, mut by_events) = (0, 0);
        for op in ops.iter().chain([&Op::Scan]) {
            apply(&f.root, op);
            if !matches!(op, Op::Scan) {
                continue;
            }
            let a = watching.rescan(&f.ws, 64).unwrap();
            let b = walking.rescan(&f.ws, 64).unwrap();
            events_only(&mut watching);
            prop_assert!(
                matches!(
                    a.full_walk,
                    None | Some(
                        FullWalkReason::HardLink
                            | FullWalkReason::NewDirectory
                            | FullWalkReason::TransientFile
                    )
                ),
                "{:?}",
                a.full_walk
            );
            scans += 1;
            by_events += usize::from(a.full_walk.is_none());
            prop_assert_eq!(summary(&a), summary(&b), "after {:?}", ops);
            prop_assert_eq!(records(&watching), records(&walking), "after {:?}", ops);
        }
        let fresh = Snapshot::capture(&f.ws).unwrap();
        prop_assert_eq!(records(&watching), records(&fresh));
        Ok((scans, by_events))
    }

    /// Whatever happens to the tree, the rescans from events report what full walks report.
    #[test]
    fn rescans_from_events_agree_with_full_walks() {
        use proptest::strategy::Strategy;
        let cases = std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(128);
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases,
            failure_persistence: None,
            ..proptest::test_runner::Config::default()
        });
        let totals = std::sync::Mutex::new((0, 0));
        let strategy = (
            proptest::collection::vec(op(), 0..12),
            proptest::collection::vec(op(), 1..40),
        );
        let result = runner.run(&strategy.boxed(), |(setup, ops)| {
            let (scans, by_events) = rescans_agree(&setup, &ops)?;
            let mut totals = totals.lock().unwrap();
            totals.0 += scans;
            totals.1 += by_events;
            Ok(())
        });
        if let Err(e) = result {
            panic!("{e}");
        }
        let (scans, by_events) = *totals.lock().unwrap();
        eprintln!("{scans} rescans, {by_events} from the events alone");
        assert!(
            by_events * 4 > scans,
            "most rescans walked: {by_events}/{scans}"
        );
    }
}
