//! Liveness and readiness.
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::{READY_TIMEOUT, SharedState};

pub fn router() -> OpenApiRouter<SharedState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
}

/// Prometheus metrics: calls by tool and status, call latency, store commit latency and batch
/// size. Unauthenticated like the probes; expose it only to the scraper (the gateway should not
/// route it).
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text exposition format", body = String, content_type = "text/plain; version=0.0.4")))]
async fn metrics(State(state): State<SharedState>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.engine.metrics().render(),
    )
        .into_response()
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`
    pub status: &'static str,
}

/// Liveness: the process serves HTTP.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "Alive", body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    /// `ready` or `not_ready`.
    pub status: &'static str,
    /// `postgres` or `sqlite`.
    pub store: &'static str,
    /// `ok`, or why the store is not usable.
    pub store_status: String,
    /// How process-running tools are sandboxed (or that none are installed).
    pub sandbox: String,
    /// How requests are authenticated.
    pub auth: &'static str,
}

/// Readiness: the store answers and the sandbox is usable. 503 with the same body otherwise.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "Not ready; the body says why", body = Readiness),
    ))]
async fn readyz(State(state): State<SharedState>) -> Response {
    let store = state.engine.store();
    let store_status = match tokio::time::timeout(READY_TIMEOUT, store.ping()).await {
        Ok(Ok(())) => "ok".to_owned(),
        Ok(Err(e)) => format!("unreachable: {e}"),
        Err(_) => format!("no answer within {} ms", READY_TIMEOUT.as_millis()),
    };
    let ready = store_status == "ok";
    let body = Readiness {
        status: if ready { "ready" } else { "not_ready" },
        store: store.backend(),
        store_status,
        sandbox: state.config.sandbox_mode.clone(),
        auth: state.auth.describe(),
    };
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}
