//! Extractors whose rejections are problem+json: JSON bodies, query strings, path ids.
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;
use toolexec_core::ProblemCode;
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
                    tracing::error!(schema = name, error = %e, "request body schema does not compile");
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
        // The common case first: `is_valid` stops at the first failure and builds no error.
        if v.is_valid(value) {
            return Ok(());
        }
        match v.iter_errors(value).next() {
            None => Ok(()),
            Some(err) => {
                let err = innermost(&err);
                let at = err.instance_path().to_string();
                let at = if at.is_empty() { "/".to_owned() } else { at };
                Err(ApiError::new(
                    ProblemCode::InvalidRequest,
                    format!(
                        "request body at '{at}': {err} (see the {name} schema in /openapi.json)"
                    ),
                ))
            }
        }
    }
}

/// The error to report for a value that matched none of a `oneOf`'s or `anyOf`'s schemas (a
/// batch's item that is a call or an OpenAI item): the error of the schema that got furthest
/// into the value, when one got further than the value itself — the pointer names the field
/// that is wrong (`/calls/0/id`), not only the item.
fn innermost<'e>(err: &'e jsonschema::ValidationError<'e>) -> &'e jsonschema::ValidationError<'e> {
    use jsonschema::error::ValidationErrorKind as Kind;
    let depth =
        |e: &jsonschema::ValidationError<'_>| e.instance_path().as_str().matches('/').count();
    let (Kind::AnyOf { context } | Kind::OneOfNotValid { context }) = err.kind() else {
        return err;
    };
    match context.iter().flatten().max_by_key(|e| depth(e)) {
        Some(best) if depth(best) > depth(err) => innermost(best),
        _ => err,
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
                ProblemCode::UnsupportedMediaType,
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
                            ProblemCode::RequestTimeout,
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
                ApiError::new(ProblemCode::UnreadableBody, e.body_text())
            }
        })?;
        let mut value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::new(
                ProblemCode::MalformedJson,
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
                    ProblemCode::InvalidRequest,
                    if path == "." {
                        format!("request body: {inner}")
                    } else {
                        format!("request body at '{path}': {inner}")
                    },
                )
            })
    }
}

/// A query string, held to the parameters `T` documents: each value is read as its parameter's
/// type (a whole number for `integer`) and checked against its schema (`minimum`, `maximum`,
/// `enum`, `format`); anything else is a 400 `invalid_query` that names the parameter.
/// Parameters the document does not list are refused too.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiQuery<T>(pub T);

/// One documented query parameter, ready to check.
struct QueryParam {
    name: String,
    /// The JSON type its text is read as.
    kind: &'static str,
    validator: jsonschema::Validator,
}

/// The parameters of `T`, compiled once per type.
fn query_params<T: utoipa::IntoParams + 'static>() -> std::sync::Arc<Vec<QueryParam>> {
    use std::any::TypeId;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<TypeId, Arc<Vec<QueryParam>>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(found) = cache
        .lock()
        .ok()
        .and_then(|c| c.get(&TypeId::of::<T>()).cloned())
    {
        return found;
    }
    let params: Vec<QueryParam> = T::into_params(|| None)
        .into_iter()
        .filter_map(|p| {
            let schema = serde_json::to_value(p.schema.as_ref()?).ok()?;
            let types: Vec<String> = match &schema["type"] {
                serde_json::Value::String(t) => vec![t.clone()],
                serde_json::Value::Array(ts) => ts
                    .iter()
                    .filter_map(|t| t.as_str().map(str::to_owned))
                    .collect(),
                _ => Vec::new(),
            };
            let kind = ["integer", "number", "boolean"]
                .into_iter()
                .find(|k| types.iter().any(|t| t == k))
                .unwrap_or("string");
            let validator = jsonschema::options()
                .should_validate_formats(true)
                .build(&schema)
                .ok()?;
            Some(QueryParam {
                name: p.name,
                kind,
                validator,
            })
        })
        .collect();
    let params = Arc::new(params);
    if let Ok(mut c) = cache.lock() {
        c.insert(TypeId::of::<T>(), params.clone());
    }
    params
}

fn invalid_query(detail: String) -> ApiError {
    ApiError::new(ProblemCode::InvalidQuery, detail)
}

impl<S: Send + Sync, T: DeserializeOwned + utoipa::IntoParams + 'static> FromRequestParts<S>
    for ApiQuery<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let q = parts.uri.query().unwrap_or_default();
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(q)
            .map_err(|e| invalid_query(format!("query string: {e}")))?;
        let params = query_params::<T>();
        let mut object = serde_json::Map::new();
        for (name, text) in pairs {
            let Some(param) = params.iter().find(|p| p.name == name) else {
                let known: Vec<&str> = params.iter().map(|p| p.name.as_str()).collect();
                return Err(invalid_query(format!(
                    "unknown query parameter '{name}'; this endpoint takes {}",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                )));
            };
            if object.contains_key(&name) {
                return Err(invalid_query(format!("'{name}' is given more than once")));
            }
            let value = match param.kind {
                "integer" => text
                    .trim()
                    .parse::<i64>()
                    .map(serde_json::Value::from)
                    .or_else(|_| text.trim().parse::<u64>().map(serde_json::Value::from))
                    .map_err(|_| {
                        invalid_query(format!("{name}: expected a whole number, got {text:?}"))
                    })?,
                "number" => text
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map(serde_json::Value::Number)
                    .ok_or_else(|| {
                        invalid_query(format!("{name}: expected a number, got {text:?}"))
                    })?,
                "boolean" => match text.as_str() {
                    "true" => serde_json::Value::Bool(true),
                    "false" => serde_json::Value::Bool(false),
                    _ => {
                        return Err(invalid_query(format!(
                            "{name}: expected true or false, got {text:?}"
                        )));
                    }
                },
                _ => serde_json::Value::String(text),
            };
            if let Some(err) = param.validator.iter_errors(&value).next() {
                return Err(invalid_query(format!("{name}: {err}")));
            }
            object.insert(name, value);
        }
        serde_path_to_error::deserialize::<_, T>(serde_json::Value::Object(object))
            .map(ApiQuery)
            .map_err(|e| {
                let at = e.path().to_string();
                invalid_query(format!("{at}: {}", e.into_inner()))
            })
    }
}

/// Parses an id from the path; anything that is not a UUID names no resource (404).
pub fn parse_id(raw: &str, what: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| ApiError::not_found(what))
}
