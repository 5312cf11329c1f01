//! What each request leaves for the operator: its span (the `request` span of the logs, and of
//! the traces when OpenTelemetry export is on) and its sample in the request metrics
//! (`toolexec_http_requests_total`, `toolexec_http_request_duration_seconds`).
//!
//! Both name the request by its route *template* (`/v1/sessions/{id}/calls`), never by its raw
//! path: a label value per session would grow the metrics without bound, and a span name per
//! session would defeat every trace view that groups by operation. Requests that match no
//! route are `unmatched`.
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Response};
use axum::middleware::Next;
use opentelemetry::propagation::{Extractor, Injector};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::SharedState;

/// The route label of a request that matched no route (404s of the fallback).
pub const UNMATCHED: &str = "unmatched";

/// The route template a request matched, or [`UNMATCHED`].
fn route_of<B>(req: &Request<B>) -> &str {
    req.extensions()
        .get::<MatchedPath>()
        .map_or(UNMATCHED, MatchedPath::as_str)
}

/// The method as a label: the standard ones by name, anything else `other` (a client may send
/// any token as a method).
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The span of one request. Its fields follow OpenTelemetry's HTTP conventions where there is
/// one (`http.route`, `http.request.method`, `http.response.status_code`); `otel.name` and
/// `otel.kind` name the exported span (`POST /v1/sessions/{id}/calls`, a server span).
/// `tenant.id` is filled in once the request is authenticated, the status when it is answered.
pub(crate) fn request_span<B>(req: &Request<B>, request_id: &HeaderName) -> Span {
    let id = req
        .headers()
        .get(request_id)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    let route = route_of(req);
    let method = method_label(req.method());
    let span = tracing::info_span!(
        "request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        otel.status_code = Empty,
        method = %req.method(),
        path = %req.uri().path(),
        request_id = %id,
        http.request.method = method,
        http.route = route,
        http.response.status_code = Empty,
        session.id = Empty,
        tenant.id = Empty,
    );
    if let Some(crate::session_path::SessionPath(session)) = req.extensions().get() {
        span.record("session.id", tracing::field::display(session));
    }
    continue_trace(&span, req.headers());
    span
}

/// The W3C trace context headers (<https://www.w3.org/TR/trace-context/>).
const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut HeaderMap);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// A request that carries a `traceparent` (from a gateway or an agent loop that traces, or
/// from the replica that forwarded it) continues that trace: its span's parent is the caller's.
/// Without an exporter (no propagator installed) this does nothing.
fn continue_trace(span: &Span, headers: &HeaderMap) {
    if !headers.contains_key(TRACEPARENT) {
        return;
    }
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(&Headers(headers)));
    // A malformed header leaves the span a root of its own trace.
    let _ = span.set_parent(cx);
}

/// Sets the trace context of a request this replica sends on (a forwarded one) to the current
/// span's, so that the owner's spans join this replica's trace. The caller's own headers are
/// replaced: they name the caller's span, not this hop.
pub(crate) fn propagate(headers: &mut HeaderMap) {
    headers.remove(TRACEPARENT);
    headers.remove(TRACESTATE);
    let cx = Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut HeadersMut(headers));
    });
}

/// Records a request's answer on its span: the status, and an error status for a 5xx (a
/// 4xx is the client's doing, not a failure of the service).
pub(crate) fn on_response<B>(res: &Response<B>, _latency: Duration, span: &Span) {
    let status = res.status();
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
}

/// Records the tenant a request was authenticated as on its span.
pub(crate) fn record_tenant(tenant: uuid::Uuid) {
    Span::current().record("tenant.id", tracing::field::display(tenant));
}

/// Counts each request and its time to the response's head by method, route template and
/// status. Requests shed for load or refused for their body are counted too (this layer is
/// outside those).
pub(crate) async fn count_request(
    State(state): State<SharedState>,
    req: Request,
    next: Next,
) -> axum::response::Response {
    let route = route_of(&req).to_owned();
    let method = method_label(req.method());
    let t0 = Instant::now();
    let res = next.run(req).await;
    state.engine.metrics().http_request(
        method,
        &route,
        res.status().as_u16(),
        t0.elapsed().as_secs_f64(),
    );
    res
}
