//! The HTTP API of toolexec (SPEC §2): axum handlers that extract, call one engine function and
//! map the result; auth in an extractor; problem+json errors; the OpenAPI document generated from
//! the handlers, served at `/openapi.json` (with Swagger UI at `/docs`) and checked in.
#![forbid(unsafe_code)]

pub mod auth;
pub mod auth_failures;
pub mod dialects;
pub mod door;
pub mod extract;
pub mod forward;
pub mod limits;
pub mod mcp;
mod observe;
mod openapi;
pub mod problem;
mod routes;
pub mod session_path;
pub mod swerex;

use std::sync::Arc;
use std::time::Duration;
use toolexec_core::ProblemCode;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, Request};
use toolexec_engine::Engine;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;

pub use auth::{Auth, AuthMode, key_hash};
pub use openapi::{openapi, openapi_json};
use problem::ApiError;

/// Default request body limit: a batch of calls with a few large `write_file` contents fits;
/// anything bigger should be split.
pub const DEFAULT_BODY_LIMIT_BYTES: usize = 16 * 1024 * 1024;

/// Default cap on requests in flight: far above what two cores serve, low enough that a flood
/// gets fast 503s instead of unbounded queues and memory.
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 1024;

/// Default share of the requests in flight one tenant may hold: an eighth of the node's, so
/// that eight tenants at their share fit and a lone tenant still has far more than two cores
/// serve at once.
pub fn default_max_concurrent_requests_per_tenant(max_concurrent_requests: usize) -> usize {
    (max_concurrent_requests / 8).max(1)
}

/// Default time a request body may take to arrive, whole: a 16 MiB body needs ~0.6 MB/s; a
/// client that announces a body and stalls holds its connection no longer than this.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Default time a request's head may take: generous for any real client, short enough that
/// connections opened and left silent (slowloris) are closed.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Default time a response may wait for a client that stopped reading it: a slow but live
/// client reads something well within it; one that asks and never reads is cut off.
pub const DEFAULT_WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Default cap on open connections: above `DEFAULT_MAX_CONCURRENT_REQUESTS` (idle keep-alive
/// connections of agent loops), far below what the descriptor limit allows.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

#[derive(Debug, Clone)]
pub struct ApiConfig {
    pub body_limit_bytes: usize,
    /// Requests in flight beyond which new ones get 503 `overloaded`.
    pub max_concurrent_requests: usize,
    /// Requests in flight one tenant may hold (and the public routes together); beyond it its
    /// new ones get 429 `too_many_concurrent`.
    pub max_concurrent_requests_per_tenant: usize,
    /// Longest a request body may take to arrive in full (408 `request_timeout` beyond).
    pub body_read_timeout: Duration,
    /// Longest a request's head may take to arrive (the connection is closed beyond); the
    /// server that serves the app applies it.
    pub header_read_timeout: Duration,
    /// Open connections beyond which new ones are closed at once; applied by the server.
    pub max_connections: usize,
    /// Longest a response may wait for the client to read more of it (the connection is
    /// closed beyond); applied by the server.
    pub write_stall_timeout: Duration,
    /// The host and browser-origin allow-lists every route but the probes is held to.
    pub door: door::Door,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            body_limit_bytes: DEFAULT_BODY_LIMIT_BYTES,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            max_concurrent_requests_per_tenant: default_max_concurrent_requests_per_tenant(
                DEFAULT_MAX_CONCURRENT_REQUESTS,
            ),
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            write_stall_timeout: DEFAULT_WRITE_STALL_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            door: door::Door::default(),
        }
    }
}

/// Everything a handler can reach.
#[derive(Debug)]
pub struct AppState {
    pub engine: Arc<Engine>,
    pub auth: Auth,
    pub limiter: limits::Limiter,
    pub config: ApiConfig,
}

pub(crate) type SharedState = Arc<AppState>;

static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Request ids are UUIDv7 unless the gateway already set `x-request-id`, which is kept.
#[derive(Clone, Copy, Debug)]
struct MakeRequestIdV7;

impl MakeRequestId for MakeRequestIdV7 {
    fn make_request_id<B>(&mut self, _: &Request<B>) -> Option<RequestId> {
        uuid::Uuid::now_v7()
            .to_string()
            .parse()
            .ok()
            .map(RequestId::new)
    }
}

/// The whole HTTP application.
pub fn app(state: Arc<AppState>) -> Router {
    let body_limit = state.config.body_limit_bytes;
    let slots = limits::RequestSlots::new(
        state.config.max_concurrent_requests,
        state.config.max_concurrent_requests_per_tenant,
    );
    let (router, api) = openapi::parts(state.engine.registry());
    let schemas = Arc::new(extract::BodySchemas::from_openapi(&api));
    let docs = utoipa_swagger_ui::SwaggerUi::new("/docs").url("/openapi.json", api);
    router
        .merge(docs)
        // JSON-RPC, described by the MCP specification rather than the OpenAPI document.
        .merge(mcp::router(&state))
        // The SWE-ReX remote API (docs/swerex.md): its client's own routes and shapes.
        .merge(swerex::router())
        .fallback(|| async {
            ApiError::new(
                ProblemCode::NoRoute,
                "no such endpoint; see /docs for the API",
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                ProblemCode::MethodNotAllowed,
                "this endpoint does not accept that method; see /docs",
            )
        })
        .with_state(state.clone())
        // One layer made of the whole stack (a route's layers are applied to each route, so
        // `MatchedPath` and the path's parameters are there): each `Router::layer` call boxes
        // the route once more, and every `from_fn` clones the service under it per request, so
        // fourteen separate calls cost ~30 boxed clones and drops per request (issue 28's
        // profile: ~10 % of the service's CPU per recorded read). Outermost first.
        .layer(
            tower::ServiceBuilder::new()
                .layer(SetRequestIdLayer::new(
                    X_REQUEST_ID.clone(),
                    MakeRequestIdV7,
                ))
                .layer(PropagateRequestIdLayer::new(X_REQUEST_ID.clone()))
                // Before the span is made: the session id is parsed here, once, for everything
                // after.
                .layer(axum::middleware::from_fn(session_path::parse))
                .layer(
                    TraceLayer::new_for_http()
                        .make_span_with(|req: &Request<_>| {
                            observe::request_span(req, &X_REQUEST_ID)
                        })
                        .on_response(observe::on_response),
                )
                .layer(axum::middleware::from_fn_with_state(
                    state.clone(),
                    observe::count_request,
                ))
                .layer(axum::middleware::map_response(no_sniffing))
                .layer(axum::middleware::from_fn(problem::with_request_id))
                .layer(tower_http::catch_panic::CatchPanicLayer::custom(
                    |_: Box<dyn std::any::Any + Send>| {
                        use axum::response::IntoResponse;
                        tracing::error!("handler panicked");
                        ApiError::internal().into_response()
                    },
                ))
                // Before anything reads the body or the credentials: a request from a page that
                // rebound its name to this address learns nothing and holds no slot.
                .layer(axum::middleware::from_fn_with_state(
                    state.clone(),
                    door::check,
                ))
                .layer(axum::middleware::from_fn_with_state(
                    slots,
                    limits::shed_load,
                ))
                .layer(axum::middleware::from_fn_with_state(
                    limits::BodyRules {
                        limit_bytes: body_limit,
                        read_timeout: state.config.body_read_timeout,
                        archive_limit_bytes: state.engine.config().limits.max_archive_bytes,
                    },
                    limits::guard_body,
                ))
                .layer(DefaultBodyLimit::max(body_limit))
                .layer(axum::Extension(schemas))
                // Innermost: the body is already bounded when a request is forwarded.
                .layer(axum::middleware::from_fn_with_state(
                    state.clone(),
                    forward::forward_to_owner,
                )),
        )
}

/// Every response is taken as the type it names: a workspace file served as `text/plain` or
/// `application/octet-stream` (`GET …/files/{path}`, archives, outputs) is never sniffed into
/// HTML or script by a browser, whatever a tenant wrote into it.
async fn no_sniffing(mut res: axum::response::Response) -> axum::response::Response {
    res.headers_mut().insert(
        axum::http::header::X_CONTENT_TYPE_OPTIONS,
        axum::http::HeaderValue::from_static("nosniff"),
    );
    res
}

/// How long `/readyz` waits for the store before calling it down.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(2);
