//! One node at a time runs a session's calls: a lease in the store, not only a lock in memory.
//!
//! The in-memory scheduling lock of a session ([`crate::SessionRuntime::schedule`]) keeps a
//! mutating call from overlapping any other call of the session *on one node*. Replicas that
//! share one store (and the workspaces, on shared storage) each have their own; the lease makes
//! the rule hold across them. A node takes the lease of a session before it runs a batch of its
//! calls (or rewinds it), and holds it while it keeps serving the session: a node that holds it
//! pays no round trip for it. Its heartbeat renews every lease it holds (one statement), and
//! gives up those of sessions it has not used for `limits.lease_linger_ms`. Another node that
//! gets a call for a session whose lease is held waits for it (released, or expired after
//! `limits.lease_ttl_ms` if its holder died), up to `limits.lease_wait_ms`, then answers 503.
//!
//! A node that takes a lease another node held last forgets what it remembered of the session
//! (its runtime: read-before-write state, call index, scan baseline): the other node may have
//! changed everything since.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use toolexec_store::{Lease, Store};
use uuid::Uuid;

use crate::{EngineError, Result};

/// How often a waiting node asks again, and how often the heartbeat looks at idle leases.
const TICK: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy)]
pub struct LeaseTimes {
    pub ttl: Duration,
    pub linger: Duration,
    pub wait: Duration,
}

struct Held {
    /// Batches (and rewinds) using it now.
    in_use: usize,
    last_used: Instant,
    /// When the store last confirmed this lease (taken or renewed): past 80 % of the TTL
    /// without a confirmation it is not trusted, and the store is asked again.
    confirmed: Instant,
}

pub(crate) struct Leases {
    store: Arc<dyn Store>,
    node: String,
    /// Where the other replicas reach this node (`cluster.advertise_url`), told with each
    /// heartbeat.
    address: Option<String>,
    /// This node is shutting down: its heartbeat says so, and requests for its sessions wait
    /// for it to hand them over.
    draining: std::sync::atomic::AtomicBool,
    times: LeaseTimes,
    held: Mutex<HashMap<Uuid, Held>>,
    /// Taking, renewing and releasing leases in the store, one at a time: a release of an idle
    /// lease never lands after this node took the same lease again, and a renewal's answer is
    /// about the leases `held` has when it is applied.
    store_turn: tokio::sync::Mutex<()>,
}

/// A lease in use; dropping it lets the heartbeat give the lease up once it has lingered.
pub(crate) struct LeaseGuard {
    leases: Arc<Leases>,
    session: Uuid,
}

impl LeaseGuard {
    /// The session whose lease this is.
    pub(crate) fn session(&self) -> Uuid {
        self.session
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Ok(mut held) = self.leases.held.lock()
            && let Some(h) = held.get_mut(&self.session)
        {
            h.in_use = h.in_use.saturating_sub(1);
            h.last_used = Instant::now();
        }
    }
}

impl Leases {
    pub(crate) fn start(
        store: Arc<dyn Store>,
        node: String,
        address: Option<String>,
        times: LeaseTimes,
    ) -> Arc<Self> {
        let leases = Arc::new(Self {
            store,
            node,
            address,
            draining: std::sync::atomic::AtomicBool::new(false),
            times,
            held: Mutex::new(HashMap::new()),
            store_turn: tokio::sync::Mutex::new(()),
        });
        let weak = Arc::downgrade(&leases);
        tokio::spawn(async move {
            let mut last_renewal = Instant::now();
            loop {
                tokio::time::sleep(TICK).await;
                let Some(leases) = weak.upgrade() else {
                    return;
                };
                leases.release_idle().await;
                if last_renewal.elapsed() >= leases.times.ttl / 3 {
                    last_renewal = Instant::now();
                    leases.renew().await;
                    leases.heartbeat().await;
                }
            }
        });
        leases
    }

    /// Tells the store this node is alive (and where it is reached, and whether it drains).
    pub(crate) async fn heartbeat(&self) {
        let draining = self.draining.load(std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = self
            .store
            .node_heartbeat(&self.node, self.address.as_deref(), draining)
            .await
        {
            tracing::warn!(error = %e, "this node's heartbeat could not be recorded");
        }
    }

    /// From now on the heartbeat says this node is draining (and says it at once).
    pub(crate) async fn drain(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.heartbeat().await;
    }

    /// Whether this node is draining.
    pub(crate) fn draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The lease TTL: a node whose heartbeat is older is gone.
    pub(crate) fn ttl(&self) -> Duration {
        self.times.ttl
    }

    /// How long a request may wait for a session's lease (or its node's hand-over).
    pub(crate) fn wait(&self) -> Duration {
        self.times.wait
    }

    /// Uses the lease of `session` if this node holds it and the store confirmed it recently.
    fn use_held(&self, session: Uuid) -> bool {
        let trusted_for = self.times.ttl.mul_f64(0.8);
        let Ok(mut held) = self.held.lock() else {
            return false;
        };
        match held.get_mut(&session) {
            Some(h) if h.confirmed.elapsed() < trusted_for => {
                h.in_use += 1;
                h.last_used = Instant::now();
                true
            }
            _ => false,
        }
    }

    /// The lease of `session` for one request, if this node holds it and the store confirmed
    /// it recently (from memory; `None` otherwise: then [`Leases::hold`] asks the store).
    pub(crate) fn take_held(self: &Arc<Self>, session: Uuid) -> Option<LeaseGuard> {
        self.use_held(session).then(|| self.guard(session))
    }

    /// Holds the lease of `session` for this node, waiting while another node holds it. Also
    /// says which other node held it last, if one did (what this node remembers is stale).
    pub(crate) async fn hold(
        self: &Arc<Self>,
        session: Uuid,
    ) -> Result<(LeaseGuard, Option<String>)> {
        if self.use_held(session) {
            return Ok((self.guard(session), None));
        }
        let started = Instant::now();
        loop {
            let outcome = {
                let _turn = self.store_turn.lock().await;
                // Another task of this node may have taken it while this one waited.
                if self.use_held(session) {
                    return Ok((self.guard(session), None));
                }
                let asked = Instant::now();
                let outcome = self
                    .store
                    .acquire_lease(session, &self.node, self.times.ttl)
                    .await?;
                if let Lease::Held { .. } = outcome
                    && let Ok(mut held) = self.held.lock()
                {
                    let h = held.entry(session).or_insert(Held {
                        in_use: 0,
                        last_used: asked,
                        confirmed: asked,
                    });
                    h.in_use += 1;
                    h.last_used = Instant::now();
                    h.confirmed = asked;
                }
                outcome
            };
            match outcome {
                Lease::Held { previous } => {
                    return Ok((self.guard(session), previous));
                }
                Lease::Busy { holder } => {
                    if started.elapsed() >= self.times.wait {
                        return Err(EngineError::Unavailable(format!(
                            "session {session} is running calls on node {holder} (its lease is held there); route a session's requests to one node, or retry"
                        )));
                    }
                    tokio::time::sleep(TICK).await;
                }
            }
        }
    }

    /// Gives up the lease of a session at once (it closed).
    pub(crate) async fn release(&self, session: Uuid) {
        let _turn = self.store_turn.lock().await;
        if let Ok(mut held) = self.held.lock() {
            held.remove(&session);
        }
        if let Err(e) = self.store.release_leases(&self.node, &[session]).await {
            tracing::warn!(error = %e, %session, "a session's lease could not be released; it expires");
        }
    }

    /// Gives up every lease (shutdown).
    pub(crate) async fn release_all(&self) {
        let _turn = self.store_turn.lock().await;
        let ids: Vec<Uuid> = self
            .held
            .lock()
            .map(|mut h| h.drain().map(|(id, _)| id).collect())
            .unwrap_or_default();
        if let Err(e) = self.store.release_leases(&self.node, &ids).await {
            tracing::warn!(error = %e, "leases could not be released at shutdown; they expire");
        }
    }

    fn guard(self: &Arc<Self>, session: Uuid) -> LeaseGuard {
        LeaseGuard {
            leases: self.clone(),
            session,
        }
    }

    /// Extends this node's leases; a lease the store did not extend (it expired meanwhile, and
    /// may be another node's now) is forgotten, so that the next call asks for it again.
    async fn renew(&self) {
        let _turn = self.store_turn.lock().await;
        let asked = Instant::now();
        match self.store.renew_leases(&self.node, self.times.ttl).await {
            Ok(renewed) => {
                let renewed: std::collections::HashSet<Uuid> = renewed.into_iter().collect();
                if let Ok(mut held) = self.held.lock() {
                    held.retain(|id, h| {
                        if renewed.contains(id) {
                            h.confirmed = asked;
                            true
                        } else {
                            tracing::warn!(session = %id, "a session lease expired before its renewal; it is asked for again");
                            false
                        }
                    });
                }
            }
            Err(e) => tracing::warn!(error = %e, "renewing this node's session leases failed"),
        }
    }

    async fn release_idle(&self) {
        let linger = self.times.linger;
        let is_idle = |h: &Held| h.in_use == 0 && h.last_used.elapsed() >= linger;
        if !self
            .held
            .lock()
            .is_ok_and(|held| held.values().any(is_idle))
        {
            return;
        }
        let _turn = self.store_turn.lock().await;
        let idle: Vec<Uuid> = match self.held.lock() {
            Ok(mut held) => {
                let ids: Vec<Uuid> = held
                    .iter()
                    .filter(|(_, h)| is_idle(h))
                    .map(|(id, _)| *id)
                    .collect();
                for id in &ids {
                    held.remove(id);
                }
                ids
            }
            Err(_) => return,
        };
        if idle.is_empty() {
            return;
        }
        if let Err(e) = self.store.release_leases(&self.node, &idle).await {
            tracing::warn!(error = %e, "idle session leases could not be released; they expire");
        }
    }
}
