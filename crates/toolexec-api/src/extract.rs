//! Extractors whose rejections are problem+json: JSON bodies, query strings, path ids.
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::problem::ApiError;

/// The request-body schemas of the OpenAPI document, compiled once: a body is checked against
/// the very document clients read, so the service accepts exactly what it documents — no array
/// where the document says object (serde alone takes a struct's sequence form), no `metadata`
/// that is not an object, no empty `calls`.
#[derive(Default)]
pub struct BodySchemas {
    validators: std::collections::HashMap<String, jsonschema::Validator>,
}

impl std::fmt::Debug for BodySchemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.validators.keys()).finish()
    }
}

impl BodySchemas {
    /// A validator for every component schema a request body names.
    pub fn from_openapi(api: &utoipa::openapi::OpenApi) -> Self {
        let doc = serde_json::to_value(api).unwrap_or_default();
        let components = doc.get("components").cloned().unwrap_or_default();
        let mut validators = std::collections::HashMap::new();
        let bodies = doc["paths"]
            .as_object()
            .into_iter()
            .flat_map(|paths| paths.values())
            .filter_map(|item| item.as_object())
            .flat_map(|ops| ops.values())
            .filter_map(|op| op.pointer("/requestBody/content/application~1json/schema/$ref"))
            .filter_map(|r| r.as_str())
            .filter_map(|r| r.strip_prefix("#/components/schemas/"));
        for name in bodies {
            let root = serde_json::json!({
                "$ref": format!("#/components/schemas/{name}"),
                "components": components,
            });
            match jsonschema::draft202012::new(&root) {
                Ok(v) => {
                    validators.insert(name.to_owned(), v);
                }
                Err(e) => {
                    tracing::error!(schema = name, error = %e, "request body schema does not compile")
                }
            }
        }
        Self { validators }
    }

    /// Checks `value` against the schema named `name` (bodies of undocumented types pass).
    fn check(&self, name: &str, value: &serde_json::Value) -> Result<(), ApiError> {
        let Some(v) = self.validators.get(name) else {
            return Ok(());
        };
        match v.iter_errors(value).next() {
            None => Ok(()),
            Some(err) => {
                let at = err.instance_path().to_string();
                let at = if at.is_empty() { "/".to_owned() } else { at };
                Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_request",
                    format!(
                        "request body at '{at}': {err} (see the {name} schema in /openapi.json)"
                    ),
                ))
            }
        }
    }
}

/// A JSON body. Wrong content type → 415, unreadable JSON → 400, JSON the document's schema for
/// `T` refuses or of the wrong shape → 422 naming the field, over the body limit → 413; all as
/// problems.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + utoipa::ToSchema> FromRequest<S> for ApiJson<T> {
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
        let req_schemas = req
            .extensions()
            .get::<std::sync::Arc<BodySchemas>>()
            .cloned();
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
        let schemas = req_schemas.clone();
        let bytes = read.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::body_too_large(deadline.map_or(0, |d| d.limit_bytes))
            } else {
                ApiError::new(StatusCode::BAD_REQUEST, "unreadable_body", e.body_text())
            }
        })?;
        let mut value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                format!("request body is not valid JSON: {e}"),
            )
        })?;
        if let Some(schemas) = &schemas {
            schemas.check(&T::name(), &value)?;
        }
        toolexec_core::json::integral_floats_as_integers(&mut value);
        serde_path_to_error::deserialize::<_, T>(value)
            .map(ApiJson)
            .map_err(|err| {
                let path = err.path().to_string();
                let inner = err.into_inner();
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_request",
                    if path == "." {
                        format!("request body: {inner}")
                    } else {
                        format!("request body at '{path}': {inner}")
                    },
                )
            })
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
