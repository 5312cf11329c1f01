//! Environments (OCI images sessions run in, docs/environments.md): pulling one into this
//! node's cache ahead of the sessions that need it, with the download's progress as events.
use std::convert::Infallible;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use toolexec_core::SessionEnvironment;
use toolexec_engine::EngineError;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::SharedState;
use crate::auth::AuthTenant;
use crate::extract::ApiJson;
use crate::problem::{ApiError, Problem};

pub fn router() -> OpenApiRouter<SharedState> {
    OpenApiRouter::new().routes(routes!(pull_environment))
}

/// The body of `POST /v1/environments`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// A name of `environments.images`, or a reference to a registry in
    /// `environments.allow_registries` — what a session's `environment.image` may be.
    pub image: String,
}

/// An image in this node's cache.
#[derive(Debug, Serialize, ToSchema)]
pub struct PulledEnvironment {
    /// What a session created with the same `image` now records: the reference, the manifest
    /// digest for this host's platform, the configured name.
    pub environment: SessionEnvironment,
    /// Whether it was in the cache already (nothing was downloaded).
    pub cached: bool,
    /// Bytes of its files unpacked, and of its blobs as downloaded.
    pub unpacked_bytes: u64,
    pub download_bytes: u64,
}

/// The data of a `progress` event of `POST /v1/environments`.
#[derive(Debug, Serialize, ToSchema)]
pub struct PullProgress {
    /// Bytes of the image's blobs downloaded and checked so far.
    pub bytes_done: u64,
    /// Bytes its manifest declares (config and layers).
    pub bytes_total: u64,
}

/// Pull an image.
///
/// Pulls an image into this node's cache (unless it is there), so that the first session in it
/// does not wait for the download: the same image a session's `environment.image` may name, by
/// the same rules. Concurrent pulls of one digest (sessions included) share one download.
///
/// With `Accept: text/event-stream`, the answer is a stream: `progress` events
/// (`PullProgress`, as bytes arrive), then one `pulled` event (`PulledEnvironment`) or one
/// `error` event (a `Problem`). Otherwise the answer waits for the pull and is the
/// `PulledEnvironment`. A cluster's nodes have a cache each: this fills the one of the node
/// that answers.
///
/// A tenant has at most `limits.max_pulls_per_tenant` pulls under way on a node; one more is
/// 429 `too_many_concurrent`. A pull goes on when its client goes away (a session may be
/// waiting on the same digest, and the image is kept for the next one) and counts against the
/// tenant until it ends.
#[utoipa::path(post, path = "/v1/environments", tag = "environments", security(("bearer" = [])),
    request_body = PullRequest,
    responses(
        (status = 200, description = "In the cache (`text/event-stream`: progress events, then `pulled` or `error`)", body = PulledEnvironment),
        (status = 422, description = "An image the operator does not allow, that the registry does not have, for another platform, too large or not a valid image (`image_not_allowed`, `image_not_found`, `image_wrong_platform`, `image_too_large`, `invalid_image`)", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "This tenant has `limits.max_pulls_per_tenant` pulls under way on this node (`too_many_concurrent`, with `Retry-After`); nothing was started", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "The registry refused the pull or could not be reached (`registry_unauthorized`, `registry_unreachable`)", body = Problem, content_type = "application/problem+json"),
    ))]
async fn pull_environment(
    State(state): State<SharedState>,
    AuthTenant(tenant): AuthTenant,
    headers: HeaderMap,
    ApiJson(req): ApiJson<PullRequest>,
) -> Result<Response, ApiError> {
    let streaming = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    if !streaming {
        let pull = state
            .engine
            .start_pull(tenant.id, req.image, |_| {})
            .map_err(retry_later)?;
        let pulled = pull
            .await
            .map_err(|e| ApiError::from(EngineError::Internal(format!("image pull: {e}"))))??;
        return Ok(Json(answer(pulled)).into_response());
    }
    // Progress (coalesced: a slow reader gets the latest, never a backlog), then the end.
    let (tx, rx) = tokio::sync::mpsc::channel::<SseEvent>(16);
    let progress_tx = tx.clone();
    let pull = state
        .engine
        .start_pull(tenant.id, req.image, move |p| {
            let data = PullProgress {
                bytes_done: p.bytes_done,
                bytes_total: p.bytes_total,
            };
            if let Ok(event) = SseEvent::default().event("progress").json_data(data) {
                let _ = progress_tx.try_send(event);
            }
        })
        .map_err(retry_later)?;
    // The pull goes on if the client goes away (`Engine::start_pull`); only its answer is lost.
    tokio::spawn(async move {
        let result = pull
            .await
            .unwrap_or_else(|e| Err(EngineError::Internal(format!("image pull: {e}"))));
        let last = match result {
            Ok(pulled) => SseEvent::default()
                .event("pulled")
                .json_data(answer(pulled)),
            Err(e) => {
                let e = ApiError::from(e);
                SseEvent::default().event("error").json_data(Problem {
                    type_: format!("urn:toolexec:problem:{}", e.code),
                    title: e.code.title().to_owned(),
                    status: e.code.status(),
                    detail: e.detail,
                    code: e.code,
                })
            }
        };
        if let Ok(event) = last {
            let _ = tx.send(event).await;
        }
    });
    let events = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    let mut resp = Sse::new(events)
        .keep_alive(
            KeepAlive::new()
                .interval(std::time::Duration::from_secs(15))
                .text("ping"),
        )
        .into_response();
    resp.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(resp)
}

/// When to try a pull refused for the pulls under way again.
const RETRY_AFTER_SECS: u32 = 5;

/// A refusal for the pulls a tenant has under way, with when to try again.
fn retry_later(e: EngineError) -> ApiError {
    ApiError {
        retry_after: Some(RETRY_AFTER_SECS),
        ..ApiError::from(e)
    }
}

fn answer(p: toolexec_engine::environments::PulledEnvironment) -> PulledEnvironment {
    PulledEnvironment {
        environment: p.environment,
        cached: p.cached,
        unpacked_bytes: p.unpacked_bytes,
        download_bytes: p.download_bytes,
    }
}
