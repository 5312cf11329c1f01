//! Postgres backend: the production store, shared by every API replica.
//!
//! A commit is usually one round trip: a batch planned from this store's cached session state,
//! written by one statement that first checks the cache under `FOR UPDATE`
//! (`WRITE_PLAN_IF_CURRENT`). When the cache is stale (another writer moved on), the batch
//! takes the locked path, five round trips whatever its size: `BEGIN`; lock the sessions of the
//! batch (`FOR UPDATE`, in id order so that concurrent batches cannot deadlock); read the
//! invocations the batch refers to; one statement that writes everything (data-modifying CTEs
//! over `UNNEST`ed arrays: blobs, invocations, finishes, events, `last_seq`); `COMMIT`.
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
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Postgres};
use toolexec_core::{
    Event, EventKind, Invocation, Session, SessionStatus, Tenant, Truncation, new_id,
};
use uuid::Uuid;

use crate::plan::{self, Plan};
use crate::rows::{
    self, Columns, event_columns, existing_columns, invocation_columns, not_found_on_fk,
    session_columns, side_effects_where,
};
use crate::{
    Approvals, Assigned, Blob, Blobs, Calls, Decided, Events, History, Lease, Leases, NewEvent,
    NewInvocation, Nodes, Outcome, PendingApproval, Result, Retention, SessionOwner, SessionPage,
    Sessions, Store, StoreError, Tenants, Waiters, Write, WriteError,
};

/// How long a request waits for a pooled connection before the store counts as unavailable: a
/// call is refused (503) rather than left hanging when the database is down or saturated.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    cache: std::sync::Arc<std::sync::Mutex<Cache>>,
    /// Most bytes of blob contents in one statement.
    blob_statement_bytes: usize,
}

/// What this store last saw of the sessions and running invocations it wrote, so a batch can
/// usually be planned without reading the database first (see [`WRITE_PLAN_IF_CURRENT`]). Never
/// trusted on its own: a stale entry only sends the batch down the locked path.
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
        }
    }

    /// Bounds the blob contents of one statement (at least 1 byte: a larger blob goes alone).
    pub fn with_blob_statement_bytes(mut self, bytes: usize) -> Self {
        self.blob_statement_bytes = bytes.max(1);
        self
    }

    /// A plan of `batch` from cached state, with what it assumes; `None` if something the batch
    /// touches is not cached.
    fn cached_plan(&self, batch: &[Write]) -> Option<(Plan, Expected)> {
        let cache = self.cache.lock().ok()?;
        let ids = plan::session_ids(batch);
        let mut sessions = Vec::with_capacity(ids.len());
        let mut expected = Expected {
            ids: Vec::with_capacity(ids.len()),
            last_seqs: Vec::with_capacity(ids.len()),
            statuses: Vec::with_capacity(ids.len()),
        };
        for id in ids {
            let &(status, last_seq) = cache.sessions.get(&id)?;
            sessions.push(plan::LockedSession {
                id,
                status,
                last_seq,
            });
            expected.ids.push(id);
            expected.last_seqs.push(last_seq);
            expected.statuses.push(status.as_str());
        }
        let mut existing = Vec::new();
        for write in batch {
            if let Write::Finish { invocation_id, .. } = write {
                existing.push(cache.running.get(invocation_id)?.clone());
            }
        }
        drop(cache);
        Some((plan::plan(batch.to_vec(), sessions, existing), expected))
    }

    /// Remembers what a committed plan left behind: session states (`locked`, read under the
    /// locks, then the new `last_seq`s) and which invocations are now running.
    fn learn(&self, plan: &Plan, locked: &[plan::LockedSession]) {
        let Ok(mut cache) = self.cache.lock() else {
            return;
        };
        if cache.sessions.len() > CACHE_MAX {
            cache.sessions.clear();
        }
        if cache.running.len() > CACHE_MAX {
            cache.running.clear();
        }
        for l in locked {
            cache.sessions.insert(l.id, (l.status, l.last_seq));
        }
        for (id, last_seq) in &plan.last_seqs {
            if let Some(entry) = cache.sessions.get_mut(id) {
                entry.1 = *last_seq;
            }
        }
        for row in &plan.invocations {
            if row.finish.is_none() {
                let inv = &row.invocation;
                cache.running.insert(
                    inv.id,
                    plan::Existing {
                        id: inv.id,
                        session_id: inv.session_id,
                        call_id: inv.call_id.clone(),
                        name: inv.name.clone(),
                        status: toolexec_core::InvocationStatus::Running,
                        started_seq: row.started_seq,
                    },
                );
            }
        }
        for f in &plan.finishes {
            cache.running.remove(&f.id);
        }
    }

    fn forget_session(&self, id: Uuid) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.sessions.remove(&id);
        }
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

/// Locks the sessions of a batch, in id order.
async fn lock_sessions(conn: &mut PgConnection, ids: &[Uuid]) -> Result<Vec<plan::LockedSession>> {
    sqlx::query(
        "SELECT id, status, last_seq FROM sessions WHERE id = ANY($1) ORDER BY id FOR UPDATE",
    )
    .bind(ids)
    .fetch_all(conn)
    .await?
    .iter()
    .map(rows::locked_session)
    .collect()
}

/// The invocations a batch names by id or by `(session_id, call_id)`. Runs after the lock, so
/// it sees everything committed before (each statement takes a fresh snapshot).
async fn existing_invocations(
    conn: &mut PgConnection,
    batch: &[Write],
) -> Result<Vec<plan::Existing>> {
    let ids = plan::invocation_ids(batch);
    let (call_sessions, call_ids) = plan::call_keys(batch);
    sqlx::query(concat!(
        "SELECT ",
        existing_columns!(),
        " FROM invocations i WHERE i.id = ANY($1) \
         UNION ALL \
         SELECT ",
        existing_columns!(),
        " FROM UNNEST($2::uuid[], $3::text[]) AS c(session_id, call_id) \
         JOIN invocations i ON i.session_id = c.session_id AND i.call_id = c.call_id"
    ))
    .bind(ids)
    .bind(call_sessions)
    .bind(call_ids)
    .fetch_all(conn)
    .await?
    .iter()
    .map(rows::existing)
    .collect()
}

/// The parts of writing a plan in one statement. Every part is an array, empty when there is
/// nothing of its kind; data-modifying CTEs all run to completion whether or not they are
/// referenced. `$w`/`$a` guard each part (`WHERE …` after a FROM, `AND …` after a WHERE):
/// empty for the locked path, the optimistic check for the fast path.
macro_rules! write_plan_parts {
    ($w:literal, $a:literal) => {
        concat!(
            "new_blobs AS (
    INSERT INTO blobs (sha256, size, data)
    SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bytea[]) ",
            $w,
            "
    ON CONFLICT (sha256) DO NOTHING
),
new_invocations AS (
    INSERT INTO invocations (
        id, session_id, call_id, name, arguments, arguments_sha256, read_only, capabilities,
        node, status, is_error, content, truncated, output_chars, output_sha256,
        started_at, finished_at, duration_ms, started_seq, finished_seq)
    SELECT * FROM UNNEST(
        $4::uuid[], $5::uuid[], $6::text[], $7::text[], $8::jsonb[], $9::text[], $10::bool[],
        $11::jsonb[], $12::text[], $13::text[], $14::bool[], $15::text[], $16::jsonb[],
        $17::bigint[], $18::text[], $19::timestamptz[], $20::timestamptz[], $21::float8[],
        $22::bigint[], $23::bigint[]) ",
            $w,
            "
),
finished AS (
    UPDATE invocations AS i SET
        status = f.status, is_error = f.is_error, content = f.content, truncated = f.truncated,
        output_chars = f.output_chars, output_sha256 = f.output_sha256,
        finished_at = f.finished_at, duration_ms = f.duration_ms, finished_seq = f.finished_seq
    FROM UNNEST(
        $24::uuid[], $25::text[], $26::bool[], $27::text[], $28::jsonb[], $29::bigint[],
        $30::text[], $31::timestamptz[], $32::float8[], $33::bigint[])
        AS f(id, status, is_error, content, truncated, output_chars, output_sha256,
             finished_at, duration_ms, finished_seq)
    WHERE i.id = f.id ",
            $a,
            "
),
new_events AS (
    INSERT INTO events (session_id, seq, kind, invocation_id, data, created_at)
    SELECT e.*, statement_timestamp()
    FROM UNNEST($34::uuid[], $35::bigint[], $36::text[], $37::uuid[], $38::jsonb[]) AS e ",
            $w,
            "
),
bumped AS (
    UPDATE sessions AS s SET last_seq = l.last_seq
    FROM UNNEST($39::uuid[], $40::bigint[]) AS l(id, last_seq)
    WHERE s.id = l.id ",
            $a,
            "
)"
        )
    };
}

/// Writes a plan made under the session locks of the caller's transaction.
const WRITE_PLAN: &str = concat!("WITH ", write_plan_parts!("", ""), " SELECT true");

/// Writes a plan made from this store's cached session state — in one statement, so one round
/// trip and its own transaction — only if the cache was right: every session of the batch still
/// has the `last_seq` and status the plan assumed (checked under `FOR UPDATE`, so no other
/// writer can move them until this commits), no call id or invocation id it inserts exists, and
/// every invocation it finishes is still running. Otherwise it writes nothing and says `false`,
/// and the caller takes the locked path.
const WRITE_PLAN_IF_CURRENT: &str = concat!(
    "WITH locked AS MATERIALIZED (
    SELECT s.id, s.last_seq, s.status FROM sessions s
    WHERE s.id = ANY($41::uuid[]) ORDER BY s.id FOR UPDATE
),
ok AS MATERIALIZED (
    SELECT
        (SELECT count(*) FROM locked l
            JOIN UNNEST($41::uuid[], $42::bigint[], $43::text[]) AS x(id, last_seq, status)
            ON l.id = x.id AND l.last_seq = x.last_seq AND l.status = x.status)
            = cardinality($41::uuid[])
        AND NOT EXISTS (SELECT 1 FROM invocations i WHERE i.id = ANY($4::uuid[]))
        AND NOT EXISTS (
            SELECT 1 FROM UNNEST($5::uuid[], $6::text[]) AS c(session_id, call_id)
            JOIN invocations i ON i.session_id = c.session_id AND i.call_id = c.call_id)
        AND (SELECT count(*) FROM invocations i
             WHERE i.id = ANY($24::uuid[]) AND i.status = 'running')
            = cardinality($24::uuid[])
        AS ok
),
",
    write_plan_parts!("WHERE (SELECT ok FROM ok)", "AND (SELECT ok FROM ok)"),
    " SELECT ok FROM ok"
);

/// The columns that the end of an invocation sets, one array each, in `WRITE_PLAN` order. A row
/// without an end (a `Start`) is `running` with the rest NULL.
#[derive(Default)]
struct EndColumns<'a> {
    status: Vec<&'static str>,
    is_error: Vec<bool>,
    content: Vec<Option<&'a str>>,
    truncated: Vec<Option<Json<&'a Truncation>>>,
    output_chars: Vec<Option<i64>>,
    output_sha256: Vec<Option<&'a str>>,
    finished_at: Vec<Option<DateTime<Utc>>>,
    duration_ms: Vec<Option<f64>>,
    finished_seq: Vec<Option<i64>>,
}

impl<'a> EndColumns<'a> {
    fn of(ends: impl Iterator<Item = Option<&'a plan::FinishRow>>) -> Self {
        let mut cols = Self::default();
        for end in ends {
            let outcome = end.map(|f| &f.outcome);
            cols.status
                .push(outcome.map_or("running", |o| o.status.as_str()));
            cols.is_error
                .push(outcome.is_some_and(|o| o.status.is_error()));
            cols.content.push(outcome.map(|o| o.content.as_str()));
            cols.truncated
                .push(outcome.and_then(|o| o.truncated.as_ref()).map(Json));
            cols.output_chars.push(outcome.map(|o| o.output_chars));
            cols.output_sha256
                .push(outcome.and_then(|o| o.output_sha256.as_deref()));
            cols.finished_at.push(outcome.map(|o| o.finished_at));
            cols.duration_ms.push(outcome.map(|o| o.duration_ms));
            cols.finished_seq.push(end.map(|f| f.finished_seq));
        }
        cols
    }
}

/// Collects one column of `rows`.
fn col<'a, R, T>(rows: &'a [R], f: impl Fn(&'a R) -> T) -> Vec<T> {
    rows.iter().map(f).collect()
}

async fn write_plan(conn: &mut PgConnection, plan: &Plan) -> Result<()> {
    if plan.is_empty() {
        return Ok(());
    }
    bind_plan(sqlx::query_scalar::<_, bool>(WRITE_PLAN), plan)
        .fetch_one(conn)
        .await?;
    Ok(())
}

/// The session state a cached plan assumed: ids (sorted), `last_seq`s, statuses.
struct Expected {
    ids: Vec<Uuid>,
    last_seqs: Vec<i64>,
    statuses: Vec<&'static str>,
}

/// Writes a plan made from cached state if the cache was right; `false` if nothing was written.
async fn write_plan_if_current(pool: &PgPool, plan: &Plan, expected: Expected) -> Result<bool> {
    Ok(
        bind_plan(sqlx::query_scalar::<_, bool>(WRITE_PLAN_IF_CURRENT), plan)
            .bind(expected.ids)
            .bind(expected.last_seqs)
            .bind(expected.statuses)
            .fetch_one(pool)
            .await?,
    )
}

/// Binds `$1`…`$40` of the write statements.
fn bind_plan<'q>(
    query: sqlx::query::QueryScalar<'q, Postgres, bool, PgArguments>,
    plan: &'q Plan,
) -> sqlx::query::QueryScalar<'q, Postgres, bool, PgArguments> {
    let blobs = &plan.blobs;
    let invs = &plan.invocations;
    let inv_end = EndColumns::of(invs.iter().map(|r| r.finish.as_ref()));
    let fin = &plan.finishes;
    let fin_end = EndColumns::of(fin.iter().map(Some));
    let events = &plan.events;
    let (last_id, last_seq): (Vec<Uuid>, Vec<i64>) = plan.last_seqs.iter().copied().unzip();

    query
        // blobs
        .bind(col(blobs, |b| b.sha256.as_str()))
        .bind(col(blobs, blob_size))
        .bind(col(blobs, |b| &b.bytes[..]))
        // new invocations
        .bind(col(invs, |r| r.invocation.id))
        .bind(col(invs, |r| r.invocation.session_id))
        .bind(col(invs, |r| r.invocation.call_id.as_str()))
        .bind(col(invs, |r| r.invocation.name.as_str()))
        .bind(col(invs, |r| Json(&r.invocation.arguments)))
        .bind(col(invs, |r| r.invocation.arguments_sha256.as_str()))
        .bind(col(invs, |r| r.invocation.read_only))
        .bind(col(invs, |r| Json(r.invocation.capabilities.as_slice())))
        .bind(col(invs, |r| r.invocation.node.as_str()))
        .bind(col(invs, plan::InvocationRow::status))
        .bind(inv_end.is_error)
        .bind(inv_end.content)
        .bind(inv_end.truncated)
        .bind(inv_end.output_chars)
        .bind(inv_end.output_sha256)
        .bind(col(invs, |r| r.invocation.started_at))
        .bind(inv_end.finished_at)
        .bind(inv_end.duration_ms)
        .bind(col(invs, |r| r.started_seq))
        .bind(inv_end.finished_seq)
        // finishes of invocations started in earlier batches
        .bind(col(fin, |f| f.id))
        .bind(fin_end.status)
        .bind(fin_end.is_error)
        .bind(fin_end.content)
        .bind(fin_end.truncated)
        .bind(fin_end.output_chars)
        .bind(fin_end.output_sha256)
        .bind(fin_end.finished_at)
        .bind(fin_end.duration_ms)
        .bind(fin_end.finished_seq)
        // events
        .bind(col(events, |e| e.session_id))
        .bind(col(events, |e| e.seq))
        .bind(col(events, |e| e.kind.as_str()))
        .bind(col(events, |e| e.invocation_id))
        .bind(col(events, |e| Json(&e.data)))
        // sessions
        .bind(last_id)
        .bind(last_seq)
}

fn blob_size(blob: &Blob) -> i64 {
    i64::try_from(blob.bytes.len()).unwrap_or(i64::MAX)
}

/// Locks, plans and writes a batch inside the caller's transaction; returns the plan and the
/// session states read under the locks.
async fn apply(
    conn: &mut PgConnection,
    batch: Vec<Write>,
) -> Result<(Plan, Vec<plan::LockedSession>)> {
    if batch.is_empty() {
        return Ok((Plan::default(), Vec::new()));
    }
    let sessions = lock_sessions(conn, &plan::session_ids(&batch)).await?;
    let existing = existing_invocations(conn, &batch).await?;
    let plan = plan::plan(batch, sessions.clone(), existing);
    write_plan(conn, &plan).await?;
    Ok((plan, sessions))
}

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
        sqlx::query(
            "SELECT t.id, t.name FROM api_keys k JOIN tenants t ON t.id = k.tenant_id \
             WHERE k.key_sha256 = $1 AND k.revoked_at IS NULL",
        )
        .bind(key_sha256)
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(rows::tenant)
        .transpose()
    }

    async fn has_api_keys(&self) -> Result<bool> {
        // Revoked keys count: once keys exist, auth is configured, and revoking every key must
        // lock clients out rather than turn authentication off.
        Ok(
            sqlx::query_scalar::<_, bool>("SELECT EXISTS (SELECT 1 FROM api_keys)")
                .fetch_one(&self.pool)
                .await?,
        )
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
        let blobs = if blobs.iter().map(Blob::len).sum::<usize>() > self.blob_statement_bytes {
            self.put_blobs(blobs).await?;
            Vec::new()
        } else {
            blobs
        };
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
        let row = sqlx::query(concat!(
            "SELECT ",
            session_columns!(),
            " FROM sessions s WHERE s.id = $1 AND s.tenant_id = $2"
        ))
        .bind(id)
        .bind(tenant_id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::NotFound)?;
        rows::session(&row)
    }

    async fn list_sessions(
        &self,
        tenant_id: Uuid,
        before: Option<Uuid>,
        limit: u32,
        bounds: crate::pages::ByteBounds,
    ) -> Result<SessionPage> {
        let (sessions, next_before) =
            crate::pages::pg::list_sessions(&self.pool, tenant_id, before, limit, bounds).await?;
        Ok(SessionPage {
            sessions,
            next_before,
        })
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
        let first = found.first().ok_or(StoreError::NotFound)?;
        let session = rows::session(first)?;
        let mut invocations = Vec::new();
        for row in &found {
            if row.opt_uuid("i_id")?.is_some() {
                invocations.push(rows::invocation(row)?);
            }
        }
        Ok((session, invocations))
    }

    async fn call_ids(&self, session_id: Uuid, after: &str, limit: u32) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar::<_, String>(
            "SELECT call_id FROM invocations WHERE session_id = $1 AND call_id > $2 \
             ORDER BY call_id LIMIT $3",
        )
        .bind(session_id)
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?)
    }

    async fn last_call_arguments(
        &self,
        session_id: Uuid,
        name: &str,
    ) -> Result<Option<serde_json::Value>> {
        Ok(sqlx::query_scalar::<_, Json<serde_json::Value>>(
            "SELECT arguments FROM invocations WHERE session_id = $1 AND name = $2 \
             ORDER BY started_seq DESC LIMIT 1",
        )
        .bind(session_id)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?
        .map(|Json(args)| args))
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
        let row = sqlx::query(concat!(
            "SELECT ",
            invocation_columns!(),
            " FROM invocations i JOIN sessions s ON s.id = i.session_id \
             WHERE i.id = $1 AND s.tenant_id = $2"
        ))
        .bind(id)
        .bind(tenant_id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::NotFound)?;
        let invocation = rows::invocation(&row)?;
        // Side effects are written with the finish; a running invocation has none yet.
        let Some(finished_seq) = invocation.finished_seq.filter(|_| limit > 0) else {
            return Ok(invocation);
        };
        let (session_id, started_seq) = (invocation.session_id, invocation.started_seq);
        let page = sqlx::query(concat!(
            "SELECT ",
            event_columns!(),
            side_effects_where!(),
            " ORDER BY e.seq LIMIT $5"
        ))
        .bind(session_id)
        .bind(id)
        .bind(after.max(started_seq))
        .bind(finished_seq)
        .bind(i64::from(limit) + 1)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(rows::event)
        .collect::<Result<Vec<_>>>()?;
        let total: i64 = sqlx::query_scalar(concat!("SELECT count(*)", side_effects_where!()))
            .bind(session_id)
            .bind(id)
            .bind(started_seq)
            .bind(finished_seq)
            .fetch_one(&self.pool)
            .await?;
        Ok(rows::with_side_effects(invocation, page, total, limit))
    }

    async fn invocation_output(&self, tenant_id: Uuid, id: Uuid) -> Result<String> {
        let row = sqlx::query(
            "SELECT i.content, i.output_sha256, b.data FROM invocations i \
             JOIN sessions s ON s.id = i.session_id \
             LEFT JOIN blobs b ON b.sha256 = i.output_sha256 \
             WHERE i.id = $1 AND s.tenant_id = $2",
        )
        .bind(id)
        .bind(tenant_id)
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::NotFound)?;
        rows::output(
            row.opt_text("content")?,
            row.opt_text("output_sha256")?,
            row.opt_bytes("data")?,
        )
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
        Ok(
            sqlx::query_scalar::<_, Json<serde_json::Value>>(PROCESS_STARTED)
                .bind(session_id)
                .bind(tenant_id)
                .bind(process_id)
                .fetch_optional(&self.pool)
                .await?
                .map(|Json(data)| data),
        )
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
        Ok(
            sqlx::query_scalar::<_, Vec<u8>>("SELECT data FROM blobs WHERE sha256 = $1")
                .bind(sha256)
                .fetch_optional(&self.pool)
                .await?,
        )
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
        let row: Option<(Option<String>,)> = sqlx::query_as(
            "SELECT i.output_sha256 FROM invocations i JOIN sessions s ON s.id = i.session_id \
             WHERE i.id = $1 AND s.tenant_id = $2",
        )
        .bind(id)
        .bind(tenant_id)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|(sha,)| sha).ok_or(StoreError::NotFound)
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
        let blobs = if blobs.iter().map(Blob::len).sum::<usize>() > self.blob_statement_bytes {
            self.put_blobs(blobs).await?;
            Vec::new()
        } else {
            blobs
        };
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
        sqlx::query(
            "INSERT INTO replays (id, tenant_id, source_session_id, session_id, status, report, \
             created_at, finished_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (id) DO UPDATE SET status = $5, report = $6, finished_at = $8 \
             WHERE replays.tenant_id = $2",
        )
        .bind(replay.id)
        .bind(tenant_id)
        .bind(replay.source_session_id)
        .bind(replay.session_id)
        .bind(replay.status.as_str())
        .bind(Json(replay))
        .bind(replay.created_at)
        .bind(replay.finished_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn replay(&self, tenant_id: Uuid, id: Uuid) -> Result<toolexec_core::Replay> {
        let row =
            sqlx::query("SELECT status, report FROM replays WHERE id = $1 AND tenant_id = $2")
                .bind(id)
                .bind(tenant_id)
                .fetch_optional(&self.pool)
                .await?
                .ok_or(StoreError::NotFound)?;
        rows::replay(&row)
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
        let known: Option<Uuid> =
            sqlx::query_scalar("SELECT id FROM invocations WHERE session_id = $1 AND call_id = $2")
                .bind(session_id)
                .bind(&invocation.call_id)
                .fetch_optional(&mut *tx)
                .await?;
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

#[async_trait]
impl Leases for PgStore {
    async fn acquire_lease(
        &self,
        session_id: Uuid,
        node: &str,
        ttl: std::time::Duration,
    ) -> Result<Lease> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        // `prev` reads the row as it was before the statement: who held it last.
        let (taken, previous): (bool, Option<String>) = sqlx::query_as(
            "WITH prev AS (SELECT node FROM session_leases WHERE session_id = $1), \
             taken AS (\
                 INSERT INTO session_leases AS l (session_id, node, expires_at) \
                 VALUES ($1, $2, clock_timestamp() + $3 * interval '1 millisecond') \
                 ON CONFLICT (session_id) DO UPDATE SET node = $2, expires_at = excluded.expires_at \
                 WHERE l.node = $2 OR l.expires_at < clock_timestamp() \
                 RETURNING node) \
             SELECT EXISTS (SELECT 1 FROM taken), (SELECT node FROM prev)",
        )
        .bind(session_id)
        .bind(node)
        .bind(ttl_ms as f64)
        .fetch_one(&self.pool)
        .await
        .map_err(not_found_on_fk)?;
        Ok(match (taken, previous) {
            (true, previous) => Lease::Held {
                previous: previous.filter(|p| p != node),
            },
            (false, holder) => Lease::Busy {
                holder: holder.unwrap_or_default(),
            },
        })
    }

    async fn renew_leases(&self, node: &str, ttl: std::time::Duration) -> Result<Vec<Uuid>> {
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        Ok(sqlx::query_scalar(
            "UPDATE session_leases SET expires_at = clock_timestamp() + $2 * interval '1 millisecond' \
             WHERE node = $1 AND expires_at >= clock_timestamp() RETURNING session_id",
        )
        .bind(node)
        .bind(ttl_ms as f64)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn release_leases(&self, node: &str, session_ids: &[Uuid]) -> Result<()> {
        if session_ids.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "UPDATE session_leases SET expires_at = clock_timestamp() - interval '1 millisecond' \
             WHERE node = $1 AND session_id = ANY($2)",
        )
        .bind(node)
        .bind(session_ids)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

#[async_trait]
impl Nodes for PgStore {
    async fn node_heartbeat(
        &self,
        node: &str,
        address: Option<&str>,
        draining: bool,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO nodes (node, address, heartbeat_at, draining) \
             VALUES ($1, $2, clock_timestamp(), $3) \
             ON CONFLICT (node) DO UPDATE SET address = $2, heartbeat_at = clock_timestamp(), \
             draining = $3",
        )
        .bind(node)
        .bind(address)
        .bind(draining)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn remove_node(&self, node: &str) -> Result<()> {
        sqlx::query("DELETE FROM nodes WHERE node = $1")
            .bind(node)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn session_owner(
        &self,
        session_id: Uuid,
        alive_within: std::time::Duration,
    ) -> Result<Option<SessionOwner>> {
        let ms = i64::try_from(alive_within.as_millis()).unwrap_or(i64::MAX) as f64;
        let row: Option<(String, Option<String>, Option<bool>, Option<bool>)> = sqlx::query_as(
            "SELECT l.node, n.address, \
                    n.heartbeat_at > clock_timestamp() - $2 * interval '1 millisecond', \
                    n.draining \
             FROM session_leases l LEFT JOIN nodes n ON n.node = l.node \
             WHERE l.session_id = $1",
        )
        .bind(session_id)
        .bind(ms)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(node, address, alive, draining)| SessionOwner {
            node,
            address,
            alive: alive.unwrap_or(false),
            draining: draining.unwrap_or(false),
        }))
    }

    async fn invocation_session(&self, invocation_id: Uuid) -> Result<Option<Uuid>> {
        Ok(
            sqlx::query_scalar("SELECT session_id FROM invocations WHERE id = $1")
                .bind(invocation_id)
                .fetch_optional(&self.pool)
                .await?,
        )
    }
}

#[async_trait]
impl Retention for PgStore {
    async fn retention_sessions(&self) -> Result<Vec<crate::RetentionSession>> {
        let rows: Vec<(Uuid, Option<DateTime<Utc>>, Option<Uuid>)> = sqlx::query_as(
            "SELECT id, closed_at, origin_session_id FROM sessions \
             WHERE status = 'closed' OR origin_session_id IS NOT NULL",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, closed_at, origin)| crate::RetentionSession {
                id,
                closed_at,
                origin,
            })
            .collect())
    }

    async fn session_seqs(&self) -> Result<Vec<(Uuid, i64)>> {
        Ok(sqlx::query_as("SELECT id, last_seq FROM sessions")
            .fetch_all(&self.pool)
            .await?)
    }

    async fn scan_events(&self, after: Option<(Uuid, i64)>, limit: u32) -> Result<Vec<Event>> {
        let (session, seq) = after.unwrap_or((Uuid::nil(), -1));
        sqlx::query(concat!(
            "SELECT ",
            event_columns!(),
            " FROM events e WHERE (e.session_id, e.seq) > ($1, $2) \
              ORDER BY e.session_id, e.seq LIMIT $3"
        ))
        .bind(session)
        .bind(seq)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(rows::event)
        .collect()
    }

    async fn scan_output_refs(
        &self,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<crate::OutputRef>> {
        let rows: Vec<(Uuid, Uuid, String)> = sqlx::query_as(
            "SELECT id, session_id, output_sha256 FROM invocations \
             WHERE output_sha256 IS NOT NULL AND id > $1 ORDER BY id LIMIT $2",
        )
        .bind(after.unwrap_or(Uuid::nil()))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(invocation_id, session_id, sha256)| crate::OutputRef {
                invocation_id,
                session_id,
                sha256,
            })
            .collect())
    }

    async fn delete_sessions(&self, ids: &[Uuid]) -> Result<crate::Deleted> {
        let mut tx = self.pool.begin().await?;
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM sessions WHERE id = ANY($1) AND status = 'closed' ORDER BY id FOR UPDATE",
        )
        .bind(ids)
        .fetch_all(&mut *tx)
        .await?;
        if ids.is_empty() {
            return Ok(crate::Deleted::default());
        }
        sqlx::query("INSERT INTO sessions_expiring (session_id) SELECT * FROM UNNEST($1::uuid[])")
            .bind(&ids)
            .execute(&mut *tx)
            .await?;
        let mut deleted = crate::Deleted::default();
        let mut run = async |sql: &'static str| -> Result<u64> {
            Ok(sqlx::query(sql)
                .bind(&ids)
                .execute(&mut *tx)
                .await
                .map_err(crate::retention::refused_delete)?
                .rows_affected())
        };
        deleted.events = run("DELETE FROM events WHERE session_id = ANY($1)").await?;
        deleted.replays =
            run("DELETE FROM replays WHERE session_id = ANY($1) OR source_session_id = ANY($1)")
                .await?;
        run("DELETE FROM session_leases WHERE session_id = ANY($1)").await?;
        deleted.invocations = run("DELETE FROM invocations WHERE session_id = ANY($1)").await?;
        deleted.sessions = run("DELETE FROM sessions WHERE id = ANY($1)").await?;
        run("DELETE FROM sessions_expiring WHERE session_id = ANY($1)").await?;
        tx.commit().await?;
        // What the cache knew of them is gone with them.
        if let Ok(mut cache) = self.cache.lock() {
            for id in &ids {
                cache.sessions.remove(id);
            }
        }
        Ok(deleted)
    }

    async fn delete_blobs(&self, sha256s: &[String]) -> Result<u64> {
        if sha256s.is_empty() {
            return Ok(0);
        }
        let mut tx = self.pool.begin().await?;
        let inline = sqlx::query("DELETE FROM blobs WHERE sha256 = ANY($1)")
            .bind(sha256s)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        let objects = sqlx::query("DELETE FROM blob_objects WHERE sha256 = ANY($1)")
            .bind(sha256s)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(inline + objects)
    }
}

/// Which running invocations [`PgStore::interrupt`] marks.
enum Running<'a> {
    OfNode(&'a str),
    OfSession(Uuid),
}

impl PgStore {
    /// Marks running invocations `interrupted` and appends their `invocation.finished` events.
    async fn interrupt(&self, which: Running<'_>, content: &str) -> Result<u64> {
        let mut tx = self.pool.begin().await?;
        let select =
            "SELECT id, session_id, started_at FROM invocations WHERE status = 'running' AND ";
        let running = match which {
            Running::OfNode(node) => {
                sqlx::query(sqlx::AssertSqlSafe(format!("{select}node = $1")))
                    .bind(node)
                    .fetch_all(&mut *tx)
                    .await?
            }
            Running::OfSession(id) => {
                sqlx::query(sqlx::AssertSqlSafe(format!("{select}session_id = $1")))
                    .bind(id)
                    .fetch_all(&mut *tx)
                    .await?
            }
        };
        let now = Utc::now();
        let mut batch = Vec::with_capacity(running.len());
        for row in &running {
            batch.push(plan::interrupted(
                row.uuid("session_id")?,
                row.uuid("id")?,
                row.time("started_at")?,
                now,
                content,
            ));
        }
        // Re-checked under the session locks: one that finished meanwhile comes back NotRunning.
        let (plan, _) = apply(&mut tx, batch).await?;
        let results = plan.results;
        tx.commit().await?;
        if let Ok(mut cache) = self.cache.lock() {
            *cache = Cache::default();
        }
        Ok(results.iter().filter(|r| r.is_ok()).count() as u64)
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
