//! Extractors whose rejections are problem+json: JSON bodies, query strings, path ids.
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::problem::ApiError;

/// A JSON body. Wrong content type → 415, unreadable JSON → 400, JSON of the wrong shape → 422,
/// over the body limit → 413; all as problems.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| {
                let v = v.trim().to_ascii_lowercase();
                v == "application/json" || (v.starts_with("application/") && v.ends_with("+json"))
            })
            .unwrap_or(false);
        if !is_json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "send the body as JSON with 'Content-Type: application/json'",
            ));
        }
        let deadline = req
            .extensions()
            .get::<crate::limits::BodyDeadline>()
            .copied();
        let read = Bytes::from_request(req, state);
        let read = match deadline {
            Some(crate::limits::BodyDeadline { at, within, .. }) => {
                match tokio::time::timeout_at(at, read).await {
                    Ok(read) => read,
                    Err(_) => {
                        return Err(ApiError::new(
                            StatusCode::REQUEST_TIMEOUT,
                            "request_timeout",
                            format!(
                                "the request body did not arrive within {} s; send the whole body at once",
                                within.as_secs_f64()
                            ),
                        ));
                    }
                }
            }
            None => read.await,
        };
        let bytes = read.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::body_too_large(deadline.map_or(0, |d| d.limit_bytes))
            } else {
                ApiError::new(StatusCode::BAD_REQUEST, "unreadable_body", e.body_text())
            }
        })?;
        let de = &mut serde_json::Deserializer::from_slice(&bytes);
        match serde_path_to_error::deserialize::<_, T>(de) {
            Ok(v) => Ok(ApiJson(v)),
            Err(err) => {
                let path = err.path().to_string();
                let inner = err.into_inner();
                use serde_json::error::Category;
                match inner.classify() {
                    Category::Syntax | Category::Eof | Category::Io => Err(ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "malformed_json",
                        format!("request body is not valid JSON: {inner}"),
                    )),
                    Category::Data => Err(ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "invalid_request",
                        if path == "." {
                            format!("request body: {inner}")
                        } else {
                            format!("request body at '{path}': {inner}")
                        },
                    )),
                }
            }
        }
    }
}

/// A query string; a malformed one is a 400 problem.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let q = parts.uri.query().unwrap_or_default();
        serde_urlencoded::from_str(q).map(ApiQuery).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_query",
                format!("query string: {e}"),
            )
        })
    }
}

/// Parses an id from the path; anything that is not a UUID names no resource (404).
pub fn parse_id(raw: &str, what: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::not_found(what))
}
