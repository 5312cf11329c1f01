//! A session's log, live: what `GET /v1/sessions/{id}/events/stream` sends.
//!
//! Every streamed session has one fetcher on this node, however many clients follow it: woken
//! when this node commits an event of the session, and at least every [`POLL_INTERVAL`]
//! (events another replica wrote to the same store), it reads what is new from the store — in
//! `seq` order, the only order there is — renders each event as JSON once, and appends it to
//! the session's feed: the newest events, at most `limits.stream_buffer_bytes` of them (and
//! [`BUFFER`]), the oldest dropped first. A subscriber first reads what it asked for from the
//! store (after its `Last-Event-ID`), in pages of the same bound, then follows the feed by
//! seq, skipping what it already sent: since the store assigns seqs gaplessly under the
//! session's row lock, and committed seqs are always a prefix, nothing is lost or sent twice
//! across a reconnect, whichever replica wrote it.
//!
//! Memory is bounded in bytes, whatever the clients do: an event larger than the buffer is
//! sent truncated (the beginning of its data and the path that serves it whole, as a page
//! shows it), a subscriber holds at most one page, and the feed drops what its slowest reader
//! has not read. A subscriber whose next event the feed has dropped (a client that reads more
//! slowly than the log grows, or not at all) gets a final `stream.overflow` item saying where
//! to resume and is disconnected. The node serves at most `limits.max_streams_per_node` streams
//! of all tenants together. The stream ends after `session.closed`.
pub(crate) mod log;
pub(crate) mod pages;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use tokio::sync::{Notify, watch};
use toolexec_core::EventKind;
use toolexec_store::Store;
use uuid::Uuid;

use crate::{EngineError, Result};
use pages::{Pages, ShownEvent};

/// The reading side of sessions' logs on this node: pages of events and sessions (bounded in
/// bytes, with excerpts of what is over), single events and invocations, waiting for an
/// invocation to end, and the live streams with each tenant's share of them. Writes no event;
/// it is told of each commit (`Streams::notify`) to wake the streams that follow it.
pub struct Streams {
    store: Arc<dyn Store>,
    /// The live streams of sessions' logs followed on this node.
    hub: Arc<StreamHub>,
    /// Each tenant's event streams on this node.
    slots: Arc<crate::slots::TenantSlots>,
    /// The bounds in bytes of pages and streams, and the excerpts of what is over them.
    pages: Arc<Pages>,
}

impl Streams {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        hub: Arc<StreamHub>,
        slots: Arc<crate::slots::TenantSlots>,
        pages: Arc<Pages>,
    ) -> Self {
        Self {
            store,
            hub,
            slots,
            pages,
        }
    }

    /// Wakes the streams following `session_id`: something of it was committed.
    pub(crate) fn notify(&self, session_id: Uuid) {
        self.hub.notify(session_id);
    }
}

/// Longest a fetcher waits without a local commit before it looks at the store anyway: the
/// delay of an event another replica wrote.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Most events a feed keeps, whatever their size.
pub const BUFFER: usize = 1024;

/// Events read from the store per page (catching up, or fetching), within the byte bound.
const PAGE: u32 = 100;

/// An event as a stream sends it: rendered once, shared by every subscriber.
#[derive(Debug)]
pub struct StreamedEvent {
    pub seq: i64,
    pub kind: EventKind,
    pub invocation_id: Option<Uuid>,
    /// The event as JSON (its data cut short when it was over the stream's bound).
    pub json: String,
}

impl From<ShownEvent> for StreamedEvent {
    fn from(e: ShownEvent) -> Self {
        Self {
            seq: e.seq(),
            kind: e.kind(),
            invocation_id: e.invocation_id(),
            json: e.to_json(),
        }
    }
}

/// One item of a stream.
#[derive(Debug, Clone)]
pub enum StreamItem {
    Event(Arc<StreamedEvent>),
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
pub(crate) struct StreamHub {
    sessions: Mutex<HashMap<Uuid, Arc<SessionFeed>>>,
    pages: Arc<Pages>,
    /// Streams open on this node, all tenants together, and how many may be.
    open: Arc<AtomicUsize>,
    max_open: usize,
}

/// The newest events of a streamed session.
#[derive(Default)]
struct Ring {
    events: VecDeque<Arc<StreamedEvent>>,
    bytes: u64,
    /// The fetcher stopped (the session closed): what is left is in the store.
    ended: bool,
}

struct SessionFeed {
    ring: Mutex<Ring>,
    /// The seq of the newest event in the ring; subscribers wait on it.
    newest: watch::Sender<i64>,
    wake: Notify,
}

/// One of the node's streams; dropping it gives it back.
struct NodeSlot(Arc<AtomicUsize>);

impl Drop for NodeSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl StreamHub {
    pub(crate) fn new(pages: Arc<Pages>, max_open: usize) -> Self {
        Self {
            sessions: Mutex::new(HashMap::new()),
            pages,
            open: Arc::new(AtomicUsize::new(0)),
            max_open,
        }
    }

    /// This node committed events of `session`: its fetcher (if any) looks now.
    pub(crate) fn notify(&self, session: Uuid) {
        if let Ok(map) = self.sessions.lock()
            && let Some(feed) = map.get(&session)
        {
            feed.wake.notify_one();
        }
    }

    /// One of the node's streams, or 503 when they are all in use.
    fn take_slot(&self) -> Result<NodeSlot> {
        let taken = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max_open).then_some(n + 1)
            });
        match taken {
            Ok(_) => Ok(NodeSlot(self.open.clone())),
            Err(_) => Err(EngineError::Unavailable(format!(
                "this node already serves {} event streams, the most it may (limits.max_streams_per_node); retry shortly, or close a stream",
                self.max_open
            ))),
        }
    }

    /// The session's feed and a receiver of its news, starting the fetcher (from `from_seq`)
    /// if there is none.
    fn subscribe(
        self: &Arc<Self>,
        store: &Arc<dyn Store>,
        tenant_id: Uuid,
        session_id: Uuid,
        from_seq: i64,
    ) -> (Arc<SessionFeed>, watch::Receiver<i64>) {
        let Ok(mut map) = self.sessions.lock() else {
            // A poisoned map: a feed nobody fetches for, already ended.
            let feed = Arc::new(SessionFeed {
                ring: Mutex::new(Ring {
                    ended: true,
                    ..Ring::default()
                }),
                newest: watch::channel(from_seq).0,
                wake: Notify::new(),
            });
            let rx = feed.newest.subscribe();
            return (feed, rx);
        };
        if let Some(feed) = map.get(&session_id) {
            return (feed.clone(), feed.newest.subscribe());
        }
        let feed = Arc::new(SessionFeed {
            ring: Mutex::new(Ring::default()),
            newest: watch::channel(from_seq).0,
            wake: Notify::new(),
        });
        let rx = feed.newest.subscribe();
        map.insert(session_id, feed.clone());
        tokio::spawn(fetch(
            self.clone(),
            store.clone(),
            feed.clone(),
            tenant_id,
            session_id,
            from_seq,
        ));
        (feed, rx)
    }

    /// Drops the feed if nobody follows it any more (decided under the map's lock, so that a
    /// subscriber never joins a feed that is going away).
    fn retire_if_unused(&self, session_id: Uuid, feed: &Arc<SessionFeed>, done: bool) -> bool {
        let Ok(mut map) = self.sessions.lock() else {
            return true;
        };
        if done || feed.newest.receiver_count() == 0 {
            if map.get(&session_id).is_some_and(|f| Arc::ptr_eq(f, feed)) {
                map.remove(&session_id);
            }
            return true;
        }
        false
    }
}

impl SessionFeed {
    /// Appends an event, dropping the oldest past the bounds (the newest always stays).
    fn push(&self, event: Arc<StreamedEvent>, max_bytes: u64) {
        let seq = event.seq;
        if let Ok(mut ring) = self.ring.lock() {
            ring.bytes += event.json.len() as u64;
            ring.events.push_back(event);
            while ring.events.len() > 1 && (ring.bytes > max_bytes || ring.events.len() > BUFFER) {
                if let Some(old) = ring.events.pop_front() {
                    ring.bytes -= old.json.len() as u64;
                }
            }
        }
        self.newest.send_replace(seq);
    }

    fn end(&self) {
        if let Ok(mut ring) = self.ring.lock() {
            ring.ended = true;
        }
        self.newest.send_modify(|_| {});
    }

    /// What the feed has for a subscriber whose last event is `last`.
    fn next_after(&self, last: i64) -> Next {
        let Ok(ring) = self.ring.lock() else {
            return Next::Ended;
        };
        match ring.events.front().map(|e| e.seq) {
            Some(first) if first > last + 1 => Next::Behind,
            Some(first) => match usize::try_from(last + 1 - first)
                .ok()
                .and_then(|i| ring.events.get(i))
            {
                Some(e) => Next::Event(e.clone()),
                None if ring.ended => Next::Ended,
                None => Next::Wait,
            },
            None if ring.ended => Next::Ended,
            None => Next::Wait,
        }
    }
}

enum Next {
    Event(Arc<StreamedEvent>),
    /// The feed no longer has the next event.
    Behind,
    /// Nothing new yet.
    Wait,
    /// The feed ended; the rest is in the store.
    Ended,
}

async fn fetch(
    hub: Arc<StreamHub>,
    store: Arc<dyn Store>,
    feed: Arc<SessionFeed>,
    tenant_id: Uuid,
    session_id: Uuid,
    mut cursor: i64,
) {
    let bounds = hub.pages.stream();
    let mut closed = false;
    loop {
        if hub.retire_if_unused(session_id, &feed, closed) {
            feed.end();
            return;
        }
        loop {
            let page = match store
                .event_texts(tenant_id, session_id, cursor, PAGE, bounds)
                .await
            {
                Ok(page) => page,
                Err(e) => {
                    // Subscribers find out from the gap they never see filled: they time out on
                    // nothing but heartbeats. Try again at the next wake.
                    tracing::warn!(error = %e, %session_id, "streaming the log: the store failed");
                    break;
                }
            };
            let full = page.more || page.events.len() == PAGE as usize;
            let shown = match hub.pages.shown(&store, tenant_id, page.events).await {
                Ok(shown) => shown,
                Err(e) => {
                    tracing::warn!(error = %e, %session_id, "streaming the log: the store failed");
                    break;
                }
            };
            for event in shown {
                cursor = event.seq();
                closed |= event.kind() == EventKind::SessionClosed;
                feed.push(Arc::new(event.into()), bounds.max_bytes);
            }
            if !full {
                break;
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
    /// Reading the store after `last` (the page at hand in `buffered`).
    CatchUp,
    /// Following the feed.
    Live,
    Done,
}

struct Subscriber {
    store: Arc<dyn Store>,
    pages: Arc<Pages>,
    tenant_id: Uuid,
    session_id: Uuid,
    /// The last seq sent.
    last: i64,
    buffered: VecDeque<ShownEvent>,
    feed: Arc<SessionFeed>,
    rx: watch::Receiver<i64>,
    phase: Phase,
    /// Just caught up from the store: the feed not having the next event means the catch-up
    /// was long, not that the client is slow, and the store has what was missed.
    caught_up: bool,
    /// The tenant's stream slot and the node's, given back when the stream ends or its client
    /// goes away.
    _slot: crate::slots::Slot,
    _node_slot: NodeSlot,
}

impl Streams {
    /// The log of a session of this tenant from `after` on, then live (see the module docs).
    pub async fn stream(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
    ) -> Result<impl Stream<Item = StreamItem> + Send + 'static> {
        let session = self.store.get_session(tenant_id, session_id).await?;
        let slot = self.slots.take(tenant_id)?;
        let node_slot = self.hub.take_slot()?;
        // Join the feed before catching up: whatever is committed after this point comes
        // through it, whatever before is read from the store.
        let (feed, rx) = self
            .hub
            .subscribe(&self.store, tenant_id, session_id, session.last_seq);
        let sub = Subscriber {
            store: self.store.clone(),
            pages: self.pages.clone(),
            tenant_id,
            session_id,
            last: after.max(0),
            buffered: VecDeque::new(),
            feed,
            rx,
            phase: Phase::CatchUp,
            caught_up: false,
            _slot: slot,
            _node_slot: node_slot,
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
                    sub.last = event.seq();
                    if event.kind() == EventKind::SessionClosed {
                        sub.phase = Phase::Done;
                    }
                    return Some((StreamItem::Event(Arc::new(event.into())), sub));
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
            Phase::Live => {
                // Seen before looking, so that an event pushed after the look wakes the wait.
                sub.rx.borrow_and_update();
                match sub.feed.next_after(sub.last) {
                    Next::Event(event) => {
                        sub.caught_up = false;
                        sub.last = event.seq;
                        if event.kind == EventKind::SessionClosed {
                            sub.phase = Phase::Done;
                        }
                        return Some((StreamItem::Event(event), sub));
                    }
                    // The feed began after what this subscriber has sent (it joined a feed
                    // started later, or caught up for long): the store has the gap.
                    Next::Behind if sub.caught_up => {
                        sub.caught_up = false;
                        sub.phase = Phase::CatchUp;
                    }
                    Next::Behind => {
                        sub.phase = Phase::Done;
                        let item = StreamItem::Overflow { last_seq: sub.last };
                        return Some((item, sub));
                    }
                    Next::Wait => {
                        if sub.rx.changed().await.is_err() {
                            sub.feed.end();
                        }
                    }
                    Next::Ended => {
                        // The feed ended (the session closed): whatever is left is in the store.
                        sub.phase = Phase::CatchUp;
                        match refill(&mut sub).await {
                            Ok(0) => return None,
                            Ok(_) => {}
                            Err(item) => return Some((item, sub)),
                        }
                    }
                }
            }
        }
    }
}

/// Reads the next page after what was sent into the buffer: how many events it held, or the
/// final item when the store failed (the subscriber is then done).
async fn refill(sub: &mut Subscriber) -> Result<usize, StreamItem> {
    let bounds = sub.pages.stream();
    let page = sub
        .store
        .event_texts(sub.tenant_id, sub.session_id, sub.last, PAGE, bounds)
        .await;
    let shown = match page {
        Ok(page) => {
            sub.pages
                .shown(&sub.store, sub.tenant_id, page.events)
                .await
        }
        Err(e) => Err(e.into()),
    };
    match shown {
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
fn store_detail(e: &EngineError) -> String {
    tracing::warn!(error = %e, "streaming the log: the store failed");
    "the store cannot be read right now; reconnect with Last-Event-ID to resume".into()
}
