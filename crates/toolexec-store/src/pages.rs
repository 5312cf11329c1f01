//! Pages bounded in bytes: a session's events and a tenant's sessions, read so that the service
//! never holds more of them than a page may show.
//!
//! A page walks its rows in order in one recursive query, summing the size of each row's JSON
//! text as the database holds it (`octet_length`), and stops before the row that would take it
//! over its bound (that row comes too, marked as not fitting: the caller knows more follow).
//! Only the rows that fit come back with their text; one larger than a page may
//! show whole comes without it (its size only): the caller shows its beginning
//! ([`crate::Events::event_text`] with a number of characters,
//! [`crate::Sessions::session_excerpt`]), which the database cuts before sending it. Event seqs are gapless, so the walk steps from seq
//! to seq; sessions step to the next older id of the tenant, one index probe each.
//!
//! What the database itself holds meanwhile is its own: Postgres on its server; SQLite in this
//! process, where a search that steps onto a row of the events table (keyed without a rowid)
//! reads that row whole — the SQLite store makes these reads on one connection of their own.
use chrono::{DateTime, Utc};
use sqlx::Row;
use toolexec_core::{EventKind, Session};
use uuid::Uuid;

use crate::Result;
use crate::rows::{self, Columns};

/// How much a page may hold, in bytes of JSON text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteBounds {
    /// Most bytes the rows of a page cost in all (the first row comes whatever it costs).
    pub max_bytes: u64,
    /// A row whose JSON text is larger comes without it and costs `excerpt_bytes` instead.
    pub inline_bytes: u64,
    /// What a row over `inline_bytes` costs: the most its excerpt takes.
    pub excerpt_bytes: u64,
    /// Added to the cost of every row: what the page shows besides the text (ids, times).
    pub overhead_bytes: u64,
}

impl ByteBounds {
    /// No bound: every row whole.
    pub const UNBOUNDED: ByteBounds = ByteBounds {
        max_bytes: i64::MAX as u64,
        inline_bytes: i64::MAX as u64,
        excerpt_bytes: 0,
        overhead_bytes: 0,
    };

    fn binds(self) -> [i64; 4] {
        let i = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        [
            i(self.inline_bytes),
            i(self.excerpt_bytes),
            i(self.overhead_bytes),
            i(self.max_bytes),
        ]
    }
}

/// An event with its data as the JSON text the store holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventText {
    pub session_id: Uuid,
    pub seq: i64,
    pub kind: EventKind,
    pub invocation_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    /// Bytes of the data's JSON text.
    pub data_bytes: u64,
    /// The data's JSON text, or its beginning when fewer characters were asked for; `None` in a
    /// page when it is over the page's `inline_bytes`.
    pub data: Option<String>,
}

impl EventText {
    /// Whether `data` is the whole text.
    pub fn is_whole(&self) -> bool {
        self.data
            .as_ref()
            .is_some_and(|d| d.len() as u64 == self.data_bytes)
    }
}

/// A page of events ([`crate::Events::event_texts`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventTexts {
    pub events: Vec<EventText>,
    /// The bound stopped the page before the next event (it is there, and did not fit).
    pub more: bool,
}

/// A session of a page of sessions.
#[derive(Debug, Clone, PartialEq)]
pub enum Listed {
    Whole(Box<Session>),
    /// Over the page's `inline_bytes`: `bytes` of JSON text in `tools`, `policy`, `env` and
    /// `metadata` together.
    Over {
        id: Uuid,
        bytes: u64,
    },
}

impl Listed {
    pub fn id(&self) -> Uuid {
        match self {
            Listed::Whole(s) => s.id,
            Listed::Over { id, .. } => *id,
        }
    }
}

/// The cost of the walk's row `w` (`$i` inline, `$e` excerpt, `$o` overhead).
macro_rules! cost {
    ($i:literal, $e:literal, $o:literal) => {
        concat!(
            "(CASE WHEN w.size <= ",
            $i,
            " THEN w.size ELSE ",
            $e,
            " END + ",
            $o,
            ")"
        )
    };
}

/// `$1` session, `$2` tenant, `$3` after, `$4` limit, `$5` inline, `$6` excerpt, `$7` overhead,
/// `$8` max. No row at all: no such session for this tenant; one with a null seq: an empty page.
const PG_EVENT_WALK: &str = concat!(
    "WITH RECURSIVE walk(seq, size, total, n) AS (\
         SELECT e.seq, octet_length(e.data::text)::bigint, 0::bigint, 1::bigint FROM events e \
          WHERE e.session_id = $1 \
            AND EXISTS (SELECT 1 FROM sessions WHERE id = $1 AND tenant_id = $2) \
            AND e.seq = (SELECT min(seq) FROM events WHERE session_id = $1 AND seq > $3) \
       UNION ALL \
         SELECT e.seq, octet_length(e.data::text)::bigint, w.total + ",
    cost!("$5", "$6", "$7"),
    ", w.n + 1 FROM walk w JOIN events e ON e.session_id = $1 AND e.seq = w.seq + 1 \
          WHERE w.n < $4 AND (w.n = 1 OR w.total + ",
    cost!("$5", "$6", "$7"),
    " <= $8)), \
     page AS (SELECT w.seq, w.size, (w.n = 1 OR w.total + ",
    cost!("$5", "$6", "$7"),
    " <= $8) AS fits FROM walk w) \
     SELECT p.seq AS e_seq, p.size AS e_size, p.fits AS e_fits, e.kind AS e_kind, \
            e.invocation_id AS e_invocation_id, e.created_at AS e_created_at, \
            CASE WHEN p.fits AND p.size <= $5 THEN e.data::text END AS e_text \
       FROM sessions s \
       LEFT JOIN (page p JOIN events e ON e.session_id = $1 AND e.seq = p.seq) ON true \
      WHERE s.id = $1 AND s.tenant_id = $2 \
      ORDER BY p.seq"
);

/// `$1` session, `$2` after, `$3` limit, `$4` inline, `$5` excerpt, `$6` overhead, `$7` max
/// (the tenant is checked first, in the same read transaction).
const SQLITE_EVENT_WALK: &str = concat!(
    "WITH RECURSIVE walk(seq, size, total, n) AS (\
         SELECT e.seq, octet_length(e.data), 0, 1 FROM events e \
          WHERE e.session_id = $1 \
            AND e.seq = (SELECT min(seq) FROM events WHERE session_id = $1 AND seq > $2) \
       UNION ALL \
         SELECT e.seq, octet_length(e.data), w.total + ",
    cost!("$4", "$5", "$6"),
    ", w.n + 1 FROM walk w JOIN events e ON e.session_id = $1 AND e.seq = w.seq + 1 \
          WHERE w.n < $3 AND (w.n = 1 OR w.total + ",
    cost!("$4", "$5", "$6"),
    " <= $7)), \
     page AS (SELECT w.seq, w.size, (w.n = 1 OR w.total + ",
    cost!("$4", "$5", "$6"),
    " <= $7) AS fits FROM walk w) \
     SELECT p.seq AS e_seq, p.size AS e_size, p.fits AS e_fits, e.kind AS e_kind, \
            e.invocation_id AS e_invocation_id, e.created_at AS e_created_at, \
            CASE WHEN p.fits AND p.size <= $4 THEN e.data END AS e_text \
       FROM page p JOIN events e ON e.session_id = $1 AND e.seq = p.seq \
      ORDER BY p.seq"
);

/// `$1` session, `$2` tenant, `$3` seq, `$4` characters (`i32::MAX`: all).
const PG_EVENT_TEXT: &str = "SELECT e.seq AS e_seq, octet_length(e.data::text)::bigint AS e_size, \
            true AS e_fits, e.kind AS e_kind, e.invocation_id AS e_invocation_id, \
            e.created_at AS e_created_at, left(e.data::text, $4) AS e_text \
       FROM sessions s LEFT JOIN events e ON e.session_id = s.id AND e.seq = $3 \
      WHERE s.id = $1 AND s.tenant_id = $2";

/// `$1` session, `$2` seq, `$3` characters (null: all).
const SQLITE_EVENT_TEXT: &str = "SELECT e.seq AS e_seq, octet_length(e.data) AS e_size, \
            1 AS e_fits, e.kind AS e_kind, e.invocation_id AS e_invocation_id, \
            e.created_at AS e_created_at, \
            CASE WHEN $3 IS NULL THEN e.data ELSE substr(e.data, 1, $3) END AS e_text \
       FROM events e WHERE e.session_id = $1 AND e.seq = $2";

/// The JSON text of a session's rows that a page shows: `tools`, `policy`, `env`, `metadata`.
macro_rules! session_size {
    (pg) => {
        "(coalesce(octet_length(s.tools::text), 4) + octet_length(s.policy::text) \
          + octet_length(s.env::text) + octet_length(s.metadata::text))::bigint"
    };
    (sqlite) => {
        "(coalesce(octet_length(s.tools), 4) + octet_length(s.policy) + octet_length(s.env) \
          + octet_length(s.metadata))"
    };
}

/// The columns of a listed session: all of them when it fits whole, else its id and size.
macro_rules! listed_columns {
    () => {
        "w.size AS w_size, (w.n = 1 OR w.total + (CASE WHEN w.size <= $4 THEN w.size ELSE $5 END \
         + $6) <= $7) AS w_fits, \
         s.id AS s_id, s.tenant_id AS s_tenant_id, s.status AS s_status, \
         CASE WHEN w.size <= $4 THEN s.tools END AS s_tools, \
         CASE WHEN w.size <= $4 THEN s.policy END AS s_policy, \
         CASE WHEN w.size <= $4 THEN s.env END AS s_env, \
         CASE WHEN w.size <= $4 THEN s.metadata END AS s_metadata, \
         s.last_seq AS s_last_seq, s.created_at AS s_created_at, s.closed_at AS s_closed_at, \
         s.origin_kind AS s_origin_kind, s.origin_session_id AS s_origin_session_id, \
         s.origin_seq AS s_origin_seq, s.environment AS s_environment"
    };
}

/// `$1` tenant, `$2` before (exclusive), `$3` limit, `$4` inline, `$5` excerpt, `$6` overhead,
/// `$7` max. Newest first.
macro_rules! session_walk {
    ($backend:tt, $one:literal, $zero:literal) => {
        concat!(
            "WITH RECURSIVE walk(id, size, total, n) AS (\
                 SELECT s.id, ",
            session_size!($backend),
            ", ",
            $zero,
            ", ",
            $one,
            " FROM sessions s \
                  WHERE s.id = (SELECT id FROM sessions WHERE tenant_id = $1 AND id < $2 \
                                 ORDER BY id DESC LIMIT 1) \
               UNION ALL \
                 SELECT s.id, ",
            session_size!($backend),
            ", w.total + ",
            cost!("$4", "$5", "$6"),
            ", w.n + 1 FROM walk w JOIN sessions s \
                     ON s.id = (SELECT id FROM sessions WHERE tenant_id = $1 AND id < w.id \
                                 ORDER BY id DESC LIMIT 1) \
                  WHERE w.n < $3 AND (w.n = 1 OR w.total + ",
            cost!("$4", "$5", "$6"),
            " <= $7)) \
             SELECT ",
            listed_columns!(),
            " FROM walk w JOIN sessions s ON s.id = w.id ORDER BY w.id DESC"
        )
    };
}

const PG_SESSION_WALK: &str = session_walk!(pg, "1::bigint", "0::bigint");
const SQLITE_SESSION_WALK: &str = session_walk!(sqlite, "1", "0");

/// `$1` session, `$2` tenant, `$3` characters of `tools`, `env` and `metadata`.
const PG_SESSION_EXCERPT: &str = "SELECT s.id AS s_id, s.tenant_id AS s_tenant_id, \
            s.status AS s_status, left(s.tools::text, $3) AS x_tools, s.policy AS s_policy, \
            left(s.env::text, $3) AS x_env, left(s.metadata::text, $3) AS x_metadata, \
            s.last_seq AS s_last_seq, s.created_at AS s_created_at, s.closed_at AS s_closed_at, \
            s.origin_kind AS s_origin_kind, s.origin_session_id AS s_origin_session_id, \
            s.origin_seq AS s_origin_seq, s.environment AS s_environment \
       FROM sessions s WHERE s.id = $1 AND s.tenant_id = $2";

const SQLITE_SESSION_EXCERPT: &str = "SELECT s.id AS s_id, s.tenant_id AS s_tenant_id, \
            s.status AS s_status, substr(s.tools, 1, $3) AS x_tools, s.policy AS s_policy, \
            substr(s.env, 1, $3) AS x_env, substr(s.metadata, 1, $3) AS x_metadata, \
            s.last_seq AS s_last_seq, s.created_at AS s_created_at, s.closed_at AS s_closed_at, \
            s.origin_kind AS s_origin_kind, s.origin_session_id AS s_origin_session_id, \
            s.origin_seq AS s_origin_seq, s.environment AS s_environment \
       FROM sessions s WHERE s.id = $1 AND s.tenant_id = $2";

fn event_row(session_id: Uuid, row: &impl Columns) -> Result<EventText> {
    Ok(EventText {
        session_id,
        seq: row.int("e_seq")?,
        kind: rows::event_kind(&row.text("e_kind")?)?,
        invocation_id: row.opt_uuid("e_invocation_id")?,
        created_at: row.time("e_created_at")?,
        data_bytes: u64::try_from(row.int("e_size")?).unwrap_or(0),
        data: if row.boolean("e_fits")? {
            row.opt_text("e_text")?
        } else {
            None
        },
    })
}

/// The walk's rows as a page: the ones that fit, and whether one that did not follows.
fn event_page(session_id: Uuid, found: &[impl Columns]) -> Result<EventTexts> {
    let mut page = EventTexts::default();
    for row in found {
        if row.opt_int("e_seq")?.is_none() {
            continue;
        }
        if !row.boolean("e_fits")? {
            page.more = true;
            continue;
        }
        page.events.push(event_row(session_id, row)?);
    }
    Ok(page)
}

fn listed(found: &[impl Columns], inline: i64) -> Result<(Vec<Listed>, bool)> {
    let mut sessions = Vec::with_capacity(found.len());
    let mut more = false;
    for row in found {
        if !row.boolean("w_fits")? {
            more = true;
            continue;
        }
        let size = row.int("w_size")?;
        sessions.push(if size <= inline {
            Listed::Whole(Box::new(rows::session(row)?))
        } else {
            Listed::Over {
                id: row.uuid("s_id")?,
                bytes: u64::try_from(size).unwrap_or(0),
            }
        });
    }
    Ok((sessions, more))
}

/// A session with `tools`, `env` and `metadata` read from the beginnings of their JSON texts.
fn excerpt(row: &impl Columns) -> Result<Session> {
    use toolexec_core::excerpt::close_prefix;
    let closed = |col: &str| -> Result<Option<serde_json::Value>> {
        Ok(row
            .opt_text(col)?
            .map(|t| serde_json::from_str(&close_prefix(&t)).unwrap_or(serde_json::Value::Null)))
    };
    let tools = closed("x_tools")?.and_then(|v| serde_json::from_value(v).ok());
    let env = closed("x_env")?
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    let metadata = closed("x_metadata")?.unwrap_or(serde_json::Value::Null);
    rows::session_with(row, tools, row.json("s_policy")?, env, metadata)
}

/// The page of at most `limit` sessions out of the walk's (one row more than `limit`, so that a
/// full last page is known to be the last), and the `before` of the next one.
fn session_page(mut sessions: Vec<Listed>, limit: u32, more: bool) -> crate::SessionPage {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let more = more || sessions.len() > limit;
    sessions.truncate(limit);
    let next_before = more.then(|| sessions.last().map(Listed::id)).flatten();
    crate::SessionPage {
        sessions,
        next_before,
    }
}

pub(crate) mod pg {
    use super::*;
    use sqlx::PgPool;

    pub(crate) async fn event_texts(
        pool: &PgPool,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
        bounds: ByteBounds,
    ) -> Result<EventTexts> {
        let [inline, excerpt, overhead, max] = bounds.binds();
        let found = sqlx::query(PG_EVENT_WALK)
            .bind(session_id)
            .bind(tenant_id)
            .bind(after)
            .bind(i64::from(limit))
            .bind(inline)
            .bind(excerpt)
            .bind(overhead)
            .bind(max)
            .fetch_all(pool)
            .await?;
        if found.is_empty() {
            return Err(crate::StoreError::NotFound);
        }
        event_page(session_id, &found)
    }

    pub(crate) async fn event_text(
        pool: &PgPool,
        tenant_id: Uuid,
        session_id: Uuid,
        seq: i64,
        chars: Option<u32>,
    ) -> Result<Option<EventText>> {
        let chars = chars.map_or(i32::MAX, |c| i32::try_from(c).unwrap_or(i32::MAX));
        let row = sqlx::query(PG_EVENT_TEXT)
            .bind(session_id)
            .bind(tenant_id)
            .bind(seq)
            .bind(chars)
            .fetch_optional(pool)
            .await?
            .ok_or(crate::StoreError::NotFound)?;
        if row.try_get::<Option<i64>, _>("e_seq")?.is_none() {
            return Ok(None);
        }
        event_row(session_id, &row).map(Some)
    }

    pub(crate) async fn list_sessions(
        pool: &PgPool,
        tenant_id: Uuid,
        before: Option<Uuid>,
        limit: u32,
        bounds: ByteBounds,
    ) -> Result<crate::SessionPage> {
        let [inline, excerpt, overhead, max] = bounds.binds();
        let found = sqlx::query(PG_SESSION_WALK)
            .bind(tenant_id)
            .bind(before.unwrap_or(Uuid::max()))
            .bind(i64::from(limit) + 1)
            .bind(inline)
            .bind(excerpt)
            .bind(overhead)
            .bind(max)
            .fetch_all(pool)
            .await?;
        let (sessions, more) = listed(&found, inline)?;
        Ok(session_page(sessions, limit, more))
    }

    pub(crate) async fn session_excerpt(
        pool: &PgPool,
        tenant_id: Uuid,
        id: Uuid,
        chars: u32,
    ) -> Result<Session> {
        let row = sqlx::query(PG_SESSION_EXCERPT)
            .bind(id)
            .bind(tenant_id)
            .bind(i32::try_from(chars).unwrap_or(i32::MAX))
            .fetch_optional(pool)
            .await?
            .ok_or(crate::StoreError::NotFound)?;
        excerpt(&row)
    }
}

pub(crate) mod sqlite {
    use super::*;
    use sqlx::SqlitePool;

    async fn visible(
        conn: &mut sqlx::SqliteConnection,
        tenant_id: Uuid,
        session_id: Uuid,
    ) -> Result<()> {
        sqlx::query("SELECT 1 FROM sessions WHERE id = $1 AND tenant_id = $2")
            .bind(session_id)
            .bind(tenant_id)
            .fetch_optional(conn)
            .await?
            .map(|_| ())
            .ok_or(crate::StoreError::NotFound)
    }

    pub(crate) async fn event_texts(
        pool: &SqlitePool,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
        bounds: ByteBounds,
    ) -> Result<EventTexts> {
        let [inline, excerpt, overhead, max] = bounds.binds();
        // One read transaction, so the check and the page see the same snapshot.
        let mut tx = pool.begin().await?;
        visible(&mut tx, tenant_id, session_id).await?;
        let found = sqlx::query(SQLITE_EVENT_WALK)
            .bind(session_id)
            .bind(after)
            .bind(i64::from(limit))
            .bind(inline)
            .bind(excerpt)
            .bind(overhead)
            .bind(max)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        event_page(session_id, &found)
    }

    pub(crate) async fn event_text(
        pool: &SqlitePool,
        tenant_id: Uuid,
        session_id: Uuid,
        seq: i64,
        chars: Option<u32>,
    ) -> Result<Option<EventText>> {
        let mut tx = pool.begin().await?;
        visible(&mut tx, tenant_id, session_id).await?;
        let row = sqlx::query(SQLITE_EVENT_TEXT)
            .bind(session_id)
            .bind(seq)
            .bind(chars.map(i64::from))
            .fetch_optional(&mut *tx)
            .await?;
        tx.commit().await?;
        row.map(|r| event_row(session_id, &r)).transpose()
    }

    pub(crate) async fn list_sessions(
        pool: &SqlitePool,
        tenant_id: Uuid,
        before: Option<Uuid>,
        limit: u32,
        bounds: ByteBounds,
    ) -> Result<crate::SessionPage> {
        let [inline, excerpt, overhead, max] = bounds.binds();
        let found = sqlx::query(SQLITE_SESSION_WALK)
            .bind(tenant_id)
            .bind(before.unwrap_or(Uuid::max()))
            .bind(i64::from(limit) + 1)
            .bind(inline)
            .bind(excerpt)
            .bind(overhead)
            .bind(max)
            .fetch_all(pool)
            .await?;
        let (sessions, more) = listed(&found, inline)?;
        Ok(session_page(sessions, limit, more))
    }

    pub(crate) async fn session_excerpt(
        pool: &SqlitePool,
        tenant_id: Uuid,
        id: Uuid,
        chars: u32,
    ) -> Result<Session> {
        let row = sqlx::query(SQLITE_SESSION_EXCERPT)
            .bind(id)
            .bind(tenant_id)
            .bind(i64::from(chars))
            .fetch_optional(pool)
            .await?
            .ok_or(crate::StoreError::NotFound)?;
        excerpt(&row)
    }
}
