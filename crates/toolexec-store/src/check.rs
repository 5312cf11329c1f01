//! What the store can hold, decided before anything is sent, and which database failures are
//! worth retrying.
//!
//! A write the database would refuse must never reach a group commit: on Postgres the refusal
//! aborts the transaction, and with it every other session's write that shared it. So a caller
//! asks [`Write::unstorable`] first (the recorder does, in the caller's task), and whatever the
//! database still refuses comes back as [`StoreError::Refused`], never as
//! [`StoreError::Unavailable`], so that nobody retries it forever.
//!
//! The limits here are the databases' own (Postgres: no NUL in `text`/`jsonb`, 255 MiB per
//! `jsonb` value, 1 GiB per field and per protocol message), with a margin.
use std::borrow::Cow;

use serde_json::Value;

use crate::{Blob, NewEvent, NewInvocation, Outcome, StoreError, Write};

/// Largest single blob: one `bytea` field (and the message that carries it) must stay under
/// Postgres's 1 GiB; half of it leaves room for the rest of the statement.
pub const MAX_BLOB_BYTES: usize = 512 * 1024 * 1024;

/// Largest JSON value (arguments, one event's data): Postgres's `jsonb` holds at most 255 MiB,
/// and its binary form can be larger than the text.
pub const MAX_JSON_BYTES: usize = 128 * 1024 * 1024;

/// Largest text column (`content`, ids): a `text` field holds at most 1 GiB.
pub const MAX_TEXT_BYTES: usize = 256 * 1024 * 1024;

/// Largest write without its blobs: the rows of one write travel in one statement, which must
/// stay well under Postgres's 1 GiB message limit.
pub const MAX_WRITE_BYTES: usize = 256 * 1024 * 1024;

/// Default bound on blob contents per statement: large enough that a statement's round trip is
/// small next to its payload, small enough that no statement nears the message limit and a
/// retry resends little.
pub const DEFAULT_BLOB_STATEMENT_BYTES: usize = 16 * 1024 * 1024;

const NUL: &str = "it contains a NUL character (\\u0000), which the store cannot hold in text";

impl Write {
    /// Why the store would refuse this write, in plain words; `None` if it can hold it.
    /// Checks every text for NUL and every value against the databases' size limits.
    pub fn unstorable(&self) -> Option<String> {
        let mut bytes = 0usize;
        let found = match self {
            Write::Start { invocation } => invocation_unstorable(invocation, &mut bytes),
            Write::Finish {
                outcome,
                side_effects,
                blobs,
                ..
            } => outcome_unstorable(outcome, &mut bytes)
                .or_else(|| events_unstorable(side_effects, &mut bytes))
                .or_else(|| blobs_unstorable(blobs)),
            Write::Record {
                invocation,
                outcome,
                side_effects,
                blobs,
            } => invocation_unstorable(invocation, &mut bytes)
                .or_else(|| outcome_unstorable(outcome, &mut bytes))
                .or_else(|| events_unstorable(side_effects, &mut bytes))
                .or_else(|| blobs_unstorable(blobs)),
        };
        found.or_else(|| {
            (bytes > MAX_WRITE_BYTES).then(|| {
                format!(
                    "its record is {} MiB without file contents, more than the {} MiB the store takes in one write",
                    bytes >> 20,
                    MAX_WRITE_BYTES >> 20
                )
            })
        })
    }

    /// Roughly how many bytes the write puts in a statement (text, JSON and blobs), for keeping
    /// group commits bounded. Cheap: lengths only, no serialization.
    pub fn approx_bytes(&self) -> usize {
        let rows = match self {
            Write::Start { invocation } => invocation_bytes(invocation),
            Write::Finish {
                outcome,
                side_effects,
                ..
            } => outcome_bytes(outcome) + side_effects.iter().map(event_bytes).sum::<usize>(),
            Write::Record {
                invocation,
                outcome,
                side_effects,
                ..
            } => {
                invocation_bytes(invocation)
                    + outcome_bytes(outcome)
                    + side_effects.iter().map(event_bytes).sum::<usize>()
            }
        };
        rows + self.blob_bytes()
    }
}

impl NewEvent {
    /// Why the store would refuse this event, in plain words; `None` if it can hold it.
    pub fn unstorable(&self) -> Option<String> {
        json_unstorable("the event", &self.data, &mut 0)
    }
}

fn invocation_bytes(inv: &NewInvocation) -> usize {
    // Fixed columns (ids, timestamps, flags) are a few hundred bytes at most.
    256 + inv.call_id.len() + inv.name.len() + inv.node.len() + json_len(&inv.arguments)
}

/// Its content, and the paths and hashes of its reads (a grep can record a thousand).
fn outcome_bytes(o: &Outcome) -> usize {
    o.content.len() + o.reads.iter().map(|r| 96 + r.path.len()).sum::<usize>()
}

fn event_bytes(e: &NewEvent) -> usize {
    64 + json_len(&e.data)
}

/// The length of a JSON value's text, near enough (strings and keys by their length, plus a
/// few bytes per item for quotes and separators).
fn json_len(v: &Value) -> usize {
    match v {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 24,
        Value::String(s) => s.len() + 2,
        Value::Array(items) => 2 + items.iter().map(|i| json_len(i) + 1).sum::<usize>(),
        Value::Object(map) => {
            2 + map
                .iter()
                .map(|(k, v)| k.len() + 4 + json_len(v))
                .sum::<usize>()
        }
    }
}

fn text_unstorable(what: &str, s: &str, bytes: &mut usize) -> Option<String> {
    *bytes += s.len();
    if s.len() > MAX_TEXT_BYTES {
        return Some(format!(
            "{what} is {} MiB, more than the {} MiB the store holds in one text",
            s.len() >> 20,
            MAX_TEXT_BYTES >> 20
        ));
    }
    s.as_bytes().contains(&0).then(|| format!("{what}: {NUL}"))
}

/// `what` is the start of the sentence (`"the arguments"`); empty, the answer starts with the
/// verb (`" is … MiB"`, `": it contains …"`) for the caller to name the value.
fn json_unstorable(what: &str, v: &Value, bytes: &mut usize) -> Option<String> {
    let len = json_len(v);
    *bytes += len;
    if len > MAX_JSON_BYTES {
        return Some(format!(
            "{what} is {} MiB of JSON, more than the {} MiB the store holds in one value",
            len >> 20,
            MAX_JSON_BYTES >> 20
        ));
    }
    json_has_nul(v).then(|| format!("{what}: {NUL}"))
}

fn json_has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.as_bytes().contains(&0),
        Value::Array(items) => items.iter().any(json_has_nul),
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| k.as_bytes().contains(&0) || json_has_nul(v)),
        _ => false,
    }
}

fn invocation_unstorable(inv: &NewInvocation, bytes: &mut usize) -> Option<String> {
    text_unstorable("the call id", &inv.call_id, bytes)
        .or_else(|| text_unstorable("the tool name", &inv.name, bytes))
        .or_else(|| text_unstorable("the node name", &inv.node, bytes))
        .or_else(|| json_unstorable("the arguments", &inv.arguments, bytes))
}

fn outcome_unstorable(outcome: &Outcome, bytes: &mut usize) -> Option<String> {
    text_unstorable("the output", &outcome.content, bytes)
}

fn events_unstorable(events: &[NewEvent], bytes: &mut usize) -> Option<String> {
    events.iter().enumerate().find_map(|(i, e)| {
        // Named only when refused: no allocation per event on the way of every write.
        json_unstorable("", &e.data, bytes)
            .map(|why| format!("side effect {} ({}){why}", i + 1, e.kind.as_str()))
    })
}

fn blobs_unstorable(blobs: &[Blob]) -> Option<String> {
    blobs.iter().find(|b| b.len() > MAX_BLOB_BYTES).map(|b| {
        format!(
            "a content of {} MiB is more than the {} MiB the store holds in one piece",
            b.len() >> 20,
            MAX_BLOB_BYTES >> 20
        )
    })
}

/// Sorts blobs by hash (the lock order of every writer of blobs), drops repeats, and groups them
/// into statements of at most `bound` bytes of contents (a larger blob alone).
pub(crate) fn blob_statements(mut blobs: Vec<Blob>, bound: usize) -> Vec<Vec<Blob>> {
    blobs.sort_unstable_by(|a, b| a.sha256.cmp(&b.sha256));
    blobs.dedup_by(|a, b| a.sha256 == b.sha256);
    let mut statements: Vec<Vec<Blob>> = Vec::new();
    let mut size = 0usize;
    for blob in blobs {
        match statements.last_mut() {
            Some(last) if !last.is_empty() && size + blob.len() <= bound => {
                size += blob.len();
                last.push(blob);
            }
            _ => {
                size = blob.len();
                statements.push(vec![blob]);
            }
        }
    }
    statements
}

/// Maps a database failure to what a caller can do about it: retry later
/// ([`StoreError::Unavailable`]) or not at all ([`StoreError::Refused`]).
pub(crate) fn classify(e: sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::RowNotFound => StoreError::NotFound,
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            StoreError::Corrupt(e.to_string())
        }
        // Encoding a value failed on our side: the same value fails again.
        sqlx::Error::Encode(_) | sqlx::Error::InvalidArgument(_) => StoreError::Refused {
            reason: "a value of it cannot be encoded for the database".into(),
            cause: e.to_string(),
        },
        sqlx::Error::Database(ref db) => match refusal(db.as_ref()) {
            Some(reason) => StoreError::Refused {
                reason: reason.into(),
                cause: e.to_string(),
            },
            None => StoreError::Unavailable(e.to_string()),
        },
        other => StoreError::Unavailable(other.to_string()),
    }
}

/// Why the database refused a statement for good, in plain words; `None` for failures that a
/// later attempt can get past (connection lost, server shutting down, out of resources, a
/// deadlock or serialization failure, lock timeouts).
fn refusal(db: &dyn sqlx::error::DatabaseError) -> Option<&'static str> {
    let code: Cow<'_, str> = db.code()?;
    if db
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some()
    {
        // SQLSTATE classes: 22 data exception (a NUL in text, a value out of range), 23 integrity
        // constraint, 42 syntax or access rule, 54 program limit (too large, too complex), and
        // 08P01 protocol violation (a message over the server's limit: sending it again gets
        // the same answer).
        return match code.get(..2) {
            _ if code == "08P01" => Some("it is larger than the database accepts in one message"),
            Some("22") => Some("it holds a value the database cannot store"),
            Some("23") => Some("it breaks a rule of the database's schema"),
            Some("42") => Some("the database does not accept the statement that would record it"),
            Some("54") => Some("it is larger than the database accepts"),
            _ => None,
        };
    }
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // Primary result codes (the low byte of the extended code): SQLITE_ERROR (1, an SQL
        // error), TOOBIG (18), CONSTRAINT (19), MISMATCH (20), RANGE (25). BUSY, LOCKED, IOERR,
        // FULL, CANTOPEN … pass.
        let primary = code.parse::<i64>().ok()? & 0xff;
        return match primary {
            1 => Some("the database does not accept the statement that would record it"),
            18 => Some("it is larger than the database accepts"),
            19 => Some("it breaks a rule of the database's schema"),
            20 | 25 => Some("it holds a value the database cannot store"),
            _ => None,
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use serde_json::json;
    use toolexec_core::{CallStatus, EventKind};
    use uuid::Uuid;

    use super::*;

    fn invocation(call_id: &str, arguments: Value) -> NewInvocation {
        NewInvocation {
            id: Uuid::now_v7(),
            session_id: Uuid::now_v7(),
            call_id: call_id.into(),
            name: "shell".into(),
            arguments,
            arguments_sha256: String::new(),
            read_only: false,
            capabilities: vec![],
            node: "n".into(),
            started_at: Utc::now(),
        }
    }

    fn outcome(content: &str) -> Outcome {
        Outcome {
            status: CallStatus::Ok,
            content: content.into(),
            truncated: None,
            output_chars: 0,
            output_sha256: None,
            finished_at: Utc::now(),
            duration_ms: 0.0,
            reads: Vec::new(),
            structured: None,
        }
    }

    fn finish(side_effects: Vec<NewEvent>, blobs: Vec<Blob>) -> Write {
        Write::Finish {
            session_id: Uuid::now_v7(),
            invocation_id: Uuid::now_v7(),
            outcome: outcome("done"),
            side_effects,
            blobs,
        }
    }

    #[test]
    fn a_nul_anywhere_in_a_write_makes_it_unstorable_and_says_where() {
        let ok = Write::Start {
            invocation: invocation("c1", json!({"a": ["b", {"c": "d"}]})),
        };
        assert_eq!(ok.unstorable(), None);
        let in_id = Write::Start {
            invocation: invocation("c\u{0}1", json!({})),
        };
        assert!(in_id.unstorable().unwrap().starts_with("the call id"));
        let deep = Write::Start {
            invocation: invocation("c1", json!({"a": [{"c": "d\u{0}"}]})),
        };
        assert!(deep.unstorable().unwrap().starts_with("the arguments"));
        let in_key = Write::Start {
            invocation: invocation("c1", json!({"k\u{0}": 1})),
        };
        assert!(in_key.unstorable().is_some());
        let event = NewEvent {
            kind: EventKind::FileCreated,
            data: json!({"path": "a\u{0}b"}),
        };
        assert!(event.unstorable().is_some());
        let in_effect = finish(vec![event], vec![]);
        assert!(
            in_effect
                .unstorable()
                .unwrap()
                .starts_with("side effect 1 (file.created)"),
            "{:?}",
            in_effect.unstorable()
        );
        let mut in_output = finish(vec![], vec![]);
        if let Write::Finish { outcome, .. } = &mut in_output {
            outcome.content = "x\u{0}".into();
        }
        assert!(in_output.unstorable().unwrap().starts_with("the output"));
    }

    #[test]
    fn a_write_too_large_for_one_statement_is_unstorable() {
        let big = "x".repeat(MAX_JSON_BYTES / 2);
        let effects: Vec<NewEvent> = (0..5)
            .map(|_| NewEvent {
                kind: EventKind::FileCreated,
                data: json!({"path": big}),
            })
            .collect();
        let reason = finish(effects, vec![]).unstorable().unwrap();
        assert!(reason.contains("more than the 256 MiB"), "{reason}");
        let one = NewEvent {
            kind: EventKind::FileCreated,
            data: json!({"path": "x".repeat(MAX_JSON_BYTES + 1)}),
        };
        assert!(one.unstorable().unwrap().contains("MiB of JSON"));
    }

    #[test]
    fn blobs_are_grouped_in_statements_of_at_most_the_bound_each() {
        let blobs: Vec<Blob> = (0..10u8).map(|i| Blob::new(vec![i; 300])).collect();
        let mut with_repeat = blobs.clone();
        with_repeat.push(blobs[3].clone());
        let statements = blob_statements(with_repeat, 1000);
        let sizes: Vec<usize> = statements
            .iter()
            .map(|s| s.iter().map(Blob::len).sum())
            .collect();
        assert_eq!(sizes, vec![900, 900, 900, 300]);
        let hashes: Vec<&str> = statements
            .iter()
            .flatten()
            .map(|b| b.sha256.as_str())
            .collect();
        let mut sorted = hashes.clone();
        sorted.sort_unstable();
        assert_eq!(
            hashes, sorted,
            "hash order: the lock order of every blob writer"
        );
        // A blob over the bound goes alone, and never with another.
        let big = Blob::new(vec![7u8; 2500]);
        let statements = blob_statements(vec![big, Blob::new(vec![1u8; 10])], 1000);
        assert_eq!(statements.len(), 2);
        assert!(statements.iter().all(|s| s.len() == 1));
    }
}
