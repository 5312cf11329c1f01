//! Proxy tools for an operator's upstream MCP server (`[[tools.mcp]]`): the upstream's tools,
//! listed at start-up, exposed as `<server>__<tool>` and forwarded with the official SDK's
//! client over Streamable HTTP.
//!
//! **At start-up** ([`load`]) the server's URL must pass the network policy (as an OpenAPI
//! tool's `base_url`: the public internet, `sandbox.egress_allow_cidrs` and the entry's own
//! `allow_cidrs`), and the server must answer `tools/list`: an upstream that is down stops the
//! start with that reason (a catalog that changes with an upstream's mood would hand models
//! tools that vanish). Each tool's input schema is the upstream's, converted into toolexec's
//! form as an OpenAPI operation's is (closed objects, optional properties nullable): a tool
//! whose schema cannot be typed for the providers' strict modes is left out with a warning, or
//! stops the start when the entry's `tools` allow-list names it — as is one whose name is too
//! long, whose schema is too large or expands too far, or whose converted schema does not
//! compile; the listing itself is bounded in pages, tools and time. Names are sanitized to
//! `[a-zA-Z0-9_-]`; a collision stops the start.
//!
//! **At call time** each call opens its own MCP connection (initialize, `tools/call`, close) on
//! a reqwest client with the network policy's checked resolver, no proxy and no redirect,
//! within the entry's timeout (the close, after the result is taken, runs in the background):
//! an upstream that is down or slow fails that call only, with an error result that says so.
//! A tool the upstream does not mark read-only is a change: [`crate::Deadline::commit_change`]
//! is called before its `tools/call` goes out, so a cancel or a deadline after that waits for
//! its result instead of recording that nothing was changed. The result's text blocks are joined; `isError` makes the call an
//! error; `structuredContent` is shown when no text came with it, and kept whole in the record
//! (the upstream's `CallToolResult` is the recorded `web.exchange` of role `mcp`, which a
//! verify replay serves instead of calling the upstream again). The bearer token is sent as
//! `Authorization: Bearer …` only, and masked in what the upstream sends back.
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolexec_core::{
    Capability, ExchangeErrorKind, ExchangeRole, OutputLimit, ToolSpec, TruncationMode,
};
use toolexec_net::NetPolicy;
use url::Url;

use super::http::{
    LoadNet, Secret, bearer_token, check_endpoint, check_prefix, endpoint_policy, scrubbed,
    tool_name,
};
use crate::observe::{Answer, Observed, Unserved};
use crate::schema::import::{typed_input_schema, without_absent};
use crate::web::checked_client;
use crate::{Tool, ToolContext, ToolOutput};

/// Default of `timeout_ms`: connecting, initializing and one tool call.
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// How long the start-up listing may take.
const LIST_TIMEOUT: Duration = Duration::from_secs(15);
/// Most bytes of one upstream answer (a JSON response or an SSE event): a result a model reads
/// is far smaller; an upstream that sends more is cut off by the SDK, not buffered.
pub const MAX_RESULT_BYTES: usize = 4 * 1024 * 1024;
/// Most pages of `tools/list` read at start-up (an upstream whose cursor never ends is cut).
const MAX_LIST_PAGES: usize = 20;
/// Most upstream tools read at start-up.
const MAX_TOOLS: usize = 1_000;
/// Largest input schema of an upstream tool, bytes of JSON: a tool whose schema is larger is
/// left out.
const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Longest description a proxied tool gets from the upstream, characters.
const MAX_DESCRIPTION_CHARS: usize = 2_000;

/// One upstream MCP server (`[[tools.mcp]]`).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolsConfig {
    /// The server's name: the prefix of its tools' names (`<name>__<tool>`).
    pub name: String,
    /// Its Streamable HTTP endpoint (`https://mcp.example/mcp`).
    pub url: String,
    /// Bearer token sent as `Authorization: Bearer …`; never logged, shown or recorded.
    #[serde(default)]
    pub bearer_token: Option<String>,
    /// The name of an environment variable of the service holding the bearer token.
    #[serde(default)]
    pub bearer_token_env: Option<String>,
    /// The upstream tools exposed (their upstream names); unset: all of them.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Non-public networks (CIDRs) the server may be reached on, besides
    /// `sandbox.egress_allow_cidrs`.
    #[serde(default)]
    pub allow_cidrs: Vec<String>,
    /// Time limit of one call (connect, initialize, call), milliseconds; default 60 s.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

impl std::fmt::Debug for McpToolsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpToolsConfig")
            .field("name", &self.name)
            .field("url", &crate::web::redacted_url(&self.url))
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "***"))
            .field("bearer_token_env", &self.bearer_token_env)
            .field("tools", &self.tools)
            .field("allow_cidrs", &self.allow_cidrs)
            .field("timeout_ms", &self.timeout_ms)
            .finish()
    }
}

/// What the tools of one server share.
struct Upstream {
    name: String,
    url: Url,
    policy: NetPolicy,
    token: Option<Secret>,
    timeout: Duration,
}

/// One upstream tool, proxied.
pub struct McpProxyTool {
    spec: ToolSpec,
    upstream: Arc<Upstream>,
    /// Its name upstream.
    remote: String,
}

/// A connection to the upstream on a checked client (one per call).
async fn connect(
    upstream: &Upstream,
    resolver: Arc<dyn toolexec_net::Resolver>,
    timeout: Duration,
) -> Result<Client, String> {
    let client = checked_client(
        &upstream.policy,
        resolver,
        timeout,
        concat!("toolexec/", env!("CARGO_PKG_VERSION"), " (mcp proxy)"),
    )
    .map_err(|e| e.to_string())?;
    let mut config = StreamableHttpClientTransportConfig::with_uri(upstream.url.as_str())
        .max_json_response_size(MAX_RESULT_BYTES)
        .max_sse_event_size(MAX_RESULT_BYTES);
    if let Some(token) = &upstream.token {
        config = config.auth_header(token.expose());
    }
    let transport = StreamableHttpClientTransport::with_client(client, config);
    ().serve(transport)
        .await
        .map_err(|e| without_secret(&e.to_string(), upstream.token.as_ref()))
}

/// The upstream's tools, page by page: at most [`MAX_LIST_PAGES`] pages and [`MAX_TOOLS`]
/// tools (an upstream that lists more has the rest left out, with a warning). The connection
/// is left in `session` for the caller to close.
async fn list_tools(
    upstream: &Upstream,
    resolver: Arc<dyn toolexec_net::Resolver>,
    session: &mut Option<Client>,
    at: &str,
) -> Result<Vec<rmcp::model::Tool>, String> {
    let client = session.insert(connect(upstream, resolver, LIST_TIMEOUT).await?);
    let mut tools = Vec::new();
    let mut cursor = None;
    for page in 0.. {
        if page == MAX_LIST_PAGES {
            tracing::warn!(entry = %at, pages = MAX_LIST_PAGES, "the MCP server lists its tools on more pages than are read; the rest are left out");
            break;
        }
        let listed = client
            .list_tools(Some(
                rmcp::model::PaginatedRequestParams::default().with_cursor(cursor),
            ))
            .await
            .map_err(|e| {
                without_secret(&format!("tools/list failed: {e}"), upstream.token.as_ref())
            })?;
        tools.extend(listed.tools);
        if tools.len() > MAX_TOOLS {
            tools.truncate(MAX_TOOLS);
            tracing::warn!(entry = %at, tools = MAX_TOOLS, "the MCP server lists more tools than are read; the rest are left out");
            break;
        }
        cursor = listed.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    Ok(tools)
}

/// An upstream result as recorded, the token masked in every string it holds (keys too) as
/// the strings are, before they are escaped as JSON (a token with a `"` or a `\` would not be
/// found in the JSON text), and then in the JSON text (a token that is all digits).
fn scrubbed_result(result: &CallToolResult, token: Option<&Secret>) -> Bytes {
    fn mask(value: &mut Value, token: &Secret) {
        let clean = |s: &str| without_secret(s, Some(token));
        match value {
            Value::String(s) => *s = clean(s),
            Value::Array(items) => items.iter_mut().for_each(|v| mask(v, token)),
            Value::Object(map) => {
                *map = std::mem::take(map)
                    .into_iter()
                    .map(|(k, mut v)| {
                        mask(&mut v, token);
                        (clean(&k), v)
                    })
                    .collect();
            }
            _ => {}
        }
    }
    let mut value = serde_json::to_value(result).unwrap_or_default();
    if let Some(token) = token {
        mask(&mut value, token);
    }
    scrubbed(
        Bytes::from(serde_json::to_vec(&value).unwrap_or_default()),
        token,
    )
}

/// An error's text with the token masked (an SDK error could quote a header).
fn without_secret(text: &str, token: Option<&Secret>) -> String {
    String::from_utf8_lossy(&scrubbed(Bytes::copy_from_slice(text.as_bytes()), token)).into_owned()
}

/// The tools of one upstream server, checked (see the module docs). `taken` holds the names in
/// use; this server's are added to it.
pub async fn load(
    config: &McpToolsConfig,
    taken: &mut BTreeSet<String>,
    net: &LoadNet,
) -> Result<Vec<Arc<dyn Tool>>, String> {
    let at = format!("tools.mcp {:?}", config.name);
    check_prefix(&config.name, &at)?;
    let token = bearer_token(
        config.bearer_token.as_deref(),
        config.bearer_token_env.as_deref(),
        &at,
    )?;
    let policy = endpoint_policy(net, &config.allow_cidrs, &at)?;
    let url = check_endpoint(
        &policy,
        net.resolver.as_ref(),
        &config.url,
        &format!("{at}: url"),
    )
    .await?;
    let upstream = Arc::new(Upstream {
        name: config.name.clone(),
        url,
        policy,
        token,
        timeout: Duration::from_millis(config.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS).max(1)),
    });
    let shown = crate::web::redacted_url(&config.url);
    let mut session = None;
    let listed = tokio::time::timeout(
        LIST_TIMEOUT,
        list_tools(&upstream, net.resolver.clone(), &mut session, &at),
    )
    .await;
    if let Some(client) = session.take() {
        close(client);
    }
    let listed = listed
    .map_err(|_| format!("{at}: the MCP server at {shown} did not list its tools within {} s", LIST_TIMEOUT.as_secs()))?
    .map_err(|e| format!("{at}: the MCP server at {shown} could not be asked for its tools ({e}); it must be up when the service starts"))?;
    if let Some(wanted) = &config.tools {
        for w in wanted {
            if !listed.iter().any(|t| t.name == w.as_str()) {
                return Err(format!(
                    "{at}: tools names {w:?}, which the server does not list"
                ));
            }
        }
    }
    let mut out: Vec<Arc<dyn Tool>> = Vec::new();
    for tool in &listed {
        let remote = tool.name.to_string();
        let named = config.tools.as_ref().map(|w| w.contains(&remote));
        if named == Some(false) {
            continue;
        }
        // The upstream's name as logs and errors show it (a hostile one can be long).
        let shown_name: String = remote.chars().take(80).collect();
        let at = format!("{at} tool {shown_name:?}");
        let (name, schema) = match admitted(&config.name, &remote, tool) {
            Ok(admitted) => admitted,
            // Not named by the operator: left out, and the service starts without it.
            Err(why) if named.is_none() => {
                tracing::warn!(entry = %at, reason = %why, "an upstream MCP tool is left out: it cannot be offered to models as it is");
                continue;
            }
            Err(why) => return Err(format!("{at}: {why}")),
        };
        if !taken.insert(name.clone()) {
            return Err(format!(
                "{at}: its tool name {name:?} is already taken (a built-in, another entry or another tool whose name sanitizes to the same)"
            ));
        }
        let read_only = tool
            .annotations
            .as_ref()
            .and_then(|a| a.read_only_hint)
            .unwrap_or(false);
        let mut description = tool
            .description
            .as_deref()
            .unwrap_or("")
            .trim()
            .chars()
            .take(MAX_DESCRIPTION_CHARS + 1)
            .collect::<String>();
        if description.chars().count() > MAX_DESCRIPTION_CHARS {
            description = description
                .chars()
                .take(MAX_DESCRIPTION_CHARS)
                .collect::<String>()
                + "…";
        }
        if !description.is_empty() {
            description.push_str("\n\n");
        }
        description.push_str(&format!(
            "Tool `{remote}` of the {:?} MCP server, called through toolexec (its result is the text the server returns; an error it reports makes the call an error).",
            config.name
        ));
        out.push(Arc::new(McpProxyTool {
            spec: ToolSpec {
                name,
                description,
                input_schema: schema,
                read_only,
                capabilities: vec![Capability::Network],
                output_limit: OutputLimit::new(50_000, TruncationMode::HeadTail),
            },
            upstream: upstream.clone(),
            remote,
        }));
    }
    Ok(out)
}

/// An upstream tool's name and input schema as toolexec offers it, or why it cannot be
/// offered: a name that does not make a tool name, a schema larger than [`MAX_SCHEMA_BYTES`],
/// one that cannot be typed for the providers' strict modes (or that takes too much to
/// expand), or whose typed form does not compile.
fn admitted(
    server: &str,
    remote: &str,
    tool: &rmcp::model::Tool,
) -> Result<(String, Value), String> {
    if remote.len() > 64 {
        return Err(format!(
            "its name is {} bytes long, more than a tool name may be (64)",
            remote.len()
        ));
    }
    let name = tool_name(server, remote)?;
    let size = serde_json::to_vec(&*tool.input_schema).map_or(usize::MAX, |v| v.len());
    if size > MAX_SCHEMA_BYTES {
        return Err(format!(
            "its input schema is {size} bytes of JSON, more than {MAX_SCHEMA_BYTES}"
        ));
    }
    let schema = typed_input_schema(&Value::Object((*tool.input_schema).clone()))?;
    jsonschema::draft202012::new(&schema)
        .map_err(|e| format!("its input schema, converted, does not compile ({e})"))?;
    Ok((name, schema))
}

#[async_trait]
impl Tool for McpProxyTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: Value) -> ToolOutput {
        let name = &self.spec.name;
        if let Some(denied) = ctx.web.denied_without_network(name, &ctx.policy) {
            return denied;
        }
        let args = without_absent(&args, &self.spec.input_schema);
        let mut timeout = self.upstream.timeout;
        if let Some(left) = ctx.deadline.remaining() {
            timeout = timeout.min(left);
        }
        let journal = ctx.journal.as_ref();
        let answer = match &ctx.observed {
            Observed::Replay(record) => record.answer(ExchangeRole::Mcp, journal),
            Observed::Live => {
                let at = journal.begin(
                    ExchangeRole::Mcp,
                    "tools/call",
                    None,
                    Some(format!("{}/{}", self.upstream.name, self.remote)),
                );
                let went_out = AtomicBool::new(false);
                let mut session = None;
                let called = tokio::time::timeout(
                    timeout,
                    self.call(ctx, args.clone(), timeout, &went_out, &mut session),
                )
                .await;
                // The result is taken before the connection is closed, and the close (which
                // may wait for the upstream to answer the session's DELETE) is outside the
                // call's time limit: a result that came is never lost to a slow goodbye.
                if let Some(client) = session.take() {
                    close(client);
                }
                let failed = |kind: ExchangeErrorKind, message: String| {
                    journal.fail_last(ExchangeRole::Mcp, kind, message.clone());
                    Err(Unserved { kind, message })
                };
                match called {
                    Ok(Ok(result)) => {
                        let body = scrubbed_result(&result, self.upstream.token.as_ref());
                        journal.respond(at, 200, &reqwest::header::HeaderMap::new());
                        journal.body(at, &body, false).await;
                        Ok(Answer {
                            status: 200,
                            body,
                            truncated: false,
                        })
                    }
                    Ok(Err((kind, message))) => failed(kind, message),
                    Err(_) if went_out.load(Ordering::Acquire) && !self.spec.read_only => failed(
                        ExchangeErrorKind::TimedOut,
                        format!(
                            "the call was sent, but the MCP server did not answer within {}: \
                             whether it took effect is unknown (check before calling it again)",
                            crate::deadline::human_duration(timeout)
                        ),
                    ),
                    Err(_) => failed(
                        ExchangeErrorKind::TimedOut,
                        format!(
                            "the MCP server did not answer within {}",
                            crate::deadline::human_duration(timeout)
                        ),
                    ),
                }
            }
        };
        let mut out = match answer {
            Ok(answer) => match serde_json::from_slice::<CallToolResult>(&answer.body) {
                Ok(result) => rendered(&result),
                Err(e) => ToolOutput::error(format!(
                    "{name}: the MCP server's result could not be read ({e})."
                )),
            },
            Err(e) => e.output(format!(
                "Cannot call {name}: {}. The operator's MCP server {:?} may be down; try again later or do without this tool.",
                e.message, self.upstream.name
            )),
        };
        out.events.extend(journal.drain_events());
        out
    }
}

impl McpProxyTool {
    /// Connects and calls the tool; the connection is left in `session` for the caller to
    /// close (outside the call's time limit).
    async fn call(
        &self,
        ctx: &ToolContext,
        args: Value,
        timeout: Duration,
        went_out: &AtomicBool,
        session: &mut Option<Client>,
    ) -> Result<CallToolResult, (ExchangeErrorKind, String)> {
        let client = connect(&self.upstream, ctx.web.resolver.clone(), timeout)
            .await
            .map_err(|e| {
                (
                    ExchangeErrorKind::Failed,
                    format!("the MCP server could not be reached ({e})"),
                )
            })?;
        let client = session.insert(client);
        let mut params = CallToolRequestParams::new(self.remote.clone());
        params.arguments = match args {
            Value::Object(map) => Some(map),
            _ => None,
        };
        // A tool the upstream does not declare read-only may change something: once the call
        // may have gone out, the engine waits for its result (within this call's time limit)
        // instead of recording a cancel or a timeout as "nothing was changed".
        if !self.spec.read_only && !ctx.deadline.commit_change() {
            return Err((
                ExchangeErrorKind::TimedOut,
                "the call's time ran out before it was sent; nothing was sent".into(),
            ));
        }
        went_out.store(true, Ordering::Release);
        let read_only = self.spec.read_only;
        client.call_tool(params).await.map_err(|e| {
            let why = without_secret(&e.to_string(), self.upstream.token.as_ref());
            (
                ExchangeErrorKind::Failed,
                if read_only {
                    format!("the MCP server refused the call ({why})")
                } else {
                    format!(
                        "the call failed after it was sent ({why}): whether it took effect is \
                         unknown (check before calling it again)"
                    )
                },
            )
        })
    }
}

/// A connection to an upstream.
type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

/// How long closing a connection (the session's DELETE) may take, in the background.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Closes a connection in the background, within [`CLOSE_TIMEOUT`]: nobody waits for it.
fn close(client: Client) {
    tokio::spawn(async move {
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, client.cancel()).await;
    });
}

/// The model's text for an upstream result: its text blocks joined (other blocks named),
/// `structuredContent` when no text came with it; `isError` makes it an error.
fn rendered(result: &CallToolResult) -> ToolOutput {
    let mut parts: Vec<String> = Vec::new();
    for block in &result.content {
        match serde_json::to_value(block).unwrap_or_default() {
            v if v["type"] == "text" => parts.push(v["text"].as_str().unwrap_or("").to_owned()),
            v if v["type"] == "resource" && v["resource"]["text"].is_string() => {
                parts.push(v["resource"]["text"].as_str().unwrap_or("").to_owned());
            }
            v => parts.push(format!(
                "[{} content not shown{}]",
                v["type"].as_str().unwrap_or("other"),
                v.get("mimeType")
                    .and_then(Value::as_str)
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            )),
        }
    }
    let mut text = parts.join("\n");
    if text.trim().is_empty()
        && let Some(structured) = &result.structured_content
    {
        text = structured.to_string();
    }
    if result.is_error == Some(true) {
        ToolOutput::error(text)
    } else {
        ToolOutput::ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn results_are_joined_text_and_is_error_is_an_error() {
        let r: CallToolResult = serde_json::from_value(json!({
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"},
                        {"type": "image", "data": "AAAA", "mimeType": "image/png"}],
            "isError": true
        }))
        .unwrap();
        let out = rendered(&r);
        assert_eq!(out.status, toolexec_core::CallStatus::Error);
        assert_eq!(
            out.content,
            "one\ntwo\n[image content not shown: image/png]"
        );
        let r: CallToolResult =
            serde_json::from_value(json!({"content": [], "structuredContent": {"temp": 21}}))
                .unwrap();
        let out = rendered(&r);
        assert_eq!(out.status, toolexec_core::CallStatus::Ok);
        assert_eq!(out.content, r#"{"temp":21}"#);
    }

    #[tokio::test]
    async fn a_server_that_is_down_or_not_allowed_stops_the_start() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let net = LoadNet {
            egress_allow: vec![],
            resolver: Arc::new(toolexec_net::StaticResolver::new()),
        };
        let mut config = McpToolsConfig {
            name: "up".into(),
            url: format!("http://127.0.0.1:{port}/mcp"),
            bearer_token: Some("mcp-secret-1".into()),
            bearer_token_env: None,
            tools: None,
            allow_cidrs: vec![],
            timeout_ms: None,
        };
        let err = load(&config, &mut BTreeSet::new(), &net)
            .await
            .err()
            .unwrap();
        assert!(
            err.contains("not allowed by the network policy (loopback"),
            "{err}"
        );
        config.allow_cidrs = vec!["127.0.0.1/32".into()];
        let err = load(&config, &mut BTreeSet::new(), &net)
            .await
            .err()
            .unwrap();
        assert!(
            err.contains("tools.mcp \"up\": the MCP server at") && err.contains("must be up"),
            "{err}"
        );
        assert!(!err.contains("mcp-secret-1"), "{err}");
        assert!(!format!("{config:?}").contains("mcp-secret-1"));
    }

    fn upstream_tool(name: &str, schema: Value) -> rmcp::model::Tool {
        rmcp::model::Tool::new(
            name.to_owned(),
            "d",
            Arc::new(schema.as_object().unwrap().clone()),
        )
    }

    #[test]
    fn an_upstream_tool_that_cannot_be_offered_says_why() {
        let ok = upstream_tool(
            "fine",
            json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        );
        assert_eq!(admitted("up", "fine", &ok).unwrap().0, "up__fine");
        let looping = json!({"allOf": [{"$ref": "#/$defs/A"}],
                             "$defs": {"A": {"allOf": [{"$ref": "#/$defs/A"}]}}});
        let mut defs = serde_json::Map::new();
        for level in 0..7 {
            let next = if level == 6 {
                json!({"type": "string"})
            } else {
                json!({"$ref": format!("#/$defs/L{}", level + 1)})
            };
            let props: serde_json::Map<String, Value> =
                (0..20).map(|i| (format!("p{i}"), next.clone())).collect();
            defs.insert(
                format!("L{level}"),
                json!({"type": "object", "properties": props}),
            );
        }
        let bomb = json!({"$ref": "#/$defs/L0", "$defs": defs});
        let big: serde_json::Map<String, Value> = (0..3000)
            .map(|i| {
                (
                    format!("p{i}"),
                    json!({"type": "string", "description": "x".repeat(20)}),
                )
            })
            .collect();
        let big = json!({"type": "object", "properties": big});
        let bad_regex =
            json!({"type": "object", "properties": {"q": {"type": "string", "pattern": "("}}});
        for (name, schema, says) in [
            ("loop", looping, "refers to itself"),
            ("bomb", bomb, "schema nodes"),
            ("big", big, "bytes of JSON"),
            ("regex", bad_regex, "does not compile"),
            (&"n".repeat(70), json!({"type": "object"}), "64"),
        ] {
            let err = admitted("up", name, &upstream_tool(name, schema)).unwrap_err();
            assert!(err.contains(says), "{name}: {err}");
        }
    }

    #[test]
    fn a_token_with_quotes_or_backslashes_is_masked_in_a_result() {
        let token = Secret::new(r#"ab"c\d-77"#.into());
        let r: CallToolResult = serde_json::from_value(json!({
            "content": [{"type": "text", "text": format!("you sent Bearer {}", token.expose())}],
            "structuredContent": {"echo": token.expose(), token.expose(): 1}
        }))
        .unwrap();
        let body = scrubbed_result(&r, Some(&token));
        let text = String::from_utf8_lossy(&body);
        assert!(!text.contains(token.expose()), "{text}");
        assert!(!text.contains(r#"ab\"c\\d-77"#), "{text}");
        assert!(text.contains("you sent Bearer ***"), "{text}");
        let back: CallToolResult = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            back.structured_content,
            Some(json!({"echo": "***", "***": 1}))
        );
        // All digits: masked in the JSON text as well.
        let digits = Secret::new("918273645".into());
        let r: CallToolResult =
            serde_json::from_value(json!({"content": [], "structuredContent": {"n": 918273645}}))
                .unwrap();
        assert!(
            !String::from_utf8_lossy(&scrubbed_result(&r, Some(&digits))).contains("918273645")
        );
    }

    #[test]
    fn an_upstream_schema_is_typed_like_an_operations() {
        let s = typed_input_schema(&json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/Unit"}},
            "required": ["city"],
            "$defs": {"Unit": {"type": "string", "enum": ["c", "f"]}}
        }))
        .unwrap();
        assert_eq!(s["properties"]["unit"]["enum"], json!(["c", "f", null]));
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(
            typed_input_schema(&json!({"type": "object"})).unwrap()["properties"],
            json!({})
        );
        let err = typed_input_schema(&json!({"type": "object", "properties": {
            "q": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}))
        .unwrap_err();
        assert!(err.contains("oneOf"), "{err}");
    }
}
