//! A session's tools over the Model Context Protocol: `POST /v1/sessions/{id}/mcp`, Streamable
//! HTTP in stateless mode, on the official Rust SDK (`rmcp`): its protocol types, its version
//! negotiation (`initialize` up to 2025-11-25, `server/discover` and per-request `_meta` for
//! 2026-07-28) and its tower service answer the JSON-RPC.
//!
//! What this module owns is the admission and the mapping, nothing of the pipeline: before the
//! SDK sees a request (whose `Host` and `Origin` were checked by [`crate::door`], as on every
//! route), the tenant is authenticated exactly as for the REST API (the same extractor), the
//! session is looked up for that tenant (another tenant's is 404), and the body is read within
//! the API's size and time limits — JSON that is not JSON-RPC gets a JSON-RPC error. Then `tools/list`
//! lists the session's allowed tools and `tools/call` is one call through
//! [`Engine::run_calls`](toolexec_engine::Engine::run_calls) — validated, sandboxed and
//! recorded like `POST /v1/sessions/{id}/calls`. Its call id is the one its
//! `_meta["dev.toolexec/call_id"]` names (an idempotent call), else a new one: a JSON-RPC
//! request id is a correlation id, which every SDK counts from 0 on each connection.
//!
//! Stateless: the session is named in the URL, so no `Mcp-Session-Id` is issued and there is no
//! server-to-client stream: GET and DELETE are 405 (the 2025-11-25 transport lets a server
//! without a GET stream answer so, and 2026-07-28 has neither).
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use rmcp::ErrorData;
use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientJsonRpcMessage, ErrorCode, Implementation,
    JsonRpcError, ListToolsResult, NumberOrString, PaginatedRequestParams, RequestId,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use toolexec_core::{Call, NetworkPolicy, ProblemCode, Session, Tenant};
use toolexec_engine::{CallBatch, RoutedLease, SessionRef};
use tracing::Instrument;

use crate::SharedState;
use crate::auth::AuthTenant;
use crate::dialects::{mcp_result, mcp_tool};
use crate::problem::{ApiError, or_not_found};
use crate::session_path::{Routed, SessionPath};

/// What a request is for, put in its extensions for the SDK's handler.
#[derive(Debug, Clone)]
struct Target {
    tenant: Tenant,
    session: Session,
    /// The lease routing took for the request, if it took one.
    lease: Option<RoutedLease>,
}

/// The route: POST for JSON-RPC; GET and DELETE answered 405 (stateless, see the module doc).
pub(crate) fn router(state: &SharedState) -> Router<SharedState> {
    let engine_state = state.clone();
    let config = StreamableHttpServerConfig::default()
        // 2025-11-25 and older: no `Mcp-Session-Id`, every request served on its own; 2026-07-28
        // requests are served statelessly whatever this says.
        .with_legacy_session_mode(false)
        // One JSON answer per request: the handler sends no notifications before its result.
        .with_json_response(true)
        // Checked on every route before this one, by the door (as problem+json, the API's
        // error shape).
        .disable_allowed_hosts()
        .disable_allowed_origins()
        .with_max_request_body_bytes(state.config.body_limit_bytes);
    let service: StreamableHttpService<ToolexecMcp, NeverSessionManager> =
        StreamableHttpService::new(
            move || {
                Ok(ToolexecMcp {
                    state: engine_state.clone(),
                })
            },
            Arc::new(NeverSessionManager::default()),
            config,
        );
    Router::new().route(
        "/v1/sessions/{id}/mcp",
        post(move |state, req| serve(state, req, service.clone()))
            .get(no_stream)
            .delete(no_stream),
    )
}

/// GET (a server-to-client stream) and DELETE (ending an MCP session): there are none.
async fn no_stream() -> Response {
    let mut resp = ApiError::new(
        ProblemCode::MethodNotAllowed,
        "this MCP endpoint is stateless: it keeps no MCP session and opens no server-to-client stream; send JSON-RPC requests with POST",
    )
    .into_response();
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("POST"));
    resp
}

async fn serve(
    State(state): State<SharedState>,
    req: Request,
    service: StreamableHttpService<ToolexecMcp, NeverSessionManager>,
) -> Response {
    match admit(&state, req).await {
        Ok(req) => service.handle(req).await.map(Body::new),
        Err(resp) => resp,
    }
}

/// Everything the REST API would check, in the order that reveals least (where the request
/// comes from was checked by the door, as on every route): who sends it, whether the session
/// is theirs, then its body.
async fn admit(state: &SharedState, req: Request) -> Result<Request, Response> {
    let (mut parts, body) = req.into_parts();
    let AuthTenant(tenant) = AuthTenant::from_request_parts(&mut parts, state)
        .await
        .map_err(into_response)?;
    let session_id =
        SessionPath::of(&parts).ok_or_else(|| into_response(ApiError::not_found("session")))?;
    let session = state
        .engine
        .session_in_use(tenant.id, session_id)
        .await
        .map_err(or_not_found("session"))
        .map_err(into_response)?;
    let is_json = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !is_json {
        return Err(ApiError::new(
            ProblemCode::UnsupportedMediaType,
            "send the JSON-RPC message with 'Content-Type: application/json'",
        )
        .into_response());
    }
    let bytes = read_body(&parts, body).await.map_err(into_response)?;
    check_json_rpc(&bytes).map_err(|(id, error)| json_rpc_error(id, error))?;
    let lease = Routed::of(&parts);
    parts.extensions.insert(Target {
        tenant,
        session,
        lease,
    });
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

fn into_response(e: ApiError) -> Response {
    e.into_response()
}

/// The body, whole, within the limits the body guard set for this request.
async fn read_body(
    parts: &axum::http::request::Parts,
    body: Body,
) -> Result<bytes::Bytes, ApiError> {
    let deadline = parts
        .extensions
        .get::<crate::limits::BodyDeadline>()
        .copied();
    let limit = deadline.map_or(crate::DEFAULT_BODY_LIMIT_BYTES, |d| d.limit_bytes);
    let read = http_body_util::BodyExt::collect(http_body_util::Limited::new(body, limit));
    let read = match deadline {
        Some(d) => tokio::time::timeout_at(d.at, read).await.map_err(|_| {
            ApiError::new(
                ProblemCode::RequestTimeout,
                format!(
                    "the request body did not arrive within {} s; send the whole body at once",
                    d.within.as_secs_f64()
                ),
            )
        })?,
        None => read.await,
    };
    match read {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::body_too_large(limit))
        }
        Err(e) => Err(ApiError::new(ProblemCode::UnreadableBody, e.to_string())),
    }
}

/// JSON that is not a JSON-RPC message the protocol knows is answered as JSON-RPC says: a
/// parse error (-32700) or an invalid request (-32600), with the request's id if it has one.
fn check_json_rpc(bytes: &[u8]) -> Result<(), (Option<RequestId>, ErrorData)> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        (
            None,
            ErrorData::parse_error(format!("the body is not JSON: {e}"), None),
        )
    })?;
    if value.is_array() {
        return Err((
            None,
            ErrorData::invalid_request(
                "JSON-RPC batches are not part of MCP since 2025-06-18; send one message per request",
                None,
            ),
        ));
    }
    let id = match value.get("id") {
        Some(Value::Number(n)) => n.as_i64().map(NumberOrString::Number),
        Some(Value::String(s)) => Some(NumberOrString::String(s.as_str().into())),
        _ => None,
    };
    serde_json::from_value::<ClientJsonRpcMessage>(value).map_err(|e| {
        (
            id,
            ErrorData::invalid_request(format!("not a JSON-RPC 2.0 MCP message: {e}"), None),
        )
    })?;
    Ok(())
}

fn json_rpc_error(id: Option<RequestId>, error: ErrorData) -> Response {
    let body = serde_json::to_vec(&JsonRpcError::new(id, error)).unwrap_or_default();
    let mut resp = (StatusCode::BAD_REQUEST, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// The SDK's handler: one per request (stateless), the request's [`Target`] in its context.
#[derive(Debug, Clone)]
pub(crate) struct ToolexecMcp {
    state: SharedState,
}

fn target(context: &RequestContext<RoleServer>) -> Result<Target, ErrorData> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<Target>())
        .cloned()
        .ok_or_else(|| ErrorData::internal_error("the request reached no session", None))
}

/// A `tools/call`'s `_meta` key naming the call id to record it under: the client asks for an
/// idempotent call (a retry of the same id returns the recorded result and runs nothing). A
/// reverse-DNS prefix, as the MCP specification recommends for `_meta` keys.
pub const CALL_ID_META: &str = "dev.toolexec/call_id";

/// The key [`CALL_ID_META`] had before it took a reverse-DNS prefix; still accepted.
pub const LEGACY_CALL_ID_META: &str = "toolexec/call_id";

/// The call id a `tools/call` is recorded under: the one its `_meta` names, else a new one.
///
/// The JSON-RPC request id is never a call id: it only correlates a request with its answer
/// within one MCP connection, and every MCP SDK counts it from 0 again on each connection, so
/// two clients (or one that reconnects) send the same ids for different calls.
fn call_id_of(meta: &serde_json::Map<String, Value>) -> Result<String, ErrorData> {
    let named = |key: &str| -> Result<Option<String>, ErrorData> {
        match meta.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(ErrorData::invalid_params(
                format!(
                    "_meta[\"{key}\"] must be a string (the call id to record this call under), not {other}"
                ),
                None,
            )),
        }
    };
    match (named(CALL_ID_META)?, named(LEGACY_CALL_ID_META)?) {
        (Some(a), Some(b)) if a != b => Err(ErrorData::invalid_params(
            format!(
                "_meta names two call ids ({CALL_ID_META:?}: {a:?}, {LEGACY_CALL_ID_META:?}: {b:?}); send one"
            ),
            None,
        )),
        (Some(id), _) | (None, Some(id)) => Ok(id),
        (None, None) => Ok(format!("mcp-{}", uuid::Uuid::now_v7())),
    }
}

/// A JSON-RPC request id as text: a number in decimal, a string as it is.
fn request_id_text(id: &RequestId) -> String {
    match id {
        NumberOrString::Number(n) => n.to_string(),
        NumberOrString::String(s) => s.to_string(),
    }
}

/// A problem the REST API would answer with, as a JSON-RPC error: the client's (4xx) as an
/// invalid request, the service's (5xx) as an internal error, its stable code in `data`.
fn protocol_error(e: ApiError) -> ErrorData {
    let mut data = json!({"code": e.code.as_str(), "status": e.code.status()});
    if let Some(secs) = e.retry_after {
        data["retry_after"] = json!(secs);
    }
    let code = if e.code.status() >= 500 {
        ErrorCode::INTERNAL_ERROR
    } else {
        ErrorCode::INVALID_REQUEST
    };
    ErrorData::new(code, e.detail, Some(data))
}

impl ServerHandler for ToolexecMcp {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = Implementation::new("toolexec", env!("CARGO_PKG_VERSION"));
        info.with_instructions(
                "The tools of one toolexec session. Every tools/call is validated against the tool's schema, runs against the session's sandboxed workspace and is recorded in the session's log as a new call (the JSON-RPC request id only pairs a request with its answer; ids may repeat across connections). To make a call idempotent, name it: `_meta: {\"dev.toolexec/call_id\": \"<id unique in the session>\"}`; sending that id again returns the recorded result and runs nothing, and with other arguments it is refused. The result's `_meta[\"toolexec/call_id\"]` is the id it was recorded under.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let Target { session, .. } = target(&context)?;
        let engine = &self.state.engine;
        let network = session.policy.network == NetworkPolicy::Allow;
        let tools = engine
            .registry()
            .specs()
            .filter(|s| {
                session
                    .tools
                    .as_ref()
                    .is_none_or(|allowed| allowed.contains(&s.name))
            })
            // A tool handed to a model is one it may call, not one that can only fail.
            .filter(|s| engine.unavailable(&s.name).is_none())
            .map(|s| mcp_tool(s, network))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.state
            .engine
            .registry()
            .get(name)
            .map(|t| mcp_tool(t.spec(), false))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Target {
            tenant,
            session,
            lease,
        } = target(&context)?;
        let call_id = call_id_of(&(context.meta.0).0)?;
        // The request id pairs this request with its answer only; it is kept on the span (logs,
        // traces) beside the call id the call is recorded under.
        let span = tracing::info_span!(
            "mcp.tools_call",
            jsonrpc.id = %request_id_text(&context.id),
            call.id = %call_id,
        );
        let call = Call {
            id: call_id.clone(),
            name: request.name.into_owned(),
            arguments: Value::Object(request.arguments.unwrap_or_default()),
        };
        let engine = &self.state.engine;
        // One call: the batch limit cannot refuse it; its id and name are checked here.
        let mut results = async {
            let batch = CallBatch::new(vec![call], usize::MAX)?;
            let session = SessionRef::new(tenant.id, session.id).with_lease(lease);
            engine.run_calls(session, batch).await
        }
        .instrument(span.clone())
        .await
        .map_err(|e| {
            // The call id, so that a client told to retry (`still_running`, `unavailable`)
            // can name the same call in `_meta` and get its result instead of a new run.
            let mut error = protocol_error(or_not_found("session")(e));
            if let Some(Value::Object(data)) = error.data.as_mut() {
                data.insert("call_id".into(), json!(call_id));
            }
            error
        })?;
        let result = results
            .pop()
            .ok_or_else(|| ErrorData::internal_error("the call returned no result", None))?;
        // A call that waits for a person's approval: an MCP client has no way to come back for
        // the result, so the request waits for the decision (and the run), as long as a batch
        // may take; still undecided then, it is answered with the pending text.
        let wait =
            std::time::Duration::from_millis(self.state.engine.config().limits.request_timeout_ms);
        let result = self
            .state
            .engine
            .after_approval(tenant.id, result, wait)
            .instrument(span)
            .await;
        let mut out = mcp_result(&result);
        if let Some(meta) = out.meta.as_mut() {
            meta.0.insert("toolexec/call_id".into(), json!(call_id));
        }
        Ok(out.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_json_rpc_is_a_json_rpc_error_with_the_id_when_there_is_one() {
        let code = |body: &str| {
            check_json_rpc(body.as_bytes())
                .err()
                .map(|(id, e)| (id, e.code))
        };
        assert_eq!(code("{not json"), Some((None, ErrorCode::PARSE_ERROR)));
        assert_eq!(code("[]"), Some((None, ErrorCode::INVALID_REQUEST)));
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":7}"#),
            Some((Some(NumberOrString::Number(7)), ErrorCode::INVALID_REQUEST))
        );
        assert_eq!(
            code(r#"{"id":"a","method":"tools/list"}"#),
            Some((
                Some(NumberOrString::String("a".into())),
                ErrorCode::INVALID_REQUEST
            ))
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            None
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            None
        );
    }

    fn meta(v: Value) -> serde_json::Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn a_call_without_a_named_id_gets_a_new_one_each_time() {
        let a = call_id_of(&meta(json!({}))).ok();
        let b = call_id_of(&meta(json!({"progressToken": 2}))).ok();
        assert!(a.as_deref().is_some_and(|a| a.starts_with("mcp-")), "{a:?}");
        assert_ne!(a, b);
    }

    #[test]
    fn a_named_call_id_is_taken_under_either_key_and_must_be_one_string() {
        for key in [CALL_ID_META, LEGACY_CALL_ID_META] {
            let got = call_id_of(&meta(json!({key: "toolu_01"}))).ok();
            assert_eq!(got.as_deref(), Some("toolu_01"), "{key}");
        }
        let both = json!({CALL_ID_META: "a", LEGACY_CALL_ID_META: "a"});
        assert_eq!(call_id_of(&meta(both)).ok().as_deref(), Some("a"));
        for bad in [
            json!({CALL_ID_META: 7}),
            json!({LEGACY_CALL_ID_META: ["a"]}),
            json!({CALL_ID_META: "a", LEGACY_CALL_ID_META: "b"}),
        ] {
            let e = call_id_of(&meta(bad.clone())).err();
            assert_eq!(e.map(|e| e.code), Some(ErrorCode::INVALID_PARAMS), "{bad}");
        }
    }
}
