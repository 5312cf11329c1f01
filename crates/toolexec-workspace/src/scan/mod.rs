//! The workspace scanner: what a process changed in the workspace, recorded like the file tools'
//! changes.
//!
//! After a mutating call that the jail did not see file by file (a sandboxed `shell` command),
//! the engine asks a [`Snapshot`] of the workspace what was created, modified and deleted since
//! the last scan. A snapshot keeps, for every regular file and symlink, its metadata and the
//! SHA-256 of its contents, and a rescan hashes again only the entries whose metadata changed.
//!
//! The parts: this module holds the snapshot, its records and the scan's driver; `watcher`
//! the inotify side (which names to look at again); `walk` one scan's visit of the tree
//! (inspection, hashing within the budget, the changes); `pool` the node's inotify instances.
//! What a rescan looks at, when it walks, racily clean files, what a hostile process can and
//! cannot do to it and what a scan may cost: docs/design.md, "The scanner in detail".
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
#[cfg(test)]
mod tests;
mod walk;
mod watcher;

pub use pool::InotifyPool;
use pool::{Lease, Refused};
use walk::{Walk, change};
use watcher::{Plan, Watcher, join, split, subtree_bounds, within};

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

    /// The report of a rescan that needs nothing from the workspace, when that can be told at
    /// once: the snapshot watches every directory, no event is queued on its inotify instance,
    /// no entry is left to recheck and no full walk is due. A rescan would then inspect nothing
    /// and report no change — what this returns, without the rescan's syscalls or a hand-off
    /// to a blocking thread (the usual case after a command that only read). The snapshot is
    /// left as it was: the next rescan covers everything since the last one that ran, as it
    /// would have. `None`: call [`Snapshot::rescan_within`] — also when the pool of inotify
    /// instances is busy (this never waits for it) and when the root itself is gone (its watch
    /// says nothing while the jail holds it open; the rescan reports it).
    pub fn rescan_if_quiet(&self, ws: &Workspace) -> Option<ScanReport> {
        let watcher = self.watcher.as_ref()?;
        if self.unwatched.is_some()
            || watcher.failed
            || watcher.walk_next.is_some()
            || !watcher.recheck.is_empty()
            || watcher.last_full_walk.elapsed() >= FULL_WALK_INTERVAL
        {
            return None;
        }
        // Not attached when the pool closed the instance for another session: its watches
        // are gone, and the rescan must walk.
        let fd = watcher.lease.try_attach()?;
        if rustix::io::ioctl_fionread(&*fd).ok()? != 0
            || rustix::fs::fstat(ws.root_fd()).ok()?.st_nlink == 0
        {
            return None;
        }
        Some(ScanReport {
            changes: Vec::new(),
            files: self.entries.len(),
            hashed: 0,
            hashed_bytes: 0,
            kept_bytes: 0,
            full_walk: None,
        })
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
