//! Postgres backend: the production store, shared by every API replica.
//!
//! A commit is usually one round trip: a batch planned from this store's cached session state,
//! written by one statement that first checks the cache under `FOR UPDATE` and holds only the
//! parts the batch needs (`write_plan_if_current_sql`: a statement per shape, so that a commit
//! of one `shell` start does not set up the blobs and finishes it does not write). When the
//! cache is stale (another writer moved on), the batch takes the locked path, five round trips
//! whatever its size: `BEGIN`; lock the sessions of the batch (`FOR UPDATE`, in id order so
//! that concurrent batches cannot deadlock); read the invocations the batch refers to; one
//! statement that writes everything (data-modifying CTEs over `UNNEST`ed arrays: blobs,
//! invocations, finishes, events, `last_seq`); `COMMIT`.
//! Per-write failures are decided before the write (see the `plan` module), never by a constraint
//! violation, which would abort the transaction and every other write of the batch.
//!
//! Blobs ride in that one statement only while they are small: a batch carrying more than
//! [`PgStore::blob_statement_bytes`] of contents has them written first by [`Blobs::put_blobs`],
//! in statements of at most that size, so no statement nears Postgres's 1 GiB message limit
//! (past it the server drops the connection, and the same statement fails the same way forever).
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::types::Json;
use toolexec_core::{Event, EventKind, Invocation, Session, SessionStatus, Tenant, new_id};
use uuid::Uuid;

use crate::plan;
use crate::rows::{
    self, Columns, event_columns, invocation_columns, not_found_on_fk, session_columns,
};
use crate::sql::{Running, pg as sql};
use crate::{
    Approvals, Assigned, Blob, Blobs, Calls, Decided, Events, History, NewEvent, NewInvocation,
    Outcome, PendingApproval, Result, SessionPage, Sessions, Store, StoreError, Tenants, Waiters,
    Write, WriteError,
};

mod upkeep;
mod write;

use write::{apply, blob_size, col, lock_sessions, write_plan, write_plan_if_current};

/// How long a request waits for a pooled connection before the store counts as unavailable: a
/// call is refused (503) rather than left hanging when the database is down or saturated.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    cache: std::sync::Arc<std::sync::Mutex<Cache>>,
    /// Most bytes of blob contents in one statement.
    blob_statement_bytes: usize,
    /// Commits that took the locked path (the cache was cold or stale), shared by clones.
    locked_commits: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// What this store last saw of the sessions and running invocations it wrote, so a batch can
/// usually be planned without reading the database first (`write_plan_if_current_sql`, in
/// [`write`]). Never trusted on its own: a stale entry only sends the batch down the locked
/// path.
#[derive(Debug, Default)]
struct Cache {
    sessions: std::collections::HashMap<Uuid, (toolexec_core::SessionStatus, i64)>,
    running: std::collections::HashMap<Uuid, plan::Existing>,
}

/// Entries beyond which a cache map is cleared (bounded memory; it refills on the next writes).
const CACHE_MAX: usize = 100_000;

impl PgStore {
    /// Connects a pool of at most `max_connections` to `url` (`postgres://…`).
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let mut options = PgConnectOptions::from_str(url)
            .map_err(|e| StoreError::Unavailable(format!("invalid database url: {e}")))?;
        // TLS only when asked for (`sslmode=require|verify-ca|verify-full`, or PGSSLMODE):
        // libpq's default `prefer` encrypts without verifying anybody, and measured here it
        // cut recorded calls/s at 32 clients from ~4,200 to ~650 on loopback.
        if !url.contains("sslmode=") && std::env::var_os("PGSSLMODE").is_none() {
            options = options.ssl_mode(PgSslMode::Disable);
        }
        let options = options
            // Every statement of the store is a lookup by key. Plan each once per connection
            // (planning the batch write each time cost ~0.35 ms a commit) and keep those plans on
            // the indexes: a generic plan made while a table was still small would otherwise
            // scan it, and go on scanning as sessions grow.
            .options([
                ("enable_seqscan", "off"),
                ("plan_cache_mode", "force_generic_plan"),
            ]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await?;
        Ok(Self::from_pool(pool))
    }

    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            pool,
            cache: std::sync::Arc::default(),
            blob_statement_bytes: crate::check::DEFAULT_BLOB_STATEMENT_BYTES,
            locked_commits: std::sync::Arc::default(),
        }
    }

    /// Bounds the blob contents of one statement (at least 1 byte: a larger blob goes alone).
    pub fn with_blob_statement_bytes(mut self, bytes: usize) -> Self {
        self.blob_statement_bytes = bytes.max(1);
        self
    }

    fn forget_session(&self, id: Uuid) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.sessions.remove(&id);
        }
    }

    /// How many group commits took the locked path because this store's cache was cold or
    /// stale (another replica or writer moved a session on), since it was made. The others were
    /// one statement from cached state.
    pub fn locked_commits(&self) -> u64 {
        self.locked_commits
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

/// The `process.started` event of a process id (`$3`) in a session (`$1`) of a tenant (`$2`).
/// The kind is a literal so that the partial index `events_process_started` (migration 0002)
/// matches it: one index probe, however long the session's log. Public so that a test can check
/// its plan.
pub const PROCESS_STARTED: &str = "SELECT e.data FROM events e JOIN sessions s ON s.id = e.session_id \
     WHERE e.session_id = $1 AND s.tenant_id = $2 AND e.kind = 'process.started' \
     AND e.data->>'process_id' = $3 LIMIT 1";

#[async_trait]
impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn migrate(&self) -> Result<()> {
        crate::migrations::migrator(crate::migrations::POSTGRES)
            .run(&self.pool)
            .await
            .map_err(|e| StoreError::Migration(e.to_string()))
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

#[async_trait]
impl Tenants for PgStore {
    async fn ensure_tenant(&self, name: &str) -> Result<Tenant> {
        // Two statements, not one: under READ COMMITTED the SELECT takes a fresh snapshot and
        // so sees a row that a concurrent insert committed while ON CONFLICT waited for it.
        sqlx::query("INSERT INTO tenants (id, name) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING")
            .bind(new_id())
            .bind(name)
            .execute(&self.pool)
            .await?;
        let row = sqlx::query("SELECT id, name FROM tenants WHERE name = $1")
            .bind(name)
            .fetch_one(&self.pool)
            .await?;
        rows::tenant(&row)
    }

    async fn create_api_key(&self, tenant_id: Uuid, key_sha256: &str, prefix: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO api_keys (id, tenant_id, key_sha256, prefix) VALUES ($1, $2, $3, $4)",
        )
        .bind(new_id())
        .bind(tenant_id)
        .bind(key_sha256)
        .bind(prefix)
        .execute(&self.pool)
        .await
        .map_err(not_found_on_fk)?;
        Ok(())
    }

    async fn tenant_for_key(&self, key_sha256: &str) -> Result<Option<Tenant>> {
        sql::tenant_for_key(&self.pool, key_sha256).await
    }

    async fn has_api_keys(&self) -> Result<bool> {
        sql::has_api_keys(&self.pool).await
    }
}

#[async_trait]
impl Sessions for PgStore {
    async fn create_session(
        &self,
        session: &Session,
        events: Vec<NewEvent>,
        blobs: Vec<Blob>,
        max_open_sessions: u64,
    ) -> Result<Session> {
        let blobs = crate::sql::inline_blobs(self, blobs).await?;
        let mut tx = self.pool.begin().await?;
        // Creates of one tenant take turns on its row (NO KEY UPDATE: the sessions' foreign-key
        // checks, which take KEY SHARE, do not wait on it), and the count below is a statement
        // of its own, so under READ COMMITTED it sees every session committed before the turn.
        sqlx::query("SELECT id FROM tenants WHERE id = $1 FOR NO KEY UPDATE")
            .bind(session.tenant_id)
            .fetch_optional(&mut *tx)
            .await?
            .ok_or(StoreError::NotFound)?;
        let last_seq = i64::try_from(events.len()).unwrap_or(i64::MAX);
        let row = sqlx::query(concat!(
            "INSERT INTO sessions AS s (id, tenant_id, status, tools, policy, env, metadata, \
             last_seq, created_at, origin_kind, origin_session_id, origin_seq, environment) \
             SELECT $1, $2, 'active', $3, $4, $5, $6, $7, $8, $10, $11, $12, $13 \
             WHERE (SELECT count(*) FROM sessions o \
                    WHERE o.tenant_id = $2 AND o.status = 'active') < $9 \
             RETURNING ",
            session_columns!()
        ))
        .bind(session.id)
        .bind(session.tenant_id)
        .bind(session.tools.as_ref().map(Json))
        .bind(Json(&session.policy))
        .bind(Json(&session.env))
        .bind(Json(&session.metadata))
        .bind(last_seq)
        .bind(session.created_at)
        .bind(i64::try_from(max_open_sessions).unwrap_or(i64::MAX))
        .bind(session.origin.map(|o| o.kind.as_str()))
        .bind(session.origin.map(|o| o.session_id))
        .bind(session.origin.map(|o| o.seq))
        .bind(
            session
                .environment
                .as_ref()
                .map(|e| serde_json::to_string(e).unwrap_or_default()),
        )
        .fetch_optional(&mut *tx)
        .await
        .map_err(not_found_on_fk)?
        .ok_or(StoreError::TooManyOpenSessions(max_open_sessions))?;
        let stored = rows::session(&row)?;
        let plan = plan::initial_plan(session.id, events, blobs);
        write_plan(&mut tx, &plan).await?;
        tx.commit().await?;
        if let Ok(mut cache) = self.cache.lock() {
            cache
                .sessions
                .insert(stored.id, (stored.status, stored.last_seq));
        }
        Ok(stored)
    }

    async fn get_session(&self, tenant_id: Uuid, id: Uuid) -> Result<Session> {
        sql::session(&self.pool, tenant_id, id)
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
        crate::pages::pg::list_sessions(&self.pool, tenant_id, before, limit, bounds).await
    }

    async fn session_excerpt(&self, tenant_id: Uuid, id: Uuid, chars: u32) -> Result<Session> {
        crate::pages::pg::session_excerpt(&self.pool, tenant_id, id, chars).await
    }

    async fn close_session(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        data: serde_json::Value,
    ) -> Result<Session> {
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions s WHERE s.id = $1 AND s.tenant_id = $2 FOR UPDATE"
        ))
        .bind(id)
        .bind(tenant_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
        let session = rows::session(&row)?;
        if session.status == SessionStatus::Closed {
            return Ok(session);
        }
        let seq = session.last_seq + 1;
        let row = sqlx::query(concat!(
            "WITH closed AS (\
                 INSERT INTO events (session_id, seq, kind, data, created_at) \
                 VALUES ($1, $2, $3, $4, statement_timestamp())) \
             UPDATE sessions AS s SET status = 'closed', closed_at = statement_timestamp(), \
             last_seq = $2 WHERE s.id = $1 RETURNING ",
            session_columns!()
        ))
        .bind(id)
        .bind(seq)
        .bind(EventKind::SessionClosed.as_str())
        .bind(Json(&data))
        .fetch_one(&mut *tx)
        .await?;
        let closed = rows::session(&row)?;
        tx.commit().await?;
        self.forget_session(id);
        Ok(closed)
    }
}

#[async_trait]
impl Calls for PgStore {
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
             ON i.session_id = s.id AND i.call_id = ANY($3) \
             WHERE s.id = $1 AND s.tenant_id = $2 ORDER BY i.started_seq"
        ))
        .bind(session_id)
        .bind(tenant_id)
        .bind(call_ids)
        .fetch_all(&self.pool)
        .await?;
        rows::session_calls(&found)
    }

    async fn call_ids(&self, session_id: Uuid, after: &str, limit: u32) -> Result<Vec<String>> {
        sql::call_ids(&self.pool, session_id, after, limit).await
    }

    async fn last_call_arguments(
        &self,
        session_id: Uuid,
        name: &str,
    ) -> Result<Option<serde_json::Value>> {
        sql::last_call_arguments(&self.pool, session_id, name).await
    }

    async fn commit(
        &self,
        batch: &[Write],
    ) -> Result<Vec<std::result::Result<Assigned, WriteError>>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let without_blobs;
        let batch = match crate::blobs_beyond(batch, self.blob_statement_bytes) {
            None => batch,
            Some((rest, blobs)) => {
                self.put_blobs(blobs).await?;
                without_blobs = rest;
                &without_blobs[..]
            }
        };
        // Fast path: one statement planned from cached state (one round trip, no read first).
        if let Some((plan, expected)) = self.cached_plan(batch) {
            if plan.is_empty() {
                // Every write refused from state that cannot change back (a closed session).
                return Ok(plan.results);
            }
            if write_plan_if_current(&self.pool, &plan, expected).await? {
                self.learn(&plan, &[]);
                return Ok(plan.results);
            }
        }
        self.locked_commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut tx = self.pool.begin().await?;
        let (plan, locked) = apply(&mut tx, batch.to_vec()).await?;
        tx.commit().await?;
        self.learn(&plan, &locked);
        Ok(plan.results)
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
        let mut conn = self.pool.acquire().await?;
        sql::invocation_page(&mut conn, tenant_id, id, after, limit).await
    }

    async fn invocation_output(&self, tenant_id: Uuid, id: Uuid) -> Result<String> {
        sql::invocation_output(&self.pool, tenant_id, id).await
    }
}

#[async_trait]
impl Events for PgStore {
    async fn events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Event>> {
        // One round trip: the session row says whether the caller may read, the lateral join
        // brings the page (no rows from it: a session with nothing after `after`).
        let found = sqlx::query(concat!(
            "SELECT s.id AS s_id, ",
            event_columns!(),
            " FROM sessions s LEFT JOIN LATERAL (\
                 SELECT * FROM events WHERE session_id = s.id AND seq > $3 \
                 ORDER BY seq LIMIT $4) e ON true \
             WHERE s.id = $1 AND s.tenant_id = $2 ORDER BY e.seq"
        ))
        .bind(session_id)
        .bind(tenant_id)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        joined_events(&found)
    }

    async fn event_texts(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
        bounds: crate::pages::ByteBounds,
    ) -> Result<crate::pages::EventTexts> {
        crate::pages::pg::event_texts(&self.pool, tenant_id, session_id, after, limit, bounds).await
    }

    async fn event_text(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        seq: i64,
        chars: Option<u32>,
    ) -> Result<Option<crate::pages::EventText>> {
        crate::pages::pg::event_text(&self.pool, tenant_id, session_id, seq, chars).await
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
        let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
        let found = sqlx::query(concat!(
            "SELECT s.id AS s_id, ",
            event_columns!(),
            " FROM sessions s LEFT JOIN LATERAL (\
                 SELECT * FROM events WHERE session_id = s.id AND seq > $3 AND seq <= $4 \
                 AND kind = ANY($5) ORDER BY seq LIMIT $6) e ON true \
             WHERE s.id = $1 AND s.tenant_id = $2 ORDER BY e.seq"
        ))
        .bind(session_id)
        .bind(tenant_id)
        .bind(after)
        .bind(up_to)
        .bind(&kinds)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        joined_events(&found)
    }

    async fn todo_events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Event>> {
        // The kinds spelled out as literals: the planner matches them to the partial index
        // `events_todos` (a bound array would not prove its predicate).
        let found = sqlx::query(concat!(
            "SELECT s.id AS s_id, ",
            event_columns!(),
            " FROM sessions s LEFT JOIN LATERAL (\
                 SELECT * FROM events WHERE session_id = s.id AND seq > $3 \
                 AND kind IN ('todo.created', 'todo.updated', 'todo.deleted') \
                 ORDER BY seq LIMIT $4) e ON true \
             WHERE s.id = $1 AND s.tenant_id = $2 ORDER BY e.seq"
        ))
        .bind(session_id)
        .bind(tenant_id)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        joined_events(&found)
    }

    fn read_records(
        &self,
        session_id: Uuid,
        up_to: i64,
    ) -> futures::stream::BoxStream<'_, Result<crate::ReadRecord>> {
        crate::reads::postgres(&self.pool, session_id, up_to)
    }

    async fn process_started(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        process_id: &str,
    ) -> Result<Option<serde_json::Value>> {
        sql::process_started(&self.pool, tenant_id, session_id, process_id).await
    }

    async fn last_process_number(&self, session_id: Uuid) -> Result<u64> {
        // The kind is a literal, so that the partial index `events_process_started`
        // (migration 0002) serves it; only well-formed ids are read as numbers.
        let n = sqlx::query_scalar::<_, i64>(
            "SELECT COALESCE(max(substr(data->>'process_id', 2)::bigint), 0) FROM events \
             WHERE session_id = $1 AND kind = 'process.started' \
             AND data->>'process_id' ~ '^p[0-9]{1,18}$'",
        )
        .bind(session_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

#[async_trait]
impl Blobs for PgStore {
    async fn put_blobs(&self, blobs: Vec<Blob>) -> Result<Vec<usize>> {
        if blobs.is_empty() {
            return Ok(Vec::new());
        }
        // Ask first which are stored: a hash costs 64 bytes, a blob up to the statement bound.
        let hashes: Vec<&str> = blobs.iter().map(|b| b.sha256.as_str()).collect();
        let stored: std::collections::HashSet<String> =
            sqlx::query_scalar::<_, String>("SELECT sha256 FROM blobs WHERE sha256 = ANY($1)")
                .bind(&hashes)
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .collect();
        let missing: Vec<Blob> = blobs
            .into_iter()
            .filter(|b| !stored.contains(&b.sha256))
            .collect();
        let mut sizes = Vec::new();
        for statement in crate::check::blob_statements(missing, self.blob_statement_bytes) {
            sqlx::query(
                "INSERT INTO blobs (sha256, size, data) \
                 SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bytea[]) \
                 ON CONFLICT (sha256) DO NOTHING",
            )
            .bind(col(&statement, |b| b.sha256.as_str()))
            .bind(col(&statement, blob_size))
            .bind(col(&statement, |b| &b.bytes[..]))
            .execute(&self.pool)
            .await?;
            sizes.push(statement.iter().map(Blob::len).sum());
        }
        Ok(sizes)
    }

    fn blob_statement_bytes(&self) -> usize {
        self.blob_statement_bytes
    }

    async fn blob(&self, sha256: &str) -> Result<Option<Vec<u8>>> {
        sql::blob(&self.pool, sha256).await
    }

    async fn blobs(&self, sha256s: &[String]) -> Result<Vec<Blob>> {
        if sha256s.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<(String, Vec<u8>)> =
            sqlx::query_as("SELECT sha256, data FROM blobs WHERE sha256 = ANY($1)")
                .bind(sha256s)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows
            .into_iter()
            .map(|(sha256, data)| Blob {
                sha256,
                bytes: data.into(),
            })
            .collect())
    }

    async fn put_blob_objects(&self, objects: &[(String, u64)]) -> Result<()> {
        if objects.is_empty() {
            return Ok(());
        }
        let hashes: Vec<&str> = objects.iter().map(|(h, _)| h.as_str()).collect();
        let sizes: Vec<i64> = objects
            .iter()
            .map(|(_, s)| i64::try_from(*s).unwrap_or(i64::MAX))
            .collect();
        sqlx::query(
            "INSERT INTO blob_objects (sha256, size) SELECT * FROM UNNEST($1::text[], $2::bigint[]) \
             ON CONFLICT (sha256) DO NOTHING",
        )
        .bind(&hashes)
        .bind(&sizes)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn blob_objects(&self, sha256s: &[String]) -> Result<Vec<String>> {
        if sha256s.is_empty() {
            return Ok(Vec::new());
        }
        Ok(sqlx::query_scalar::<_, String>(
            "SELECT sha256 FROM blob_objects WHERE sha256 = ANY($1)",
        )
        .bind(sha256s)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn invocation_output_sha256(&self, tenant_id: Uuid, id: Uuid) -> Result<Option<String>> {
        sql::invocation_output_sha256(&self.pool, tenant_id, id).await
    }
}

#[async_trait]
impl History for PgStore {
    async fn append_events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        events: Vec<NewEvent>,
        blobs: Vec<Blob>,
    ) -> Result<(i64, i64)> {
        let blobs = crate::sql::inline_blobs(self, blobs).await?;
        let mut tx = self.pool.begin().await?;
        let row = sqlx::query(
            "SELECT id, status, last_seq FROM sessions WHERE id = $1 AND tenant_id = $2 FOR UPDATE",
        )
        .bind(session_id)
        .bind(tenant_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
        let locked = rows::locked_session(&row)?;
        if locked.status != toolexec_core::SessionStatus::Active {
            return Err(StoreError::Refused {
                reason: "the session is closed".into(),
                cause: "append to a closed session".into(),
            });
        }
        let plan = plan::appended_plan(session_id, locked.last_seq, events, blobs);
        let first = locked.last_seq + 1;
        let last = plan.last_seqs.first().map_or(locked.last_seq, |(_, s)| *s);
        write_plan(&mut tx, &plan).await?;
        tx.commit().await?;
        self.forget_session(session_id);
        Ok((first, last))
    }

    async fn save_replay(&self, tenant_id: Uuid, replay: &toolexec_core::Replay) -> Result<()> {
        sql::save_replay(&self.pool, tenant_id, replay).await
    }

    async fn replay(&self, tenant_id: Uuid, id: Uuid) -> Result<toolexec_core::Replay> {
        sql::replay(&self.pool, tenant_id, id).await
    }
}

#[async_trait]
impl Approvals for PgStore {
    async fn request_approval(
        &self,
        invocation: NewInvocation,
        data: serde_json::Value,
        max_waiting: u64,
    ) -> Result<std::result::Result<i64, WriteError>> {
        let session_id = invocation.session_id;
        let mut tx = self.pool.begin().await?;
        let Some(locked) = lock_sessions(&mut tx, &[session_id]).await?.pop() else {
            return Ok(Err(WriteError::SessionNotActive));
        };
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM invocations WHERE session_id = $1 AND status = 'pending_approval'",
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
        self.forget_session(session_id);
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
        let mut tx = self.pool.begin().await?;
        let session_id: Uuid = sqlx::query_scalar(
            "SELECT i.session_id FROM invocations i JOIN sessions s ON s.id = i.session_id \
             WHERE i.id = $1 AND s.tenant_id = $2",
        )
        .bind(invocation_id)
        .bind(tenant_id)
        .fetch_optional(&mut *tx)
        .await?
        .ok_or(StoreError::NotFound)?;
        let locked = lock_sessions(&mut tx, &[session_id])
            .await?
            .pop()
            .ok_or(StoreError::NotFound)?;
        // Read under the lock: a decision made meanwhile is seen.
        let row = sqlx::query(
            "SELECT i.id, i.session_id, i.call_id, i.name, i.arguments, i.read_only, \
             i.capabilities, i.status, e.data->>'expires_at' AS expires_at \
             FROM invocations i LEFT JOIN events e \
             ON e.session_id = i.session_id AND e.seq = i.started_seq \
             AND e.kind = 'approval.requested' WHERE i.id = $1",
        )
        .bind(invocation_id)
        .fetch_one(&mut *tx)
        .await?;
        let waiting = rows::waiting(&row)?;
        let (plan, done) = match plan::decided_plan(&locked, &waiting, decided, denied) {
            Ok(p) => p,
            Err(e) => return Ok(Err(e)),
        };
        write_plan(&mut tx, &plan).await?;
        if plan.finishes.is_empty() {
            sqlx::query(
                "UPDATE invocations SET status = 'running', started_seq = $2, started_at = now(), \
                 node = $3 WHERE id = $1",
            )
            .bind(invocation_id)
            .bind(done.next_seq)
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
        self.forget_session(session_id);
        Ok(Ok(done))
    }

    async fn pending_approvals(&self, of: Waiters<'_>) -> Result<Vec<PendingApproval>> {
        const SELECT: &str = "SELECT s.tenant_id, i.session_id, i.id, \
             e.data->>'expires_at' AS expires_at \
             FROM invocations i JOIN sessions s ON s.id = i.session_id \
             LEFT JOIN events e ON e.session_id = i.session_id AND e.seq = i.started_seq \
             WHERE i.status = 'pending_approval' AND ";
        let query = match of {
            Waiters::Node(node) => sqlx::query(sqlx::AssertSqlSafe(format!("{SELECT}i.node = $1")))
                .bind(node.to_owned()),
            Waiters::Session(id) => {
                sqlx::query(sqlx::AssertSqlSafe(format!("{SELECT}i.session_id = $1"))).bind(id)
            }
        };
        query
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(rows::pending_approval)
            .collect()
    }
}

/// The events of a query that joins a tenant's session to its events (`LEFT JOIN LATERAL`):
/// `NotFound` when no row came back (no such session for this tenant), and the session's row
/// alone (no event columns) when it has no events in range.
fn joined_events(found: &[sqlx::postgres::PgRow]) -> Result<Vec<Event>> {
    if found.is_empty() {
        return Err(StoreError::NotFound);
    }
    let mut events = Vec::with_capacity(found.len());
    for row in found {
        if row.opt_int("e_seq")?.is_some() {
            events.push(rows::event(row)?);
        }
    }
    Ok(events)
}
