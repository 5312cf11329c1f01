//! Postgres's upkeep: leases and node heartbeats (which replica runs a session, and where it
//! lives), and what retention reads and deletes.
use async_trait::async_trait;
use uuid::Uuid;

use super::PgStore;
use crate::rows::not_found_on_fk;
use crate::sql::pg as sql;
use crate::{Event, Lease, Leases, Nodes, Result, Retention, SessionOwner};

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
        sql::remove_node(&self.pool, node).await
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
        sql::invocation_session(&self.pool, invocation_id).await
    }
}

#[async_trait]
impl Retention for PgStore {
    async fn retention_sessions(&self) -> Result<Vec<crate::RetentionSession>> {
        sql::retention_sessions(&self.pool).await
    }

    async fn session_seqs(&self) -> Result<Vec<(Uuid, i64)>> {
        sql::session_seqs(&self.pool).await
    }

    async fn scan_events(&self, after: Option<(Uuid, i64)>, limit: u32) -> Result<Vec<Event>> {
        sql::scan_events(&self.pool, after, limit).await
    }

    async fn scan_output_refs(
        &self,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<crate::OutputRef>> {
        sql::scan_output_refs(&self.pool, after, limit).await
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
