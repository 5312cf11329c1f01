//! Replicas that share one store: where a session's requests run, taking a session over from a
//! node that is gone, and leaving the cluster cleanly.
//!
//! A session lives on the node that last held its lease (`session_leases.node`): that node has
//! its workspace and its processes. Every node records a heartbeat (`nodes`, every third of the
//! lease TTL) with the address the others reach it at (`cluster.advertise_url`). A request that
//! must run where the session lives ([`Cluster::route`]) and reaches another node is forwarded
//! there by the API while that node is alive; once it is gone (no heartbeat within the TTL, or
//! it left after draining), the next node to get a call for the session takes it over: it takes
//! the lease (waiting out the old one's TTL), records the calls and background processes that
//! were running there as interrupted, and rebuilds the workspace from the log
//! ([`Cluster::take_over`]), which it records as `session.taken_over`. The log goes on gapless:
//! seqs are assigned by the store.
//!
//! This module decides; it does not move bytes between nodes (the API forwards requests) and
//! it does not fence a node that lost its lease while still running (see docs/design.md).
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use toolexec_core::{EventKind, Session, names};
use toolexec_store::{NewEvent, Store};
use toolexec_workspace::history;
use uuid::Uuid;

use crate::leases::{LeaseGuard, Leases};
use crate::{Engine, EngineError, Result};

/// Where this node stands among the replicas: the leases of the sessions it runs (taken,
/// renewed, released; the heartbeat), where a request for a session goes (here or forwarded),
/// taking over a session whose node is gone, draining and leaving. Writes
/// `session.taken_over`, and `process.exited` / `terminal.exited` for what the gone node was
/// running.
pub struct Cluster {
    store: Arc<dyn Store>,
    /// This node's name.
    node: String,
    /// Whether this node takes forwarded requests (`cluster.advertise_url` is set).
    forwards: bool,
    leases: Arc<Leases>,
}

/// Where a request for a session runs.
#[derive(Debug, Clone)]
pub enum Route {
    /// On this node (the session lives here, or nowhere alive: this node takes it over). With
    /// this node's lease of the session when it was held here already: the request hands it to
    /// the calls it runs ([`SessionRef::with_lease`]), which then do not check it again.
    ///
    /// [`SessionRef::with_lease`]: crate::SessionRef::with_lease
    Here(Option<RoutedLease>),
    /// On the node the session lives on, alive and reachable at `address`.
    Forward { node: String, address: String },
}

/// This node's lease of a session, taken where its request was routed and used by the calls
/// that request runs: one lease check per request. Clones share it (it travels in a request's
/// extensions); the first to run calls takes it, and it is let go when the last clone drops.
#[derive(Clone)]
pub struct RoutedLease(Arc<std::sync::Mutex<Option<LeaseGuard>>>);

impl RoutedLease {
    fn new(lease: LeaseGuard) -> Self {
        Self(Arc::new(std::sync::Mutex::new(Some(lease))))
    }

    /// The lease, if it is of `session` and no call of the request took it yet.
    pub(crate) fn take(&self, session: Uuid) -> Option<LeaseGuard> {
        let mut slot = self.0.lock().ok()?;
        if slot.as_ref().is_some_and(|l| l.session() == session) {
            slot.take()
        } else {
            None
        }
    }
}

impl std::fmt::Debug for RoutedLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoutedLease")
    }
}

/// How often a request for a session whose node is handing it over looks again.
const HANDOVER_POLL: Duration = Duration::from_millis(100);

/// What the model reads of a call that was running on a node that is gone.
const INTERRUPTED_BY_TAKEOVER: &str = "The node running this call stopped (it crashed, was \
     removed or lost its connection to the store) before the call ended, so its result was not \
     recorded. Another node took the session over: the workspace is as the log last recorded \
     it. Check the workspace state (for example with read_file or list_dir) before retrying \
     with a new call id.";

impl Cluster {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        node: String,
        forwards: bool,
        leases: Arc<Leases>,
    ) -> Self {
        Self {
            store,
            node,
            forwards,
            leases,
        }
    }

    /// This node's name.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Holds the lease of `session_id` for a call: see [`Leases::hold`].
    pub(crate) async fn hold(&self, session_id: Uuid) -> Result<(LeaseGuard, Option<String>)> {
        self.leases.hold(session_id).await
    }

    /// Gives up the lease of `session_id` (a closed session): see [`Leases::release`].
    pub(crate) async fn release(&self, session_id: Uuid) {
        self.leases.release(session_id).await;
    }

    /// Where a request that must run where `session_id` lives goes: here if this node serves
    /// the session (or the session lives nowhere alive, or on a node that takes no forwarded
    /// requests), else the node it lives on. A node handing its sessions over (draining) is
    /// waited for, up to `limits.lease_wait_ms`. Answers from memory while this node holds the
    /// session's lease (it ran a call of it within `limits.lease_linger_ms`), and then takes the
    /// lease for the request ([`Route::Here`]): a session in use costs nothing; otherwise one
    /// read of the store. A runtime this node still has cached is not enough: another node may
    /// have taken the session over since, and running here would take it back (and rebuild it)
    /// on every call.
    pub async fn route(&self, session_id: Uuid) -> Result<Route> {
        if !self.forwards {
            return Ok(Route::Here(None));
        }
        if let Some(lease) = self.leases.take_held(session_id) {
            return Ok(Route::Here(Some(RoutedLease::new(lease))));
        }
        let started = Instant::now();
        loop {
            let Some(owner) = self
                .store
                .session_owner(session_id, self.leases.ttl())
                .await?
            else {
                return Ok(Route::Here(None));
            };
            if owner.node == self.node || !owner.alive {
                return Ok(Route::Here(None));
            }
            match owner.address {
                None => return Ok(Route::Here(None)),
                Some(address) if !owner.draining => {
                    return Ok(Route::Forward {
                        node: owner.node,
                        address,
                    });
                }
                Some(_) => {
                    if started.elapsed() >= self.leases.wait() {
                        return Ok(Route::Here(None));
                    }
                    tokio::time::sleep(HANDOVER_POLL).await;
                }
            }
        }
    }

    /// Makes a session made on this node live here (its lease is taken once, and lingers): the
    /// other replicas forward its requests here from its first call on. A session whose lease
    /// could not be taken (the store failed just after creating it) is taken over by the first
    /// node to run a call of it, which rebuilds its workspace from the log.
    pub(crate) async fn settle(&self, session_id: Uuid) {
        if let Err(e) = self.leases.hold(session_id).await {
            tracing::warn!(session = %session_id, error = %e, "a new session's lease could not be taken");
        }
    }

    /// Whether `node` is still where `session_id` lives, and alive: a request forwarded there
    /// that has not been answered is given up once it is not (a node that froze or lost the
    /// network keeps connections open but answers nothing).
    pub async fn still_lives_on(&self, session_id: Uuid, node: &str) -> bool {
        match self
            .store
            .session_owner(session_id, self.leases.ttl())
            .await
        {
            Ok(Some(owner)) => owner.node == node && owner.alive,
            Ok(None) => false,
            // The store is down: nothing can be decided; keep waiting for the answer.
            Err(_) => true,
        }
    }

    /// How often a forwarded request that has not been answered checks that its node is alive.
    pub fn liveness_check_interval(&self) -> Duration {
        self.leases.ttl() / 2
    }

    /// The session an invocation belongs to (for routing a cancel to where it runs).
    pub async fn invocation_session(&self, invocation_id: Uuid) -> Result<Option<Uuid>> {
        Ok(self.store.invocation_session(invocation_id).await?)
    }

    /// Whether this node is draining (shutting down, handing its sessions over).
    pub fn draining(&self) -> bool {
        self.leases.draining()
    }

    /// Starts draining: the heartbeat says so at once, and requests for this node's sessions
    /// that reach other nodes wait for the hand-over instead of being forwarded here.
    pub async fn drain(&self) {
        self.leases.drain().await;
    }

    /// Leaves the cluster once this node's work is done: its leases are given up and its node
    /// record removed, so that the next call of each of its sessions, on any node, takes the
    /// session over at once instead of after the lease TTL.
    pub async fn leave(&self) {
        self.leases.release_all().await;
        if let Err(e) = self.store.remove_node(&self.node).await {
            tracing::warn!(error = %e, "this node's record could not be removed; the others take its sessions over once its heartbeat is older than the lease TTL");
        }
    }

    /// Takes a session over if the node it lives on is gone (its heartbeat older than the lease
    /// TTL): a call that node was running is then recorded interrupted. Nothing when it lives
    /// here or on a node that is alive.
    pub(crate) async fn take_over_if_orphaned(
        &self,
        engine: &Engine,
        tenant_id: Uuid,
        session_id: Uuid,
    ) -> Result<()> {
        let owner = self
            .store
            .session_owner(session_id, self.leases.ttl())
            .await?;
        if owner.is_none_or(|o| o.alive) {
            return Ok(());
        }
        let session = self.store.get_session(tenant_id, session_id).await?;
        if session.status != toolexec_core::SessionStatus::Active {
            return Ok(());
        }
        let (_lease, previous) = self.leases.hold(session_id).await?;
        if previous.is_some() {
            engine.runtimes.forget_runtime(session_id);
        }
        engine
            .runtimes
            .runtime(engine, &session, previous.as_deref())
            .await?;
        Ok(())
    }

    /// Makes this node the home of a session another node held last (or whose workspace is not
    /// here): the calls still `running` in the log are recorded `interrupted`, background
    /// processes that were running are recorded as exited (interrupted), and the workspace is
    /// rebuilt from the log — unless workspaces are on shared storage
    /// (`cluster.shared_workspaces`) and this one is there. Records `session.taken_over`.
    /// Returns the ids of the processes it recorded as gone.
    pub(crate) async fn take_over(
        &self,
        engine: &Engine,
        session: &Session,
        from: Option<&str>,
    ) -> Result<Vec<String>> {
        let started = Instant::now();
        let interrupted = self
            .store
            .interrupt_session(session.id, INTERRUPTED_BY_TAKEOVER)
            .await?;
        // Its calls waiting for approval stay waiting; this node times their waits now.
        engine
            .approvals
            .arm_pending(engine, toolexec_store::Waiters::Session(session.id))
            .await;
        // Re-read after the interruptions: the rebuild must see the log as it now ends.
        let session = self
            .store
            .get_session(session.tenant_id, session.id)
            .await?;
        let gone = self.running_processes(&session).await?;
        let terminals_gone = self.open_terminals(&session).await?;
        let name = session.id.to_string();
        let keep = engine.config.cluster.shared_workspaces && engine.workspaces.open(&name).is_ok();
        let (entries, unrestorable) = if keep {
            (None, Vec::new())
        } else {
            let permit = engine.history.fold_permit(engine, 1).await?;
            let state = engine
                .history
                .fold(engine, &session, session.last_seq)
                .await?;
            let plan = history::plan(std::iter::empty(), &state);
            // A copy left from an earlier stay of the session here is stale.
            engine.workspaces.remove(&name);
            let ws = Arc::new(engine.workspaces.create(&name).map_err(|e| {
                EngineError::Unavailable(format!(
                    "the workspace of session {} cannot be made on this node ({e})",
                    session.id
                ))
            })?);
            let (missing, failed) = engine.history.fill(engine, &ws, &plan).await?;
            drop(permit);
            let mut unrestorable: Vec<String> = plan
                .unrestorable
                .iter()
                .chain(missing.iter())
                .map(|p| names::display_bytes(p))
                .collect();
            unrestorable.extend(failed.iter().map(|(p, _)| names::display_bytes(p)));
            (Some(plan.write.len()), unrestorable)
        };
        let mut events: Vec<NewEvent> = gone
            .iter()
            .map(|(id, command)| NewEvent {
                kind: EventKind::ProcessExited,
                data: json!({
                    "process_id": id,
                    "command": command,
                    "state": {"state": "interrupted", "reason": "the session moved to another node"},
                }),
            })
            .collect();
        // Terminals lived on the node that is gone: recorded as ended with it.
        events.extend(terminals_gone.iter().map(|(id, command)| NewEvent {
            kind: EventKind::TerminalExited,
            data: json!({
                "terminal_id": id,
                "command": command,
                "exit_code": null,
                "killed_by": "the session moved to another node",
            }),
        }));
        events.push(NewEvent {
            kind: EventKind::SessionTakenOver,
            data: json!({
                "from_node": from,
                "node": engine.config.node,
                "invocations_interrupted": interrupted,
                "processes_interrupted": gone.iter().map(|(id, _)| id).collect::<Vec<_>>(),
                "workspace": if keep { "kept (shared storage)" } else { "rebuilt from the log" },
                "entries_restored": entries,
                "unrestorable": unrestorable,
                "duration_ms": started.elapsed().as_secs_f64() * 1000.0,
            }),
        });
        self.store
            .append_events(session.tenant_id, session.id, events, Vec::new())
            .await?;
        engine
            .metrics
            .session_taken_over(started.elapsed().as_secs_f64());
        tracing::info!(session = %session.id, from = ?from, interrupted, processes = gone.len(), ms = started.elapsed().as_millis() as u64, "session taken over");
        Ok(gone.into_iter().map(|(id, _)| id).collect())
    }

    /// The terminals the log says were opened and have not ended, with their commands.
    async fn open_terminals(&self, session: &Session) -> Result<Vec<(u64, serde_json::Value)>> {
        let mut opened: Vec<(u64, serde_json::Value)> = Vec::new();
        let mut ended = std::collections::HashSet::new();
        let mut after = 0;
        loop {
            let page = self
                .store
                .events_of_kinds(
                    session.tenant_id,
                    session.id,
                    &[EventKind::TerminalOpened, EventKind::TerminalExited],
                    after,
                    session.last_seq,
                    1000,
                )
                .await?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            let full = page.len() == 1000;
            for e in page {
                let Some(id) = e.data["terminal_id"].as_u64() else {
                    continue;
                };
                if e.kind == EventKind::TerminalOpened {
                    opened.push((id, e.data["command"].clone()));
                } else {
                    ended.insert(id);
                }
            }
            if !full {
                break;
            }
        }
        opened.retain(|(id, _)| !ended.contains(id));
        Ok(opened)
    }

    /// The background processes the log says were started and have not exited, with their
    /// commands.
    async fn running_processes(
        &self,
        session: &Session,
    ) -> Result<Vec<(String, serde_json::Value)>> {
        let mut started: Vec<(String, serde_json::Value)> = Vec::new();
        let mut exited = std::collections::HashSet::new();
        let mut after = 0;
        loop {
            let page = self
                .store
                .events_of_kinds(
                    session.tenant_id,
                    session.id,
                    &[EventKind::ProcessStarted, EventKind::ProcessExited],
                    after,
                    session.last_seq,
                    1000,
                )
                .await?;
            let Some(last) = page.last() else { break };
            after = last.seq;
            let full = page.len() == 1000;
            for e in page {
                let Some(id) = e.data["process_id"].as_str().map(str::to_owned) else {
                    continue;
                };
                if e.kind == EventKind::ProcessStarted {
                    started.push((id, e.data["command"].clone()));
                } else {
                    exited.insert(id);
                }
            }
            if !full {
                break;
            }
        }
        started.retain(|(id, _)| !exited.contains(id));
        Ok(started)
    }
}
