//! A workspace as the log says it was: the state after any event, folded from the file changes
//! the log holds (`file.created`, `file.modified`, `file.deleted`, the manifests of
//! `files.changed`, and what a rewind changed), and the operations that put such a state into
//! a directory — a fresh one (a fork's base) or a live workspace (a rewind).
//!
//! What the log cannot give back is said, never guessed: a file recorded by hash and size only
//! (over `limits.max_blob_bytes`, past a scan budget, hard-linked) is in the state with
//! `stored: false`, and putting the state into a directory names it as not restored.
//! Directories are not recorded (a scan reports files and symlinks): a rebuilt tree has the
//! directories its files imply, and an empty directory is not part of any state.
use std::collections::BTreeMap;

use toolexec_core::{FileChange, FileChangeKind, UnstoredReason, names};

use crate::scan::SeenEntry;
use crate::{JailError, Workspace};

/// Permission bits assumed for a file recorded before modes were.
pub const DEFAULT_FILE_MODE: u32 = 0o644;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Symlink,
}

/// One file or symlink of a state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub kind: EntryKind,
    /// SHA-256 of the contents (of the target text, for a symlink); absent when the file was
    /// not read when recorded.
    pub sha256: Option<String>,
    pub size: u64,
    /// Permission bits of a file (`0o777` for a symlink).
    pub mode: u32,
    /// A symlink's target, exactly.
    pub target: Option<Vec<u8>>,
    /// Whether the contents can be had from the store (a symlink's target always can).
    pub stored: bool,
    /// Why the contents are not stored, when they are not.
    pub unstored: Option<UnstoredReason>,
    /// The event that gave the entry this state.
    pub seq: i64,
}

impl Entry {
    /// Whether the log holds what is needed to put it back.
    pub fn restorable(&self) -> bool {
        self.kind == EntryKind::Symlink || (self.stored && self.sha256.is_some())
    }
}

/// Files and symlinks by their raw path bytes (workspace-relative), in byte order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    entries: BTreeMap<Vec<u8>, Entry>,
}

/// A recorded change that cannot be applied (a record this binary cannot read).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event {seq}: {reason}")]
pub struct BadChange {
    pub seq: i64,
    pub reason: String,
}

impl State {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one recorded change, made by the event `seq`.
    pub fn apply(&mut self, seq: i64, change: &FileChange) -> Result<(), BadChange> {
        let bad = |reason: &str| BadChange {
            seq,
            reason: format!("{}: {reason}", change.path),
        };
        let path = names::raw_bytes(&change.path, change.path_b64.as_deref())
            .ok_or_else(|| bad("the path cannot be decoded"))?;
        if change.kind == FileChangeKind::Deleted {
            self.entries.remove(&path);
            return Ok(());
        }
        let entry = match &change.symlink_target {
            Some(display) => {
                let target = names::raw_bytes(display, change.symlink_target_b64.as_deref())
                    .ok_or_else(|| bad("the symlink target cannot be decoded"))?;
                Entry {
                    kind: EntryKind::Symlink,
                    sha256: change.after_sha256.clone(),
                    size: target.len() as u64,
                    mode: 0o777,
                    target: Some(target),
                    stored: true,
                    unstored: None,
                    seq,
                }
            }
            None => Entry {
                kind: EntryKind::File,
                sha256: change.after_sha256.clone(),
                size: change.after_size.unwrap_or(0),
                mode: change.after_mode.unwrap_or(DEFAULT_FILE_MODE),
                target: None,
                stored: change.after_stored,
                unstored: change.after_unstored,
                seq,
            },
        };
        self.entries.insert(path, entry);
        Ok(())
    }

    pub fn get(&self, path: &[u8]) -> Option<&Entry> {
        self.entries.get(path)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &Entry)> {
        self.entries.iter().map(|(k, v)| (k.as_slice(), v))
    }

    /// Entries with paths after `after` (byte order), for paging.
    pub fn iter_after<'a>(
        &'a self,
        after: &'a [u8],
    ) -> impl Iterator<Item = (&'a [u8], &'a Entry)> {
        use std::ops::Bound;
        self.entries
            .range::<[u8], _>((Bound::Excluded(after), Bound::Unbounded))
            .map(|(k, v)| (k.as_slice(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Files whose contents the log does not hold.
    pub fn unrestorable(&self) -> impl Iterator<Item = (&[u8], &Entry)> {
        self.iter().filter(|(_, e)| !e.restorable())
    }

    /// The hashes of the contents needed to put this state into a directory (files only;
    /// unrestorable ones left out), each once.
    pub fn needed_blobs(&self) -> Vec<String> {
        blobs_of(self.entries.values().filter(|e| e.restorable()))
    }
}

/// The hashes of the contents of these entries' files, each once, sorted.
pub fn blobs_of<'e>(entries: impl IntoIterator<Item = &'e Entry>) -> Vec<String> {
    let mut shas: Vec<String> = entries
        .into_iter()
        .filter(|e| e.kind == EntryKind::File)
        .filter_map(|e| e.sha256.clone())
        .collect();
    shas.sort_unstable();
    shas.dedup();
    shas
}

/// What putting a state into a workspace did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Entries written (files and symlinks put back or created).
    pub written: Vec<Vec<u8>>,
    /// Entries removed.
    pub removed: Vec<Vec<u8>>,
    /// Files the state has but whose contents the log does not hold: left as they are in a
    /// live workspace, absent from a fresh one.
    pub unrestorable: Vec<Vec<u8>>,
}

/// The contents of a blob by its hash, from wherever the caller keeps them.
pub trait Contents {
    fn get(&self, sha256: &str) -> Option<&[u8]>;
}

impl Contents for std::collections::HashMap<String, bytes::Bytes> {
    fn get(&self, sha256: &str) -> Option<&[u8]> {
        std::collections::HashMap::get(self, sha256).map(|b| &b[..])
    }
}

/// What it takes to turn a workspace whose entries are `live` into a state: the entries to
/// remove (deepest first), those to write, and those the state has but cannot restore.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan<'s> {
    pub remove: Vec<Vec<u8>>,
    pub write: Vec<(&'s [u8], &'s Entry)>,
    pub unrestorable: Vec<Vec<u8>>,
}

impl Plan<'_> {
    /// The hashes of the contents the writes need, each once.
    pub fn needed_blobs(&self) -> Vec<String> {
        blobs_of(self.write.iter().map(|(_, e)| *e))
    }

    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.write.is_empty()
    }
}

/// The plan that puts `target` into a workspace whose entries are `live` right now (a fresh
/// workspace: none). Entries already as the state says are left alone; entries the state
/// cannot restore are left as they are in `live` (and listed).
pub fn plan<'a, 's>(
    live: impl IntoIterator<Item = (&'a [u8], SeenEntry<'a>)>,
    target: &'s State,
) -> Plan<'s> {
    let live: BTreeMap<&[u8], SeenEntry<'_>> = live.into_iter().collect();
    let mut plan = Plan::default();
    // Deepest first: a directory whose files all go frees its name for a file.
    for (path, _) in live.iter().rev() {
        if target.get(path).is_none() {
            plan.remove.push(path.to_vec());
        }
    }
    for (path, entry) in target.iter() {
        if same(live.get(path), entry) {
            continue;
        }
        if entry.restorable() {
            plan.write.push((path, entry));
        } else {
            plan.unrestorable.push(path.to_vec());
        }
    }
    plan
}

/// Entries an operation could not change, with why: a rewind goes on past them and records
/// what is really there; a fresh workspace fails on the first.
pub type Failed = Vec<(Vec<u8>, JailError)>;

/// Removes the plan's entries; the ones that were there. An entry that cannot be removed is
/// added to `failed` and the others are still removed.
pub fn remove(ws: &Workspace, plan: &Plan<'_>, failed: &mut Failed) -> Vec<Vec<u8>> {
    let mut removed = Vec::new();
    for path in &plan.remove {
        match ws.remove_entry(path) {
            Ok(true) => removed.push(path.clone()),
            Ok(false) => {}
            Err(e) => failed.push((path.clone(), e)),
        }
    }
    removed
}

/// Writes entries of a plan (all, or one batch of them whose contents are at hand). A file
/// whose contents `contents` does not have is left out and returned; one that cannot be
/// written is added to `failed` and the others are still written.
pub fn write(
    ws: &Workspace,
    entries: &[(&[u8], &Entry)],
    contents: &impl Contents,
    failed: &mut Failed,
) -> Vec<Vec<u8>> {
    let mut missing = Vec::new();
    for (path, entry) in entries {
        let done = match entry.kind {
            EntryKind::Symlink => {
                ws.restore_symlink(path, entry.target.as_deref().unwrap_or_default())
            }
            EntryKind::File => match entry.sha256.as_deref().and_then(|sha| contents.get(sha)) {
                Some(bytes) => ws.restore_file(path, bytes, entry.mode),
                None => {
                    missing.push(path.to_vec());
                    Ok(())
                }
            },
        };
        if let Err(e) = done {
            failed.push((path.to_vec(), e));
        }
    }
    missing
}

/// [`plan`], [`remove`] and [`write()`] in one step, with every content at hand; fails on the
/// first entry it cannot change.
pub fn apply<'a>(
    ws: &Workspace,
    live: impl IntoIterator<Item = (&'a [u8], SeenEntry<'a>)>,
    target: &State,
    contents: &impl Contents,
) -> Result<Applied, JailError> {
    let plan = plan(live, target);
    let mut failed = Failed::new();
    let removed = remove(ws, &plan, &mut failed);
    let missing = write(ws, &plan.write, contents, &mut failed);
    if let Some((_, e)) = failed.into_iter().next() {
        return Err(e);
    }
    let written = plan
        .write
        .iter()
        .map(|(p, _)| p.to_vec())
        .filter(|p| !missing.contains(p))
        .collect();
    let mut unrestorable = plan.unrestorable;
    unrestorable.extend(missing);
    Ok(Applied {
        written,
        removed,
        unrestorable,
    })
}

/// Whether a live entry already is what the state says (a file not read when scanned never is).
pub fn same(live: Option<&SeenEntry<'_>>, entry: &Entry) -> bool {
    match (live, entry.kind) {
        (Some(SeenEntry::File { sha256, mode, .. }), EntryKind::File) => {
            sha256.is_some() && *sha256 == entry.sha256 && *mode == entry.mode
        }
        (Some(SeenEntry::Symlink { target }), EntryKind::Symlink) => {
            Some(*target) == entry.target.as_deref()
        }
        _ => false,
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests look at the result on the host"
)]
mod tests {
    use std::collections::HashMap;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use toolexec_core::{Capability, sha256_hex};

    use super::*;
    use crate::scan::Snapshot;

    fn change(kind: FileChangeKind, path: &str, contents: Option<&[u8]>) -> FileChange {
        FileChange {
            kind,
            path: path.into(),
            path_b64: None,
            before_sha256: None,
            after_sha256: contents.map(sha256_hex),
            before_size: None,
            after_size: contents.map(|c| c.len() as u64),
            after_stored: contents.is_some(),
            after_unstored: None,
            after_mode: contents.map(|_| 0o644),
            capability: Capability::FsWrite,
            symlink_target: None,
            symlink_target_b64: None,
        }
    }

    #[test]
    fn a_fold_keeps_the_last_change_of_each_path() {
        let mut s = State::new();
        s.apply(2, &change(FileChangeKind::Created, "a", Some(b"1")))
            .unwrap();
        s.apply(3, &change(FileChangeKind::Created, "b", Some(b"2")))
            .unwrap();
        s.apply(4, &change(FileChangeKind::Modified, "a", Some(b"3")))
            .unwrap();
        s.apply(5, &change(FileChangeKind::Deleted, "b", None))
            .unwrap();
        assert_eq!(s.len(), 1);
        let a = s.get(b"a").unwrap();
        assert_eq!((a.seq, a.sha256.clone()), (4, Some(sha256_hex(b"3"))));
        let mut link = change(FileChangeKind::Created, "l", Some(b"a"));
        link.symlink_target = Some("a".into());
        link.after_mode = None;
        s.apply(6, &link).unwrap();
        assert_eq!(s.get(b"l").unwrap().kind, EntryKind::Symlink);
        let mut big = change(FileChangeKind::Created, "big", Some(b"xx"));
        big.after_stored = false;
        big.after_unstored = Some(UnstoredReason::TooLarge);
        s.apply(7, &big).unwrap();
        let names: Vec<&[u8]> = s.unrestorable().map(|(p, _)| p).collect();
        assert_eq!(names, [b"big".as_slice()]);
    }

    #[test]
    fn applying_a_state_to_a_live_workspace_makes_it_that_state() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        let ws = Workspace::create(&root).unwrap();
        fs::create_dir_all(root.join("later/deep")).unwrap();
        fs::write(root.join("later/deep/f"), b"made later").unwrap();
        fs::write(root.join("kept"), b"new contents").unwrap();
        fs::write(root.join("same"), b"same").unwrap();
        let mut target = State::new();
        let mut contents = HashMap::new();
        for (path, body, mode) in [
            ("kept", &b"old contents"[..], 0o755),
            ("same", b"same", 0o644),
            ("gone/x", b"deleted later", 0o600),
        ] {
            let mut c = change(FileChangeKind::Created, path, Some(body));
            c.after_mode = Some(mode);
            target.apply(1, &c).unwrap();
            contents.insert(sha256_hex(body), bytes::Bytes::copy_from_slice(body));
        }
        fs::set_permissions(root.join("same"), fs::Permissions::from_mode(0o644)).unwrap();
        let snap = Snapshot::capture(&ws).unwrap();
        let applied = apply(&ws, snap.entries(), &target, &contents).unwrap();
        assert_eq!(applied.removed, vec![b"later/deep/f".to_vec()]);
        assert_eq!(applied.written.len(), 2, "{applied:?}");
        assert_eq!(fs::read(root.join("kept")).unwrap(), b"old contents");
        assert_eq!(
            fs::metadata(root.join("kept"))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777,
            0o755
        );
        assert_eq!(fs::read(root.join("gone/x")).unwrap(), b"deleted later");
        assert_eq!(
            fs::metadata(root.join("gone/x"))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777,
            0o600
        );
        // Applying it again changes nothing.
        let snap = Snapshot::capture(&ws).unwrap();
        let again = apply(&ws, snap.entries(), &target, &contents).unwrap();
        assert_eq!(again, Applied::default());
    }

    #[test]
    fn an_entry_that_cannot_be_changed_does_not_stop_the_others() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        let ws = Workspace::create(&root).unwrap();
        fs::write(root.join("plain"), b"p").unwrap();
        // A name longer than a directory entry can be fails wherever it comes; the rest goes on.
        let long = "n".repeat(300);
        let plan = Plan {
            remove: vec![long.as_bytes().to_vec(), b"plain".to_vec()],
            ..Plan::default()
        };
        let mut failed = Failed::new();
        let removed = remove(&ws, &plan, &mut failed);
        assert_eq!(removed, vec![b"plain".to_vec()]);
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert_eq!(failed[0].0, long.as_bytes());
        let mut target = State::new();
        let mut contents = HashMap::new();
        for path in [long.as_str(), "z"] {
            target
                .apply(1, &change(FileChangeKind::Created, path, Some(b"new")))
                .unwrap();
        }
        contents.insert(sha256_hex(b"new"), bytes::Bytes::from_static(b"new"));
        let entries: Vec<(&[u8], &Entry)> = target.iter().collect();
        let mut failed = Failed::new();
        let missing = write(&ws, &entries, &contents, &mut failed);
        assert!(missing.is_empty());
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert_eq!(failed[0].0, long.as_bytes());
        assert_eq!(fs::read(root.join("z")).unwrap(), b"new");
        // As one step on a fresh workspace, the first failure fails it.
        fs::remove_file(root.join("z")).unwrap();
        let snap = Snapshot::capture(&ws).unwrap();
        assert!(apply(&ws, snap.entries(), &target, &contents).is_err());
    }
}
