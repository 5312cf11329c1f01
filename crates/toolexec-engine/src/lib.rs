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
mod log;
pub mod metrics;
mod pages;
mod reads;
pub mod recorder;
mod replay;
mod scans;
mod session_env;
mod sessions;
mod slots;
mod storable;
mod stream;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use toolexec_core::ProblemCode;
use toolexec_store::{Store, StoreError};
use toolexec_tools::Registry;
use uuid::Uuid;

pub use archive::{ArchiveSlot, ArchiveUpload, MAX_ARCHIVE_FILE_BYTES, Spool};
pub use calls::{CANCEL_WAIT, CallBatch, CancelledCalls, CancelledInvocation, Decision};
pub use canonical::arguments_sha256;
pub use cluster::Route;
pub use config::{ClusterConfig, EngineConfig, Limits};
pub use history::{DEFAULT_TREE_PAGE, FileAt, MAX_ORIGIN_DEPTH, MAX_TREE_PAGE};
pub use log::{DEFAULT_EVENTS_PAGE, MAX_EVENTS_PAGE, MAX_OUTPUT_SLICE, OutputSlice};
pub use pages::{EventsPage, SessionsPage, ShownEvent};
pub use sessions::MAX_PAGE as MAX_SESSIONS_PAGE;
pub use sessions::SessionRuntime;
pub use stream::StreamItem;

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
pub struct Engine {
    store: Arc<dyn Store>,
    registry: Arc<Registry>,
    recorder: recorder::Recorder,
    metrics: Arc<metrics::Metrics>,
    config: EngineConfig,
    /// Per-session state of active sessions on this node (workspace handle, read-state, the
    /// scheduling lock), created on first use.
    runtimes: Mutex<HashMap<Uuid, Arc<SessionRuntime>>>,
    /// Calls running on this node, by (session, call id): a retry of a running call waits here.
    inflight: calls::Inflight,
    /// Batches and cancellable calls running on this node: what a cancel stops.
    cancels: calls::Cancels,
    /// When the engine started: the clock of the runtimes' least-recently-used order.
    started: std::time::Instant,
    /// This node's share of the host's inotify instances and watches (workspace scans).
    inotify: Arc<toolexec_workspace::scan::InotifyPool>,
    /// The node's budget of scan contents held until their calls are recorded.
    contents: Arc<scans::ContentPool>,
    /// The live streams of sessions' logs followed on this node.
    streams: Arc<stream::StreamHub>,
    /// The bounds in bytes of pages and streams, and the excerpts of what is over them.
    pages: Arc<pages::Pages>,
    /// The sessions whose calls this node runs now (their leases in the store).
    leases: Arc<leases::Leases>,
    /// Where this node's session workspaces live, and who owns them.
    workspaces: toolexec_workspace::Workspaces,
    /// States being rebuilt from logs on this node (`limits.max_concurrent_folds`).
    folds: Arc<tokio::sync::Semaphore>,
    /// Each tenant's event streams and replays on this node.
    stream_slots: Arc<slots::TenantSlots>,
    replay_slots: Arc<slots::TenantSlots>,
    /// Each tenant's archive uploads and downloads on this node.
    archive_slots: Arc<slots::TenantSlots>,
    /// Archive uploads under way on this node, all tenants (`limits.max_concurrent_archive_uploads`).
    archive_uploads: Arc<tokio::sync::Semaphore>,
    /// Each tenant's commands running on this node (`limits.max_processes_per_tenant`).
    process_slots: Option<Arc<slots::TenantSlots>>,
    /// Sessions a verify replay is re-running calls in: no other batch may run in them until
    /// it ends.
    replaying: Mutex<std::collections::HashSet<Uuid>>,
    /// The calls waiting for approval whose expiry this node times.
    approval_timers: Mutex<HashMap<Uuid, tokio::task::AbortHandle>>,
    /// This engine, for the tasks it starts on its own (approval timers) without keeping it
    /// alive.
    me: std::sync::OnceLock<std::sync::Weak<Engine>>,
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
        let pages = pages::Pages::new(&config.limits);
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
        let folds = Arc::new(tokio::sync::Semaphore::new(
            config.limits.max_concurrent_folds.max(1),
        ));
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
        let engine = Arc::new(Self {
            store,
            registry,
            recorder,
            metrics,
            config,
            runtimes: Mutex::new(HashMap::new()),
            inflight: calls::Inflight::default(),
            cancels: calls::Cancels::default(),
            started: std::time::Instant::now(),
            inotify,
            contents,
            streams,
            pages,
            leases,
            workspaces,
            folds,
            stream_slots,
            replay_slots,
            process_slots,
            archive_slots,
            archive_uploads: Arc::new(tokio::sync::Semaphore::new(config_uploads)),
            replaying: Mutex::new(std::collections::HashSet::new()),
            approval_timers: Mutex::new(HashMap::new()),
            me: std::sync::OnceLock::new(),
        });
        let _ = engine.me.set(Arc::downgrade(&engine));
        // The calls this node recorded waiting for approval before it stopped: their waits
        // are timed again (those that ended meanwhile are denied now).
        engine
            .arm_pending(toolexec_store::Waiters::Node(&engine.config.node))
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
        let cached = self.runtimes.lock().map_or(0, |m| m.len());
        self.metrics.sessions_cached(cached);
        self.metrics.render()
    }

    pub fn metrics(&self) -> &metrics::Metrics {
        &self.metrics
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Inotify instances and watches the workspace scans of this node hold.
    pub fn inotify(&self) -> &toolexec_workspace::scan::InotifyPool {
        &self.inotify
    }
}
