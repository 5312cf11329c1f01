//! The recording store: tenants, API keys, sessions, invocations, the append-only event log and
//! content-addressed blobs.
//!
//! One [`Store`] trait with two backends: [`postgres::PgStore`] (production) and
//! [`sqlite::SqliteStore`] (the zero-configuration default). Both pass the same test suite.
//!
//! The store owns `seq`: every write that appends events assigns the next numbers of the session
//! inside the transaction that inserts them, under a lock on the session row, so a session's log
//! is gapless and ordered no matter how many writers (tasks or replicas) there are. It does not
//! decide *when* to write: batching (group commit) is the caller's job, see [`Store::commit`].
#![forbid(unsafe_code)]

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use toolexec_core::{
    CallStatus, Capability, Event, EventKind, Invocation, Session, Tenant, Truncation,
};
use uuid::Uuid;

mod migrations;
mod plan;
pub mod postgres;
mod rows;
pub mod sqlite;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No such row — or a row that belongs to another tenant, which callers must not tell apart.
    #[error("not found")]
    NotFound,
    /// The database cannot be reached or failed; the request may be retried later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A migration failed or the schema is not what this binary expects.
    #[error("migration failed: {0}")]
    Migration(String),
    /// Data in the store that this binary cannot read (a bug or a manual edit).
    #[error("corrupt row: {0}")]
    Corrupt(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::RowNotFound => StoreError::NotFound,
            sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
                StoreError::Corrupt(e.to_string())
            }
            other => StoreError::Unavailable(other.to_string()),
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The most side-effect events one read of an invocation returns (and the default page).
pub const SIDE_EFFECTS_PAGE: u32 = 1_000;

/// Content-addressed bytes. Inserting a blob that exists is a no-op.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// `toolexec_core::sha256_hex(&bytes)`.
    pub sha256: String,
    pub bytes: Vec<u8>,
}

impl Blob {
    pub fn new(bytes: Vec<u8>) -> Self {
        Self {
            sha256: toolexec_core::sha256_hex(&bytes),
            bytes,
        }
    }
}

/// An event to append; the store assigns `seq` and `created_at`.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub kind: EventKind,
    pub data: serde_json::Value,
}

/// The start of an invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct NewInvocation {
    pub id: Uuid,
    pub session_id: Uuid,
    pub call_id: String,
    pub name: String,
    pub arguments: serde_json::Value,
    /// SHA-256 of the canonical JSON of `arguments`: same id + other arguments is a conflict.
    pub arguments_sha256: String,
    pub read_only: bool,
    pub capabilities: Vec<Capability>,
    /// Which service instance runs it; at start-up an instance interrupts only its own.
    pub node: String,
    pub started_at: DateTime<Utc>,
}

/// How an invocation ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: CallStatus,
    /// What the model is shown (already truncated).
    pub content: String,
    pub truncated: Option<Truncation>,
    pub output_chars: i64,
    /// The blob holding the full output, when `content` is truncated.
    pub output_sha256: Option<String>,
    pub finished_at: DateTime<Utc>,
    pub duration_ms: f64,
}

/// One unit of a group commit. Every write of a batch is applied in one transaction, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// Insert a running invocation and append its `invocation.started` event.
    Start { invocation: NewInvocation },
    /// Finish a running invocation: append its side-effect events, then `invocation.finished`.
    Finish {
        session_id: Uuid,
        invocation_id: Uuid,
        outcome: Outcome,
        side_effects: Vec<NewEvent>,
        blobs: Vec<Blob>,
    },
    /// Start and finish at once: `invocation.started`, side effects, `invocation.finished`.
    Record {
        invocation: NewInvocation,
        outcome: Outcome,
        side_effects: Vec<NewEvent>,
        blobs: Vec<Blob>,
    },
}

impl Write {
    pub fn session_id(&self) -> Uuid {
        match self {
            Write::Start { invocation } | Write::Record { invocation, .. } => invocation.session_id,
            Write::Finish { session_id, .. } => *session_id,
        }
    }
}

/// The seqs a write was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assigned {
    /// `invocation.started` (for `Finish`: the one recorded earlier).
    pub started_seq: i64,
    /// `invocation.finished`; `None` for `Start`.
    pub finished_seq: Option<i64>,
}

/// Why one write of a batch was not applied. The other writes of the batch are unaffected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// Start/Record: the session already has an invocation with this call id.
    #[error("call id already recorded as invocation {0}")]
    DuplicateCall(Uuid),
    /// Start/Record: the session is closed or does not exist.
    #[error("session is not active")]
    SessionNotActive,
    /// Finish: the invocation does not exist or is not running.
    #[error("invocation is not running")]
    NotRunning,
}

/// What identifies a recorded call: enough to tell a retry from a reuse of the id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallKey {
    pub call_id: String,
    pub name: String,
    pub arguments_sha256: String,
    pub invocation_id: Uuid,
}

/// A page of sessions, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionPage {
    pub sessions: Vec<Session>,
    /// Pass as `before` to get the next (older) page; `None` on the last page.
    pub next_before: Option<Uuid>,
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `"postgres"` or `"sqlite"`.
    fn backend(&self) -> &'static str;

    /// Applies the embedded migrations of this backend.
    async fn migrate(&self) -> Result<()>;

    /// A cheap round trip, for readiness.
    async fn ping(&self) -> Result<()>;

    // --- tenants and keys ---

    /// Returns the tenant with this name, creating it if needed.
    async fn ensure_tenant(&self, name: &str) -> Result<Tenant>;
    /// Stores an API key by its hash; `prefix` is a short non-secret part for humans.
    async fn create_api_key(&self, tenant_id: Uuid, key_sha256: &str, prefix: &str) -> Result<()>;
    /// The tenant of a (non-revoked) key, by the key's hash.
    async fn tenant_for_key(&self, key_sha256: &str) -> Result<Option<Tenant>>;
    async fn has_api_keys(&self) -> Result<bool>;

    // --- sessions ---

    /// Inserts an active session (its `last_seq` is ignored) and appends `events` as seq 1, 2, …
    /// with `blobs`, in one transaction. Returns the session as stored.
    async fn create_session(
        &self,
        session: &Session,
        events: Vec<NewEvent>,
        blobs: Vec<Blob>,
    ) -> Result<Session>;
    /// `NotFound` for a missing session or another tenant's.
    async fn get_session(&self, tenant_id: Uuid, id: Uuid) -> Result<Session>;
    /// Newest first; `before` is the `next_before` of the previous page.
    async fn list_sessions(
        &self,
        tenant_id: Uuid,
        before: Option<Uuid>,
        limit: u32,
    ) -> Result<SessionPage>;
    /// Marks the session closed and appends `session.closed` with `data`. Closing a closed session
    /// changes nothing and returns it as it is.
    async fn close_session(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        data: serde_json::Value,
    ) -> Result<Session>;

    // --- calls ---

    /// The session (tenant-checked: `NotFound` otherwise) and the invocations it already has for
    /// any of `call_ids`, in one round trip where the backend allows.
    async fn lookup_calls(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        call_ids: &[String],
    ) -> Result<(Session, Vec<Invocation>)>;

    /// Every call id recorded in a session, for the node that serves it to answer "already
    /// recorded?" from memory.
    async fn call_index(&self, session_id: Uuid) -> Result<Vec<CallKey>>;

    /// Applies a batch of writes in one transaction (group commit). The outer error means nothing
    /// was written (store down); otherwise there is one result per write, in order.
    async fn commit(
        &self,
        batch: Vec<Write>,
    ) -> Result<Vec<std::result::Result<Assigned, WriteError>>>;

    /// Marks every invocation still `running` on `node` as `interrupted` and appends their
    /// `invocation.finished` events. Returns how many there were.
    async fn interrupt_running(&self, node: &str, content: &str) -> Result<u64>;

    // --- reads ---

    /// Events with `seq > after`, in order, at most `limit`.
    async fn events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Event>>;
    /// One invocation with a page of its side-effect events: those with `seq > after`, in log
    /// order, at most `limit` (0: none), with `side_effects_total` and, when more follow,
    /// `side_effects_next_after`. A call can have hundreds of thousands of side effects; one
    /// read of them all would be one unbounded document.
    async fn invocation_page(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Invocation>;
    /// One invocation with the first [`SIDE_EFFECTS_PAGE`] of its side-effect events.
    async fn invocation(&self, tenant_id: Uuid, id: Uuid) -> Result<Invocation> {
        self.invocation_page(tenant_id, id, 0, SIDE_EFFECTS_PAGE)
            .await
    }
    /// The full output of an invocation: the output blob, or its content when not truncated.
    async fn invocation_output(&self, tenant_id: Uuid, id: Uuid) -> Result<String>;
    async fn blob(&self, sha256: &str) -> Result<Option<Vec<u8>>>;
}
