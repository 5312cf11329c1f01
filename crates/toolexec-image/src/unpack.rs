//! Applying a layer (a tar stream, already inflated) to an image's root directory. Layers are
//! hostile input; what keeps every write inside the root is structural, not lexical:
//!
//! - **Names** are cleaned as containerd does (`/a/../../b` is `b`: a leading `/` and a `..`
//!   above the root stay at the root), and the directory an entry goes in is opened with
//!   `openat2(root, parent, RESOLVE_IN_ROOT)`: the kernel resolves every symlink on the way as
//!   if `root` were `/` (an absolute target, or `..` past the top, lands at the root), so an
//!   earlier entry's link (`evil -> /etc`, in this layer or a lower one) can redirect a later
//!   entry only to somewhere inside. Missing parents are made one at a time through the same
//!   resolution.
//! - **The last component** is never followed: whatever is there (a file, a link, a directory
//!   unless a directory replaces it) is removed first, and a file is created with
//!   `O_CREAT|O_EXCL|O_NOFOLLOW`, so no entry is ever written through a link or into an inode a
//!   hard link shares.
//! - **Hard links** name their target the same way (resolved inside the root), so they can
//!   only share an inode this unpacking made.
//! - **Device nodes and FIFOs** are skipped (an unprivileged sandbox could not use them; the
//!   sandbox's `/dev` is its own). **Set-id and sticky bits** are cleared on files, and
//!   directories keep the owner's `rwx` so later layers can be applied.
//! - **Bounds**: every header counts against the image's entry budget and every size a header
//!   announces against its byte budget *before* the bytes are read or inflated, so a 10 GB
//!   declaration or a gzip bomb stops at its header; extension headers (long names, pax) are
//!   read only when at most 64 KiB. Names and link targets are within `NAME_MAX`/`PATH_MAX`.
//! - **Whiteouts** (`.wh.name`) remove `name` beneath the resolved parent; an opaque marker
//!   (`.wh..wh..opq`) removes what the directory held from lower layers (what this layer wrote
//!   there, by the directory's inode and the name, is kept, whichever comes first in the stream).
//!
//! The tar handling (raw headers, bounded extension records) follows
//! `toolexec-engine`'s archive reader; its path rules differ (a workspace upload refuses what
//! an image resolves inside its root), so only the approach is shared.
use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::ImageError;

/// Largest extension header (pax records, GNU long name or link).
const MAX_EXTENSION_BYTES: u64 = 64 * 1024;
/// One name (`NAME_MAX`).
const MAX_COMPONENT_BYTES: usize = 255;
/// A whole path or link target without its NUL (`PATH_MAX` - 1).
const MAX_NAME_BYTES: usize = 4095;
/// Bytes of names this layer wrote, kept to apply opaque directories.
const MAX_WRITTEN_NAME_BYTES: usize = 64 * 1024 * 1024;

/// What an image may still take, across its layers.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    pub bytes_left: u64,
    pub entries_left: u64,
    pub max_bytes: u64,
    pub max_entries: u64,
    /// When the pull gives up: checked at every entry.
    pub deadline: std::time::Instant,
    pub timeout: std::time::Duration,
    /// Set when the pull is given up (its caller's future dropped): checked at every entry,
    /// so that an unpacking stops within one entry, not at the next read of its blob (a
    /// buffer of a well-compressed layer holds thousands of entries).
    pub cancelled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// What one layer held.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LayerStats {
    pub entries: u64,
    pub bytes: u64,
    pub skipped_devices: u64,
}

fn refused(detail: String) -> ImageError {
    ImageError::InvalidLayer(detail)
}

fn io_err(what: &str, e: impl std::fmt::Display) -> ImageError {
    ImageError::Io(format!("{what}: {e}"))
}

/// `name` cleaned inside the root: components, with `.`, empty and `..` above the top dropped.
fn clean(raw: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    if raw.contains(&0) {
        return Err("a name with a NUL byte".into());
    }
    let mut parts: Vec<Vec<u8>> = Vec::new();
    for comp in raw.split(|b| *b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => {
                parts.pop();
            }
            c if c.len() > MAX_COMPONENT_BYTES => {
                return Err(format!(
                    "a name of {} bytes, over NAME_MAX ({MAX_COMPONENT_BYTES})",
                    c.len()
                ));
            }
            c => parts.push(c.to_vec()),
        }
    }
    if parts.iter().map(|p| p.len() + 1).sum::<usize>() > MAX_NAME_BYTES {
        return Err(format!("a path over PATH_MAX ({MAX_NAME_BYTES} bytes)"));
    }
    Ok(parts)
}

fn resolve_flags() -> ResolveFlags {
    ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV
}

fn open_in_root(root: &OwnedFd, parts: &[Vec<u8>]) -> Result<OwnedFd, Errno> {
    let path = if parts.is_empty() {
        b".".to_vec()
    } else {
        parts.join(&b'/')
    };
    loop {
        match rustix::fs::openat2(
            root,
            path.as_slice(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            resolve_flags(),
        ) {
            Err(Errno::AGAIN | Errno::INTR) => continue,
            other => return other,
        }
    }
}

/// Dangling links followed while making one entry's missing parents (the kernel's
/// `MAXSYMLINKS`).
const MAX_LINK_HOPS: u32 = 40;

/// The directory `parts` names, resolved inside the root, made (0755) where missing. A
/// dangling link on the way is followed as the kernel would, inside the root: the directories
/// are made where it points (as containerd does), never outside.
fn ensure_dir(root: &OwnedFd, parts: &[Vec<u8>]) -> Result<OwnedFd, ImageError> {
    match open_in_root(root, parts) {
        Ok(fd) => return Ok(fd),
        Err(Errno::NOENT) => {}
        Err(e) => return Err(dir_error(parts, e)),
    }
    // Components as the kernel will read them (`..` kept: it climbs through what the links
    // resolved to, never above the root).
    let mut comps: Vec<Vec<u8>> = parts.to_vec();
    let mut hops = 0;
    'restart: loop {
        let mut cur = open_in_root(root, &[]).map_err(|e| dir_error(&[], e))?;
        for i in 0..comps.len() {
            let comp = comps[i].clone();
            // `..` climbs as the kernel does inside the root (never above it).
            if comp == b".." {
                cur = open_in_root(root, &comps[..=i]).map_err(|e| dir_error(&comps[..=i], e))?;
                continue;
            }
            // A real directory is walked from the last one (linear in the depth); only a link
            // is resolved from the root.
            match rustix::fs::openat(
                &cur,
                comp.as_slice(),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => {
                    cur = fd;
                    continue;
                }
                Err(Errno::NOENT) => {
                    match rustix::fs::mkdirat(&cur, comp.as_slice(), Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(dir_error(&comps[..=i], e)),
                    }
                    cur = rustix::fs::openat(
                        &cur,
                        comp.as_slice(),
                        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(|e| dir_error(&comps[..=i], e))?;
                    continue;
                }
                Err(Errno::NOTDIR | Errno::LOOP) => {}
                Err(e) => return Err(dir_error(&comps[..=i], e)),
            }
            match open_in_root(root, &comps[..=i]) {
                Ok(fd) => {
                    cur = fd;
                    continue;
                }
                Err(Errno::NOENT) => {}
                Err(e) => return Err(dir_error(&comps[..=i], e)),
            }
            // A dangling link: followed by hand, its target made inside the root.
            match rustix::fs::statat(&cur, comp.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if rustix::fs::FileType::from_raw_mode(st.st_mode).is_symlink() => {
                    hops += 1;
                    if hops > MAX_LINK_HOPS {
                        return Err(dir_error(parts, Errno::LOOP));
                    }
                    let target = rustix::fs::readlinkat(&cur, comp.as_slice(), Vec::new())
                        .map_err(|e| dir_error(&comps[..=i], e))?
                        .into_bytes();
                    let mut next: Vec<Vec<u8>> = if target.starts_with(b"/") {
                        Vec::new()
                    } else {
                        comps[..i].to_vec()
                    };
                    next.extend(
                        target
                            .split(|b| *b == b'/')
                            .filter(|c| !c.is_empty() && *c != b".")
                            .map(<[u8]>::to_vec),
                    );
                    next.extend_from_slice(&comps[i + 1..]);
                    if next.iter().map(|c| c.len() + 1).sum::<usize>() > MAX_NAME_BYTES {
                        return Err(dir_error(parts, Errno::NAMETOOLONG));
                    }
                    comps = next;
                    continue 'restart;
                }
                Ok(_) => return Err(dir_error(&comps[..=i], Errno::NOTDIR)),
                Err(e) => return Err(dir_error(&comps[..=i], e)),
            }
        }
        return Ok(cur);
    }
}

fn dir_error(parts: &[Vec<u8>], e: Errno) -> ImageError {
    refused(format!(
        "'/{}' cannot be used as a directory inside the image: {e}",
        String::from_utf8_lossy(&parts.join(&b'/'))
    ))
}

/// Removes `name` in `dir` whatever it is, a directory with everything in it, following no
/// link. Iterative, holding one directory open at a time (it climbs back with `..`, in the
/// cache's own directories, which nothing else renames): links let a layer build trees far
/// deeper than `PATH_MAX`, which recursion would overflow the stack on and holding every level
/// open would run out of descriptors on.
pub(crate) fn remove_all(dir: &impl AsFd, name: &[u8]) -> Result<(), Errno> {
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => return Ok(()),
        Err(Errno::ISDIR | Errno::PERM) => {}
        Err(e) => return Err(e),
    }
    let mut cur = open_for_removal(dir, name)?;
    // Each level down: the directory's name in its parent, and its subdirectories still to go.
    let mut levels: Vec<(Vec<u8>, Vec<Vec<u8>>)> = vec![(name.to_vec(), clear_files(&cur)?)];
    loop {
        let Some((_, pending)) = levels.last_mut() else {
            return Ok(());
        };
        if let Some(child) = pending.pop() {
            match open_for_removal(&cur, &child) {
                Ok(sub) => {
                    cur = sub;
                    let subdirs = clear_files(&cur)?;
                    levels.push((child, subdirs));
                }
                Err(Errno::NOENT) => {}
                // Not a directory after all (a link): removed as it is.
                Err(Errno::NOTDIR | Errno::LOOP) => {
                    rustix::fs::unlinkat(&cur, child.as_slice(), AtFlags::empty())?;
                }
                Err(e) => return Err(e),
            }
            continue;
        }
        let Some((emptied, _)) = levels.pop() else {
            return Ok(());
        };
        if levels.is_empty() {
            drop(cur);
            return rustix::fs::unlinkat(dir, emptied.as_slice(), AtFlags::REMOVEDIR);
        }
        cur = rustix::fs::openat(
            &cur,
            "..",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        rustix::fs::unlinkat(&cur, emptied.as_slice(), AtFlags::REMOVEDIR)?;
    }
}

fn open_for_removal(dir: &impl AsFd, name: &[u8]) -> Result<OwnedFd, Errno> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    // Make sure its entries can be removed.
    let _ = rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o700));
    Ok(fd)
}

/// Removes what is not a directory in `dir`; the names of its subdirectories.
fn clear_files(dir: &OwnedFd) -> Result<Vec<Vec<u8>>, Errno> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    }
    let mut subdirs = Vec::new();
    for name in names {
        match rustix::fs::unlinkat(dir, name.as_slice(), AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(Errno::ISDIR | Errno::PERM) => subdirs.push(name),
            Err(e) => return Err(e),
        }
    }
    Ok(subdirs)
}

/// Removes the entries of the open directory `dir` for which `keep_not` says true.
fn empty_dir(dir: &OwnedFd, mut remove: impl FnMut(&[u8]) -> bool) -> Result<(), Errno> {
    let mut names = Vec::new();
    let it = rustix::fs::Dir::read_from(dir)?;
    for entry in it {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." && remove(name) {
            names.push(name.to_vec());
        }
    }
    for name in names {
        remove_all(dir, &name)?;
    }
    Ok(())
}

/// GNU long names and links and pax records for the entry that follows.
#[derive(Default)]
struct Pending {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<Vec<u8>>,
}

/// Applies the layer read from `reader` (an inflated tar stream) to `root`.
pub(crate) fn apply_layer(
    root: &OwnedFd,
    reader: impl Read,
    budget: &mut Budget,
) -> Result<LayerStats, ImageError> {
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| refused(format!("not a tar stream: {e}")))?
        .raw(true);
    let mut stats = LayerStats::default();
    let mut pending = Pending::default();
    // What this layer made, as (inode of the directory it is in, name): an opaque marker keeps
    // these, wherever links led the names (containerd compares resolved paths likewise).
    let mut written: HashSet<(u64, Vec<u8>)> = HashSet::new();
    let mut written_bytes = 0usize;
    let mut opaque: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut n = 0u64;
    use tar::EntryType as T;
    for entry in entries {
        n += 1;
        let mut entry =
            entry.map_err(|e| refused(format!("entry {n}: not readable as tar: {e}")))?;
        if budget.entries_left == 0 {
            return Err(ImageError::TooBig(format!(
                "the image has more than {} entries (limits.max_image_entries)",
                budget.max_entries
            )));
        }
        budget.entries_left -= 1;
        stats.entries += 1;
        if budget.cancelled.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(ImageError::Io("the pull was given up".into()));
        }
        if std::time::Instant::now() > budget.deadline {
            return Err(ImageError::Unreachable(format!(
                "unpacking took longer than the pull may, {} ms (limits.image_pull_timeout_ms)",
                budget.timeout.as_millis()
            )));
        }
        let kind = entry.header().entry_type();
        let size = entry.size();
        // Counted before a byte of it is read or inflated: where a bomb stops.
        if size > budget.bytes_left {
            return Err(ImageError::TooBig(format!(
                "entry {n} declares {size} bytes; the image may unpack to {} bytes in all \
                 (limits.max_image_bytes)",
                budget.max_bytes
            )));
        }
        budget.bytes_left -= size;
        stats.bytes += size;
        if matches!(
            kind,
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink
        ) {
            if size > MAX_EXTENSION_BYTES {
                return Err(refused(format!(
                    "entry {n}: an extension header of {size} bytes, over {MAX_EXTENSION_BYTES}"
                )));
            }
            if kind == T::XGlobalHeader {
                continue;
            }
            let mut data = Vec::with_capacity(size as usize);
            (&mut entry)
                .take(size)
                .read_to_end(&mut data)
                .map_err(|e| refused(format!("entry {n}: not readable as tar: {e}")))?;
            let slot = match kind {
                T::GNULongName => &mut pending.long_name,
                T::GNULongLink => &mut pending.long_link,
                _ => &mut pending.pax,
            };
            if slot.is_some() {
                return Err(refused(format!(
                    "entry {n}: two extension headers of one kind"
                )));
            }
            *slot = Some(data);
            continue;
        }
        let ext = std::mem::take(&mut pending);
        let (mut pax_path, mut pax_link) = (None, None);
        if let Some(pax) = &ext.pax {
            for record in tar::PaxExtensions::new(pax) {
                let record =
                    record.map_err(|_| refused(format!("entry {n}: an unreadable pax record")))?;
                match record.key_bytes() {
                    b"size" => {
                        return Err(refused(format!(
                            "entry {n}: a pax 'size' record (only files over 8 GiB need one)"
                        )));
                    }
                    b"path" => pax_path = Some(record.value_bytes().to_vec()),
                    b"linkpath" => pax_link = Some(record.value_bytes().to_vec()),
                    k if k.starts_with(b"GNU.sparse.") => {
                        return Err(refused(format!("entry {n}: a sparse file")));
                    }
                    _ => {}
                }
            }
        }
        let strip = |mut v: Vec<u8>| {
            while v.last() == Some(&0) {
                v.pop();
            }
            v
        };
        let raw = match (ext.long_name, pax_path) {
            (Some(long), _) => strip(long),
            (None, Some(p)) => p,
            (None, None) => entry.path_bytes().into_owned(),
        };
        let link = match (ext.long_link, pax_link) {
            (Some(long), _) => Some(strip(long)),
            (None, Some(p)) => Some(p),
            (None, None) => entry.link_name_bytes().map(|l| l.into_owned()),
        };
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let at = |why: &str| refused(format!("entry {n} ('{shown}'): {why}"));
        let parts = clean(&raw).map_err(|w| at(&w))?;
        let Some((name, parent)) = parts.split_last() else {
            // The root itself: its mode is the image's own business, nothing to write.
            if kind == T::Directory {
                continue;
            }
            return Err(at("it names the image's root"));
        };
        // Whiteouts.
        if let Some(hidden) = name.strip_prefix(b".wh.") {
            if hidden == b".wh..opq" {
                opaque.push(parent.to_vec());
                continue;
            }
            if hidden.is_empty() || hidden == b"." || hidden == b".." || hidden.contains(&b'/') {
                return Err(at("a whiteout of no name"));
            }
            match open_in_root(root, parent) {
                Ok(dir) => {
                    remove_all(&dir, hidden).map_err(|e| at(&format!("whiteout: {e}")))?;
                }
                Err(Errno::NOENT | Errno::NOTDIR) => {}
                Err(e) => return Err(at(&format!("whiteout: {e}"))),
            }
            continue;
        }
        if matches!(kind, T::Char | T::Block | T::Fifo) {
            stats.skipped_devices += 1;
            continue;
        }
        let dir = ensure_dir(root, parent)?;
        let exists = rustix::fs::statat(&dir, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW).ok();
        let is_dir = exists
            .as_ref()
            .is_some_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir());
        if exists.is_some() && !(is_dir && kind == T::Directory) {
            remove_all(&dir, name).map_err(|e| at(&format!("cannot replace it: {e}")))?;
        }
        let mode = entry.header().mode().unwrap_or(0o644);
        match kind {
            T::Directory => {
                if !is_dir {
                    rustix::fs::mkdirat(&dir, name.as_slice(), Mode::from_raw_mode(0o700))
                        .map_err(|e| at(&e.to_string()))?;
                }
                let fd = rustix::fs::openat(
                    &dir,
                    name.as_slice(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| at(&e.to_string()))?;
                rustix::fs::fchmod(&fd, Mode::from_raw_mode((mode & 0o1777) | 0o700))
                    .map_err(|e| at(&e.to_string()))?;
            }
            T::Regular | T::Continuous => {
                let fd = rustix::fs::openat(
                    &dir,
                    name.as_slice(),
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| at(&e.to_string()))?;
                let mut file = std::fs::File::from(fd);
                let copied = io::copy(&mut (&mut entry).take(size), &mut file)
                    .map_err(|e| at(&format!("writing it: {e}")))?;
                if copied != size {
                    return Err(at(&format!(
                        "the layer ends after {copied} of its {size} bytes"
                    )));
                }
                file.flush().map_err(|e| io_err("flush", e))?;
                // Permission bits only: no set-uid, set-gid or sticky bit.
                rustix::fs::fchmod(&file, Mode::from_raw_mode(mode & 0o777))
                    .map_err(|e| at(&e.to_string()))?;
            }
            T::Symlink => {
                let target = link.unwrap_or_default();
                if target.is_empty() || target.len() > MAX_NAME_BYTES || target.contains(&0) {
                    return Err(at("a symlink with an empty, over-long or NUL target"));
                }
                // Kept as written: inside the image it is resolved against the image's root
                // (this unpacking itself only ever resolves through RESOLVE_IN_ROOT).
                rustix::fs::symlinkat(target.as_slice(), &dir, name.as_slice())
                    .map_err(|e| at(&e.to_string()))?;
            }
            T::Link => {
                let target = link.unwrap_or_default();
                let tparts = clean(&target).map_err(|w| at(&format!("its link target: {w}")))?;
                let Some((tname, tparent)) = tparts.split_last() else {
                    return Err(at("a hard link to the image's root"));
                };
                let tdir = open_in_root(root, tparent).map_err(|e| {
                    at(&format!(
                        "a hard link to '{}', which is not in the image: {e}",
                        String::from_utf8_lossy(&target)
                    ))
                })?;
                rustix::fs::linkat(
                    &tdir,
                    tname.as_slice(),
                    &dir,
                    name.as_slice(),
                    AtFlags::empty(),
                )
                .map_err(|e| {
                    at(&format!(
                        "a hard link to '{}' cannot be made: {e}",
                        String::from_utf8_lossy(&target)
                    ))
                })?;
            }
            other => return Err(at(&format!("an entry of type {other:?}"))),
        }
        written_bytes += name.len() + 16;
        if written_bytes > MAX_WRITTEN_NAME_BYTES {
            return Err(refused(format!(
                "the layer's names add up to more than {MAX_WRITTEN_NAME_BYTES} bytes"
            )));
        }
        let ino = rustix::fs::fstat(&dir)
            .map_err(|e| at(&e.to_string()))?
            .st_ino;
        written.insert((ino, name.clone()));
    }
    // Opaque directories: what lower layers left there goes; what this layer wrote stays.
    for dir_parts in opaque {
        let path = if dir_parts.is_empty() {
            b".".to_vec()
        } else {
            dir_parts.join(&b'/')
        };
        let dir = match rustix::fs::openat2(
            root,
            path.as_slice(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            resolve_flags(),
        ) {
            Ok(dir) => dir,
            Err(Errno::NOENT | Errno::NOTDIR) => continue,
            Err(e) => return Err(io_err("opaque directory", e)),
        };
        let ino = rustix::fs::fstat(&dir)
            .map_err(|e| io_err("opaque directory", e))?
            .st_ino;
        empty_dir(&dir, |child| !written.contains(&(ino, child.to_vec())))
            .map_err(|e| io_err("opaque directory", e))?;
    }
    if pending.long_name.is_some() || pending.long_link.is_some() || pending.pax.is_some() {
        return Err(refused("extension headers with no entry after them".into()));
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_cleaned_inside_the_root() {
        let c = |s: &str| {
            clean(s.as_bytes())
                .unwrap()
                .iter()
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect::<Vec<_>>()
                .join("/")
        };
        assert_eq!(c("../../etc/passwd"), "etc/passwd");
        assert_eq!(c("/abs/./x/"), "abs/x");
        assert_eq!(c("a/../../b"), "b");
        assert!(clean(&[b'a'; 300]).is_err());
    }
}
