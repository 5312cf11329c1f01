//! Requests that must run where their session lives — its calls (also over MCP), rewinds,
//! cancels, forks and its close, and the cancel of one of its invocations — are forwarded to the replica it lives
//! on when they reach another one (the engine decides where: [`Cluster::route`]). Everything
//! else (the log, the tree at a seq, replays, new sessions) is answered by whichever replica
//! gets it, from the shared store.
//!
//! The forwarded request is the client's, byte for byte, with its own credentials (the owner
//! authenticates it again) and one header more, `x-toolexec-forwarded-by`: a request that
//! carries it is never forwarded again. The header grants nothing else: the owner checks the
//! request's `Host` and `Origin` like any other ([`crate::door`]), and its `Host` is the
//! owner's advertised address, which the owner answers for. The answer comes back as the owner gave it, streamed.
//! If the owner cannot be reached (no connection: the request was not sent), the route is asked
//! again — the owner may be handing its sessions over, or gone, and this node then takes the
//! session over — until `limits.lease_wait_ms`, then the client gets 503. If the connection
//! breaks after the request went out, it may have run: the client gets 503 and a retry of the
//! same call ids returns what was recorded.
//!
//! [`Cluster::route`]: toolexec_engine::Cluster::route
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use toolexec_core::ProblemCode;
use toolexec_engine::Route;
use uuid::Uuid;

use crate::SharedState;
use crate::problem::ApiError;
use crate::session_path::SessionPath;

/// Set on a forwarded request (the forwarding node's name): never forwarded again.
pub static FORWARDED_BY: HeaderName = HeaderName::from_static("x-toolexec-forwarded-by");

/// Headers that belong to one connection, not to the request (RFC 9110 §7.6.1), and the ones
/// the client library sets itself.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

/// What a request is about, when it must run where a session lives.
enum Target {
    Session(Uuid),
    Invocation(Uuid),
    /// An archive upload: its body is streamed to the node, not buffered here.
    Upload(Uuid),
}

/// `session`: the id the session-path layer parsed from the path, if its route names one.
fn target(method: &Method, path: &str, session: Option<Uuid>) -> Option<Target> {
    if let Some(rest) = path.strip_prefix("/v1/sessions/") {
        let session = session?;
        let mut parts = rest.split('/');
        parts.next();
        return match (method, parts.next(), parts.next()) {
            (&Method::POST, Some("calls" | "mcp" | "rewind" | "cancel" | "fork"), None)
            | (&Method::DELETE, None, None)
            // The SWE-ReX API's calls (its bash sessions are terminals of the session's node).
            | (&Method::POST, Some("swerex"), Some(_)) => Some(Target::Session(session)),
            (&Method::PUT, Some("archive"), None) => Some(Target::Upload(session)),
            _ => None,
        };
    }
    let rest = path.strip_prefix("/v1/invocations/")?;
    let mut parts = rest.split('/');
    let invocation = Uuid::parse_str(parts.next()?).ok()?;
    match (method, parts.next(), parts.next()) {
        (&Method::POST, Some("cancel" | "approve" | "deny"), None) => {
            Some(Target::Invocation(invocation))
        }
        _ => None,
    }
}

fn client() -> Option<&'static reqwest::Client> {
    static CLIENT: OnceLock<Option<reqwest::Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| match toolexec_tools::web::replica_client() {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::error!(error = %e, "no client for forwarding requests to other replicas");
                None
            }
        })
        .as_ref()
}

/// The middleware: runs the request here, or forwards it to the session's node.
pub(crate) async fn forward_to_owner(
    State(state): State<SharedState>,
    req: Request,
    next: Next,
) -> Response {
    let engine = &state.engine;
    if engine.config().cluster.advertise_url.is_none() || req.headers().contains_key(&FORWARDED_BY)
    {
        return next.run(req).await;
    }
    let session = req.extensions().get::<SessionPath>().map(|s| s.0);
    let Some(target) = target(req.method(), req.uri().path(), session) else {
        return next.run(req).await;
    };
    // Who sends it, before its body is read or sent on (the owner authenticates it again;
    // Host and Origin were checked before this layer, on every route): a wrong key is
    // answered at once and holds no request slot, and the tenant's slot is taken here
    // (docs/security.md, "Request slots").
    let (mut parts, body) = req.into_parts();
    if let Err(e) = crate::auth::AuthTenant::from_request_parts(&mut parts, &state).await {
        return e.into_response();
    }
    let req = Request::from_parts(parts, body);
    let session = match target {
        Target::Upload(session) => return forward_upload(&state, session, req, next).await,
        Target::Session(id) => id,
        Target::Invocation(id) => match engine.cluster().invocation_session(id).await {
            Ok(Some(session)) => session,
            // Unknown here too: the handler answers (404), as for any id.
            _ => return next.run(req).await,
        },
    };
    let (mut parts, body) = req.into_parts();
    // The body guard already bounded it in size and time.
    let Ok(body) = axum::body::to_bytes(body, state.config.body_limit_bytes).await else {
        return ApiError::new(
            ProblemCode::UnreadableBody,
            "the request body could not be read to its end",
        )
        .into_response();
    };
    let started = Instant::now();
    let wait = Duration::from_millis(engine.config().limits.lease_wait_ms);
    loop {
        let route = match engine.cluster().route(session).await {
            Ok(route) => route,
            Err(e) => return ApiError::from(e).into_response(),
        };
        let (node, address) = match route {
            Route::Forward { node, address } => (node, address),
            Route::Here(lease) => {
                // The lease routing took goes on to the calls this request runs.
                if let Some(lease) = lease {
                    parts.extensions.insert(lease);
                }
                let req = Request::from_parts(parts, Body::from(body));
                return next.run(req).await;
            }
        };
        match send(
            engine,
            session,
            &node,
            &address,
            &parts,
            body.clone().into(),
        )
        .await
        {
            Ok(response) => return response,
            Err(Failed::Answering(e)) => {
                // It may have run: only the client can tell a retry (the same call ids) apart.
                tracing::warn!(%session, %node, error = %e, "the node a session lives on failed while answering a forwarded request");
                return ApiError::new(
                    ProblemCode::Unavailable,
                    format!(
                        "session {session} lives on node {node}, which failed while answering; what was sent may have run. Send the same request again (the same call ids): recorded calls return their results and none runs twice"
                    ),
                )
                .into_response();
            }
            Err(Failed::Connecting(e)) => {
                tracing::warn!(%session, %node, error = %e, "the node a session lives on did not take a forwarded request");
                if started.elapsed() >= wait {
                    return ApiError::new(
                        ProblemCode::Unavailable,
                        format!(
                            "session {session} lives on node {node}, which cannot be reached now; nothing was run. Retry shortly: once that node is gone, another one takes the session over"
                        ),
                    )
                    .into_response();
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// An archive upload for a session on another node: its body streamed there as it arrives (it
/// may be a GiB; it is not held here), in one attempt — a node that cannot be reached gets a 503
/// that says to send it again, since the body cannot be sent twice.
async fn forward_upload(state: &SharedState, session: Uuid, req: Request, next: Next) -> Response {
    let engine = &state.engine;
    let route = match engine.cluster().route(session).await {
        Ok(route) => route,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let Route::Forward { node, address } = route else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    let body = reqwest::Body::wrap_stream(body.into_data_stream());
    match send(engine, session, &node, &address, &parts, body).await {
        Ok(response) => response,
        Err(Failed::Connecting(e) | Failed::Answering(e)) => {
            tracing::warn!(%session, %node, error = %e, "an archive upload could not be forwarded to the session's node");
            ApiError::new(
                ProblemCode::Unavailable,
                format!(
                    "session {session} lives on node {node}, which did not take the upload ({e}); send it again (an archive applied twice writes the same files)"
                ),
            )
            .into_response()
        }
    }
}

/// Why a forwarded request got no answer.
enum Failed {
    /// No connection: the request was not sent (sending it elsewhere is safe).
    Connecting(String),
    /// The connection broke after the request went out: it may have run.
    Answering(String),
}

/// Sends the request to `node` at `address` and streams its answer back. While no answer has
/// come, the node's heartbeat is checked every half lease TTL: a node that froze keeps the
/// connection open but never answers, and its sessions are taken over once it is gone.
async fn send(
    engine: &toolexec_engine::Engine,
    session: Uuid,
    node: &str,
    address: &str,
    parts: &axum::http::request::Parts,
    body: reqwest::Body,
) -> Result<Response, Failed> {
    let client = client().ok_or_else(|| Failed::Connecting("no client".to_owned()))?;
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
    let url = format!("{}{path}", address.trim_end_matches('/'));
    let mut headers = end_to_end(&parts.headers);
    if let Ok(value) = HeaderValue::from_str(engine.cluster().node()) {
        headers.insert(FORWARDED_BY.clone(), value);
    }
    crate::observe::propagate(&mut headers);
    let sent = client
        .request(parts.method.clone(), url)
        .headers(headers)
        .body(body)
        .send();
    tokio::pin!(sent);
    let answer = loop {
        tokio::select! {
            answer = &mut sent => break answer.map_err(|e| {
                if e.is_connect() {
                    Failed::Connecting(e.to_string())
                } else {
                    Failed::Answering(e.to_string())
                }
            })?,
            () = tokio::time::sleep(engine.cluster().liveness_check_interval()) => {
                if !engine.cluster().still_lives_on(session, node).await {
                    return Err(Failed::Answering(format!(
                        "node {node} stopped answering (its heartbeat is older than the lease TTL)"
                    )));
                }
            }
        }
    };
    let mut response = Response::builder().status(answer.status());
    if let Some(h) = response.headers_mut() {
        *h = end_to_end(answer.headers());
    }
    response
        .body(Body::from_stream(answer.bytes_stream()))
        .map_err(|e| Failed::Answering(e.to_string()))
}

fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_needs_the_sessions_node_is_forwarded() {
        let s = "01a2282a-7bae-7178-9bcd-084cb54c55a9";
        // As the session-path layer finds it.
        let forwarded = |m: Method, p: &str| {
            let session = p
                .strip_prefix("/v1/sessions/")
                .and_then(|rest| rest.split('/').next())
                .and_then(|id| Uuid::parse_str(id).ok());
            target(&m, p, session).is_some()
        };
        for (m, p) in [
            (Method::POST, format!("/v1/sessions/{s}/calls")),
            (Method::POST, format!("/v1/sessions/{s}/rewind")),
            (Method::POST, format!("/v1/sessions/{s}/cancel")),
            (Method::POST, format!("/v1/sessions/{s}/fork")),
            (Method::DELETE, format!("/v1/sessions/{s}")),
            (Method::POST, format!("/v1/invocations/{s}/cancel")),
            (Method::PUT, format!("/v1/sessions/{s}/archive")),
        ] {
            assert!(forwarded(m.clone(), &p), "{m} {p}");
        }
        for (m, p) in [
            (Method::GET, format!("/v1/sessions/{s}")),
            (Method::GET, format!("/v1/sessions/{s}/events")),
            (Method::GET, format!("/v1/sessions/{s}/events/stream")),
            (Method::GET, format!("/v1/sessions/{s}/tree")),
            (Method::GET, format!("/v1/sessions/{s}/archive")),
            (Method::POST, format!("/v1/sessions/{s}/replay")),
            (Method::POST, "/v1/sessions".to_owned()),
            (Method::POST, "/v1/sessions/not-a-uuid/calls".to_owned()),
            (Method::POST, format!("/v1/sessions/{s}/calls/x")),
            (Method::GET, format!("/v1/invocations/{s}")),
        ] {
            assert!(!forwarded(m.clone(), &p), "{m} {p}");
        }
    }
}
