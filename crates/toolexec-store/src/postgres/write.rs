//! Writing a plan on Postgres, in one statement: planned from the cache and checked by the
//! statement itself (`write_plan_if_current_sql`, one statement per [`Shape`]), or planned
//! under the locks of the batch's sessions, read in id order (`WRITE_PLAN`). See the module
//! above for why.
use chrono::{DateTime, Utc};
use sqlx::postgres::PgArguments;
use sqlx::types::Json;
use sqlx::{PgConnection, PgPool, Postgres};
use toolexec_core::Truncation;
use uuid::Uuid;

use super::{CACHE_MAX, Cache, PgStore};
use crate::plan::{self, Plan};
use crate::rows::{self, existing_columns};
use crate::sql::{Running, pg as sql};
use crate::{Blob, Result, Write};

impl PgStore {
    /// A plan of `batch` from cached state, with what it assumes; `None` if something the batch
    /// touches is not cached.
    pub(super) fn cached_plan(&self, batch: &[Write]) -> Option<(Plan, Expected)> {
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
    pub(super) fn learn(&self, plan: &Plan, locked: &[plan::LockedSession]) {
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
}

/// Locks the sessions of a batch, in id order.
pub(super) async fn lock_sessions(
    conn: &mut PgConnection,
    ids: &[Uuid],
) -> Result<Vec<plan::LockedSession>> {
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

// The parts of writing a plan in one statement, one macro each. Every part is an array, empty
// when there is nothing of its kind; data-modifying CTEs all run to completion whether or not
// they are referenced. `$w` guards a part that ends in a FROM (`WHERE …`), `$a` one that ends in
// a WHERE (`AND …`): empty for the locked path, the optimistic check for the fast path.
macro_rules! blobs_part {
    ($w:literal) => {
        concat!(
            "new_blobs AS (
    INSERT INTO blobs (sha256, size, data)
    SELECT * FROM UNNEST($1::text[], $2::bigint[], $3::bytea[]) ",
            $w,
            "
    ON CONFLICT (sha256) DO NOTHING
)"
        )
    };
}

macro_rules! invocations_part {
    ($w:literal) => {
        concat!(
            "new_invocations AS (
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
)"
        )
    };
}

macro_rules! finished_part {
    ($a:literal) => {
        concat!(
            "finished AS (
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
)"
        )
    };
}

macro_rules! events_part {
    ($w:literal) => {
        concat!(
            "new_events AS (
    INSERT INTO events (session_id, seq, kind, invocation_id, data, created_at)
    SELECT e.*, statement_timestamp()
    FROM UNNEST($34::uuid[], $35::bigint[], $36::text[], $37::uuid[], $38::jsonb[]) AS e ",
            $w,
            "
)"
        )
    };
}

macro_rules! bumped_part {
    ($a:literal) => {
        concat!(
            "bumped AS (
    UPDATE sessions AS s SET last_seq = l.last_seq
    FROM UNNEST($39::uuid[], $40::bigint[]) AS l(id, last_seq)
    WHERE s.id = l.id ",
            $a,
            "
)"
        )
    };
}

/// Writes a plan made under the session locks of the caller's transaction (every part: this is
/// the rare path, taken when the cache was stale).
const WRITE_PLAN: &str = concat!(
    "WITH ",
    blobs_part!(""),
    ",\n",
    invocations_part!(""),
    ",\n",
    finished_part!(""),
    ",\n",
    events_part!(""),
    ",\n",
    bumped_part!(""),
    " SELECT true"
);

/// Which parts a plan needs beyond its events and sessions: a statement with a part whose arrays
/// are empty still sets that part up in the executor (its table, every index, the check that
/// goes with it), which measured ~30 % of Postgres's CPU for a commit of one `shell` start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape {
    pub blobs: bool,
    pub invocations: bool,
    pub finishes: bool,
}

impl Shape {
    pub(super) fn of(plan: &Plan) -> Self {
        Self {
            blobs: !plan.blobs.is_empty(),
            invocations: !plan.invocations.is_empty(),
            finishes: !plan.finishes.is_empty(),
        }
    }

    fn index(self) -> usize {
        usize::from(self.blobs)
            | (usize::from(self.invocations) << 1)
            | (usize::from(self.finishes) << 2)
    }

    fn from_index(i: usize) -> Self {
        Self {
            blobs: i & 1 != 0,
            invocations: i & 2 != 0,
            finishes: i & 4 != 0,
        }
    }
}

/// The check a plan from cached state must pass, for the parts of `shape`: every session of
/// the batch still has the `last_seq` and status the plan assumed (read under `FOR UPDATE`, so
/// no other writer can move them until this commits), no call id or invocation id it inserts
/// exists, and every invocation it finishes is still running.
fn if_current_check(shape: Shape) -> String {
    let mut ok = vec![
        "(SELECT count(*) FROM locked l
            JOIN UNNEST($41::uuid[], $42::bigint[], $43::text[]) AS x(id, last_seq, status)
            ON l.id = x.id AND l.last_seq = x.last_seq AND l.status = x.status)
            = cardinality($41::uuid[])",
    ];
    if shape.invocations {
        ok.push("NOT EXISTS (SELECT 1 FROM invocations i WHERE i.id = ANY($4::uuid[]))");
        ok.push(
            "NOT EXISTS (
            SELECT 1 FROM UNNEST($5::uuid[], $6::text[]) AS c(session_id, call_id)
            JOIN invocations i ON i.session_id = c.session_id AND i.call_id = c.call_id)",
        );
    }
    if shape.finishes {
        ok.push(
            "(SELECT count(*) FROM invocations i
             WHERE i.id = ANY($24::uuid[]) AND i.status = 'running')
            = cardinality($24::uuid[])",
        );
    }
    ok.join("\n        AND ")
}

/// Writes a plan made from this store's cached session state — in one statement, so one round
/// trip and its own transaction — only if the cache was right ([`if_current_check`]), with only
/// the parts the plan's [`Shape`] needs. Otherwise it writes nothing and says `false`, and the
/// caller takes the locked path. Each shape's statement is made once and prepared once per
/// connection (sqlx's statement cache, keyed by the text).
fn write_plan_if_current_sql(shape: Shape) -> &'static str {
    static STATEMENTS: std::sync::LazyLock<[String; 8]> = std::sync::LazyLock::new(|| {
        std::array::from_fn(|i| {
            let shape = Shape::from_index(i);
            let mut parts = Vec::with_capacity(5);
            if shape.blobs {
                parts.push(blobs_part!("WHERE (SELECT ok FROM ok)"));
            }
            if shape.invocations {
                parts.push(invocations_part!("WHERE (SELECT ok FROM ok)"));
            }
            if shape.finishes {
                parts.push(finished_part!("AND (SELECT ok FROM ok)"));
            }
            parts.push(events_part!("WHERE (SELECT ok FROM ok)"));
            parts.push(bumped_part!("AND (SELECT ok FROM ok)"));
            format!(
                "WITH locked AS MATERIALIZED (
    SELECT s.id, s.last_seq, s.status FROM sessions s
    WHERE s.id = ANY($41::uuid[]) ORDER BY s.id FOR UPDATE
),
ok AS MATERIALIZED (
    SELECT
        {}
        AS ok
),
{} SELECT ok FROM ok",
                if_current_check(shape),
                parts.join(",\n")
            )
        })
    });
    &STATEMENTS[shape.index()]
}

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
pub(super) fn col<'a, R, T>(rows: &'a [R], f: impl Fn(&'a R) -> T) -> Vec<T> {
    rows.iter().map(f).collect()
}

pub(super) async fn write_plan(conn: &mut PgConnection, plan: &Plan) -> Result<()> {
    if plan.is_empty() {
        return Ok(());
    }
    bind_plan(sqlx::query_scalar::<_, bool>(WRITE_PLAN), plan)
        .fetch_one(conn)
        .await?;
    Ok(())
}

/// The session state a cached plan assumed: ids (sorted), `last_seq`s, statuses.
pub(super) struct Expected {
    ids: Vec<Uuid>,
    last_seqs: Vec<i64>,
    statuses: Vec<&'static str>,
}

/// Writes a plan made from cached state if the cache was right; `false` if nothing was written.
pub(super) async fn write_plan_if_current(
    pool: &PgPool,
    plan: &Plan,
    expected: Expected,
) -> Result<bool> {
    Ok(bind_plan(
        sqlx::query_scalar::<_, bool>(write_plan_if_current_sql(Shape::of(plan))),
        plan,
    )
    .bind(expected.ids)
    .bind(expected.last_seqs)
    .bind(expected.statuses)
    .fetch_one(pool)
    .await?)
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

pub(super) fn blob_size(blob: &Blob) -> i64 {
    i64::try_from(blob.bytes.len()).unwrap_or(i64::MAX)
}

/// Locks, plans and writes a batch inside the caller's transaction; returns the plan and the
/// session states read under the locks.
pub(super) async fn apply(
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

impl PgStore {
    /// Marks running invocations `interrupted` and appends their `invocation.finished` events.
    pub(super) async fn interrupt(&self, which: Running<'_>, content: &str) -> Result<u64> {
        let mut tx = self.pool.begin().await?;
        let batch = sql::interruptions(&mut tx, which, content).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_shape_writes_and_checks_its_own_parts_and_no_others() {
        for i in 0..8 {
            let shape = Shape::from_index(i);
            assert_eq!(shape.index(), i);
            let sql = write_plan_if_current_sql(shape);
            assert_eq!(sql.contains("new_blobs AS"), shape.blobs, "{shape:?}");
            assert_eq!(sql.contains("new_invocations AS"), shape.invocations);
            assert_eq!(sql.contains("i.id = ANY($4::uuid[])"), shape.invocations);
            assert_eq!(sql.contains("JOIN invocations i ON"), shape.invocations);
            assert_eq!(sql.contains("finished AS"), shape.finishes);
            assert_eq!(sql.contains("status = 'running'"), shape.finishes);
            // Every statement locks and checks its sessions, appends its events, moves the
            // sessions' `last_seq`, and writes nothing unless the check passed.
            for always in [
                "FOR UPDATE",
                "= cardinality($41::uuid[])",
                "new_events AS",
                "bumped AS",
            ] {
                assert!(sql.contains(always), "{shape:?} lacks {always}");
            }
            let parts = sql.matches(" AS (\n").count();
            let guarded = sql.matches("(SELECT ok FROM ok)").count();
            assert_eq!(guarded, parts, "{shape:?}: every part is guarded");
        }
        // The shape with every part is the locked path's statement, guarded.
        let all = Shape::from_index(7);
        let unguarded = write_plan_if_current_sql(all)
            .replace("WHERE (SELECT ok FROM ok)", "")
            .replace("AND (SELECT ok FROM ok)", "");
        let parts = &WRITE_PLAN["WITH ".len()..WRITE_PLAN.len() - " SELECT true".len()];
        assert!(
            unguarded.contains(parts.trim_end()),
            "the full shape writes what WRITE_PLAN writes"
        );
    }
}
