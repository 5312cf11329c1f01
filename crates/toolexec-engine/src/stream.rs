//! A session's log, live: what `GET /v1/sessions/{id}/events/stream` sends.
//!
//! Every streamed session has one fetcher on this node, however many clients follow it: woken
//! when this node commits an event of the session, and at least every [`POLL_INTERVAL`]
//! (events another replica wrote to the same store), it reads what is new from the store — in
//! `seq` order, the only order there is — and broadcasts it to the session's subscribers over a
//! bounded channel. A subscriber first reads what it asked for from the store (after its
//! `Last-Event-ID`), then follows the broadcast, skipping what it already sent: since the store
//! assigns seqs gaplessly under the session's row lock, and committed seqs are always a prefix,
//! nothing is lost or sent twice across a reconnect, whichever replica wrote it.
//!
//! A subscriber that falls more than [`BUFFER`] events behind the broadcast (a client that does
//! not read) gets a final `stream.overflow` item saying where to resume and is disconnected:
//! nothing is buffered for it without bound. The stream ends after `session.closed`.
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{Notify, broadcast};
use toolexec_core::{Event, EventKind};
use toolexec_store::Store;
use uuid::Uuid;

use crate::{Engine, Result};

/// Longest a fetcher waits without a local commit before it looks at the store anyway: the
/// delay of an event another replica wrote.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Events a subscriber may fall behind before it is disconnected.
pub const BUFFER: usize = 1024;

/// Events read from the store per page (catching up, or fetching).
const PAGE: u32 = 100;

/// One item of a stream.
#[derive(Debug, Clone)]
pub enum StreamItem {
    Event(Arc<Event>),
    /// The subscriber fell too far behind; resume after `last_seq` (`Last-Event-ID`).
    Overflow {
        last_seq: i64,
    },
    /// The store failed; resume after `last_seq`.
    Failed {
        last_seq: i64,
        detail: String,
    },
}

/// The fetchers of the sessions streamed on this node.
#[derive(Default)]
pub(crate) struct StreamHub {
    sessions: Mutex<HashMap<Uuid, Arc<SessionFeed>>>,
}

struct SessionFeed {
    tx: broadcast::Sender<Arc<Event>>,
    wake: Notify,
}

impl StreamHub {
    /// This node committed events of `session`: its fetcher (if any) looks now.
    pub(crate) fn notify(&self, session: Uuid) {
        if let Ok(map) = self.sessions.lock()
            && let Some(feed) = map.get(&session)
        {
            feed.wake.notify_one();
        }
    }

    /// A receiver of the session's broadcast, starting the fetcher (from `from_seq`) if there is
    /// none.
    fn subscribe(
        self: &Arc<Self>,
        store: &Arc<dyn Store>,
        tenant_id: Uuid,
        session_id: Uuid,
        from_seq: i64,
    ) -> broadcast::Receiver<Arc<Event>> {
        let Ok(mut map) = self.sessions.lock() else {
            // A poisoned map: a receiver of a channel nobody sends on ends at once.
            return broadcast::channel(1).1;
        };
        if let Some(feed) = map.get(&session_id) {
            return feed.tx.subscribe();
        }
        let (tx, rx) = broadcast::channel(BUFFER);
        let feed = Arc::new(SessionFeed {
            tx,
            wake: Notify::new(),
        });
        map.insert(session_id, feed.clone());
        tokio::spawn(fetch(
            self.clone(),
            store.clone(),
            feed,
            tenant_id,
            session_id,
            from_seq,
        ));
        rx
    }

    /// Drops the feed if nobody follows it any more (decided under the map's lock, so that a
    /// subscriber never joins a feed that is going away).
    fn retire_if_unused(&self, session_id: Uuid, feed: &Arc<SessionFeed>, done: bool) -> bool {
        let Ok(mut map) = self.sessions.lock() else {
            return true;
        };
        if done || feed.tx.receiver_count() == 0 {
            if map.get(&session_id).is_some_and(|f| Arc::ptr_eq(f, feed)) {
                map.remove(&session_id);
            }
            return true;
        }
        false
    }
}

async fn fetch(
    hub: Arc<StreamHub>,
    store: Arc<dyn Store>,
    feed: Arc<SessionFeed>,
    tenant_id: Uuid,
    session_id: Uuid,
    mut cursor: i64,
) {
    let mut closed = false;
    loop {
        if hub.retire_if_unused(session_id, &feed, closed) {
            return;
        }
        loop {
            match store.events(tenant_id, session_id, cursor, PAGE).await {
                Ok(page) => {
                    let full = page.len() == PAGE as usize;
                    for event in page {
                        cursor = event.seq;
                        closed |= event.kind == EventKind::SessionClosed;
                        let _ = feed.tx.send(Arc::new(event));
                    }
                    if !full {
                        break;
                    }
                }
                Err(e) => {
                    // Subscribers find out from the gap they never see filled: they time out on
                    // nothing but heartbeats. Try again at the next wake.
                    tracing::warn!(error = %e, %session_id, "streaming the log: the store failed");
                    break;
                }
            }
        }
        if closed {
            continue;
        }
        let _ = tokio::time::timeout(POLL_INTERVAL, feed.wake.notified()).await;
    }
}

/// Where a subscriber is.
enum Phase {
    /// Reading the store after `after` (the page at hand in `buffered`).
    CatchUp,
    /// Following the broadcast.
    Live,
    Done,
}

struct Subscriber {
    store: Arc<dyn Store>,
    tenant_id: Uuid,
    session_id: Uuid,
    /// The last seq sent.
    last: i64,
    buffered: VecDeque<Event>,
    rx: broadcast::Receiver<Arc<Event>>,
    phase: Phase,
    /// Just caught up from the store: a lag now means the catch-up was long, not that the
    /// client is slow, and the store has what was missed.
    caught_up: bool,
    /// The tenant's stream slot, given back when the stream ends or its client goes away.
    _slot: crate::slots::Slot,
}

impl Engine {
    /// The log of a session of this tenant from `after` on, then live (see the module docs).
    pub async fn stream(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
    ) -> Result<impl Stream<Item = StreamItem> + Send + 'static> {
        let session = self.store.get_session(tenant_id, session_id).await?;
        let slot = self.stream_slots.take(tenant_id)?;
        // Join the broadcast before catching up: whatever is committed after this point comes
        // through it, whatever before is read from the store.
        let rx = self
            .streams
            .subscribe(&self.store, tenant_id, session_id, session.last_seq);
        let sub = Subscriber {
            store: self.store.clone(),
            tenant_id,
            session_id,
            last: after.max(0),
            buffered: VecDeque::new(),
            rx,
            phase: Phase::CatchUp,
            caught_up: false,
            _slot: slot,
        };
        Ok(futures::stream::unfold(sub, next_item))
    }
}

async fn next_item(mut sub: Subscriber) -> Option<(StreamItem, Subscriber)> {
    loop {
        match sub.phase {
            Phase::Done => return None,
            Phase::CatchUp => {
                if let Some(event) = sub.buffered.pop_front() {
                    sub.last = event.seq;
                    if event.kind == EventKind::SessionClosed {
                        sub.phase = Phase::Done;
                    }
                    return Some((StreamItem::Event(Arc::new(event)), sub));
                }
                match refill(&mut sub).await {
                    Ok(0) => {
                        sub.phase = Phase::Live;
                        sub.caught_up = true;
                    }
                    Ok(_) => {}
                    Err(item) => return Some((item, sub)),
                }
            }
            Phase::Live => match sub.rx.recv().await {
                Err(broadcast::error::RecvError::Lagged(_)) if sub.caught_up => {
                    sub.caught_up = false;
                    sub.phase = Phase::CatchUp;
                }
                Ok(event) if event.seq <= sub.last => {}
                Ok(event) if event.seq == sub.last + 1 => {
                    sub.caught_up = false;
                    sub.last = event.seq;
                    if event.kind == EventKind::SessionClosed {
                        sub.phase = Phase::Done;
                    }
                    return Some((StreamItem::Event(event), sub));
                }
                // Ahead of what was sent (the broadcast started before this subscriber had
                // caught up with it): read the gap from the store.
                Ok(_) => sub.phase = Phase::CatchUp,
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    sub.phase = Phase::Done;
                    let item = StreamItem::Overflow { last_seq: sub.last };
                    return Some((item, sub));
                }
                Err(broadcast::error::RecvError::Closed) => {
                    // The feed ended (the session closed, or nobody else followed it and a new
                    // one will start): whatever is left is in the store.
                    sub.phase = Phase::CatchUp;
                    match refill(&mut sub).await {
                        Ok(0) => return None,
                        Ok(_) => {}
                        Err(item) => return Some((item, sub)),
                    }
                }
            },
        }
    }
}

/// Reads the next page after what was sent into the buffer: how many events it held, or the
/// final item when the store failed (the subscriber is then done).
async fn refill(sub: &mut Subscriber) -> Result<usize, StreamItem> {
    match sub
        .store
        .events(sub.tenant_id, sub.session_id, sub.last, PAGE)
        .await
    {
        Ok(page) => {
            let n = page.len();
            sub.buffered.extend(page);
            Ok(n)
        }
        Err(e) => {
            sub.phase = Phase::Done;
            Err(StreamItem::Failed {
                last_seq: sub.last,
                detail: store_detail(&e),
            })
        }
    }
}

/// No store text reaches a client.
fn store_detail(e: &toolexec_store::StoreError) -> String {
    tracing::warn!(error = %e, "streaming the log: the store failed");
    "the store cannot be read right now; reconnect with Last-Event-ID to resume".into()
}
