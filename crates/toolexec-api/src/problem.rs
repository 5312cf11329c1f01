//! The one error type of the API: every failure leaves as `application/problem+json` with a
//! stable `code`. Internals of 5xx errors are logged here, once, and never shown to the client.
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use toolexec_engine::EngineError;
use utoipa::ToSchema;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// RFC 9457 problem details, with a stable machine-readable `code`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// A URI naming the problem type (`urn:toolexec:problem:<code>`).
    #[serde(rename = "type")]
    pub type_: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Stable code to branch on: `not_found`, `call_id_reused`, `malformed_json`, …
    pub code: String,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub detail: String,
    /// Seconds, for 429 and 503.
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            code,
            detail: detail.into(),
            retry_after: None,
        }
    }

    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found (or not visible to this API key)"),
        )
    }

    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self {
            retry_after: Some(1),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
        }
    }

    /// 413: the body is (or says it is) over `limit` bytes (0: the limit is not known here).
    pub fn body_too_large(limit: usize) -> Self {
        let limit = if limit > 0 {
            format!(" of {limit} bytes")
        } else {
            String::new()
        };
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!(
                "request body is larger than the server's limit{limit}; send fewer or smaller calls"
            ),
        )
    }

    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; the request id in the x-request-id header identifies it in the logs",
        )
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::NotFound => ApiError::not_found("resource"),
            EngineError::Conflict { code, detail } => {
                ApiError::new(StatusCode::CONFLICT, code, detail)
            }
            EngineError::Invalid { code, detail } => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, detail)
            }
            EngineError::Unavailable(detail) => {
                tracing::warn!(%detail, "unavailable");
                ApiError::unavailable(format!("temporarily unavailable: {detail}"))
            }
            EngineError::Internal(detail) => {
                tracing::error!(%detail, "internal error");
                ApiError::internal()
            }
        }
    }
}

impl From<toolexec_store::StoreError> for ApiError {
    fn from(e: toolexec_store::StoreError) -> Self {
        EngineError::from(e).into()
    }
}

pub fn title_of(status: StatusCode) -> String {
    status.canonical_reason().unwrap_or("Error").to_owned()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Problem {
            type_: format!("urn:toolexec:problem:{}", self.code),
            title: title_of(self.status),
            status: self.status.as_u16(),
            detail: self.detail,
            code: self.code.to_owned(),
        };
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        let mut resp = (self.status, bytes).into_response();
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

/// Maps an engine error, naming the missing resource on 404.
pub fn or_not_found(what: &'static str) -> impl Fn(EngineError) -> ApiError {
    move |e| match e {
        EngineError::NotFound => ApiError::not_found(what),
        other => other.into(),
    }
}
