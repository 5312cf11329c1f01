//! The jail's system calls: openat2 with retries, errno to [`JailError`], capped reads, files replaced
//! by rename, owners, streaming copies and hashes, and how sizes and paths are shown.

use super::*;

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

pub(super) fn fstat(fd: &OwnedFd, shown: &str) -> Result<Stat, JailError> {
    rustix::fs::fstat(fd).map_err(|e| errno_to_jail(e, shown, "inspect"))
}

pub(super) fn check_readable(st: &Stat, shown: &str) -> Result<(), JailError> {
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
pub(super) fn check_streamable(st: &Stat, shown: &str) -> Result<(), JailError> {
    match check_readable(st, shown) {
        Err(JailError::TooLarge { .. }) => Ok(()),
        other => other,
    }
}

/// Reads at most [`MAX_READ_BYTES`]; a file that grew past it since the `fstat` is refused too.
pub(super) fn read_capped(fd: OwnedFd, shown: &str, limit: u64) -> Result<Vec<u8>, JailError> {
    let mut bytes = Vec::new();
    File::from(fd)
        .take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| JailError::Io {
            path: shown.to_owned(),
            op: "read",
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(JailError::TooLarge {
            path: shown.to_owned(),
            size: bytes.len() as u64,
            limit,
        });
    }
    Ok(bytes)
}

/// Writes a temp file next to the target and renames it over the target.
pub(super) fn replace_file(
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
pub(super) fn replace_file_with<T>(
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
pub(super) const COPY_BUFFER_BYTES: usize = 256 * 1024;

/// Copies `source` into `out`, hashing as it goes; keeps the bytes while there are at most
/// `keep_up_to` of them. Returns (SHA-256, size, kept bytes).
pub(super) fn stream_copy(
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
pub(super) fn hash_stream(mut source: File, shown: &str) -> Result<String, JailError> {
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
pub(super) fn hash_prefix(
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
pub(super) fn temp_name(name: &str) -> String {
    let mut stem_len = name.len().min(MAX_COMPONENT_BYTES - 40);
    while !name.is_char_boundary(stem_len) {
        stem_len -= 1;
    }
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!(".{}.toolexec-{}.tmp", &name[..stem_len], &random[..16])
}

pub(super) fn proc_fd_path(fd: BorrowedFd<'_>) -> Option<String> {
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rustix::fs::readlinkat(CWD, link.as_str(), Vec::new())
        .ok()?
        .into_string()
        .ok()
}

pub(super) fn file_size(st: &Stat) -> u64 {
    u64::try_from(st.st_size).unwrap_or(0)
}

pub(super) fn describe(file_type: FileType) -> &'static str {
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

pub(super) fn shorten(path: &str) -> String {
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
