//! HTTP operation tools from an operator's OpenAPI document (`[[tools.openapi]]`): one typed
//! tool per operation the operator admits, named `<api>__<operationId>`.
//!
//! **At start-up** ([`load`]) the document (OpenAPI 3.0 or 3.1, JSON) is read and each admitted
//! operation becomes a tool whose input schema is built from the operation's path and query
//! parameters and its JSON request body (as `body`), local `$ref`s resolved, in toolexec's
//! schema form (closed objects, optional properties nullable) so that it passes the providers'
//! strict modes like the built-ins. What cannot be typed that way (free-form objects,
//! `oneOf` with several choices, recursive schemas, required header parameters, non-JSON
//! bodies, …) refuses the start with the operation and the reason: nothing is exposed that the
//! operator did not name, and nothing the model could call only half-way. `base_url` must be
//! allowed by the network policy (the public internet, `sandbox.egress_allow_cidrs`, and this
//! API's own `allow_cidrs`), checked on the URL and, for a name, on what it resolves to.
//!
//! **At call time** the path is the template with each parameter percent-encoded as one segment
//! (a `/`, `?`, `#` or `%` in an argument is data, never structure; a segment that would read
//! as `.`, `..` or nothing is refused), the query is form-encoded, and the request goes through
//! the same checked resolver as `web_fetch` (every address checked when dialled: DNS rebinding
//! cannot reach another host), with no proxy and no redirect followed. The bearer token goes in
//! the `Authorization` header only; it never reaches a log, the record or an error message, and
//! a response that echoes it has it replaced by `***` before the model or the record sees it.
//! The exchange is recorded as a `web.exchange` of role `api`, and a verify replay is served
//! from it without calling the API again.
//!
//! This module neither decides which sessions may use the network (the web tools' rule:
//! [`crate::web::WebAccess::denied_without_network`]) nor records: the engine does.
#![allow(
    clippy::disallowed_methods,
    reason = "the OpenAPI document is a host file named by the operator's configuration, not a model's path"
)]
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use toolexec_core::{
    CallStatus, Capability, ExchangeErrorKind, ExchangeRole, OutputLimit, ToolSpec, TruncationMode,
};
use toolexec_net::NetPolicy;
use url::Url;

use super::http::scrub_overlap;
use super::http::{
    LoadNet, Secret, bearer_token, check_endpoint, check_prefix, endpoint_policy, scrubbed,
    scrubbed_within, tool_name,
};
use crate::observe::{Answer, Observed, Unserved};
use crate::schema::import::{
    Typer, check_property_name, make_nullable, resolve, types_of, without_absent,
};
use crate::web::{FetchError, checked_client, read_capped, request_failed};
use crate::{Tool, ToolContext, ToolOutput};
/// Default of `timeout_ms`: an API call an agent waits for, not a batch job.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// Default of `max_response_bytes`: far more than an API answer a model should read (its
/// output limit shows 50,000 characters; `read_output` pages the rest), little memory.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// Most `max_response_bytes` may be: the body is held in memory and recorded as a blob.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024 * 1024;
/// Longest description a tool gets from the document's summary and description, characters.
const MAX_DESCRIPTION_CHARS: usize = 2_000;

/// One operator API (`[[tools.openapi]]`).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenApiToolsConfig {
    /// The API's name: the prefix of its tools' names (`<name>__<operationId>`).
    pub name: String,
    /// Path of the OpenAPI 3.0 or 3.1 document (JSON).
    pub spec: std::path::PathBuf,
    /// Where the API is: the operations' paths are appended to it
    /// (`https://api.example.com/v1`).
    pub base_url: String,
    /// The `operationId`s admitted as tools; no other operation of the document is exposed.
    pub operations: Vec<String>,
    /// Bearer token sent as `Authorization: Bearer …`; never logged, shown or recorded.
    #[serde(default)]
    pub bearer_token: Option<String>,
    /// The name of an environment variable of the service holding the bearer token (read at
    /// start-up; better than `bearer_token` in the file).
    #[serde(default)]
    pub bearer_token_env: Option<String>,
    /// Non-public networks (CIDRs) this API may be reached on, besides
    /// `sandbox.egress_allow_cidrs`: an internal API is not opened to `web_fetch` or the shell.
    #[serde(default)]
    pub allow_cidrs: Vec<String>,
    /// Time limit of one call, milliseconds (default 30 s).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Most bytes of a response body read (default 1 MiB, at most 16 MiB); the rest is cut.
    #[serde(default)]
    pub max_response_bytes: Option<usize>,
}

impl std::fmt::Debug for OpenApiToolsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenApiToolsConfig")
            .field("name", &self.name)
            .field("spec", &self.spec)
            .field("base_url", &crate::web::redacted_url(&self.base_url))
            .field("operations", &self.operations)
            .field("bearer_token", &self.bearer_token.as_ref().map(|_| "***"))
            .field("bearer_token_env", &self.bearer_token_env)
            .field("allow_cidrs", &self.allow_cidrs)
            .field("timeout_ms", &self.timeout_ms)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

/// The tools of one API entry, checked (see the module docs). `taken` holds the names in use
/// (built-ins, earlier entries); this entry's names are added to it.
pub async fn load(
    config: &OpenApiToolsConfig,
    taken: &mut BTreeSet<String>,
    net: &LoadNet,
) -> Result<Vec<Arc<dyn Tool>>, String> {
    let at = format!("tools.openapi {:?}", config.name);
    check_prefix(&config.name, &at)?;
    if config.operations.is_empty() {
        return Err(format!(
            "{at}: operations is empty: list the operationIds to admit as tools (none is exposed by default)"
        ));
    }
    let token = bearer_token(
        config.bearer_token.as_deref(),
        config.bearer_token_env.as_deref(),
        &at,
    )?;
    let max_response_bytes = config
        .max_response_bytes
        .unwrap_or(DEFAULT_MAX_RESPONSE_BYTES);
    if max_response_bytes == 0 || max_response_bytes > MAX_RESPONSE_BYTES {
        return Err(format!(
            "{at}: max_response_bytes must be 1 to {MAX_RESPONSE_BYTES}"
        ));
    }
    let timeout = Duration::from_millis(config.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS).max(1));
    let text = std::fs::read_to_string(&config.spec)
        .map_err(|e| format!("{at}: spec {}: {e}", config.spec.display()))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{at}: spec {} is not JSON ({e}); a YAML document must be converted to JSON first",
            config.spec.display()
        )
    })?;
    let operations = operations(&doc, &config.operations).map_err(|e| format!("{at}: {e}"))?;
    let policy = endpoint_policy(net, &config.allow_cidrs, &at)?;
    let base = check_endpoint(
        &policy,
        net.resolver.as_ref(),
        &config.base_url,
        &format!("{at}: base_url"),
    )
    .await?;
    if base.query().is_some() || base.fragment().is_some() {
        return Err(format!(
            "{at}: base_url must have no query or fragment (the operations' paths are appended to it)"
        ));
    }
    let api = Arc::new(Api {
        name: config.name.clone(),
        base,
        policy,
        token,
        timeout,
        max_response_bytes,
    });
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    for op in operations {
        let at = format!("{at} operation {:?}", op.operation_id);
        let name = tool_name(&config.name, &op.operation_id).map_err(|e| format!("{at}: {e}"))?;
        if !taken.insert(name.clone()) {
            return Err(format!(
                "{at}: its tool name {name:?} is already taken (a built-in, another entry or another operation whose name sanitizes to the same)"
            ));
        }
        let tool =
            OperationTool::new(name, api.clone(), &doc, &op).map_err(|e| format!("{at}: {e}"))?;
        tools.push(Arc::new(tool));
    }
    Ok(tools)
}

/// An operation as the document has it.
struct Operation<'a> {
    operation_id: String,
    method: reqwest::Method,
    path: String,
    path_item: &'a Value,
    op: &'a Value,
}

const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// The admitted operations of `doc`, in the order of `admitted`; every admitted id must be
/// there, once.
fn operations<'a>(doc: &'a Value, admitted: &[String]) -> Result<Vec<Operation<'a>>, String> {
    let version = doc.get("openapi").and_then(Value::as_str).unwrap_or("");
    if !(version.starts_with("3.0") || version.starts_with("3.1")) {
        return Err(format!(
            "the document is not OpenAPI 3.0 or 3.1 (its \"openapi\" is {version:?}; Swagger 2.0 must be converted)"
        ));
    }
    let paths = doc
        .get("paths")
        .and_then(Value::as_object)
        .ok_or("the document has no paths")?;
    let mut found: BTreeMap<&str, Operation<'a>> = BTreeMap::new();
    for (path, item) in paths {
        let item = resolve(doc, item)?;
        for method in METHODS {
            let Some(op) = item.get(*method) else {
                continue;
            };
            let Some(id) = op.get("operationId").and_then(Value::as_str) else {
                continue;
            };
            if !admitted.iter().any(|a| a == id) {
                continue;
            }
            if found.contains_key(id) {
                return Err(format!("operationId {id:?} appears twice in the document"));
            }
            let method = reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes())
                .map_err(|e| e.to_string())?;
            found.insert(
                id,
                Operation {
                    operation_id: id.to_owned(),
                    method,
                    path: path.clone(),
                    path_item: item,
                    op,
                },
            );
        }
    }
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for id in admitted {
        if !seen.insert(id.as_str()) {
            return Err(format!("operations lists {id:?} twice"));
        }
        out.push(found.remove(id.as_str()).ok_or_else(|| {
            format!("operations lists {id:?}, which is no operationId of the document")
        })?);
    }
    Ok(out)
}

/// Where a parameter goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum In {
    Path,
    Query,
}

/// A parameter of the tool: its name (the argument's and the API's) and how it is sent.
#[derive(Debug, Clone)]
struct Param {
    name: String,
    at: In,
    /// Query arrays: repeated (`tag=a&tag=b`, the default) or comma-joined (`explode: false`).
    explode: bool,
}

/// One admitted operation, as a tool.
pub struct OperationTool {
    spec: ToolSpec,
    api: Arc<Api>,
    method: reqwest::Method,
    /// The path template, split into segments (`/pets/{petId}` → `["pets", "{petId}"]`).
    segments: Vec<String>,
    params: Vec<Param>,
    /// Whether the operation takes a JSON body (`body`).
    has_body: bool,
}

/// What the tools of one entry share.
struct Api {
    name: String,
    base: Url,
    policy: NetPolicy,
    token: Option<Secret>,
    timeout: Duration,
    max_response_bytes: usize,
}

impl OperationTool {
    fn new(name: String, api: Arc<Api>, doc: &Value, op: &Operation<'_>) -> Result<Self, String> {
        let mut properties = Map::new();
        let mut required = Vec::new();
        let mut params = Vec::new();
        // Path-level parameters, overridden by the operation's own of the same name and place.
        let mut declared: Vec<&Value> = Vec::new();
        for list in [op.path_item.get("parameters"), op.op.get("parameters")] {
            for p in list.and_then(Value::as_array).into_iter().flatten() {
                let p = resolve(doc, p)?;
                let key = (p.get("name"), p.get("in"));
                declared.retain(|q| (q.get("name"), q.get("in")) != key);
                declared.push(p);
            }
        }
        let template: Vec<String> = op
            .path
            .trim_start_matches('/')
            .split('/')
            .map(str::to_owned)
            .collect();
        for p in declared {
            let pname = p
                .get("name")
                .and_then(Value::as_str)
                .ok_or("a parameter has no name")?;
            let place = p.get("in").and_then(Value::as_str).unwrap_or("");
            let is_required = p.get("required").and_then(Value::as_bool) == Some(true);
            let at = match place {
                "path" => In::Path,
                "query" => In::Query,
                "header" | "cookie" if !is_required => continue,
                other => {
                    return Err(format!(
                        "parameter {pname:?} is a required {other} parameter, which these tools do not send (only path and query parameters and a JSON body)"
                    ));
                }
            };
            check_property_name(pname)?;
            if pname == "body" {
                return Err(
                    "a parameter is named \"body\", the name the tool gives the request body"
                        .to_owned(),
                );
            }
            if properties.contains_key(pname) {
                return Err(format!(
                    "two parameters are named {pname:?} (in the path and the query): a tool's arguments need one name each"
                ));
            }
            if p.get("content").is_some() {
                return Err(format!(
                    "parameter {pname:?} is described by `content`, not `schema`: not supported"
                ));
            }
            let style = p.get("style").and_then(Value::as_str);
            let ok_style = match at {
                In::Path => style.is_none_or(|s| s == "simple"),
                In::Query => style.is_none_or(|s| s == "form"),
            };
            if !ok_style {
                return Err(format!(
                    "parameter {pname:?} has style {style:?}, which is not supported (path: simple, query: form)"
                ));
            }
            let raw = p
                .get("schema")
                .ok_or_else(|| format!("parameter {pname:?} has no schema"))?;
            let mut typer = Typer::new(doc);
            let mut schema = typer
                .typed(raw, 2)
                .map_err(|e| format!("parameter {pname:?}: {e}"))?;
            let types = types_of(&schema);
            let scalar =
                |t: &str| matches!(t, "string" | "integer" | "number" | "boolean" | "null");
            let fits = match at {
                In::Path => types.iter().all(|t| scalar(t) && t != "null"),
                In::Query => {
                    types.iter().all(|t| scalar(t))
                        || (types.contains(&"array".to_owned())
                            && types_of(&schema["items"]).iter().all(|t| scalar(t)))
                }
            };
            if !fits {
                return Err(format!(
                    "parameter {pname:?} is of type {types:?}: a {place} parameter must be a string, number, integer or boolean{}",
                    if at == In::Query {
                        " (or an array of them)"
                    } else {
                        ""
                    }
                ));
            }
            if let Some(d) = p.get("description").and_then(Value::as_str)
                && let Value::Object(m) = &mut schema
            {
                m.entry("description").or_insert_with(|| json!(d));
            }
            if at == In::Path {
                if !template.iter().any(|s| s.contains(&format!("{{{pname}}}"))) {
                    return Err(format!(
                        "path parameter {pname:?} is not in the path {:?}",
                        op.path
                    ));
                }
                if let Value::Object(m) = &mut schema
                    && types_of(&Value::Object(m.clone())) == ["string"]
                {
                    m.entry("minLength").or_insert(json!(1));
                }
                required.push(json!(pname));
            } else if is_required {
                required.push(json!(pname));
            } else {
                make_nullable(&mut schema);
            }
            properties.insert(pname.to_owned(), schema);
            params.push(Param {
                name: pname.to_owned(),
                at,
                explode: p.get("explode").and_then(Value::as_bool).unwrap_or(true),
            });
        }
        for segment in &template {
            let mut rest = segment.as_str();
            while let Some(open) = rest.find('{') {
                let close = rest[open..]
                    .find('}')
                    .ok_or_else(|| format!("the path {:?} has an unclosed '{{'", op.path))?;
                let pname = &rest[open + 1..open + close];
                if !params.iter().any(|p| p.at == In::Path && p.name == pname) {
                    return Err(format!(
                        "the path {:?} has {{{pname}}}, which no path parameter declares",
                        op.path
                    ));
                }
                rest = &rest[open + close + 1..];
            }
        }
        let mut has_body = false;
        if let Some(body) = op.op.get("requestBody") {
            let body = resolve(doc, body)?;
            let body_required = body.get("required").and_then(Value::as_bool) == Some(true);
            let content = body
                .get("content")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let json_media = content.iter().find(|(media, _)| {
                let m = media.split(';').next().unwrap_or("").trim();
                m == "application/json" || m.ends_with("+json")
            });
            match json_media {
                Some((_, media)) => {
                    let raw = media
                        .get("schema")
                        .ok_or("the JSON request body has no schema")?;
                    let mut schema = Typer::new(doc)
                        .typed(raw, 2)
                        .map_err(|e| format!("request body: {e}"))?;
                    if let (Some(d), Value::Object(m)) =
                        (body.get("description").and_then(Value::as_str), &mut schema)
                    {
                        m.entry("description").or_insert_with(|| json!(d));
                    }
                    if body_required {
                        required.push(json!("body"));
                    } else {
                        make_nullable(&mut schema);
                    }
                    properties.insert("body".to_owned(), schema);
                    has_body = true;
                }
                None if body_required => {
                    return Err(format!(
                        "its request body is required and not JSON ({:?}): not supported",
                        content.keys().collect::<Vec<_>>()
                    ));
                }
                None => {}
            }
        }
        let input_schema = json!({
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        });
        let read_only = matches!(op.method, reqwest::Method::GET | reqwest::Method::HEAD);
        Ok(Self {
            spec: ToolSpec {
                name,
                description: description(&api, op, has_body),
                input_schema,
                read_only,
                capabilities: vec![Capability::Network],
                output_limit: OutputLimit::new(50_000, TruncationMode::HeadTail),
            },
            api,
            method: op.method.clone(),
            segments: template,
            params,
            has_body,
        })
    }

    /// The request's URL from validated arguments: `Err` is a sentence for the model.
    fn url(&self, args: &Value) -> Result<Url, String> {
        let mut path = String::new();
        for segment in &self.segments {
            let mut filled = String::new();
            let mut rest = segment.as_str();
            while let Some(open) = rest.find('{') {
                filled.push_str(&rest[..open]);
                let close = rest[open..].find('}').unwrap_or(rest.len() - open);
                let pname = &rest[open + 1..open + close];
                let text = scalar_text(&args[pname])
                    .ok_or_else(|| format!("the path parameter {pname} needs a value"))?;
                filled.push_str(&encode_segment(&text));
                rest = rest.get(open + close + 1..).unwrap_or("");
            }
            filled.push_str(rest);
            if segment.contains('{') && (filled.is_empty() || filled == "." || filled == "..") {
                return Err(format!(
                    "a path parameter makes the path segment {filled:?}, which would change the path's structure; give a real value"
                ));
            }
            path.push('/');
            path.push_str(&filled);
        }
        let base = self.api.base.as_str().trim_end_matches('/');
        let mut url = Url::parse(&format!("{base}{path}"))
            .map_err(|e| format!("the request URL is not valid ({e})"))?;
        // Belt and braces: the parsed path is the base's, then exactly the template's segments.
        let base_segments = self
            .api
            .base
            .path_segments()
            .map(|s| s.filter(|x| !x.is_empty()).count())
            .unwrap_or(0);
        let got = url.path_segments().map(|s| s.count()).unwrap_or(0);
        if got != base_segments + self.segments.len()
            || !url
                .path()
                .starts_with(self.api.base.path().trim_end_matches('/'))
        {
            return Err("the arguments would change the request's path; refused".to_owned());
        }
        {
            let mut pairs = url.query_pairs_mut();
            for p in self.params.iter().filter(|p| p.at == In::Query) {
                match &args[p.name.as_str()] {
                    Value::Null => {}
                    Value::Array(items) if p.explode => {
                        for item in items {
                            if let Some(t) = scalar_text(item) {
                                pairs.append_pair(&p.name, &t);
                            }
                        }
                    }
                    Value::Array(items) => {
                        let joined: Vec<String> = items.iter().filter_map(scalar_text).collect();
                        pairs.append_pair(&p.name, &joined.join(","));
                    }
                    v => {
                        if let Some(t) = scalar_text(v) {
                            pairs.append_pair(&p.name, &t);
                        }
                    }
                }
            }
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        Ok(url)
    }
}

/// A scalar argument as text (`None` for null, arrays and objects).
fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `text` as (part of) one path segment: every byte but the unreserved ones of RFC 3986
/// (`A-Z a-z 0-9 - . _ ~`) percent-encoded, so `/`, `?`, `#`, `%` and `\` are data.
fn encode_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The tool's manual: the operation's summary and description, and what the tool does.
fn description(api: &Api, op: &Operation<'_>, has_body: bool) -> String {
    let mut text = String::new();
    for key in ["summary", "description"] {
        if let Some(t) = op.op.get(key).and_then(Value::as_str).map(str::trim)
            && !t.is_empty()
        {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(t);
        }
    }
    if text.chars().count() > MAX_DESCRIPTION_CHARS {
        text = text.chars().take(MAX_DESCRIPTION_CHARS).collect::<String>() + "…";
    }
    if !text.is_empty() {
        text.push_str("\n\n");
    }
    text.push_str(&format!(
        "Calls `{} {}` of the {:?} API. Path and query parameters are arguments by name{}. The \
         result is the HTTP status and the response body (at most {} bytes); a status other \
         than 2xx makes the call an error that shows the body.",
        op.method,
        op.path,
        api.name,
        if has_body {
            "; `body` is the JSON request body"
        } else {
            ""
        },
        api.max_response_bytes
    ));
    text
}

#[async_trait]
impl Tool for OperationTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: Value) -> ToolOutput {
        let name = &self.spec.name;
        if let Some(denied) = ctx.web.denied_without_network(name, &ctx.policy) {
            return denied;
        }
        let args = without_absent(&args, &self.spec.input_schema);
        let url = match self.url(&args) {
            Ok(url) => url,
            Err(why) => {
                return ToolOutput {
                    status: CallStatus::InvalidArguments,
                    content: format!("Invalid arguments for {name}: {why}."),
                    changes: Vec::new(),
                    events: Vec::new(),
                    structured: None,
                };
            }
        };
        // The URL layer again (the base was checked at start-up; the port and host cannot
        // change, but the check is cheap and the one the dial relies on).
        if let Err(r) = self.api.policy.check_parsed_url(url.clone()) {
            return ToolOutput::denied(format!("Cannot call {name}: {r}."));
        }
        let body = if self.has_body {
            match args.get("body") {
                Some(b) if !b.is_null() => Some(b.to_string()),
                _ => None,
            }
        } else {
            None
        };
        let mut timeout = self.api.timeout;
        if let Some(left) = ctx.deadline.remaining() {
            timeout = timeout.min(left);
        }
        let journal = ctx.journal.as_ref();
        let shown = format!("{} {}", self.method, url.path());
        let answer = match &ctx.observed {
            Observed::Replay(record) => record.answer(ExchangeRole::Api, journal),
            Observed::Live => {
                let went_out = AtomicBool::new(false);
                let sent =
                    tokio::time::timeout(timeout, self.send(ctx, url, body, timeout, &went_out))
                        .await;
                let failed = |kind: ExchangeErrorKind, message: String| {
                    journal.fail_last(ExchangeRole::Api, kind, message.clone());
                    Err(Unserved { kind, message })
                };
                match sent {
                    Ok(Ok(answer)) => Ok(answer),
                    Ok(Err(e)) => failed(e.kind(), e.to_string()),
                    Err(_) if went_out.load(Ordering::Acquire) && !self.spec.read_only => failed(
                        ExchangeErrorKind::TimedOut,
                        format!(
                            "the request was sent, but the API did not answer within {}: whether \
                             it took effect is unknown (check before sending it again)",
                            crate::deadline::human_duration(timeout)
                        ),
                    ),
                    Err(_) => failed(
                        ExchangeErrorKind::TimedOut,
                        format!(
                            "the API did not answer within {}",
                            crate::deadline::human_duration(timeout)
                        ),
                    ),
                }
            }
        };
        let mut out = match answer {
            Ok(answer) => rendered(name, &shown, &answer),
            Err(e) => e.output(format!("Cannot call {name} ({shown}): {}.", e.message)),
        };
        out.events.extend(journal.drain_events());
        out
    }
}

impl OperationTool {
    /// Sends the request and reads the answer, recording the exchange in the call's journal.
    async fn send(
        &self,
        ctx: &ToolContext,
        url: Url,
        body: Option<String>,
        timeout: Duration,
        went_out: &AtomicBool,
    ) -> Result<Answer, FetchError> {
        let journal = ctx.journal.as_ref();
        let client = checked_client(
            &self.api.policy,
            ctx.web.resolver.clone(),
            timeout,
            concat!("toolexec/", env!("CARGO_PKG_VERSION"), " (openapi tool)"),
        )?;
        let at = journal.begin(
            ExchangeRole::Api,
            self.method.as_str(),
            Some(url.to_string()),
            Some(self.api.name.clone()),
        );
        let mut request = client
            .request(self.method.clone(), url)
            .header(reqwest::header::ACCEPT, "application/json, */*;q=0.5");
        if let Some(token) = &self.api.token {
            let mut value =
                reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.expose()))
                    .map_err(|_| {
                        FetchError::Http("the operator's token is not a header value".into())
                    })?;
            value.set_sensitive(true);
            request = request.header(reqwest::header::AUTHORIZATION, value);
        }
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        // A request that changes something (not GET or HEAD) is a change: once it may have
        // gone out, the engine waits for its answer (within this call's time limit) instead of
        // recording a cancel or a timeout as "nothing was changed".
        if !self.spec.read_only && !ctx.deadline.commit_change() {
            return Err(FetchError::Recorded {
                kind: ExchangeErrorKind::TimedOut,
                message: "the call's time ran out before the request was sent; nothing was sent"
                    .into(),
            });
        }
        went_out.store(true, Ordering::Release);
        let response = request.send().await.map_err(|e| {
            let (connect, timed_out) = (e.is_connect(), e.is_timeout());
            let failed = request_failed(e);
            if self.spec.read_only
                || connect
                || matches!(failed, FetchError::Refused(_) | FetchError::Dial(_))
            {
                return failed;
            }
            // Connected, so the request may have reached the API.
            FetchError::Recorded {
                kind: if timed_out {
                    ExchangeErrorKind::TimedOut
                } else {
                    ExchangeErrorKind::Failed
                },
                message: if timed_out {
                    format!(
                        "the request was sent, but the API did not answer within {}: whether \
                         it took effect is unknown (check before sending it again)",
                        crate::deadline::human_duration(timeout)
                    )
                } else {
                    format!(
                        "{failed}, after the request was sent: whether it took effect is \
                         unknown (check before sending it again)"
                    )
                },
            }
        })?;
        let status = response.status().as_u16();
        let mut headers = response.headers().clone();
        for value in headers.values_mut() {
            let clean = scrubbed(
                Bytes::copy_from_slice(value.as_bytes()),
                self.api.token.as_ref(),
            );
            if clean.len() != value.len()
                && let Ok(v) = reqwest::header::HeaderValue::from_bytes(&clean)
            {
                *value = v;
            }
        }
        journal.respond(at, status, &headers);
        // Read a token's length − 1 past the cap, so that a token the cap would split is
        // masked whole before the body is cut.
        let overlap = scrub_overlap(self.api.token.as_ref());
        let (body, read_cut) = read_capped(response, self.api.max_response_bytes + overlap).await?;
        let (body, cut) =
            scrubbed_within(body, self.api.token.as_ref(), self.api.max_response_bytes);
        let truncated = read_cut || cut;
        journal.body(at, &body, truncated).await;
        Ok(Answer {
            status,
            body,
            truncated,
        })
    }
}

/// The model's text for an answer: status, then the body; not 2xx is an error.
fn rendered(name: &str, shown: &str, answer: &Answer) -> ToolOutput {
    let reason = reqwest::StatusCode::from_u16(answer.status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let body = String::from_utf8_lossy(&answer.body);
    let cut = if answer.truncated {
        format!(
            "\n[the response was longer: cut after {} bytes]",
            answer.body.len()
        )
    } else {
        String::new()
    };
    if (200..300).contains(&answer.status) {
        ToolOutput::ok(format!("HTTP {} {reason}\n\n{body}{cut}", answer.status))
    } else {
        ToolOutput::error(format!(
            "{name} ({shown}): the API answered HTTP {} {reason}, an error.\n\n{body}{cut}",
            answer.status
        ))
    }
}

#[cfg(test)]
mod tests;
