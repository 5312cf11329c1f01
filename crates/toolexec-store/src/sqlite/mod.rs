//! SQLite backend: the zero-configuration store of a single `toolexec serve`.
//!
//! One file in WAL mode with two pools: a writer pool of exactly one connection that every write
//! goes through, so writes are serialised in-process and never meet `SQLITE_BUSY`, and a pool of
//! `query_only` readers, which WAL lets read while the writer writes. The single writer is also
//! what makes `seq` assignment safe here: the lock that Postgres takes per session row is, in
//! SQLite, the one write transaction at a time. Row-by-row statements are fine: they are calls
//! into a library, not round trips.
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::types::Json;
use toolexec_core::{Event, EventKind, Invocation, Session, SessionStatus, Tenant, new_id};
use uuid::Uuid;

use crate::plan;
use crate::rows::{self, event_columns, invocation_columns, not_found_on_fk, session_columns};
use crate::sql::{Running, sqlite as sql};
use crate::{
    Approvals, Assigned, Blob, Blobs, Calls, Decided, Events, History, NewEvent, NewInvocation,
    Outcome, PendingApproval, Result, SessionPage, Sessions, Store, StoreError, Tenants, Waiters,
    Write, WriteError,
};

mod upkeep;
mod write;

use write::{apply, insert_blobs, insert_event, write_plan};

/// How long a connection waits on a lock held by another process (a CLI next to the server)
/// before giving up with `SQLITE_BUSY`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a request waits for a pooled connection before the store counts as unavailable.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// Readers: enough for concurrent API reads on a small machine; SQLite reads are cheap.
const READERS: u32 = 4;

/// How long a read of the log by bytes waits for the one connection that makes them: they
/// queue behind each other (each a few milliseconds), so longer than a pooled read.
const LOG_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// Exactly one connection: every write, in order.
    writer: SqlitePool,
    reader: SqlitePool,
    /// One read-only connection for reading the log by bytes ([`Events::event_texts`],
    /// [`Events::event_text`], [`Sessions::session_excerpt`]). The events table is keyed by
    /// `(session_id, seq)` without a rowid, so SQLite reads a row whole whenever a search steps
    /// onto it (to compare its key), whatever columns are asked for; a row may be as large as a
    /// request body. On one connection those reads take turns, and the node holds one such
    /// row at a time instead of one per reader.
    log: SqlitePool,
    /// Most bytes of blob contents in one transaction: SQLite has no message limit, but the one
    /// writer is held for as long as a transaction takes, so big contents go in bounded steps.
    blob_statement_bytes: usize,
}

impl SqliteStore {
    /// Opens (creating it and its folder if needed) the database file at `path`.
    pub async fn open(path: &Path) -> Result<Self> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| {
                StoreError::Unavailable(format!("cannot create {}: {e}", parent.display()))
            })?;
        }
        let base = SqliteConnectOptions::new()
            .filename(path)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true)
            // FULL, not NORMAL: `invocation.started` must survive a power cut before the tool
            // runs. Group commit amortises the fsync.
            .synchronous(SqliteSynchronous::Full);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            // Keep the connection: reopening it costs more than holding a file handle.
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(
                base.clone()
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal),
            )
            .await?;
        // The writer has created the file and switched it to WAL (a setting of the file).
        let reader = SqlitePoolOptions::new()
            .max_connections(READERS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(base.clone().pragma("query_only", "ON"))
            .await?;
        let log = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(LOG_ACQUIRE_TIMEOUT)
            .connect_with(base.pragma("query_only", "ON"))
            .await?;
        Ok(Self {
            writer,
            reader,
            log,
            blob_statement_bytes: crate::check::DEFAULT_BLOB_STATEMENT_BYTES,
        })
    }

    /// Bounds the blob contents of one transaction (at least 1 byte: a larger blob goes alone).
    pub fn with_blob_statement_bytes(mut self, bytes: usize) -> Self {
        self.blob_statement_bytes = bytes.max(1);
        self
    }

    /// A private in-memory database (for tests): one connection kept open for the life of the
    /// store, reading and writing. Call [`Store::migrate`] before use, as with [`Self::open`].
    pub async fn memory() -> Result<Self> {
        let options = SqliteConnectOptions::from_str("sqlite::memory:")?.foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await?;
        Ok(Self {
            writer: pool.clone(),
            reader: pool.clone(),
            log: pool,
            blob_statement_bytes: crate::check::DEFAULT_BLOB_STATEMENT_BYTES,
        })
    }

    /// Begins a write transaction. `IMMEDIATE` takes the file's write lock up front, so another
    /// process holding it makes us wait (busy timeout) instead of failing mid-transaction.
    async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }
}

/// The `process.started` event of a process id (`$3`) in a session (`$1`) of a tenant (`$2`),
/// from the partial index `events_process_started` (migration 0002): the kind is a literal and
/// the expression the index's own. Named with `INDEXED BY` because without statistics SQLite
/// prefers the primary key's `session_id` prefix, which reads the whole log of the session.
/// Public so that a test can check its plan.
pub const PROCESS_STARTED: &str = "SELECT e.data FROM events e INDEXED BY events_process_started \
     JOIN sessions s ON s.id = e.session_id \
     WHERE e.session_id = $1 AND s.tenant_id = $2 AND e.kind = 'process.started' \
     AND json_extract(e.data, '$.process_id') = $3 LIMIT 1";

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn migrate(&self) -> Result<()> {
        crate::migrations::migrator(crate::migrations::SQLITE)
            .run(&self.writer)
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }
}

#[async_trait]
impl Tenants for SqliteStore {
    async fn ensure_tenant(&self, name: &str) -> Result<Tenant> {
        sqlx::query(
            "INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(new_id())
        .bind(name)
        .bind(Utc::now())
        .execute(&self.writer)
        .await?;
        let row = sqlx::query("SELECT id, name FROM tenants WHERE name = $1")
            .bind(name)
            .fetch_one(&self.writer)
            .await?;
        rows::tenant(&row)
    }

    async fn create_api_key(&self, tenant_id: Uuid, key_sha256: &str, prefix: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, key_sha256, prefix, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(new_id())
        .bind(tenant_id)
        .bind(key_sha256)
        .bind(prefix)
        .bind(Utc::now())
        .execute(&self.writer)
        .await
        .map_err(not_found_on_fk)?;
        Ok(())
    }

    async fn tenant_for_key(&self, key_sha256: &str) -> Result<Option<Tenant>> {
        sql::tenant_for_key(&self.reader, key_sha256).await
    }

    async fn has_api_keys(&self) -> Result<bool> {
        sql::has_api_keys(&self.reader).await
    }
}

#[async_trait]
impl Sessions for SqliteStore {
    async fn create_session(
        &self,
        session: &Session,
        events: Vec<NewEvent>,
        blobs: Vec<Blob>,
        max_open_sessions: u64,
    ) -> Result<Session> {
        let blobs = crate::sql::inline_blobs(self, blobs).await?;
        // The count and the insert share the one write transaction: no other create can come
        // between them.
        let mut tx = self.begin().await?;
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sessions WHERE tenant_id = $1 AND status = 'active'",
        )
        .bind(session.tenant_id)
        .fetch_one(&mut *tx)
        .await?;
        if u64::try_from(open).unwrap_or(0) >= max_open_sessions {
            return Err(StoreError::TooManyOpenSessions(max_open_sessions));
        }
        sqlx::query(
            "INSERT INTO sessions (id, tenant_id, status, tools, policy, env, metadata, last_seq, \
             created_at, origin_kind, origin_session_id, origin_seq, environment) \
             VALUES ($1, $2, 'active', $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        )
        .bind(session.id)
        .bind(session.tenant_id)
        .bind(session.tools.as_ref().map(Json))
        .bind(Json(&session.policy))
        .bind(Json(&session.env))
        .bind(Json(&session.metadata))
        .bind(i64::try_from(events.len()).unwrap_or(i64::MAX))
        .bind(session.created_at)
        .bind(session.origin.map(|o| o.kind.as_str()))
        .bind(session.origin.map(|o| o.session_id))
        .bind(session.origin.map(|o| o.seq))
        .bind(
            session
                .environment
                .as_ref()
                .map(|e| serde_json::to_string(e).unwrap_or_default()),
        )
        .execute(&mut *tx)
        .await
        .map_err(not_found_on_fk)?;
        write_plan(&mut tx, &plan::initial_plan(session.id, events, blobs)).await?;
        let stored = sql::session(&mut *tx, session.tenant_id, session.id)
            .await?
            .ok_or(StoreError::NotFound)?;
        tx.commit().await?;
        Ok(stored)
    }

    async fn get_session(&self, tenant_id: Uuid, id: Uuid) -> Result<Session> {
        sql::session(&self.reader, tenant_id, id)
            .await?
            .ok_or(StoreError::NotFound)
    }

    async fn list_sessions(
        &self,
        tenant_id: Uuid,
        before: Option<Uuid>,
        limit: u32,
        bounds: crate::pages::ByteBounds,
    ) -> Result<SessionPage> {
        crate::pages::sqlite::list_sessions(&self.reader, tenant_id, before, limit, bounds).await
    }

    async fn session_excerpt(&self, tenant_id: Uuid, id: Uuid, chars: u32) -> Result<Session> {
        crate::pages::sqlite::session_excerpt(&self.log, tenant_id, id, chars).await
    }

    async fn close_session(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        data: serde_json::Value,
    ) -> Result<Session> {
        let mut tx = self.begin().await?;
        let session = sql::session(&mut *tx, tenant_id, id)
            .await?
            .ok_or(StoreError::NotFound)?;
        if session.status == SessionStatus::Closed {
            return Ok(session);
        }
        let now = Utc::now();
        let seq = session.last_seq + 1;
        sqlx::query(
            "UPDATE sessions SET status = 'closed', closed_at = $2, last_seq = $3 WHERE id = $1",
        )
        .bind(id)
        .bind(now)
        .bind(seq)
        .execute(&mut *tx)
        .await?;
        insert_event(&mut tx, id, seq, EventKind::SessionClosed, None, &data, now).await?;
        let closed = sql::session(&mut *tx, tenant_id, id)
            .await?
            .ok_or(StoreError::NotFound)?;
        tx.commit().await?;
        Ok(closed)
    }
}

#[async_trait]
impl Calls for SqliteStore {
    async fn lookup_calls(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        call_ids: &[String],
    ) -> Result<(Session, Vec<Invocation>)> {
        let found = sqlx::query(concat!(
            "SELECT ",
            session_columns!(),
            ", ",
            invocation_columns!(),
            " FROM sessions s LEFT JOIN invocations i \
             ON i.session_id = s.id AND i.call_id IN (SELECT value FROM json_each($3)) \
             WHERE s.id = $1 AND s.tenant_id = $2 ORDER BY i.started_seq"
        ))
        .bind(session_id)
        .bind(tenant_id)
        .bind(Json(call_ids))
        .fetch_all(&self.reader)
        .await?;
        rows::session_calls(&found)
    }

    async fn call_ids(&self, session_id: Uuid, after: &str, limit: u32) -> Result<Vec<String>> {
        sql::call_ids(&self.reader, session_id, after, limit).await
    }

    async fn last_call_arguments(
        &self,
        session_id: Uuid,
        name: &str,
    ) -> Result<Option<serde_json::Value>> {
        sql::last_call_arguments(&self.reader, session_id, name).await
    }

    async fn commit(
        &self,
        batch: &[Write],
    ) -> Result<Vec<std::result::Result<Assigned, WriteError>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let batch = match crate::blobs_beyond(batch, self.blob_statement_bytes) {
            None => batch.to_vec(),
            Some((rest, blobs)) => {
                self.put_blobs(blobs).await?;
                rest
            }
        };
        let mut tx = self.begin().await?;
        let results = apply(&mut tx, batch).await?;
        tx.commit().await?;
        Ok(results)
    }

    async fn interrupt_running(&self, node: &str, content: &str) -> Result<u64> {
        self.interrupt(Running::OfNode(node), content).await
    }

    async fn interrupt_session(&self, session_id: Uuid, content: &str) -> Result<u64> {
        self.interrupt(Running::OfSession(session_id), content)
            .await
    }

    async fn invocation_page(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Invocation> {
        // One read transaction: the invocation, its page and their count from one snapshot.
        let mut tx = self.reader.begin().await?;
        let invocation = sql::invocation_page(&mut tx, tenant_id, id, after, limit).await?;
        tx.commit().await?;
        Ok(invocation)
    }

    async fn invocation_output(&self, tenant_id: Uuid, id: Uuid) -> Result<String> {
        sql::invocation_output(&self.reader, tenant_id, id).await
    }
}

#[async_trait]
impl Events for SqliteStore {
    async fn events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Event>> {
        // One read transaction, so the check and the page see the same snapshot.
        let mut tx = self.reader.begin().await?;
        sql::session(&mut *tx, tenant_id, session_id)
            .await?
            .ok_or(StoreError::NotFound)?;
        let events = sqlx::query(concat!(
            "SELECT ",
            event_columns!(),
            " FROM events e WHERE e.session_id = $1 AND e.seq > $2 ORDER BY e.seq LIMIT $3"
        ))
        .bind(session_id)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::event)
        .collect::<Result<Vec<_>>>()?;
        tx.commit().await?;
        Ok(events)
    }

    async fn event_texts(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
        bounds: crate::pages::ByteBounds,
    ) -> Result<crate::pages::EventTexts> {
        crate::pages::sqlite::event_texts(&self.log, tenant_id, session_id, after, limit, bounds)
            .await
    }

    async fn event_text(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        seq: i64,
        chars: Option<u32>,
    ) -> Result<Option<crate::pages::EventText>> {
        crate::pages::sqlite::event_text(&self.log, tenant_id, session_id, seq, chars).await
    }

    async fn events_of_kinds(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        kinds: &[EventKind],
        after: i64,
        up_to: i64,
        limit: u32,
    ) -> Result<Vec<Event>> {
        let mut tx = self.reader.begin().await?;
        sql::session(&mut *tx, tenant_id, session_id)
            .await?
            .ok_or(StoreError::NotFound)?;
        let kinds = serde_json::to_string(&kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>())
            .unwrap_or_default();
        let events = sqlx::query(concat!(
            "SELECT ",
            event_columns!(),
            " FROM events e WHERE e.session_id = $1 AND e.seq > $2 AND e.seq <= $3 \
             AND e.kind IN (SELECT value FROM json_each($4)) ORDER BY e.seq LIMIT $5"
        ))
        .bind(session_id)
        .bind(after)
        .bind(up_to)
        .bind(kinds)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::event)
        .collect::<Result<Vec<_>>>()?;
        tx.commit().await?;
        Ok(events)
    }

    async fn todo_events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Event>> {
        let mut tx = self.reader.begin().await?;
        sql::session(&mut *tx, tenant_id, session_id)
            .await?
            .ok_or(StoreError::NotFound)?;
        // Literal kinds: the partial index `events_todos` serves it.
        let events = sqlx::query(concat!(
            "SELECT ",
            event_columns!(),
            " FROM events e WHERE e.session_id = $1 AND e.seq > $2 \
             AND e.kind IN ('todo.created', 'todo.updated', 'todo.deleted') \
             ORDER BY e.seq LIMIT $3"
        ))
        .bind(session_id)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(rows::event)
        .collect::<Result<Vec<_>>>()?;
        tx.commit().await?;
        Ok(events)
    }

    fn read_records(
        &self,
        session_id: Uuid,
        up_to: i64,
    ) -> futures::stream::BoxStream<'_, Result<crate::ReadRecord>> {
        crate::reads::sqlite(&self.reader, session_id, up_to)
    }

    async fn process_started(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        process_id: &str,
    ) -> Result<Option<serde_json::Value>> {
        sql::process_started(&self.reader, tenant_id, session_id, process_id).await
    }

    async fn last_process_number(&self, session_id: Uuid) -> Result<u64> {
        // The kind is a literal, so that the partial index `events_process_started`
        // (migration 0002) serves it; only well-formed ids are read as numbers.
        let n = sqlx::query_scalar::<_, i64>(
            "SELECT COALESCE(MAX(CAST(substr(json_extract(data, '$.process_id'), 2) AS INTEGER)), 0) \
             FROM events WHERE session_id = $1 AND kind = 'process.started' \
             AND json_extract(data, '$.process_id') GLOB 'p[0-9]*' \
             AND substr(json_extract(data, '$.process_id'), 2) NOT GLOB '*[^0-9]*' \
             AND length(json_extract(data, '$.process_id')) <= 19",
        )
        .bind(session_id)
        .fetch_one(&self.reader)
        .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

#[async_trait]
impl Blobs for SqliteStore {
    async fn put_blobs(&self, blobs: Vec<Blob>) -> Result<Vec<usize>> {
        let mut sizes = Vec::new();
        for statement in crate::check::blob_statements(blobs, self.blob_statement_bytes) {
            let mut tx = self.begin().await?;
            insert_blobs(&mut tx, &statement, Utc::now()).await?;
            tx.commit().await?;
            sizes.push(statement.iter().map(Blob::len).sum());
        }
        Ok(sizes)
    }

    fn blob_statement_bytes(&self) -> usize {
        self.blob_statement_bytes
    }

    async fn blob(&self, sha256: &str) -> Result<Option<Vec<u8>>> {
        sql::blob(&self.reader, sha256).await
    }

    async fn blobs(&self, sha256s: &[String]) -> Result<Vec<Blob>> {
        let mut found = Vec::with_capacity(sha256s.len());
        // SQLite has no array parameter; one prepared statement, run per hash, in one read.
        let mut conn = self.reader.acquire().await?;
        for sha256 in sha256s {
            let data: Option<Vec<u8>> =
                sqlx::query_scalar("SELECT data FROM blobs WHERE sha256 = $1")
                    .bind(sha256)
                    .fetch_optional(&mut *conn)
                    .await?;
            if let Some(data) = data {
                found.push(Blob {
                    sha256: sha256.clone(),
                    bytes: data.into(),
                });
            }
        }
        Ok(found)
    }

    async fn put_blob_objects(&self, objects: &[(String, u64)]) -> Result<()> {
        if objects.is_empty() {
            return Ok(());
        }
        let now = Utc::now().timestamp_millis();
        let mut tx = self.begin().await?;
        for (sha256, size) in objects {
            sqlx::query(
                "INSERT INTO blob_objects (sha256, size, created_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (sha256) DO NOTHING",
            )
            .bind(sha256)
            .bind(i64::try_from(*size).unwrap_or(i64::MAX))
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn blob_objects(&self, sha256s: &[String]) -> Result<Vec<String>> {
        let mut found = Vec::new();
        let mut conn = self.reader.acquire().await?;
        for sha256 in sha256s {
            let hit: Option<String> =
                sqlx::query_scalar("SELECT sha256 FROM blob_objects WHERE sha256 = $1")
                    .bind(sha256)
                    .fetch_optional(&mut *conn)
                    .await?;
            found.extend(hit);
        }
        Ok(found)
    }

    async fn invocation_output_sha256(&self, tenant_id: Uuid, id: Uuid) -> Result<Option<String>> {
        sql::invocation_output_sha256(&self.reader, tenant_id, id).await
    }
}

#[async_trait]
impl History for SqliteStore {
    async fn append_events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        events: Vec<NewEvent>,
        blobs: Vec<Blob>,
    ) -> Result<(i64, i64)> {
        let blobs = crate::sql::inline_blobs(self, blobs).await?;
        let mut tx = self.begin().await?;
        let session = sql::session(&mut *tx, tenant_id, session_id)
            .await?
            .ok_or(StoreError::NotFound)?;
        if session.status != SessionStatus::Active {
            return Err(StoreError::Refused {
                reason: "the session is closed".into(),
                cause: "append to a closed session".into(),
            });
        }
        let plan = plan::appended_plan(session_id, session.last_seq, events, blobs);
        let first = session.last_seq + 1;
        let last = plan.last_seqs.first().map_or(session.last_seq, |(_, s)| *s);
        write_plan(&mut tx, &plan).await?;
        tx.commit().await?;
        Ok((first, last))
    }

    async fn save_replay(&self, tenant_id: Uuid, replay: &toolexec_core::Replay) -> Result<()> {
        let mut tx = self.begin().await?;
        sql::save_replay(&mut *tx, tenant_id, replay).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn replay(&self, tenant_id: Uuid, id: Uuid) -> Result<toolexec_core::Replay> {
        sql::replay(&self.reader, tenant_id, id).await
    }
}

#[async_trait]
impl Approvals for SqliteStore {
    async fn request_approval(
        &self,
        invocation: NewInvocation,
        data: serde_json::Value,
        max_waiting: u64,
    ) -> Result<std::result::Result<i64, WriteError>> {
        let session_id = invocation.session_id;
        let mut tx = self.begin().await?;
        let Some(locked) = sqlx::query("SELECT id, status, last_seq FROM sessions WHERE id = $1")
            .bind(session_id)
            .fetch_optional(&mut *tx)
            .await?
        else {
            return Ok(Err(WriteError::SessionNotActive));
        };
        let locked = rows::locked_session(&locked)?;
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM invocations INDEXED BY invocations_pending_session \
             WHERE session_id = $1 AND status = 'pending_approval'",
        )
        .bind(session_id)
        .fetch_one(&mut *tx)
        .await?;
        let known = sql::call_invocation(&mut *tx, session_id, &invocation.call_id).await?;
        let now = plan::WaitingNow { waiting, known };
        let (plan, seq) = match plan::requested_plan(&locked, now, max_waiting, invocation, data) {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        write_plan(&mut tx, &plan).await?;
        tx.commit().await?;
        Ok(Ok(seq))
    }

    async fn decide_approval(
        &self,
        tenant_id: Uuid,
        invocation_id: Uuid,
        decided: serde_json::Value,
        denied: Option<Outcome>,
        node: &str,
    ) -> Result<std::result::Result<Decided, WriteError>> {
        let mut tx = self.begin().await?;
        let row = sqlx::query(
            "SELECT i.id, i.session_id, i.call_id, i.name, i.arguments, i.read_only, \
             i.capabilities, i.status, json_extract(e.data, '$.expires_at') AS expires_at \
             FROM invocations i JOIN sessions s ON s.id = i.session_id \
             LEFT JOIN events e ON e.session_id = i.session_id AND e.seq = i.started_seq \
             AND e.kind = 'approval.requested' \
             WHERE i.id = $1 AND s.tenant_id = $2",
        )
        .bind(invocation_id)
        .bind(tenant_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
        let waiting = rows::waiting(&row)?;
        let locked = sqlx::query("SELECT id, status, last_seq FROM sessions WHERE id = $1")
            .bind(waiting.session_id)
            .fetch_one(&mut *tx)
            .await?;
        let locked = rows::locked_session(&locked)?;
        let (plan, done) = match plan::decided_plan(&locked, &waiting, decided, denied) {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        write_plan(&mut tx, &plan).await?;
        if plan.finishes.is_empty() {
            sqlx::query(
                "UPDATE invocations SET status = 'running', started_seq = $2, started_at = $3, \
                 node = $4 WHERE id = $1",
            )
            .bind(invocation_id)
            .bind(done.next_seq)
            .bind(Utc::now())
            .bind(node)
            .execute(&mut *tx)
            .await?;
        } else {
            // A denial lists no side effect: its start is its decision.
            sqlx::query("UPDATE invocations SET started_seq = $2 WHERE id = $1")
                .bind(invocation_id)
                .bind(done.decided_seq)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(Ok(done))
    }

    async fn pending_approvals(&self, of: Waiters<'_>) -> Result<Vec<PendingApproval>> {
        const SELECT: &str = "SELECT s.tenant_id, i.session_id, i.id, \
             json_extract(e.data, '$.expires_at') AS expires_at FROM invocations i ";
        const REST: &str = " JOIN sessions s ON s.id = i.session_id \
             LEFT JOIN events e ON e.session_id = i.session_id AND e.seq = i.started_seq \
             WHERE i.status = 'pending_approval' AND ";
        let query = match of {
            Waiters::Node(node) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "{SELECT}INDEXED BY invocations_pending_node{REST}i.node = $1"
            )))
            .bind(node.to_owned()),
            Waiters::Session(id) => sqlx::query(sqlx::AssertSqlSafe(format!(
                "{SELECT}INDEXED BY invocations_pending_session{REST}i.session_id = $1"
            )))
            .bind(id),
        };
        query
            .fetch_all(&self.reader)
            .await?
            .iter()
            .map(rows::pending_approval)
            .collect()
    }
}

#[cfg(test)]
mod tests;
