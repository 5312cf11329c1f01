//! What the web tools observe of the outside world, as they record it, and the record a verify
//! replay serves them from instead of the network.
//!
//! A web tool writes each request it sends into a [`Journal`] as it goes: the request, the
//! response's status and the headers that matter, the body (decoded, as read), or why it
//! failed. The journal becomes the call's `web.exchange` events, each body a blob. In a replay
//! ([`Observed::Replay`]) the tool asks the [`Recorded`] exchanges of the call it re-runs
//! instead of the network, and records them again (marked `served_from`), so that the replay's
//! log is as complete as its source's.
//!
//! This module neither reaches the network nor decides what the model is shown: the exchanges
//! are made in `web.rs`, the results rendered by the tools.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use toolexec_core::{
    EventKind, ExchangeError, ExchangeErrorKind, ExchangeRole, WebExchange, sha256_hex,
};
use uuid::Uuid;

use crate::ToolEvent;

/// Response headers a record keeps: what the body is, where a redirect led, and when and how
/// the server made it. Cookies and the rest are left out.
const RECORDED_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "content-encoding",
    "location",
    "last-modified",
    "etag",
    "date",
];

/// Longest header value kept, in bytes (a longer `content-type` is ignored live too, so that a
/// replay decodes a body as the live call did).
pub(crate) const MAX_HEADER_BYTES: usize = 2048;

/// One exchange as recorded: the `web.exchange` payload and the body it names.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub record: WebExchange,
    /// Shared with the tool that read it, not copied.
    pub body: Option<Bytes>,
    started: Instant,
    /// The exchange ended well (a redirect's head, or a body read to its end or cap): an error
    /// that comes after it is a new exchange's.
    complete: bool,
}

/// The exchanges of one call, in the order they were made. Shared between the tool and the
/// engine (in the call's [`crate::ToolContext`]): what a tool recorded is in the call's record
/// even when the tool is abandoned halfway (cancelled, or stuck past its deadline), since the
/// engine takes what is left once the tool has returned or been dropped.
#[derive(Debug, Default)]
pub struct Journal {
    entries: std::sync::Mutex<Entries>,
}

impl Journal {
    fn with<T>(&self, f: impl FnOnce(&mut Entries) -> T) -> T {
        // A tool that panicked while holding the lock left entries that are still records.
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut entries)
    }

    /// Starts an exchange; its index, for the calls that fill it in.
    pub fn begin(
        &self,
        role: ExchangeRole,
        method: &str,
        url: Option<String>,
        service: Option<String>,
    ) -> usize {
        self.with(|e| e.begin(role, method, url, service))
    }

    /// The response's head arrived.
    pub fn respond(&self, at: usize, status: u16, headers: &reqwest::header::HeaderMap) {
        self.with(|e| e.respond(at, status, headers));
    }

    /// The exchange ended without a body to keep (a redirect).
    pub fn complete(&self, at: usize) {
        self.with(|e| e.complete(at));
    }

    /// The body was read (to its end, or to the cap when `truncated`). A large body is hashed
    /// on a blocking thread: 5 MiB of SHA-256 would hold an async worker for milliseconds.
    pub async fn body(&self, at: usize, body: &Bytes, truncated: bool) {
        const HASH_INLINE_BYTES: usize = 64 * 1024;
        let sha = if body.len() <= HASH_INLINE_BYTES {
            sha256_hex(body)
        } else {
            let bytes = body.clone();
            match tokio::task::spawn_blocking(move || sha256_hex(&bytes)).await {
                Ok(sha) => sha,
                Err(_) => sha256_hex(body),
            }
        };
        self.with(|e| e.body(at, sha, body, truncated));
    }

    /// See `Entries::body_withheld`.
    pub fn body_withheld(&self, at: usize, bytes: usize, truncated: bool) {
        self.with(|e| e.body_withheld(at, bytes, truncated));
    }

    /// The role of the exchange at `at`.
    pub fn role_of(&self, at: usize) -> ExchangeRole {
        self.with(|e| e.role_of(at))
    }

    /// See `Entries::fail_last`.
    pub fn fail_last(&self, role: ExchangeRole, kind: ExchangeErrorKind, message: String) {
        self.with(|e| e.fail_last(role, kind, message));
    }

    /// Records a call's refusal to send a request it would have made (the tenant's quota of the
    /// operator's paid services was used up): an exchange that was never sent, so that a replay
    /// answers as the call did.
    pub fn not_sent(&self, role: ExchangeRole, message: String) {
        self.with(|e| {
            let at = e.begin(role, "", None, None);
            e.exchanges[at].record.error = Some(ExchangeError {
                kind: ExchangeErrorKind::Quota,
                message,
            });
            e.exchanges[at].complete = true;
        });
    }

    /// Whether an exchange of `role` was made.
    pub fn has(&self, role: ExchangeRole) -> bool {
        self.with(|e| e.of_role(role).next().is_some())
    }

    /// The call was abandoned (cancelled, or stuck past its deadline) while exchanges were
    /// under way: each says so, since no response will come.
    pub fn abandoned(&self) {
        self.with(|e| {
            for x in e.exchanges.iter_mut() {
                if !x.complete && x.record.error.is_none() {
                    x.record.error = Some(ExchangeError {
                        kind: ExchangeErrorKind::Failed,
                        message: "the call was stopped before this exchange ended".to_owned(),
                    });
                    x.record.duration_ms = elapsed_ms(x.started);
                }
            }
        });
    }

    /// Takes the exchanges recorded so far, as the call's `web.exchange` events, each with its
    /// body.
    pub fn drain_events(&self) -> Vec<ToolEvent> {
        self.with(|e| std::mem::take(&mut e.exchanges))
            .into_iter()
            .map(|x| ToolEvent {
                kind: EventKind::WebExchange,
                data: serde_json::to_value(&x.record).unwrap_or_default(),
                blob: x.body,
            })
            .collect()
    }

    fn push(&self, x: Exchange) {
        self.with(|e| e.exchanges.push(x));
    }
}

/// What a [`Journal`] holds.
#[derive(Debug, Default)]
struct Entries {
    exchanges: Vec<Exchange>,
}

impl Entries {
    fn begin(
        &mut self,
        role: ExchangeRole,
        method: &str,
        url: Option<String>,
        service: Option<String>,
    ) -> usize {
        let hop = self.of_role(role).count();
        self.exchanges.push(Exchange {
            record: WebExchange {
                role,
                hop: u32::try_from(hop).unwrap_or(u32::MAX),
                method: method.to_owned(),
                url,
                service,
                status: None,
                headers: BTreeMap::new(),
                body_sha256: None,
                body_bytes: None,
                body_truncated: false,
                body_stored: false,
                error: None,
                duration_ms: 0.0,
                served_from: None,
            },
            body: None,
            started: Instant::now(),
            complete: false,
        });
        self.exchanges.len() - 1
    }

    fn respond(&mut self, at: usize, status: u16, headers: &reqwest::header::HeaderMap) {
        let Some(x) = self.exchanges.get_mut(at) else {
            return;
        };
        x.record.status = Some(status);
        for name in RECORDED_HEADERS {
            if let Some(value) = headers.get(*name)
                && let Ok(text) = value.to_str()
                && text.len() <= MAX_HEADER_BYTES
            {
                x.record.headers.insert((*name).to_owned(), text.to_owned());
            }
        }
        x.record.duration_ms = elapsed_ms(x.started);
    }

    fn complete(&mut self, at: usize) {
        if let Some(x) = self.exchanges.get_mut(at) {
            x.complete = true;
            x.record.duration_ms = elapsed_ms(x.started);
        }
    }

    fn body(&mut self, at: usize, sha256: String, body: &Bytes, truncated: bool) {
        if let Some(x) = self.exchanges.get_mut(at) {
            x.record.body_sha256 = Some(sha256);
            x.record.body_bytes = Some(body.len() as u64);
            x.record.body_truncated = truncated;
            x.record.body_stored = true;
            x.body = Some(body.clone());
            x.complete = true;
            x.record.duration_ms = elapsed_ms(x.started);
        }
    }

    /// The body of an operator's service's refusal (a search provider's or summarizer's answer
    /// with an error status) was read but is not kept: it may quote the operator's key. Its
    /// status is the observation.
    fn body_withheld(&mut self, at: usize, bytes: usize, truncated: bool) {
        if let Some(x) = self.exchanges.get_mut(at) {
            x.record.body_bytes = Some(bytes as u64);
            x.record.body_truncated = truncated;
            x.complete = true;
            x.record.duration_ms = elapsed_ms(x.started);
        }
    }

    fn role_of(&self, at: usize) -> ExchangeRole {
        self.exchanges
            .get(at)
            .map_or(ExchangeRole::Page, |x| x.record.role)
    }

    /// Records why the last exchange of `role` ended the call's work with it: on that exchange
    /// if it was still under way, else on a new one after it (a redirect to a refused target,
    /// say). Nothing when no exchange of `role` was made (nothing was sent).
    fn fail_last(&mut self, role: ExchangeRole, kind: ExchangeErrorKind, message: String) {
        let Some(last) = self.exchanges.iter().rposition(|x| x.record.role == role) else {
            return;
        };
        let error = Some(ExchangeError { kind, message });
        let x = &self.exchanges[last];
        if x.record.error.is_some() {
            return;
        }
        if x.complete {
            let (method, service) = (x.record.method.clone(), x.record.service.clone());
            let at = self.begin(role, &method, None, service);
            self.exchanges[at].record.error = error;
        } else {
            let x = &mut self.exchanges[last];
            x.record.error = error;
            x.record.duration_ms = elapsed_ms(x.started);
        }
    }

    fn of_role(&self, role: ExchangeRole) -> impl Iterator<Item = &Exchange> {
        self.exchanges.iter().filter(move |x| x.record.role == role)
    }
}

fn elapsed_ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// Where a call's observations of the outside world come from.
#[derive(Debug, Clone, Default)]
pub enum Observed {
    /// The network (through the network policy).
    #[default]
    Live,
    /// The record of the call a verify replay re-runs: never the network.
    Replay(Arc<Recorded>),
}

/// The recorded exchanges of one call, which a replay serves in place of the network.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    /// The recorded invocation they are from; `None` when the source has no call to match
    /// (then nothing can be served).
    pub invocation_id: Option<Uuid>,
    pub exchanges: Vec<Exchange>,
}

/// A response as a record holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
    pub truncated: bool,
}

/// Why a record cannot serve what a replayed call asks for, or the failure it recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unserved {
    pub kind: ExchangeErrorKind,
    pub message: String,
}

impl Unserved {
    /// The call's result when its exchange got no answer: refused by the network policy is
    /// `denied`, out of time is `timed_out`, anything else an error; `text` says what.
    pub fn output(&self, text: String) -> crate::ToolOutput {
        match self.kind {
            ExchangeErrorKind::Refused => crate::ToolOutput::denied(text),
            ExchangeErrorKind::TimedOut => crate::ToolOutput::timed_out(text),
            _ => crate::ToolOutput::error(text),
        }
    }
}

impl Recorded {
    /// From a recorded invocation's `web.exchange` events and the blobs they name (`blobs` by
    /// SHA-256; a body missing from it is not served).
    pub fn new(
        invocation_id: Uuid,
        events: impl IntoIterator<Item = serde_json::Value>,
        blobs: &std::collections::HashMap<String, Bytes>,
    ) -> Self {
        let exchanges = events
            .into_iter()
            .filter_map(|data| serde_json::from_value::<WebExchange>(data).ok())
            .map(|record| {
                let body = record
                    .body_sha256
                    .as_ref()
                    .filter(|_| record.body_stored)
                    .and_then(|sha| blobs.get(sha).cloned());
                Exchange {
                    record,
                    body,
                    started: Instant::now(),
                    complete: true,
                }
            })
            .collect();
        Self {
            invocation_id: Some(invocation_id),
            exchanges,
        }
    }

    /// Whether the record has an exchange of `role`.
    pub fn has(&self, role: ExchangeRole) -> bool {
        self.exchanges.iter().any(|x| x.record.role == role)
    }

    /// Serves the exchanges of `role`: they go into `journal` (marked as served from the
    /// record) and the last one, the outcome, comes back.
    pub fn serve(&self, role: ExchangeRole, journal: &Journal) -> Result<&Exchange, Unserved> {
        let mut last = None;
        for x in self.exchanges.iter().filter(|x| x.record.role == role) {
            let mut copy = x.clone();
            copy.record.served_from = self.invocation_id;
            journal.push(copy);
            last = Some(x);
        }
        last.ok_or_else(|| Unserved {
            kind: ExchangeErrorKind::Failed,
            message: "this call is being replayed, and its record holds no response to serve in \
                      place of the network (a replay never goes to the network)"
                .to_owned(),
        })
    }

    /// The outcome of the last exchange of `role`: its response with the body, or the failure
    /// it recorded.
    pub fn answer(&self, role: ExchangeRole, journal: &Journal) -> Result<Answer, Unserved> {
        let last = self.serve(role, journal)?;
        answer_of(last)
    }
}

/// A recorded exchange's response, or its failure.
pub fn answer_of(x: &Exchange) -> Result<Answer, Unserved> {
    if let Some(error) = &x.record.error {
        return Err(Unserved {
            kind: error.kind,
            message: error.message.clone(),
        });
    }
    if let (Some(status), None, false) = (x.record.status, &x.body, x.record.body_stored) {
        // A refusal whose body was withheld (see [`Journal::body_withheld`]): its status is
        // what was observed.
        if x.record.role != ExchangeRole::Page && !(200..300).contains(&status) {
            return Ok(Answer {
                status,
                body: Bytes::new(),
                truncated: x.record.body_truncated,
            });
        }
    }
    let (Some(status), Some(body)) = (x.record.status, &x.body) else {
        return Err(Unserved {
            kind: ExchangeErrorKind::Failed,
            message: "this call is being replayed, and its record does not hold the response's \
                      body (it was over the service's limits.max_blob_bytes), so it cannot be \
                      served again"
                .to_owned(),
        });
    };
    Ok(Answer {
        status,
        body: body.clone(),
        truncated: x.record.body_truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> reqwest::header::HeaderMap {
        let mut h = reqwest::header::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[tokio::test]
    async fn a_redirect_then_a_page_are_two_exchanges_and_only_the_page_has_a_body() {
        let j = Journal::default();
        let a = j.begin(ExchangeRole::Page, "GET", Some("http://a/".into()), None);
        j.respond(
            a,
            301,
            &headers(&[("location", "http://b/"), ("set-cookie", "secret=1")]),
        );
        j.complete(a);
        let b = j.begin(ExchangeRole::Page, "GET", Some("http://b/".into()), None);
        j.respond(b, 200, &headers(&[("content-type", "text/plain")]));
        j.body(b, &Bytes::from_static(b"hello"), false).await;
        let events = j.drain_events();
        assert_eq!(events.len(), 2);
        let first: WebExchange = serde_json::from_value(events[0].data.clone()).unwrap();
        assert_eq!(first.hop, 0);
        assert_eq!(first.status, Some(301));
        assert_eq!(
            first.headers.get("location").map(String::as_str),
            Some("http://b/")
        );
        assert!(!first.headers.contains_key("set-cookie"));
        assert!(events[0].blob.is_none());
        let second: WebExchange = serde_json::from_value(events[1].data.clone()).unwrap();
        assert_eq!(second.hop, 1);
        assert_eq!(
            second.body_sha256.as_deref(),
            Some(sha256_hex(b"hello").as_str())
        );
        assert!(second.body_stored);
        assert_eq!(events[1].blob.as_deref(), Some(&b"hello"[..]));
    }

    #[test]
    fn an_error_goes_on_the_exchange_under_way_or_after_a_complete_one() {
        let j = Journal::default();
        // Nothing sent: nothing to record.
        j.fail_last(ExchangeRole::Page, ExchangeErrorKind::Refused, "no".into());
        assert!(!j.has(ExchangeRole::Page));
        let a = j.begin(ExchangeRole::Page, "GET", Some("http://a/".into()), None);
        j.fail_last(
            ExchangeRole::Page,
            ExchangeErrorKind::TimedOut,
            "slow".into(),
        );
        // A second failure does not replace the first.
        j.fail_last(ExchangeRole::Page, ExchangeErrorKind::Failed, "late".into());
        let events = j.drain_events();
        assert_eq!(events.len(), 1);
        assert_eq!(events[a].data["error"]["message"], "slow");
        let j = Journal::default();
        let a = j.begin(ExchangeRole::Page, "GET", Some("http://a/".into()), None);
        j.respond(a, 302, &headers(&[("location", "http://10.0.0.1/")]));
        j.complete(a);
        j.fail_last(
            ExchangeRole::Page,
            ExchangeErrorKind::Refused,
            "not reachable".into(),
        );
        let events = j.drain_events();
        assert_eq!(events.len(), 2);
        assert_eq!(events[1].data["hop"], 1);
        assert_eq!(events[1].data["error"]["kind"], "refused");
    }

    #[tokio::test]
    async fn a_record_serves_its_exchanges_again_marked_and_with_their_bodies() {
        let j = Journal::default();
        let a = j.begin(
            ExchangeRole::Search,
            "GET",
            Some("http://s/?q=x".into()),
            Some("brave".into()),
        );
        j.respond(a, 200, &headers(&[]));
        j.body(a, &Bytes::from_static(b"{}"), false).await;
        let events = j.drain_events();
        let blobs = events
            .iter()
            .filter_map(|e| e.blob.clone())
            .map(|b| (sha256_hex(&b), b))
            .collect();
        let source = Uuid::from_u128(5);
        let rec = Recorded::new(source, events.into_iter().map(|e| e.data), &blobs);
        let replay = Journal::default();
        let answer = rec.answer(ExchangeRole::Search, &replay).unwrap();
        assert_eq!(
            answer,
            Answer {
                status: 200,
                body: Bytes::from_static(b"{}"),
                truncated: false
            }
        );
        assert_eq!(
            replay.drain_events()[0].data["served_from"],
            serde_json::json!(source)
        );
        // Nothing recorded for a role: never served, never the network.
        let err = rec.answer(ExchangeRole::Page, &replay).unwrap_err();
        assert!(
            err.message.contains("never goes to the network"),
            "{}",
            err.message
        );
        // A body the record does not hold cannot be served.
        let rec = Recorded::new(
            source,
            rec.exchanges
                .iter()
                .map(|x| serde_json::to_value(&x.record).unwrap()),
            &Default::default(),
        );
        let err = rec
            .answer(ExchangeRole::Search, &Journal::default())
            .unwrap_err();
        assert!(err.message.contains("max_blob_bytes"), "{}", err.message);
    }
}
