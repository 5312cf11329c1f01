//! The recording store: tenants, API keys, sessions, invocations, the append-only event log and
//! content-addressed blobs.
//!
//! One [`Store`] trait with two backends: [`postgres::PgStore`] (production) and
//! [`sqlite::SqliteStore`] (the zero-configuration default). Both pass the same test suite.
//!
//! The store owns `seq`: every write that appends events assigns the next numbers of the session
//! inside the transaction that inserts them, under a lock on the session row, so a session's log
//! is gapless and ordered no matter how many writers (tasks or replicas) there are. It does not
//! decide *when* to write: batching (group commit) is the caller's job, see [`Calls::commit`].
//!
//! It also says what it can hold ([`Write::unstorable`], [`mod@check`]) and which of its failures
//! are worth retrying ([`StoreError::Unavailable`]) and which are not ([`StoreError::Refused`]),
//! so that a caller never retries forever what the database will refuse forever.
#![forbid(unsafe_code)]

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use toolexec_core::{
    CallStatus, Capability, Event, EventKind, Invocation, Session, Tenant, Truncation,
};
use uuid::Uuid;

pub mod check;
mod migrations;
pub mod objects;
pub mod pages;
mod plan;
pub mod postgres;
pub mod reads;
pub mod retention;
mod rows;
mod sql;
pub mod sqlite;

/// The store's traits, for calling their methods on a concrete store (`PgStore`,
/// `SqliteStore`, a wrapper): `use toolexec_store::prelude::*;`. They come in unnamed, so they
/// clash with no name of the caller's. Methods called on `dyn Store` need no import.
pub mod prelude {
    pub use crate::{
        Approvals as _, Blobs as _, Calls as _, Events as _, History as _, Leases as _, Nodes as _,
        Retention as _, Sessions as _, Store, Tenants as _,
    };
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No such row — or a row that belongs to another tenant, which callers must not tell apart.
    #[error("not found")]
    NotFound,
    /// The database cannot be reached or failed; the request may be retried later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The database refused what it was given and would refuse it again: a value it cannot hold
    /// or a rule of the schema. Retrying the same statement cannot succeed.
    #[error("refused by the store: {reason} ({cause})")]
    Refused {
        /// In plain words, for the model and the client (no database internals).
        reason: String,
        /// The database's own message, for the log.
        cause: String,
    },
    /// `create_session`: the tenant already has as many open sessions as it may.
    #[error("the tenant already has {0} open sessions")]
    TooManyOpenSessions(u64),
    /// A migration failed or the schema is not what this binary expects.
    #[error("migration failed: {0}")]
    Migration(String),
    /// Data in the store that this binary cannot read (a bug or a manual edit).
    #[error("corrupt row: {0}")]
    Corrupt(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        check::classify(e)
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The most side-effect events one read of an invocation returns (and the default page).
pub const SIDE_EFFECTS_PAGE: u32 = 1_000;

/// Content-addressed bytes. Inserting a blob that exists is a no-op. Cloning is cheap (the bytes
/// are shared), so a write that must be retried does not copy its contents again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// `toolexec_core::sha256_hex(&bytes)`.
    pub sha256: String,
    pub bytes: Bytes,
}

impl Blob {
    /// Takes `Vec<u8>` (no copy), `Bytes`, `&'static [u8]`, …
    pub fn new(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        Self {
            sha256: toolexec_core::sha256_hex(&bytes),
            bytes,
        }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
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
    /// The files the call read (and wrote), in the order it did, for read-before-write: the
    /// `reads` of its `invocation.finished` event (left out when empty).
    pub reads: Vec<toolexec_core::FileRead>,
    /// The tool's machine-readable result (`ToolOutput::structured`, bounded by the tool): the
    /// `structured` of its `invocation.finished` event (left out when `None`), so that a retry
    /// answered from the record renders exactly what the first answer did.
    pub structured: Option<serde_json::Value>,
}

/// One event a session's read-state is folded from ([`Events::read_records`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadRecord {
    /// The `reads` of an `invocation.finished` event, in the order the call made them.
    Reads {
        seq: i64,
        reads: Vec<toolexec_core::FileRead>,
    },
    /// A `workspace.rewound` event: what was read after `to_seq` no longer counts.
    Rewound { seq: i64, to_seq: i64 },
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
    /// Start and finish at once: `invocation.started`, side effects, `invocation.finished` — or,
    /// for a read-only call with no side effect, its `invocation.finished` alone, carrying the
    /// start's fields, with `started_seq == finished_seq` (SPEC §6: one event per read).
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

    /// What kind of write this is, as named in traces: `start`, `finish` or `record`.
    pub fn kind(&self) -> &'static str {
        match self {
            Write::Start { .. } => "start",
            Write::Finish { .. } => "finish",
            Write::Record { .. } => "record",
        }
    }

    /// The blobs this write carries (none for a `Start`).
    pub fn blobs(&self) -> &[Blob] {
        match self {
            Write::Start { .. } => &[],
            Write::Finish { blobs, .. } | Write::Record { blobs, .. } => blobs,
        }
    }

    /// Takes the blobs out of this write (to store them on their own, before it).
    pub fn take_blobs(&mut self) -> Vec<Blob> {
        match self {
            Write::Start { .. } => Vec::new(),
            Write::Finish { blobs, .. } | Write::Record { blobs, .. } => std::mem::take(blobs),
        }
    }

    /// Bytes of blob contents this write carries.
    pub fn blob_bytes(&self) -> usize {
        self.blobs().iter().map(Blob::len).sum()
    }
}

/// When the blobs of `batch` together exceed `bound` bytes: the batch without its blobs, and the
/// blobs, to be written first in bounded statements of their own ([`Blobs::put_blobs`]).
pub(crate) fn blobs_beyond(batch: &[Write], bound: usize) -> Option<(Vec<Write>, Vec<Blob>)> {
    if batch.iter().map(Write::blob_bytes).sum::<usize>() <= bound {
        return None;
    }
    let mut rest = batch.to_vec();
    let blobs = rest.iter_mut().flat_map(Write::take_blobs).collect();
    Some((rest, blobs))
}

/// The seqs a write was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assigned {
    /// `invocation.started` (for `Finish`: the one recorded earlier); for a read recorded in
    /// one event, that event's seq (the same as `finished_seq`).
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
    /// An approval decision: the invocation is not waiting for one (it was decided before,
    /// with this status now).
    #[error("invocation is not waiting for approval (it is {})", .0.as_str())]
    NotPending(toolexec_core::InvocationStatus),
    /// An approval after the call's wait ended (it must be denied as expired instead).
    #[error("the call's wait for approval ended at {0}")]
    WaitEnded(DateTime<Utc>),
    /// A call asking for approval in a session where this many calls wait already.
    #[error("{0} calls of this session wait for approval already")]
    TooManyWaiting(u64),
    /// The store cannot hold this write (said in plain words): writing it again cannot succeed.
    /// Found before committing ([`Write::unstorable`]) or by the database itself.
    #[error("the store cannot record it: {0}")]
    Refused(String),
}

/// What [`Approvals::decide_approval`] recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decided {
    pub session_id: Uuid,
    /// The `approval.decided` event.
    pub decided_seq: i64,
    /// Approved: its `invocation.started`; denied: its `invocation.finished`.
    pub next_seq: i64,
}

/// Whose waiting calls [`Approvals::pending_approvals`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiters<'a> {
    /// Those a node recorded.
    Node(&'a str),
    /// Those of a session.
    Session(Uuid),
}

/// A call waiting for approval, as [`Approvals::pending_approvals`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingApproval {
    pub tenant_id: Uuid,
    pub session_id: Uuid,
    pub invocation_id: Uuid,
    /// When its wait ends (from its `approval.requested` event); `None` if that cannot be read.
    pub expires_at: Option<DateTime<Utc>>,
}

/// What identifies a recorded call: enough to tell a retry from a reuse of the id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallKey {
    pub call_id: String,
    pub name: String,
    pub arguments_sha256: String,
    pub invocation_id: Uuid,
}

/// What [`Leases::acquire_lease`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lease {
    /// The node holds the lease now. `previous` is the node that held it last, when another
    /// one did (or `None`: it was this node's, or never anyone's): a node that takes a session
    /// over from another must not trust what it remembered of it.
    Held { previous: Option<String> },
    /// Another node holds it, until it releases it or it expires.
    Busy { holder: String },
}

/// Where a session lives ([`Nodes::session_owner`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOwner {
    /// The node that last held the session's lease (and has its workspace).
    pub node: String,
    /// Where the other nodes reach it; `None`: it takes no forwarded requests (or is gone).
    pub address: Option<String>,
    /// Its heartbeat is recent (within the TTL asked for).
    pub alive: bool,
    /// It is shutting down and handing its sessions over.
    pub draining: bool,
}

/// A page of sessions, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionPage {
    /// Whole, or (over the page's bound) by id and size.
    pub sessions: Vec<pages::Listed>,
    /// Pass as `before` to get the next (older) page; `None` on the last page.
    pub next_before: Option<Uuid>,
}

/// A session as retention sees it ([`Retention::retention_sessions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionSession {
    pub id: Uuid,
    /// When it was closed; `None` while it is active.
    pub closed_at: Option<DateTime<Utc>>,
    /// The session it was forked or replayed from: its log starts from that one's.
    pub origin: Option<Uuid>,
}

/// Rows [`Retention::delete_sessions`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deleted {
    pub sessions: u64,
    pub events: u64,
    pub invocations: u64,
    pub replays: u64,
}

/// A blob named by an invocation row (its full output), for retention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRef {
    pub invocation_id: Uuid,
    pub session_id: Uuid,
    pub sha256: String,
}

/// The recording store, in groups of methods: [`Tenants`], [`Sessions`], [`Calls`], [`Events`],
/// [`Blobs`], [`History`], [`Approvals`], [`Leases`], [`Nodes`] and [`Retention`]. A backend
/// implements each group; callers hold an `Arc<dyn Store>`, on which every group's methods are
/// callable without importing it (on a concrete store, `use toolexec_store::prelude::*`).
#[async_trait]
pub trait Store:
    Tenants
    + Sessions
    + Calls
    + Events
    + Blobs
    + History
    + Approvals
    + Leases
    + Nodes
    + Retention
    + Send
    + Sync
    + 'static
{
    /// `"postgres"` or `"sqlite"`.
    fn backend(&self) -> &'static str;

    /// Applies the embedded migrations of this backend.
    async fn migrate(&self) -> Result<()>;

    /// A cheap round trip, for readiness.
    async fn ping(&self) -> Result<()>;
}

/// Tenants and their API keys (stored by hash).
#[async_trait]
pub trait Tenants: Send + Sync {
    /// Returns the tenant with this name, creating it if needed.
    async fn ensure_tenant(&self, name: &str) -> Result<Tenant>;

    /// Stores an API key by its hash; `prefix` is a short non-secret part for humans.
    async fn create_api_key(&self, tenant_id: Uuid, key_sha256: &str, prefix: &str) -> Result<()>;

    /// The tenant of a (non-revoked) key, by the key's hash.
    async fn tenant_for_key(&self, key_sha256: &str) -> Result<Option<Tenant>>;

    async fn has_api_keys(&self) -> Result<bool>;
}

/// Sessions: created with their first events, read whole or in excerpts, listed a page at a
/// time, closed.
#[async_trait]
pub trait Sessions: Send + Sync {
    /// Inserts an active session (its `last_seq` is ignored) and appends `events` as seq 1, 2, …
    /// with `blobs`, in one transaction. Returns the session as stored.
    ///
    /// Refused with [`StoreError::TooManyOpenSessions`] when the tenant already has
    /// `max_open_sessions` active sessions; the count and the insert are one transaction,
    /// serialized per tenant, so concurrent creates cannot overshoot.
    async fn create_session(
        &self,
        session: &Session,
        events: Vec<NewEvent>,
        blobs: Vec<Blob>,
        max_open_sessions: u64,
    ) -> Result<Session>;

    /// `NotFound` for a missing session or another tenant's.
    async fn get_session(&self, tenant_id: Uuid, id: Uuid) -> Result<Session>;

    /// Newest first; `before` is the `next_before` of the previous page. At most `limit`
    /// sessions, within `bounds` (the JSON text of their `tools`, `policy`, `env` and
    /// `metadata`, see [`pages`]): a session over `bounds.inline_bytes` comes by id and size
    /// (read what a page shows of it with [`Sessions::session_excerpt`]).
    async fn list_sessions(
        &self,
        tenant_id: Uuid,
        before: Option<Uuid>,
        limit: u32,
        bounds: pages::ByteBounds,
    ) -> Result<SessionPage>;

    /// A session of this tenant with its `tools`, `env` and `metadata` read from the first
    /// `chars` characters of their JSON texts (closed: [`toolexec_core::excerpt::close_prefix`]);
    /// `NotFound` otherwise.
    async fn session_excerpt(&self, tenant_id: Uuid, id: Uuid, chars: u32) -> Result<Session>;

    /// Marks the session closed and appends `session.closed` with `data`. Closing a closed session
    /// changes nothing and returns it as it is.
    async fn close_session(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        data: serde_json::Value,
    ) -> Result<Session>;
}

/// Calls: the group commit that records them ([`Calls::commit`]), the lookups that tell a retry
/// from a new call, an invocation read back, and the calls left running marked interrupted.
#[async_trait]
pub trait Calls: Send + Sync {
    /// The session (tenant-checked: `NotFound` otherwise) and the invocations it already has for
    /// any of `call_ids`, in one round trip where the backend allows.
    async fn lookup_calls(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        call_ids: &[String],
    ) -> Result<(Session, Vec<Invocation>)>;

    /// A page of the call ids recorded in a session: those after `after` in the order of the
    /// `(session_id, call_id)` index (`""`: from the first), at most `limit`. The node serving
    /// the session reads them all once, page by page, into its call index; each page is one
    /// range of that index, so a page costs the same whatever the session's length.
    async fn call_ids(&self, session_id: Uuid, after: &str, limit: u32) -> Result<Vec<String>>;

    /// The arguments of the session's latest call of the tool `name` (by start) that ran or
    /// runs — not one refused before it ran (invalid arguments, an unknown tool, denied) or
    /// waiting for approval — if it has one: how a rebuilt runtime learns that the session had
    /// a persistent shell, which did not survive. Reads the session's entries of the
    /// `(session_id, call_id)` index; asked once per runtime a node builds for the session.
    async fn last_call_arguments(
        &self,
        session_id: Uuid,
        name: &str,
    ) -> Result<Option<serde_json::Value>>;

    /// Applies a batch of writes in one transaction (group commit). The outer error means nothing
    /// was written: [`StoreError::Unavailable`] (store down; the same batch may succeed later) or
    /// [`StoreError::Refused`] (something in the batch cannot be stored: the caller retries the
    /// writes apart to find which). Otherwise there is one result per write, in order. Borrowed,
    /// so that the caller still has the writes to retry.
    ///
    /// The blobs of one statement are bounded ([`Blobs::blob_statement_bytes`]): a batch carrying
    /// more has them written first, in statements of their own (see [`Blobs::put_blobs`]).
    async fn commit(
        &self,
        batch: &[Write],
    ) -> Result<Vec<std::result::Result<Assigned, WriteError>>>;

    /// What a write needs done before it joins a group commit, done in the caller's task so
    /// that no other session's commit waits for it. The database backends need nothing; with
    /// blobs in object storage ([`objects::ObjectBlobs`]) a write that starts a call is refused
    /// ([`StoreError::Unavailable`]) while the object store cannot be reached, and the blobs
    /// above the inline bound are uploaded and taken out of the write. On an error the write
    /// is as it was.
    async fn prepare(&self, write: &mut Write) -> Result<()> {
        let _ = write;
        Ok(())
    }

    /// Marks every invocation still `running` on `node` as `interrupted` and appends their
    /// `invocation.finished` events. Returns how many there were.
    async fn interrupt_running(&self, node: &str, content: &str) -> Result<u64>;

    /// Marks every invocation of one session still `running` as `interrupted` (a node took the
    /// session over from one that is gone) and appends their `invocation.finished` events.
    async fn interrupt_session(&self, session_id: Uuid, content: &str) -> Result<u64>;

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
}

/// Reading a session's append-only log: pages by count or by bytes, and the probes of partial
/// indexes that loading a session needs (its processes, todos, read-state, what a rebuild of
/// its workspace replays).
#[async_trait]
pub trait Events: Send + Sync {
    /// Events with `seq > after`, in order, at most `limit`.
    async fn events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Event>>;

    /// Events with `seq > after`, in order, at most `limit`, within `bounds` (the JSON text of
    /// their data, see [`pages`]): an event over `bounds.inline_bytes` comes without its data
    /// (read its beginning with [`Events::event_text`]). `NotFound` for a session that is not
    /// this tenant's.
    async fn event_texts(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
        bounds: pages::ByteBounds,
    ) -> Result<pages::EventTexts>;

    /// One event of a session of this tenant, its data whole or (`chars`) the first characters
    /// of its JSON text; `None` when the session has no such seq, `NotFound` for a session that
    /// is not this tenant's.
    async fn event_text(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        seq: i64,
        chars: Option<u32>,
    ) -> Result<Option<pages::EventText>>;

    /// The events of one of `kinds` with `after < seq <= up_to`, in order, at most `limit`:
    /// what a rebuild of the workspace reads, without the invocations' outputs.
    #[allow(clippy::too_many_arguments)]
    async fn events_of_kinds(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        kinds: &[EventKind],
        after: i64,
        up_to: i64,
        limit: u32,
    ) -> Result<Vec<Event>>;

    /// The session's `todo.*` events with `seq > after`, in order, at most `limit`: one probe
    /// of a partial index, whatever the length of the log (what loading a session folds its
    /// plan and tasks from).
    async fn todo_events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Event>>;

    /// The events a session's read-state is folded from, newest first, with `seq <= up_to`:
    /// the `reads` of its `invocation.finished` events that have any, and its
    /// `workspace.rewound` events. A stream, one row at a time, over a partial index of those
    /// events: neither the rest of the log nor all of them at once are read. No tenant check
    /// (the node serving the session reads it).
    fn read_records(
        &self,
        session_id: Uuid,
        up_to: i64,
    ) -> futures::stream::BoxStream<'_, Result<ReadRecord>>;

    /// The data of the `process.started` event of `process_id` in a session of this tenant: one
    /// indexed lookup, however long the session's log is.
    async fn process_started(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        process_id: &str,
    ) -> Result<Option<serde_json::Value>>;

    /// The highest `N` of the process ids (`p<N>`) in the session's `process.started` events
    /// (0: none). A node that makes a new runtime for the session numbers its processes above
    /// it, so an id is never given twice. One probe of the partial index of those events: it
    /// reads the session's background processes, not its calls.
    async fn last_process_number(&self, session_id: Uuid) -> Result<u64>;
}

/// Content-addressed blobs: stored apart from a group commit in bounded statements, read back,
/// and recorded as objects when they live in object storage (see [`objects`]).
#[async_trait]
pub trait Blobs: Send + Sync {
    /// Stores blobs outside any group commit, sorted by hash, in statements of at most
    /// [`Blobs::blob_statement_bytes`] of contents each (a larger blob goes alone), each its own
    /// transaction; blobs already stored are skipped. Content-addressed, so a blob stored for a
    /// write that then fails is harmless. Returns the size of each statement sent, in bytes.
    async fn put_blobs(&self, blobs: Vec<Blob>) -> Result<Vec<usize>>;

    /// Most bytes of blob contents one statement carries.
    fn blob_statement_bytes(&self) -> usize;

    async fn blob(&self, sha256: &str) -> Result<Option<Vec<u8>>>;

    /// Blobs by hash, in one round trip; hashes not stored are left out of the answer.
    async fn blobs(&self, sha256s: &[String]) -> Result<Vec<Blob>>;

    /// Records that these blobs (hash, size in bytes) are objects of the object store, not rows
    /// of `blobs`; hashes already recorded are left as they are.
    async fn put_blob_objects(&self, objects: &[(String, u64)]) -> Result<()>;

    /// Which of `sha256s` are recorded as objects of the object store.
    async fn blob_objects(&self, sha256s: &[String]) -> Result<Vec<String>>;

    /// The hash of an invocation's full output when it is a blob (its content was truncated),
    /// tenant-checked like [`Calls::invocation_output`].
    async fn invocation_output_sha256(&self, tenant_id: Uuid, id: Uuid) -> Result<Option<String>>;
}

/// What time travel writes: events that belong to no call (a rewind and what it changed), and
/// the reports of replays.
#[async_trait]
pub trait History: Send + Sync {
    /// Appends `events` that belong to no invocation (a rewind and what it changed) to an
    /// active session of this tenant, with their blobs, in one transaction under the session's
    /// lock. Returns the seqs of the first and the last. `NotFound` for another tenant's
    /// session; [`StoreError::Refused`] for a closed one.
    async fn append_events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        events: Vec<NewEvent>,
        blobs: Vec<Blob>,
    ) -> Result<(i64, i64)>;

    /// Inserts or replaces a replay's report.
    async fn save_replay(&self, tenant_id: Uuid, replay: &toolexec_core::Replay) -> Result<()>;

    /// A replay of this tenant.
    async fn replay(&self, tenant_id: Uuid, id: Uuid) -> Result<toolexec_core::Replay>;
}

/// Calls that wait for a person's approval: recorded waiting, decided under their session's
/// lock, found again after a restart.
#[async_trait]
pub trait Approvals: Send + Sync {
    /// Records a call that waits for a person's approval, in one transaction under its
    /// session's lock: its invocation, `pending_approval`, and its `approval.requested` event
    /// (the call as `invocation.started` would have it, and `data`). Returns that event's seq.
    /// `DuplicateCall` when the call id is recorded already; `SessionNotActive` when the
    /// session is closed; `TooManyWaiting` when `max_waiting` calls of the session wait already.
    async fn request_approval(
        &self,
        invocation: NewInvocation,
        data: serde_json::Value,
        max_waiting: u64,
    ) -> Result<std::result::Result<i64, WriteError>>;

    /// Decides a call waiting for approval, in one transaction under its session's lock:
    /// appends `approval.decided` (`decided`), then — approved (`denied` is `None`) — its
    /// `invocation.started`, and the invocation is `running` (its runner records its end with
    /// a `Write::Finish`); or — denied — its `invocation.finished` with that outcome.
    /// `NotFound` for another tenant's invocation; `NotPending` when it is not waiting;
    /// for an approval, `WaitEnded` past its `expires_at` and `SessionNotActive` when its
    /// session is closed. A denial moves the invocation's `started_seq` to its
    /// `approval.decided`, so that it lists no side effect.
    async fn decide_approval(
        &self,
        tenant_id: Uuid,
        invocation_id: Uuid,
        decided: serde_json::Value,
        denied: Option<Outcome>,
        node: &str,
    ) -> Result<std::result::Result<Decided, WriteError>>;

    /// The calls waiting for approval that `node` recorded, or those of one session (one
    /// probe of a partial index either way).
    async fn pending_approvals(&self, of: Waiters<'_>) -> Result<Vec<PendingApproval>>;
}

/// Which node runs a session's calls: one lease per session, taken, renewed by its holder's
/// heartbeat, released.
#[async_trait]
pub trait Leases: Send + Sync {
    /// Takes (or renews) the lease of `session_id` for `node` until `ttl` from now, if it is
    /// free (released or expired) or already `node`'s; otherwise says who holds it.
    async fn acquire_lease(
        &self,
        session_id: Uuid,
        node: &str,
        ttl: std::time::Duration,
    ) -> Result<Lease>;

    /// Extends every lease `node` holds (and that has not expired) to `ttl` from now (its
    /// heartbeat); the sessions whose leases it extended. A lease missing from the answer is
    /// no longer the node's.
    async fn renew_leases(&self, node: &str, ttl: std::time::Duration) -> Result<Vec<Uuid>>;

    /// Gives up `node`'s leases of these sessions (the row stays, expired, so that the next
    /// holder learns who held it last).
    async fn release_leases(&self, node: &str, session_ids: &[Uuid]) -> Result<()>;
}

/// Replicas that share the store: their heartbeats and addresses, and where a session or an
/// invocation lives (what forwarding asks).
#[async_trait]
pub trait Nodes: Send + Sync {
    /// `node` is alive now (its heartbeat), reachable by the others at `address`, and
    /// `draining` or not.
    async fn node_heartbeat(&self, node: &str, address: Option<&str>, draining: bool)
    -> Result<()>;

    /// `node` is gone (a drained node, once it has handed its sessions over).
    async fn remove_node(&self, node: &str) -> Result<()>;

    /// Where a session lives: the node that last held its lease, with that node's address and
    /// whether its heartbeat is within `alive_within`. `None` for a session no node has held
    /// (or that does not exist). No tenant check: it routes requests, which the owner then
    /// checks.
    async fn session_owner(
        &self,
        session_id: Uuid,
        alive_within: std::time::Duration,
    ) -> Result<Option<SessionOwner>>;

    /// The session an invocation belongs to (no tenant check: it routes a request, which the
    /// owner then checks).
    async fn invocation_session(&self, invocation_id: Uuid) -> Result<Option<Uuid>>;
}

/// What retention reads and deletes (see [`retention`]): an operator's job, with no tenant
/// check.
#[async_trait]
pub trait Retention: Send + Sync {
    /// Every session that is closed or has an origin (no tenant check: an operator's job).
    async fn retention_sessions(&self) -> Result<Vec<RetentionSession>>;

    /// Every session's id and `last_seq`: what retention compares, at its end, with what it
    /// saw at its start, to read again the events appended while it ran.
    async fn session_seqs(&self) -> Result<Vec<(Uuid, i64)>>;

    /// A page of every session's events in `(session_id, seq)` order: those after `after`
    /// (`None`: from the first), at most `limit`. One range of the primary key per page.
    async fn scan_events(&self, after: Option<(Uuid, i64)>, limit: u32) -> Result<Vec<Event>>;

    /// A page of the invocations that have an output blob, by id: those after `after`.
    async fn scan_output_refs(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<OutputRef>>;

    /// Deletes these sessions if they are closed — their events, invocations, replays and
    /// lease — in one transaction (the append-only rule of events lifted for them alone).
    /// Fails, deleting nothing, when a session not in the list has one of them as its origin.
    async fn delete_sessions(&self, ids: &[Uuid]) -> Result<Deleted>;

    /// Deletes the rows of these blobs (in `blobs` and in `blob_objects`); how many there were.
    /// The objects themselves are the object store's ([`objects::ObjectBlobs`] deletes them).
    async fn delete_blobs(&self, sha256s: &[String]) -> Result<u64>;
}
