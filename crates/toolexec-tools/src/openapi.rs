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
use toolexec_net::{NetPolicy, Resolver, resolve_checked};
use url::Url;

use crate::observe::{Answer, Observed, Unserved};
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
/// How deep a schema may nest (the providers' strict modes take 10 levels; the tool's own
/// object and `body` take two of them).
const MAX_SCHEMA_DEPTH: usize = 8;
/// Longest chain of `$ref`s followed to one definition.
const MAX_REF_HOPS: usize = 32;
/// Most schema nodes one conversion may expand (each `$ref` is expanded where it is used, so a
/// small document can describe an enormous schema): OpenAI's strict mode takes 5,000
/// properties in all, and a schema past this is no tool a model can fill in.
const MAX_SCHEMA_NODES: usize = 10_000;
/// How long the start-up check of `base_url`'s host name may take.
const RESOLVE_AT_LOAD: Duration = Duration::from_secs(10);

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

/// A secret that never shows: `Debug` prints `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// The bearer token of an entry: from the file or the named variable (read now), checked to
/// be a header value. The errors never quote the token.
pub(crate) fn bearer_token(
    token: Option<&str>,
    env: Option<&str>,
    at: &str,
) -> Result<Option<Secret>, String> {
    let token = match (token, env) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "{at}: set bearer_token or bearer_token_env, not both"
            ));
        }
        (Some(t), None) => t.to_owned(),
        (None, Some(var)) => std::env::var(var).map_err(|_| {
            format!("{at}: bearer_token_env names {var}, which is not set (or not UTF-8) in the service's environment")
        })?,
        (None, None) => return Ok(None),
    };
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(format!(
            "{at}: the bearer token is empty or holds characters a header cannot carry"
        ));
    }
    Ok(Some(Secret(token)))
}

/// `text` with every occurrence of `secret` replaced by `***` (an API that echoes the request's
/// headers must not put the token into the result or the record).
pub(crate) fn scrubbed(body: Bytes, secret: Option<&Secret>) -> Bytes {
    let Some(secret) = secret.map(|s| s.0.as_bytes()).filter(|s| !s.is_empty()) else {
        return body;
    };
    if !body.windows(secret.len()).any(|w| w == secret) {
        return body;
    }
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        if body[i..].starts_with(secret) {
            out.extend_from_slice(b"***");
            i += secret.len();
        } else {
            out.push(body[i]);
            i += 1;
        }
    }
    out.into()
}

/// `body` with `secret` masked, as it is and as JSON escapes it (a token with a `"` or a `\`
/// echoed in a JSON body), and cut at `limit` bytes of the original: a token that begins
/// before the cut is masked whole (`body` should hold [`scrub_overlap`] bytes past `limit`,
/// read for that), so no prefix of it shows at the end of a cut body. Also says whether
/// anything of `body` was cut.
pub(crate) fn scrubbed_within(body: Bytes, secret: Option<&Secret>, limit: usize) -> (Bytes, bool) {
    let needles = secret.map(secret_forms).unwrap_or_default();
    if needles.is_empty() {
        let cut = body.len() > limit;
        return (body.slice(..body.len().min(limit)), cut);
    }
    let mut out = Vec::with_capacity(body.len().min(limit));
    let mut i = 0;
    'bytes: while i < body.len() && i < limit {
        for needle in &needles {
            if body[i..].starts_with(needle) {
                out.extend_from_slice(b"***");
                i += needle.len();
                continue 'bytes;
            }
        }
        out.push(body[i]);
        i += 1;
    }
    (out.into(), i < body.len())
}

/// The forms a token takes in a body: as it is, and JSON-escaped when that differs.
fn secret_forms(secret: &Secret) -> Vec<Vec<u8>> {
    let raw = secret.0.as_bytes().to_vec();
    if raw.is_empty() {
        return Vec::new();
    }
    let quoted = serde_json::to_string(&secret.0).unwrap_or_default();
    let escaped = quoted.as_bytes()[1..quoted.len() - 1].to_vec();
    if escaped == raw {
        vec![raw]
    } else {
        // The longer first: an escaped form may begin like the raw one.
        vec![escaped, raw]
    }
}

/// Bytes to read past a cap so that [`scrubbed_within`] sees whole any token the cap splits.
pub(crate) fn scrub_overlap(secret: Option<&Secret>) -> usize {
    secret
        .map(secret_forms)
        .unwrap_or_default()
        .iter()
        .map(|n| n.len().saturating_sub(1))
        .max()
        .unwrap_or(0)
}

/// What the loaders need of the network: the operator's allow-list and the resolver the
/// service dials with (a static one in tests).
#[derive(Clone)]
pub struct LoadNet {
    /// `sandbox.egress_allow_cidrs`.
    pub egress_allow: Vec<String>,
    pub resolver: Arc<dyn Resolver>,
}

/// The policy of an operator's endpoint: the public internet, `sandbox.egress_allow_cidrs` and
/// the entry's own `allow_cidrs`; this host's own addresses refused unless named.
pub(crate) fn endpoint_policy(
    net: &LoadNet,
    own: &[String],
    at: &str,
) -> Result<NetPolicy, String> {
    let all: Vec<&str> = net
        .egress_allow
        .iter()
        .chain(own)
        .map(String::as_str)
        .collect();
    Ok(NetPolicy::new(&all)
        .map_err(|e| format!("{at}: allow_cidrs: {e}"))?
        .refusing_this_host())
}

/// Checks at start-up that `url` may be reached under `policy`: the URL layer, and for a name
/// what it resolves to now. A name that does not resolve now is let through (the check is made
/// again at every call); a refusal stops the start.
pub(crate) async fn check_endpoint(
    policy: &NetPolicy,
    resolver: &dyn Resolver,
    url: &str,
    at: &str,
) -> Result<Url, String> {
    let refused = |r: toolexec_net::Refusal| {
        format!(
            "{at}: {url:?} is not allowed by the network policy ({}: {r}); add its network to this entry's allow_cidrs (or sandbox.egress_allow_cidrs) if it is meant to be reached",
            r.reason()
        )
    };
    let checked = policy.check_url(url).map_err(refused)?;
    if let toolexec_net::Host::Domain(name) = checked.host() {
        match resolve_checked(policy, resolver, name, checked.port(), RESOLVE_AT_LOAD).await {
            Ok(_) => {}
            Err(toolexec_net::ConnectError::Refused(r)) => return Err(refused(r)),
            Err(e) => {
                tracing::warn!(entry = at, error = %e, "an operator endpoint's host does not resolve now; its calls will fail until it does");
            }
        }
    }
    Ok(checked.into_url())
}

/// The tool name `<prefix>__<name>` with every character outside `[a-zA-Z0-9_-]` made `_`;
/// refused when longer than 64 characters (the providers' limit).
pub(crate) fn tool_name(prefix: &str, name: &str) -> Result<String, String> {
    let joined: String = format!("{prefix}__{name}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if joined.len() > 64 {
        return Err(format!(
            "the tool name {joined:?} is longer than 64 characters (the providers' limit): use a shorter name for the entry"
        ));
    }
    Ok(joined)
}

/// Checks an entry's `name` (the prefix of its tools' names).
pub(crate) fn check_prefix(name: &str, at: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{at}: the name must be 1 to 32 letters, digits, '_' or '-' (it prefixes the tools' names)"
        ))
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

/// `value`, or what its `$ref` (a local `#/…` pointer) names, followed to the end.
fn resolve<'a>(doc: &'a Value, mut value: &'a Value) -> Result<&'a Value, String> {
    for _ in 0..MAX_REF_HOPS {
        let Some(r) = value.get("$ref").and_then(Value::as_str) else {
            return Ok(value);
        };
        value = pointer(doc, r)?;
    }
    Err("a chain of $refs is too long (a loop?)".to_owned())
}

/// The definition a local `$ref` names.
fn pointer<'a>(doc: &'a Value, r: &str) -> Result<&'a Value, String> {
    let Some(p) = r.strip_prefix('#') else {
        return Err(format!(
            "$ref {r:?} points outside the document (only local #/… references are resolved)"
        ));
    };
    doc.pointer(p)
        .ok_or_else(|| format!("$ref {r:?} names nothing in the document"))
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

/// Property names the providers accept (`^[a-zA-Z0-9_.-]{1,64}$`, Anthropic's rule).
fn check_property_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "the name {name:?} is not 1 to 64 letters, digits, '_', '.' or '-' (the providers' rule for argument names)"
        ))
    }
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

/// The types a converted schema allows.
fn types_of(schema: &Value) -> Vec<String> {
    match schema.get("type") {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    }
}

/// Lets `null` through (toolexec's form of an optional property: `null` means not given).
fn make_nullable(schema: &mut Value) {
    let Value::Object(map) = schema else {
        return;
    };
    match map.get_mut("type") {
        Some(Value::String(t)) if t != "null" => {
            let t = t.clone();
            map.insert("type".into(), json!([t, "null"]));
        }
        Some(Value::Array(types)) if !types.iter().any(|t| t == "null") => {
            types.push(json!("null"));
        }
        _ => {}
    }
    // A `const` would refuse the `null`: it becomes a choice of itself or `null`.
    if let Some(c) = map.remove("const") {
        map.insert("enum".into(), Value::Array(vec![c, Value::Null]));
    }
    if let Some(Value::Array(values)) = map.get_mut("enum")
        && !values.iter().any(Value::is_null)
    {
        values.push(Value::Null);
    }
}

/// Keywords of a document's schema carried into the tool's schema as they are.
const KEPT: &[&str] = &[
    "description",
    "format",
    "minimum",
    "maximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "uniqueItems",
    "enum",
    "const",
];

/// Keywords that annotate and do not constrain: left out.
const ANNOTATIONS: &[&str] = &[
    "title",
    "default",
    "example",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "xml",
    "externalDocs",
    "$comment",
    "$schema",
    "$id",
    "$defs",
    "definitions",
    "discriminator",
    "contentMediaType",
    "contentEncoding",
];

/// Converts a document's schema into toolexec's form, or says why it cannot be typed.
struct Typer<'a> {
    doc: &'a Value,
    /// The `$ref`s being expanded (a schema that refers to itself cannot be typed strictly).
    stack: Vec<String>,
    /// Schema nodes expanded so far (see [`MAX_SCHEMA_NODES`]).
    nodes: usize,
}

impl<'a> Typer<'a> {
    fn new(doc: &'a Value) -> Self {
        Self {
            doc,
            stack: Vec::new(),
            nodes: 0,
        }
    }

    /// Counts one more expanded node, refusing past the budget.
    fn spend(&mut self) -> Result<(), String> {
        self.nodes += 1;
        if self.nodes > MAX_SCHEMA_NODES {
            return Err(format!(
                "the schema expands to more than {MAX_SCHEMA_NODES} schema nodes (its $refs, expanded where they are used, make it too large for a tool's arguments)"
            ));
        }
        Ok(())
    }

    fn typed(&mut self, schema: &Value, depth: usize) -> Result<Value, String> {
        self.spend()?;
        if depth > MAX_SCHEMA_DEPTH {
            return Err(format!(
                "the schema nests deeper than {MAX_SCHEMA_DEPTH} levels (the providers' strict modes take 10 in all)"
            ));
        }
        let Value::Object(map) = schema else {
            return Err("a schema is not an object (true/false schemas cannot be typed)".into());
        };
        if let Some(r) = map.get("$ref").and_then(Value::as_str) {
            if self.stack.iter().any(|s| s == r) {
                return Err(format!(
                    "{r} refers to itself (a recursive schema cannot be typed for the providers' strict modes)"
                ));
            }
            let target = pointer(self.doc, r)?;
            self.stack.push(r.to_owned());
            let out = self.typed(target, depth);
            self.stack.pop();
            // Siblings of a $ref (3.1): a description is kept, 3.0's `nullable` applied,
            // anything else that constrains refused (it would be dropped, loosening the schema).
            return siblings_kept(out?, map, "$ref");
        }
        if let Some(Value::Array(all)) = map.get("allOf") {
            let merged = self.merged(map, all)?;
            return self.typed(&merged, depth);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(choices)) = map.get(key) {
                let real: Vec<&Value> = choices
                    .iter()
                    .filter(|c| c.get("type").and_then(Value::as_str) != Some("null"))
                    .collect();
                if real.len() != 1 {
                    return Err(format!(
                        "{key} with {} choices cannot be typed for the providers' strict modes",
                        real.len()
                    ));
                }
                let mut out = self.typed(real[0], depth)?;
                if real.len() < choices.len() {
                    make_nullable(&mut out);
                }
                return siblings_kept(out, map, key);
            }
        }
        let mut out = Map::new();
        let mut types = match map.get("type") {
            Some(Value::String(t)) => vec![t.clone()],
            Some(Value::Array(ts)) => ts
                .iter()
                .map(|t| {
                    t.as_str()
                        .map(str::to_owned)
                        .ok_or("a type is not a string")
                })
                .collect::<Result<_, _>>()?,
            None if map.contains_key("properties") => vec!["object".to_owned()],
            None if map.contains_key("items") => vec!["array".to_owned()],
            None => match map.get("enum").or(map.get("const")) {
                Some(Value::Array(values)) => {
                    let mut ts: Vec<String> = values.iter().map(json_type).collect();
                    ts.sort();
                    ts.dedup();
                    ts
                }
                Some(v) => vec![json_type(v)],
                None => {
                    return Err(
                        "a schema has no type (an \"any value\" cannot be typed for the providers' strict modes)"
                            .into(),
                    );
                }
            },
            Some(_) => return Err("a type is not a string".into()),
        };
        if map.get("nullable").and_then(Value::as_bool) == Some(true)
            && !types.iter().any(|t| t == "null")
        {
            types.push("null".to_owned());
        }
        for (key, value) in map {
            let k = key.as_str();
            if matches!(
                k,
                "type"
                    | "nullable"
                    | "properties"
                    | "required"
                    | "additionalProperties"
                    | "items"
                    | "exclusiveMinimum"
                    | "exclusiveMaximum"
            ) || ANNOTATIONS.contains(&k)
                || k.starts_with("x-")
            {
                continue;
            }
            if KEPT.contains(&k) {
                out.insert(key.clone(), value.clone());
                continue;
            }
            return Err(format!(
                "the keyword {k:?} cannot be carried into a strict tool schema"
            ));
        }
        // 3.0 writes exclusive bounds as booleans beside minimum/maximum; 3.1 as numbers.
        for (key, bound) in [
            ("exclusiveMinimum", "minimum"),
            ("exclusiveMaximum", "maximum"),
        ] {
            match map.get(key) {
                Some(Value::Bool(true)) => {
                    if let Some(b) = out.remove(bound) {
                        out.insert(key.into(), b);
                    }
                }
                Some(Value::Number(n)) => {
                    out.insert(key.into(), Value::Number(n.clone()));
                }
                _ => {}
            }
        }
        let is = |t: &str| types.iter().any(|x| x == t);
        if is("object") {
            let props = map
                .get("properties")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            if props.is_empty() && map.get("additionalProperties") != Some(&Value::Bool(false)) {
                return Err(
                    "a free-form object (no properties) cannot be typed for the providers' strict modes"
                        .into(),
                );
            }
            let required: Vec<String> = map
                .get("required")
                .and_then(Value::as_array)
                .map(|r| {
                    r.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            let mut properties = Map::new();
            let mut kept_required = Vec::new();
            for (name, prop) in &props {
                check_property_name(name)?;
                // A server-set property is not sent.
                if resolve(self.doc, prop)?.get("readOnly") == Some(&Value::Bool(true)) {
                    continue;
                }
                let mut p = self
                    .typed(prop, depth + 1)
                    .map_err(|e| format!("{name}: {e}"))?;
                if required.contains(name) {
                    kept_required.push(json!(name));
                } else {
                    make_nullable(&mut p);
                }
                properties.insert(name.clone(), p);
            }
            out.insert("properties".into(), Value::Object(properties));
            out.insert("required".into(), Value::Array(kept_required));
            out.insert("additionalProperties".into(), Value::Bool(false));
        }
        if is("array") {
            let items = map
                .get("items")
                .ok_or("an array without `items` cannot be typed")?;
            out.insert("items".into(), self.typed(items, depth + 1)?);
        }
        out.insert(
            "type".into(),
            if types.len() == 1 {
                json!(types[0])
            } else {
                json!(types)
            },
        );
        if let Some(Value::Array(values)) = out.get_mut("enum")
            && is("null")
            && !values.iter().any(Value::is_null)
        {
            values.push(Value::Null);
        }
        Ok(Value::Object(out))
    }

    /// An `allOf` of object schemas as one object schema (properties and required joined).
    fn merged(&mut self, map: &Map<String, Value>, all: &[Value]) -> Result<Value, String> {
        let mut out = map.clone();
        out.remove("allOf");
        let mut properties = out
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let mut required: Vec<Value> = out
            .get("required")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for part in all {
            self.spend()?;
            // A part's own $ref and allOf are followed (an inheritance chain); the $refs
            // followed stay on the stack while the part's own allOf is merged, so a part that
            // comes back to itself is refused, however it gets there.
            let depth = self.stack.len();
            let merged_part = self.merged_part(part);
            self.stack.truncate(depth);
            let part = merged_part?;
            let Value::Object(part) = part else {
                return Err("an allOf part is not a schema object".into());
            };
            let object = part.get("type").is_none_or(|t| t == "object");
            if !object {
                return Err("allOf of schemas that are not objects cannot be typed".into());
            }
            for (key, value) in &part {
                match key.as_str() {
                    "properties" => {
                        for (k, v) in value.as_object().into_iter().flatten() {
                            properties.insert(k.clone(), v.clone());
                        }
                    }
                    "required" => required.extend(value.as_array().into_iter().flatten().cloned()),
                    "type" => {}
                    "additionalProperties" | "description" => {
                        out.entry(key.clone()).or_insert_with(|| value.clone());
                    }
                    k if ANNOTATIONS.contains(&k) || k.starts_with("x-") => {}
                    k => {
                        return Err(format!(
                            "the keyword {k:?} in an allOf part cannot be carried into a strict tool schema"
                        ));
                    }
                }
            }
        }
        out.insert("type".into(), json!("object"));
        out.insert("properties".into(), Value::Object(properties));
        out.insert("required".into(), Value::Array(required));
        // The parts' additionalProperties: false would refuse the other parts' properties.
        out.remove("additionalProperties");
        Ok(Value::Object(out))
    }

    /// One part of an `allOf`: its `$ref`s followed (each pushed on the stack; the caller pops
    /// them) and its own `allOf` merged.
    fn merged_part(&mut self, part: &Value) -> Result<Value, String> {
        let mut part = part;
        while let Some(r) = part.get("$ref").and_then(Value::as_str) {
            if self.stack.iter().any(|s| s == r) || self.stack.len() > MAX_REF_HOPS {
                return Err(format!("{r} refers to itself through allOf"));
            }
            self.stack.push(r.to_owned());
            part = pointer(self.doc, r)?;
        }
        match part.get("allOf").and_then(Value::as_array) {
            Some(inner) => {
                let Value::Object(m) = part else {
                    return Err("an allOf part is not a schema object".into());
                };
                self.merged(m, inner)
            }
            None => Ok(part.clone()),
        }
    }
}

/// `typed`, the conversion of the `$ref` or the single choice of `anyOf`/`oneOf` (`key`) of
/// `map`, with `map`'s other keywords: a `description` replaces the target's, `nullable: true`
/// (OpenAPI 3.0) lets `null` through, annotations are left out, and anything else is refused:
/// it would constrain the value, and dropping it would let through what the document refuses.
fn siblings_kept(mut typed: Value, map: &Map<String, Value>, key: &str) -> Result<Value, String> {
    for (k, v) in map {
        match k.as_str() {
            k2 if k2 == key => {}
            "description" => {
                if let Value::Object(m) = &mut typed {
                    m.insert("description".into(), v.clone());
                }
            }
            "nullable" if v == &Value::Bool(true) => make_nullable(&mut typed),
            "nullable" => {}
            k2 if ANNOTATIONS.contains(&k2) || k2.starts_with("x-") => {}
            k2 => {
                return Err(format!(
                    "the keyword {k2:?} beside {key} cannot be carried into a strict tool schema"
                ));
            }
        }
    }
    Ok(typed)
}

/// A tool's input schema from elsewhere (an upstream MCP server's `inputSchema`) in toolexec's
/// form, its local `$ref`s (`#/$defs/…`) resolved against itself; a root without properties is
/// a tool without arguments (`{}`).
pub(crate) fn typed_input_schema(schema: &Value) -> Result<Value, String> {
    // A root that is a `$ref` (`{"$ref": "#/$defs/Args", "$defs": …}`) is its target.
    let mut root = resolve(schema, schema)?.clone();
    if let Value::Object(m) = &mut root {
        if m.get("type").is_none() {
            m.insert("type".into(), json!("object"));
        }
        if m.get("type") != Some(&json!("object")) {
            return Err("the input schema is not an object schema".into());
        }
        let empty = m
            .get("properties")
            .and_then(Value::as_object)
            .is_none_or(|p| p.is_empty());
        if empty {
            m.insert("properties".into(), json!({}));
            m.insert("additionalProperties".into(), json!(false));
        }
    }
    Typer::new(schema).typed(&root, 1)
}

/// The JSON type of a value, as JSON Schema names it.
fn json_type(v: &Value) -> String {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
    .to_owned()
}

/// `value` without the properties a strict model filled with `null` for "not given": a `null`
/// for a property its object schema does not require is dropped, at every level.
pub(crate) fn without_absent(value: &Value, schema: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let props = schema.get("properties");
            Value::Object(
                map.iter()
                    .filter(|(k, v)| !v.is_null() || required.contains(&k.as_str()))
                    .map(|(k, v)| {
                        let sub = props.and_then(|p| p.get(k)).unwrap_or(&Value::Null);
                        (k.clone(), without_absent(v, sub))
                    })
                    .collect(),
            )
        }
        Value::Array(items) => {
            let sub = schema.get("items").unwrap_or(&Value::Null);
            Value::Array(items.iter().map(|v| without_absent(v, sub)).collect())
        }
        other => other.clone(),
    }
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
mod tests {
    use super::*;

    fn doc() -> Value {
        json!({
            "openapi": "3.0.3",
            "info": {"title": "Pets", "version": "1"},
            "paths": {
                "/pets": {
                    "get": {
                        "operationId": "listPets",
                        "summary": "List pets.",
                        "parameters": [
                            {"name": "limit", "in": "query", "schema": {"type": "integer", "maximum": 100}},
                            {"name": "tag", "in": "query", "schema": {"type": "array", "items": {"type": "string"}}},
                            {"name": "X-Trace", "in": "header", "schema": {"type": "string"}}
                        ]
                    },
                    "post": {
                        "operationId": "create.pet",
                        "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewPet"}}}}
                    }
                },
                "/pets/{petId}/photos/{name}.png": {
                    "parameters": [{"name": "petId", "in": "path", "required": true, "schema": {"type": "string"}}],
                    "get": {
                        "operationId": "getPhoto",
                        "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}]
                    }
                },
                "/free": {"post": {"operationId": "free", "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object"}}}}}},
                "/tree": {"post": {"operationId": "tree", "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Node"}}}}}},
                "/either": {"post": {"operationId": "either", "requestBody": {"content": {"application/json": {"schema": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}}}},
                "/hdr": {"get": {"operationId": "hdr", "parameters": [{"name": "X-Key", "in": "header", "required": true, "schema": {"type": "string"}}]}},
                "/upload": {"put": {"operationId": "upload", "requestBody": {"required": true, "content": {"application/octet-stream": {}}}}}
            },
            "components": {"schemas": {
                "Base": {"type": "object", "properties": {"name": {"type": "string"}, "id": {"type": "integer", "readOnly": true}}, "required": ["name"]},
                "NewPet": {"allOf": [{"$ref": "#/components/schemas/Base"}, {"type": "object", "properties": {"tag": {"type": "string", "nullable": true}, "kind": {"enum": ["cat", "dog"]}}}]},
                "Node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}}}
            }}
        })
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        config: OpenApiToolsConfig,
    }

    fn fixture(operations: &[&str]) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let spec = dir.path().join("api.json");
        std::fs::write(&spec, doc().to_string()).unwrap();
        Fixture {
            _dir: dir,
            config: OpenApiToolsConfig {
                name: "pets".into(),
                spec,
                base_url: "http://127.0.0.1:9/api/".into(),
                operations: operations.iter().map(|s| (*s).to_owned()).collect(),
                bearer_token: Some("tok-secret".into()),
                bearer_token_env: None,
                allow_cidrs: vec!["127.0.0.1/32".into()],
                timeout_ms: None,
                max_response_bytes: None,
            },
        }
    }

    fn net() -> LoadNet {
        LoadNet {
            egress_allow: vec![],
            resolver: Arc::new(toolexec_net::StaticResolver::new()),
        }
    }

    async fn load_one(f: &Fixture) -> Result<Vec<Arc<dyn Tool>>, String> {
        load(&f.config, &mut BTreeSet::from(["shell".to_owned()]), &net()).await
    }

    #[tokio::test]
    async fn admitted_operations_become_typed_tools() {
        let f = fixture(&["listPets", "create.pet", "getPhoto"]);
        let tools = load_one(&f).await.unwrap();
        let names: Vec<&str> = tools.iter().map(|t| t.spec().name.as_str()).collect();
        assert_eq!(
            names,
            ["pets__listPets", "pets__create_pet", "pets__getPhoto"]
        );
        let list = tools[0].spec();
        assert!(list.read_only);
        assert_eq!(list.capabilities, vec![Capability::Network]);
        let s = &list.input_schema;
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["required"], json!([]));
        assert_eq!(s["properties"]["limit"]["type"], json!(["integer", "null"]));
        assert_eq!(s["properties"]["tag"]["items"]["type"], "string");
        assert!(
            s["properties"].get("X-Trace").is_none(),
            "optional headers are left out"
        );
        let create = tools[1].spec();
        assert!(!create.read_only);
        let body = &create.input_schema["properties"]["body"];
        assert_eq!(create.input_schema["required"], json!(["body"]));
        assert_eq!(body["required"], json!(["name"]), "{body}");
        assert!(
            body["properties"].get("id").is_none(),
            "readOnly is not sent: {body}"
        );
        assert_eq!(body["properties"]["tag"]["type"], json!(["string", "null"]));
        assert_eq!(
            body["properties"]["kind"]["enum"],
            json!(["cat", "dog", null])
        );
        assert_eq!(body["additionalProperties"], false);
        // Every schema compiles, and a strict model's nulls pass it.
        for t in &tools {
            jsonschema::draft202012::new(&t.spec().input_schema).unwrap();
        }
        let v = jsonschema::draft202012::new(&tools[0].spec().input_schema).unwrap();
        assert!(v.is_valid(&json!({"limit": null, "tag": null})));
        assert!(!v.is_valid(&json!({"limit": 101})));
        assert!(!tools[0].spec().description.contains("tok-secret"));
    }

    #[tokio::test]
    async fn what_cannot_be_typed_is_refused_at_load_with_the_reason() {
        for (op, says) in [
            ("free", "free-form object"),
            ("tree", "refers to itself"),
            ("either", "oneOf with 2 choices"),
            ("hdr", "required header parameter"),
            ("upload", "not JSON"),
            ("nope", "no operationId of the document"),
        ] {
            let f = fixture(&[op]);
            let err = load_one(&f).await.err().unwrap_or_default();
            assert!(err.contains(says), "{op}: {err}");
            assert!(err.contains("tools.openapi \"pets\""), "{err}");
        }
        let f = fixture(&[]);
        assert!(
            load_one(&f)
                .await
                .err()
                .unwrap()
                .contains("operations is empty")
        );
    }

    #[tokio::test]
    async fn the_base_url_must_be_allowed_by_the_network_policy() {
        let mut f = fixture(&["listPets"]);
        f.config.allow_cidrs.clear();
        let err = load_one(&f).await.err().unwrap();
        assert!(
            err.contains("not allowed by the network policy (loopback"),
            "{err}"
        );
        assert!(!err.contains("tok-secret"), "{err}");
        f.config.base_url = "http://169.254.169.254/latest".into();
        let err = load_one(&f).await.err().unwrap();
        assert!(err.contains("metadata"), "{err}");
        f.config.base_url = "http://localhost:8080/".into();
        f.config.allow_cidrs = vec!["127.0.0.1/32".into()];
        let err = load_one(&f).await.err().unwrap();
        assert!(err.contains("localhost"), "{err}");
        // A name is checked on what it resolves to.
        f.config.base_url = "http://internal.example:8080/".into();
        let n = LoadNet {
            egress_allow: vec![],
            resolver: Arc::new(
                toolexec_net::StaticResolver::new()
                    .with("internal.example", ["10.1.2.3".parse().unwrap()]),
            ),
        };
        let err = load(&f.config, &mut BTreeSet::new(), &n)
            .await
            .err()
            .unwrap();
        assert!(err.contains("private"), "{err}");
        f.config.allow_cidrs = vec!["10.1.2.0/24".into()];
        assert!(load(&f.config, &mut BTreeSet::new(), &n).await.is_ok());
    }

    #[tokio::test]
    async fn names_are_sanitized_and_collisions_refused() {
        let mut f = fixture(&["listPets"]);
        let mut taken = BTreeSet::from(["pets__listPets".to_owned()]);
        let err = load(&f.config, &mut taken, &net()).await.err().unwrap();
        assert!(err.contains("already taken"), "{err}");
        f.config.name = "a".repeat(60);
        let err = load_one(&f).await.err().unwrap();
        assert!(err.contains("1 to 32"), "{err}");
        f.config.name = "pets".into();
        f.config.bearer_token_env = Some("TOOLEXEC_TEST_SURELY_UNSET_VARIABLE".into());
        let err = load_one(&f).await.err().unwrap();
        assert!(err.contains("not both"), "{err}");
        f.config.bearer_token = None;
        let err = load_one(&f).await.err().unwrap();
        assert!(err.contains("is not set"), "{err}");
        assert_eq!(
            tool_name("api", "get pet/{id}").unwrap(),
            "api__get_pet__id_"
        );
    }

    #[tokio::test]
    async fn path_arguments_stay_inside_their_segment() {
        let f = fixture(&["getPhoto", "listPets"]);
        let tools = load_one(&f).await.unwrap();
        let photo = tools[0].spec().name.clone();
        let cfg = &f.config;
        let api = Arc::new(Api {
            name: "pets".into(),
            base: Url::parse(&cfg.base_url).unwrap(),
            policy: NetPolicy::public_only(),
            token: None,
            timeout: Duration::from_secs(1),
            max_response_bytes: 10,
        });
        let d = doc();
        let ops = operations(&d, &["getPhoto".to_owned(), "listPets".to_owned()]).unwrap();
        let t = OperationTool::new(photo, api.clone(), &d, &ops[0]).unwrap();
        let url = |pet: &str, name: &str| t.url(&json!({"petId": pet, "name": name}));
        assert_eq!(
            url("7", "a").unwrap().as_str(),
            "http://127.0.0.1:9/api/pets/7/photos/a.png"
        );
        assert_eq!(
            url("../../admin", "x/y?z#w%2e").unwrap().as_str(),
            "http://127.0.0.1:9/api/pets/..%2F..%2Fadmin/photos/x%2Fy%3Fz%23w%252e.png"
        );
        assert_eq!(
            url("%2e%2e", "a").unwrap().path(),
            "/api/pets/%252e%252e/photos/a.png"
        );
        for bad in ["..", ".", ""] {
            let err = url(bad, "a").unwrap_err();
            assert!(err.contains("change the path"), "{bad:?}: {err}");
        }
        let list = OperationTool::new("pets__listPets".into(), api, &d, &ops[1]).unwrap();
        assert_eq!(
            list.url(&json!({"limit": 5, "tag": ["a b", "c&d"]}))
                .unwrap()
                .as_str(),
            "http://127.0.0.1:9/api/pets?limit=5&tag=a+b&tag=c%26d"
        );
        assert_eq!(
            list.url(&json!({})).unwrap().as_str(),
            "http://127.0.0.1:9/api/pets"
        );
    }

    #[test]
    fn a_strict_models_nulls_are_not_sent() {
        let schema = json!({"type": "object", "required": ["a"], "properties": {
            "a": {"type": ["string", "null"]},
            "b": {"type": ["string", "null"]},
            "o": {"type": "object", "required": [], "properties": {"c": {"type": ["integer", "null"]}}}
        }});
        assert_eq!(
            without_absent(&json!({"a": null, "b": null, "o": {"c": null}}), &schema),
            json!({"a": null, "o": {}})
        );
    }

    /// An API on loopback that reads one request, says so, and answers `answer` after
    /// `delay` (never, for `None`).
    async fn slow_api(
        delay: Duration,
        answer: Option<&'static str>,
    ) -> (u16, tokio::sync::oneshot::Receiver<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (arrived, wait) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = vec![0; 8192];
            let _ = sock.read(&mut buf).await;
            let _ = arrived.send(());
            tokio::time::sleep(delay).await;
            match answer {
                Some(a) => {
                    let _ = sock.write_all(a.as_bytes()).await;
                }
                None => tokio::time::sleep(Duration::from_secs(60)).await,
            }
        });
        (port, wait)
    }

    fn live_ctx(dir: &tempfile::TempDir, budget: Duration) -> ToolContext {
        let ws = Arc::new(crate::Workspace::open(dir.path()).unwrap());
        let mut ctx = ToolContext::new(uuid::Uuid::now_v7(), ws);
        ctx.policy.network = toolexec_core::NetworkPolicy::Allow;
        ctx.deadline = crate::Deadline::after(budget);
        ctx
    }

    #[tokio::test]
    async fn a_write_that_went_out_is_waited_for_and_not_recorded_as_nothing_changed() {
        const CREATED: &str =
            "HTTP/1.1 201 Created\r\ncontent-length: 7\r\nconnection: close\r\n\r\ncreated";
        let ws = tempfile::tempdir().unwrap();
        // The client cancels once the POST has reached the API: its real answer is kept.
        let (port, arrived) = slow_api(Duration::from_millis(300), Some(CREATED)).await;
        let mut f = fixture(&["create.pet"]);
        f.config.base_url = format!("http://127.0.0.1:{port}/api/");
        let tools = load_one(&f).await.unwrap();
        let ctx = live_ctx(&ws, Duration::from_secs(10));
        let cancel = ctx.cancel.clone();
        tokio::spawn(async move {
            let _ = arrived.await;
            cancel.cancel();
        });
        let out =
            crate::run_within_deadline(tools[0].as_ref(), &ctx, json!({"body": {"name": "Rex"}}))
                .await;
        assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
        assert!(out.content.contains("HTTP 201 Created"), "{}", out.content);

        // An API that never answers: the call ends at its time limit saying the request went
        // out, not that nothing was changed.
        let (port, _arrived) = slow_api(Duration::ZERO, None).await;
        f.config.base_url = format!("http://127.0.0.1:{port}/api/");
        let tools = load_one(&f).await.unwrap();
        let ctx = live_ctx(&ws, Duration::from_millis(500));
        let out =
            crate::run_within_deadline(tools[0].as_ref(), &ctx, json!({"body": {"name": "Rex"}}))
                .await;
        assert_eq!(out.status, CallStatus::TimedOut, "{}", out.content);
        assert!(
            out.content.contains("the request was sent")
                && !out.content.contains("nothing was changed"),
            "{}",
            out.content
        );

        // A read that is cancelled is simply cancelled.
        let (port, arrived) = slow_api(Duration::ZERO, None).await;
        let mut f = fixture(&["listPets"]);
        f.config.base_url = format!("http://127.0.0.1:{port}/api/");
        let tools = load_one(&f).await.unwrap();
        let ctx = live_ctx(&ws, Duration::from_secs(10));
        let cancel = ctx.cancel.clone();
        tokio::spawn(async move {
            let _ = arrived.await;
            cancel.cancel();
        });
        let out = crate::run_within_deadline(tools[0].as_ref(), &ctx, json!({})).await;
        assert_eq!(out.status, CallStatus::Cancelled, "{}", out.content);

        // Past its deadline before sending, a write sends nothing.
        let ctx = live_ctx(&ws, Duration::ZERO);
        let mut f = fixture(&["create.pet"]);
        f.config.base_url = format!("http://127.0.0.1:{port}/api/");
        let tools = load_one(&f).await.unwrap();
        let out = tools[0].run(&ctx, json!({"body": {"name": "Rex"}})).await;
        assert_ne!(out.status, CallStatus::Ok, "{}", out.content);
    }

    #[test]
    fn hostile_schemas_are_refused_quickly_with_the_reason() {
        // An allOf part that comes back to itself through its own allOf.
        let err = typed_input_schema(&json!({
            "allOf": [{"$ref": "#/$defs/A"}],
            "$defs": {"A": {"allOf": [{"$ref": "#/$defs/A"}]}}
        }))
        .unwrap_err();
        assert!(err.contains("refers to itself"), "{err}");
        // The same through two definitions.
        let err = typed_input_schema(&json!({
            "allOf": [{"$ref": "#/$defs/A"}],
            "$defs": {"A": {"allOf": [{"$ref": "#/$defs/B"}]}, "B": {"allOf": [{"$ref": "#/$defs/A"}]}}
        }))
        .unwrap_err();
        assert!(err.contains("refers to itself"), "{err}");
        // 7 levels of 20 properties, each referring to the next level: ~10^9 nodes expanded.
        let mut defs = Map::new();
        for level in 0..7 {
            let next = if level == 6 {
                json!({"type": "string"})
            } else {
                json!({"$ref": format!("#/$defs/L{}", level + 1)})
            };
            let props: Map<String, Value> =
                (0..20).map(|i| (format!("p{i}"), next.clone())).collect();
            defs.insert(
                format!("L{level}"),
                json!({"type": "object", "properties": props}),
            );
        }
        let started = std::time::Instant::now();
        let err = typed_input_schema(&json!({"$ref": "#/$defs/L0", "$defs": defs})).unwrap_err();
        assert!(err.contains("more than 10000 schema nodes"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // The same through allOf parts.
        let mut defs = Map::new();
        for level in 0..7 {
            let parts: Vec<Value> = (0..20)
                .map(|i| {
                    if level == 6 {
                        json!({"type": "object", "properties": {format!("p{i}"): {"type": "string"}}})
                    } else {
                        json!({"$ref": format!("#/$defs/L{}", level + 1)})
                    }
                })
                .collect();
            defs.insert(format!("L{level}"), json!({"allOf": parts}));
        }
        let err = typed_input_schema(&json!({"allOf": [{"$ref": "#/$defs/L0"}], "$defs": defs}))
            .unwrap_err();
        assert!(err.contains("more than 10000 schema nodes"), "{err}");
    }

    #[test]
    fn an_optional_const_can_be_left_out() {
        let s = typed_input_schema(&json!({"type": "object", "properties": {
            "kind": {"type": "string", "const": "x"}}}))
        .unwrap();
        assert_eq!(s["properties"]["kind"]["enum"], json!(["x", null]));
        assert!(s["properties"]["kind"].get("const").is_none());
        let v = jsonschema::draft202012::new(&s).unwrap();
        assert!(v.is_valid(&json!({"kind": null})));
        assert!(v.is_valid(&json!({"kind": "x"})));
        assert!(!v.is_valid(&json!({"kind": "y"})));
        // Required, it stays a const.
        let s = typed_input_schema(&json!({"type": "object", "required": ["kind"],
            "properties": {"kind": {"type": "string", "const": "x"}}}))
        .unwrap();
        assert_eq!(s["properties"]["kind"]["const"], "x");
    }

    #[test]
    fn keywords_beside_a_ref_or_a_single_choice_are_kept_or_refused() {
        let defs = json!({"S": {"type": "string"}});
        for (prop, says) in [
            (
                json!({"$ref": "#/$defs/S", "maxLength": 3}),
                "\"maxLength\" beside $ref",
            ),
            (
                json!({"$ref": "#/$defs/S", "enum": ["a"]}),
                "\"enum\" beside $ref",
            ),
            (
                json!({"anyOf": [{"$ref": "#/$defs/S"}, {"type": "null"}], "maxLength": 3}),
                "\"maxLength\" beside anyOf",
            ),
            (
                json!({"oneOf": [{"type": "string"}], "enum": ["a"]}),
                "\"enum\" beside oneOf",
            ),
        ] {
            let err = typed_input_schema(&json!({"type": "object", "required": ["p"],
                "properties": {"p": prop}, "$defs": defs}))
            .unwrap_err();
            assert!(err.contains(says), "{err}");
        }
        // 3.0's nullable beside them lets null through; a description is kept.
        for prop in [
            json!({"$ref": "#/$defs/S", "nullable": true, "description": "d"}),
            json!({"oneOf": [{"$ref": "#/$defs/S"}], "nullable": true, "description": "d", "title": "t"}),
        ] {
            let s = typed_input_schema(&json!({"type": "object", "required": ["p"],
                "properties": {"p": prop}, "$defs": defs}))
            .unwrap();
            assert_eq!(
                s["properties"]["p"]["type"],
                json!(["string", "null"]),
                "{s}"
            );
            assert_eq!(s["properties"]["p"]["description"], "d");
        }
    }

    #[test]
    fn a_token_split_by_the_cut_is_masked_whole() {
        let s = Secret::new("tok-secret-123".into());
        // The cap falls inside the token: no prefix of it is shown.
        for limit in 5..20 {
            let (body, cut) = scrubbed_within(
                Bytes::from_static(b"12345tok-secret-123 and more"),
                Some(&s),
                limit,
            );
            let text = String::from_utf8_lossy(&body);
            assert!(cut, "{limit}");
            assert!(!text.contains("tok-"), "{limit}: {text}");
            if limit > 5 {
                assert_eq!(text, "12345***", "{limit}");
            }
        }
        let (body, cut) = scrubbed_within(Bytes::from_static(b"tok-secret-123"), Some(&s), 100);
        assert_eq!((body, cut), (Bytes::from_static(b"***"), false));
        // Echoed in JSON, a token with a quote or a backslash is escaped: masked too.
        let q = Secret::new(r#"t"o\k"#.into());
        let (body, _) = scrubbed_within(
            Bytes::from_static(br#"{"you_sent": "Bearer t\"o\\k"} t"o\k"#),
            Some(&q),
            100,
        );
        assert_eq!(
            body,
            Bytes::from_static(br#"{"you_sent": "Bearer ***"} ***"#)
        );
        assert_eq!(scrub_overlap(Some(&q)), 6);
        let (body, cut) = scrubbed_within(Bytes::from_static(b"abcdef"), None, 3);
        assert_eq!((body, cut), (Bytes::from_static(b"abc"), true));
    }

    #[test]
    fn a_token_echoed_by_the_api_is_scrubbed() {
        let s = Secret::new("tok-1".into());
        assert_eq!(
            scrubbed(Bytes::from_static(b"Bearer tok-1 and tok-1!"), Some(&s)),
            Bytes::from_static(b"Bearer *** and ***!")
        );
        assert_eq!(format!("{s:?}"), "***");
    }
}
