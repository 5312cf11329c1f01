//! Admission control: a per-tenant request rate limit (token bucket, 429 + `Retry-After`), a
//! cap on requests in flight with a share of it per tenant (load shedding: 503 + `Retry-After`
//! when the node is full, 429 when the tenant holds its share, instead of queueing without
//! bound), and the rules for request bodies (a declared size over the limit is refused before a
//! byte of it is read; a body must arrive whole within a deadline).
//!
//! **Request slots.** A request takes one of the node's `max_concurrent_requests` slots when it
//! arrives, and, once its tenant is known, one of that tenant's
//! `max_concurrent_requests_per_tenant` ([`RequestSlots`]). The tenant is known at
//! authentication ([`crate::auth::AuthTenant`]), which comes before anything reads a body:
//! it is every `/v1` handler's first extractor, and the forwarding layer authenticates before it
//! buffers a body for another replica. So a tenant's slow bodies hold its share and no more,
//! and a request with a wrong key is answered 401 before its body, holding nothing. Requests to
//! the public routes (`/healthz`, `/readyz`, `/metrics`, the OpenAPI document and docs) name no
//! tenant: together they hold one tenant's share.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::request::Parts;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use toolexec_core::ProblemCode;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use uuid::Uuid;

use crate::problem::ApiError;

/// Per-tenant token bucket settings. `requests_per_second = 0` turns the limit off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub requests_per_second: f64,
    pub burst: f64,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Most tenants tracked at once; the table is cleared when full (bounded memory).
const MAX_BUCKETS: usize = 100_000;

#[derive(Debug)]
pub struct Limiter {
    rate: RateLimit,
    buckets: Mutex<HashMap<Uuid, Bucket>>,
}

impl Limiter {
    pub fn new(rate: RateLimit) -> Self {
        Self {
            rate,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `tenant`, or says how many seconds until one is available.
    pub fn check(&self, tenant: Uuid) -> Result<(), ApiError> {
        let RateLimit {
            requests_per_second: rps,
            burst,
        } = self.rate;
        if rps <= 0.0 {
            return Ok(());
        }
        let Ok(mut buckets) = self.buckets.lock() else {
            return Ok(());
        };
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(&tenant) {
            buckets.clear();
        }
        let now = Instant::now();
        let b = buckets.entry(tenant).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rps).min(burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        let wait = ((1.0 - b.tokens) / rps).ceil().max(1.0) as u32;
        Err(ApiError {
            retry_after: Some(wait),
            ..ApiError::new(
                ProblemCode::RateLimited,
                format!(
                    "this tenant's request rate is over {rps} per second; retry after {wait} s"
                ),
            )
        })
    }
}

/// What a request body must respect.
#[derive(Debug, Clone, Copy)]
pub struct BodyRules {
    pub limit_bytes: usize,
    pub read_timeout: Duration,
    /// The bound of an archive upload (`PUT /v1/sessions/{id}/archive`), which its handler
    /// streams to disk rather than reading whole.
    pub archive_limit_bytes: u64,
}

/// Whether a request is an archive upload: its body is streamed by its handler, within its own
/// bound and an idle timeout rather than the body limit and read deadline of the rest.
pub(crate) fn is_archive_upload(method: &axum::http::Method, path: &str) -> bool {
    method == axum::http::Method::PUT
        && path
            .strip_prefix("/v1/sessions/")
            .and_then(|rest| rest.strip_suffix("/archive"))
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

/// What the extractors that read a body must hold it to: its size limit, and when it must have
/// arrived.
#[derive(Debug, Clone, Copy)]
pub struct BodyDeadline {
    pub at: tokio::time::Instant,
    pub within: Duration,
    pub limit_bytes: usize,
}

/// Refuses a request whose `Content-Length` is over the limit at once (413, and the connection is
/// closed rather than drained), and gives the rest a deadline for their body.
pub async fn guard_body(State(rules): State<BodyRules>, mut req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if is_archive_upload(req.method(), req.uri().path()) {
        if declared.is_some_and(|n| n > rules.archive_limit_bytes) {
            let mut resp = ApiError::new(
                ProblemCode::ArchiveTooLarge,
                format!(
                    "the archive is over {} bytes, the most one upload may be \
                     (limits.max_archive_bytes); nothing was written. Upload the project in parts",
                    rules.archive_limit_bytes
                ),
            )
            .into_response();
            resp.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
            return resp;
        }
        return next.run(req).await;
    }
    if declared.is_some_and(|n| n > rules.limit_bytes as u64) {
        let mut resp = ApiError::body_too_large(rules.limit_bytes).into_response();
        resp.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
        return resp;
    }
    req.extensions_mut().insert(BodyDeadline {
        at: tokio::time::Instant::now() + rules.read_timeout,
        within: rules.read_timeout,
        limit_bytes: rules.limit_bytes,
    });
    next.run(req).await
}

/// The node's request slots: `total` in flight, at most `per_tenant` of them for one tenant (and
/// as many for the public routes together).
#[derive(Debug)]
pub struct RequestSlots {
    total: Semaphore,
    per_tenant: usize,
    /// Slots held per holder; a holder with none has no entry (at most `total` entries).
    held: Mutex<HashMap<Holder, usize>>,
}

/// Who holds a slot beyond the node's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Holder {
    Tenant(Uuid),
    /// The public routes, which name no tenant.
    Public,
}

/// One holder's slot; given back when dropped.
#[derive(Debug)]
struct Slot {
    slots: Arc<RequestSlots>,
    holder: Holder,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut held) = self.slots.held.lock()
            && let Some(n) = held.get_mut(&self.holder)
        {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.holder);
            }
        }
    }
}

impl RequestSlots {
    pub fn new(total: usize, per_tenant: usize) -> Arc<Self> {
        let total = total.max(1);
        Arc::new(Self {
            total: Semaphore::new(total),
            per_tenant: per_tenant.clamp(1, total),
            held: Mutex::new(HashMap::new()),
        })
    }

    fn take(self: &Arc<Self>, holder: Holder) -> Option<Slot> {
        let mut held = self.held.lock().ok()?;
        let n = held.entry(holder).or_insert(0);
        if *n >= self.per_tenant {
            return None;
        }
        *n += 1;
        Some(Slot {
            slots: self.clone(),
            holder,
        })
    }
}

/// Where a request keeps its tenant's slot: put on the request by [`shed_load`], filled at
/// authentication ([`take_tenant_slot`]), emptied by [`shed_load`] when the response is ready.
#[derive(Debug, Clone)]
struct SlotCell {
    slots: Arc<RequestSlots>,
    slot: Arc<Mutex<Option<Slot>>>,
}

impl SlotCell {
    fn fill(&self, slot: Slot) {
        if let Ok(mut cell) = self.slot.lock() {
            *cell = Some(slot);
        }
    }

    fn is_filled(&self) -> bool {
        self.slot.lock().map(|c| c.is_some()).unwrap_or(true)
    }
}

/// Takes one of `tenant`'s slots for the request (once; again is a no-op): 429
/// `too_many_concurrent` when the tenant holds its share already. Called by the authentication
/// extractor, before any body is read.
pub(crate) fn take_tenant_slot(parts: &Parts, tenant: Uuid) -> Result<(), ApiError> {
    // A router without the shedding layer (none in the service) has no shares to keep.
    let Some(cell) = parts.extensions.get::<SlotCell>() else {
        return Ok(());
    };
    if cell.is_filled() {
        return Ok(());
    }
    match cell.slots.take(Holder::Tenant(tenant)) {
        Some(slot) => {
            cell.fill(slot);
            Ok(())
        }
        None => Err(ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                ProblemCode::TooManyConcurrent,
                format!(
                    "this tenant already has {} requests in flight on this node, its share \
                     (max_concurrent_requests_per_tenant); retry when one of them has been answered",
                    cell.slots.per_tenant
                ),
            )
        }),
    }
}

/// Sheds load beyond the node's slots (503 `overloaded`), and beyond the public routes' share;
/// a tenant's share is taken at authentication.
pub async fn shed_load(
    State(slots): State<Arc<RequestSlots>>,
    mut req: Request,
    next: Next,
) -> Response {
    let overloaded = || {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                ProblemCode::Overloaded,
                "the service is at its limit of concurrent requests; retry shortly",
            )
        }
        .into_response()
    };
    let Ok(_permit) = slots.total.try_acquire() else {
        return overloaded();
    };
    let cell = SlotCell {
        slots: slots.clone(),
        slot: Arc::new(Mutex::new(None)),
    };
    if !req.uri().path().starts_with("/v1/") {
        match slots.take(Holder::Public) {
            Some(slot) => cell.fill(slot),
            None => return overloaded(),
        }
    }
    req.extensions_mut().insert(cell.clone());
    // Given back when the response is ready (or the client left), whoever still holds a copy
    // of the request's extensions.
    let _release = Release(cell);
    next.run(req).await
}

/// Empties a request's [`SlotCell`] when dropped.
struct Release(SlotCell);

impl Drop for Release {
    fn drop(&mut self) {
        if let Ok(mut slot) = self.0.slot.lock() {
            slot.take();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_over_its_burst_is_told_when_to_retry_and_others_are_unaffected() {
        let l = Limiter::new(RateLimit {
            requests_per_second: 1.0,
            burst: 2.0,
        });
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        assert!(l.check(a).is_ok());
        assert!(l.check(a).is_ok());
        let e = l.check(a).expect_err("over the burst");
        assert_eq!(e.code, ProblemCode::RateLimited);
        assert_eq!(e.retry_after, Some(1));
        assert!(l.check(b).is_ok());
    }

    #[test]
    fn a_tenant_holds_its_share_and_gets_its_slots_back() {
        let slots = RequestSlots::new(8, 2);
        let (a, b) = (
            Holder::Tenant(Uuid::now_v7()),
            Holder::Tenant(Uuid::now_v7()),
        );
        let a1 = slots.take(a).expect("first");
        let _a2 = slots.take(a).expect("second");
        assert!(slots.take(a).is_none(), "over the share");
        assert!(slots.take(b).is_some(), "another tenant");
        drop(a1);
        assert!(slots.take(a).is_some(), "given back");
        assert_eq!(
            RequestSlots::new(4, 100).per_tenant,
            4,
            "never above the pool"
        );
        assert_eq!(RequestSlots::new(4, 0).per_tenant, 1, "at least one");
    }

    #[test]
    fn a_zero_rate_means_no_limit() {
        let l = Limiter::new(RateLimit {
            requests_per_second: 0.0,
            burst: 0.0,
        });
        let a = Uuid::now_v7();
        for _ in 0..1000 {
            assert!(l.check(a).is_ok());
        }
    }
}
