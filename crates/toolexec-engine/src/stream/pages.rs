//! Reading the record in pieces bounded in bytes: pages of a session's events and of a tenant's
//! sessions (`limits.page_bytes`), and what an event stream holds (`limits.stream_buffer_bytes`).
//!
//! The store walks a page's rows and stops at the bound, handing over each event's data as the
//! JSON text it holds: nothing is parsed, the text goes into the answer as it is. An event (or
//! a session) larger than the bound alone comes without it; what is shown of it is the
//! beginning of its text, cut by the database ([`toolexec_core::excerpt`]), with a `truncated`
//! pointer to the path that serves it whole. The log never changes, so each beginning is cut
//! once and kept for a while ([`EXCERPTS_KEPT`]): streams that follow one session show its
//! large events without reading them again.
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use toolexec_core::excerpt::{EXCERPT_CHARS, EXCERPT_MAX_BYTES, Truncated, close_prefix};
use toolexec_core::{EventKind, Session};
use toolexec_store::Store;
use toolexec_store::pages::{ByteBounds, EventText, Listed};
use uuid::Uuid;

use super::Streams;
use crate::{EngineError, Result};

/// Bytes an event's JSON takes besides its data (ids, kind, time, a `truncated` pointer), and
/// an SSE frame's fields: what a page or a stream counts for each event on top of its data.
pub const EVENT_OVERHEAD_BYTES: u64 = 512;

/// Bytes a session's JSON takes besides its `tools`, `policy`, `env` and `metadata`.
const SESSION_OVERHEAD_BYTES: u64 = 512;

/// Bytes of a page around its items (`{"events":[`, `],"next_after":…}`).
pub const PAGE_FRAME_BYTES: u64 = 64;

/// The smallest page and stream buffer: room for the excerpts of a session shown truncated
/// (its `tools`, `env` and `metadata`) and a few events around them.
pub const MIN_PAGE_BYTES: u64 = 128 * 1024;

/// Excerpts of events kept on the node, the oldest dropped first: at most ~20 KiB each.
const EXCERPTS_KEPT: usize = 256;

/// What a page of sessions counts for one shown truncated: the excerpts of its `tools`, `env`
/// and `metadata`, and its policy (bounded by the operator's catalog).
const SESSION_EXCERPT_BYTES: u64 = 3 * EXCERPT_MAX_BYTES + 16 * 1024;

/// The bounds of this node's pages and streams.
pub(crate) struct Pages {
    page_bytes: u64,
    stream_bytes: u64,
    /// The closed beginnings of events over a bound, by session and seq.
    excerpts: std::sync::Mutex<Excerpts>,
}

#[derive(Default)]
struct Excerpts {
    by_event: std::collections::HashMap<(Uuid, i64), Arc<str>>,
    order: std::collections::VecDeque<(Uuid, i64)>,
}

impl Pages {
    pub(crate) fn new(limits: &crate::Limits) -> Arc<Self> {
        Arc::new(Self {
            page_bytes: limits.page_bytes.max(MIN_PAGE_BYTES),
            stream_bytes: limits.stream_buffer_bytes.max(MIN_PAGE_BYTES),
            excerpts: std::sync::Mutex::new(Excerpts::default()),
        })
    }

    /// A page of events: its JSON within `limits.page_bytes`.
    fn events(&self) -> ByteBounds {
        let max = self.page_bytes - PAGE_FRAME_BYTES;
        ByteBounds {
            max_bytes: max,
            inline_bytes: max - EVENT_OVERHEAD_BYTES,
            excerpt_bytes: EXCERPT_MAX_BYTES,
            overhead_bytes: EVENT_OVERHEAD_BYTES,
        }
    }

    fn sessions(&self) -> ByteBounds {
        let max = self.page_bytes - PAGE_FRAME_BYTES;
        ByteBounds {
            max_bytes: max,
            inline_bytes: max - SESSION_OVERHEAD_BYTES,
            excerpt_bytes: SESSION_EXCERPT_BYTES,
            overhead_bytes: SESSION_OVERHEAD_BYTES,
        }
    }

    /// What one stream holds: `limits.stream_buffer_bytes` of events, each frame included.
    pub(crate) fn stream(&self) -> ByteBounds {
        ByteBounds {
            max_bytes: self.stream_bytes,
            inline_bytes: self.stream_bytes - EVENT_OVERHEAD_BYTES,
            excerpt_bytes: EXCERPT_MAX_BYTES,
            overhead_bytes: EVENT_OVERHEAD_BYTES,
        }
    }

    /// The events of a page read from the store, each with its data whole or, over the bound,
    /// the closed beginning of it.
    pub(crate) async fn shown(
        &self,
        store: &Arc<dyn Store>,
        tenant_id: Uuid,
        texts: Vec<EventText>,
    ) -> Result<Vec<ShownEvent>> {
        let mut shown = Vec::with_capacity(texts.len());
        for mut text in texts {
            let truncated = text.data.is_none();
            if truncated {
                text.data = Some(self.excerpt(store, tenant_id, &text).await?);
            }
            shown.push(ShownEvent { text, truncated });
        }
        Ok(shown)
    }

    async fn excerpt(
        &self,
        store: &Arc<dyn Store>,
        tenant_id: Uuid,
        event: &EventText,
    ) -> Result<String> {
        let key = (event.session_id, event.seq);
        if let Some(kept) = self
            .excerpts
            .lock()
            .ok()
            .and_then(|x| x.by_event.get(&key).cloned())
        {
            return Ok(kept.to_string());
        }
        let cut = store
            .event_text(tenant_id, event.session_id, event.seq, Some(EXCERPT_CHARS))
            .await?
            .and_then(|e| e.data)
            .unwrap_or_default();
        let closed = close_prefix(&cut);
        if let Ok(mut kept) = self.excerpts.lock()
            && kept.by_event.insert(key, closed.as_str().into()).is_none()
        {
            kept.order.push_back(key);
            while kept.order.len() > EXCERPTS_KEPT {
                if let Some(old) = kept.order.pop_front() {
                    kept.by_event.remove(&old);
                }
            }
        }
        Ok(closed)
    }
}

/// An event as a page or a stream shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownEvent {
    /// Its data: the JSON text whole, or the closed beginning of it when `truncated`.
    pub text: EventText,
    pub truncated: bool,
}

impl ShownEvent {
    pub fn seq(&self) -> i64 {
        self.text.seq
    }

    pub fn kind(&self) -> EventKind {
        self.text.kind
    }

    pub fn invocation_id(&self) -> Option<Uuid> {
        self.text.invocation_id
    }

    /// The event as JSON: the shape of [`toolexec_core::Event`], its data spliced in as the
    /// store's text (never parsed), `truncated` when it is cut short.
    pub fn to_json(&self) -> String {
        let (head, data, tail) = self.parts();
        let data = data.unwrap_or("null");
        let mut out = String::with_capacity(head.len() + data.len() + tail.len());
        out.push_str(&head);
        out.push_str(data);
        out.push_str(&tail);
        out
    }

    /// [`ShownEvent::to_json`] in three pieces, the data's text moved, not copied: what
    /// serves one large event.
    pub fn into_json_parts(mut self) -> [String; 3] {
        let (head, _, tail) = self.parts();
        let data = self.text.data.take().unwrap_or_else(|| "null".into());
        [head, data, tail]
    }

    /// The JSON before the data (`{…,"data":`), the data, and after it (`,…}`).
    fn parts(&self) -> (String, Option<&str>, String) {
        #[derive(Serialize)]
        struct Head {
            session_id: Uuid,
            seq: i64,
            kind: EventKind,
            invocation_id: Option<Uuid>,
        }
        #[derive(Serialize)]
        struct Tail {
            created_at: DateTime<Utc>,
            #[serde(skip_serializing_if = "Option::is_none")]
            truncated: Option<Truncated>,
        }
        let e = &self.text;
        let head = serde_json::to_string(&Head {
            session_id: e.session_id,
            seq: e.seq,
            kind: e.kind,
            invocation_id: e.invocation_id,
        })
        .unwrap_or_default();
        let tail = serde_json::to_string(&Tail {
            created_at: e.created_at,
            truncated: self.truncated.then(|| Truncated {
                bytes: e.data_bytes,
                full: format!("/v1/sessions/{}/events/{}", e.session_id, e.seq),
            }),
        })
        .unwrap_or_default();
        let head = format!("{},\"data\":", head.strip_suffix('}').unwrap_or(&head));
        let tail = format!(",{}", tail.strip_prefix('{').unwrap_or(&tail));
        (head, e.data.as_deref(), tail)
    }
}

/// A page of a session's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventsPage {
    pub events: Vec<ShownEvent>,
    /// The `after` of the next page; `None` when this one reached the end of the log so far.
    pub next_after: Option<i64>,
}

/// A page of a tenant's sessions, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionsPage {
    pub sessions: Vec<Session>,
    /// The `before` of the next page; `None` on the last one.
    pub next_before: Option<Uuid>,
}

impl Streams {
    /// A page of a session's events after `after`, at most `limit` (1–1000, default 100) and
    /// within `limits.page_bytes`.
    pub async fn event_page(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: Option<u32>,
    ) -> Result<EventsPage> {
        let limit = limit
            .unwrap_or(crate::DEFAULT_EVENTS_PAGE)
            .clamp(1, crate::MAX_EVENTS_PAGE);
        let page = self
            .store
            .event_texts(
                tenant_id,
                session_id,
                after.max(0),
                limit,
                self.pages.events(),
            )
            .await?;
        let full = page.more || page.events.len() == limit as usize;
        let next_after = full.then(|| page.events.last().map(|e| e.seq)).flatten();
        let events = self
            .pages
            .shown(&self.store, tenant_id, page.events)
            .await?;
        Ok(EventsPage { events, next_after })
    }

    /// One event of a session, whole: what a truncated event's `full` serves.
    pub async fn event(&self, tenant_id: Uuid, session_id: Uuid, seq: i64) -> Result<ShownEvent> {
        match self
            .store
            .event_text(tenant_id, session_id, seq, None)
            .await?
        {
            Some(text) => Ok(ShownEvent {
                text,
                truncated: false,
            }),
            None => Err(EngineError::Missing(format!(
                "session {session_id} has no event {seq}"
            ))),
        }
    }

    /// A page of this tenant's sessions, newest first, at most `limit` (1–200) and within
    /// `limits.page_bytes`.
    pub async fn list_sessions(
        &self,
        tenant_id: Uuid,
        before: Option<Uuid>,
        limit: u32,
    ) -> Result<SessionsPage> {
        let page = self
            .store
            .list_sessions(
                tenant_id,
                before,
                limit.clamp(1, crate::MAX_SESSIONS_PAGE),
                self.pages.sessions(),
            )
            .await?;
        let mut sessions = Vec::with_capacity(page.sessions.len());
        for listed in page.sessions {
            sessions.push(match listed {
                Listed::Whole(s) => *s,
                Listed::Over { id, bytes } => {
                    let mut s = self
                        .store
                        .session_excerpt(tenant_id, id, EXCERPT_CHARS)
                        .await?;
                    s.truncated = Some(Truncated {
                        bytes,
                        full: format!("/v1/sessions/{id}"),
                    });
                    s
                }
            });
        }
        Ok(SessionsPage {
            sessions,
            next_before: page.next_before,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(data: &str) -> EventText {
        EventText {
            session_id: Uuid::from_u128(1),
            seq: 7,
            kind: EventKind::InvocationStarted,
            invocation_id: Some(Uuid::from_u128(2)),
            created_at: DateTime::parse_from_rfc3339("2026-01-02T03:04:05.678901Z")
                .map(|t| t.with_timezone(&Utc))
                .unwrap_or_default(),
            data_bytes: 1000,
            data: Some(data.to_owned()),
        }
    }

    #[test]
    fn an_event_is_shown_as_the_record_serializes_it() {
        let data = json!({"call_id": "c", "name": "read_file", "arguments": {"x": [1, 2]}});
        let shown = ShownEvent {
            text: text(&data.to_string()),
            truncated: false,
        };
        let event = toolexec_core::Event {
            session_id: Uuid::from_u128(1),
            seq: 7,
            kind: EventKind::InvocationStarted,
            invocation_id: Some(Uuid::from_u128(2)),
            data,
            created_at: shown.text.created_at,
            truncated: None,
        };
        assert_eq!(
            shown.to_json(),
            serde_json::to_string(&event).unwrap_or_default()
        );
        let cut = ShownEvent {
            text: text(r#"{"arguments":{"x":"ab…"}}"#),
            truncated: true,
        };
        let v: serde_json::Value = serde_json::from_str(&cut.to_json()).unwrap_or_default();
        assert_eq!(v["truncated"]["bytes"], 1000);
        assert_eq!(
            v["truncated"]["full"],
            format!("/v1/sessions/{}/events/7", Uuid::from_u128(1))
        );
        assert_eq!(v["data"]["arguments"]["x"], "ab…");
    }
}
