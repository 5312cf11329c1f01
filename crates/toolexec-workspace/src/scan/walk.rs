//! One scan of the workspace: the visit of the tree, inspection, hashing within the budget.

use super::*;

/// One scan of the workspace, updating the records of the previous scan.
pub(super) struct Walk<'a> {
    pub(super) ws: &'a Workspace,
    pub(super) entries: &'a mut BTreeMap<Key, Record>,
    /// Records seen by this scan carry this generation; those looked for and not seen are
    /// deleted after it.
    pub(super) generation: u64,
    /// When the previous scan started (for the racy check).
    pub(super) previous_started_ns: i128,
    /// When this scan started (which entries the next rescan inspects anyway).
    pub(super) started_ns: i128,
    /// Whether changes are reported; a capture reports none and keeps no contents.
    pub(super) report: bool,
    /// The budget ([`ScanBudget`]): the largest file whose contents are kept, what is left of
    /// the contents and hash budgets, and when hashing stops.
    pub(super) keep_up_to: usize,
    pub(super) content_left: u64,
    pub(super) hash_left: u64,
    pub(super) deadline: Option<Instant>,
    /// The changes whose contents are kept, largest first: (bytes, index in `changes`).
    pub(super) kept: BinaryHeap<(usize, usize)>,
    /// The changes found, with their raw paths (the order of the report).
    pub(super) changes: Vec<(Key, RecordedChange)>,
    pub(super) hashed: usize,
    pub(super) hashed_bytes: u64,
    /// The path of the entry being visited (reused between entries).
    pub(super) path: Vec<u8>,
    /// Where the directories walked are watched.
    pub(super) watcher: Option<&'a mut Watcher>,
    /// Why the next rescan must walk everything.
    pub(super) walk_next: Option<FullWalkReason>,
    /// A file was seen with more than one link at a name that had not recorded that file with
    /// more than one link.
    pub(super) new_link: bool,
    /// Entries the next rescan inspects anyway.
    pub(super) recheck: Vec<Key>,
    /// Racily clean files, read at the end of the scan ([`Walk::reread_deferred`]).
    pub(super) deferred: Vec<Key>,
    /// From events: names inspected and directories walked or gone, below which records not
    /// seen by this scan are deleted.
    pub(super) sweep_keys: Vec<Key>,
    pub(super) sweep_below: Vec<Key>,
}

impl Walk<'_> {
    /// Everything, from the root (watched, then listed, by the caller).
    pub(super) fn full(&mut self, root: &WorkspaceDir, root_entries: &[Entry]) {
        let mut pending = Vec::new();
        self.visit_dir(root, b"", root_entries, &mut pending);
        self.walk(pending);
    }

    /// After events, the whole workspace again, in the same generation: what the events led to
    /// is not inspected twice. False if the root cannot be listed (the next rescan walks).
    pub(super) fn full_again(&mut self, root: &WorkspaceDir) -> bool {
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
    pub(super) fn walk(&mut self, mut pending: Vec<Vec<u8>>) {
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
    pub(super) fn unwalkable(&mut self, dir_path: &[u8]) {
        self.keep_below(dir_path);
        self.walk_next.get_or_insert(FullWalkReason::Unwatched);
    }

    pub(super) fn watch(&mut self, dir: &WorkspaceDir, path: &[u8]) {
        if let Some(watcher) = self.watcher.as_deref_mut() {
            watcher.watch(dir, path);
        }
    }

    /// What the events name, by directory (parents before children).
    pub(super) fn incremental(&mut self, plan: Plan) -> Vec<Key> {
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
    pub(super) fn inspect(
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
    pub(super) fn forget_below(&mut self, path: &[u8]) {
        if let Some(watcher) = self.watcher.as_deref_mut() {
            watcher.forget_below(path);
        }
        self.sweep_below.push(path.into());
    }

    pub(super) fn visit_dir(
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
    pub(super) fn visit_entry(&mut self, dir: &WorkspaceDir, entry: &Entry, st: &ChildStat) {
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
    pub(super) fn record(&mut self, dir: &WorkspaceDir, entry: &Entry, st: &ChildStat) {
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
                self.unkeep(after);
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
    pub(super) fn reread_deferred(&mut self) {
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
    pub(super) fn push_change(&mut self, key: Key, change: RecordedChange) {
        if !self.report {
            return;
        }
        if let Some(after) = &change.after {
            self.kept.push((after.len(), self.changes.len()));
        }
        self.changes.push((key, change));
    }

    /// Contents read but not reported (the file's contents did not change): back to the budget.
    pub(super) fn unkeep(&mut self, after: After) {
        if let Ok(bytes) = after {
            self.content_left = self.content_left.saturating_add(bytes.len() as u64);
        }
    }

    /// How many bytes of a file of `size` bytes may be kept, making room (if `evict`) by dropping
    /// the contents of larger files kept before it (so that the budget keeps the small files,
    /// and as many of them as it can); the reason when none.
    pub(super) fn allowance(&mut self, size: u64, evict: bool) -> Result<usize, UnstoredReason> {
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

    pub(super) fn past_deadline(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }
    /// Reads an entry whose metadata changed (or cannot be trusted yet). `None` when it vanished
    /// (then it is deleted) or changed type since its `stat` (then its previous record is kept,
    /// and the next rescan looks again: its metadata differs). `evict`: whether its contents may
    /// take the place of contents kept before it.
    pub(super) fn read(
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
    pub(super) fn keep(&mut self) {
        if let Some(old) = self.entries.get_mut(self.path.as_slice()) {
            old.seen = self.generation;
            self.recheck.push(self.path.as_slice().into());
        }
    }

    /// Keeps the previous records below a directory that could not be walked.
    pub(super) fn keep_below(&mut self, dir: &[u8]) {
        let (start, end) = subtree_bounds(dir);
        let range = (Bound::Included(&start[..]), Bound::Excluded(&end[..]));
        for (_, record) in self.entries.range_mut::<[u8], _>(range) {
            record.seen = self.generation;
        }
    }
}

/// The contents of a file after a change, or why they are not kept.
pub(super) type After = Result<Vec<u8>, UnstoredReason>;

/// A change of the entry at `key`, from `before` to `after` (`contents`: `Err(None)` for a
/// deletion).
pub(super) fn change(
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
