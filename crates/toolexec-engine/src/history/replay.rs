//! Verify replays: a new session starts from a recorded session's initial state (the state
//! right before its first call) and re-runs its recorded calls — and its rewinds — in the order
//! they were recorded, through the same pipeline as any call (validated, sandboxed, recorded in
//! the replay session's own log). Each call is then compared with its record:
//!
//! - **status**: the same status;
//! - **output**: the full (untruncated) outputs, line by line, after the differences that say
//!   nothing about the outcome are taken out — the ids the two sessions gave the same things
//!   (session and invocation ids) and the times a result reports (`after 0.04 s`);
//! - **side effects**: the file changes (path, kind, contents hash, mode, symlink target) and
//!   plan updates, in path order; process events by id and kind.
//!
//! The report names, per call, whether each aspect matched and, for each that did not, the first
//! difference: the line of output, the file. Call ids are the recorded ones, so the replay
//! session's log reads like the source's. A call reading the output of an earlier one
//! (`read_output`) is given the replay's invocation id for it.
//!
//! The source is read a page of ids at a time and one call when it is re-run ([`Steps`]), never
//! whole. A call the session's `policy.approval` gates waits for a person again, as any call of
//! the replay session would: an approval in the source was for that run only
//! (`History::decided`, docs/design.md, "Approval gates").
//!
//! Observations from outside — the responses of tools that declare the `network` capability
//! (`web_fetch`, `web_search`: their `web.exchange` events) — are served from the record, never
//! the network: a call is matched by tool, canonical arguments hash and ordinal among the calls
//! with both the same. A replay re-runs the source's calls in order, so the k-th such call of
//! the replay is the k-th of the source: the one it re-runs, which the engine serves it from
//! when its tool and arguments hash match (and otherwise serves nothing: the call then says its
//! record holds no response, and the report shows the divergence). Only while the replay runs:
//! calls made in the replay session afterwards go to the network like any session's.
use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};
use toolexec_core::{
    Aspect, Call, CallResult, Divergence, Event, EventKind, Invocation, NewSession, Origin,
    OriginKind, Replay, ReplayMode, ReplayStatus, ReplayedCall, RewindRequest, Session, new_id,
};
use uuid::Uuid;

use toolexec_tools::observe::{Observed, Recorded};

use super::History;
use crate::calls::{CallBatch, SessionRef};
use crate::{Engine, EngineError, Result};

/// Longest text of a line (or value) a divergence quotes.
const QUOTE_CHARS: usize = 500;

/// Calls replayed between two saves of the report (it can be followed while it runs).
const SAVE_EVERY: usize = 10;

/// One thing the source session did that a replay does again.
#[derive(Debug, Clone)]
enum Step {
    Call(Box<Invocation>),
    /// A rewind to the source's `to_seq`; `last_seq` is the source's seq after it.
    Rewind {
        to_seq: i64,
        last_seq: i64,
    },
}

/// A step as the source's log names it: what [`Steps`] pages through.
#[derive(Debug, Clone, Copy)]
enum StepRef {
    /// The event that starts a call ([`EventKind::starts_call`]).
    Call(Uuid),
    Rewind {
        to_seq: i64,
        seq: i64,
    },
}

/// Events of the source read per page while stepping through it.
const STEP_PAGE: u32 = 1000;

/// What one page of the source's log may hold: events' data above 16 KiB (a call's arguments)
/// is not read, only the step's ids are needed.
const STEP_BOUNDS: toolexec_store::pages::ByteBounds = toolexec_store::pages::ByteBounds {
    max_bytes: 1024 * 1024,
    inline_bytes: 16 * 1024,
    excerpt_bytes: 0,
    overhead_bytes: 256,
};

/// The source's calls (every recorded invocation) and rewinds up to its `last_seq`, in log
/// order, read a page at a time: a replay holds one page of the log's ids and the call it
/// re-runs, never the log whole.
struct Steps {
    tenant_id: Uuid,
    session_id: Uuid,
    up_to: i64,
    after: i64,
    page: std::collections::VecDeque<StepRef>,
    /// Calls started and not finished yet, as far as the log is read.
    open: std::collections::HashSet<Uuid>,
    done: bool,
}

impl Steps {
    fn of(source: &Session) -> Self {
        Self {
            tenant_id: source.tenant_id,
            session_id: source.id,
            up_to: source.last_seq,
            after: 0,
            page: std::collections::VecDeque::new(),
            open: std::collections::HashSet::new(),
            done: false,
        }
    }

    async fn next(&mut self, engine: &Engine) -> Result<Option<StepRef>> {
        loop {
            if let Some(step) = self.page.pop_front() {
                return Ok(Some(step));
            }
            if self.done {
                return Ok(None);
            }
            let page = engine
                .store
                .event_texts(
                    self.tenant_id,
                    self.session_id,
                    self.after,
                    STEP_PAGE,
                    STEP_BOUNDS,
                )
                .await?;
            self.done = !(page.more || page.events.len() == STEP_PAGE as usize);
            for event in page.events {
                if event.seq > self.up_to {
                    self.done = true;
                    break;
                }
                self.after = event.seq;
                match (event.kind, event.invocation_id) {
                    (EventKind::InvocationStarted, Some(id)) => {
                        self.open.insert(id);
                        self.page.push_back(StepRef::Call(id));
                    }
                    (EventKind::InvocationFinished, Some(id)) if self.open.remove(&id) => {}
                    // A finish with no start before it: a read recorded in one event (its
                    // finish is its start too), or a call denied before it ran (not a step).
                    (EventKind::InvocationFinished, Some(id)) => {
                        let data = match event.data {
                            Some(data) => data,
                            // Too big for the page: read it alone.
                            None => engine
                                .store
                                .event_text(self.tenant_id, self.session_id, event.seq, None)
                                .await?
                                .and_then(|e| e.data)
                                .unwrap_or_default(),
                        };
                        let data = serde_json::from_str::<Value>(&data).unwrap_or_default();
                        if EventKind::InvocationFinished.starts_call(&data) {
                            self.page.push_back(StepRef::Call(id));
                        }
                    }
                    (EventKind::WorkspaceRewound, _) => {
                        let data = match event.data {
                            Some(data) => data,
                            // A rewind that listed many files: read it alone.
                            None => engine
                                .store
                                .event_text(self.tenant_id, self.session_id, event.seq, None)
                                .await?
                                .and_then(|e| e.data)
                                .unwrap_or_default(),
                        };
                        let to_seq = serde_json::from_str::<Value>(&data)
                            .ok()
                            .and_then(|d| d["to_seq"].as_i64())
                            .unwrap_or(1);
                        self.page.push_back(StepRef::Rewind {
                            to_seq,
                            seq: event.seq,
                        });
                    }
                    _ => {}
                }
            }
        }
    }

    /// The next step, its call read from the store.
    async fn next_step(&mut self, engine: &Engine) -> Result<Option<Step>> {
        Ok(match self.next(engine).await? {
            None => None,
            Some(StepRef::Call(id)) => Some(Step::Call(Box::new(
                engine
                    .store
                    .invocation_page(self.tenant_id, id, 0, toolexec_store::SIDE_EFFECTS_PAGE)
                    .await?,
            ))),
            Some(StepRef::Rewind { to_seq, seq }) => Some(Step::Rewind {
                to_seq,
                last_seq: seq,
            }),
        })
    }
}

impl History {
    /// Starts a verify replay of a session of this tenant, waits for it up to the request
    /// limit, and returns its report as it is then (`running` if it goes on).
    pub async fn replay(
        &self,
        engine: &Arc<Engine>,
        tenant_id: Uuid,
        source_id: Uuid,
        mode: ReplayMode,
    ) -> Result<Replay> {
        let source = engine.store.get_session(tenant_id, source_id).await?;
        let slot = self.replay_slots.take(tenant_id)?;
        // How many calls, then the state right before the first step: two passes over the
        // ids of the source's log, a page at a time.
        let mut calls_total = 0u64;
        let mut counting = Steps::of(&source);
        while let Some(step) = counting.next(engine).await? {
            calls_total += u64::from(matches!(step, StepRef::Call(_)));
        }
        let mut steps = Steps::of(&source);
        let first = steps.next_step(engine).await?;
        let initial = first
            .as_ref()
            .map_or(source.last_seq, |s| match s {
                Step::Call(inv) => inv.started_seq - 1,
                Step::Rewind { last_seq, .. } => last_seq - 1,
            })
            .max(1);
        let permit = self.fold_permit(engine, 1).await?;
        let state = self.fold(engine, &source, initial).await?;
        let mut metadata = source.metadata.clone();
        if let Value::Object(m) = &mut metadata {
            m.insert("replay_of".into(), json!(source.id));
        }
        let new = NewSession {
            tools: source.tools.clone(),
            policy: Some(source.policy.clone()),
            env: Some(source.env.clone()),
            metadata: Some(metadata),
            files: None,
            environment: None,
        };
        let origin = Origin {
            kind: OriginKind::Replay,
            session_id: source.id,
            seq: initial,
        };
        // Before the session exists (a listing could show it): no client's batch runs in it
        // while the replay re-runs the source's calls.
        let id = new_id();
        let replaying = Replaying::start(engine, id);
        let (session, _) = self
            .create_from_state(
                engine,
                tenant_id,
                id,
                new,
                origin,
                source.environment.clone(),
                &state,
            )
            .await?;
        drop(state);
        drop(permit);
        let replay = Replay {
            id: new_id(),
            mode,
            status: ReplayStatus::Running,
            source_session_id: source.id,
            session_id: session.id,
            calls_total,
            calls_replayed: 0,
            calls_diverged: 0,
            calls: Vec::new(),
            error: None,
            created_at: chrono::Utc::now(),
            finished_at: None,
        };
        engine.store.save_replay(tenant_id, &replay).await?;
        let id = replay.id;
        let task = tokio::spawn({
            let engine = engine.clone();
            async move {
                let _slot = slot;
                let _replaying = replaying;
                engine
                    .history
                    .run_replay(
                        &engine,
                        tenant_id,
                        source,
                        session,
                        initial,
                        (first, steps),
                        replay,
                    )
                    .await
            }
        });
        let waited = std::time::Duration::from_millis(engine.config.limits.request_timeout_ms);
        match tokio::time::timeout(waited, task).await {
            Ok(Ok(done)) => Ok(done),
            Ok(Err(e)) => Err(EngineError::Internal(format!(
                "the replay's task failed: {e}"
            ))),
            Err(_) => Ok(engine.store.replay(tenant_id, id).await?),
        }
    }

    pub async fn get_replay(&self, engine: &Engine, tenant_id: Uuid, id: Uuid) -> Result<Replay> {
        Ok(engine.store.replay(tenant_id, id).await?)
    }

    #[allow(clippy::too_many_arguments)] // the engine it runs in is the eighth
    async fn run_replay(
        &self,
        engine: &Arc<Engine>,
        tenant_id: Uuid,
        source: Session,
        session: Session,
        initial: i64,
        (first, mut steps): (Option<Step>, Steps),
        mut replay: Replay,
    ) -> Replay {
        // Source seq → replay seq at each point both logs agree on.
        let mut seqs: Vec<(i64, i64)> = vec![(initial, session.last_seq.max(1))];
        let mut ids = Ids::default();
        ids.insert(source.id.to_string(), session.id.to_string());
        let mut failure = None;
        let mut next = Ok(first);
        let mut i = 0usize;
        loop {
            let step = match next {
                Ok(Some(step)) => step,
                Ok(None) => break,
                Err(e) => {
                    failure = Some(format!("reading the source's log: {e}"));
                    break;
                }
            };
            match step {
                Step::Call(recorded) => {
                    let entry = self
                        .replay_call(engine, tenant_id, &session, &recorded, &mut ids)
                        .await;
                    match entry {
                        Ok((entry, seq)) => {
                            if let (Some(finished), Some(seq)) = (recorded.finished_seq, seq) {
                                seqs.push((finished, seq));
                            }
                            if !entry.divergences.is_empty() {
                                replay.calls_diverged += 1;
                            }
                            replay.calls_replayed += 1;
                            replay.calls.push(entry);
                        }
                        Err(e) => {
                            failure = Some(format!("call {}: {e}", recorded.call_id));
                            break;
                        }
                    }
                }
                Step::Rewind { to_seq, last_seq } => {
                    let mapped = seqs
                        .iter()
                        .rev()
                        .find(|(src, _)| *src <= to_seq)
                        .map_or(1, |(_, dst)| *dst);
                    match self
                        .rewind(
                            engine,
                            tenant_id,
                            session.id,
                            RewindRequest {
                                to_seq: mapped,
                                allow_partial: true,
                            },
                        )
                        .await
                    {
                        Ok(done) => seqs.push((last_seq, done.seq)),
                        Err(e) => {
                            failure = Some(format!("rewind to {to_seq}: {e}"));
                            break;
                        }
                    }
                }
            }
            if i % SAVE_EVERY == SAVE_EVERY - 1 {
                let _ = engine.store.save_replay(tenant_id, &replay).await;
            }
            i += 1;
            next = steps.next_step(engine).await;
        }
        replay.status = if failure.is_some() {
            ReplayStatus::Failed
        } else {
            ReplayStatus::Finished
        };
        replay.error = failure;
        replay.finished_at = Some(chrono::Utc::now());
        if let Err(e) = engine.store.save_replay(tenant_id, &replay).await {
            tracing::error!(error = %e, replay = %replay.id, "the replay's report could not be saved");
        }
        replay
    }

    /// Re-runs one recorded call in the replay session and compares it with its record; the
    /// replay's seq of its `invocation.finished`.
    async fn replay_call(
        &self,
        engine: &Arc<Engine>,
        tenant_id: Uuid,
        session: &Session,
        recorded: &Invocation,
        ids: &mut Ids,
    ) -> Result<(ReplayedCall, Option<i64>)> {
        let mut arguments = map_ids(&recorded.arguments, &ids.to_replay);
        // A terminal is named by the id the replay's exec_command got for it.
        if recorded.name == "write_stdin"
            && let Some(id) = arguments["session_id"].as_u64()
            && let Some(mapped) = ids.terminals.get(&id)
        {
            arguments["session_id"] = json!(mapped);
        }
        let call = Call {
            id: recorded.call_id.clone(),
            name: recorded.name.clone(),
            arguments,
        };
        let results = engine
            .calls
            .run_calls(
                engine,
                SessionRef::new(tenant_id, session.id),
                CallBatch::replaying(call, recorded.id),
            )
            .await?;
        let mut result: CallResult = results
            .into_iter()
            .next()
            .ok_or_else(|| EngineError::Internal("a batch of one gave no result".into()))?;
        if result.status == toolexec_core::CallStatus::PendingApproval {
            result = self.decided(engine, tenant_id, session, result).await?;
        }
        ids.insert(recorded.id.to_string(), result.invocation_id.to_string());
        let replayed = engine
            .store
            .invocation_page(
                tenant_id,
                result.invocation_id,
                0,
                toolexec_store::SIDE_EFFECTS_PAGE,
            )
            .await?;
        let mut divergences = Vec::new();
        let status_matched = recorded.status == replayed.status;
        if !status_matched {
            divergences.push(Divergence {
                aspect: Aspect::Status,
                detail: format!(
                    "recorded {}, replayed {}",
                    recorded.status.as_str(),
                    replayed.status.as_str()
                ),
                line: None,
                path: None,
                recorded: Some(recorded.status.as_str().into()),
                replayed: Some(replayed.status.as_str().into()),
            });
        }
        let opened = |effects: &[Event]| {
            effects
                .iter()
                .find(|e| e.kind == EventKind::TerminalOpened)
                .and_then(|e| e.data["terminal_id"].as_u64())
        };
        if let (Some(a), Some(b)) = (
            opened(&recorded.side_effects),
            opened(&replayed.side_effects),
        ) {
            ids.terminals.insert(a, b);
            let n = ids.terminal_tokens.0.len();
            ids.terminal_tokens.0.insert(a, n);
            ids.terminal_tokens.1.insert(b, n);
        }
        let before = engine
            .store
            .invocation_output(tenant_id, recorded.id)
            .await?;
        let after = engine
            .store
            .invocation_output(tenant_id, replayed.id)
            .await?;
        let terminal = matches!(recorded.name.as_str(), "exec_command" | "write_stdin");
        let (before, after) = if terminal {
            (
                terminal_block(&before, &ids.terminal_tokens.0),
                terminal_block(&after, &ids.terminal_tokens.1),
            )
        } else {
            (before, after)
        };
        let output = first_line_difference(
            &normalize(&before, &ids.recorded),
            &normalize(&after, &ids.replayed),
        );
        let output_matched = output.is_none();
        divergences.extend(output);
        let effects = first_effect_difference(&recorded.side_effects, &replayed.side_effects);
        let side_effects_matched = effects.is_none();
        divergences.extend(effects);
        Ok((
            ReplayedCall {
                call_id: recorded.call_id.clone(),
                name: recorded.name.clone(),
                recorded_invocation_id: recorded.id,
                replayed_invocation_id: Some(replayed.id),
                recorded_status: recorded.status,
                replayed_status: Some(replayed.status),
                served_from_record: replayed
                    .side_effects
                    .iter()
                    .any(|e| e.kind == EventKind::WebExchange && !e.data["served_from"].is_null()),
                status_matched,
                output_matched,
                side_effects_matched,
                divergences,
            },
            Some(result.seq),
        ))
    }
}

impl History {
    /// A replayed call the session's policy gates waits for a person again, as any call of the
    /// session would (docs/design.md, "Approval gates"): its result once it is decided and has
    /// run (or was denied, or its wait ended). Followed as `GET /v1/invocations/{id}?wait=`
    /// does; polled every second when the tenant's streams are all in use.
    async fn decided(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        session: &Session,
        mut result: CallResult,
    ) -> Result<CallResult> {
        let wait_ms = session
            .policy
            .approval
            .as_ref()
            .map_or(toolexec_core::DEFAULT_APPROVAL_TIMEOUT_MS, |p| {
                p.timeout_ms()
            })
            .min(engine.config.limits.max_approval_wait_ms);
        // The expiry denies it at the end of its wait; the margin covers a late timer.
        let deadline = tokio::time::Instant::now()
            + std::time::Duration::from_millis(wait_ms)
            + std::time::Duration::from_secs(60);
        while result.status == toolexec_core::CallStatus::PendingApproval {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(EngineError::Internal(format!(
                    "invocation {} still waits for approval past the end of its wait",
                    result.invocation_id
                )));
            }
            let waited = left.min(std::time::Duration::from_secs(60));
            let t0 = tokio::time::Instant::now();
            result = engine
                .approvals
                .after_approval(engine, tenant_id, result, waited)
                .await;
            if result.status == toolexec_core::CallStatus::PendingApproval && t0.elapsed() < waited
            {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }
        Ok(result)
    }
}

/// Marks a session as a running replay's, until dropped: no other batch may run in it.
pub(crate) struct Replaying {
    engine: Arc<Engine>,
    session_id: Uuid,
}

impl Replaying {
    pub(crate) fn start(engine: &Arc<Engine>, session_id: Uuid) -> Self {
        if let Ok(mut set) = engine.history.replaying.lock() {
            set.insert(session_id);
        }
        Self {
            engine: engine.clone(),
            session_id,
        }
    }
}

impl Drop for Replaying {
    fn drop(&mut self) {
        if let Ok(mut set) = self.engine.history.replaying.lock() {
            set.remove(&self.session_id);
        }
    }
}

impl History {
    /// Whether a replay is re-running calls in this session (a poisoned lock counts as yes:
    /// refusing a client's batch is the safe side).
    pub(crate) fn replay_running(&self, session_id: Uuid) -> bool {
        self.replaying
            .lock()
            .map_or(true, |set| set.contains(&session_id))
    }

    /// The observations of a web call a verify replay re-runs as `recorded`: that call's
    /// record, if its tool and arguments hash are this call's (else an empty record: nothing is
    /// served, and nothing goes to the network).
    pub(crate) async fn observed_for(
        &self,
        engine: &Engine,
        session: &Session,
        recorded: Uuid,
        call: &Call,
        args_hash: &str,
    ) -> Result<Observed> {
        let source = engine
            .store
            .invocation_page(
                session.tenant_id,
                recorded,
                0,
                toolexec_store::SIDE_EFFECTS_PAGE,
            )
            .await?;
        if source.name != call.name || source.arguments_sha256 != args_hash {
            return Ok(Observed::Replay(Arc::new(Recorded::default())));
        }
        let exchanges: Vec<Value> = source
            .side_effects
            .into_iter()
            .filter(|e| e.kind == EventKind::WebExchange)
            .map(|e| e.data)
            .collect();
        let shas: Vec<String> = exchanges
            .iter()
            .filter(|d| d["body_stored"] == true)
            .filter_map(|d| d["body_sha256"].as_str().map(str::to_owned))
            .collect();
        let blobs: HashMap<String, bytes::Bytes> = if shas.is_empty() {
            HashMap::new()
        } else {
            engine
                .store
                .blobs(&shas)
                .await?
                .into_iter()
                .map(|b| (b.sha256, b.bytes))
                .collect()
        };
        Ok(Observed::Replay(Arc::new(Recorded::new(
            recorded, exchanges, &blobs,
        ))))
    }
}

/// The arguments with the source's ids (an earlier call's invocation id for `read_output`)
/// replaced by the replay's.
fn map_ids(args: &Value, ids: &HashMap<String, String>) -> Value {
    match args {
        Value::String(s) => Value::String(ids.get(s).cloned().unwrap_or_else(|| s.clone())),
        Value::Array(items) => Value::Array(items.iter().map(|v| map_ids(v, ids)).collect()),
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), map_ids(v, ids)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The ids the source and the replay gave the same things (the sessions, each call's
/// invocation), and the token each stands for in a compared output.
#[derive(Debug, Default)]
struct Ids {
    to_replay: HashMap<String, String>,
    recorded: HashMap<String, usize>,
    replayed: HashMap<String, usize>,
    /// Terminal ids (exec_command's session IDs): the source's to the replay's.
    terminals: HashMap<u64, u64>,
    /// The token each terminal id stands for: the source's, the replay's.
    terminal_tokens: (HashMap<u64, usize>, HashMap<u64, usize>),
}

/// A terminal call's block (exec_command, write_stdin) with what differs from run to run made
/// equal: the chunk id, the wall time, and the terminal's id (as the token of the terminal it
/// names).
fn terminal_block(text: &str, tokens: &HashMap<u64, usize>) -> String {
    let id_token = |prefix: &str, line: &str| -> Option<String> {
        let id: u64 = line.strip_prefix(prefix)?.trim().parse().ok()?;
        Some(match tokens.get(&id) {
            Some(n) => format!("{prefix}<terminal {n}>"),
            None => line.to_owned(),
        })
    };
    let mut out: Vec<String> = Vec::new();
    let mut in_output = false;
    for line in text.split('\n') {
        if in_output {
            out.push(line.to_owned());
            continue;
        }
        let shown = if line.starts_with("Chunk ID: ") {
            "Chunk ID: …".to_owned()
        } else if line.starts_with("Wall time: ") {
            "Wall time: …".to_owned()
        } else if let Some(l) = id_token("Process running with session ID ", line) {
            l
        } else if let Some(l) = id_token("write_stdin failed: Unknown process id ", line) {
            l
        } else {
            line.to_owned()
        };
        in_output = line == "Output:";
        out.push(shown);
    }
    out.join("\n")
}

impl Ids {
    fn insert(&mut self, source: String, replay: String) {
        let n = self.recorded.len();
        self.recorded.insert(source.clone(), n);
        self.replayed.insert(replay.clone(), n);
        self.to_replay.insert(source, replay);
    }
}

/// Length of a hyphenated UUID, the form every id of the service takes.
const UUID_LEN: usize = 36;

fn is_uuid(b: &[u8]) -> bool {
    b.len() == UUID_LEN
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// An output with what says nothing of the outcome made equal: each id of `tokens` (the
/// source's or the replay's) becomes the token of the thing it names, in one pass over the
/// text, and a reported time (`after 0.04 s`, `after 12 ms`) becomes `after … s`.
fn normalize(text: &str, tokens: &HashMap<String, usize>) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let (mut i, mut copied) = (0, 0);
    while i + UUID_LEN <= b.len() {
        // An id starts at a hex digit, and a UUID's bytes are all ASCII: `i` and `i + 36`
        // are character boundaries.
        if b[i + 8] == b'-'
            && is_uuid(&b[i..i + UUID_LEN])
            && let Some(n) = tokens.get(&text[i..i + UUID_LEN])
        {
            out.push_str(&text[copied..i]);
            out.push_str(&format!("<id {n}>"));
            i += UUID_LEN;
            copied = i;
            continue;
        }
        i += 1;
    }
    out.push_str(&text[copied..]);
    times_out(&out)
}

/// `after 0.04 s` / `after 1.5 ms` → `after … s` / `after … ms`.
fn times_out(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("after ") {
        out.push_str(&rest[..i + 6]);
        rest = &rest[i + 6..];
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let unit = &rest[digits..];
        if digits > 0 && (unit.starts_with(" s") || unit.starts_with(" ms")) {
            out.push('…');
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}

fn quote(s: &str) -> String {
    if s.chars().count() <= QUOTE_CHARS {
        s.to_owned()
    } else {
        let cut: String = s.chars().take(QUOTE_CHARS).collect();
        format!("{cut}…")
    }
}

fn first_line_difference(recorded: &str, replayed: &str) -> Option<Divergence> {
    if recorded == replayed {
        return None;
    }
    let mut a = recorded.lines();
    let mut b = replayed.lines();
    let mut line = 0u64;
    loop {
        line += 1;
        match (a.next(), b.next()) {
            (Some(x), Some(y)) if x == y => continue,
            (None, None) => {
                // Same lines, different line endings or a final newline.
                return Some(Divergence {
                    aspect: Aspect::Output,
                    detail: "the outputs differ only in their line endings".into(),
                    line: Some(line),
                    path: None,
                    recorded: None,
                    replayed: None,
                });
            }
            (x, y) => {
                return Some(Divergence {
                    aspect: Aspect::Output,
                    detail: match (x, y) {
                        (Some(_), Some(_)) => format!("line {line} of the output differs"),
                        (Some(_), None) => {
                            format!("the replayed output ends before line {line}")
                        }
                        _ => format!("the replayed output has more lines, from line {line}"),
                    },
                    line: Some(line),
                    path: None,
                    recorded: x.map(quote),
                    replayed: y.map(quote),
                });
            }
        }
    }
}

/// A side effect as compared: what it is and what it left, not when or how long it took.
fn comparable(event: &Event) -> Option<(String, String)> {
    let d = &event.data;
    let key = match event.kind {
        EventKind::FileCreated | EventKind::FileModified | EventKind::FileDeleted => {
            d["path_b64"].as_str().map_or_else(
                || d["path"].as_str().unwrap_or_default().to_owned(),
                str::to_owned,
            )
        }
        EventKind::ProcessStarted | EventKind::ProcessExited => {
            format!("process {}", d["process_id"].as_str().unwrap_or_default())
        }
        EventKind::PlanUpdated => "plan".to_owned(),
        EventKind::FilesChanged => "files.changed".to_owned(),
        EventKind::WebExchange => format!(
            "web {} {}",
            d["role"].as_str().unwrap_or_default(),
            d["hop"]
        ),
        EventKind::TodoCreated | EventKind::TodoUpdated | EventKind::TodoDeleted => {
            format!(
                "todo {} {}",
                d["id"].as_str().unwrap_or_default(),
                event.kind.as_str()
            )
        }
        _ => return None,
    };
    let value = match event.kind {
        EventKind::FileCreated | EventKind::FileModified | EventKind::FileDeleted => json!({
            "kind": event.kind.as_str(),
            "after_sha256": d["after_sha256"],
            "after_mode": d["after_mode"],
            "symlink_target": d["symlink_target"],
        }),
        EventKind::ProcessStarted => json!({"kind": event.kind.as_str(), "command": d["command"]}),
        EventKind::ProcessExited => json!({"kind": event.kind.as_str()}),
        // What was observed, not when or how fast.
        EventKind::WebExchange => json!({
            "url": d["url"], "status": d["status"], "body_sha256": d["body_sha256"],
            "error": d["error"],
        }),
        EventKind::FilesChanged => json!({
            "changes": d["changes"], "created": d["created"], "modified": d["modified"],
            "deleted": d["deleted"], "after_bytes": d["after_bytes"],
        }),
        _ => d.clone(),
    };
    Some((key, value.to_string()))
}

fn first_effect_difference(recorded: &[Event], replayed: &[Event]) -> Option<Divergence> {
    let sorted = |events: &[Event]| {
        let mut v: Vec<(String, String)> = events.iter().filter_map(comparable).collect();
        v.sort();
        v
    };
    let (a, b) = (sorted(recorded), sorted(replayed));
    if a == b {
        return None;
    }
    let mut ia = a.iter().peekable();
    let mut ib = b.iter().peekable();
    loop {
        match (ia.peek(), ib.peek()) {
            (Some(x), Some(y)) if x == y => {
                ia.next();
                ib.next();
            }
            (Some(x), Some(y)) if x.0 == y.0 => {
                return Some(effect_divergence(&x.0, "differs", Some(&x.1), Some(&y.1)));
            }
            (Some(x), Some(y)) if x.0 < y.0 => {
                return Some(effect_divergence(
                    &x.0,
                    "was not changed by the replay",
                    Some(&x.1),
                    None,
                ));
            }
            (Some(_) | None, Some(y)) => {
                return Some(effect_divergence(
                    &y.0,
                    "was changed by the replay only",
                    None,
                    Some(&y.1),
                ));
            }
            (Some(x), None) => {
                return Some(effect_divergence(
                    &x.0,
                    "was not changed by the replay",
                    Some(&x.1),
                    None,
                ));
            }
            (None, None) => return None,
        }
    }
}

fn effect_divergence(
    key: &str,
    how: &str,
    recorded: Option<&String>,
    replayed: Option<&String>,
) -> Divergence {
    Divergence {
        aspect: Aspect::SideEffects,
        detail: format!("{key}: {how}"),
        line: None,
        path: Some(key.to_owned()),
        recorded: recorded.map(|s| quote(s)),
        replayed: replayed.map(|s| quote(s)),
    }
}

#[cfg(test)]
mod tests;
