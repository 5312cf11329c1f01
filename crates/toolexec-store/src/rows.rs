//! Reading domain types out of rows, written once for both backends.
//!
//! Queries select columns under fixed prefixed names (`s_` sessions, `i_` invocations, `e_`
//! events, see the `*_columns!` macros) so that the same decoder reads a table on its own or
//! joined to another. A value this binary cannot read is [`StoreError::Corrupt`].
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use sqlx::Row;
use sqlx::types::Json;
use toolexec_core::{
    Event, EventKind, Invocation, InvocationStatus, Origin, OriginKind, Replay, ReplayStatus,
    Session, SessionStatus, Tenant,
};

use uuid::Uuid;

use crate::plan::{Existing, LockedSession, Waiting};
use crate::{Result, StoreError};

/// The session columns, for `FROM sessions s`.
macro_rules! session_columns {
    () => {
        "s.id AS s_id, s.tenant_id AS s_tenant_id, s.status AS s_status, s.tools AS s_tools, \
         s.policy AS s_policy, s.env AS s_env, s.metadata AS s_metadata, \
         s.last_seq AS s_last_seq, s.created_at AS s_created_at, s.closed_at AS s_closed_at, \
         s.origin_kind AS s_origin_kind, s.origin_session_id AS s_origin_session_id, \
         s.origin_seq AS s_origin_seq, s.environment AS s_environment"
    };
}

/// The invocation columns, for `FROM invocations i`.
macro_rules! invocation_columns {
    () => {
        "i.id AS i_id, i.session_id AS i_session_id, i.call_id AS i_call_id, i.name AS i_name, \
         i.arguments AS i_arguments, i.arguments_sha256 AS i_arguments_sha256, \
         i.status AS i_status, i.is_error AS i_is_error, \
         i.content AS i_content, i.truncated AS i_truncated, i.output_chars AS i_output_chars, \
         i.read_only AS i_read_only, i.capabilities AS i_capabilities, \
         i.started_at AS i_started_at, i.finished_at AS i_finished_at, \
         i.duration_ms AS i_duration_ms, i.started_seq AS i_started_seq, \
         i.finished_seq AS i_finished_seq"
    };
}

/// What the planner needs to know of an existing invocation, for `FROM invocations i`.
macro_rules! existing_columns {
    () => {
        "i.id AS i_id, i.session_id AS i_session_id, i.call_id AS i_call_id, i.name AS i_name, \
         i.status AS i_status, i.started_seq AS i_started_seq"
    };
}

/// The event columns, for `FROM events e`.
macro_rules! event_columns {
    () => {
        "e.session_id AS e_session_id, e.seq AS e_seq, e.kind AS e_kind, \
         e.invocation_id AS e_invocation_id, e.data AS e_data, e.created_at AS e_created_at"
    };
}

/// The side effects of an invocation lie between its own `invocation.started` and
/// `invocation.finished` (both written with them, or the start earlier): a range of the log's
/// primary key, so a page is read in seq order without sorting all of them. `$1` session, `$2`
/// invocation, `$3` the lower bound (exclusive), `$4` the finished seq (exclusive).
macro_rules! side_effects_where {
    () => {
        " FROM events e WHERE e.session_id = $1 AND e.invocation_id = $2 \
         AND e.seq > $3 AND e.seq < $4"
    };
}

pub(crate) use {
    event_columns, existing_columns, invocation_columns, session_columns, side_effects_where,
};

/// Typed column access, implemented alike for each backend's row type.
pub(crate) trait Columns {
    fn uuid(&self, col: &str) -> Result<Uuid>;
    fn opt_uuid(&self, col: &str) -> Result<Option<Uuid>>;
    fn text(&self, col: &str) -> Result<String>;
    fn opt_text(&self, col: &str) -> Result<Option<String>>;
    fn int(&self, col: &str) -> Result<i64>;
    fn opt_int(&self, col: &str) -> Result<Option<i64>>;
    fn boolean(&self, col: &str) -> Result<bool>;
    fn opt_float(&self, col: &str) -> Result<Option<f64>>;
    fn time(&self, col: &str) -> Result<DateTime<Utc>>;
    fn opt_time(&self, col: &str) -> Result<Option<DateTime<Utc>>>;
    fn opt_bytes(&self, col: &str) -> Result<Option<Vec<u8>>>;
    fn json<T: DeserializeOwned>(&self, col: &str) -> Result<T>;
    fn opt_json<T: DeserializeOwned>(&self, col: &str) -> Result<Option<T>>;
}

macro_rules! impl_columns {
    ($row:ty) => {
        impl Columns for $row {
            fn uuid(&self, col: &str) -> Result<Uuid> {
                Ok(self.try_get(col)?)
            }
            fn opt_uuid(&self, col: &str) -> Result<Option<Uuid>> {
                Ok(self.try_get(col)?)
            }
            fn text(&self, col: &str) -> Result<String> {
                Ok(self.try_get(col)?)
            }
            fn opt_text(&self, col: &str) -> Result<Option<String>> {
                Ok(self.try_get(col)?)
            }
            fn int(&self, col: &str) -> Result<i64> {
                Ok(self.try_get(col)?)
            }
            fn opt_int(&self, col: &str) -> Result<Option<i64>> {
                Ok(self.try_get(col)?)
            }
            fn boolean(&self, col: &str) -> Result<bool> {
                Ok(self.try_get(col)?)
            }
            fn opt_float(&self, col: &str) -> Result<Option<f64>> {
                Ok(self.try_get(col)?)
            }
            fn time(&self, col: &str) -> Result<DateTime<Utc>> {
                Ok(self.try_get(col)?)
            }
            fn opt_time(&self, col: &str) -> Result<Option<DateTime<Utc>>> {
                Ok(self.try_get(col)?)
            }
            fn opt_bytes(&self, col: &str) -> Result<Option<Vec<u8>>> {
                Ok(self.try_get(col)?)
            }
            fn json<T: DeserializeOwned>(&self, col: &str) -> Result<T> {
                Ok(self.try_get::<Json<T>, _>(col)?.0)
            }
            fn opt_json<T: DeserializeOwned>(&self, col: &str) -> Result<Option<T>> {
                Ok(self.try_get::<Option<Json<T>>, _>(col)?.map(|j| j.0))
            }
        }
    };
}

impl_columns!(sqlx::postgres::PgRow);
impl_columns!(sqlx::sqlite::SqliteRow);

fn corrupt(what: &str, value: &str) -> StoreError {
    StoreError::Corrupt(format!("unknown {what} {value:?}"))
}

pub(crate) fn session_status(s: &str) -> Result<SessionStatus> {
    SessionStatus::parse(s).ok_or_else(|| corrupt("session status", s))
}

pub(crate) fn invocation_status(s: &str) -> Result<InvocationStatus> {
    InvocationStatus::parse(s).ok_or_else(|| corrupt("invocation status", s))
}

pub(crate) fn event_kind(s: &str) -> Result<EventKind> {
    EventKind::parse(s).ok_or_else(|| corrupt("event kind", s))
}

pub(crate) fn tenant(row: &impl Columns) -> Result<Tenant> {
    Ok(Tenant {
        id: row.uuid("id")?,
        name: row.text("name")?,
    })
}

pub(crate) fn session(row: &impl Columns) -> Result<Session> {
    session_with(
        row,
        row.opt_json("s_tools")?,
        row.json("s_policy")?,
        row.json("s_env")?,
        row.json("s_metadata")?,
    )
}

/// A session from `row`'s columns but for its JSON ones, given (read whole, or from the
/// beginnings of their texts: [`crate::pages`]).
pub(crate) fn session_with(
    row: &impl Columns,
    tools: Option<Vec<String>>,
    policy: toolexec_core::Policy,
    env: std::collections::BTreeMap<String, String>,
    metadata: serde_json::Value,
) -> Result<Session> {
    Ok(Session {
        id: row.uuid("s_id")?,
        tenant_id: row.uuid("s_tenant_id")?,
        status: session_status(&row.text("s_status")?)?,
        tools,
        policy,
        env,
        metadata,
        created_at: row.time("s_created_at")?,
        closed_at: row.opt_time("s_closed_at")?,
        last_seq: row.int("s_last_seq")?,
        origin: match (
            row.opt_text("s_origin_kind")?,
            row.opt_uuid("s_origin_session_id")?,
            row.opt_int("s_origin_seq")?,
        ) {
            (Some(kind), Some(session_id), Some(seq)) => Some(Origin {
                kind: OriginKind::parse(&kind).ok_or_else(|| corrupt("session origin", &kind))?,
                session_id,
                seq,
            }),
            _ => None,
        },
        environment: match row.opt_text("s_environment")? {
            Some(text) => Some(
                serde_json::from_str(&text)
                    .map_err(|e| StoreError::Corrupt(format!("session environment: {e}")))?,
            ),
            None => None,
        },
        truncated: None,
    })
}

pub(crate) fn replay(row: &impl Columns) -> Result<Replay> {
    let mut replay: Replay = row.json("report")?;
    replay.status =
        ReplayStatus::parse(&row.text("status")?).ok_or_else(|| corrupt("replay status", "?"))?;
    Ok(replay)
}

/// An invocation without its side effects.
pub(crate) fn invocation(row: &impl Columns) -> Result<Invocation> {
    Ok(Invocation {
        id: row.uuid("i_id")?,
        session_id: row.uuid("i_session_id")?,
        call_id: row.text("i_call_id")?,
        name: row.text("i_name")?,
        arguments: row.json("i_arguments")?,
        arguments_sha256: row.text("i_arguments_sha256")?,
        status: invocation_status(&row.text("i_status")?)?,
        is_error: row.boolean("i_is_error")?,
        content: row.opt_text("i_content")?,
        truncated: row.opt_json("i_truncated")?,
        output_chars: row.opt_int("i_output_chars")?,
        read_only: row.boolean("i_read_only")?,
        capabilities: row.json("i_capabilities")?,
        started_at: row.time("i_started_at")?,
        finished_at: row.opt_time("i_finished_at")?,
        duration_ms: row.opt_float("i_duration_ms")?,
        started_seq: row.int("i_started_seq")?,
        finished_seq: row.opt_int("i_finished_seq")?,
        side_effects: Vec::new(),
        side_effects_total: 0,
        side_effects_next_after: None,
    })
}

/// A session joined to the invocations of some of its calls (`LEFT JOIN`, `s_` and `i_`
/// columns): `NotFound` when no row came back (no such session for this tenant).
pub(crate) fn session_calls(found: &[impl Columns]) -> Result<(Session, Vec<Invocation>)> {
    let first = found.first().ok_or(StoreError::NotFound)?;
    let session = session(first)?;
    let mut invocations = Vec::new();
    for row in found {
        if row.opt_uuid("i_id")?.is_some() {
            invocations.push(invocation(row)?);
        }
    }
    Ok((session, invocations))
}

pub(crate) fn existing(row: &impl Columns) -> Result<Existing> {
    Ok(Existing {
        id: row.uuid("i_id")?,
        session_id: row.uuid("i_session_id")?,
        call_id: row.text("i_call_id")?,
        name: row.text("i_name")?,
        status: invocation_status(&row.text("i_status")?)?,
        started_seq: row.int("i_started_seq")?,
    })
}

/// Columns `id`, `session_id`, `call_id`, `name`, `arguments`, `read_only`, `capabilities`,
/// `status`, `expires_at` (RFC 3339 text, from its `approval.requested`) of an invocation to
/// decide.
pub(crate) fn waiting(row: &impl Columns) -> Result<Waiting> {
    Ok(Waiting {
        id: row.uuid("id")?,
        session_id: row.uuid("session_id")?,
        call_id: row.text("call_id")?,
        name: row.text("name")?,
        arguments: row.json("arguments")?,
        read_only: row.boolean("read_only")?,
        capabilities: row.json("capabilities")?,
        status: invocation_status(&row.text("status")?)?,
        expires_at: rfc3339(row.opt_text("expires_at")?),
    })
}

fn rfc3339(text: Option<String>) -> Option<DateTime<Utc>> {
    text.and_then(|t| DateTime::parse_from_rfc3339(&t).ok())
        .map(|t| t.with_timezone(&Utc))
}

/// Columns `tenant_id`, `session_id`, `id`, `expires_at` (RFC 3339 text) of a waiting call.
pub(crate) fn pending_approval(row: &impl Columns) -> Result<crate::PendingApproval> {
    Ok(crate::PendingApproval {
        tenant_id: row.uuid("tenant_id")?,
        session_id: row.uuid("session_id")?,
        invocation_id: row.uuid("id")?,
        expires_at: rfc3339(row.opt_text("expires_at")?),
    })
}

/// Columns `id`, `status`, `last_seq` of a session read under its lock.
pub(crate) fn locked_session(row: &impl Columns) -> Result<LockedSession> {
    Ok(LockedSession {
        id: row.uuid("id")?,
        status: session_status(&row.text("status")?)?,
        last_seq: row.int("last_seq")?,
    })
}

pub(crate) fn event(row: &impl Columns) -> Result<Event> {
    Ok(Event {
        session_id: row.uuid("e_session_id")?,
        seq: row.int("e_seq")?,
        kind: event_kind(&row.text("e_kind")?)?,
        invocation_id: row.opt_uuid("e_invocation_id")?,
        data: row.json("e_data")?,
        created_at: row.time("e_created_at")?,
        truncated: None,
    })
}

/// Fills in a page of side effects (read with one row more than `limit`, to know whether more
/// follow) and their total.
pub(crate) fn with_side_effects(
    mut invocation: Invocation,
    mut page: Vec<Event>,
    total: i64,
    limit: u32,
) -> Invocation {
    let limit = limit as usize;
    let more = page.len() > limit;
    page.truncate(limit);
    invocation.side_effects_next_after = more.then(|| page.last().map(|e| e.seq)).flatten();
    invocation.side_effects = page;
    invocation.side_effects_total = u64::try_from(total).unwrap_or(0);
    invocation
}

/// The full output of an invocation from its `content`, `output_sha256` and the blob's bytes.
pub(crate) fn output(
    content: Option<String>,
    output_sha256: Option<String>,
    blob: Option<Vec<u8>>,
) -> Result<String> {
    match (output_sha256, blob) {
        (None, _) => Ok(content.unwrap_or_default()),
        (Some(_), Some(bytes)) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        (Some(sha), None) => Err(StoreError::Corrupt(format!("output blob {sha} is missing"))),
    }
}

/// Maps a foreign-key violation to `NotFound` (the row referred to does not exist).
pub(crate) fn not_found_on_fk(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Database(db) if db.is_foreign_key_violation() => StoreError::NotFound,
        _ => e.into(),
    }
}
