//! The session a request is about, read from its path once, where the request comes in: the
//! request's span, the forwarding layer and the handler take it from the request's extensions
//! ([`SessionPath`]) instead of parsing the path again. The engine gets it as part of a
//! [`SessionRef`], with the lease routing took for it ([`Routed`]).
//!
//! [`SessionRef`]: toolexec_engine::SessionRef
use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;
use toolexec_engine::RoutedLease;
use uuid::Uuid;

use crate::problem::ApiError;

/// Routes whose `{id}` names a session.
const SESSION_ROUTES: &str = "/v1/sessions/{id}";

/// The session id of a request's path, when its route names one and the id is a UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionPath(pub Uuid);

/// The layer: parses the `{id}` of a session's routes (percent-decoded, as `Path` would) and
/// puts it in the request's extensions. An `{id}` that is not a UUID names no session: the
/// handler answers 404 as for any unknown id.
pub(crate) async fn parse(
    params: Result<RawPathParams, axum::extract::rejection::RawPathParamsRejection>,
    mut req: Request,
    next: Next,
) -> Response {
    let names_session = req
        .extensions()
        .get::<MatchedPath>()
        .is_some_and(|m| m.as_str().starts_with(SESSION_ROUTES));
    if !names_session {
        return next.run(req).await;
    }
    let id = match &params {
        Ok(params) => params
            .iter()
            .find(|(name, _)| *name == "id")
            .and_then(|(_, id)| Uuid::parse_str(id).ok()),
        // Another parameter is not UTF-8 once decoded (a file's path may hold such bytes):
        // the id from the raw path, where a UUID needs no decoding.
        Err(_) => req
            .uri()
            .path()
            .strip_prefix("/v1/sessions/")
            .and_then(|rest| rest.split('/').next())
            .and_then(|id| Uuid::parse_str(id).ok()),
    };
    if let Some(id) = id {
        req.extensions_mut().insert(SessionPath(id));
    }
    next.run(req).await
}

impl SessionPath {
    /// The session id the layer found in this request's path, if any.
    pub(crate) fn of(parts: &Parts) -> Option<Uuid> {
        parts.extensions.get::<SessionPath>().map(|s| s.0)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for SessionPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Self::of(parts)
            .map(SessionPath)
            .ok_or_else(|| ApiError::not_found("session"))
    }
}

/// This node's lease of the request's session, when routing the request took it
/// ([`toolexec_engine::Route::Here`]); `None` when clustering is off, the request was forwarded
/// here, or the lease was not held here yet (the engine takes it then).
#[derive(Debug, Clone, Default)]
pub struct Routed(pub Option<RoutedLease>);

impl Routed {
    pub(crate) fn of(parts: &Parts) -> Option<RoutedLease> {
        parts.extensions.get::<RoutedLease>().cloned()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Routed {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Routed(Self::of(parts)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use axum::Router;
    use axum::body::Body;
    use axum::http::Request;
    use axum::routing::get;
    use tower::ServiceExt;

    use super::*;

    /// What the handler of each route finds: the id the layer parsed, or "none".
    async fn found(uri: &str) -> String {
        let seen = |ext: axum::http::Extensions| async move {
            ext.get::<SessionPath>()
                .map_or("none".to_owned(), |s| s.0.to_string())
        };
        let app = Router::new()
            .route("/v1/sessions/{id}", get(seen))
            .route("/v1/sessions/{id}/files/{*path}", get(seen))
            .route("/v1/replays/{id}", get(seen))
            .layer(axum::middleware::from_fn(parse));
        let res = app
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_sessions_id_is_parsed_once_for_everything_after() {
        let id = "01a2282a-7bae-7178-9bcd-084cb54c55a9";
        assert_eq!(found(&format!("/v1/sessions/{id}")).await, id);
        // Percent-decoded, as `Path` decodes it.
        let encoded = id.replacen('0', "%30", 1);
        assert_eq!(found(&format!("/v1/sessions/{encoded}")).await, id);
        // A file's path that is not UTF-8 once decoded does not hide the session.
        assert_eq!(
            found(&format!("/v1/sessions/{id}/files/a%FF.txt")).await,
            id
        );
        // Not a UUID: no session (the handler answers 404).
        assert_eq!(found("/v1/sessions/not-a-uuid").await, "none");
        // Another resource's id is not a session's.
        assert_eq!(found(&format!("/v1/replays/{id}")).await, "none");
    }
}
