//! Putting entries back: what rebuilds a state from the log into a workspace (a fork's base, a
//! rewind of a live session). Paths are raw bytes, exactly as recorded (a name that is not
//! UTF-8 included), workspace-relative, `/`-separated.
//!
//! Every step is made relative to a directory descriptor opened beneath the root with no
//! symlink followed anywhere (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), so a symlink a command
//! left (or swaps in while a rewind runs) can only be replaced, never written through: what is
//! in the way of an entry — a file or symlink where a directory must be, a directory where a
//! file must be — is removed (a directory with everything beneath it). A file is written to a
//! fresh temp file (`O_EXCL|O_NOFOLLOW`) and renamed over its name; a symlink is made under a
//! temp name and renamed likewise. Owners follow the jail's rule (a new entry gets the owner of
//! the directory it is made in, when the service is root); the permission bits are set after
//! the `chown` (which clears set-id bits), exactly as recorded.
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::jail::{
    JAIL_NO_SYMLINKS, JailError, Workspace, errno_to_jail, give_to, openat2_retry, owner_of_new,
};
use crate::sparse::SparseWriter;

/// Deepest directory tree a removal descends (a tree deeper than `PATH_MAX` allows cannot be
/// made by path anyway).
const MAX_DEPTH: usize = 2048;

/// Permission bits of the directories made on the way.
const DIR_MODE: u32 = 0o755;

impl Workspace {
    /// Puts a regular file with `contents` and exactly `mode` (`0o7777` bits) at `path`,
    /// replacing whatever is there and making the directories on the way. Blocks of zeros are
    /// left as holes (see [`crate::sparse`]): the file never takes more disk than its data.
    pub fn restore_file(&self, path: &[u8], contents: &[u8], mode: u32) -> Result<(), JailError> {
        self.restore_file_from(path, &mut &contents[..], contents.len() as u64, mode)
    }

    /// Like [`Workspace::restore_file`], with the contents streamed from `reader` through a
    /// fixed buffer (never whole in memory): exactly `size` bytes, or an error (and nothing at
    /// `path` changed) if `reader` ends before.
    pub fn restore_file_from(
        &self,
        path: &[u8],
        reader: &mut dyn Read,
        size: u64,
        mode: u32,
    ) -> Result<(), JailError> {
        let (parent, name, shown) = self.restore_parent(path)?;
        place(&parent, name, &shown, |temp| {
            let fd = openat2_retry(
                parent.as_fd(),
                temp,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
                JAIL_NO_SYMLINKS,
            )
            .map_err(|e| errno_to_jail(e, &shown, "create"))?;
            if let Some(owner) = owner_of_new(&parent) {
                give_to(fd.as_fd(), owner, &shown);
            }
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & 0o7777))
                .map_err(|e| errno_to_jail(e, &shown, "set permissions of"))?;
            let io = |source| JailError::Io {
                path: shown.clone(),
                op: "write",
                source,
            };
            let mut out = SparseWriter::new(File::from(fd));
            let copied = out.copy_from(reader, size).map_err(io)?;
            if copied != size {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("{copied} bytes of {size}"),
                )));
            }
            out.finish().map(drop).map_err(io)
        })
    }

    /// Puts a symlink to `target` (not followed, not checked: it is text) at `path`, replacing
    /// whatever is there and making the directories on the way.
    pub fn restore_symlink(&self, path: &[u8], target: &[u8]) -> Result<(), JailError> {
        let (parent, name, shown) = self.restore_parent(path)?;
        place(&parent, name, &shown, |temp| {
            rustix::fs::symlinkat(target, &parent, temp)
                .map_err(|e| errno_to_jail(e, &shown, "create a symlink"))?;
            if let Some((uid, gid)) = owner_of_new(&parent) {
                let _ = rustix::fs::chownat(
                    &parent,
                    temp,
                    Some(rustix::fs::Uid::from_raw(uid)),
                    Some(rustix::fs::Gid::from_raw(gid)),
                    AtFlags::SYMLINK_NOFOLLOW,
                );
            }
            Ok(())
        })
    }

    /// Removes whatever is at `path` — a file, a symlink (never what it points to), a directory
    /// with everything beneath it. `false` if nothing was there (or a parent is not a
    /// directory).
    pub fn remove_entry(&self, path: &[u8]) -> Result<bool, JailError> {
        let comps = components(path)?;
        let shown = String::from_utf8_lossy(path).into_owned();
        let Some((name, dirs)) = comps.split_last() else {
            return Err(invalid(&shown, "it names the workspace root"));
        };
        let mut dir = self.dup_root(&shown)?;
        for comp in dirs {
            match open_dir(dir.as_fd(), comp) {
                Ok(fd) => dir = fd,
                Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => return Ok(false),
                Err(e) => return Err(errno_to_jail(e, &shown, "open the parent directory of")),
            }
        }
        match remove_any(dir.as_fd(), name, 0) {
            Ok(()) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(errno_to_jail(e, &shown, "remove")),
        }
    }

    /// The directory `path` goes in (made as needed, a non-directory in the way removed), its
    /// last component, and the path as text for messages.
    fn restore_parent<'p>(&self, path: &'p [u8]) -> Result<(OwnedFd, &'p [u8], String), JailError> {
        let comps = components(path)?;
        let shown = String::from_utf8_lossy(path).into_owned();
        let Some((name, dirs)) = comps.split_last() else {
            return Err(invalid(&shown, "it names the workspace root"));
        };
        let mut dir = self.dup_root(&shown)?;
        for comp in dirs {
            dir = match open_dir(dir.as_fd(), comp) {
                Ok(fd) => fd,
                Err(e @ (Errno::NOENT | Errno::NOTDIR | Errno::LOOP)) => {
                    if e != Errno::NOENT {
                        // A file or a symlink where a directory must be.
                        remove_any(dir.as_fd(), comp, 0)
                            .map_err(|e| errno_to_jail(e, &shown, "remove"))?;
                    }
                    make_dir(&dir, comp, &shown)?
                }
                Err(e) => return Err(errno_to_jail(e, &shown, "open the parent directory of")),
            };
        }
        Ok((dir, name, shown))
    }

    fn dup_root(&self, shown: &str) -> Result<OwnedFd, JailError> {
        openat2_retry(
            self.root_fd(),
            ".",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            JAIL_NO_SYMLINKS,
        )
        .map_err(|e| errno_to_jail(e, shown, "open the workspace for"))
    }
}

/// Makes `name` under a temp name with `make`, then renames it over `name` (a directory there
/// is removed first); the temp entry is removed on failure.
fn place(
    parent: &OwnedFd,
    name: &[u8],
    shown: &str,
    make: impl FnOnce(&[u8]) -> Result<(), JailError>,
) -> Result<(), JailError> {
    let temp = temp_name(name);
    if let Err(e) = make(&temp) {
        let _ = rustix::fs::unlinkat(parent, temp.as_slice(), AtFlags::empty());
        return Err(e);
    }
    let renamed = match rustix::fs::renameat(parent, temp.as_slice(), parent, name) {
        Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST) => remove_any(parent.as_fd(), name, 0)
            .and_then(|()| rustix::fs::renameat(parent, temp.as_slice(), parent, name)),
        other => other,
    };
    renamed.map_err(|e| {
        let _ = rustix::fs::unlinkat(parent, temp.as_slice(), AtFlags::empty());
        errno_to_jail(e, shown, "replace")
    })
}

fn open_dir(dir: BorrowedFd<'_>, name: &[u8]) -> Result<OwnedFd, Errno> {
    openat2_retry(
        dir,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        JAIL_NO_SYMLINKS,
    )
}

fn make_dir(parent: &OwnedFd, name: &[u8], shown: &str) -> Result<OwnedFd, JailError> {
    match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(DIR_MODE)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(errno_to_jail(e, shown, "create a directory for")),
    }
    let fd = open_dir(parent.as_fd(), name)
        .map_err(|e| errno_to_jail(e, shown, "open a directory made for"))?;
    if let Some(owner) = owner_of_new(parent) {
        give_to(fd.as_fd(), owner, shown);
    }
    Ok(fd)
}

/// Removes `name` in `dir` whatever it is, a directory with everything beneath it, following
/// no symlink.
fn remove_any(dir: BorrowedFd<'_>, name: &[u8], depth: usize) -> Result<(), Errno> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Err(Errno::ISDIR | Errno::PERM) => {}
        other => return other,
    }
    if depth >= MAX_DEPTH {
        return Err(Errno::NAMETOOLONG);
    }
    let sub = openat2_retry(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        JAIL_NO_SYMLINKS,
    )?;
    // A process may keep adding entries: a few passes, then whatever the kernel says.
    for _ in 0..4 {
        let mut names = Vec::new();
        for entry in Dir::read_from(&sub)? {
            let entry = entry?;
            let n = entry.file_name().to_bytes();
            if n != b"." && n != b".." {
                names.push((n.to_vec(), entry.file_type()));
            }
        }
        if names.is_empty() {
            break;
        }
        for (n, kind) in names {
            let removed = if kind == FileType::Directory {
                remove_any(sub.as_fd(), &n, depth + 1)
            } else {
                match rustix::fs::unlinkat(&sub, n.as_slice(), AtFlags::empty()) {
                    Err(Errno::ISDIR) => remove_any(sub.as_fd(), &n, depth + 1),
                    other => other,
                }
            };
            match removed {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(e),
            }
        }
    }
    rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
}

/// The components of a workspace-relative path; `.`, `..`, empty components and NUL refused.
fn components(path: &[u8]) -> Result<Vec<&[u8]>, JailError> {
    let shown = String::from_utf8_lossy(path);
    if path.contains(&0) {
        return Err(invalid(&shown, "it contains a NUL byte"));
    }
    if path.len() > crate::jail::MAX_PATH_BYTES {
        return Err(invalid(&shown, "it is too long"));
    }
    let comps: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
    if comps.iter().any(|c| {
        c.is_empty() || *c == b"." || *c == b".." || c.len() > crate::jail::MAX_COMPONENT_BYTES
    }) {
        return Err(invalid(&shown, "it is not a plain workspace-relative path"));
    }
    Ok(comps)
}

fn invalid(shown: &str, reason: &str) -> JailError {
    JailError::InvalidPath {
        path: shown.to_owned(),
        reason: reason.to_owned(),
    }
}

/// `.<name>.toolexec-<random>.tmp`, within `NAME_MAX`.
fn temp_name(name: &[u8]) -> Vec<u8> {
    let stem = &name[..name.len().min(crate::jail::MAX_COMPONENT_BYTES - 40)];
    let random = uuid::Uuid::new_v4().simple().to_string();
    let mut temp = Vec::with_capacity(stem.len() + 32);
    temp.push(b'.');
    temp.extend_from_slice(stem);
    temp.extend_from_slice(b".toolexec-");
    temp.extend_from_slice(&random.as_bytes()[..16]);
    temp.extend_from_slice(b".tmp");
    temp
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests look at the result on the host"
)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::*;

    fn ws() -> (tempfile::TempDir, Workspace) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::create(&tmp.path().join("ws")).unwrap();
        (tmp, ws)
    }

    #[test]
    fn files_and_symlinks_are_put_back_with_their_modes_and_directories() {
        let (tmp, ws) = ws();
        let root = tmp.path().join("ws");
        ws.restore_file(b"a/b/run.sh", b"echo hi\n", 0o755).unwrap();
        ws.restore_symlink(b"a/link", b"b/run.sh").unwrap();
        ws.restore_file(b"bad\xff", b"x", 0o600).unwrap();
        assert_eq!(fs::read(root.join("a/b/run.sh")).unwrap(), b"echo hi\n");
        let mode = fs::metadata(root.join("a/b/run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755);
        assert_eq!(
            fs::read_link(root.join("a/link")).unwrap().to_str(),
            Some("b/run.sh")
        );
        let bad: &std::ffi::OsStr = std::os::unix::ffi::OsStrExt::from_bytes(b"bad\xff");
        assert_eq!(fs::read(root.join(bad)).unwrap(), b"x");
    }

    #[test]
    fn what_is_in_the_way_is_replaced_and_symlinks_are_never_written_through() {
        let (tmp, ws) = ws();
        let root = tmp.path().join("ws");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("secret"), b"secret").unwrap();
        // A symlink to a directory outside where a directory must be, one to a file outside
        // where a file must be, a directory where a file must be.
        symlink(&outside, root.join("d")).unwrap();
        symlink(outside.join("secret"), root.join("f")).unwrap();
        fs::create_dir_all(root.join("x/y")).unwrap();
        fs::write(root.join("x/y/z"), b"z").unwrap();
        ws.restore_file(b"d/new", b"inside", 0o644).unwrap();
        ws.restore_file(b"f", b"replaced", 0o644).unwrap();
        ws.restore_file(b"x", b"now a file", 0o644).unwrap();
        assert_eq!(fs::read(outside.join("secret")).unwrap(), b"secret");
        assert!(!outside.join("new").exists());
        assert!(root.join("d").is_dir() && !root.join("d").is_symlink());
        assert_eq!(fs::read(root.join("d/new")).unwrap(), b"inside");
        assert_eq!(fs::read(root.join("f")).unwrap(), b"replaced");
        assert_eq!(fs::read(root.join("x")).unwrap(), b"now a file");
        // Removal never follows a symlink either.
        symlink(&outside, root.join("gone")).unwrap();
        assert!(ws.remove_entry(b"gone").unwrap());
        assert!(outside.join("secret").exists());
        assert!(!ws.remove_entry(b"gone").unwrap());
        assert!(ws.remove_entry(b"d").unwrap());
        assert!(!root.join("d").exists());
        assert!(ws.remove_entry(b"../x").is_err());
        assert!(ws.restore_file(b"/etc/x", b"", 0o644).is_err());
    }
}
