//! [`crate::Events::read_records`] for both backends: the events a session's read-state is
//! folded from, newest first, one row at a time.
//!
//! Each query repeats, word for word, the predicate of the partial index `events_reads`
//! (migration 0009), which is how both planners know the index holds every row asked for: the
//! fold reads the session's reads and rewinds, never the rest of its log.
use futures::stream::{BoxStream, StreamExt};
use toolexec_core::FileRead;
use uuid::Uuid;

use crate::rows::Columns;
use crate::{ReadRecord, Result, StoreError};

/// The query on Postgres (`$1` session, `$2` up to seq), public for plan tests.
pub const POSTGRES: &str = "SELECT seq, kind, data->'reads' AS reads, \
     (data->>'to_seq')::bigint AS to_seq FROM events \
     WHERE session_id = $1 AND seq <= $2 \
     AND (kind = 'workspace.rewound' OR (kind = 'invocation.finished' AND data ? 'reads')) \
     ORDER BY seq DESC";

/// The query on SQLite, which must use the index (`INDEXED BY` fails it otherwise).
pub const SQLITE: &str = "SELECT seq, kind, json_extract(data, '$.reads') AS reads, \
     json_extract(data, '$.to_seq') AS to_seq FROM events INDEXED BY events_reads \
     WHERE session_id = $1 AND seq <= $2 \
     AND (kind = 'workspace.rewound' \
       OR (kind = 'invocation.finished' AND json_type(data, '$.reads') IS NOT NULL)) \
     ORDER BY seq DESC";

pub(crate) fn postgres(
    pool: &sqlx::PgPool,
    session_id: Uuid,
    up_to: i64,
) -> BoxStream<'_, Result<ReadRecord>> {
    sqlx::query(POSTGRES)
        .bind(session_id)
        .bind(up_to)
        .fetch(pool)
        .map(|row| record(&row?))
        .boxed()
}

pub(crate) fn sqlite(
    pool: &sqlx::SqlitePool,
    session_id: Uuid,
    up_to: i64,
) -> BoxStream<'_, Result<ReadRecord>> {
    sqlx::query(SQLITE)
        .bind(session_id)
        .bind(up_to)
        .fetch(pool)
        .map(|row| record(&row?))
        .boxed()
}

/// One row as a [`ReadRecord`]; a row this binary cannot read is [`StoreError::Corrupt`] (the
/// rows after it still come).
fn record(row: &impl Columns) -> Result<ReadRecord> {
    let seq = row.int("seq")?;
    if row.text("kind")? == "workspace.rewound" {
        let to_seq = row.opt_int("to_seq")?.ok_or_else(|| {
            StoreError::Corrupt(format!("workspace.rewound at seq {seq} has no to_seq"))
        })?;
        return Ok(ReadRecord::Rewound { seq, to_seq });
    }
    let reads: Vec<FileRead> = row
        .opt_json("reads")
        .map_err(|e| StoreError::Corrupt(format!("the reads of the event at seq {seq}: {e}")))?
        .unwrap_or_default();
    Ok(ReadRecord::Reads { seq, reads })
}
