//! The workspace scanner: what a process changed in the workspace, recorded like the file tools'
//! changes.
//!
//! After a mutating call that the jail did not see file by file (a sandboxed `shell` command),
//! the engine asks a [`Snapshot`] of the workspace what was created, modified and deleted since
//! the last scan. A snapshot keeps, for every regular file and symlink, its metadata (device,
//! inode, size, mtime and ctime to the nanosecond, mode, link count) and the SHA-256 of its
//! contents. A rescan makes one `statat(AT_SYMLINK_NOFOLLOW)` per entry and hashes only the
//! entries whose metadata changed, so an unchanged workspace of ten thousand files costs a few
//! milliseconds.
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
//! checked on the opened descriptor before a byte is read. What is recorded:
//!
//! - Regular files, with the SHA-256 of their contents, hashed streaming (at most the size seen at
//!   the open is read, so a file that keeps growing cannot keep the scan going). Their contents
//!   are returned only when small enough (`keep_up_to`).
//! - **Files with more than one hard link are never read**: a hard link may lead to a file from
//!   outside the workspace. They are recorded by metadata only, with no hash and no contents
//!   (`after_sha256` absent), and reported modified when their inode, size or mtime changes. The
//!   same goes for files over [`MAX_HASH_BYTES`] (a sparse file can claim terabytes) and files the
//!   service may not read.
//! - Symlinks, never followed: their target text is the contents (hashed, returned as `after`,
//!   and given in [`FileChange::symlink_target`]). A change between a regular file and a symlink
//!   at the same path is reported as `modified`.
//! - Not directories themselves, only what is in them: a directory that appears or disappears
//!   shows as its files created or deleted. Everything is walked, `.git`, `node_modules` and
//!   `target` included: replaying a session needs all of it.
//! - Not FIFOs, sockets and devices: they are ignored (never opened).
//!
//! A race never fails the scan: an entry that disappears between the listing and its inspection
//! is gone, a directory that disappears or turns into a symlink or file before it is opened has
//! its previous contents reported deleted, and an entry that changes type between its `stat` and
//! its open is left as the previous scan saw it (its new metadata differs, so the next rescan
//! looks again). A directory or entry that cannot be inspected for another reason (permissions,
//! a mount point, a path over `PATH_MAX`) also keeps its previous records rather than reporting
//! them deleted. Only an unusable workspace root is an error.
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use toolexec_core::{Capability, FileChange, FileChangeKind, sha256_hex};

use crate::RecordedChange;
use crate::workspace::{
    ChildStat, Entry, EntryKind, JailError, MAX_PATH_BYTES, Workspace, WorkspaceDir,
};

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

/// A path relative to the workspace root as raw bytes, components joined with `/`.
type Key = Box<[u8]>;

type Sha = [u8; 32];

/// What the last scan saw of the workspace: every regular file and symlink with its metadata and
/// content hash. [`Snapshot::default`] is an empty workspace (a rescan of it reports every file
/// as created).
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    entries: BTreeMap<Key, Record>,
    /// When the scan that recorded `entries` started, nanoseconds since the Unix epoch.
    started_ns: i128,
    /// Counts the scans.
    generation: u64,
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
    /// A regular file whose contents were not read: more than one hard link, over
    /// [`MAX_HASH_BYTES`], or unreadable.
    Unread,
}

impl Record {
    fn sha256(&self) -> Option<String> {
        match &self.content {
            Content::File { sha256, .. } | Content::Symlink { sha256, .. } => {
                Some(hex::encode(sha256))
            }
            Content::Unread => None,
        }
    }

    fn size(&self) -> u64 {
        match &self.content {
            Content::File { size, .. } => *size,
            Content::Symlink { target, .. } => target.len() as u64,
            Content::Unread => self.meta.size,
        }
    }

    fn symlink_target(&self) -> Option<String> {
        match &self.content {
            Content::Symlink { target, .. } => Some(String::from_utf8_lossy(target).into_owned()),
            _ => None,
        }
    }

    /// Whether two records hold the same contents. Unread files are compared by identity, size
    /// and mtime, the best there is without reading them.
    fn same_contents(&self, other: &Record) -> bool {
        match (&self.content, &other.content) {
            (Content::File { sha256: a, .. }, Content::File { sha256: b, .. })
            | (Content::Symlink { sha256: a, .. }, Content::Symlink { sha256: b, .. }) => a == b,
            (Content::Unread, Content::Unread) => {
                let (a, b) = (&self.meta, &other.meta);
                (a.dev, a.ino, a.size, a.mtime_ns) == (b.dev, b.ino, b.size, b.mtime_ns)
            }
            _ => false,
        }
    }
}

impl Snapshot {
    /// The baseline of the workspace as it is now (every regular file hashed). Reports nothing.
    pub fn capture(ws: &Workspace) -> Result<Self, JailError> {
        let mut snapshot = Self::default();
        snapshot.scan(ws, None)?;
        Ok(snapshot)
    }

    /// Walks the workspace again, returns what changed since the last capture or rescan, and
    /// becomes the new baseline. The contents of created and modified files (and the target text
    /// of symlinks) are returned in [`RecordedChange::after`] when there are at most
    /// `keep_up_to` bytes of them.
    pub fn rescan(&mut self, ws: &Workspace, keep_up_to: usize) -> Result<ScanReport, JailError> {
        self.scan(ws, Some(keep_up_to))
    }

    /// How many regular files and symlinks the snapshot holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Updates the records in place: an unchanged entry costs one `statat` and one lookup, no
    /// allocation; entries no longer seen are swept out at the end as deletions.
    fn scan(&mut self, ws: &Workspace, keep_up_to: Option<usize>) -> Result<ScanReport, JailError> {
        let started_ns = now_ns();
        // The root is the one thing that must work; nothing is changed before it does.
        let root = ws.open_dir_exact(b"")?;
        if root.stat()?.nlink == 0 {
            return Err(JailError::NotFound {
                path: root.path().to_owned(),
            });
        }
        let root_entries = root.entries()?;
        self.generation += 1;
        let mut walk = Walk {
            ws,
            entries: &mut self.entries,
            generation: self.generation,
            previous_started_ns: self.started_ns,
            keep_up_to,
            changes: Vec::new(),
            hashed: 0,
            path: Vec::new(),
        };
        walk.run(&root, &root_entries);
        let Walk {
            mut changes,
            hashed,
            ..
        } = walk;
        let generation = self.generation;
        self.entries.retain(|key, record| {
            let seen = record.seen == generation;
            if !seen && keep_up_to.is_some() {
                changes.push(change(
                    FileChangeKind::Deleted,
                    key,
                    Some(record),
                    None,
                    None,
                ));
            }
            seen
        });
        self.started_ns = started_ns;
        // Byte order of paths, except where lossy decoding changed a name.
        changes.sort_by(|a, b| a.change.path.cmp(&b.change.path));
        Ok(ScanReport {
            changes,
            files: self.entries.len(),
            hashed,
        })
    }
}

/// One walk of the workspace, updating the records of the previous scan.
struct Walk<'a> {
    ws: &'a Workspace,
    entries: &'a mut BTreeMap<Key, Record>,
    /// Records seen by this walk carry this generation; the others are deleted after it.
    generation: u64,
    /// When the previous scan started (for the racy check).
    previous_started_ns: i128,
    /// `None` when nothing is reported (a capture): no contents are kept.
    keep_up_to: Option<usize>,
    changes: Vec<RecordedChange>,
    hashed: usize,
    /// The path of the entry being visited (reused between entries).
    path: Vec<u8>,
}

impl Walk<'_> {
    /// Depth first, one open directory at a time: each directory is opened by its path from the
    /// root with no symlink allowed on the way, so deep trees cost no descriptors.
    fn run(&mut self, root: &WorkspaceDir, root_entries: &[Entry]) {
        let mut pending: Vec<Vec<u8>> = Vec::new();
        self.visit_dir(root, b"", root_entries, &mut pending);
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
                    self.keep_below(&dir_path);
                    continue;
                }
            };
            match dir.entries() {
                Ok(entries) => self.visit_dir(&dir, &dir_path, &entries, &mut pending),
                Err(_) => self.keep_below(&dir_path),
            }
        }
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
                // Too deep to open by path: what is below stays as the last scan saw it.
                EntryKind::Dir => {
                    let path = std::mem::take(&mut self.path);
                    self.keep_below(&path);
                    self.path = path;
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
        if let Some(old) = self.entries.get_mut(self.path.as_slice())
            && old.meta == meta
            && !old.meta.racy(self.previous_started_ns)
        {
            old.seen = self.generation;
            return;
        }
        let Some((record, contents)) = self.read(dir, entry, st) else {
            return;
        };
        let keep_up_to = self.keep_up_to;
        match self.entries.get_mut(self.path.as_slice()) {
            Some(old) => {
                if !old.same_contents(&record) && keep_up_to.is_some() {
                    let key = self.path.as_slice();
                    let modified = FileChangeKind::Modified;
                    self.changes
                        .push(change(modified, key, Some(old), Some(&record), contents));
                }
                *old = record;
            }
            None => {
                if keep_up_to.is_some() {
                    let key = self.path.as_slice();
                    let created = FileChangeKind::Created;
                    self.changes
                        .push(change(created, key, None, Some(&record), contents));
                }
                self.entries
                    .insert(self.path.clone().into_boxed_slice(), record);
            }
        }
    }

    /// Reads an entry whose metadata changed. `None` when it vanished (then it is deleted) or
    /// changed type since its `stat` (then its previous record is kept, and the next rescan
    /// looks again: its metadata differs).
    fn read(
        &mut self,
        dir: &WorkspaceDir,
        entry: &Entry,
        st: &ChildStat,
    ) -> Option<(Record, Option<Vec<u8>>)> {
        let meta = Meta::from(st);
        let seen = self.generation;
        let keep_up_to = self.keep_up_to.unwrap_or(0);
        let unread = |meta| Record {
            meta,
            content: Content::Unread,
            seen,
        };
        if st.kind == EntryKind::Symlink {
            return match dir.link_target(entry) {
                Ok(target) => {
                    self.hashed += 1;
                    let sha256 = sha256_bytes(&target);
                    let contents = (target.len() <= keep_up_to).then(|| target.clone());
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
                        contents,
                    ))
                }
                Err(JailError::NotFound { .. }) => None,
                Err(_) => {
                    self.keep();
                    None
                }
            };
        }
        if st.nlink > 1 || st.size > MAX_HASH_BYTES {
            // Never opened: a hard link may lead out of the workspace.
            return Some((unread(meta), None));
        }
        match dir.hash_child(entry, keep_up_to, MAX_HASH_BYTES) {
            Ok(hashed) => {
                self.hashed += 1;
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
                    hashed.kept,
                ))
            }
            Err(JailError::NotFound { .. }) => None,
            // Hard-linked or grown too large since the stat, or unreadable (permissions).
            Err(JailError::HardLink { .. } | JailError::TooLarge { .. } | JailError::Io { .. }) => {
                Some((unread(meta), None))
            }
            // Not a regular file any more.
            Err(_) => {
                self.keep();
                None
            }
        }
    }

    /// Keeps the previous record of the entry at `self.path`, which could not be inspected.
    fn keep(&mut self) {
        if let Some(old) = self.entries.get_mut(self.path.as_slice()) {
            old.seen = self.generation;
        }
    }

    /// Keeps the previous records below a directory that could not be walked.
    fn keep_below(&mut self, dir: &[u8]) {
        let mut start = dir.to_vec();
        start.push(b'/');
        let mut end = dir.to_vec();
        end.push(b'/' + 1);
        let range = (
            std::ops::Bound::Included(start.as_slice()),
            std::ops::Bound::Excluded(end.as_slice()),
        );
        for (_, record) in self.entries.range_mut::<[u8], _>(range) {
            record.seen = self.generation;
        }
    }
}

/// A change of the entry at `key`, from `before` to `after`.
fn change(
    kind: FileChangeKind,
    key: &[u8],
    before: Option<&Record>,
    after: Option<&Record>,
    contents: Option<Vec<u8>>,
) -> RecordedChange {
    RecordedChange {
        change: FileChange {
            kind,
            path: String::from_utf8_lossy(key).into_owned(),
            before_sha256: before.and_then(Record::sha256),
            after_sha256: after.and_then(Record::sha256),
            before_size: before.map(Record::size),
            after_size: after.map(Record::size),
            after_stored: contents.is_some(),
            capability: Capability::Process,
            symlink_target: after.and_then(Record::symlink_target),
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
    fn metadata_only_changes_rehash_but_report_nothing() {
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
        fs::set_permissions(f.path("a.txt"), fs::Permissions::from_mode(0o600)).unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(report.hashed, 1);
        assert!(report.changes.is_empty());
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
        assert_eq!(report.hashed, 4);
    }

    #[test]
    fn names_that_are_not_utf8_are_shown_lossily() {
        use std::os::unix::ffi::OsStrExt;
        let f = Fixture::new();
        let mut snapshot = Snapshot::capture(&f.ws).unwrap();
        let name = std::ffi::OsStr::from_bytes(b"caf\xe9.txt");
        fs::write(f.root.join(name), b"latin-1").unwrap();
        let report = f.rescan(&mut snapshot);
        assert_eq!(kinds(&report), [(Created, "caf\u{fffd}.txt")]);
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
        let mut best = Duration::MAX;
        for _ in 0..5 {
            let started = Instant::now();
            let report = snapshot.rescan(&f.ws, 1024).unwrap();
            let elapsed = started.elapsed();
            best = best.min(elapsed);
            eprintln!("no-change rescan of 10,000 files: {elapsed:?}");
            assert!(report.changes.is_empty());
            assert_eq!(report.hashed, 0);
            assert_eq!(report.files, 10_000);
        }
        eprintln!("best no-change rescan of 10,000 files: {best:?}");

        f.write("d050/f050.txt", b"changed\n");
        let report = snapshot.rescan(&f.ws, 1024).unwrap();
        assert_eq!(kinds(&report), [(Modified, "d050/f050.txt")]);
        assert_eq!(report.hashed, 1);
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
}
