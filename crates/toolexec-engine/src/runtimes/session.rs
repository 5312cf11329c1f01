//! What a node keeps for one session it serves: [`SessionRuntime`].
use std::sync::Arc;

use toolexec_core::Session;
use toolexec_sandbox::{ProcessTable, Sandbox};
use toolexec_store::CallKey;
use toolexec_tools::{OutputSource, ReadTracker, Workspace};
use toolexec_workspace::scan::{InotifyPool, ScanBudget, Snapshot};
use uuid::Uuid;

use crate::callindex::{CallIndex, Seen};
use crate::{EngineError, Result};

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
    pub(super) last_used: std::sync::atomic::AtomicU64,
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
pub(super) struct RecordedOutputs {
    pub(super) store: Arc<dyn toolexec_store::Store>,
    pub(super) tenant_id: Uuid,
    /// Process ids the log can hold for processes this node does not know: `p1` up to the id
    /// before the runtime's first (see [`SessionRuntime::first_process_id`]).
    pub(super) first_process_id: u64,
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

impl SessionRuntime {
    /// `first_process_id`: above every process id the session's log holds (see
    /// [`toolexec_store::Events::last_process_number`]), so that an id never repeats within a
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

    pub(super) fn touch(&self, now_ms: u64) {
        self.last_used
            .store(now_ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether nothing but the cache holds it and nothing of it runs: it can be dropped and
    /// rebuilt later (its read-state folded from the log again).
    pub(super) fn is_idle(self: &Arc<Self>) -> bool {
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
