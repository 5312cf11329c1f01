//! What a [`WorkspaceDir`] does: list, stat, read and hash one directory's entries, one at a time.

use super::*;

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
        let bytes = read_capped(fd, &path, MAX_READ_BYTES)?;
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

    pub(super) fn child_path(&self, entry: &Entry) -> String {
        if self.path == "." {
            entry.name.clone()
        } else {
            format!("{}/{}", self.path, entry.name)
        }
    }
}
