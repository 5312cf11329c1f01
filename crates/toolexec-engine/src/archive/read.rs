//! Reading an uploaded archive: a tar stream (gunzipped when it starts with gzip's magic) taken
//! entry by entry, with every bound checked on a header **before** the bytes it announces are
//! read or inflated. A gzip bomb stops at the first header past a limit: a file over
//! [`MAX_ARCHIVE_FILE_BYTES`], the running total over `limits.max_archive_unpacked_bytes`, an
//! extension header over its size. The tar crate reads its entries' headers raw: GNU long names
//! and links and pax records are handled here, each read only once its declared size is known
//! to be small, so no header makes this hold more than [`MAX_EXTENSION_BYTES`].
//!
//! It also checks what one entry alone can be refused for — its type, its path (relative, no
//! `..` or NUL, every component within `NAME_MAX` and the whole within `PATH_MAX`), a symlink's
//! target as text — and hands each entry to a callback with the reader of its contents. What
//! depends on the other entries and on the workspace is `check`'s.
use std::io::{self, Read};
use std::path::Path;

use toolexec_core::ProblemCode;
use toolexec_workspace::jail::{MAX_COMPONENT_BYTES, MAX_PATH_BYTES};

use crate::{EngineError, Result};

/// Largest file one archive may hold: GitHub's limit for a file in a repository.
pub const MAX_ARCHIVE_FILE_BYTES: u64 = 100 * 1024 * 1024;

/// Largest pax extension header (local or global): room for any real set of records (a long
/// path, a long link target, times, extended attributes).
pub(super) const MAX_EXTENSION_BYTES: u64 = 64 * 1024;

/// Pax global headers one archive may hold (`git archive` writes one, with the commit id).
const MAX_GLOBAL_HEADERS: u32 = 16;

/// Largest path or symlink target, with its NUL: `PATH_MAX`. A longer one could not be made or
/// followed by the kernel, nor walked by the workspace scan.
const MAX_NAME_BYTES: usize = MAX_PATH_BYTES - 1;

/// One entry as the reader accepted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Kind {
    /// A regular file, with the permission bits it will have.
    File {
        mode: u32,
    },
    Symlink {
        target: Vec<u8>,
    },
    Directory,
}

/// An entry: its number (1-based, extension headers not counted), its workspace-relative path
/// (`./` and trailing `/` dropped), what it is, and its size (a file's contents).
#[derive(Debug)]
pub(super) struct Item {
    pub n: usize,
    pub path: Vec<u8>,
    pub kind: Kind,
    pub size: u64,
}

impl Item {
    pub fn shown(&self) -> String {
        String::from_utf8_lossy(&self.path).into_owned()
    }
}

/// The operator's bounds on one archive.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub files: u64,
    pub unpacked_bytes: u64,
}

impl Bounds {
    /// The most an archive within these bounds can be as an inflated stream: the bytes the
    /// headers announce (contents and extension records, all counted against `unpacked_bytes`),
    /// a header and up to three extension headers per entry with their padding, the global
    /// headers, and the end marker. The decoder is cut there whatever the headers say.
    fn stream_bytes(&self) -> u64 {
        self.unpacked_bytes
            .saturating_add(self.files.saturating_mul(4 * 1024))
            .saturating_add(u64::from(MAX_GLOBAL_HEADERS) * 1024)
            .saturating_add(1 << 20)
    }
}

/// What a whole pass counted.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Counts {
    pub files: u64,
    pub symlinks: u64,
    pub directories: u64,
    /// Bytes of file contents.
    pub bytes: u64,
}

pub(super) fn refused(detail: String) -> EngineError {
    EngineError::Invalid {
        code: ProblemCode::InvalidArchive,
        detail,
    }
}

/// Opens `path` as a tar stream, gunzipped when it starts with gzip's magic, never longer than
/// `cap` bytes once inflated.
fn open(path: &Path, cap: u64) -> io::Result<Box<dyn Read>> {
    let mut file = std::fs::File::open(path)?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic)?;
    let file = std::fs::File::open(path)?;
    let reader = io::BufReader::with_capacity(256 * 1024, file);
    Ok(if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(flate2::read::GzDecoder::new(reader).take(cap))
    } else {
        Box::new(reader.take(cap))
    })
}

/// The workspace-relative path of an entry (`./` and trailing `/` dropped), or why not.
pub(super) fn entry_path(raw: &[u8]) -> std::result::Result<Vec<u8>, String> {
    if raw.contains(&0) {
        return Err("a path with a NUL byte is not allowed".into());
    }
    if raw.starts_with(b"/") {
        return Err("an absolute path is not allowed".into());
    }
    let mut parts = Vec::new();
    for comp in raw.split(|b| *b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => return Err("a path with '..' is not allowed".into()),
            c if c.len() > MAX_COMPONENT_BYTES => {
                return Err(format!(
                    "a name of {} bytes in its path, over the {MAX_COMPONENT_BYTES}-byte limit \
                     of one name (NAME_MAX)",
                    c.len()
                ));
            }
            c => parts.push(c),
        }
    }
    let path = parts.join(&b'/');
    if path.len() > MAX_NAME_BYTES {
        return Err(format!(
            "a path of {} bytes, over the {MAX_NAME_BYTES}-byte limit of a whole path \
             (PATH_MAX)",
            path.len()
        ));
    }
    Ok(path)
}

/// Whether a symlink at `path` with `target` stays inside the workspace read as text: a
/// relative target whose `..` never climbs above the root. (Links through other links are
/// resolved by `check`.)
pub(super) fn stays_inside(path: &[u8], target: &[u8]) -> bool {
    if target.is_empty() || target.starts_with(b"/") || target.contains(&0) {
        return false;
    }
    let mut depth = path.split(|b| *b == b'/').count() as i64 - 1;
    for comp in target.split(|b| *b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => depth += 1,
        }
    }
    true
}

/// GNU long names and links and pax records read for the entry that follows them.
#[derive(Default)]
struct Pending {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<Vec<u8>>,
}

/// Reads the archive at `path` entry by entry, checking each header before its contents are
/// read, and calls `f` with each entry and the reader of its contents (what `f` leaves unread
/// is skipped). Stops at the first refusal, or at the first error of `f`.
pub(super) fn each_entry(
    path: &Path,
    bounds: Bounds,
    mut f: impl FnMut(&Item, &mut dyn Read) -> Result<()>,
) -> Result<Counts> {
    let reader = open(path, bounds.stream_bytes())
        .map_err(|e| EngineError::Internal(format!("archive spool: {e}")))?;
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| refused(format!("not a tar archive: {e}")))?
        .raw(true);
    let mut counts = Counts::default();
    // Every byte a header announced so far (contents, extension records, the data of any other
    // entry): what reading the archive inflates.
    let mut announced = 0u64;
    let mut globals = 0u32;
    let mut pending = Pending::default();
    let mut n = 0usize;
    let over_unpacked = || {
        refused(format!(
            "the archive unpacks to more than {} bytes, the most one upload may (limits.\
             max_archive_unpacked_bytes); upload it in parts",
            bounds.unpacked_bytes
        ))
    };
    use tar::EntryType as T;
    for entry in entries {
        let mut entry =
            entry.map_err(|e| refused(format!("entry {}: not readable as tar: {e}", n + 1)))?;
        let kind = entry.header().entry_type();
        // The header's own size field (raw: no pax record applied; a pax `size` is refused).
        let size = entry.size();
        if matches!(
            kind,
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink
        ) {
            if matches!(kind, T::GNULongName | T::GNULongLink) && size > MAX_PATH_BYTES as u64 {
                return Err(refused(format!(
                    "entry {}: an extension header (a long name) of {size} bytes, over the \
                     limit of a whole path (PATH_MAX: {MAX_NAME_BYTES} bytes and a NUL)",
                    n + 1
                )));
            }
            let max = MAX_EXTENSION_BYTES;
            if size > max {
                return Err(refused(format!(
                    "entry {}: an extension header (a long name or pax record) of {size} \
                     bytes, over the {max}-byte limit",
                    n + 1
                )));
            }
            announced = announced.saturating_add(size);
            if announced > bounds.unpacked_bytes {
                return Err(over_unpacked());
            }
            if kind == T::XGlobalHeader {
                globals += 1;
                if globals > MAX_GLOBAL_HEADERS {
                    return Err(refused(format!(
                        "more than {MAX_GLOBAL_HEADERS} pax global headers"
                    )));
                }
                // Global records (a commit id, times) change nothing the workspace keeps.
                continue;
            }
            let mut data = Vec::with_capacity(size as usize);
            (&mut entry)
                .take(size)
                .read_to_end(&mut data)
                .map_err(|e| refused(format!("entry {}: not readable as tar: {e}", n + 1)))?;
            let (slot, what) = match kind {
                T::GNULongName => (&mut pending.long_name, "GNU long name"),
                T::GNULongLink => (&mut pending.long_link, "GNU long link"),
                _ => (&mut pending.pax, "pax"),
            };
            if slot.is_some() {
                return Err(refused(format!(
                    "entry {}: two {what} headers for one entry",
                    n + 1
                )));
            }
            *slot = Some(data);
            continue;
        }
        n += 1;
        if n as u64 > bounds.files {
            return Err(refused(format!(
                "the archive has more than {} entries, the most one upload may hold \
                 (limits.max_archive_files); upload it in parts",
                bounds.files
            )));
        }
        let ext = std::mem::take(&mut pending);
        let (mut pax_path, mut pax_link) = (None, None);
        if let Some(pax) = &ext.pax {
            for record in tar::PaxExtensions::new(pax) {
                let record = record
                    .map_err(|_| refused(format!("entry {n}: a pax record that cannot be read")))?;
                match record.key_bytes() {
                    b"size" => {
                        // Only a file over 8 GiB needs one; refused, it cannot make the
                        // entry's data differ from what its header announced.
                        return Err(refused(format!(
                            "entry {n}: a pax 'size' record (only files over 8 GiB need one; \
                             one file may be {MAX_ARCHIVE_FILE_BYTES} bytes)"
                        )));
                    }
                    b"path" => pax_path = Some(record.value_bytes().to_vec()),
                    b"linkpath" => pax_link = Some(record.value_bytes().to_vec()),
                    key if key.starts_with(b"GNU.sparse.") => {
                        return Err(refused(format!(
                            "entry {n}: a sparse file (pax GNU.sparse records); upload it as \
                             a plain file"
                        )));
                    }
                    _ => {}
                }
            }
        }
        let strip = |mut v: Vec<u8>| {
            if v.last() == Some(&0) {
                v.pop();
            }
            v
        };
        let raw = match (ext.long_name, pax_path) {
            (Some(long), _) => strip(long),
            (None, Some(p)) => p,
            (None, None) => entry.path_bytes().into_owned(),
        };
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let at = |why: &str| refused(format!("entry {n} ('{shown}'): {why}"));
        let path = entry_path(&raw).map_err(|why| at(&why))?;
        let kind = match kind {
            T::Directory => {
                counts.directories += 1;
                Kind::Directory
            }
            _ if path.is_empty() => return Err(at("it names the workspace root")),
            T::Regular | T::Continuous => {
                if size > MAX_ARCHIVE_FILE_BYTES {
                    return Err(at(&format!(
                        "{size} bytes, over the {MAX_ARCHIVE_FILE_BYTES}-byte limit for one file"
                    )));
                }
                counts.files += 1;
                counts.bytes += size;
                let mode = entry.header().mode().unwrap_or(0o644);
                // Permission bits only, as the file tools write them: no setuid, setgid or
                // sticky bit, and never writable by others.
                Kind::File {
                    mode: (mode & 0o777 & !0o002) | 0o600,
                }
            }
            T::Symlink => {
                let target = match (ext.long_link, pax_link) {
                    (Some(long), _) => strip(long),
                    (None, Some(p)) => p,
                    (None, None) => entry
                        .link_name_bytes()
                        .map(|t| t.into_owned())
                        .unwrap_or_default(),
                };
                if target.len() > MAX_NAME_BYTES || !stays_inside(&path, &target) {
                    return Err(at(&format!(
                        "a symlink to '{}', which leads out of the workspace (only relative \
                         targets that stay inside are allowed)",
                        String::from_utf8_lossy(&target)
                    )));
                }
                counts.symlinks += 1;
                Kind::Symlink { target }
            }
            T::Link => return Err(at("a hard link (upload the file itself)")),
            T::Char | T::Block => return Err(at("a device")),
            T::Fifo => return Err(at("a FIFO")),
            T::GNUSparse => return Err(at("a sparse file (upload it as a plain file)")),
            other => return Err(at(&format!("an entry of type {other:?}"))),
        };
        // Counted before a byte of it is read: this is where a bomb stops.
        announced = announced.saturating_add(size);
        if announced > bounds.unpacked_bytes {
            return Err(over_unpacked());
        }
        let item = Item {
            n,
            path,
            kind,
            size,
        };
        f(&item, &mut entry)?;
    }
    if pending.long_name.is_some() || pending.long_link.is_some() || pending.pax.is_some() {
        return Err(refused(format!(
            "entry {}: extension headers with no entry after them",
            n + 1
        )));
    }
    Ok(counts)
}
