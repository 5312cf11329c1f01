//! A batch's envelope and its plan: the checks a batch must pass before anything of it runs
//! (size, call ids, tool names), and for each call what to do — return what is recorded for its
//! id, mirror an earlier call of the same batch, or run it with its tool, resolved once here.
use std::collections::HashMap;
use std::sync::Arc;

use toolexec_core::ProblemCode;
use toolexec_core::{Call, Invocation, Session, SessionStatus};
use toolexec_tools::Resolved;

use super::{Calls, SessionRef};
use crate::callindex::Seen;
use crate::canonical::arguments_sha256;
use crate::runtimes::{SessionRuntime, invalid};
use crate::{Engine, EngineError, Result};

/// Longest call id accepted, in characters (what the OpenAPI document states as `maxLength`):
/// model tool-call ids are short; this bounds index keys (at most 1 KiB of UTF-8).
pub const MAX_CALL_ID_CHARS: usize = 256;

/// How one call of a batch is handled.
pub(super) enum Plan {
    /// Already recorded (or running elsewhere): return what the record says.
    Recorded(Box<Invocation>),
    /// Same id as an earlier call of this batch (same arguments): mirror its result.
    Alias(usize),
    /// Run it with this tool (`None`: no such tool, recorded as `unknown_tool`).
    Run(Option<Resolved>),
}

impl Plan {
    /// A mutating call runs alone; everything else of a batch may run together.
    pub(super) fn is_mutating(&self) -> bool {
        matches!(self, Plan::Run(Some(tool)) if !tool.spec().read_only)
    }
}

/// A batch ready to schedule.
pub(super) struct Planned {
    pub session: Session,
    /// The session's runtime, when something of the batch runs.
    pub runtime: Option<Arc<SessionRuntime>>,
    pub plans: Vec<Plan>,
    /// The canonical hash of each call's arguments: its identity for retries.
    pub hashes: Vec<String>,
    /// This node's lease of the session, held while the batch runs (when something runs).
    pub _lease: Option<crate::leases::LeaseGuard>,
}

/// Checks what does not depend on the store: batch size, call id length, NUL in ids and names.
pub(super) fn check_envelope(calls: &[Call], max_calls: usize) -> Result<()> {
    if calls.is_empty() {
        return Err(invalid(
            ProblemCode::EmptyBatch,
            "calls: send at least one call".into(),
        ));
    }
    if calls.len() > max_calls {
        return Err(invalid(
            ProblemCode::BatchTooLarge,
            format!("calls: at most {max_calls} calls per request; split the batch"),
        ));
    }
    for (i, c) in calls.iter().enumerate() {
        let chars = c.id.chars().count();
        if chars == 0 || chars > MAX_CALL_ID_CHARS {
            return Err(invalid(
                ProblemCode::InvalidCallId,
                format!("calls/{i}/id: must be 1 to {MAX_CALL_ID_CHARS} characters"),
            ));
        }
        // No database text type holds NUL, and unlike arguments these cannot be recorded with
        // a replacement character: the id is the call's identity, the name its tool.
        if c.id.contains('\0') {
            return Err(invalid(
                ProblemCode::InvalidCallId,
                format!("calls/{i}/id: must not contain a NUL character (\\u0000)"),
            ));
        }
        if c.name.contains('\0') {
            return Err(invalid(
                ProblemCode::InvalidToolName,
                format!("calls/{i}/name: must not contain a NUL character (\\u0000)"),
            ));
        }
    }
    Ok(())
}

impl Calls {
    /// Plans a batch whose envelope passed [`check_envelope`]: ids repeated within the batch,
    /// ids already recorded (retries), the tool of each call to run, and the session's runtime
    /// if anything runs. Errors: a reused id (409), a closed session with calls to run (409),
    /// an unknown session (404).
    pub(super) async fn plan_batch(
        &self,
        engine: &Engine,
        session_ref: &SessionRef,
        calls: &[Call],
    ) -> Result<Planned> {
        let (tenant_id, session_id) = (session_ref.tenant_id, session_ref.id);
        let hashes: Vec<String> = calls
            .iter()
            .map(|c| arguments_sha256(&c.arguments))
            .collect();

        // Same id twice in one batch: fine if it is the same call, a conflict otherwise.
        let mut first: HashMap<&str, usize> = HashMap::new();
        let mut plans: Vec<Option<Plan>> = Vec::with_capacity(calls.len());
        for (i, c) in calls.iter().enumerate() {
            match first.get(c.id.as_str()) {
                Some(&j) => {
                    if hashes[i] != hashes[j] || calls[j].name != c.name {
                        return Err(reused(&c.id));
                    }
                    plans.push(Some(Plan::Alias(j)));
                }
                None => {
                    first.insert(&c.id, i);
                    plans.push(None);
                }
            }
        }
        let ids: Vec<String> = first.keys().map(|s| (*s).to_owned()).collect();
        let (session, existing, cached) =
            match engine.runtimes.cached_runtime(tenant_id, session_id)? {
                // The node serving the session knows which call ids are new: only possible
                // retries (and the index's rare false positives) need a store read.
                Some(rt) => {
                    let ask: Vec<String> = calls
                        .iter()
                        .zip(&plans)
                        .filter(|(c, p)| p.is_none() && rt.seen(&c.id) == Seen::Maybe)
                        .map(|(c, _)| c.id.clone())
                        .collect();
                    let existing = if ask.is_empty() {
                        Vec::new()
                    } else {
                        engine
                            .store
                            .lookup_calls(tenant_id, session_id, &ask)
                            .await?
                            .1
                    };
                    engine.metrics.call_index_answers(
                        (ids.len() - ask.len()) as u64,
                        existing.len() as u64,
                        (ask.len() - existing.len()) as u64,
                    );
                    (rt.session.clone(), existing, Some(rt))
                }
                None => {
                    let (session, existing) = engine
                        .store
                        .lookup_calls(tenant_id, session_id, &ids)
                        .await?;
                    (session, existing, None)
                }
            };
        let mut existing: HashMap<String, Invocation> = existing
            .into_iter()
            .map(|inv| (inv.call_id.clone(), inv))
            .collect();

        let mut needs_run = false;
        for (i, c) in calls.iter().enumerate() {
            if plans[i].is_some() {
                continue;
            }
            if let Some(inv) = existing.remove(&c.id) {
                if inv.name != c.name || inv.arguments_sha256 != hashes[i] {
                    return Err(reused(&c.id));
                }
                plans[i] = Some(Plan::Recorded(Box::new(inv)));
            } else {
                needs_run = true;
                plans[i] = Some(Plan::Run(engine.registry.resolve(&c.name)));
            }
        }
        let runtime = if needs_run {
            if session.status != SessionStatus::Active {
                return Err(EngineError::Conflict {
                    code: ProblemCode::SessionClosed,
                    detail: format!(
                        "session {session_id} is closed; create a new session (or fork this one) to run more calls"
                    ),
                });
            }
            // One node at a time runs the session's calls; one that takes the session over
            // from another forgets what it remembered of it. Routing the request may have
            // taken the lease already (from memory: this node holds it, so none held it since).
            let routed = session_ref.lease.as_ref().and_then(|l| l.take(session_id));
            let (lease, previous) = match routed {
                Some(lease) => (lease, None),
                None => engine.cluster.hold(session_id).await?,
            };
            let cached = if previous.is_some() {
                engine.runtimes.forget_runtime(session_id);
                None
            } else {
                cached
            };
            Some((
                match cached {
                    Some(rt) => rt,
                    None => {
                        engine
                            .runtimes
                            .runtime(engine, &session, previous.as_deref())
                            .await?
                    }
                },
                lease,
            ))
        } else {
            None
        };
        let (runtime, lease) = match runtime {
            Some((rt, lease)) => (Some(rt), Some(lease)),
            None => (None, None),
        };
        Ok(Planned {
            session,
            runtime,
            plans: plans.into_iter().flatten().collect(),
            hashes,
            _lease: lease,
        })
    }
}

pub(super) fn reused(call_id: &str) -> EngineError {
    EngineError::Conflict {
        code: ProblemCode::CallIdReused,
        detail: format!(
            "call id '{call_id}' was already used in this session with other arguments; use a new id for a new call"
        ),
    }
}
