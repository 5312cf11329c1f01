//! The statements both backends run alike, written once.
//!
//! Most of the store's SQL is the same text on Postgres and on SQLite; what differs is the
//! executor it runs on (a pool, a reader, a transaction) and, elsewhere, the dialect. `alike!`
//! holds the statements that read the same on both, with their binds and row decoding, and
//! expands them for each backend's types into [`pg`] and [`sqlite`] — as [`crate::rows`]
//! decodes both backends' rows with one `Columns` trait — so that a backend method whose SQL is
//! the other's is one call, and the two cannot drift apart. What differs (locks, `LATERAL`
//! joins, `INDEXED BY`, array parameters, time arithmetic) stays in each backend's module.
use uuid::Uuid;

use crate::{Blob, Blobs, Result};

/// Which running invocations an interruption marks.
pub(crate) enum Running<'a> {
    /// Those a node runs (at its start-up: what it ran before is gone).
    OfNode(&'a str),
    /// Those of one session (taken over from a node that is gone).
    OfSession(Uuid),
}

/// The blobs to write inline with a session's events, or none once stored apart
/// ([`Blobs::put_blobs`]) because together they exceed the store's statement bound.
pub(crate) async fn inline_blobs<S: Blobs + ?Sized>(
    store: &S,
    blobs: Vec<Blob>,
) -> Result<Vec<Blob>> {
    if blobs.iter().map(Blob::len).sum::<usize>() <= store.blob_statement_bytes() {
        return Ok(blobs);
    }
    store.put_blobs(blobs).await?;
    Ok(Vec::new())
}

/// The statements alike on both backends, for a backend's `Database` type, its connection type
/// (statements that must share one: a page and its count) and the text of its
/// `process.started` lookup (which names its index differently).
macro_rules! alike {
    ($db:ty, $conn:ty, $process_started:expr) => {
        use chrono::{DateTime, Utc};
        use sqlx::types::Json;
        use toolexec_core::{Event, Invocation, Replay, Session, Tenant};
        use uuid::Uuid;

        use crate::rows::{
            self, Columns, event_columns, invocation_columns, session_columns, side_effects_where,
        };
        use crate::sql::Running;
        use crate::{OutputRef, Result, RetentionSession, StoreError, Write};

        /// An executor of this backend: a pool, a connection, a transaction.
        pub trait Exec<'c>: sqlx::Executor<'c, Database = $db> {}
        impl<'c, E: sqlx::Executor<'c, Database = $db>> Exec<'c> for E {}

        pub async fn tenant_for_key(e: impl Exec<'_>, key_sha256: &str) -> Result<Option<Tenant>> {
            sqlx::query(
                "SELECT t.id AS id, t.name AS name FROM api_keys k \
                 JOIN tenants t ON t.id = k.tenant_id \
                 WHERE k.key_sha256 = $1 AND k.revoked_at IS NULL",
            )
            .bind(key_sha256)
            .fetch_optional(e)
            .await?
            .as_ref()
            .map(rows::tenant)
            .transpose()
        }

        pub async fn has_api_keys(e: impl Exec<'_>) -> Result<bool> {
            // Revoked keys count: once keys exist, auth is configured, and revoking every key
            // must lock clients out rather than turn authentication off.
            Ok(
                sqlx::query_scalar::<_, bool>("SELECT EXISTS (SELECT 1 FROM api_keys)")
                    .fetch_one(e)
                    .await?,
            )
        }

        /// A session of this tenant; `None` for another tenant's or none.
        pub async fn session(
            e: impl Exec<'_>,
            tenant_id: Uuid,
            id: Uuid,
        ) -> Result<Option<Session>> {
            sqlx::query(concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions s WHERE s.id = $1 AND s.tenant_id = $2"
            ))
            .bind(id)
            .bind(tenant_id)
            .fetch_optional(e)
            .await?
            .as_ref()
            .map(rows::session)
            .transpose()
        }

        pub async fn call_ids(
            e: impl Exec<'_>,
            session_id: Uuid,
            after: &str,
            limit: u32,
        ) -> Result<Vec<String>> {
            Ok(sqlx::query_scalar::<_, String>(
                "SELECT call_id FROM invocations WHERE session_id = $1 AND call_id > $2 \
                 ORDER BY call_id LIMIT $3",
            )
            .bind(session_id)
            .bind(after)
            .bind(i64::from(limit))
            .fetch_all(e)
            .await?)
        }

        /// The invocation of a call id in a session, if it has one.
        pub async fn call_invocation(
            e: impl Exec<'_>,
            session_id: Uuid,
            call_id: &str,
        ) -> Result<Option<Uuid>> {
            Ok(sqlx::query_scalar(
                "SELECT id FROM invocations WHERE session_id = $1 AND call_id = $2",
            )
            .bind(session_id)
            .bind(call_id)
            .fetch_optional(e)
            .await?)
        }

        pub async fn last_call_arguments(
            e: impl Exec<'_>,
            session_id: Uuid,
            name: &str,
        ) -> Result<Option<serde_json::Value>> {
            Ok(sqlx::query_scalar::<_, Json<serde_json::Value>>(
                "SELECT arguments FROM invocations WHERE session_id = $1 AND name = $2 \
                 AND status NOT IN ('pending_approval', 'invalid_arguments', 'unknown_tool', \
                 'denied') ORDER BY started_seq DESC LIMIT 1",
            )
            .bind(session_id)
            .bind(name)
            .fetch_optional(e)
            .await?
            .map(|Json(args)| args))
        }

        /// An invocation and a page of its side effects, three statements on one connection
        /// (a read transaction where the backend wants one snapshot).
        pub async fn invocation_page(
            conn: &mut $conn,
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
            .fetch_optional(&mut *conn)
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
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(rows::event)
            .collect::<Result<Vec<_>>>()?;
            let total: i64 = sqlx::query_scalar(concat!("SELECT count(*)", side_effects_where!()))
                .bind(session_id)
                .bind(id)
                .bind(started_seq)
                .bind(finished_seq)
                .fetch_one(&mut *conn)
                .await?;
            Ok(rows::with_side_effects(invocation, page, total, limit))
        }

        pub async fn invocation_output(
            e: impl Exec<'_>,
            tenant_id: Uuid,
            id: Uuid,
        ) -> Result<String> {
            let row = sqlx::query(
                "SELECT i.content AS content, i.output_sha256 AS output_sha256, b.data AS data \
                 FROM invocations i JOIN sessions s ON s.id = i.session_id \
                 LEFT JOIN blobs b ON b.sha256 = i.output_sha256 \
                 WHERE i.id = $1 AND s.tenant_id = $2",
            )
            .bind(id)
            .bind(tenant_id)
            .fetch_optional(e)
            .await?
            .ok_or(StoreError::NotFound)?;
            rows::output(
                row.opt_text("content")?,
                row.opt_text("output_sha256")?,
                row.opt_bytes("data")?,
            )
        }

        pub async fn invocation_output_sha256(
            e: impl Exec<'_>,
            tenant_id: Uuid,
            id: Uuid,
        ) -> Result<Option<String>> {
            let row: Option<(Option<String>,)> = sqlx::query_as(
                "SELECT i.output_sha256 FROM invocations i JOIN sessions s ON s.id = i.session_id \
                 WHERE i.id = $1 AND s.tenant_id = $2",
            )
            .bind(id)
            .bind(tenant_id)
            .fetch_optional(e)
            .await?;
            row.map(|(sha,)| sha).ok_or(StoreError::NotFound)
        }

        pub async fn invocation_session(
            e: impl Exec<'_>,
            invocation_id: Uuid,
        ) -> Result<Option<Uuid>> {
            Ok(
                sqlx::query_scalar("SELECT session_id FROM invocations WHERE id = $1")
                    .bind(invocation_id)
                    .fetch_optional(e)
                    .await?,
            )
        }

        pub async fn process_started(
            e: impl Exec<'_>,
            tenant_id: Uuid,
            session_id: Uuid,
            process_id: &str,
        ) -> Result<Option<serde_json::Value>> {
            Ok(
                sqlx::query_scalar::<_, Json<serde_json::Value>>($process_started)
                    .bind(session_id)
                    .bind(tenant_id)
                    .bind(process_id)
                    .fetch_optional(e)
                    .await?
                    .map(|Json(data)| data),
            )
        }

        pub async fn blob(e: impl Exec<'_>, sha256: &str) -> Result<Option<Vec<u8>>> {
            Ok(
                sqlx::query_scalar::<_, Vec<u8>>("SELECT data FROM blobs WHERE sha256 = $1")
                    .bind(sha256)
                    .fetch_optional(e)
                    .await?,
            )
        }

        pub async fn save_replay(e: impl Exec<'_>, tenant_id: Uuid, replay: &Replay) -> Result<()> {
            sqlx::query(
                "INSERT INTO replays (id, tenant_id, source_session_id, session_id, status, \
                 report, created_at, finished_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
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
            .execute(e)
            .await?;
            Ok(())
        }

        pub async fn replay(e: impl Exec<'_>, tenant_id: Uuid, id: Uuid) -> Result<Replay> {
            let row =
                sqlx::query("SELECT status, report FROM replays WHERE id = $1 AND tenant_id = $2")
                    .bind(id)
                    .bind(tenant_id)
                    .fetch_optional(e)
                    .await?
                    .ok_or(StoreError::NotFound)?;
            rows::replay(&row)
        }

        pub async fn remove_node(e: impl Exec<'_>, node: &str) -> Result<()> {
            sqlx::query("DELETE FROM nodes WHERE node = $1")
                .bind(node)
                .execute(e)
                .await?;
            Ok(())
        }

        pub async fn retention_sessions(e: impl Exec<'_>) -> Result<Vec<RetentionSession>> {
            let rows: Vec<(Uuid, Option<DateTime<Utc>>, Option<Uuid>)> = sqlx::query_as(
                "SELECT id, closed_at, origin_session_id FROM sessions \
                 WHERE status = 'closed' OR origin_session_id IS NOT NULL",
            )
            .fetch_all(e)
            .await?;
            Ok(rows
                .into_iter()
                .map(|(id, closed_at, origin)| RetentionSession {
                    id,
                    closed_at,
                    origin,
                })
                .collect())
        }

        pub async fn session_seqs(e: impl Exec<'_>) -> Result<Vec<(Uuid, i64)>> {
            Ok(sqlx::query_as("SELECT id, last_seq FROM sessions")
                .fetch_all(e)
                .await?)
        }

        pub async fn scan_events(
            e: impl Exec<'_>,
            after: Option<(Uuid, i64)>,
            limit: u32,
        ) -> Result<Vec<Event>> {
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
            .fetch_all(e)
            .await?
            .iter()
            .map(rows::event)
            .collect()
        }

        pub async fn scan_output_refs(
            e: impl Exec<'_>,
            after: Option<Uuid>,
            limit: u32,
        ) -> Result<Vec<OutputRef>> {
            let rows: Vec<(Uuid, Uuid, String)> = sqlx::query_as(
                "SELECT id, session_id, output_sha256 FROM invocations \
                 WHERE output_sha256 IS NOT NULL AND id > $1 ORDER BY id LIMIT $2",
            )
            .bind(after.unwrap_or(Uuid::nil()))
            .bind(i64::from(limit))
            .fetch_all(e)
            .await?;
            Ok(rows
                .into_iter()
                .map(|(invocation_id, session_id, sha256)| OutputRef {
                    invocation_id,
                    session_id,
                    sha256,
                })
                .collect())
        }

        /// The writes that mark `which` invocations, running now, `interrupted` (the caller
        /// commits them under the session locks: one that finished meanwhile is refused then).
        pub async fn interruptions(
            conn: &mut $conn,
            which: Running<'_>,
            content: &str,
        ) -> Result<Vec<Write>> {
            let select =
                "SELECT id, session_id, started_at FROM invocations WHERE status = 'running' AND ";
            let running = match which {
                Running::OfNode(node) => {
                    sqlx::query(sqlx::AssertSqlSafe(format!("{select}node = $1")))
                        .bind(node)
                        .fetch_all(&mut *conn)
                        .await?
                }
                Running::OfSession(id) => {
                    sqlx::query(sqlx::AssertSqlSafe(format!("{select}session_id = $1")))
                        .bind(id)
                        .fetch_all(&mut *conn)
                        .await?
                }
            };
            let now = Utc::now();
            let mut batch = Vec::with_capacity(running.len());
            for row in &running {
                batch.push(crate::plan::interrupted(
                    row.uuid("session_id")?,
                    row.uuid("id")?,
                    row.time("started_at")?,
                    now,
                    content,
                ));
            }
            Ok(batch)
        }
    };
}

/// The shared statements on Postgres.
pub(crate) mod pg {
    alike!(
        sqlx::Postgres,
        sqlx::PgConnection,
        crate::postgres::PROCESS_STARTED
    );
}

/// The shared statements on SQLite.
pub(crate) mod sqlite {
    alike!(
        sqlx::Sqlite,
        sqlx::SqliteConnection,
        crate::sqlite::PROCESS_STARTED
    );
}
