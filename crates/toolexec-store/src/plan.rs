//! Turning a batch of writes into rows: the one place that decides seqs and per-write errors,
//! shared by both backends.
//!
//! A backend locks the sessions of the batch, reads the invocations the batch refers to, hands
//! both to [`plan`], and inserts what comes back, all in one transaction. Planning does no I/O and
//! cannot fail as a whole: a write that cannot be applied gets its [`WriteError`] and adds no rows,
//! so no constraint of the database is ever hit on purpose (on Postgres that would abort the
//! transaction and with it every other write of the batch).
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::json;
use toolexec_core::{CallStatus, EventKind, InvocationStatus, SessionStatus};
use uuid::Uuid;

use crate::{Assigned, Blob, NewEvent, NewInvocation, Outcome, Write, WriteError};

/// A session of the batch, read under its row lock.
#[derive(Debug, Clone)]
pub(crate) struct LockedSession {
    pub id: Uuid,
    pub status: SessionStatus,
    pub last_seq: i64,
}

/// An invocation already in the store that a write of the batch refers to, by id or call id.
#[derive(Debug, Clone)]
pub(crate) struct Existing {
    pub id: Uuid,
    pub session_id: Uuid,
    pub call_id: String,
    pub name: String,
    pub status: InvocationStatus,
    pub started_seq: i64,
}

/// One event to insert.
#[derive(Debug, Clone)]
pub(crate) struct EventRow {
    pub session_id: Uuid,
    pub seq: i64,
    pub kind: EventKind,
    pub invocation_id: Option<Uuid>,
    pub data: serde_json::Value,
}

/// One invocation to insert; `finish` is set when it also ends in this batch.
#[derive(Debug, Clone)]
pub(crate) struct InvocationRow {
    pub invocation: NewInvocation,
    pub started_seq: i64,
    pub finish: Option<FinishRow>,
    /// Inserted `pending_approval` (with no `finish`) rather than `running`.
    pub pending: bool,
}

impl InvocationRow {
    /// Its status column as inserted.
    pub fn status(&self) -> &'static str {
        match (&self.finish, self.pending) {
            (Some(f), _) => f.outcome.status.as_str(),
            (None, true) => InvocationStatus::PendingApproval.as_str(),
            (None, false) => InvocationStatus::Running.as_str(),
        }
    }
}

/// A call waiting for approval, read under its session's lock to decide it.
#[derive(Debug, Clone)]
pub(crate) struct Waiting {
    pub id: Uuid,
    pub session_id: Uuid,
    pub call_id: String,
    pub name: String,
    pub arguments: serde_json::Value,
    pub read_only: bool,
    pub capabilities: serde_json::Value,
    pub status: InvocationStatus,
    /// When its wait ends (from its `approval.requested` event).
    pub expires_at: Option<DateTime<Utc>>,
}

/// The end of an invocation: for one inserted earlier, an update of its row.
#[derive(Debug, Clone)]
pub(crate) struct FinishRow {
    pub id: Uuid,
    pub outcome: Outcome,
    pub finished_seq: i64,
}

/// Everything a batch writes, and what each write was given.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub results: Vec<Result<Assigned, WriteError>>,
    pub invocations: Vec<InvocationRow>,
    pub finishes: Vec<FinishRow>,
    pub events: Vec<EventRow>,
    /// Distinct and sorted by hash (see [`distinct_blobs`]).
    pub blobs: Vec<Blob>,
    /// The new `last_seq` of every session that got events.
    pub last_seqs: Vec<(Uuid, i64)>,
}

impl Plan {
    /// Nothing to write: every write of the batch failed.
    pub fn is_empty(&self) -> bool {
        self.invocations.is_empty()
            && self.finishes.is_empty()
            && self.events.is_empty()
            && self.blobs.is_empty()
            && self.last_seqs.is_empty()
    }
}

/// The sessions a batch writes to, sorted (the lock order) and distinct.
pub(crate) fn session_ids(batch: &[Write]) -> Vec<Uuid> {
    let mut ids: Vec<Uuid> = batch.iter().map(Write::session_id).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The invocation ids a batch names: new ones (to catch a reused id) and the ones it finishes.
pub(crate) fn invocation_ids(batch: &[Write]) -> Vec<Uuid> {
    batch
        .iter()
        .map(|w| match w {
            Write::Start { invocation } | Write::Record { invocation, .. } => invocation.id,
            Write::Finish { invocation_id, .. } => *invocation_id,
        })
        .collect()
}

/// The `(session_id, call_id)` pairs a batch starts, as two parallel columns.
pub(crate) fn call_keys(batch: &[Write]) -> (Vec<Uuid>, Vec<&str>) {
    batch
        .iter()
        .filter_map(|w| match w {
            Write::Start { invocation } | Write::Record { invocation, .. } => {
                Some((invocation.session_id, invocation.call_id.as_str()))
            }
            Write::Finish { .. } => None,
        })
        .unzip()
}

/// The data of an `invocation.started` event.
pub(crate) fn started_data(invocation: &NewInvocation) -> serde_json::Value {
    json!({
        "call_id": invocation.call_id,
        "name": invocation.name,
        "arguments": invocation.arguments,
        "read_only": invocation.read_only,
        "capabilities": invocation.capabilities,
    })
}

/// The data of an `invocation.finished` event.
pub(crate) fn finished_data(call_id: &str, name: &str, outcome: &Outcome) -> serde_json::Value {
    let mut data = json!({
        "call_id": call_id,
        "name": name,
        "status": outcome.status,
        "is_error": outcome.status.is_error(),
        "duration_ms": outcome.duration_ms,
        "truncated": outcome.truncated,
        "output_chars": outcome.output_chars,
        "output_sha256": outcome.output_sha256,
    });
    if !outcome.reads.is_empty()
        && let serde_json::Value::Object(map) = &mut data
    {
        map.insert("reads".into(), json!(outcome.reads));
    }
    if let (Some(structured), serde_json::Value::Object(map)) = (&outcome.structured, &mut data) {
        map.insert("structured".into(), structured.clone());
    }
    data
}

/// Plans `batch` against the locked `sessions` and the `existing` invocations it refers to.
/// Writes are applied in order, so a write sees the effects of the earlier ones of the batch.
pub(crate) fn plan(
    batch: Vec<Write>,
    sessions: Vec<LockedSession>,
    existing: Vec<Existing>,
) -> Plan {
    let mut planner = Planner {
        sessions: sessions
            .into_iter()
            .map(|s| {
                (
                    s.id,
                    SessionState {
                        status: s.status,
                        last_seq: s.last_seq,
                        changed: false,
                    },
                )
            })
            .collect(),
        by_call: HashMap::with_capacity(existing.len() + batch.len()),
        by_id: HashMap::with_capacity(existing.len() + batch.len()),
        plan: Plan::default(),
    };
    for e in existing {
        planner
            .by_call
            .insert((e.session_id, e.call_id.clone()), e.id);
        planner.by_id.insert(
            e.id,
            Known {
                session_id: e.session_id,
                call_id: e.call_id,
                name: e.name,
                status: e.status,
                started_seq: e.started_seq,
                row: None,
            },
        );
    }
    for write in batch {
        let result = match write {
            Write::Start { invocation } => planner.start(invocation, None),
            Write::Record {
                invocation,
                outcome,
                side_effects,
                blobs,
            } => planner.start(
                invocation,
                Some(Ending {
                    outcome,
                    side_effects,
                    blobs,
                }),
            ),
            Write::Finish {
                session_id,
                invocation_id,
                outcome,
                side_effects,
                blobs,
            } => planner.finish(
                session_id,
                invocation_id,
                Ending {
                    outcome,
                    side_effects,
                    blobs,
                },
            ),
        };
        planner.plan.results.push(result);
    }
    planner.into_plan()
}

struct SessionState {
    status: SessionStatus,
    last_seq: i64,
    changed: bool,
}

impl SessionState {
    fn next_seq(&mut self) -> i64 {
        self.last_seq += 1;
        self.changed = true;
        self.last_seq
    }
}

/// An invocation as the batch has left it so far.
struct Known {
    session_id: Uuid,
    call_id: String,
    name: String,
    status: InvocationStatus,
    started_seq: i64,
    /// Index into `Plan::invocations` when it is inserted by this batch.
    row: Option<usize>,
}

struct Ending {
    outcome: Outcome,
    side_effects: Vec<NewEvent>,
    blobs: Vec<Blob>,
}

struct Planner {
    sessions: HashMap<Uuid, SessionState>,
    by_call: HashMap<(Uuid, String), Uuid>,
    by_id: HashMap<Uuid, Known>,
    plan: Plan,
}

impl Planner {
    fn start(
        &mut self,
        invocation: NewInvocation,
        ending: Option<Ending>,
    ) -> Result<Assigned, WriteError> {
        let key = (invocation.session_id, invocation.call_id.clone());
        // A known call id wins over a closed session: a client retrying a recorded call must get
        // the recorded result back, even after the session was closed.
        if let Some(&id) = self.by_call.get(&key) {
            return Err(WriteError::DuplicateCall(id));
        }
        // The same invocation id twice (a resubmitted write): refused like a repeated call.
        if self.by_id.contains_key(&invocation.id) {
            return Err(WriteError::DuplicateCall(invocation.id));
        }
        let session_id = invocation.session_id;
        let Some(session) = self
            .sessions
            .get_mut(&session_id)
            .filter(|s| s.status == SessionStatus::Active)
        else {
            return Err(WriteError::SessionNotActive);
        };
        let started_seq = session.next_seq();
        // A read-only call that ends here with no side effect: one event, its
        // `invocation.finished` carrying its start (SPEC §6), at one seq.
        let once =
            invocation.read_only && ending.as_ref().is_some_and(|e| e.side_effects.is_empty());
        if !once {
            self.plan.events.push(EventRow {
                session_id,
                seq: started_seq,
                kind: EventKind::InvocationStarted,
                invocation_id: Some(invocation.id),
                data: started_data(&invocation),
            });
        }
        let id = invocation.id;
        self.by_call.insert(key, id);
        self.by_id.insert(
            id,
            Known {
                session_id,
                call_id: invocation.call_id.clone(),
                name: invocation.name.clone(),
                status: InvocationStatus::Running,
                started_seq,
                row: Some(self.plan.invocations.len()),
            },
        );
        let mut row = InvocationRow {
            invocation,
            started_seq,
            finish: None,
            pending: false,
        };
        match ending {
            None => {
                self.plan.invocations.push(row);
                Ok(Assigned {
                    started_seq,
                    finished_seq: None,
                })
            }
            Some(ending) if once => {
                self.finish_at_start(&mut row, ending);
                self.plan.invocations.push(row);
                Ok(Assigned {
                    started_seq,
                    finished_seq: Some(started_seq),
                })
            }
            Some(ending) => {
                self.plan.invocations.push(row);
                self.finish(session_id, id, ending)
            }
        }
    }

    /// The end of an invocation inserted by this write, recorded in one event at its
    /// `started_seq`: its `invocation.finished` with the start's fields.
    fn finish_at_start(&mut self, row: &mut InvocationRow, ending: Ending) {
        let (inv, seq) = (&row.invocation, row.started_seq);
        let mut data = finished_data(&inv.call_id, &inv.name, &ending.outcome);
        if let (serde_json::Value::Object(data), serde_json::Value::Object(start)) =
            (&mut data, started_data(inv))
        {
            data.extend(start);
        }
        self.plan.events.push(EventRow {
            session_id: inv.session_id,
            seq,
            kind: EventKind::InvocationFinished,
            invocation_id: Some(inv.id),
            data,
        });
        if let Some(known) = self.by_id.get_mut(&inv.id) {
            known.status = ending.outcome.status.into();
        }
        row.finish = Some(FinishRow {
            id: row.invocation.id,
            outcome: ending.outcome,
            finished_seq: seq,
        });
        self.plan.blobs.extend(ending.blobs);
    }

    fn finish(
        &mut self,
        session_id: Uuid,
        invocation_id: Uuid,
        ending: Ending,
    ) -> Result<Assigned, WriteError> {
        let Some(known) = self
            .by_id
            .get_mut(&invocation_id)
            .filter(|k| k.session_id == session_id && k.status == InvocationStatus::Running)
        else {
            return Err(WriteError::NotRunning);
        };
        // The session of a known invocation was locked with the batch; a finish is recorded
        // even when the session has been closed since the invocation started.
        let Some(session) = self.sessions.get_mut(&session_id) else {
            return Err(WriteError::NotRunning);
        };
        for effect in ending.side_effects {
            self.plan.events.push(EventRow {
                session_id,
                seq: session.next_seq(),
                kind: effect.kind,
                invocation_id: Some(invocation_id),
                data: effect.data,
            });
        }
        let finished_seq = session.next_seq();
        self.plan.events.push(EventRow {
            session_id,
            seq: finished_seq,
            kind: EventKind::InvocationFinished,
            invocation_id: Some(invocation_id),
            data: finished_data(&known.call_id, &known.name, &ending.outcome),
        });
        known.status = ending.outcome.status.into();
        let finish = FinishRow {
            id: invocation_id,
            outcome: ending.outcome,
            finished_seq,
        };
        match known.row.and_then(|i| self.plan.invocations.get_mut(i)) {
            Some(row) => row.finish = Some(finish),
            None => self.plan.finishes.push(finish),
        }
        self.plan.blobs.extend(ending.blobs);
        Ok(Assigned {
            started_seq: known.started_seq,
            finished_seq: Some(finished_seq),
        })
    }

    fn into_plan(mut self) -> Plan {
        distinct_blobs(&mut self.plan.blobs);
        let mut last_seqs: Vec<(Uuid, i64)> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.changed)
            .map(|(id, s)| (*id, s.last_seq))
            .collect();
        last_seqs.sort_unstable();
        self.plan.last_seqs = last_seqs;
        self.plan
    }
}

/// What a backend read, under the session's lock, before recording a call that waits.
pub(crate) struct WaitingNow {
    /// Calls of the session that wait already.
    pub waiting: i64,
    /// The invocation already recorded under the call's id, if any.
    pub known: Option<Uuid>,
}

/// A call that waits for approval: its invocation, `pending_approval`, and its
/// `approval.requested` event — the call as its `invocation.started` would show it, and `data`.
/// Refused when `max_waiting` calls wait already, when its call id is recorded, or when the
/// session is closed (in that order).
pub(crate) fn requested_plan(
    session: &LockedSession,
    now: WaitingNow,
    max_waiting: u64,
    invocation: NewInvocation,
    data: serde_json::Value,
) -> Result<(Plan, i64), WriteError> {
    if u64::try_from(now.waiting).unwrap_or(0) >= max_waiting {
        return Err(WriteError::TooManyWaiting(max_waiting));
    }
    if let Some(id) = now.known {
        return Err(WriteError::DuplicateCall(id));
    }
    if session.status != SessionStatus::Active {
        return Err(WriteError::SessionNotActive);
    }
    let seq = session.last_seq + 1;
    let mut event = started_data(&invocation);
    if let (Some(event), serde_json::Value::Object(data)) = (event.as_object_mut(), data) {
        event.extend(data);
    }
    let plan = Plan {
        events: vec![EventRow {
            session_id: session.id,
            seq,
            kind: EventKind::ApprovalRequested,
            invocation_id: Some(invocation.id),
            data: event,
        }],
        invocations: vec![InvocationRow {
            invocation,
            started_seq: seq,
            finish: None,
            pending: true,
        }],
        last_seqs: vec![(session.id, seq)],
        ..Plan::default()
    };
    Ok((plan, seq))
}

/// The decision on a call waiting for approval: `approval.decided` (`decided`), then its
/// `invocation.started` (approved: `denied` is `None`; the caller marks the invocation
/// `running` from that seq) or its `invocation.finished` with the `denied` outcome.
pub(crate) fn decided_plan(
    session: &LockedSession,
    waiting: &Waiting,
    decided: serde_json::Value,
    denied: Option<Outcome>,
) -> Result<(Plan, crate::Decided), WriteError> {
    if waiting.status != InvocationStatus::PendingApproval {
        return Err(WriteError::NotPending(waiting.status));
    }
    if denied.is_none() {
        if let Some(at) = waiting.expires_at
            && at <= Utc::now()
        {
            return Err(WriteError::WaitEnded(at));
        }
        if session.status != SessionStatus::Active {
            return Err(WriteError::SessionNotActive);
        }
    }
    let (decided_seq, next_seq) = (session.last_seq + 1, session.last_seq + 2);
    let event = |seq, kind, data| EventRow {
        session_id: session.id,
        seq,
        kind,
        invocation_id: Some(waiting.id),
        data,
    };
    let mut plan = Plan {
        events: vec![event(decided_seq, EventKind::ApprovalDecided, decided)],
        last_seqs: vec![(session.id, next_seq)],
        ..Plan::default()
    };
    match denied {
        None => plan.events.push(event(
            next_seq,
            EventKind::InvocationStarted,
            json!({
                "call_id": waiting.call_id,
                "name": waiting.name,
                "arguments": waiting.arguments,
                "read_only": waiting.read_only,
                "capabilities": waiting.capabilities,
            }),
        )),
        Some(outcome) => {
            plan.events.push(event(
                next_seq,
                EventKind::InvocationFinished,
                finished_data(&waiting.call_id, &waiting.name, &outcome),
            ));
            plan.finishes.push(FinishRow {
                id: waiting.id,
                outcome,
                finished_seq: next_seq,
            });
        }
    }
    let decided = crate::Decided {
        session_id: session.id,
        decided_seq,
        next_seq,
    };
    Ok((plan, decided))
}

/// The first events of a new session, numbered from 1.
pub(crate) fn initial_plan(session_id: Uuid, events: Vec<NewEvent>, blobs: Vec<Blob>) -> Plan {
    let mut plan = Plan {
        events: events
            .into_iter()
            .zip(1..)
            .map(|(e, seq)| EventRow {
                session_id,
                seq,
                kind: e.kind,
                invocation_id: None,
                data: e.data,
            })
            .collect(),
        blobs,
        ..Plan::default()
    };
    distinct_blobs(&mut plan.blobs);
    plan
}

/// The plan that appends `events` (of no invocation) to a session whose last seq is `last_seq`.
pub(crate) fn appended_plan(
    session_id: Uuid,
    last_seq: i64,
    events: Vec<NewEvent>,
    blobs: Vec<Blob>,
) -> Plan {
    let rows: Vec<EventRow> = events
        .into_iter()
        .zip(last_seq + 1..)
        .map(|(e, seq)| EventRow {
            session_id,
            seq,
            kind: e.kind,
            invocation_id: None,
            data: e.data,
        })
        .collect();
    let last = rows.last().map(|r| r.seq);
    let mut plan = Plan {
        events: rows,
        blobs,
        last_seqs: last.map(|l| vec![(session_id, l)]).unwrap_or_default(),
        ..Plan::default()
    };
    distinct_blobs(&mut plan.blobs);
    plan
}

/// Sorts blobs by hash and drops repeats: each is written once, and concurrent batches take
/// their locks on shared blobs in the same order.
fn distinct_blobs(blobs: &mut Vec<Blob>) {
    blobs.sort_unstable_by(|a, b| a.sha256.cmp(&b.sha256));
    blobs.dedup_by(|a, b| a.sha256 == b.sha256);
}

/// The finish written for an invocation that was running when its node stopped.
pub(crate) fn interrupted(
    session_id: Uuid,
    invocation_id: Uuid,
    started_at: DateTime<Utc>,
    now: DateTime<Utc>,
    content: &str,
) -> Write {
    let duration_ms = (now - started_at)
        .to_std()
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0);
    Write::Finish {
        session_id,
        invocation_id,
        outcome: Outcome {
            status: CallStatus::Interrupted,
            content: content.to_owned(),
            truncated: None,
            output_chars: i64::try_from(content.chars().count()).unwrap_or(i64::MAX),
            output_sha256: None,
            finished_at: now,
            duration_ms,
            reads: Vec::new(),
            structured: None,
        },
        side_effects: Vec::new(),
        blobs: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(id: Uuid, status: SessionStatus, last_seq: i64) -> LockedSession {
        LockedSession {
            id,
            status,
            last_seq,
        }
    }

    fn start(session_id: Uuid, call_id: &str) -> NewInvocation {
        NewInvocation {
            id: Uuid::now_v7(),
            session_id,
            call_id: call_id.to_owned(),
            name: "read_file".to_owned(),
            arguments: json!({}),
            arguments_sha256: String::new(),
            read_only: true,
            capabilities: vec![],
            node: "n".to_owned(),
            started_at: Utc::now(),
        }
    }

    fn waiting(session_id: Uuid, expires_in: i64) -> Waiting {
        Waiting {
            id: Uuid::now_v7(),
            session_id,
            call_id: "c".to_owned(),
            name: "shell".to_owned(),
            arguments: json!({"command": "true"}),
            read_only: false,
            capabilities: json!(["process"]),
            status: InvocationStatus::PendingApproval,
            expires_at: Some(Utc::now() + chrono::Duration::seconds(expires_in)),
        }
    }

    #[test]
    fn one_decision_per_waiting_call_and_no_approval_past_its_wait_or_its_session() {
        let id = Uuid::now_v7();
        let active = session(id, SessionStatus::Active, 5);
        let closed = session(id, SessionStatus::Closed, 5);
        let mut denied = ok();
        denied.status = CallStatus::Denied;
        // Approved in time: decided, then started, two seqs on.
        let (plan, done) = decided_plan(&active, &waiting(id, 60), json!({}), None).unwrap();
        let kinds: Vec<EventKind> = plan.events.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [EventKind::ApprovalDecided, EventKind::InvocationStarted]
        );
        assert_eq!((done.decided_seq, done.next_seq), (6, 7));
        assert_eq!(plan.last_seqs, vec![(id, 7)]);
        assert!(plan.finishes.is_empty());
        // Denied: decided, then finished denied.
        let (plan, _) =
            decided_plan(&active, &waiting(id, 60), json!({}), Some(denied.clone())).unwrap();
        let kinds: Vec<EventKind> = plan.events.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [EventKind::ApprovalDecided, EventKind::InvocationFinished]
        );
        assert_eq!(plan.finishes[0].outcome.status, CallStatus::Denied);
        // Too late, or in a closed session: no approval; a denial still lands.
        assert!(matches!(
            decided_plan(&active, &waiting(id, -1), json!({}), None),
            Err(WriteError::WaitEnded(_))
        ));
        assert!(matches!(
            decided_plan(&closed, &waiting(id, 60), json!({}), None),
            Err(WriteError::SessionNotActive)
        ));
        assert!(decided_plan(&closed, &waiting(id, -1), json!({}), Some(denied.clone())).is_ok());
        // Decided before: nothing more.
        let mut decided = waiting(id, 60);
        decided.status = InvocationStatus::Running;
        assert!(matches!(
            decided_plan(&active, &decided, json!({}), Some(denied)),
            Err(WriteError::NotPending(InvocationStatus::Running))
        ));
    }

    fn ok() -> Outcome {
        Outcome {
            status: CallStatus::Ok,
            content: "done".to_owned(),
            truncated: None,
            output_chars: 4,
            output_sha256: None,
            finished_at: Utc::now(),
            duration_ms: 1.0,
            reads: Vec::new(),
            structured: None,
        }
    }

    #[test]
    fn a_start_finished_in_the_same_batch_is_inserted_finished() {
        let s = Uuid::now_v7();
        let inv = start(s, "a");
        let id = inv.id;
        let plan = plan(
            vec![
                Write::Start { invocation: inv },
                Write::Finish {
                    session_id: s,
                    invocation_id: id,
                    outcome: ok(),
                    side_effects: vec![],
                    blobs: vec![],
                },
            ],
            vec![session(s, SessionStatus::Active, 3)],
            vec![],
        );
        assert_eq!(
            plan.results,
            vec![
                Ok(Assigned {
                    started_seq: 4,
                    finished_seq: None
                }),
                Ok(Assigned {
                    started_seq: 4,
                    finished_seq: Some(5)
                }),
            ]
        );
        assert!(plan.finishes.is_empty());
        assert_eq!(plan.invocations.len(), 1);
        assert_eq!(
            plan.invocations[0].finish.as_ref().map(|f| f.finished_seq),
            Some(5)
        );
        assert_eq!(plan.last_seqs, vec![(s, 5)]);
    }

    fn record(invocation: NewInvocation, side_effects: Vec<NewEvent>) -> Write {
        Write::Record {
            invocation,
            outcome: ok(),
            side_effects,
            blobs: vec![],
        }
    }

    #[test]
    fn a_read_with_no_side_effect_is_one_event_carrying_its_start() {
        let s = Uuid::now_v7();
        let read = start(s, "read");
        let mut mutating = start(s, "write");
        mutating.read_only = false;
        let effect = NewEvent {
            kind: EventKind::FileModified,
            data: json!({"path": "a"}),
        };
        let plan = plan(
            vec![
                record(read, vec![]),
                record(mutating, vec![]),
                record(start(s, "read2"), vec![effect]),
            ],
            vec![session(s, SessionStatus::Active, 3)],
            vec![],
        );
        let assigned = |started_seq, finished_seq| {
            Ok(Assigned {
                started_seq,
                finished_seq: Some(finished_seq),
            })
        };
        // The read: one event, its finish at its start's seq; the others: start, end.
        assert_eq!(
            plan.results,
            vec![assigned(4, 4), assigned(5, 6), assigned(7, 9)]
        );
        let kinds: Vec<(i64, EventKind)> = plan.events.iter().map(|e| (e.seq, e.kind)).collect();
        assert_eq!(
            kinds,
            [
                (4, EventKind::InvocationFinished),
                (5, EventKind::InvocationStarted),
                (6, EventKind::InvocationFinished),
                (7, EventKind::InvocationStarted),
                (8, EventKind::FileModified),
                (9, EventKind::InvocationFinished),
            ]
        );
        let once = &plan.events[0].data;
        assert_eq!(once["call_id"], "read");
        assert_eq!(once["arguments"], json!({}));
        assert_eq!(once["read_only"], true);
        assert_eq!(once["status"], "ok");
        assert_eq!(once["output_chars"], 4);
        // Which events start a call: the one of the read, and the two starts.
        let starts: Vec<i64> = plan
            .events
            .iter()
            .filter(|e| e.kind.starts_call(&e.data))
            .map(|e| e.seq)
            .collect();
        assert_eq!(starts, [4, 5, 7]);
        let row = &plan.invocations[0];
        assert_eq!(row.started_seq, 4);
        assert_eq!(row.finish.as_ref().map(|f| f.finished_seq), Some(4));
        assert_eq!(row.status(), "ok");
        assert_eq!(plan.last_seqs, vec![(s, 9)]);
    }

    #[test]
    fn failed_writes_add_no_rows_and_no_seqs() {
        let s = Uuid::now_v7();
        let plan = plan(
            vec![
                Write::Start {
                    invocation: start(s, "a"),
                },
                Write::Start {
                    invocation: start(s, "a"),
                },
                Write::Finish {
                    session_id: s,
                    invocation_id: Uuid::now_v7(),
                    outcome: ok(),
                    side_effects: vec![],
                    blobs: vec![Blob::new(b"x".to_vec())],
                },
            ],
            vec![session(s, SessionStatus::Active, 0)],
            vec![],
        );
        assert!(matches!(plan.results[1], Err(WriteError::DuplicateCall(_))));
        assert_eq!(plan.results[2], Err(WriteError::NotRunning));
        assert_eq!(plan.events.len(), 1);
        assert!(plan.blobs.is_empty());
        assert_eq!(plan.last_seqs, vec![(s, 1)]);
    }
}
