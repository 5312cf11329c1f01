//! The inotify side of a snapshot: which names a rescan must look at again.

use super::*;

/// The inotify side of a snapshot: one instance, a watch on every directory of the workspace.
#[derive(Debug)]
pub(super) struct Watcher {
    /// The instance's place in the pool, which keeps the instance between scans (and may close
    /// it then, for another snapshot).
    pub(super) lease: Lease,
    /// The instance, while a scan runs ([`Watcher::attach`]).
    pub(super) fd: Option<Arc<OwnedFd>>,
    /// Watch descriptor → the workspace-relative path of the directory it watches (empty for the
    /// root), where the walk that added the watch found it.
    pub(super) dirs: HashMap<i32, Key>,
    /// The reverse: the watched directories.
    pub(super) wds: BTreeMap<Key, i32>,
    /// Watches taken out of the maps during a scan: removed at its end unless a walk found their
    /// directory again (a moved directory keeps its watch, under its new path).
    pub(super) orphans: BTreeSet<i32>,
    /// Paths whose watches were forgotten during this scan (to be found again by a walk):
    /// watching the directory there again most likely adds no watch.
    pub(super) forgotten: BTreeSet<Key>,
    /// Entries the next rescan inspects whatever the events say (see [`Meta::recheck`]), and
    /// entries this one could not inspect.
    pub(super) recheck: BTreeSet<Key>,
    /// Set when the next rescan cannot trust the events alone.
    pub(super) walk_next: Option<FullWalkReason>,
    /// A watch could not be added: the snapshot drops its inotify instance after this scan.
    pub(super) failed: bool,
    pub(super) last_full_walk: Instant,
}

/// What the events say to look at.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// Directory → names in it to inspect → whether a directory was created, deleted or moved at
    /// the name (then what is below it is looked at again too).
    pub(super) dirs: BTreeMap<Key, BTreeMap<Key, bool>>,
    /// The previous scan's entries to inspect again ([`Watcher::recheck`]).
    pub(super) carried: Vec<Key>,
}

impl Plan {
    pub(super) fn touch(&mut self, dir: &[u8], name: &[u8], structural: bool) {
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
    pub(super) fn open(pool: &Arc<InotifyPool>, reason: FullWalkReason) -> Result<Self, Refused> {
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
    pub(super) fn attach(&mut self) -> bool {
        self.fd = self.lease.attach();
        self.fd.is_some()
    }

    /// Gives the instance back to the pool after a scan, with the count of its watches.
    pub(super) fn detach(&mut self) {
        self.fd = None;
        self.forgotten.clear();
        self.lease.detach(self.dirs.len());
    }

    /// Watches an open directory (or finds its watch), known by `path` from now on.
    pub(super) fn watch(&mut self, dir: &WorkspaceDir, path: &[u8]) {
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

    pub(super) fn cap_reached(&mut self) {
        tracing::warn!(
            "the service's share of inotify watches is used up (limits.max_inotify_watches): every rescan of this workspace walks all of it for a while"
        );
        self.failed = true;
    }

    pub(super) fn add_watch(&mut self, dir: &WorkspaceDir) -> Result<i32, Errno> {
        let Some(fd) = self.fd.as_deref() else {
            return Err(Errno::BADF);
        };
        let by_fd = format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd());
        inotify::add_watch(fd, by_fd.as_str(), WATCH_MASK)
    }

    /// Records that `wd` watches the directory at `path`, and nothing else watches it (a
    /// directory found again at a new path keeps its watch descriptor).
    pub(super) fn map(&mut self, wd: i32, path: &[u8]) {
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
    pub(super) fn forget_below(&mut self, path: &[u8]) {
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

    pub(super) fn forget_all(&mut self) {
        self.orphans.extend(self.dirs.drain().map(|(wd, _)| wd));
        self.forgotten
            .extend(std::mem::take(&mut self.wds).into_keys());
    }

    /// Removes the watches no directory was found for again.
    pub(super) fn release_orphans(&mut self) {
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
    pub(super) fn drain(
        &mut self,
        entries: &BTreeMap<Key, Record>,
    ) -> Result<Plan, FullWalkReason> {
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
pub(super) enum Occupant {
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
pub(super) struct Names {
    pub(super) occupants: HashMap<Key, Occupant>,
    /// Files being moved, by cookie: whether what moved was [`Occupant::Known`].
    pub(super) moving: HashMap<u32, bool>,
    /// Directories being moved (within the watched tree), by cookie.
    pub(super) moving_dirs: BTreeSet<u32>,
    /// Watches whose directory was deleted (`IN_DELETE_SELF`).
    pub(super) deleted_dirs: BTreeSet<i32>,
}

impl Names {
    pub(super) fn follow(
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
    pub(super) fn finish(self) -> Result<(), FullWalkReason> {
        if self.moving.values().any(|known| !known) {
            return Err(FullWalkReason::TransientFile);
        }
        Ok(())
    }
}

/// An entry's path from its directory's and its name.
pub(super) fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(dir.len() + 1 + name.len());
    if !dir.is_empty() {
        path.extend_from_slice(dir);
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// The directory and the name of an entry's path.
pub(super) fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(slash) => (&path[..slash], &path[slash + 1..]),
        None => (&[], path),
    }
}

/// The bounds of the keys below the directory `dir` (not the root): from `dir/` to `dir0`.
pub(super) fn subtree_bounds(dir: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut start = dir.to_vec();
    start.push(b'/');
    let mut end = dir.to_vec();
    end.push(b'/' + 1);
    (start, end)
}

/// Whether `path` is one of the directories walked, or below one.
pub(super) fn within(walked: &BTreeSet<Key>, path: &[u8]) -> bool {
    !walked.is_empty()
        && (walked.contains(path)
            || path
                .iter()
                .enumerate()
                .any(|(i, &b)| b == b'/' && walked.contains(&path[..i])))
}
