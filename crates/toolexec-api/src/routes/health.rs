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

/// Prometheus metrics.
///
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
        state.engine.render_metrics(),
    )
        .into_response()
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`
    pub status: &'static str,
}

/// Liveness.
///
/// Always `{"status": "ok"}` while the process serves HTTP; unauthenticated, for an
/// orchestrator's liveness probe. Readiness (the store and the sandbox) is `GET /readyz`.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "Alive", body = Health)))]
async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxReadiness {
    /// `enforced`, `unsandboxed` (the operator turned isolation off: commands run on the host),
    /// `unavailable` (commands fail closed) or `none` (no sandbox configured).
    pub mode: String,
    pub ready: bool,
    /// What is enforced, or why the sandbox is unusable.
    pub detail: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    /// `ready` or `not_ready`.
    pub status: &'static str,
    /// `postgres` or `sqlite`.
    pub store: &'static str,
    /// `ok`, or why the store is not usable.
    pub store_status: String,
    /// Whether `shell` and the process tools can run commands, and how they are isolated.
    pub sandbox: SandboxReadiness,
    /// How requests are authenticated.
    pub auth: &'static str,
}

/// Readiness.
///
/// Readiness: the store answers and the sandbox is usable (a sandbox that failed its start-up
/// self-check makes the instance not ready: its commands would fail closed). 503 with the same
/// body otherwise.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "Not ready; the body says why", body = Readiness),
    ))]
async fn readyz(State(state): State<SharedState>) -> Response {
    let store = state.engine.store();
    let store_status = match tokio::time::timeout(READY_TIMEOUT, store.ping()).await {
        Ok(Ok(())) => "ok".to_owned(),
        // The cause goes to the log: this body is unauthenticated.
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: the store is unreachable");
            "unreachable (the service's log has the cause)".to_owned()
        }
        Err(_) => format!("no answer within {} ms", READY_TIMEOUT.as_millis()),
    };
    let sandbox = match state.engine.config().sandbox.as_ref().map(|s| s.status()) {
        Some(s) => SandboxReadiness {
            mode: s.mode.to_owned(),
            ready: s.ready,
            detail: s.detail,
        },
        None => SandboxReadiness {
            mode: "none".into(),
            ready: true,
            detail: "no sandbox configured: shell and the process tools answer that commands cannot run here".into(),
        },
    };
    let ready = store_status == "ok" && sandbox.ready;
    let body = Readiness {
        status: if ready { "ready" } else { "not_ready" },
        store: store.backend(),
        store_status,
        sandbox,
        auth: state.auth.describe(),
    };
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}
