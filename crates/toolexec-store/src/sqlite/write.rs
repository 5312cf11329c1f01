//! Writing a plan on SQLite: row by row, inside the one writer's transaction (the lock that
//! Postgres takes per session row is here the single write transaction at a time).
use chrono::{DateTime, Utc};
use sqlx::SqliteConnection;
use sqlx::types::Json;
use toolexec_core::EventKind;
use uuid::Uuid;

use super::SqliteStore;
use crate::plan::{self, Plan};
use crate::rows::{self, existing_columns};
use crate::sql::{Running, sqlite as sql};
use crate::{Assigned, Blob, Result, Write, WriteError};

/// Reads what the planner needs. No locks: the single writer connection is the lock.
async fn read_for_plan(
    conn: &mut SqliteConnection,
    batch: &[Write],
) -> Result<(Vec<plan::LockedSession>, Vec<plan::Existing>)> {
    let mut sessions = Vec::new();
    for id in plan::session_ids(batch) {
        let row = sqlx::query("SELECT id, status, last_seq FROM sessions WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(row) = row {
            sessions.push(rows::locked_session(&row)?);
        }
    }
    let mut existing = Vec::new();
    for write in batch {
        let found = match write {
            Write::Start { invocation } | Write::Record { invocation, .. } => {
                sqlx::query(concat!(
                    "SELECT ",
                    existing_columns!(),
                    " FROM invocations i \
                     WHERE (i.session_id = $1 AND i.call_id = $2) OR i.id = $3"
                ))
                .bind(invocation.session_id)
                .bind(&invocation.call_id)
                .bind(invocation.id)
                .fetch_all(&mut *conn)
                .await?
            }
            Write::Finish { invocation_id, .. } => {
                sqlx::query(concat!(
                    "SELECT ",
                    existing_columns!(),
                    " FROM invocations i WHERE i.id = $1"
                ))
                .bind(invocation_id)
                .fetch_all(&mut *conn)
                .await?
            }
        };
        for row in &found {
            existing.push(rows::existing(row)?);
        }
    }
    Ok((sessions, existing))
}

pub(super) async fn insert_blobs(
    conn: &mut SqliteConnection,
    blobs: &[Blob],
    now: DateTime<Utc>,
) -> Result<()> {
    for blob in blobs {
        sqlx::query(
            "INSERT INTO blobs (sha256, size, data, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (sha256) DO NOTHING",
        )
        .bind(&blob.sha256)
        .bind(i64::try_from(blob.len()).unwrap_or(i64::MAX))
        .bind(&blob.bytes[..])
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

pub(super) async fn write_plan(conn: &mut SqliteConnection, plan: &Plan) -> Result<()> {
    let now = Utc::now();
    insert_blobs(conn, &plan.blobs, now).await?;
    for row in &plan.invocations {
        let inv = &row.invocation;
        let outcome = row.finish.as_ref().map(|f| &f.outcome);
        sqlx::query(
            "INSERT INTO invocations (id, session_id, call_id, name, arguments, arguments_sha256, \
             read_only, capabilities, node, status, is_error, content, truncated, output_chars, \
             output_sha256, started_at, finished_at, duration_ms, started_seq, finished_seq) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
             $18, $19, $20)",
        )
        .bind(inv.id)
        .bind(inv.session_id)
        .bind(&inv.call_id)
        .bind(&inv.name)
        .bind(Json(&inv.arguments))
        .bind(&inv.arguments_sha256)
        .bind(inv.read_only)
        .bind(Json(&inv.capabilities))
        .bind(&inv.node)
        .bind(row.status())
        .bind(outcome.is_some_and(|o| o.status.is_error()))
        .bind(outcome.map(|o| o.content.as_str()))
        .bind(outcome.and_then(|o| o.truncated.as_ref()).map(Json))
        .bind(outcome.map(|o| o.output_chars))
        .bind(outcome.and_then(|o| o.output_sha256.as_deref()))
        .bind(inv.started_at)
        .bind(outcome.map(|o| o.finished_at))
        .bind(outcome.map(|o| o.duration_ms))
        .bind(row.started_seq)
        .bind(row.finish.as_ref().map(|f| f.finished_seq))
        .execute(&mut *conn)
        .await?;
    }
    for finish in &plan.finishes {
        let o = &finish.outcome;
        sqlx::query(
            "UPDATE invocations SET status = $2, is_error = $3, content = $4, truncated = $5, \
             output_chars = $6, output_sha256 = $7, finished_at = $8, duration_ms = $9, \
             finished_seq = $10 WHERE id = $1",
        )
        .bind(finish.id)
        .bind(o.status.as_str())
        .bind(o.status.is_error())
        .bind(&o.content)
        .bind(o.truncated.as_ref().map(Json))
        .bind(o.output_chars)
        .bind(o.output_sha256.as_deref())
        .bind(o.finished_at)
        .bind(o.duration_ms)
        .bind(finish.finished_seq)
        .execute(&mut *conn)
        .await?;
    }
    for event in &plan.events {
        insert_event(
            &mut *conn,
            event.session_id,
            event.seq,
            event.kind,
            event.invocation_id,
            &event.data,
            now,
        )
        .await?;
    }
    for (id, last_seq) in &plan.last_seqs {
        sqlx::query("UPDATE sessions SET last_seq = $2 WHERE id = $1")
            .bind(id)
            .bind(last_seq)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

pub(super) async fn insert_event(
    conn: &mut SqliteConnection,
    session_id: Uuid,
    seq: i64,
    kind: EventKind,
    invocation_id: Option<Uuid>,
    data: &serde_json::Value,
    created_at: DateTime<Utc>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO events (session_id, seq, kind, invocation_id, data, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(session_id)
    .bind(seq)
    .bind(kind.as_str())
    .bind(invocation_id)
    .bind(Json(data))
    .bind(created_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Plans and writes a batch inside the caller's (write) transaction.
pub(super) async fn apply(
    conn: &mut SqliteConnection,
    batch: Vec<Write>,
) -> Result<Vec<std::result::Result<Assigned, WriteError>>> {
    if batch.is_empty() {
        return Ok(Vec::new());
    }
    let (sessions, existing) = read_for_plan(conn, &batch).await?;
    let plan = plan::plan(batch, sessions, existing);
    write_plan(conn, &plan).await?;
    Ok(plan.results)
}

impl SqliteStore {
    /// Marks running invocations `interrupted` and appends their `invocation.finished` events.
    pub(super) async fn interrupt(&self, which: Running<'_>, content: &str) -> Result<u64> {
        let mut tx = self.begin().await?;
        let batch = sql::interruptions(&mut tx, which, content).await?;
        let results = apply(&mut tx, batch).await?;
        tx.commit().await?;
        Ok(results.iter().filter(|r| r.is_ok()).count() as u64)
    }
}
