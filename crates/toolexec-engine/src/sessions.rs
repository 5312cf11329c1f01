//! Sessions: creation (workspace + seed files + the first events), listing, closing, and the
//! per-session runtime state kept on the node that holds the workspace.
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::json;
use toolexec_core::ProblemCode;
use toolexec_core::{EventKind, NewSession, Policy, Session, SessionStatus, new_id};
use toolexec_sandbox::{ProcessTable, Sandbox};
use toolexec_store::{Blob, CallKey, NewEvent};
use toolexec_tools::{OutputSource, ReadTracker, ToolContext, Workspace};
use toolexec_workspace::scan::{InotifyPool, ScanBudget, Snapshot};
use uuid::Uuid;

use crate::callindex::{CallIndex, Seen};
use crate::{Engine, EngineError, Result};

/// Call ids read from the store per query while a runtime's call index is filled: one indexed
/// range, ~0.5 MB of ids at most; a session of a million calls takes a hundred of them.
const CALL_ID_PAGE: u32 = 10_000;

/// Longest pause between two attempts to read a runtime's call ids while the store fails
/// (meanwhile every call of the session asks the store, which is failing too).
const CALL_ID_RETRY_MAX: Duration = Duration::from_secs(5);

/// What a node keeps for an active session it serves. A session's calls run on the node that
/// holds its workspace, so this node sees every call recorded for it; the store still checks every
/// write (duplicates, closed sessions), so a stale cache can cost a retry, never a wrong record.
pub struct SessionRuntime {
    /// The session as it was when the runtime was made (its `last_seq` is not kept current).
    pub session: Session,
    pub workspace: Arc<Workspace>,
    pub reads: Arc<ReadTracker>,
    /// Read-only calls share it; a mutating call holds it alone, so it never overlaps another
    /// call of the same session — also across concurrent requests.
    pub schedule: tokio::sync::RwLock<()>,
    /// The call ids recorded for the session, in bounded memory: tells a new call from a
    /// possible retry without a store read (`crate::callindex`).
    pub(crate) calls: CallIndex,
    /// The session's sandbox and background processes (when the engine has a sandbox).
    pub processes: Option<Arc<ProcessTable>>,
    /// When the session was last used on this node (milliseconds on the engine's clock): the
    /// least recently used idle runtimes go first when the node keeps too many.
    last_used: std::sync::atomic::AtomicU64,
    /// What the workspace looked like after the last mutating call: the next one's changes
    /// (a shell command's, a background process's) are found by comparing with it. Taken just
    /// before the session's first command: until then only tools change the workspace, and they
    /// record their own changes.
    pub snapshot: tokio::sync::Mutex<Option<Snapshot>>,
    /// The first process id (`p<N>`) this runtime assigns: ids below it belong to earlier runs
    /// (or earlier runtimes) of the session and may be in its log; ids from it on are known here.
    pub first_process_id: u64,
    /// The session's todos (plan steps and tasks), folded from its log when the runtime is
    /// made and kept current by the tools that change them.
    pub todos: Arc<std::sync::Mutex<toolexec_core::todo::Todos>>,
}

/// `read_output`'s view of the store: full outputs of this session's invocations only.
struct RecordedOutputs {
    store: Arc<dyn toolexec_store::Store>,
    tenant_id: Uuid,
    /// Process ids the log can hold for processes this node does not know: `p1` up to the id
    /// before the runtime's first (see [`SessionRuntime::first_process_id`]).
    first_process_id: u64,
}

/// What the model reads when the store cannot answer a read: no database text (the log has it).
fn unreadable(e: &toolexec_store::StoreError) -> String {
    tracing::warn!(error = %e, "a recorded output could not be read");
    "The recorded output cannot be read right now (the store is unavailable); try again.".into()
}

#[async_trait::async_trait]
impl OutputSource for RecordedOutputs {
    async fn output(
        &self,
        session_id: Uuid,
        invocation_id: Uuid,
    ) -> Result<toolexec_tools::RecordedOutput, String> {
        let not_here = || {
            format!(
                "No invocation {invocation_id} in this session. Use the invocation_id from a truncation marker of this session."
            )
        };
        let output_chars = match self
            .store
            .invocation_page(self.tenant_id, invocation_id, 0, 0)
            .await
        {
            Ok(inv) if inv.session_id == session_id => inv.output_chars,
            Ok(_) | Err(toolexec_store::StoreError::NotFound) => return Err(not_here()),
            Err(e) => return Err(unreadable(&e)),
        };
        self.store
            .invocation_output(self.tenant_id, invocation_id)
            .await
            .map(|text| toolexec_tools::RecordedOutput::new(text, output_chars))
            .map_err(|e| unreadable(&e))
    }

    async fn process_started(
        &self,
        session_id: Uuid,
        process_id: &str,
    ) -> Option<serde_json::Value> {
        // Ids are `p<N>`, numbered per session; every N from the runtime's first id on is one
        // this node assigned (and knows). Anything else cannot be in the log: no query.
        let n: u64 = process_id.strip_prefix('p')?.parse().ok()?;
        if n == 0 || n >= self.first_process_id || process_id != format!("p{n}") {
            return None;
        }
        match self
            .store
            .process_started(self.tenant_id, session_id, process_id)
            .await
        {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, %session_id, process_id, "looking up a process in the log failed");
                None
            }
        }
    }
}

/// Most sessions in one page of `list_sessions`.
pub const MAX_PAGE: u32 = 200;

impl SessionRuntime {
    /// `first_process_id`: above every process id the session's log holds (see
    /// [`toolexec_store::Store::last_process_number`]), so that an id never repeats within a
    /// session, also across restarts.
    pub(crate) fn new(
        session: Session,
        workspace: Workspace,
        calls: CallIndex,
        first_process_id: u64,
        sandbox: Option<&Arc<Sandbox>>,
        admission: Option<toolexec_sandbox::Admission>,
        image: Option<Arc<toolexec_sandbox::SessionImage>>,
    ) -> Self {
        let first_id = first_process_id.max(1);
        let processes = sandbox.map(|s| {
            let table = ProcessTable::new(
                s.clone(),
                session.id.to_string(),
                workspace.root_path().to_path_buf(),
                first_id,
            )
            .with_image(image);
            Arc::new(match admission {
                Some(a) => table.with_admission(a),
                None => table,
            })
        });
        Self {
            session,
            workspace: Arc::new(workspace),
            reads: Arc::new(ReadTracker::default()),
            schedule: tokio::sync::RwLock::new(()),
            calls,
            processes,
            last_used: std::sync::atomic::AtomicU64::new(0),
            snapshot: tokio::sync::Mutex::new(None),
            first_process_id: first_id,
            todos: Arc::default(),
        }
    }

    fn touch(&self, now_ms: u64) {
        self.last_used
            .store(now_ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether nothing but the cache holds it and nothing of it runs: it can be dropped and
    /// rebuilt later (its read-state folded from the log again).
    fn is_idle(self: &Arc<Self>) -> bool {
        Arc::strong_count(self) == 1 && !self.has_running_processes()
    }

    /// Takes the baseline the side-effect scans compare with (hashes every file once, within
    /// the scan budget), unless there is one.
    pub(crate) async fn ensure_baseline(
        &self,
        inotify: &Arc<InotifyPool>,
        budget: ScanBudget,
    ) -> Result<()> {
        let mut guard = self.snapshot.lock().await;
        if guard.is_some() {
            return Ok(());
        }
        let ws = self.workspace.clone();
        let inotify = inotify.clone();
        let snap = tokio::task::spawn_blocking(move || {
            Snapshot::capture_within(&ws, Some(&inotify), &budget)
        })
        .await
        .map_err(|e| EngineError::Internal(format!("workspace scan: {e}")))?
        .map_err(|e| EngineError::Unavailable(format!("the workspace cannot be scanned: {e}")))?;
        *guard = Some(snap);
        Ok(())
    }

    /// Whether background processes or terminals of the session still run (its runtime must
    /// then stay: dropping it would kill them unrecorded). Terminals end by themselves, at the
    /// latest after `limits.terminal_idle_timeout_ms` untouched; the persistent shell does not
    /// keep a runtime (its loss is said by the next `bash` call).
    fn has_running_processes(&self) -> bool {
        self.processes.as_ref().is_some_and(|p| {
            p.running_terminals() > 0
                || p.list()
                    .iter()
                    .any(|p| p.state == toolexec_sandbox::ProcessState::Running)
        })
    }

    /// Whether a call id may be recorded for the session (then the store says whether it is).
    pub(crate) fn seen(&self, call_id: &str) -> Seen {
        self.calls.seen(call_id)
    }

    /// Remembers a call recorded for the session.
    pub(crate) fn remember(&self, key: CallKey) {
        self.calls.add(&key.call_id);
    }
}

/// The sessions live on this node: each one's runtime (its workspace, sandbox and process
/// table, terminals, read-state, call index, the lock its batches take turns on), made on
/// first use (rebuilt from the log, or taken over from a node that is gone) and evicted when
/// idle, least recently used first; and each tenant's share of the node's running commands.
/// Also making, seeding and closing sessions. Writes `session.created`, `session.closed`,
/// `process.started`/`process.exited` and the output of background processes.
pub struct Runtimes {
    /// The runtimes of active sessions on this node, by session id.
    cached: std::sync::Mutex<std::collections::HashMap<Uuid, Arc<SessionRuntime>>>,
    /// When the engine started: the clock of the runtimes' least-recently-used order.
    started: std::time::Instant,
    /// Each tenant's commands running on this node (`limits.max_processes_per_tenant`).
    process_slots: Option<Arc<crate::slots::TenantSlots>>,
}

impl Runtimes {
    pub(crate) fn new(process_slots: Option<Arc<crate::slots::TenantSlots>>) -> Self {
        Self {
            cached: std::sync::Mutex::new(std::collections::HashMap::new()),
            started: std::time::Instant::now(),
            process_slots,
        }
    }

    /// How many runtimes this node holds now (a gauge).
    pub(crate) fn cached_count(&self) -> usize {
        self.cached.lock().map_or(0, |m| m.len())
    }
}

impl Runtimes {
    /// The cached runtime of a session this tenant owns, if this node has one.
    pub(crate) fn cached_runtime(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
    ) -> Result<Option<Arc<SessionRuntime>>> {
        let map = self
            .cached
            .lock()
            .map_err(|_| EngineError::Internal("runtime map poisoned".into()))?;
        match map.get(&session_id) {
            Some(rt) if rt.session.tenant_id == tenant_id => {
                rt.touch(self.clock_ms());
                Ok(Some(rt.clone()))
            }
            Some(_) => Err(EngineError::NotFound),
            None => Ok(None),
        }
    }

    /// The runtime of an active session, opening its workspace and loading its call index on
    /// first use. `from` is the other node that held the session's lease last, if one did:
    /// this node then takes the session over (`Cluster::take_over`), as it does when the
    /// workspace is not here (a node that lost its disk).
    pub(crate) async fn runtime(
        &self,
        engine: &Engine,
        session: &Session,
        from: Option<&str>,
    ) -> Result<Arc<SessionRuntime>> {
        if let Some(rt) = self.cached_runtime(session.tenant_id, session.id)? {
            return Ok(rt);
        }
        let name = session.id.to_string();
        let unavailable = |e: std::io::Error| {
            out_of_descriptors(&e).unwrap_or_else(|| {
                EngineError::Unavailable(format!(
                    "the workspace of session {} cannot be opened on this node ({e})",
                    session.id
                ))
            })
        };
        let took_over = from.is_some();
        let (workspace, gone, took_over) = match (from, engine.workspaces.open(&name)) {
            (None, Ok(ws)) => (ws, Vec::new(), took_over),
            (Some(_), _) => {
                let gone = engine.cluster.take_over(engine, session, from).await?;
                (
                    engine.workspaces.open(&name).map_err(unavailable)?,
                    gone,
                    true,
                )
            }
            (None, Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                let gone = engine.cluster.take_over(engine, session, None).await?;
                (
                    engine.workspaces.open(&name).map_err(unavailable)?,
                    gone,
                    true,
                )
            }
            (None, Err(e)) => return Err(unavailable(e)),
        };
        // The session's image, by its digest (a replica taking it over pulls it first).
        let image = self
            .session_image(engine, session.environment.as_ref())
            .await?;
        let first_process_id = engine.store.last_process_number(session.id).await? + 1;
        // The first page of call ids now: a session of up to a page of calls has its whole
        // index before its first call is planned; a longer one goes on filling it in the
        // background, its calls asking the store meanwhile.
        let calls = CallIndex::loading(engine.config.limits.call_index_max_bytes);
        let first = engine.store.call_ids(session.id, "", CALL_ID_PAGE).await?;
        calls.add_all(first.iter().map(String::as_str));
        let rest = match first.last() {
            Some(last) if first.len() >= CALL_ID_PAGE as usize => Some(last.clone()),
            _ => {
                calls.mark_complete();
                None
            }
        };
        let rt = Arc::new(SessionRuntime::new(
            session.clone(),
            workspace,
            calls,
            first_process_id,
            engine.config.sandbox.as_ref(),
            self.admission(session.tenant_id),
            image,
        ));
        let todos = self
            .todos_of(engine, &session.tenant_id, session.id)
            .await?;
        if let Ok(mut t) = rt.todos.lock() {
            *t = todos;
        }
        // What the session had read, from its log: this node may never have served it, or
        // has forgotten it (restart, eviction, another node ran its calls since).
        rt.reads
            .replace(self.reads_at(engine, session, i64::MAX).await?);
        // Recorded as gone by the take-over: not again by the first call that asks.
        if let Some(table) = &rt.processes {
            for id in &gone {
                table.first_report_of_gone(id);
            }
            // A persistent shell the session had (its last `bash` call ran a command) did not
            // survive the runtime it lived in: its next call says so.
            let had_shell = engine
                .store
                .last_call_arguments(session.id, "bash")
                .await?
                .is_some_and(|args| {
                    args.get("command")
                        .and_then(|c| c.as_str())
                        .is_some_and(|c| !c.trim().is_empty())
                });
            if had_shell {
                table.shell_lost(if took_over {
                    "this node took the session over from the one that served it, and the shell did not move with it"
                } else {
                    "the session's runtime was rebuilt (it was evicted from memory or the service restarted), and the shell went with it"
                });
            }
        }
        let kept = self.keep_runtime(engine, rt.clone());
        if let Some(after) = rest
            && Arc::ptr_eq(&kept, &rt)
        {
            self.fill_call_index(engine, &kept, after);
        }
        Ok(kept)
    }

    /// A session's todos as its log folds them (plan steps and tasks).
    pub async fn todos_of(
        &self,
        engine: &Engine,
        tenant_id: &Uuid,
        session_id: Uuid,
    ) -> Result<toolexec_core::todo::Todos> {
        let mut todos = toolexec_core::todo::Todos::default();
        let mut after = 0;
        loop {
            let page = engine
                .store
                .todo_events(*tenant_id, session_id, after, 1000)
                .await?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            let full = page.len() == 1000;
            for e in &page {
                todos.apply(e);
            }
            if !full {
                break;
            }
        }
        Ok(todos)
    }

    /// The runtime of a session made on this node just now: no call recorded yet.
    pub(crate) fn fresh_runtime(
        &self,
        engine: &Engine,
        session: Session,
        workspace: Workspace,
        image: Option<Arc<toolexec_sandbox::SessionImage>>,
    ) -> SessionRuntime {
        let admission = self.admission(session.tenant_id);
        SessionRuntime::new(
            session,
            workspace,
            CallIndex::complete(engine.config.limits.call_index_max_bytes),
            1,
            engine.config.sandbox.as_ref(),
            admission,
            image,
        )
    }

    /// What a command of one of `tenant`'s sessions needs before it starts.
    fn admission(&self, tenant: Uuid) -> Option<toolexec_sandbox::Admission> {
        self.process_slots.as_ref().map(|s| s.admission(tenant))
    }

    /// Reads the rest of a runtime's call ids from the store (those after `after`), page by
    /// page, into its index, then marks it complete. Stops when the runtime is dropped; retries
    /// while the store fails.
    fn fill_call_index(&self, engine: &Engine, rt: &Arc<SessionRuntime>, mut after: String) {
        let store = engine.store.clone();
        let session_id = rt.session.id;
        let rt: Weak<SessionRuntime> = Arc::downgrade(rt);
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(100);
            loop {
                if rt.strong_count() == 0 {
                    return;
                }
                match store.call_ids(session_id, &after, CALL_ID_PAGE).await {
                    Ok(page) => {
                        let Some(rt) = rt.upgrade() else { return };
                        rt.calls.add_all(page.iter().map(String::as_str));
                        match page.last() {
                            Some(last) if page.len() >= CALL_ID_PAGE as usize => {
                                after = last.clone();
                            }
                            _ => {
                                rt.calls.mark_complete();
                                tracing::debug!(%session_id, bytes = rt.calls.bytes(), "call index loaded");
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, %session_id, "reading the session's call ids failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(CALL_ID_RETRY_MAX);
                    }
                }
            }
        });
    }

    /// Drops this node's runtime of a session (another node ran its calls since): the next
    /// call builds a new one from the store.
    pub(crate) fn forget_runtime(&self, session_id: Uuid) {
        if let Ok(mut map) = self.cached.lock() {
            map.remove(&session_id);
        }
    }

    /// Caches a runtime (or returns the one another task cached first).
    pub(crate) fn keep_runtime(
        &self,
        engine: &Engine,
        rt: Arc<SessionRuntime>,
    ) -> Arc<SessionRuntime> {
        let Ok(mut map) = self.cached.lock() else {
            return rt;
        };
        if let Some(existing) = map.get(&rt.session.id) {
            return existing.clone();
        }
        let budget = engine.config.limits.max_cached_sessions.max(1);
        if map.len() >= budget {
            // Down to 90 % of the budget at once, so that eviction is not paid on every new
            // session; a runtime in use or with processes running is never dropped.
            let keep = budget - budget / 10 - 1;
            let mut idle: Vec<(u64, Uuid)> = map
                .iter()
                .filter(|(_, r)| r.is_idle())
                .map(|(id, r)| (r.last_used.load(std::sync::atomic::Ordering::Relaxed), *id))
                .collect();
            idle.sort_unstable();
            let excess = map.len().saturating_sub(keep);
            let mut dropped = 0;
            for (_, id) in idle.into_iter().take(excess) {
                map.remove(&id);
                dropped += 1;
            }
            engine.metrics.sessions_evicted(dropped);
            if map.len() >= budget {
                tracing::warn!(
                    cached = map.len(),
                    budget,
                    "every cached session is in use: keeping more than limits.max_cached_sessions"
                );
            }
        }
        rt.touch(self.clock_ms());
        map.insert(rt.session.id, rt.clone());
        rt
    }

    /// Milliseconds since the engine started (a clock for least-recently-used order only).
    fn clock_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn tool_context(
        &self,
        engine: &Engine,
        session: &Session,
        rt: &SessionRuntime,
    ) -> ToolContext {
        ToolContext {
            session_id: session.id,
            workspace: rt.workspace.clone(),
            reads: toolexec_tools::CallReads::new(rt.reads.clone()),
            policy: session.policy.clone(),
            env: session.env.clone(),
            outputs: Arc::new(RecordedOutputs {
                store: engine.store.clone(),
                tenant_id: session.tenant_id,
                first_process_id: rt.first_process_id,
            }),
            processes: rt.processes.clone(),
            max_timeout_ms: engine.config.limits.max_timeout_ms,
            max_read_bytes: engine.config.limits.max_read_bytes_per_call,
            max_walk_entries: engine.config.limits.max_walk_entries,
            max_terminals: engine.config.limits.max_terminals_per_session,
            terminal_idle_timeout_ms: engine.config.limits.terminal_idle_timeout_ms,
            // Set when a call runs (`Calls::run_tool`), so that waiting for the session's
            // scheduling lock does not count against it.
            deadline: toolexec_tools::Deadline::none(),
            // Set when a call runs, from its batch (`calls::cancel`).
            cancel: tokio_util::sync::CancellationToken::new(),
            web: engine.config.web.clone(),
            // Set when a call of a verify replay runs (`History::observed_for`).
            observed: toolexec_tools::observe::Observed::Live,
            journal: Arc::new(toolexec_tools::observe::Journal::default()),
            tenant_id: session.tenant_id,
            todos: rt.todos.clone(),
            disk_quota: engine.workspaces.disk_quota(),
        }
    }

    pub(crate) fn check_new_session(&self, engine: &Engine, new: &NewSession) -> Result<()> {
        let limits = &engine.config.limits;
        if let Some(tools) = &new.tools {
            let unknown: Vec<&str> = tools
                .iter()
                .map(String::as_str)
                .filter(|t| engine.registry.get(t).is_none())
                .collect();
            if !unknown.is_empty() {
                return Err(invalid(
                    ProblemCode::UnknownTool,
                    format!(
                        "tools: unknown tool(s) {}; GET /v1/tools lists the catalog",
                        unknown.join(", ")
                    ),
                ));
            }
        }
        if let Some(policy) = &new.policy {
            check_policy(policy, limits)?;
            let egress = engine
                .config
                .sandbox
                .as_ref()
                .is_some_and(|s| s.config().egress);
            if policy.network == toolexec_core::NetworkPolicy::Allow && !egress {
                return Err(invalid(
                ProblemCode::PolicyAboveCeiling,
                    "policy.network: this service gives commands no network (sandbox.egress is off); create the session with network \"none\"".into(),
                ));
            }
            let gated = policy.approval.iter().flat_map(|a| a.tools.iter());
            if let Some(tool) = gated.into_iter().find(|t| engine.registry.get(t).is_none()) {
                return Err(invalid(
                    ProblemCode::UnknownTool,
                    format!("policy.approval.tools: unknown tool '{tool}'"),
                ));
            }
            for tool in policy.output_limits.keys() {
                if engine.registry.get(tool).is_none() {
                    return Err(invalid(
                        ProblemCode::UnknownTool,
                        format!("policy.output_limits: unknown tool '{tool}'"),
                    ));
                }
            }
        }
        if let Some(env) = &new.env {
            for key in env.keys() {
                let ok = !key.is_empty()
                    && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !key.starts_with(|c: char| c.is_ascii_digit());
                if !ok {
                    return Err(invalid(
                        ProblemCode::InvalidEnv,
                        format!(
                            "env: '{key}' is not a valid variable name (letters, digits, '_'; not starting with a digit)"
                        ),
                    ));
                }
                if let Some(why) = crate::session_env::refusal(key) {
                    return Err(invalid(ProblemCode::InvalidEnv, why));
                }
            }
            if env.values().any(|v| v.contains('\0')) {
                return Err(invalid(
                    ProblemCode::InvalidEnv,
                    "env: values must not contain NUL bytes".into(),
                ));
            }
        }
        // Stored as JSON, which no database holds with NUL; and unlike a call's arguments it is
        // returned as is, so it is refused rather than recorded with a replacement.
        if let Some(at) = new
            .metadata
            .as_ref()
            .and_then(|m| crate::canonical::nul_pointer(m, String::new()))
        {
            return Err(invalid(
                ProblemCode::InvalidMetadata,
                format!("metadata{at}: must not contain a NUL character (\\u0000)"),
            ));
        }
        if new
            .files
            .as_ref()
            .is_some_and(|f| f.len() > limits.max_seed_files)
        {
            return Err(invalid(
                ProblemCode::TooManyFiles,
                format!("files: at most {} seed files", limits.max_seed_files),
            ));
        }
        Ok(())
    }

    /// Creates a session: its workspace with the seed files, then the session row and its first
    /// events (`session.created`, one `file.created` per seed file) in one transaction.
    pub async fn create_session(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        new: NewSession,
    ) -> Result<Session> {
        self.check_new_session(engine, &new)?;
        // The image first: pulled (or found in the cache) before anything of the session exists.
        let (environment, image) = match self
            .new_environment(engine, new.environment.as_ref())
            .await?
        {
            Some((e, i)) => (Some(e), Some(i)),
            None => (None, None),
        };
        let id = new_id();
        let now = chrono::Utc::now();
        let session = Session {
            id,
            tenant_id,
            status: SessionStatus::Active,
            tools: new.tools,
            policy: new.policy.unwrap_or_default(),
            env: new.env.unwrap_or_default(),
            metadata: new.metadata.unwrap_or_else(|| json!({})),
            created_at: now,
            closed_at: None,
            last_seq: 0,
            origin: None,
            environment,
            truncated: None,
        };
        let name = id.to_string();
        // Off the async threads: with a disk quota this makes and mounts a filesystem (~50 ms).
        let made = {
            let workspaces = engine.workspaces.clone();
            let name = name.clone();
            tokio::task::spawn_blocking(move || workspaces.create(&name))
                .await
                .map_err(|e| EngineError::Internal(format!("cannot create workspace: {e}")))?
        };
        let workspace = made.map_err(|e| {
            out_of_descriptors(&e)
                .unwrap_or_else(|| EngineError::Internal(format!("cannot create workspace: {e}")))
        })?;
        let rt = Arc::new(self.fresh_runtime(engine, session.clone(), workspace, image));

        let mut events = vec![self.session_created(engine, &session, None)];
        let mut blobs = Vec::new();
        let seeded = self
            .seed_files(engine, &session, &rt, new.files.unwrap_or_default())
            .await;
        let changes = match seeded {
            Ok(c) => c,
            Err(e) => {
                engine.workspaces.remove(&name);
                return Err(e);
            }
        };
        for change in changes {
            let (event, blob) = self.change_event(engine, change);
            events.push(event);
            blobs.extend(blob);
        }
        let (cap, disk_binds) = self.open_session_cap(engine);
        match engine
            .store
            .create_session(&session, events, blobs, cap)
            .await
        {
            Ok(stored) => {
                engine.metrics.session_created();
                self.keep_runtime(engine, rt);
                engine.cluster.settle(stored.id).await;
                Ok(stored)
            }
            Err(e) => {
                engine.workspaces.remove(&name);
                Err(self.refused_create(engine, e, disk_binds))
            }
        }
    }

    /// How many open sessions a tenant may hold: `limits.max_open_sessions_per_tenant`, or
    /// fewer when each reserves its disk quota out of `limits.tenant_disk_bytes` (then `true`).
    pub(crate) fn open_session_cap(&self, engine: &Engine) -> (u64, bool) {
        let limits = &engine.config.limits;
        let cap = limits.max_open_sessions_per_tenant;
        match engine.workspaces.disk_quota() {
            Some(each) if limits.tenant_disk_bytes > 0 => {
                let by_disk = limits.tenant_disk_bytes / each;
                if by_disk < cap {
                    (by_disk, true)
                } else {
                    (cap, false)
                }
            }
            _ => (cap, false),
        }
    }

    /// The error of a refused session create, naming the disk limit when that is what binds.
    pub(crate) fn refused_create(
        &self,
        engine: &Engine,
        e: toolexec_store::StoreError,
        disk_binds: bool,
    ) -> EngineError {
        match e {
            toolexec_store::StoreError::TooManyOpenSessions(max) if disk_binds => {
                EngineError::Conflict {
                    code: toolexec_core::ProblemCode::TooManyOpenSessions,
                    detail: format!(
                        "this tenant's {max} open sessions hold its whole workspace disk quota \
                         (limits.tenant_disk_bytes = {} bytes, {} bytes reserved by each session, \
                         limits.session_disk_bytes); close sessions it no longer needs (DELETE \
                         /v1/sessions/{{id}}) and create this one again",
                        engine.config.limits.tenant_disk_bytes,
                        engine.workspaces.disk_quota().unwrap_or(0)
                    ),
                }
            }
            e => e.into(),
        }
    }

    /// The `session.created` event of a session (with where it came from, and how many files
    /// it started with, for a fork or a replay).
    pub(crate) fn session_created(
        &self,
        engine: &Engine,
        session: &Session,
        from: Option<usize>,
    ) -> NewEvent {
        let mut data = json!({
            "tools": session.tools,
            "policy": session.policy,
            "env_keys": session.env.keys().collect::<Vec<_>>(),
            "metadata": session.metadata,
            "node": engine.config.node,
        });
        if let (Some(environment), serde_json::Value::Object(map)) =
            (&session.environment, &mut data)
        {
            map.insert("environment".into(), json!(environment));
        }
        if let (Some(origin), Some(files), serde_json::Value::Object(map)) =
            (session.origin, from, &mut data)
        {
            map.insert("origin".into(), json!(origin));
            map.insert("files".into(), json!(files));
        }
        NewEvent {
            kind: EventKind::SessionCreated,
            data,
        }
    }

    async fn seed_files(
        &self,
        engine: &Engine,
        session: &Session,
        rt: &SessionRuntime,
        files: std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<toolexec_tools::RecordedChange>> {
        if files.is_empty() {
            return Ok(Vec::new());
        }
        // Seeding goes through write_file itself, so seed paths obey exactly the jail rules the
        // model's writes do.
        let writer = engine
            .registry
            .get("write_file")
            .ok_or_else(|| EngineError::Internal("write_file tool missing".into()))?
            .clone();
        let ctx = self.tool_context(engine, session, rt);
        let mut changes = Vec::new();
        for (path, content) in files {
            let out = writer
                .run(&ctx, json!({"file_path": path, "content": content}))
                .await;
            if out.status.is_error() {
                return Err(invalid(
                    ProblemCode::InvalidSeedFile,
                    format!("files['{path}']: {}", out.content),
                ));
            }
            changes.extend(out.changes);
        }
        // The model has not read the seed files: read-before-write still applies to them.
        for c in &changes {
            rt.reads.forget(&c.change.path);
        }
        Ok(changes)
    }

    /// A file change as a log event, with its contents as a blob unless over the size limit.
    pub(crate) fn change_event(
        &self,
        engine: &Engine,
        change: toolexec_tools::RecordedChange,
    ) -> (NewEvent, Option<Blob>) {
        let mut fc = change.change;
        // The bytes move into the blob: contents are never copied on their way to the store.
        let blob = match change.after {
            Some(bytes) if bytes.len() <= engine.config.limits.max_blob_bytes => {
                Some(Blob::new(bytes))
            }
            after => {
                if after.is_some() {
                    fc.after_unstored = Some(toolexec_core::UnstoredReason::TooLarge);
                }
                fc.after_stored = false;
                None
            }
        };
        (
            NewEvent {
                kind: fc.kind.event_kind(),
                data: serde_json::to_value(&fc).unwrap_or_default(),
            },
            blob,
        )
    }

    pub async fn get_session(&self, engine: &Engine, tenant_id: Uuid, id: Uuid) -> Result<Session> {
        Ok(engine.store.get_session(tenant_id, id).await?)
    }

    /// Closes a session: stops its background processes, records `session.closed` (with how
    /// each process ended), then removes its workspace. The log stays.
    pub async fn close_session(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<Session> {
        // Running calls are stopped (a command's process tree killed) and queued ones never
        // start, all recorded `cancelled`, before the session closes (SPEC §2).
        engine
            .calls
            .cancel_session_calls(engine, tenant_id, id)
            .await?;
        // Calls waiting for approval can no longer run: recorded denied, and why.
        engine
            .approvals
            .deny_waiting_of_session(engine, tenant_id, id, "the session was closed")
            .await;
        let mut processes = Vec::new();
        let mut terminals = Vec::new();
        if let Some(rt) = self.cached_runtime(tenant_id, id)?
            && let Some(table) = &rt.processes
        {
            // Terminals first, so that how each ended is in `session.closed`.
            terminals = table
                .end_terminals("the session was closed")
                .await
                .into_iter()
                .map(|(t, e)| json!({"terminal_id": t.id, "command": t.command, "tty": t.tty, "exit_code": e.exit_code, "killed_by": e.killed_by}))
                .collect();
            table.shutdown().await;
            processes = table
                .take_exits()
                .into_iter()
                .map(|p| json!({"process_id": p.id, "command": p.command, "state": p.state, "output_bytes": p.output_bytes}))
                .collect();
        }
        let session = engine
            .store
            .close_session(
                tenant_id,
                id,
                json!({"node": engine.config.node, "processes": processes, "terminals": terminals}),
            )
            .await?;
        engine.streams.notify(id);
        engine.cluster.release(id).await;
        let rt = self.cached.lock().ok().and_then(|mut m| m.remove(&id));
        // Wait for running calls of the session to finish before the workspace goes away.
        if let Some(rt) = rt {
            let _guard = rt.schedule.write().await;
        }
        engine.workspaces.remove(&id.to_string());
        Ok(session)
    }
}

fn check_policy(policy: &Policy, limits: &crate::Limits) -> Result<()> {
    if let Some(t) = policy.default_timeout_ms
        && (t == 0 || t > limits.max_timeout_ms)
    {
        return Err(invalid(
            ProblemCode::PolicyAboveCeiling,
            format!(
                "policy.default_timeout_ms: must be between 1 and the operator's ceiling of {} ms",
                limits.max_timeout_ms
            ),
        ));
    }
    if let Some(t) = policy.approval.as_ref().and_then(|a| a.timeout_ms)
        && (t == 0 || t > limits.max_approval_wait_ms)
    {
        return Err(invalid(
            ProblemCode::PolicyAboveCeiling,
            format!(
                "policy.approval.timeout_ms: must be between 1 and the operator's ceiling of {} ms (limits.max_approval_wait_ms)",
                limits.max_approval_wait_ms
            ),
        ));
    }
    for (tool, chars) in &policy.output_limits {
        if *chars == 0 || *chars > limits.max_output_chars {
            return Err(invalid(
                ProblemCode::PolicyAboveCeiling,
                format!(
                    "policy.output_limits.{tool}: must be between 1 and the operator's ceiling of {} characters",
                    limits.max_output_chars
                ),
            ));
        }
    }
    Ok(())
}

pub(crate) fn invalid(code: ProblemCode, detail: String) -> EngineError {
    EngineError::Invalid { code, detail }
}

/// "Too many open files" (of this process or of the host) is a node at capacity, not a bug: the
/// client may retry, later or elsewhere.
pub(crate) fn out_of_descriptors(e: &std::io::Error) -> Option<EngineError> {
    if e.kind() == std::io::ErrorKind::StorageFull {
        tracing::error!(error = %e, "no disk left for another session's quota");
        return Some(EngineError::Unavailable(
            "this node has no disk left for another session's workspace; retry later".into(),
        ));
    }
    matches!(
        rustix::io::Errno::from_io_error(e),
        Some(rustix::io::Errno::MFILE | rustix::io::Errno::NFILE)
    )
    .then(|| {
        tracing::error!(error = %e, "out of file descriptors: raise the service's RLIMIT_NOFILE or lower limits.max_cached_sessions");
        EngineError::Unavailable(
            "this node has no file descriptors left for another session; retry later".into(),
        )
    })
}
