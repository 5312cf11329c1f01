//! The SWE-ReX remote API under a session: `…/v1/sessions/{id}/swerex/{endpoint}`, what the
//! official `swe-rex` client (`RemoteRuntime(host="http://…/v1/sessions/{id}/swerex",
//! auth_token=KEY)`) drives, unchanged (docs/swerex.md).
//!
//! Like [`crate::mcp`], this module owns the admission and the mapping, nothing of the pipeline:
//! every request is one or more calls of the session's own tools (`exec_command`/`write_stdin`
//! for bash sessions, `shell` for `execute` and `read_file`, `write_file`), run through
//! [`Engine::run_calls`](toolexec_engine::Engine::run_calls) — validated, sandboxed and
//! recorded like `POST /v1/sessions/{id}/calls`, visible in the session's log and re-run by a
//! verify replay. An upload goes through the archive import (`PUT …/archive`), its checks and
//! its record.
//!
//! - **Auth**: the client's `X-API-Key` is the service's API key (the same as a bearer token),
//!   accepted on this prefix only; a session of another tenant is 404.
//! - **Errors** travel as swerex-remote sends them: status 511 with `{"swerexception":
//!   {message, class_path, traceback, extra_info}}`, so that the client raises the same
//!   exception class; `traceback` is always empty (it would show the service's internals).
//!   Every other error is `{"detail": …}` with its HTTP status, as FastAPI answers.
//! - **X-Request-ID** (idempotency): the calls of a request are recorded under call ids made of
//!   it (`swerex-{id}-{n}`), so a request sent again with the same id is answered from the
//!   record — none of its calls runs twice — for as long as the session's log keeps it.
//!   Without the header, each request is new.
use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use toolexec_core::{Call, CallStatus, Invocation, Session, Tenant};
use toolexec_engine::{CallBatch, RoutedLease, SessionRef};

use crate::SharedState;
use crate::auth::AuthTenant;
use crate::problem::{ApiError, or_not_found};
use crate::session_path::{Routed, SessionPath};

mod bash;
mod files;
mod frame;
mod multipart;
pub(crate) mod names;
mod upload;

/// The most a command may run when the client sets no timeout (`timeout: null`, which
/// swerex-remote takes as "no limit"), and the cap of any timeout: below the 300 s after which
/// the client (aiohttp's default) gives up on a request.
pub const MAX_TIMEOUT_SECS: f64 = 240.0;

/// Where the sandbox's workspace is, as its commands see it: the only root this API's paths
/// may name (the jail of `read_file`/`write_file`; the sandbox's home is the workspace too).
pub const WORKSPACE: &str = "/workspace";

/// Longest `X-Request-ID` taken as an idempotency key (longer: refused).
const MAX_REQUEST_ID_CHARS: usize = 128;

/// Most calls one request makes (an interrupt's retries are the most).
const MAX_STEPS: usize = 32;

pub(crate) fn router() -> Router<SharedState> {
    let base = "/v1/sessions/{id}/swerex";
    Router::new()
        .route(&format!("{base}/"), get(root))
        .route(&format!("{base}/is_alive"), get(is_alive))
        .route(
            &format!("{base}/create_session"),
            post(bash::create_session),
        )
        .route(
            &format!("{base}/run_in_session"),
            post(bash::run_in_session),
        )
        .route(&format!("{base}/close_session"), post(bash::close_session))
        .route(&format!("{base}/close"), post(bash::close))
        .route(&format!("{base}/execute"), post(files::execute))
        .route(&format!("{base}/read_file"), post(files::read_file))
        .route(&format!("{base}/write_file"), post(files::write_file))
        .route(&format!("{base}/upload"), post(upload::upload))
}

/// Whether a path is under this API's prefix (its requests may authenticate with `X-API-Key`).
pub fn is_swerex_path(path: &str) -> bool {
    path.strip_prefix("/v1/sessions/")
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(_, rest)| rest == "swerex" || rest.starts_with("swerex/"))
}

/// The exception classes this API raises in the client, by their import path.
pub(crate) mod class {
    pub const NON_ZERO_EXIT: &str = "swerex.exceptions.NonZeroExitCodeError";
    pub const TIMEOUT: &str = "swerex.exceptions.CommandTimeoutError";
    pub const NO_EXIT_CODE: &str = "swerex.exceptions.NoExitCodeError";
    pub const SESSION_MISSING: &str = "swerex.exceptions.SessionDoesNotExistError";
    pub const SESSION_EXISTS: &str = "swerex.exceptions.SessionExistsError";
    pub const SYNTAX: &str = "swerex.exceptions.BashIncorrectSyntaxError";
    pub const NOT_FOUND: &str = "builtins.FileNotFoundError";
    pub const PERMISSION: &str = "builtins.PermissionError";
    pub const IS_A_DIRECTORY: &str = "builtins.IsADirectoryError";
    pub const OS_ERROR: &str = "builtins.OSError";
    pub const VALUE: &str = "builtins.ValueError";
    pub const RUNTIME: &str = "builtins.RuntimeError";
}

/// How a request fails, in the shapes the client knows.
#[derive(Debug)]
pub(crate) enum Failure {
    /// Re-raised by the client as `class_path(message)`, with `extra_info` set on it.
    Exception {
        class_path: &'static str,
        message: String,
        extra_info: Value,
    },
    /// `{"detail": …}` with this status.
    Http { status: StatusCode, detail: String },
}

impl Failure {
    pub(crate) fn exception(class_path: &'static str, message: impl Into<String>) -> Self {
        Self::Exception {
            class_path,
            message: message.into(),
            extra_info: json!({}),
        }
    }

    pub(crate) fn http(status: StatusCode, detail: impl Into<String>) -> Self {
        Self::Http {
            status,
            detail: detail.into(),
        }
    }

    fn unprocessable(detail: impl Into<String>) -> Self {
        Self::http(StatusCode::UNPROCESSABLE_ENTITY, detail)
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        // An internal error's detail is never shown (the cause goes to the log), as the REST
        // API's; a 503's says when to retry, and is kept.
        let status = e.status();
        let detail = if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(code = e.code.as_str(), detail = %e.detail, "a SWE-ReX request failed");
            "the service could not answer this request; the cause is in its log".to_owned()
        } else {
            e.detail
        };
        Self::Http { status, detail }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let (status, body) = match self {
            Failure::Exception {
                class_path,
                message,
                extra_info,
            } => (
                // 511, as swerex-remote answers a runtime exception.
                StatusCode::NETWORK_AUTHENTICATION_REQUIRED,
                json!({"swerexception": {
                    "message": message,
                    "class_path": class_path,
                    "traceback": "",
                    "extra_info": extra_info,
                }}),
            ),
            Failure::Http { status, detail } => (status, json!({"detail": detail})),
        };
        json_response(status, &body)
    }
}

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut resp = (status, body.to_string()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

pub(crate) fn ok(body: Value) -> Response {
    json_response(StatusCode::OK, &body)
}

/// A request admitted to a session: who, which session, and the record of its calls.
pub(crate) struct Ctx {
    pub state: SharedState,
    pub tenant: Tenant,
    pub session: Session,
    /// The lease routing took for the request, if it took one (its first call uses it).
    lease: Option<RoutedLease>,
    /// The request's key: its `X-Request-ID`, or a fresh id.
    pub key: String,
    /// Whether the client named the request (`X-Request-ID`): it may be sent again.
    pub named: bool,
    step: usize,
    /// Once the request is found in the record: its calls there, by call id.
    recorded: Option<std::collections::HashMap<String, Invocation>>,
}

/// A call's result as a request step reads it: the status and the whole output.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub status: CallStatus,
    pub text: String,
}

impl Ctx {
    /// The id the request's `n`th call is recorded under.
    fn call_id(&self, n: usize) -> String {
        format!("swerex-{}-{n}", self.key)
    }

    /// A token unique to this request (the same each time a named request is sent): the
    /// markers of its commands.
    pub fn nonce(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.session.id.as_bytes());
        h.update(self.key.as_bytes());
        hex::encode(&h.finalize()[..12])
    }

    /// Whether this request is one the record has (sent before with the same id): its live
    /// checks are then skipped and its calls answered from the record.
    pub async fn replaying(&mut self) -> Result<bool, Failure> {
        if !self.named {
            return Ok(false);
        }
        if self.recorded.is_none() {
            let ids: Vec<String> = (0..MAX_STEPS).map(|n| self.call_id(n)).collect();
            let (_, found) = self
                .state
                .engine
                .store()
                .lookup_calls(self.tenant.id, self.session.id, &ids)
                .await
                .map_err(|e| {
                    Failure::from(ApiError::from(toolexec_engine::EngineError::from(e)))
                })?;
            self.recorded = Some(
                found
                    .into_iter()
                    .map(|inv| (inv.call_id.clone(), inv))
                    .collect(),
            );
        }
        Ok(self.recorded.as_ref().is_some_and(|r| !r.is_empty()))
    }

    /// The arguments the record has for this request's `n`th call, if it was recorded.
    pub fn recorded_arguments(&self, n: usize) -> Option<&Value> {
        self.recorded
            .as_ref()?
            .get(&self.call_id(n))
            .map(|inv| &inv.arguments)
    }

    /// Runs the request's next call (or, for a request sent again, takes its recorded result:
    /// the engine answers a recorded call id from the record), and its whole output.
    pub async fn call(&mut self, name: &str, arguments: Value) -> Result<Outcome, Failure> {
        if self.step >= MAX_STEPS {
            return Err(Failure::http(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the request needed more calls than one request may make",
            ));
        }
        let id = self.call_id(self.step);
        self.step += 1;
        // A request sent again runs its calls with the arguments recorded for them (the same,
        // unless the live state they were made from changed meanwhile).
        let arguments = self
            .recorded
            .as_ref()
            .and_then(|r| r.get(&id))
            .map(|inv| inv.arguments.clone())
            .unwrap_or(arguments);
        let call = Call {
            id,
            name: name.to_owned(),
            arguments,
        };
        let engine = &self.state.engine;
        // Our own call id, one call: the envelope cannot refuse it.
        let batch =
            CallBatch::new(vec![call], usize::MAX).map_err(|e| Failure::from(ApiError::from(e)))?;
        let session =
            SessionRef::new(self.tenant.id, self.session.id).with_lease(self.lease.clone());
        let mut results = engine
            .run_calls(session, batch)
            .await
            .map_err(|e| Failure::from(or_not_found("session")(e)))?;
        let result = results.pop().ok_or_else(|| {
            Failure::http(StatusCode::INTERNAL_SERVER_ERROR, "a call gave no result")
        })?;
        // A call the session's policy makes wait for a person: the request waits for the
        // decision, as an MCP call does.
        let wait = std::time::Duration::from_millis(engine.config().limits.request_timeout_ms);
        let result = engine.after_approval(self.tenant.id, result, wait).await;
        if result.status == CallStatus::PendingApproval {
            return Err(Failure::http(
                StatusCode::SERVICE_UNAVAILABLE,
                "the call waits for a person's approval (the session's policy.approval); send the request again with the same X-Request-ID once it is decided",
            ));
        }
        let text = if result.truncated.is_some() {
            engine
                .streams()
                .invocation_output(self.tenant.id, result.invocation_id, None, Some(usize::MAX))
                .await
                .map(|s| s.content)
                .map_err(|e| Failure::from(ApiError::from(e)))?
        } else {
            result.content
        };
        Ok(Outcome {
            status: result.status,
            text,
        })
    }
}

/// Everything the REST API would check, in the order that reveals least: who sends it, whether
/// the session is theirs; then the request's key. Failures in the client's shapes: no key is
/// 401 "Not authenticated", a wrong one 401 "Invalid API Key" (swerex-remote's words).
pub(crate) async fn admit(state: &SharedState, req: Request) -> Result<(Ctx, Body), Failure> {
    let (mut parts, body) = req.into_parts();
    let tenant = authenticate(state, &mut parts).await?;
    let session_id = SessionPath::of(&parts)
        .ok_or_else(|| Failure::from(crate::problem::ApiError::not_found("session")))?;
    let session = state
        .engine
        .session_in_use(tenant.id, session_id)
        .await
        .map_err(|e| Failure::from(or_not_found("session")(e)))?;
    let (key, named) = request_key(&parts.headers)?;
    Ok((
        Ctx {
            state: state.clone(),
            tenant,
            session,
            lease: Routed::of(&parts),
            key,
            named,
            step: 0,
            recorded: None,
        },
        body,
    ))
}

async fn authenticate(
    state: &SharedState,
    parts: &mut axum::http::request::Parts,
) -> Result<Tenant, Failure> {
    let has_key = parts.headers.contains_key("x-api-key")
        || parts.headers.contains_key(header::AUTHORIZATION);
    match AuthTenant::from_request_parts(parts, state).await {
        Ok(AuthTenant(t)) => Ok(t),
        Err(e) if e.status() == StatusCode::UNAUTHORIZED => Err(Failure::http(
            StatusCode::UNAUTHORIZED,
            if has_key {
                "Invalid API Key"
            } else {
                "Not authenticated"
            },
        )),
        Err(e) => Err(Failure::from(e)),
    }
}

fn request_key(headers: &HeaderMap) -> Result<(String, bool), Failure> {
    match headers.get("x-request-id") {
        None => Ok((uuid::Uuid::now_v7().simple().to_string(), false)),
        Some(v) => {
            let v = v
                .to_str()
                .ok()
                .map(str::trim)
                .filter(|v| {
                    !v.is_empty()
                        && v.chars().count() <= MAX_REQUEST_ID_CHARS
                        && v.chars().all(|c| c.is_ascii_graphic())
                })
                .ok_or_else(|| {
                    Failure::http(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "X-Request-ID must be 1 to {MAX_REQUEST_ID_CHARS} printable ASCII characters"
                        ),
                    )
                })?;
            Ok((v.to_owned(), true))
        }
    }
}

/// The request's JSON body as `T`; a body that is not one is 422, as FastAPI answers.
pub(crate) async fn json_body<T: DeserializeOwned>(
    state: &SharedState,
    body: Body,
) -> Result<T, Failure> {
    let bytes = axum::body::to_bytes(body, state.config.body_limit_bytes)
        .await
        .map_err(|_| {
            Failure::http(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body could not be read within the size limit",
            )
        })?;
    let de = &mut serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        Failure::unprocessable(format!("body/{path}: {}", e.inner()))
    })
}

/// A path the client names, as the workspace-relative path the tools take; anything outside
/// the workspace is `PermissionError`, naming what is allowed.
pub(crate) fn workspace_path(path: &str) -> Result<String, Failure> {
    let refuse = || {
        Failure::exception(
            class::PERMISSION,
            format!(
                "[Errno 13] Permission denied: {}: this runtime is a toolexec session; paths must be absolute and under {WORKSPACE} (the sandbox's workspace, also its home), the only root it maps",
                py_repr(path)
            ),
        )
    };
    let rest = path.strip_prefix(WORKSPACE).ok_or_else(refuse)?;
    if !(rest.is_empty() || rest.starts_with('/')) {
        return Err(refuse());
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop().ok_or_else(refuse)?;
            }
            p => parts.push(p),
        }
    }
    Ok(parts.join("/"))
}

/// `s` as Python's `repr` of a str shows it (the client's messages quote commands so).
pub(crate) fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// A timeout the client gives, in seconds, within the cap; `None` is the cap.
pub(crate) fn timeout_ms(timeout: Option<f64>) -> u64 {
    let secs = match timeout {
        Some(t) if t.is_finite() && t > 0.0 => t.min(MAX_TIMEOUT_SECS),
        _ => MAX_TIMEOUT_SECS,
    };
    (secs * 1000.0).ceil() as u64
}

/// `GET /` of swerex-remote.
async fn root(State(state): State<SharedState>, req: Request) -> Response {
    match admit(&state, req).await {
        Ok(_) => ok(json!({"message": "hello world"})),
        Err(f) => f.into_response(),
    }
}

/// `GET is_alive`: the session is this tenant's and open.
async fn is_alive(State(state): State<SharedState>, req: Request) -> Response {
    match admit(&state, req).await {
        Ok((ctx, _)) if ctx.session.status == toolexec_core::SessionStatus::Active => {
            ok(json!({"is_alive": true, "message": ""}))
        }
        Ok((ctx, _)) => ok(json!({
            "is_alive": false,
            "message": format!("session {} is closed", ctx.session.id),
        })),
        Err(f) => f.into_response(),
    }
}

/// Runs a handler body against an admitted request.
pub(crate) async fn handle<F, Fut>(state: SharedState, req: Request, f: F) -> Response
where
    F: FnOnce(Ctx, Body) -> Fut,
    Fut: std::future::Future<Output = Result<Value, Failure>>,
{
    let (ctx, body) = match admit(&state, req).await {
        Ok(x) => x,
        Err(f) => return f.into_response(),
    };
    match f(ctx, body).await {
        Ok(v) => ok(v),
        Err(f) => f.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_into_the_workspace_or_are_refused() {
        assert_eq!(workspace_path("/workspace").ok().as_deref(), Some(""));
        assert_eq!(
            workspace_path("/workspace/a/./b/../c").ok().as_deref(),
            Some("a/c")
        );
        for bad in [
            "/etc/passwd",
            "/workspace/../etc",
            "relative",
            "/workspaces/x",
            "/",
        ] {
            match workspace_path(bad) {
                Err(Failure::Exception {
                    class_path,
                    message,
                    ..
                }) => {
                    assert_eq!(class_path, class::PERMISSION, "{bad}");
                    assert!(message.contains(WORKSPACE), "{message}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn reprs_are_pythons() {
        assert_eq!(py_repr("ls -la"), "'ls -la'");
        assert_eq!(py_repr("echo 'a'"), "\"echo 'a'\"");
        assert_eq!(py_repr("a\nb\\"), "'a\\nb\\\\'");
    }

    #[test]
    fn the_prefix_is_recognised() {
        assert!(is_swerex_path("/v1/sessions/abc/swerex/is_alive"));
        assert!(!is_swerex_path("/v1/sessions/abc/calls"));
        assert!(!is_swerex_path("/v1/sessions/abc/swerexx/a"));
    }

    #[test]
    fn timeouts_are_capped() {
        assert_eq!(timeout_ms(None), 240_000);
        assert_eq!(timeout_ms(Some(0.5)), 500);
        assert_eq!(timeout_ms(Some(1e9)), 240_000);
    }
}
