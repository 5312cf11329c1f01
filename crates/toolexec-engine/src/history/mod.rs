//! Reading the record back: a session's workspace as it was right after any event (its tree,
//! one file), putting a live workspace back to such a state (rewind), and starting a new
//! session from one (fork). Everything here is rebuilt from the log alone — the workspace on
//! disk is only ever written to, never trusted as the record.
//!
//! A state is folded from the session's file events (`file.*`, and the manifests of
//! `files.changed`) up to the seq asked for; a fork's or a replay's log starts where its
//! origin's state was, so its fold starts with its origin's (recursively, at most
//! [`MAX_ORIGIN_DEPTH`] deep).
use std::collections::HashMap;
use std::io::{BufRead, Read};
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use serde_json::json;
use toolexec_core::{
    Event, EventKind, FileChange, FileChangeKind, ForkRequest, Forked, NetworkPolicy, NewSession,
    Origin, OriginKind, ProblemCode, RewindRequest, RewindResult, Rewound, Session, SessionStatus,
    Tree, TreeEntry, TreeEntryKind, names, new_id,
};
use toolexec_store::{Blob, NewEvent};
use toolexec_workspace::Workspace;
use toolexec_workspace::history::{self, Entry, EntryKind, Plan, State};
use toolexec_workspace::scan::{SeenEntry, Snapshot};
use uuid::Uuid;

use crate::runtimes::{SessionRuntime, invalid};
use crate::{Engine, EngineError, Result};

mod entries;
mod replay;

use entries::*;
pub(crate) use entries::{unrestorable_error, unrestorable_names};

/// Deepest chain of origins a fold follows (a fork of a fork of …).
pub const MAX_ORIGIN_DEPTH: usize = 64;

/// Events read per page while folding.
const FOLD_PAGE: u32 = 10_000;

/// Most entries in one page of a tree (and the default).
pub const MAX_TREE_PAGE: u32 = 10_000;
pub const DEFAULT_TREE_PAGE: u32 = 1_000;

/// Most bytes a `files.changed` manifest decompresses to (~210 bytes a change: 5 million).
const MAX_MANIFEST_BYTES: u64 = 1024 * 1024 * 1024;

/// Contents fetched from the store in one round trip while a state is put into a workspace.
const FILL_BATCH_BYTES: u64 = 32 * 1024 * 1024;

/// A file of a past state, as `GET /v1/sessions/{id}/files/{path}?at=` returns it.
#[derive(Debug, Clone)]
pub struct FileAt {
    pub at: i64,
    pub kind: TreeEntryKind,
    pub sha256: Option<String>,
    pub mode: u32,
    pub seq: i64,
    /// The contents (a symlink's target text).
    pub bytes: Bytes,
}

/// The kinds a fold reads.
const FILE_KINDS: [EventKind; 4] = [
    EventKind::FileCreated,
    EventKind::FileModified,
    EventKind::FileDeleted,
    EventKind::FilesChanged,
];

/// A session's past: folding its log into the state at a seq (a bounded number at a time on
/// this node), its tree and files at a seq, forks and rewinds, verify replays and the
/// observations they serve again. Writes `workspace.rewound`, the new session of a fork or a
/// replay (`session.created` with its origin), and a replay's calls (through [`Calls`]).
///
/// [`Calls`]: crate::calls::Calls
pub struct History {
    /// States being rebuilt from logs on this node (`limits.max_concurrent_folds`).
    folds: Arc<tokio::sync::Semaphore>,
    /// Each tenant's replays on this node.
    replay_slots: Arc<crate::slots::TenantSlots>,
    /// Sessions a verify replay is re-running calls in: no other batch may run in them until
    /// it ends.
    replaying: std::sync::Mutex<std::collections::HashSet<Uuid>>,
}

impl History {
    pub(crate) fn new(folds: usize, replay_slots: Arc<crate::slots::TenantSlots>) -> Self {
        Self {
            folds: Arc::new(tokio::sync::Semaphore::new(folds)),
            replay_slots,
            replaying: std::sync::Mutex::new(std::collections::HashSet::new()),
        }
    }
}

impl History {
    /// The seq `at` stands for in `session` (its last event when absent), checked.
    fn resolve_at(session: &Session, at: Option<i64>) -> Result<i64> {
        let at = at.unwrap_or(session.last_seq);
        if at < 1 || at > session.last_seq {
            return Err(invalid(
                ProblemCode::SeqOutOfRange,
                format!(
                    "seq {at} is not an event of session {}: it has events 1 to {}",
                    session.id, session.last_seq
                ),
            ));
        }
        Ok(at)
    }

    /// The workspace of a session of this tenant right after event `at` (its last by default),
    /// from the log alone.
    pub async fn state_at(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        session_id: Uuid,
        at: Option<i64>,
    ) -> Result<(Session, i64, State)> {
        let session = engine.store.get_session(tenant_id, session_id).await?;
        let at = Self::resolve_at(&session, at)?;
        let state = self.fold(engine, &session, at).await?;
        Ok((session, at, state))
    }

    /// Room for `folds` states rebuilt at once on this node (`limits.max_concurrent_folds`),
    /// waited for up to `limits.lease_wait_ms`.
    pub(crate) async fn fold_permit(
        &self,
        engine: &Engine,
        folds: u32,
    ) -> Result<tokio::sync::OwnedSemaphorePermit> {
        let cap = engine.config.limits.max_concurrent_folds.max(1) as u32;
        let wait = std::time::Duration::from_millis(engine.config.limits.lease_wait_ms);
        match tokio::time::timeout(wait, self.folds.clone().acquire_many_owned(folds.min(cap))).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(EngineError::Unavailable(
                "this node is rebuilding as many workspace states from logs as it may at once (limits.max_concurrent_folds); retry shortly".into(),
            )),
        }
    }

    /// Folds the file events of `session` (after its origin's state) up to `at`.
    pub(crate) async fn fold(&self, engine: &Engine, session: &Session, at: i64) -> Result<State> {
        let mut chain = vec![(session.id, at)];
        let mut origin = session.origin;
        while let Some(o) = origin {
            if chain.len() > MAX_ORIGIN_DEPTH {
                return Err(EngineError::Internal(format!(
                    "session {} has more than {MAX_ORIGIN_DEPTH} origins",
                    session.id
                )));
            }
            chain.push((o.session_id, o.seq));
            origin = engine
                .store
                .get_session(session.tenant_id, o.session_id)
                .await?
                .origin;
        }
        let mut state = State::new();
        for (id, up_to) in chain.into_iter().rev() {
            let mut after = 0;
            loop {
                let page = engine
                    .store
                    .events_of_kinds(session.tenant_id, id, &FILE_KINDS, after, up_to, FOLD_PAGE)
                    .await?;
                let Some(last) = page.last() else { break };
                after = last.seq;
                let full = page.len() as u32 == FOLD_PAGE;
                for event in &page {
                    self.apply_event(engine, &mut state, event).await?;
                    self.check_state_size(engine, &state, session)?;
                }
                if !full {
                    break;
                }
            }
        }
        Ok(state)
    }

    fn check_state_size(&self, engine: &Engine, state: &State, session: &Session) -> Result<()> {
        let max = engine.config.limits.max_state_entries;
        if state.len() > max {
            return Err(EngineError::Conflict {
                code: ProblemCode::StateTooLarge,
                detail: format!(
                    "the workspace of session {} holds more than {max} files and symlinks at that point, more than this service rebuilds from a log (limits.max_state_entries)",
                    session.id
                ),
            });
        }
        Ok(())
    }

    async fn apply_event(&self, engine: &Engine, state: &mut State, event: &Event) -> Result<()> {
        let corrupt = |e: String| EngineError::Internal(format!("event {}: {e}", event.seq));
        if event.kind == EventKind::FilesChanged {
            let summary: toolexec_core::FilesChanged =
                serde_json::from_value(event.data.clone()).map_err(|e| corrupt(e.to_string()))?;
            let Some(manifest) = engine.store.blob(&summary.manifest_sha256).await? else {
                return Err(corrupt(
                    "the manifest of files.changed is not stored".into(),
                ));
            };
            // Line by line: a manifest of a million changes is never held decompressed.
            let mut lines = std::io::BufReader::new(
                flate2::read::GzDecoder::new(&manifest[..]).take(MAX_MANIFEST_BYTES),
            );
            let mut line = Vec::new();
            let mut read = 0u64;
            let mut applied = 0usize;
            loop {
                line.clear();
                let n = lines
                    .read_until(b'\n', &mut line)
                    .map_err(|e| corrupt(format!("manifest: {e}")))?;
                if n == 0 {
                    break;
                }
                read += n as u64;
                if read >= MAX_MANIFEST_BYTES {
                    return Err(corrupt(format!(
                        "the manifest of files.changed is larger than {MAX_MANIFEST_BYTES} bytes"
                    )));
                }
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let change: FileChange =
                    serde_json::from_slice(&line).map_err(|e| corrupt(e.to_string()))?;
                state
                    .apply(event.seq, &change)
                    .map_err(|e| corrupt(e.to_string()))?;
                applied += 1;
                if applied.is_multiple_of(1024)
                    && state.len() > engine.config.limits.max_state_entries
                {
                    return Ok(());
                }
            }
            return Ok(());
        }
        let change: FileChange =
            serde_json::from_value(event.data.clone()).map_err(|e| corrupt(e.to_string()))?;
        state
            .apply(event.seq, &change)
            .map_err(|e| corrupt(e.to_string()))
    }

    /// One page of the workspace of a session as it was right after `at`.
    pub async fn tree(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        session_id: Uuid,
        at: Option<i64>,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<Tree> {
        let _permit = self.fold_permit(engine, 1).await?;
        let (_, at, state) = self.state_at(engine, tenant_id, session_id, at).await?;
        let after = match cursor {
            Some(c) => base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(c)
                .map_err(|_| {
                    invalid(
                        ProblemCode::InvalidRequest,
                        "cursor: not a cursor this endpoint gave out".into(),
                    )
                })?,
            None => Vec::new(),
        };
        let limit = limit.clamp(1, MAX_TREE_PAGE) as usize;
        let iter: Box<dyn Iterator<Item = (&[u8], &Entry)>> = if cursor.is_some() {
            Box::new(state.iter_after(&after))
        } else {
            Box::new(state.iter())
        };
        let mut entries = Vec::with_capacity(limit.min(state.len()));
        let mut next_cursor = None;
        for (path, entry) in iter {
            if entries.len() == limit {
                // The cursor names the last entry returned; the next page starts after it.
                next_cursor = Some(cursor_after(&entries));
                break;
            }
            entries.push(tree_entry(path, entry));
        }
        Ok(Tree {
            session_id,
            at,
            total: state.len() as u64,
            unrestorable: state.unrestorable().count() as u64,
            entries,
            next_cursor,
        })
    }

    /// One file (or symlink) of a session's workspace as it was right after `at`.
    pub async fn file_at(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        session_id: Uuid,
        at: Option<i64>,
        path: &[u8],
    ) -> Result<FileAt> {
        let _permit = self.fold_permit(engine, 1).await?;
        let (_, at, state) = self.state_at(engine, tenant_id, session_id, at).await?;
        let shown = names::display_bytes(path);
        let entry = state.get(path).ok_or_else(|| {
            EngineError::Missing(format!(
                "no file or symlink '{shown}' in the workspace after event {at} (GET …/tree?at={at} lists them)"
            ))
        })?;
        let bytes = match entry.kind {
            EntryKind::Symlink => Bytes::from(entry.target.clone().unwrap_or_default()),
            EntryKind::File => {
                let sha = entry
                    .sha256
                    .as_deref()
                    .filter(|_| entry.restorable())
                    .ok_or_else(|| not_recorded(&shown, entry))?;
                let data = engine
                    .store
                    .blob(sha)
                    .await?
                    .ok_or_else(|| not_recorded(&shown, entry))?;
                Bytes::from(data)
            }
        };
        Ok(FileAt {
            at,
            kind: match entry.kind {
                EntryKind::File => TreeEntryKind::File,
                EntryKind::Symlink => TreeEntryKind::Symlink,
            },
            sha256: entry.sha256.clone(),
            mode: entry.mode,
            seq: entry.seq,
            bytes,
        })
    }

    /// Writes a plan's entries into `ws`, fetching their contents from the store in bounded
    /// batches. Returns the files whose contents the store did not have, and the entries that
    /// could not be written (the others are).
    pub(crate) async fn fill(
        &self,
        engine: &Engine,
        ws: &Arc<Workspace>,
        plan: &Plan<'_>,
    ) -> Result<(Vec<Vec<u8>>, history::Failed)> {
        let mut missing = Vec::new();
        let mut failed = history::Failed::new();
        let mut start = 0;
        while start < plan.write.len() {
            let mut end = start;
            let mut bytes = 0u64;
            while end < plan.write.len() && (end == start || bytes < FILL_BATCH_BYTES) {
                bytes += plan.write[end].1.size;
                end += 1;
            }
            let batch: Vec<(Vec<u8>, Entry)> = plan.write[start..end]
                .iter()
                .map(|(p, e)| (p.to_vec(), (*e).clone()))
                .collect();
            let shas = history::blobs_of(batch.iter().map(|(_, e)| e));
            let contents: HashMap<String, Bytes> = engine
                .store
                .blobs(&shas)
                .await?
                .into_iter()
                .map(|b| (b.sha256, b.bytes))
                .collect();
            let ws = ws.clone();
            let (absent, not_written) = tokio::task::spawn_blocking(move || {
                let refs: Vec<(&[u8], &Entry)> =
                    batch.iter().map(|(p, e)| (p.as_slice(), e)).collect();
                let mut failed = history::Failed::new();
                let absent = history::write(&ws, &refs, &contents, &mut failed);
                (absent, failed)
            })
            .await
            .map_err(|e| EngineError::Internal(format!("restoring files: {e}")))?;
            missing.extend(absent);
            failed.extend(not_written);
            start = end;
        }
        Ok((missing, failed))
    }

    /// Writes a whole state into a fresh workspace. Contents the log names but the store does
    /// not have fail it (with their names), as does any other failure: a fork's or replay's
    /// workspace is what the log says or is not made.
    async fn fill_fresh(
        &self,
        engine: &Engine,
        ws: &Arc<Workspace>,
        plan: &Plan<'_>,
    ) -> Result<()> {
        let (missing, failed) = self.fill(engine, ws, plan).await?;
        if !missing.is_empty() {
            let shown: Vec<String> = missing
                .iter()
                .take(20)
                .map(|p| names::display_bytes(p))
                .collect();
            return Err(EngineError::Conflict {
                code: ProblemCode::ContentNotRecorded,
                detail: format!(
                    "the log names contents the store does not have for {} file(s): {}",
                    missing.len(),
                    shown.join(", ")
                ),
            });
        }
        match failed.into_iter().next() {
            Some((path, e)) => Err(EngineError::Internal(format!(
                "restoring '{}': {e}",
                names::display_bytes(&path)
            ))),
            None => Ok(()),
        }
    }

    /// A new session of the same tenant whose workspace starts as `source_id`'s was right after
    /// `at_seq` (see [`ForkRequest`]).
    pub async fn fork(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        source_id: Uuid,
        req: ForkRequest,
    ) -> Result<Forked> {
        let source = engine.store.get_session(tenant_id, source_id).await?;
        // "Now" waits for the source's calls in flight, on any node (its lease), and for a
        // mutating one on this node (its scheduling lock).
        let _lease = match (req.at_seq, source.status) {
            (None, SessionStatus::Active) => {
                let (lease, previous) = engine.cluster.hold(source_id).await?;
                if previous.is_some() {
                    engine.runtimes.forget_runtime(source_id);
                }
                Some(lease)
            }
            _ => None,
        };
        let cached = engine.runtimes.cached_runtime(tenant_id, source_id)?;
        let _turn = match (&cached, req.at_seq) {
            (Some(rt), None) => Some(rt.schedule.read().await),
            _ => None,
        };
        let source = if _turn.is_some() {
            engine.store.get_session(tenant_id, source_id).await?
        } else {
            source
        };
        let at = Self::resolve_at(&source, req.at_seq)?;
        self.check_fork(&source, &req)?;
        let _permit = self.fold_permit(engine, 1).await?;
        let state = self.fold(engine, &source, at).await?;
        let unrestorable = unrestorable_names(&state);
        if !unrestorable.is_empty() && !req.allow_partial {
            return Err(unrestorable_error(&unrestorable, "fork"));
        }
        let new = NewSession {
            tools: req.tools.clone().or_else(|| source.tools.clone()),
            policy: Some(match req.policy.clone() {
                // What the fork's policy leaves out, it keeps from the source.
                Some(mut p) => {
                    p.default_timeout_ms =
                        p.default_timeout_ms.or(source.policy.default_timeout_ms);
                    p.approval = p.approval.or_else(|| source.policy.approval.clone());
                    p
                }
                None => source.policy.clone(),
            }),
            env: Some(source.env.clone()),
            metadata: Some(
                req.metadata
                    .clone()
                    .unwrap_or_else(|| source.metadata.clone()),
            ),
            files: None,
            environment: None,
        };
        let origin = Origin {
            kind: OriginKind::Fork,
            session_id: source.id,
            seq: at,
        };
        // A fork runs in its source's image: the same digest, whatever its tag names now.
        let (session, shares_contents) = self
            .create_from_state(
                engine,
                tenant_id,
                new_id(),
                new,
                origin,
                source.environment.clone(),
                &state,
            )
            .await?;
        Ok(Forked {
            session,
            unrestorable,
            shares_contents,
        })
    }

    /// A fork may only tighten: network, timeouts, output limits, tools.
    fn check_fork(&self, source: &Session, req: &ForkRequest) -> Result<()> {
        let not_tighter = |what: String| invalid(ProblemCode::PolicyNotTighter, what);
        if let Some(p) = &req.policy {
            if p.network == NetworkPolicy::Allow && source.policy.network == NetworkPolicy::None {
                return Err(not_tighter(
                    "policy.network: the source has no network; a fork cannot be given it".into(),
                ));
            }
            if let (Some(mine), Some(src)) = (&p.approval, &source.policy.approval)
                && !mine.covers(src)
            {
                return Err(not_tighter(
                    "policy.approval: a fork must gate at least every tool and capability its source gates".into(),
                ));
            }
            if let (Some(t), Some(src)) = (p.default_timeout_ms, source.policy.default_timeout_ms)
                && t > src
            {
                return Err(not_tighter(format!(
                    "policy.default_timeout_ms: {t} is above the source's {src}"
                )));
            }
            for (tool, chars) in &source.policy.output_limits {
                match p.output_limits.get(tool) {
                    Some(c) if c > chars => {
                        return Err(not_tighter(format!(
                            "policy.output_limits.{tool}: {c} is above the source's {chars}"
                        )));
                    }
                    None => {
                        return Err(not_tighter(format!(
                            "policy.output_limits.{tool}: the source limits it to {chars}; keep a limit at most that"
                        )));
                    }
                    _ => {}
                }
            }
        }
        if let (Some(tools), Some(allowed)) = (&req.tools, &source.tools) {
            let extra: Vec<&str> = tools
                .iter()
                .filter(|t| !allowed.contains(t))
                .map(String::as_str)
                .collect();
            if !extra.is_empty() {
                return Err(not_tighter(format!(
                    "tools: {} not allowed in the source session",
                    extra.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Creates a session (checked like any new one) whose workspace is `state`, recorded as
    /// coming from `origin`: on the base of that state when forks share contents, else a copy.
    #[allow(clippy::too_many_arguments)] // the engine it runs in is the eighth
    pub(crate) async fn create_from_state(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        id: Uuid,
        new: NewSession,
        origin: Origin,
        environment: Option<toolexec_core::SessionEnvironment>,
        state: &State,
    ) -> Result<(Session, bool)> {
        engine.runtimes.check_new_session(engine, &new)?;
        self.check_origin_depth(engine, tenant_id, origin.session_id)
            .await?;
        let image = engine
            .runtimes
            .session_image(engine, environment.as_ref())
            .await?;
        let name = id.to_string();
        let session = Session {
            id,
            tenant_id,
            status: SessionStatus::Active,
            tools: new.tools,
            policy: new.policy.unwrap_or_default(),
            env: new.env.unwrap_or_default(),
            metadata: new.metadata.unwrap_or_else(|| json!({})),
            created_at: chrono::Utc::now(),
            closed_at: None,
            last_seq: 0,
            origin: Some(origin),
            environment,
            truncated: None,
        };
        // What its origin had read at its seq (the workspace is that state, so the hashes
        // match): its log has nothing yet, so the fold starts at the origin.
        let reads = engine.runtimes.reads_at(engine, &session, 0).await?;
        let empty = history::plan(std::iter::empty(), state);
        let shares = engine.workspaces.shares_contents();
        let workspace = if shares {
            let key = format!("{}@{}", origin.session_id, origin.seq);
            if engine.workspaces.existing_base(&key).is_none() {
                let builder = engine.workspaces.begin_base(&key).map_err(io_error)?;
                let ws = builder.workspace();
                match self.fill_fresh(engine, &ws, &empty).await {
                    Ok(()) => {
                        drop(ws);
                        engine.workspaces.finish_base(builder).map_err(io_error)?;
                    }
                    Err(e) => {
                        drop(ws);
                        engine.workspaces.abandon_base(builder);
                        return Err(e);
                    }
                }
            }
            let workspaces = engine.workspaces.clone();
            let name = name.clone();
            tokio::task::spawn_blocking(move || workspaces.create_on(&name, &key))
                .await
                .map_err(|e| EngineError::Internal(format!("cannot create workspace: {e}")))?
                .map_err(io_error)?
        } else {
            // Off the async threads: with a disk quota this makes and mounts a filesystem.
            let workspaces = engine.workspaces.clone();
            let made = {
                let name = name.clone();
                tokio::task::spawn_blocking(move || workspaces.create(&name))
                    .await
                    .map_err(|e| EngineError::Internal(format!("cannot create workspace: {e}")))?
            };
            let ws = Arc::new(made.map_err(io_error)?);
            if let Err(e) = self.fill_fresh(engine, &ws, &empty).await {
                drop(ws);
                engine.workspaces.remove(&name);
                return Err(e);
            }
            Arc::try_unwrap(ws)
                .map_err(|_| EngineError::Internal("workspace still shared".into()))?
        };
        let rt = Arc::new(
            engine
                .runtimes
                .fresh_runtime(engine, session.clone(), workspace, image),
        );
        rt.reads.replace(reads);
        let event = engine
            .runtimes
            .session_created(engine, &session, Some(state.len()));
        let (cap, disk_binds) = engine.runtimes.open_session_cap(engine);
        match engine
            .store
            .create_session(&session, vec![event], Vec::new(), cap)
            .await
        {
            Ok(stored) => {
                engine.runtimes.keep_runtime(engine, rt);
                engine.cluster.settle(stored.id).await;
                Ok((stored, shares))
            }
            Err(e) => {
                drop(rt);
                engine.workspaces.remove(&name);
                Err(engine.runtimes.refused_create(engine, e, disk_binds))
            }
        }
    }

    /// A session made from `source` would have one origin more than `source`: refused when
    /// that is more than a fold follows.
    async fn check_origin_depth(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        source: Uuid,
    ) -> Result<()> {
        let mut depth = 1;
        let mut origin = engine.store.get_session(tenant_id, source).await?.origin;
        while let Some(o) = origin {
            depth += 1;
            if depth > MAX_ORIGIN_DEPTH {
                return Err(invalid(
                    ProblemCode::InvalidRequest,
                    format!(
                        "session {source} is already {MAX_ORIGIN_DEPTH} forks or replays away from its first session; fork an earlier session of the chain instead"
                    ),
                ));
            }
            origin = engine
                .store
                .get_session(tenant_id, o.session_id)
                .await?
                .origin;
        }
        Ok(())
    }

    /// Puts the live workspace of an active session back to its state right after `to_seq`
    /// (see [`RewindRequest`]), and records that as a `workspace.rewound` event followed by a
    /// `file.*` event per change. Waits for the session's calls in flight on this node.
    pub async fn rewind(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        session_id: Uuid,
        req: RewindRequest,
    ) -> Result<RewindResult> {
        let session = engine.store.get_session(tenant_id, session_id).await?;
        if session.status != SessionStatus::Active {
            return Err(crate::calls::closed(session_id));
        }
        let (_lease, previous) = engine.cluster.hold(session_id).await?;
        if previous.is_some() {
            engine.runtimes.forget_runtime(session_id);
        }
        let rt = engine
            .runtimes
            .runtime(engine, &session, previous.as_deref())
            .await?;
        let _turn = rt.schedule.write().await;
        // Calls waiting for approval were asked for in a state the rewind takes away: they
        // must not run on the state it brings back.
        engine
            .approvals
            .deny_waiting_of_session(engine, tenant_id, session_id, "the workspace was rewound")
            .await;
        // Read again under the lock: calls that ran while it was awaited moved last_seq.
        let session = engine.store.get_session(tenant_id, session_id).await?;
        if session.status != SessionStatus::Active {
            return Err(crate::calls::closed(session_id));
        }
        let to_seq = Self::resolve_at(&session, Some(req.to_seq))?;
        // Read before anything changes: what the session had read at `to_seq` is its
        // read-state after the rewind (the files are as they were then).
        let reads = engine.runtimes.reads_at(engine, &session, to_seq).await?;
        let _permit = self.fold_permit(engine, 2).await?;
        let target = self.fold(engine, &session, to_seq).await?;
        let recorded = self.fold(engine, &session, session.last_seq).await?;
        let unrestorable = unrestorable_names(&target);
        if !unrestorable.is_empty() && !req.allow_partial {
            return Err(unrestorable_error(&unrestorable, "rewind"));
        }

        // Background processes started after to_seq go first: they could write meanwhile.
        let stopped = self
            .stop_processes_after(engine, &rt, &session, to_seq)
            .await?;
        // Terminals and the persistent shell too: their programs could write meanwhile, and
        // their working directories may not survive the rewind.
        let mut terminals_ended = Vec::new();
        if let Some(table) = &rt.processes {
            table.end_bash("the workspace was rewound").await;
            terminals_ended = table.end_terminals("the workspace was rewound").await;
        }

        // What is really there now (a command's unrecorded writes included), hashed.
        let ws = rt.workspace.clone();
        let budget = crate::scans::budget(&engine.config.limits);
        let live =
            tokio::task::spawn_blocking(move || Snapshot::capture_within(&ws, None, &budget))
                .await
                .map_err(|e| EngineError::Internal(format!("workspace scan: {e}")))?
                .map_err(|e| {
                    EngineError::Unavailable(format!("the workspace cannot be scanned: {e}"))
                })?;
        let plan = history::plan(live.entries(), &target);
        let ws = rt.workspace.clone();
        let removals = Plan {
            remove: plan.remove.clone(),
            ..Plan::default()
        };
        let (removed, mut failed) = tokio::task::spawn_blocking(move || {
            let mut failed = history::Failed::new();
            let removed = history::remove(&ws, &removals, &mut failed);
            (removed, failed)
        })
        .await
        .map_err(|e| EngineError::Internal(format!("rewind: {e}")))?;
        let (_, not_written) = self.fill(engine, &rt.workspace, &plan).await?;
        failed.extend(not_written);
        for (path, e) in &failed {
            tracing::warn!(session = %session_id, path = %names::display_bytes(path), error = %e, "a rewind could not put an entry back");
        }

        // What is there now, whatever got in the way (a failed write, an earlier background
        // process writing meanwhile): the record says exactly that, so that folding the log
        // gives the workspace on disk. It is also the next scan's baseline.
        let ws = rt.workspace.clone();
        let inotify = engine.inotify.clone();
        let budget = crate::scans::budget(&engine.config.limits);
        let after = tokio::task::spawn_blocking(move || {
            Snapshot::capture_within(&ws, Some(&inotify), &budget)
        })
        .await
        .map_err(|e| EngineError::Internal(format!("workspace scan: {e}")))?
        .map_err(|e| EngineError::Unavailable(format!("the workspace cannot be scanned: {e}")))?;
        let now: HashMap<&[u8], SeenEntry<'_>> = after.entries().collect();
        let mut paths: Vec<&[u8]> = recorded
            .iter()
            .map(|(p, _)| p)
            .chain(now.keys().copied())
            .collect();
        paths.sort_unstable();
        paths.dedup();
        let mut changes = Vec::new();
        for &path in &paths {
            let before = recorded.get(path);
            let is = now
                .get(path)
                .map(|seen| as_recorded(seen, target.get(path), before));
            if !same_entry(before, is.as_ref()) {
                changes.push(rewind_change(path, before, is.as_ref()));
            }
        }
        let as_target = |path: &[u8]| match (now.get(path), target.get(path)) {
            (None, None) => true,
            (Some(seen), Some(t)) => history::same(Some(seen), t),
            _ => false,
        };
        let unrestorable: std::collections::BTreeSet<String> = paths
            .iter()
            .chain(target.iter().map(|(p, _)| p).collect::<Vec<_>>().iter())
            .filter(|p| !as_target(p))
            .map(|p| names::display_bytes(p))
            .collect();
        let restored = plan.write.iter().filter(|(p, _)| as_target(p)).count();
        // What was read after `to_seq` no longer counts (the `workspace.rewound` event says so
        // to a node that folds the log); a file that is not as it was read is refused as stale.
        rt.reads.replace(reads);
        drop(now);

        let rewound = Rewound {
            to_seq,
            restored: restored as u64,
            removed: removed.len() as u64,
            unrestorable: unrestorable.into_iter().collect(),
            processes_stopped: stopped
                .iter()
                .map(|e| e["process_id"].as_str().unwrap_or_default().to_owned())
                .collect(),
        };
        let mut events = vec![NewEvent {
            kind: EventKind::WorkspaceRewound,
            data: serde_json::to_value(&rewound).unwrap_or_default(),
        }];
        events.extend(changes.into_iter().map(|c| NewEvent {
            kind: c.kind.event_kind(),
            data: serde_json::to_value(&c).unwrap_or_default(),
        }));
        events.extend(stopped.into_iter().map(|data| NewEvent {
            kind: EventKind::ProcessExited,
            data,
        }));
        events.extend(terminals_ended.into_iter().map(|(t, e)| NewEvent {
            kind: EventKind::TerminalExited,
            data: serde_json::json!({
                "terminal_id": t.id,
                "command": t.command,
                "exit_code": e.exit_code,
                "killed_by": e.killed_by,
            }),
        }));
        let (seq, _) = engine
            .store
            .append_events(tenant_id, session_id, events, Vec::<Blob>::new())
            .await?;
        engine.streams.notify(session_id);
        // The next scan compares with the rewound workspace, as recorded.
        *rt.snapshot.lock().await = Some(after);
        Ok(RewindResult {
            session_id,
            seq,
            rewound,
        })
    }

    /// Kills the session's background processes started after `seq`; their `process.exited`
    /// event data.
    async fn stop_processes_after(
        &self,
        engine: &Engine,
        rt: &SessionRuntime,
        session: &Session,
        seq: i64,
    ) -> Result<Vec<serde_json::Value>> {
        let Some(table) = &rt.processes else {
            return Ok(Vec::new());
        };
        let started = engine
            .store
            .events_of_kinds(
                session.tenant_id,
                session.id,
                &[EventKind::ProcessStarted],
                seq,
                session.last_seq,
                FOLD_PAGE,
            )
            .await?;
        let mut exits = Vec::new();
        for event in started {
            let Some(id) = event.data["process_id"].as_str() else {
                continue;
            };
            if !table.knows(id) {
                continue;
            }
            let _ = table.kill(id, rustix::process::Signal::KILL).await;
            if let Some(info) = table.take_exit(id) {
                exits.push(json!({
                    "process_id": info.id,
                    "command": info.command,
                    "state": info.state,
                    "output_bytes": info.output_bytes,
                    "stopped_by": "rewind",
                }));
            }
        }
        Ok(exits)
    }
}
