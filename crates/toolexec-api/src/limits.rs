//! Admission control: a per-tenant request rate limit (token bucket, 429 + `Retry-After`), a
//! global cap on requests in flight (load shedding: 503 + `Retry-After` instead of queueing
//! without bound), and the rules for request bodies (a declared size over the limit is refused
//! before a byte of it is read; a body must arrive whole within a deadline).
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolexec_core::ProblemCode;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;
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

/// Sheds load beyond `permits` requests in flight.
pub async fn shed_load(
    State(permits): State<Arc<Semaphore>>,
    req: Request,
    next: Next,
) -> Response {
    match permits.try_acquire() {
        Ok(_permit) => next.run(req).await,
        Err(_) => ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                ProblemCode::Overloaded,
                "the service is at its limit of concurrent requests; retry shortly",
            )
        }
        .into_response(),
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
