//! SQLite's upkeep: leases and node heartbeats (kept in milliseconds since the epoch: SQLite
//! has no clock of its own to compare with), and what retention reads and deletes.
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use uuid::Uuid;

use super::SqliteStore;
use crate::rows::not_found_on_fk;
use crate::sql::sqlite as sql;
use crate::{Event, Lease, Leases, Nodes, Result, Retention, SessionOwner};

#[async_trait]
impl Leases for SqliteStore {
    async fn acquire_lease(&self, session_id: Uuid, node: &str, ttl: Duration) -> Result<Lease> {
        let now = Utc::now().timestamp_millis();
        let until = now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
        let mut tx = self.begin().await?;
        let previous: Option<(String, i64)> =
            sqlx::query_as("SELECT node, expires_at FROM session_leases WHERE session_id = $1")
                .bind(session_id)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some((holder, expires)) = &previous
            && holder != node
            && *expires >= now
        {
            return Ok(Lease::Busy {
                holder: holder.clone(),
            });
        }
        sqlx::query(
            "INSERT INTO session_leases (session_id, node, expires_at) VALUES ($1, $2, $3) \
             ON CONFLICT (session_id) DO UPDATE SET node = $2, expires_at = $3",
        )
        .bind(session_id)
        .bind(node)
        .bind(until)
        .execute(&mut *tx)
        .await
        .map_err(not_found_on_fk)?;
        tx.commit().await?;
        Ok(Lease::Held {
            previous: previous.map(|(n, _)| n).filter(|n| n != node),
        })
    }

    async fn renew_leases(&self, node: &str, ttl: Duration) -> Result<Vec<Uuid>> {
        let until = Utc::now()
            .timestamp_millis()
            .saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
        let mut tx = self.begin().await?;
        let renewed: Vec<Uuid> = sqlx::query_scalar(
            "UPDATE session_leases SET expires_at = $2 WHERE node = $1 AND expires_at >= $3 \
             RETURNING session_id",
        )
        .bind(node)
        .bind(until)
        .bind(Utc::now().timestamp_millis())
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(renewed)
    }

    async fn release_leases(&self, node: &str, session_ids: &[Uuid]) -> Result<()> {
        if session_ids.is_empty() {
            return Ok(());
        }
        let mut tx = self.begin().await?;
        for id in session_ids {
            sqlx::query(
                "UPDATE session_leases SET expires_at = $3 WHERE node = $1 AND session_id = $2",
            )
            .bind(node)
            .bind(id)
            .bind(Utc::now().timestamp_millis() - 1)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

#[async_trait]
impl Nodes for SqliteStore {
    async fn node_heartbeat(
        &self,
        node: &str,
        address: Option<&str>,
        draining: bool,
    ) -> Result<()> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO nodes (node, address, heartbeat_at, draining) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (node) DO UPDATE SET address = $2, heartbeat_at = $3, draining = $4",
        )
        .bind(node)
        .bind(address)
        .bind(Utc::now().timestamp_millis())
        .bind(draining)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn remove_node(&self, node: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        sql::remove_node(&mut *tx, node).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn session_owner(
        &self,
        session_id: Uuid,
        alive_within: Duration,
    ) -> Result<Option<SessionOwner>> {
        let since = Utc::now()
            .timestamp_millis()
            .saturating_sub(i64::try_from(alive_within.as_millis()).unwrap_or(i64::MAX));
        let row: Option<(String, Option<String>, Option<i64>, Option<bool>)> = sqlx::query_as(
            "SELECT l.node, n.address, n.heartbeat_at, n.draining \
             FROM session_leases l LEFT JOIN nodes n ON n.node = l.node \
             WHERE l.session_id = $1",
        )
        .bind(session_id)
        .fetch_optional(&self.reader)
        .await?;
        Ok(
            row.map(|(node, address, heartbeat, draining)| SessionOwner {
                node,
                address,
                alive: heartbeat.is_some_and(|at| at > since),
                draining: draining.unwrap_or(false),
            }),
        )
    }

    async fn invocation_session(&self, invocation_id: Uuid) -> Result<Option<Uuid>> {
        sql::invocation_session(&self.reader, invocation_id).await
    }
}

#[async_trait]
impl Retention for SqliteStore {
    async fn retention_sessions(&self) -> Result<Vec<crate::RetentionSession>> {
        sql::retention_sessions(&self.reader).await
    }

    async fn session_seqs(&self) -> Result<Vec<(Uuid, i64)>> {
        sql::session_seqs(&self.reader).await
    }

    async fn scan_events(&self, after: Option<(Uuid, i64)>, limit: u32) -> Result<Vec<Event>> {
        sql::scan_events(&self.reader, after, limit).await
    }

    async fn scan_output_refs(
        &self,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<crate::OutputRef>> {
        sql::scan_output_refs(&self.reader, after, limit).await
    }

    async fn delete_sessions(&self, ids: &[Uuid]) -> Result<crate::Deleted> {
        let mut tx = self.begin().await?;
        let mut closed = Vec::with_capacity(ids.len());
        for id in ids {
            let hit: Option<Uuid> =
                sqlx::query_scalar("SELECT id FROM sessions WHERE id = $1 AND status = 'closed'")
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
            closed.extend(hit);
        }
        let mut deleted = crate::Deleted::default();
        for id in &closed {
            sqlx::query("INSERT INTO sessions_expiring (session_id) VALUES ($1)")
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        // Children before parents: a session's origin must still exist when it is deleted
        // (SQLite checks each statement's foreign keys as it ends).
        for id in &closed {
            let mut run = async |sql: &'static str| -> Result<u64> {
                Ok(sqlx::query(sql)
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .map_err(crate::retention::refused_delete)?
                    .rows_affected())
            };
            deleted.events += run("DELETE FROM events WHERE session_id = $1").await?;
            deleted.replays +=
                run("DELETE FROM replays WHERE session_id = $1 OR source_session_id = $1").await?;
            run("DELETE FROM session_leases WHERE session_id = $1").await?;
            deleted.invocations += run("DELETE FROM invocations WHERE session_id = $1").await?;
            run("DELETE FROM sessions_expiring WHERE session_id = $1").await?;
        }
        // All sessions in one statement: forks among them refer to each other.
        for id in &closed {
            sqlx::query("UPDATE sessions SET origin_session_id = NULL WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        for id in &closed {
            deleted.sessions += sqlx::query("DELETE FROM sessions WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(crate::retention::refused_delete)?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(deleted)
    }

    async fn delete_blobs(&self, sha256s: &[String]) -> Result<u64> {
        let mut tx = self.begin().await?;
        let mut n = 0;
        for sha256 in sha256s {
            for sql in [
                "DELETE FROM blobs WHERE sha256 = $1",
                "DELETE FROM blob_objects WHERE sha256 = $1",
            ] {
                n += sqlx::query(sql)
                    .bind(sha256)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
            }
        }
        tx.commit().await?;
        Ok(n)
    }
}
