//! Getting a project in and out of a session: a tar (or tar.gz) stream unpacked into its
//! workspace — checked whole before the first entry is written — and recorded as the session's
//! file events; and the workspace, as the log has it at any step, streamed back as tar.
//!
//! **In.** The API spools the request body to a file beneath the workspace root (bounded by
//! `limits.max_archive_bytes`; the node takes `limits.max_concurrent_archive_uploads` at once),
//! then [`Engine::upload_archive`]:
//! 1. reads the archive once and refuses it, writing nothing, for anything one entry or the
//!    archive as a whole can be refused for ([`read`]: types, paths and their lengths, sizes and
//!    counts checked on each header before its bytes are inflated, so a gzip bomb stops at the
//!    first header past a limit; [`check::Tree`]: a path given twice or as two things);
//! 2. under the session's exclusive turn (no call runs meanwhile), checks it against the
//!    workspace as it is then — what is in the way, every link resolved through the links of
//!    the archive and of the workspace, the blocks and inodes free — still writing nothing;
//! 3. then writes it through the workspace jail in batches of at most [`BATCH_BYTES`], each
//!    file streamed from the archive to its place through a fixed buffer (never whole in
//!    memory, blocks of zeros left as holes), and records each batch as the scan after a
//!    command does: the file events of what changed on disk, contents as blobs up to
//!    `limits.max_blob_bytes` per file. Directories are not recorded (the log records files
//!    and symlinks; an empty directory is not kept).
//!
//! Every refusal is made before the first write: what is left to fail in the third step is the
//! disk itself (an I/O error, or space a background process took meanwhile); that ends the
//! upload there, with what was written recorded and the error saying so.
//!
//! **Out.** [`Engine::archive_at`] folds the log at a seq (default: the latest) and writes the
//! state as tar to a spool file (holes kept), which the API streams; files the log holds by
//! hash only make it a 409 that names them, as for a rewind.
#![allow(
    clippy::disallowed_methods,
    reason = "the spool files are the service's own, beneath the workspace root"
)]
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use toolexec_core::history::ArchiveUploaded;
use toolexec_core::{ProblemCode, SessionStatus};
use toolexec_workspace::sparse::SparseWriter;
use uuid::Uuid;

use crate::{Engine, EngineError, Result};

mod check;
mod read;

use read::{Bounds, Kind};

/// Contents written (and then recorded) at a time: within one scan's content budget, so every
/// batch's files are recorded with their contents.
pub const BATCH_BYTES: u64 = 32 * 1024 * 1024;
/// Entries written at a time, whatever their size.
const BATCH_ENTRIES: usize = 2_000;
pub use read::MAX_ARCHIVE_FILE_BYTES;

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

/// One of a tenant's archive transfers on this node, held while it lasts.
pub struct ArchiveSlot(#[allow(dead_code, reason = "held for its drop")] crate::slots::Slot);

/// One of this node's archive uploads, held from before the body is read until it is recorded.
pub struct ArchiveUpload(
    #[allow(dead_code, reason = "held for its drop")] tokio::sync::OwnedSemaphorePermit,
);

/// Archives of workspaces: uploads unpacked into a session (spooled, checked, recorded as one
/// batch of changes) and downloads of its state at a seq, each tenant's share of them and the
/// node's bound on uploads at once. Writes the file changes an upload makes, as one batch.
pub struct Archives {
    /// Each tenant's archive uploads and downloads on this node.
    slots: Arc<crate::slots::TenantSlots>,
    /// Archive uploads under way on this node, all tenants
    /// (`limits.max_concurrent_archive_uploads`).
    uploads: Arc<tokio::sync::Semaphore>,
    /// Where spools are made (in the workspace root, on the workspaces' file system).
    workspaces: toolexec_workspace::Workspaces,
}

impl Archives {
    pub(crate) fn new(
        slots: Arc<crate::slots::TenantSlots>,
        uploads: usize,
        workspaces: toolexec_workspace::Workspaces,
    ) -> Self {
        Self {
            slots,
            uploads: Arc::new(tokio::sync::Semaphore::new(uploads)),
            workspaces,
        }
    }
}

impl Archives {
    /// A slot for one of `tenant`'s archive transfers, or 429 `too_many_concurrent`.
    pub fn archive_slot(&self, tenant: Uuid) -> Result<ArchiveSlot> {
        self.slots.take(tenant).map(ArchiveSlot)
    }

    /// Room for one more archive upload on this node, or `None` when it has
    /// `limits.max_concurrent_archive_uploads` under way (each holds a spool on disk and a core
    /// while it inflates): the caller answers 503 with a `Retry-After` without reading the body.
    pub fn archive_upload(&self) -> Option<ArchiveUpload> {
        self.uploads
            .clone()
            .try_acquire_owned()
            .ok()
            .map(ArchiveUpload)
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
        engine: &Engine,
        tenant_id: Uuid,
        session_id: Uuid,
        spool: Spool,
    ) -> Result<ArchiveUploaded> {
        let session = engine.store.get_session(tenant_id, session_id).await?;
        if session.status != SessionStatus::Active {
            return Err(crate::calls::closed(session_id));
        }
        let bounds = Bounds {
            files: engine.config.limits.max_archive_files,
            unpacked_bytes: engine.config.limits.max_archive_unpacked_bytes,
        };
        // First pass: the archive alone, read once; nothing written.
        let spool = Arc::new(spool);
        let (checked, tree) = {
            let spool = spool.clone();
            tokio::task::spawn_blocking(move || {
                let mut tree = check::Tree::default();
                let counts = read::each_entry(spool.path(), bounds, |item, _| tree.add(item))?;
                Ok::<_, EngineError>((counts, tree))
            })
            .await
            .map_err(|e| EngineError::Internal(format!("archive check: {e}")))??
        };

        let (_lease, previous) = engine.cluster.hold(session_id).await?;
        if previous.is_some() {
            engine.runtimes.forget_runtime(session_id);
        }
        let rt = engine
            .runtimes
            .runtime(engine, &session, previous.as_deref())
            .await?;
        let _turn = rt.schedule.write().await;
        let session = engine.store.get_session(tenant_id, session_id).await?;
        if session.status != SessionStatus::Active {
            return Err(crate::calls::closed(session_id));
        }
        // Then against the workspace as it is now, no call running: still nothing written.
        {
            let ws = rt.workspace.clone();
            let quota = self.workspaces.disk_quota().is_some();
            tokio::task::spawn_blocking(move || {
                let needs = tree.check_workspace(&ws)?;
                tree.check_links(&ws, &needs)?;
                check::check_disk(&ws, &needs, quota)
            })
            .await
            .map_err(|e| EngineError::Internal(format!("archive check: {e}")))??;
        }
        // The scans that record each batch compare with the workspace as it is now.
        rt.ensure_baseline(&engine.inotify, crate::scans::budget(&engine.config.limits))
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
                read::each_entry(spool.path(), bounds, |item, reader| {
                    let written = match &item.kind {
                        Kind::Directory => Ok(()),
                        Kind::Symlink { target } => ws.restore_symlink(&item.path, target),
                        Kind::File { mode } => {
                            ws.restore_file_from(&item.path, reader, item.size, *mode)
                        }
                    };
                    if let Err(e) = written {
                        return Err(EngineError::Conflict {
                            code: ProblemCode::ArchiveNotApplied,
                            detail: e.model_message(),
                        });
                    }
                    batch_bytes += item.size;
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
            let (n, seq) = self
                .record_upload_batch(engine, &rt, tenant_id, session_id)
                .await?;
            events += n;
            last_seq = seq.unwrap_or(last_seq);
            let _ = go_tx.send(());
        }
        let written = writer
            .await
            .map_err(|e| EngineError::Internal(format!("archive unpack: {e}")))?;
        let (n, seq) = self
            .record_upload_batch(engine, &rt, tenant_id, session_id)
            .await?;
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
        engine: &Engine,
        tenant_id: Uuid,
        session_id: Uuid,
        at: Option<i64>,
        allow_partial: bool,
    ) -> Result<(Spool, i64, Vec<String>)> {
        let _permit = engine.history.fold_permit(engine, 1).await?;
        let (_, at, state) = engine
            .history
            .state_at(engine, tenant_id, session_id, at)
            .await?;
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
        // Holes kept: a sparse file of the state costs the spool its data, not its length.
        let mut builder = tar::Builder::new(SparseWriter::new(file));
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
            let contents: std::collections::HashMap<String, bytes::Bytes> = engine
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
        tokio::task::spawn_blocking(move || builder.into_inner().and_then(SparseWriter::finish))
            .await
            .map_err(|e| EngineError::Internal(format!("archive: {e}")))?
            .map_err(|e| EngineError::Internal(format!("archive: {e}")))?;
        Ok((spool, at, missing))
    }

    /// Records what the last batch changed in the workspace as events of no invocation; how
    /// many, and the last seq when there were any.
    async fn record_upload_batch(
        &self,
        engine: &Engine,
        rt: &crate::runtimes::SessionRuntime,
        tenant_id: Uuid,
        session_id: Uuid,
    ) -> Result<(u64, Option<i64>)> {
        let mut out = toolexec_tools::ToolOutput::ok(String::new());
        let _contents = engine
            .calls
            .record_workspace_changes(engine, rt, &mut out)
            .await;
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
            let (event, blob) = engine.runtimes.change_event(engine, change);
            events.push(event);
            blobs.extend(blob);
        }
        let n = events.len() as u64;
        let (_, last) = engine
            .store
            .append_events(tenant_id, session_id, events, blobs)
            .await?;
        Ok((n, Some(last)))
    }
}
