//! The one error type of the API: every failure leaves as `application/problem+json` with a
//! stable `code`. Internals of 5xx errors (store and database messages above all) are logged
//! here, once, and never shown to the client: a 5xx detail is a generic sentence plus the
//! request id that finds the cause in the log.
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use toolexec_core::ProblemCode;
use toolexec_engine::EngineError;
use utoipa::ToSchema;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// RFC 9457 problem details, with a stable machine-readable `code`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Problem {
    /// A URI naming the problem type (`urn:toolexec:problem:<code>`).
    #[serde(rename = "type")]
    pub type_: String,
    /// The problem type's fixed title (docs/problems.md).
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Stable code to branch on (docs/problems.md lists them all, with when each happens).
    pub code: ProblemCode,
}

/// An error answered as a problem; its status and title come from its code's row of the table
/// ([`ProblemCode`]).
#[derive(Debug)]
pub struct ApiError {
    pub code: ProblemCode,
    pub detail: String,
    /// Seconds, for 429 and 503.
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(code: ProblemCode, detail: impl Into<String>) -> Self {
        Self {
            code,
            detail: detail.into(),
            retry_after: None,
        }
    }

    /// The HTTP status of its code.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    pub fn not_found(what: &str) -> Self {
        Self::new(
            ProblemCode::NotFound,
            format!("{what} not found (or not visible to this API key)"),
        )
    }

    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self {
            retry_after: Some(1),
            ..Self::new(ProblemCode::Unavailable, detail)
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
            ProblemCode::BodyTooLarge,
            format!(
                "request body is larger than the server's limit{limit}; send fewer or smaller calls"
            ),
        )
    }

    pub fn internal() -> Self {
        Self::new(
            ProblemCode::Internal,
            "internal error; the service's log has the cause under this request's id",
        )
    }

    /// The store cannot be reached: nothing was run (or, for a call that ran, the detail of the
    /// engine says so instead).
    pub fn store_unavailable() -> Self {
        Self::unavailable(
            "the store is temporarily unavailable and nothing was done; retry after the Retry-After delay",
        )
    }
}

tokio::task_local! {
    /// The id of the request being served (`x-request-id`), for the detail of a 5xx answer.
    static REQUEST_ID: String;
}

/// Serves `next` with the request's id known to every error built on the way
/// ([`ApiError::into_response`] appends it to 5xx details).
pub async fn with_request_id(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    REQUEST_ID.scope(id, next.run(req)).await
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::NotFound => ApiError::not_found("resource"),
            EngineError::Missing(detail) => ApiError::new(ProblemCode::NotFound, detail),
            EngineError::Conflict { code, detail } => ApiError::new(code, detail),
            EngineError::Invalid { code, detail } => ApiError::new(code, detail),
            EngineError::StillRunning(detail) => ApiError {
                retry_after: Some(5),
                ..ApiError::new(ProblemCode::StillRunning, detail)
            },
            EngineError::Unavailable(detail) => {
                tracing::warn!(%detail, "unavailable");
                ApiError::unavailable(format!("temporarily unavailable: {detail}"))
            }
            EngineError::Store(e @ toolexec_store::StoreError::Unavailable(_)) => {
                tracing::warn!(error = %e, "store unavailable");
                ApiError::store_unavailable()
            }
            EngineError::Store(e) => {
                tracing::error!(error = %e, "store error");
                ApiError::internal()
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut detail = self.detail;
        if status.is_server_error()
            && let Ok(id) = REQUEST_ID.try_with(String::clone)
        {
            detail.push_str(&format!(" (request id {id})"));
        }
        let body = Problem {
            type_: format!("urn:toolexec:problem:{}", self.code),
            title: self.code.title().to_owned(),
            status: status.as_u16(),
            detail,
            code: self.code,
        };
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        let mut resp = (status, bytes).into_response();
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if status == StatusCode::UNAUTHORIZED {
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
