//! What a [`Workspace`] does: open, read, write, remove and copy files beneath its root.

use super::*;

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
        let bytes = read_capped(fd, &resolved, MAX_READ_BYTES)?;
        Ok(FileContents {
            sha256: sha256_hex(&bytes),
            path: resolved,
            bytes,
        })
    }

    /// [`Workspace::read`] of a file of at most `max` bytes, or `None` when it is larger (or
    /// grew past `max` while it was read): then nothing is returned and the caller reads it
    /// with [`Workspace::read`]. The open never waits (non-blocking, and FIFOs and devices are
    /// refused before a byte is read) and at most `max + 1` bytes are read, so a caller on an
    /// async worker may read a small file in place instead of handing it to a blocking thread.
    pub fn read_if_small(&self, path: &str, max: u64) -> Result<Option<FileContents>, JailError> {
        let target = parse_path(path)?;
        let shown = &target.display;
        let (fd, st) = self.open_for_reading(&target, check_readable)?;
        if file_size(&st) > max {
            return Ok(None);
        }
        let resolved = self
            .relative_path_of(fd.as_fd())
            .unwrap_or_else(|| shown.clone());
        let bytes = match read_capped(fd, &resolved, max) {
            Ok(bytes) => bytes,
            Err(JailError::TooLarge { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some(FileContents {
            sha256: sha256_hex(&bytes),
            path: resolved,
            bytes,
        }))
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
    pub(super) fn open_for_reading(
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

    pub(super) fn open_beneath_root(
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
    pub(super) fn open_or_create_parent(
        &self,
        parent: &str,
        shown: &str,
    ) -> Result<OwnedFd, JailError> {
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
    pub(super) fn existing_target(
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
        let bytes = read_capped(fd, shown, MAX_READ_BYTES)?;
        let before = Before::File {
            sha256: sha256_hex(&bytes),
            size: bytes.len() as u64,
            bytes,
        };
        Ok((before, Some(opened)))
    }

    /// The resolved workspace-relative path of `name` inside an opened parent directory.
    pub(super) fn resolved_child(&self, parent: &OwnedFd, name: &str, shown: &str) -> String {
        match self.relative_path_of(parent.as_fd()) {
            Some(dir) if dir == "." => name.to_owned(),
            Some(dir) => format!("{dir}/{name}"),
            None => shown.to_owned(),
        }
    }

    /// The workspace-relative path of an open descriptor, from the kernel's own record of it
    /// (`/proc/self/fd`). `None` if /proc is unavailable or the descriptor is not under the root.
    pub(super) fn relative_path_of(&self, fd: BorrowedFd<'_>) -> Option<String> {
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
