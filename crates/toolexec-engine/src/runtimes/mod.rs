//! The sessions live on this node: their runtimes (made on first use, rebuilt from the log or
//! taken over, evicted when idle), session creation and closing (`lifecycle`), and the
//! read-state a runtime is made with (`reads`).
mod lifecycle;
mod reads;
mod session;

pub use lifecycle::MAX_PAGE;
pub use session::SessionRuntime;

use std::sync::{Arc, Weak};
use std::time::Duration;

use toolexec_core::ProblemCode;
use toolexec_core::Session;
use toolexec_tools::{ToolContext, Workspace};
use uuid::Uuid;

use crate::callindex::CallIndex;
use crate::{Engine, EngineError, Result};
use session::RecordedOutputs;

/// Call ids read from the store per query while a runtime's call index is filled: one indexed
/// range, ~0.5 MB of ids at most; a session of a million calls takes a hundred of them.
const CALL_ID_PAGE: u32 = 10_000;

/// Longest pause between two attempts to read a runtime's call ids while the store fails
/// (meanwhile every call of the session asks the store, which is failing too).
const CALL_ID_RETRY_MAX: Duration = Duration::from_secs(5);

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
