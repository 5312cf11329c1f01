//! The call pipeline of toolexec, independent of HTTP: sessions and their workspaces, batches of
//! calls (validation, policy, idempotency, scheduling), truncation, and recording through a
//! group-committing [`recorder::Recorder`].
//!
//! The engine decides what runs and what gets recorded; it must not know about HTTP status codes
//! (the API maps [`EngineError`]) nor about SQL (it speaks [`toolexec_store::Store`]).
#![forbid(unsafe_code)]

mod archive;
mod callindex;
mod calls;
mod canonical;
mod cluster;
mod config;
mod deadlines;
mod effects;
pub mod environments;
mod history;
mod leases;
pub mod metrics;
pub mod recorder;
mod runtimes;
mod scans;
mod session_env;
mod slots;
mod storable;
mod stream;

use std::sync::Arc;

use environments::{Progress, PulledEnvironment};
use toolexec_core::history::ArchiveUploaded;
use toolexec_core::{
    CallResult, ForkRequest, Forked, Invocation, NewSession, ProblemCode, Replay, ReplayMode,
    RewindRequest, RewindResult, Session, Tree,
};
use toolexec_store::{Store, StoreError};
use toolexec_tools::Registry;
use uuid::Uuid;

pub use archive::{ArchiveSlot, ArchiveUpload, Archives, MAX_ARCHIVE_FILE_BYTES, Spool};
pub use calls::{
    Approvals, CANCEL_WAIT, CallBatch, Calls, CancelledCalls, CancelledInvocation, Decision,
    SessionRef,
};
pub use canonical::arguments_sha256;
pub use cluster::{Cluster, Route, RoutedLease};
pub use config::{ClusterConfig, EngineConfig, Limits};
pub use history::{DEFAULT_TREE_PAGE, FileAt, History, MAX_ORIGIN_DEPTH, MAX_TREE_PAGE};
pub use runtimes::MAX_PAGE as MAX_SESSIONS_PAGE;
pub use runtimes::{Runtimes, SessionRuntime};
pub use stream::log::{DEFAULT_EVENTS_PAGE, MAX_EVENTS_PAGE, MAX_OUTPUT_SLICE, OutputSlice};
pub use stream::pages::{EventsPage, SessionsPage, ShownEvent};
pub use stream::{StreamItem, Streams};

/// Why the engine could not act on a request. A tool that fails is not an error here: it is a
/// [`toolexec_core::CallResult`] with an error status.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Missing, or owned by another tenant (indistinguishable on purpose).
    #[error("not found")]
    NotFound,
    /// Something within a resource the caller may read is missing (a file in a past state of
    /// its session): a 404 whose detail says what.
    #[error("{0}")]
    Missing(String),
    /// The request conflicts with what is recorded (a call id reused with other arguments, a
    /// closed session).
    #[error("{detail}")]
    Conflict { code: ProblemCode, detail: String },
    /// The request is well-formed JSON but not acceptable (unknown tool in an allow-list, a policy
    /// above the operator's ceiling, an empty batch, …).
    #[error("{detail}")]
    Invalid { code: ProblemCode, detail: String },
    /// A batch outlived the request's time limit; it goes on, and a retry collects its results.
    #[error("still running: {0}")]
    StillRunning(String),
    /// The session's workspace (or the record of a call) is unavailable; the detail is written
    /// for the client. Retry later.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The store failed. Its message is for the log only: the API answers with a generic detail
    /// (503 when it is unreachable, 500 otherwise), never with database text.
    #[error("store: {0}")]
    Store(StoreError),
    /// A bug or an unexpected environment failure. The detail is for logs, not clients.
    #[error("internal: {0}")]
    Internal(String),
}

impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => EngineError::NotFound,
            StoreError::TooManyOpenSessions(max) => EngineError::Conflict {
                code: ProblemCode::TooManyOpenSessions,
                detail: format!(
                    "this tenant already has {max} open sessions, the most this service allows (limits.max_open_sessions_per_tenant); close sessions it no longer needs (DELETE /v1/sessions/{{id}}) and create this one again"
                ),
            },
            other => EngineError::Store(other),
        }
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// The running engine. Cheap to share (`Arc`); one per process.
///
/// A facade: it holds the node's shared services and the engine's parts, and answers the API,
/// mostly by handing a request to the part that owns it. Each part's fields are private to its
/// module; a part reaches another through that part's methods, with the `&Engine` it runs in
/// (docs/design.md, "The engine's parts").
pub struct Engine {
    store: Arc<dyn Store>,
    registry: Arc<Registry>,
    recorder: recorder::Recorder,
    metrics: Arc<metrics::Metrics>,
    config: EngineConfig,
    /// Where this node's session workspaces live, and who owns them.
    workspaces: toolexec_workspace::Workspaces,
    /// This node's share of the host's inotify instances and watches (workspace scans).
    inotify: Arc<toolexec_workspace::scan::InotifyPool>,
    /// The node's budget of scan contents held until their calls are recorded.
    contents: Arc<scans::ContentPool>,
    /// The sessions live on this node: their workspaces, sandboxes, terminals, read-state.
    runtimes: runtimes::Runtimes,
    /// Running, recording and cancelling batches of calls.
    calls: calls::Calls,
    /// The calls waiting for a person's decision.
    approvals: calls::Approvals,
    /// A session's past: folds, tree, files at a seq, fork, rewind, replay.
    history: history::History,
    /// Uploads and downloads of workspace archives.
    archives: archive::Archives,
    /// Reading sessions' logs: pages, events, invocations, live streams.
    streams: stream::Streams,
    /// The leases of the sessions this node runs, forwarding and taking over.
    cluster: cluster::Cluster,
    /// Each tenant's pre-pulls of images under way on this node (`POST /v1/environments`).
    pull_slots: Arc<slots::TenantSlots>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("backend", &self.store.backend())
            .field("node", &self.config.node)
            .finish()
    }
}

impl Engine {
    /// Starts the engine: marks this node's invocations left `running` by a previous process as
    /// `interrupted`, then starts the recorder.
    pub async fn start(
        store: Arc<dyn Store>,
        registry: Arc<Registry>,
        config: EngineConfig,
    ) -> Result<Arc<Self>> {
        let interrupted = store
            .interrupt_running(
                &config.node,
                "The service stopped while this call was running, so its result was not recorded. \
                 Any files it changed are in the session's event log. Check the workspace state \
                 (for example with read_file or list_dir) before retrying with a new call id.",
            )
            .await?;
        if interrupted > 0 {
            tracing::warn!(interrupted, node = %config.node, "marked invocations left running by a previous process as interrupted");
        }
        let owner = config.sandbox.as_ref().and_then(|s| s.workspace_owner());
        let mut workspaces = toolexec_workspace::Workspaces::new(&config.workspace_root, owner)
            .map_err(|e| {
                EngineError::Internal(format!(
                    "cannot create workspace root {}: {e}",
                    config.workspace_root.display()
                ))
            })?;
        if config.limits.session_disk_bytes > 0 {
            // Asked for and not enforceable: the service does not start (fail closed).
            workspaces = workspaces
                .with_disk_quota(config.limits.session_disk_bytes)
                .map_err(|e| EngineError::Internal(format!("limits.session_disk_bytes: {e}")))?;
        }
        let metrics = Arc::new(metrics::Metrics::default());
        let pages = stream::pages::Pages::new(&config.limits);
        let streams = Arc::new(stream::StreamHub::new(
            pages.clone(),
            config.limits.max_streams_per_node,
        ));
        let notify = streams.clone();
        let recorder =
            recorder::Recorder::start(store.clone(), config.recorder_writers, metrics.clone())
                .with_on_commit(Arc::new(move |session| notify.notify(session)));
        let inotify = scans::inotify_pool(&config.limits);
        let contents = scans::ContentPool::new(config.limits.node_content_budget_bytes);
        let ms = std::time::Duration::from_millis;
        let leases = leases::Leases::start(
            store.clone(),
            config.node.clone(),
            config.cluster.advertise_url.clone(),
            leases::LeaseTimes {
                ttl: ms(config.limits.lease_ttl_ms.max(100)),
                linger: ms(config.limits.lease_linger_ms),
                wait: ms(config.limits.lease_wait_ms),
            },
        );
        let stream_slots = slots::TenantSlots::new(
            "event streams open",
            "limits.max_streams_per_tenant",
            config.limits.max_streams_per_tenant,
        );
        let replay_slots = slots::TenantSlots::new(
            "replays running",
            "limits.max_replays_per_tenant",
            config.limits.max_replays_per_tenant,
        );
        let archive_slots = slots::TenantSlots::new(
            "archive transfers under way",
            "limits.max_archive_transfers_per_tenant",
            config.limits.max_archive_transfers_per_tenant.max(1),
        );
        let pull_slots = slots::TenantSlots::new(
            "image pulls under way",
            "limits.max_pulls_per_tenant",
            config.limits.max_pulls_per_tenant.max(1),
        );
        let config_uploads = config.limits.max_concurrent_archive_uploads.max(1);
        let process_slots = (config.limits.max_processes_per_tenant > 0).then(|| {
            slots::TenantSlots::new(
                "commands running",
                "limits.max_processes_per_tenant",
                config.limits.max_processes_per_tenant,
            )
        });
        // Alive before it serves: the other replicas forward to a node they know is there.
        leases.heartbeat().await;
        let cluster = cluster::Cluster::new(
            store.clone(),
            config.node.clone(),
            config.cluster.advertise_url.is_some(),
            leases,
        );
        let engine = Arc::new(Self {
            store: store.clone(),
            registry,
            recorder,
            metrics,
            runtimes: runtimes::Runtimes::new(process_slots),
            calls: calls::Calls::new(),
            approvals: calls::Approvals::new(),
            history: history::History::new(config.limits.max_concurrent_folds.max(1), replay_slots),
            archives: archive::Archives::new(archive_slots, config_uploads, workspaces.clone()),
            streams: stream::Streams::new(store.clone(), streams, stream_slots, pages),
            cluster,
            pull_slots,
            config,
            workspaces,
            inotify,
            contents,
        });
        engine.approvals.wire(&engine);
        // The calls this node recorded waiting for approval before it stopped: their waits
        // are timed again (those that ended meanwhile are denied now).
        engine
            .approvals
            .arm_pending(&engine, toolexec_store::Waiters::Node(&engine.config.node))
            .await;
        Ok(engine)
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Why this service cannot run tool `name` (see [`toolexec_tools::Tool::unavailable`]).
    pub fn unavailable(&self, name: &str) -> Option<String> {
        self.registry.get(name)?.unavailable(&self.config.web)
    }

    /// The metrics as Prometheus text, with the gauges read now.
    pub fn render_metrics(&self) -> String {
        let cached = self.runtimes.cached_count();
        self.metrics.sessions_cached(cached);
        self.metrics.render()
    }

    pub fn metrics(&self) -> &metrics::Metrics {
        &self.metrics
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Where this node stands among the replicas: routing, forwarding, draining, leaving.
    pub fn cluster(&self) -> &cluster::Cluster {
        &self.cluster
    }

    /// The reading side of sessions' logs: pages, events, invocations, live streams.
    pub fn streams(&self) -> &stream::Streams {
        &self.streams
    }

    /// Uploads and downloads of workspace archives: each tenant's slots, the spools.
    pub fn archives(&self) -> &archive::Archives {
        &self.archives
    }

    /// Runs a batch of calls for a session and returns one result per call, in request order.
    ///
    /// The batch runs in a task of its own: if this future is dropped (the client went away),
    /// no call is cut in half. The call running then finishes and is recorded, and the calls
    /// that had not started are recorded `cancelled` without running (see `cancel`).
    pub async fn run_calls(
        self: &Arc<Self>,
        session: SessionRef,
        batch: CallBatch,
    ) -> Result<Vec<CallResult>> {
        self.calls.run_calls(self, session, batch).await
    }

    /// Creates a session: its workspace with the seed files, then the session row and its first
    /// events (`session.created`, one `file.created` per seed file) in one transaction.
    pub async fn create_session(&self, tenant_id: Uuid, new: NewSession) -> Result<Session> {
        self.runtimes.create_session(self, tenant_id, new).await
    }

    pub async fn get_session(&self, tenant_id: Uuid, id: Uuid) -> Result<Session> {
        self.runtimes.get_session(self, tenant_id, id).await
    }

    /// The session as this node runs it: see [`Runtimes::session_in_use`].
    pub async fn session_in_use(&self, tenant_id: Uuid, id: Uuid) -> Result<Session> {
        self.runtimes.session_in_use(self, tenant_id, id).await
    }

    /// Closes a session: stops its background processes, records `session.closed` (with how
    /// each process ended), then removes its workspace. The log stays.
    pub async fn close_session(&self, tenant_id: Uuid, id: Uuid) -> Result<Session> {
        self.runtimes.close_session(self, tenant_id, id).await
    }

    /// A session's todos as its log folds them (plan steps and tasks).
    pub async fn todos_of(
        &self,
        tenant_id: &Uuid,
        session_id: Uuid,
    ) -> Result<toolexec_core::todo::Todos> {
        self.runtimes.todos_of(self, tenant_id, session_id).await
    }

    /// A `pending_approval` result once its call is decided and has ended, waiting up to
    /// `wait` (for doors whose clients cannot be answered "later", such as MCP's `tools/call`);
    /// any other result as it is. Still undecided after `wait` (or the wait cannot be
    /// followed): the pending result.
    pub async fn after_approval(
        &self,
        tenant_id: Uuid,
        result: CallResult,
        wait: std::time::Duration,
    ) -> CallResult {
        self.approvals
            .after_approval(self, tenant_id, result, wait)
            .await
    }

    /// Decides a waiting call (`POST /v1/invocations/{id}/approve|deny`, or its expiry) and
    /// returns the invocation as it is then. An approved call starts running on this node
    /// before this returns; wait for its end with [`Streams::wait_invocation`].
    ///
    /// For an approval, the session is made this node's (its lease held, a take-over done)
    /// and the call registered as cancellable before the decision is recorded: what a
    /// take-over interrupts is never the call just approved, and a cancel from the moment it
    /// is approved reaches it.
    pub async fn decide(
        self: &Arc<Self>,
        tenant_id: Uuid,
        invocation_id: Uuid,
        decision: Decision,
    ) -> Result<Invocation> {
        self.approvals
            .decide(self, tenant_id, invocation_id, decision)
            .await
    }

    /// Cancels one invocation of this tenant. A finished one is returned as it is (a cancel
    /// changes nothing then, so repeating it is harmless); a running one is stopped and returned
    /// once recorded. Errors: not found (also another tenant's), or running on another node.
    pub async fn cancel_invocation(
        &self,
        tenant_id: Uuid,
        id: Uuid,
    ) -> Result<CancelledInvocation> {
        self.calls.cancel_invocation(self, tenant_id, id).await
    }

    /// Cancels every pending call of a session on this node: running calls are stopped, queued
    /// ones never start; all are recorded. Returns what the stopped calls ended with. A session
    /// with nothing pending (or closed) gives an empty report. Error: not found.
    pub async fn cancel_session_calls(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
    ) -> Result<CancelledCalls> {
        self.calls
            .cancel_session_calls(self, tenant_id, session_id)
            .await
    }

    /// Waits until no batch runs on this node. A batch outlives the request that sent it, so a
    /// service shutting down waits here, after its last request, for batches whose clients went
    /// away: their running call is recorded as it ended, not left to be marked `interrupted`.
    pub async fn wait_for_batches(&self) {
        self.calls.wait_for_batches().await;
    }

    /// Starts pulling an image into this node's cache ahead of the sessions that will run in
    /// it (`POST /v1/environments`), reporting the download's progress; the pull's end.
    ///
    /// The pull takes one of `tenant`'s slots (`limits.max_pulls_per_tenant`; when it holds
    /// them all, 429 `too_many_concurrent` at once, nothing started) and runs in a task of its
    /// own, which holds the slot until the pull ends: dropping the returned handle (the client
    /// went away) neither cancels the pull nor gives the slot back. A pull may be shared with
    /// sessions waiting on the same digest, and what it downloaded is kept for the next one;
    /// the tenant's slots bound what it leaves running, `limits.image_pull_timeout_ms` how long.
    pub fn start_pull(
        self: &Arc<Self>,
        tenant: Uuid,
        asked: String,
        progress: impl Fn(Progress) + Send + Sync + 'static,
    ) -> Result<tokio::task::JoinHandle<Result<PulledEnvironment>>> {
        let slot = self.pull_slots.take(tenant)?;
        let engine = self.clone();
        Ok(tokio::spawn(async move {
            let _slot = slot;
            engine
                .runtimes
                .pull_environment(&engine, &asked, progress)
                .await
        }))
    }

    /// Unpacks the spooled archive into the session's workspace and records what it changed
    /// (see the module's documentation).
    pub async fn upload_archive(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        spool: Spool,
    ) -> Result<ArchiveUploaded> {
        self.archives
            .upload_archive(self, tenant_id, session_id, spool)
            .await
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
        self.archives
            .archive_at(self, tenant_id, session_id, at, allow_partial)
            .await
    }

    /// One page of the workspace of a session as it was right after `at`.
    pub async fn tree(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        at: Option<i64>,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<Tree> {
        self.history
            .tree(self, tenant_id, session_id, at, cursor, limit)
            .await
    }

    /// One file (or symlink) of a session's workspace as it was right after `at`.
    pub async fn file_at(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        at: Option<i64>,
        path: &[u8],
    ) -> Result<FileAt> {
        self.history
            .file_at(self, tenant_id, session_id, at, path)
            .await
    }

    /// A new session of the same tenant whose workspace starts as `source_id`'s was right after
    /// `at_seq` (see [`ForkRequest`]).
    pub async fn fork(&self, tenant_id: Uuid, source_id: Uuid, req: ForkRequest) -> Result<Forked> {
        self.history.fork(self, tenant_id, source_id, req).await
    }

    /// Puts the live workspace of an active session back to its state right after `to_seq`
    /// (see [`RewindRequest`]), and records that as a `workspace.rewound` event followed by a
    /// `file.*` event per change. Waits for the session's calls in flight on this node.
    pub async fn rewind(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        req: RewindRequest,
    ) -> Result<RewindResult> {
        self.history.rewind(self, tenant_id, session_id, req).await
    }

    /// Starts a verify replay of a session of this tenant, waits for it up to the request
    /// limit, and returns its report as it is then (`running` if it goes on).
    pub async fn replay(
        self: &Arc<Self>,
        tenant_id: Uuid,
        source_id: Uuid,
        mode: ReplayMode,
    ) -> Result<Replay> {
        self.history.replay(self, tenant_id, source_id, mode).await
    }

    pub async fn get_replay(&self, tenant_id: Uuid, id: Uuid) -> Result<Replay> {
        self.history.get_replay(self, tenant_id, id).await
    }

    /// Inotify instances and watches the workspace scans of this node hold.
    pub fn inotify(&self) -> &toolexec_workspace::scan::InotifyPool {
        &self.inotify
    }
}
