//! Getting a project in and out of a session: a tar (or tar.gz) stream unpacked into its
//! workspace — every entry checked before the first is written — and recorded as the session's
//! file events; and the workspace, as the log has it at any step, streamed back as tar.
//!
//! **In.** The API spools the request body to a file beneath the workspace root (bounded by
//! `limits.max_archive_bytes`), then [`Engine::upload_archive`]:
//! 1. reads the whole archive once and refuses it, writing nothing, if any entry is not a
//!    regular file, a directory or a symlink that stays inside (hard links, devices, FIFOs,
//!    sparse files), if a path is absolute, has `..` or a NUL, or names a directory the jail
//!    refuses, or if it is over `limits.max_archive_files` entries or
//!    `limits.max_archive_unpacked_bytes` unpacked (checked on the headers as it goes, so a
//!    gzip bomb stops at the limit), or if the session's disk cannot hold it;
//! 2. then, under the session's exclusive turn (no call runs meanwhile), writes it through the
//!    workspace jail in batches of at most [`BATCH_BYTES`], and records each batch as the scan
//!    after a command does: the file events of what changed on disk, contents as blobs up to
//!    `limits.max_blob_bytes` per file. Directories are not recorded (the log records files
//!    and symlinks; an empty directory is not kept).
//!
//! All or nothing for everything the first pass checks; a write that fails in the second (an
//! I/O error) ends the upload there, with what was written recorded and the error saying so.
//!
//! **Out.** [`Engine::archive_at`] folds the log at a seq (default: the latest) and writes the
//! state as tar to a spool file, which the API streams; files the log holds by hash only make it
//! a 409 that names them, as for a rewind.
#![allow(
    clippy::disallowed_methods,
    reason = "the spool files are the service's own, beneath the workspace root"
)]
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use toolexec_core::history::ArchiveUploaded;
use toolexec_core::{ProblemCode, SessionStatus};
use uuid::Uuid;

use crate::{Engine, EngineError, Result};

/// Contents written (and then recorded) at a time: within one scan's content budget, so every
/// batch's files are recorded with their contents.
pub const BATCH_BYTES: u64 = 32 * 1024 * 1024;
/// Entries written at a time, whatever their size.
const BATCH_ENTRIES: usize = 2_000;
/// Largest file one archive may hold: GitHub's limit for a file in a repository.
pub const MAX_ARCHIVE_FILE_BYTES: u64 = 100 * 1024 * 1024;

/// A spooled request body, removed when dropped.
#[derive(Debug)]
pub struct Spool {
    path: PathBuf,
}

impl Spool {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One entry as the first pass accepted it.
enum Kind {
    File { mode: u32 },
    Symlink { target: Vec<u8> },
    Directory,
}

/// Largest GNU long-name or pax extension header: the tar crate reads one whole into memory
/// before the entry it describes, so its declared size must be bounded first.
const MAX_EXTENSION_BYTES: u64 = 64 * 1024;

/// Opens `path` as a tar stream, gunzipped when it starts with gzip's magic, and never longer
/// than `cap` bytes unpacked (past it the stream ends, and the archive is unreadable).
fn open_capped(path: &Path, cap: u64) -> io::Result<Box<dyn Read>> {
    Ok(Box::new(open(path)?.take(cap)))
}

/// Refuses an archive with an extension header (GNU long name or link, pax) over
/// [`MAX_EXTENSION_BYTES`], reading the entries raw: nothing of such a header is held.
fn check_extensions(path: &Path, cap: u64) -> Result<()> {
    let reader =
        open_capped(path, cap).map_err(|e| EngineError::Internal(format!("archive spool: {e}")))?;
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| refused(format!("not a tar archive: {e}")))?
        .raw(true);
    for (n, entry) in entries.enumerate() {
        let mut entry =
            entry.map_err(|e| refused(format!("entry {}: not readable as tar: {e}", n + 1)))?;
        use tar::EntryType as T;
        let kind = entry.header().entry_type();
        if !matches!(
            kind,
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink
        ) {
            continue;
        }
        if entry.size() > MAX_EXTENSION_BYTES {
            return Err(refused(format!(
                "entry {}: an extension header (a long name or pax record) of {} bytes, over \
                 the {MAX_EXTENSION_BYTES}-byte limit",
                n + 1,
                entry.size()
            )));
        }
        if kind == T::XHeader {
            // A pax `size` record is only needed for a file over 8 GiB, which no archive we
            // take holds; refused, it cannot make the entry's data differ from its header.
            let mut data = Vec::new();
            entry
                .read_to_end(&mut data)
                .map_err(|e| refused(format!("entry {}: not readable as tar: {e}", n + 1)))?;
            let sized = tar::PaxExtensions::new(&data)
                .flatten()
                .any(|ext| ext.key_bytes() == b"size");
            if sized {
                return Err(refused(format!(
                    "entry {}: a pax 'size' record (only files over 8 GiB need one; one file \
                     may be {MAX_ARCHIVE_FILE_BYTES} bytes)",
                    n + 1
                )));
            }
        }
    }
    Ok(())
}

/// Opens `path` as a tar stream, gunzipped when it starts with gzip's magic.
fn open(path: &Path) -> io::Result<Box<dyn Read>> {
    let mut file = std::fs::File::open(path)?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic)?;
    let file = std::fs::File::open(path)?;
    let reader = io::BufReader::with_capacity(256 * 1024, file);
    Ok(if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(flate2::read::GzDecoder::new(reader))
    } else {
        Box::new(reader)
    })
}

/// The workspace-relative path of an entry (`./` and trailing `/` dropped), or why not.
fn entry_path(raw: &[u8]) -> std::result::Result<Vec<u8>, String> {
    if raw.contains(&0) {
        return Err("a path with a NUL byte".into());
    }
    if raw.starts_with(b"/") {
        return Err("an absolute path".into());
    }
    let mut parts = Vec::new();
    for comp in raw.split(|b| *b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => return Err("a path with '..'".into()),
            c => parts.push(c),
        }
    }
    if parts.is_empty() {
        return Ok(Vec::new());
    }
    Ok(parts.join(&b'/'))
}

/// Whether a symlink at `path` with `target` resolves inside the workspace (lexically: no
/// absolute target, and its `..` never climbs above the root).
fn stays_inside(path: &[u8], target: &[u8]) -> bool {
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

/// The operator's bounds on one archive.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub files: u64,
    pub unpacked_bytes: u64,
}

impl Bounds {
    /// The most an archive within these bounds can unpack to as a stream: its contents, a
    /// header and up to two extension headers per entry, padding, and the end marker.
    fn stream_bytes(&self) -> u64 {
        self.unpacked_bytes
            .saturating_add(
                self.files
                    .saturating_mul(3 * (512 + MAX_EXTENSION_BYTES) + 512),
            )
            .saturating_add(1 << 20)
    }
}

/// What the first pass found.
#[derive(Debug, Default, Clone, Copy)]
struct Checked {
    files: u64,
    symlinks: u64,
    directories: u64,
    bytes: u64,
}

fn refused(detail: String) -> EngineError {
    EngineError::Invalid {
        code: ProblemCode::InvalidArchive,
        detail,
    }
}

/// Iterates the entries of the archive at `path`, each with its checked path and kind, and its
/// reader for a file's contents.
fn each_entry(
    path: &Path,
    bounds: Bounds,
    mut f: impl FnMut(Vec<u8>, Kind, &mut dyn Read, u64) -> Result<()>,
) -> Result<Checked> {
    let reader = open_capped(path, bounds.stream_bytes())
        .map_err(|e| EngineError::Internal(format!("archive spool: {e}")))?;
    let mut archive = tar::Archive::new(reader);
    let entries = archive
        .entries()
        .map_err(|e| refused(format!("not a tar archive: {e}")))?;
    let mut checked = Checked::default();
    for (n, entry) in entries.enumerate() {
        let mut entry =
            entry.map_err(|e| refused(format!("entry {}: not readable as tar: {e}", n + 1)))?;
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let at = |why: &str| refused(format!("entry {} ('{shown}'): {why}", n + 1));
        let kind = entry.header().entry_type();
        use tar::EntryType as T;
        if matches!(
            kind,
            T::XGlobalHeader | T::XHeader | T::GNULongName | T::GNULongLink
        ) {
            continue;
        }
        let path = entry_path(&raw).map_err(|why| at(&format!("{why} is not allowed")))?;
        if checked.files + checked.symlinks + checked.directories >= bounds.files {
            return Err(refused(format!(
                "the archive has more than {} entries, the most one upload may hold \
                 (limits.max_archive_files); upload it in parts",
                bounds.files
            )));
        }
        // The size the entry's data really has (a pax record overrides the header's field).
        let size = entry.size();
        let kind = match kind {
            T::Directory => {
                checked.directories += 1;
                Kind::Directory
            }
            _ if path.is_empty() => return Err(at("it names the workspace root")),
            T::Regular | T::Continuous => {
                if size > MAX_ARCHIVE_FILE_BYTES {
                    return Err(at(&format!(
                        "{size} bytes, over the {MAX_ARCHIVE_FILE_BYTES}-byte limit for one file"
                    )));
                }
                checked.files += 1;
                checked.bytes = checked.bytes.saturating_add(size);
                if checked.bytes > bounds.unpacked_bytes {
                    return Err(refused(format!(
                        "the archive unpacks to more than {} bytes, the most one upload may \
                         (limits.max_archive_unpacked_bytes); upload it in parts",
                        bounds.unpacked_bytes
                    )));
                }
                let mode = entry.header().mode().unwrap_or(0o644);
                // Permission bits only, as the file tools write them: no setuid, setgid or
                // sticky bit, and never writable by others.
                Kind::File {
                    mode: (mode & 0o777 & !0o002) | 0o600,
                }
            }
            T::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                if !stays_inside(&path, &target) {
                    return Err(at(&format!(
                        "a symlink to '{}', which leads out of the workspace (only relative \
                         targets that stay inside are allowed)",
                        String::from_utf8_lossy(&target)
                    )));
                }
                checked.symlinks += 1;
                Kind::Symlink { target }
            }
            T::Link => return Err(at("a hard link (upload the file itself)")),
            T::Char | T::Block => return Err(at("a device")),
            T::Fifo => return Err(at("a FIFO")),
            T::GNUSparse => return Err(at("a sparse file")),
            other => return Err(at(&format!("an entry of type {other:?}"))),
        };
        f(path, kind, &mut entry, size)?;
    }
    Ok(checked)
}

/// One of a tenant's archive transfers on this node, held while it lasts.
pub struct ArchiveSlot(#[allow(dead_code, reason = "held for its drop")] crate::slots::Slot);

impl Engine {
    /// A slot for one of `tenant`'s archive transfers, or 429 `too_many_concurrent`.
    pub fn archive_slot(&self, tenant: Uuid) -> Result<ArchiveSlot> {
        self.archive_slots.take(tenant).map(ArchiveSlot)
    }

    /// A new spool file for an upload, beneath the workspace root (`.uploads/`, the service's
    /// alone), and the file to write the body to.
    pub fn archive_spool(&self) -> io::Result<(Spool, std::fs::File)> {
        let dir = self.workspaces.root().join(".uploads");
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let path = dir.join(format!("{}.tar", Uuid::now_v7().simple()));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)?;
        Ok((Spool { path }, file))
    }

    /// Unpacks the spooled archive into the session's workspace and records what it changed
    /// (see the module's documentation).
    pub async fn upload_archive(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        spool: Spool,
    ) -> Result<ArchiveUploaded> {
        let session = self.store.get_session(tenant_id, session_id).await?;
        if session.status != SessionStatus::Active {
            return Err(crate::calls::closed(session_id));
        }
        let bounds = Bounds {
            files: self.config.limits.max_archive_files,
            unpacked_bytes: self.config.limits.max_archive_unpacked_bytes,
        };
        // First pass: everything checked, nothing written.
        let spool = Arc::new(spool);
        let checked = {
            let spool = spool.clone();
            tokio::task::spawn_blocking(move || {
                check_extensions(spool.path(), bounds.stream_bytes())?;
                each_entry(spool.path(), bounds, |_, _, _, _| Ok(()))
            })
            .await
            .map_err(|e| EngineError::Internal(format!("archive check: {e}")))??
        };

        let (_lease, previous) = self.leases.hold(session_id).await?;
        if previous.is_some() {
            self.forget_runtime(session_id);
        }
        let rt = self.runtime(&session, previous.as_deref()).await?;
        let _turn = rt.schedule.write().await;
        let session = self.store.get_session(tenant_id, session_id).await?;
        if session.status != SessionStatus::Active {
            return Err(crate::calls::closed(session_id));
        }
        if let Ok(st) = rustix::fs::statvfs(rt.workspace.root_path()) {
            let free = st.f_bavail.saturating_mul(st.f_frsize);
            if checked.bytes > free {
                return Err(EngineError::Conflict {
                    code: ProblemCode::ArchiveNotApplied,
                    detail: format!(
                        "the archive unpacks to {} bytes and the session's workspace has {free} \
                         bytes free{}; nothing was written",
                        checked.bytes,
                        if self.workspaces.disk_quota().is_some() {
                            " (its disk quota)"
                        } else {
                            ""
                        }
                    ),
                });
            }
        }
        // The scans that record each batch compare with the workspace as it is now.
        rt.ensure_baseline(&self.inotify, crate::scans::budget(&self.config.limits))
            .await?;

        // Second pass: written batch by batch, each batch recorded before the next.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<std::result::Result<(), String>>(1);
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let writer = {
            let spool = spool.clone();
            let ws = rt.workspace.clone();
            tokio::task::spawn_blocking(move || {
                let mut batch_bytes = 0u64;
                let mut batch_entries = 0usize;
                each_entry(spool.path(), bounds, |path, kind, reader, size| {
                    let shown = String::from_utf8_lossy(&path).into_owned();
                    let written = match kind {
                        Kind::Directory => Ok(()),
                        Kind::Symlink { target } => ws
                            .restore_symlink(&path, &target)
                            .map_err(|e| e.model_message()),
                        Kind::File { mode } => {
                            let mut contents = Vec::with_capacity(size.min(1 << 20) as usize);
                            reader
                                .take(size.min(MAX_ARCHIVE_FILE_BYTES) + 1)
                                .read_to_end(&mut contents)
                                .map_err(|e| format!("reading '{shown}' from the archive: {e}"))
                                .and_then(|n| {
                                    // The first pass counted `size`: more is not this archive.
                                    if n as u64 != size {
                                        return Err(format!(
                                            "'{shown}' holds {n} bytes where its header says {size}"
                                        ));
                                    }
                                    ws.restore_file(&path, &contents, mode)
                                        .map_err(|e| e.model_message())
                                })
                        }
                    };
                    if let Err(e) = written {
                        return Err(EngineError::Conflict {
                            code: ProblemCode::ArchiveNotApplied,
                            detail: e,
                        });
                    }
                    batch_bytes += size;
                    batch_entries += 1;
                    if batch_bytes >= BATCH_BYTES || batch_entries >= BATCH_ENTRIES {
                        batch_bytes = 0;
                        batch_entries = 0;
                        // Recorded before the next batch is written.
                        if tx.blocking_send(Ok(())).is_err() || go_rx.recv().is_err() {
                            return Err(EngineError::Internal("the upload was stopped".into()));
                        }
                    }
                    Ok(())
                })
            })
        };
        let mut events = 0u64;
        let mut last_seq = session.last_seq;
        while let Some(_batch) = rx.recv().await {
            let (n, seq) = self.record_upload_batch(&rt, tenant_id, session_id).await?;
            events += n;
            last_seq = seq.unwrap_or(last_seq);
            let _ = go_tx.send(());
        }
        let written = writer
            .await
            .map_err(|e| EngineError::Internal(format!("archive unpack: {e}")))?;
        let (n, seq) = self.record_upload_batch(&rt, tenant_id, session_id).await?;
        events += n;
        last_seq = seq.unwrap_or(last_seq);
        match written {
            Ok(_) => Ok(ArchiveUploaded {
                files: checked.files,
                symlinks: checked.symlinks,
                directories: checked.directories,
                bytes: checked.bytes,
                events,
                last_seq,
            }),
            Err(EngineError::Conflict { code, detail }) => Err(EngineError::Conflict {
                code,
                detail: format!(
                    "the upload stopped at an entry it could not write ({detail}); the {events} \
                     file changes before it are in the workspace and recorded (up to seq \
                     {last_seq})"
                ),
            }),
            Err(e) => Err(e),
        }
    }

    /// The workspace of a session of this tenant as the log has it right after event `at` (its
    /// last by default), as a tar file in a spool the caller streams and drops. With
    /// `allow_partial`, files whose contents the log lacks are left out (their names in the
    /// second value); without, they make it a 409 that names them.
    pub async fn archive_at(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        at: Option<i64>,
        allow_partial: bool,
    ) -> Result<(Spool, i64, Vec<String>)> {
        let _permit = self.fold_permit(1).await?;
        let (_, at, state) = self.state_at(tenant_id, session_id, at).await?;
        let missing = crate::history::unrestorable_names(&state);
        if !missing.is_empty() && !allow_partial {
            return Err(crate::history::unrestorable_error(
                &missing,
                "download the archive",
            ));
        }
        let (spool, file) = self
            .archive_spool()
            .map_err(|e| EngineError::Internal(format!("archive spool: {e}")))?;
        let mut builder = tar::Builder::new(io::BufWriter::new(file));
        builder.mode(tar::HeaderMode::Deterministic);
        let entries: Vec<(Vec<u8>, toolexec_workspace::history::Entry)> = state
            .iter()
            .filter(|(_, e)| e.restorable())
            .map(|(p, e)| (p.to_vec(), e.clone()))
            .collect();
        let mut start = 0;
        while start < entries.len() {
            // Contents fetched a batch at a time: memory bounded by the batch, not the state.
            let mut end = start;
            let mut bytes = 0u64;
            while end < entries.len() && (end == start || bytes < BATCH_BYTES) {
                bytes += entries[end].1.size;
                end += 1;
            }
            let batch = entries[start..end].to_vec();
            let shas = toolexec_workspace::history::blobs_of(batch.iter().map(|(_, e)| e));
            let contents: std::collections::HashMap<String, bytes::Bytes> = self
                .store
                .blobs(&shas)
                .await?
                .into_iter()
                .map(|b| (b.sha256, b.bytes))
                .collect();
            builder = tokio::task::spawn_blocking(move || {
                for (path, entry) in &batch {
                    let name = std::ffi::OsStr::from_bytes(path);
                    let mut header = tar::Header::new_gnu();
                    if let Some(target) = &entry.target {
                        header.set_entry_type(tar::EntryType::Symlink);
                        header.set_mode(0o777);
                        header.set_size(0);
                        builder.append_link(
                            &mut header,
                            name,
                            std::ffi::OsStr::from_bytes(target),
                        )?;
                    } else {
                        let Some(data) = entry.sha256.as_ref().and_then(|s| contents.get(s)) else {
                            return Err(io::Error::other(format!(
                                "the store lacks the contents of '{}'",
                                String::from_utf8_lossy(path)
                            )));
                        };
                        header.set_entry_type(tar::EntryType::Regular);
                        header.set_mode(entry.mode & 0o7777);
                        header.set_size(data.len() as u64);
                        builder.append_data(&mut header, name, &data[..])?;
                    }
                }
                Ok(builder)
            })
            .await
            .map_err(|e| EngineError::Internal(format!("archive: {e}")))?
            .map_err(|e| EngineError::Internal(format!("archive: {e}")))?;
            start = end;
        }
        tokio::task::spawn_blocking(move || {
            builder.into_inner().and_then(|mut w| {
                use std::io::Write;
                w.flush()
            })
        })
        .await
        .map_err(|e| EngineError::Internal(format!("archive: {e}")))?
        .map_err(|e| EngineError::Internal(format!("archive: {e}")))?;
        Ok((spool, at, missing))
    }

    /// Records what the last batch changed in the workspace as events of no invocation; how
    /// many, and the last seq when there were any.
    async fn record_upload_batch(
        &self,
        rt: &crate::sessions::SessionRuntime,
        tenant_id: Uuid,
        session_id: Uuid,
    ) -> Result<(u64, Option<i64>)> {
        let mut out = toolexec_tools::ToolOutput::ok(String::new());
        let _contents = self.record_workspace_changes(rt, &mut out).await;
        if !out.content.is_empty() {
            // The scan failed: what the batch wrote may be missing from the log; say so.
            return Err(EngineError::Unavailable(format!(
                "the upload stopped: {}",
                out.content.trim()
            )));
        }
        if out.changes.is_empty() {
            return Ok((0, None));
        }
        let mut events = Vec::with_capacity(out.changes.len());
        let mut blobs = Vec::new();
        for change in out.changes {
            rt.reads.forget(&change.change.path);
            let (event, blob) = self.change_event(change);
            events.push(event);
            blobs.extend(blob);
        }
        let n = events.len() as u64;
        let (_, last) = self
            .store
            .append_events(tenant_id, session_id, events, blobs)
            .await?;
        Ok((n, Some(last)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_paths_are_relative_and_never_climb() {
        assert_eq!(entry_path(b"./src/main.rs").unwrap(), b"src/main.rs");
        assert_eq!(entry_path(b"src//lib/").unwrap(), b"src/lib");
        assert_eq!(entry_path(b"./").unwrap(), b"");
        for bad in [&b"/etc/passwd"[..], b"../x", b"a/../../x", b"a/..", b"a\0b"] {
            assert!(
                entry_path(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_symlink_may_point_anywhere_inside_and_nowhere_outside() {
        assert!(stays_inside(b"a/link", b"../b"));
        assert!(stays_inside(b"a/b/link", b"../../c/d"));
        assert!(stays_inside(b"link", b"x/y/../z"));
        assert!(!stays_inside(b"link", b"../x"));
        assert!(!stays_inside(b"a/link", b"../../x"));
        assert!(!stays_inside(b"a/link", b"/etc/passwd"));
        assert!(!stays_inside(b"link", b""));
        assert!(!stays_inside(b"a/link", b"x/../../../y"));
    }
}
