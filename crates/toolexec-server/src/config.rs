//! Configuration: defaults, then a TOML file, then `TOOLEXEC_*` environment variables.
//! Secrets (the database URL's password) never appear in `Debug` output or logs.
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::providers::{Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

#[derive(Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on. A non-loopback address needs auth (API keys or a trusted gateway).
    pub bind: String,
    /// `postgres://…` for Postgres; `sqlite:PATH` or unset for the embedded SQLite store.
    pub database_url: Option<String>,
    /// Where the SQLite file and (by default) the workspaces live.
    pub data_dir: PathBuf,
    /// Parent directory of session workspaces; default `<data_dir>/workspaces`.
    pub workspace_root: Option<PathBuf>,
    /// This instance's name in the log (default: the host name).
    pub node: Option<String>,
    /// Apply migrations at start-up.
    pub auto_migrate: bool,
    /// Postgres pool size.
    pub max_db_connections: u32,
    /// Largest request body, in bytes.
    pub body_limit_bytes: usize,
    /// When set, a trusted gateway authenticates callers and names the tenant in this header.
    pub trusted_identity_header: Option<String>,
    /// Host names (or `host:port`) the service answers for besides its own (the loopback names,
    /// the bound address, `cluster.advertise_url`): the names clients reach it by through a
    /// gateway. `*` turns the Host check off. See docs/operator.md, "Host and Origin".
    pub allowed_hosts: Vec<String>,
    /// Browser origins (`scheme://host[:port]`) whose pages may call the API besides the
    /// service's own pages. Requests without an `Origin` (agents, servers) are not affected.
    pub allowed_origins: Vec<String>,
    /// `json` (default) or `text`.
    pub log_format: String,
    /// Concurrent group-commit loops of the recorder (1: the largest batches, the least
    /// database CPU per call; docs/benchmarks.md).
    pub recorder_writers: usize,
    /// Record `invocation.started` durably before read-only tools run too (see docs/design.md).
    pub durable_start_for_read_only: bool,
    /// Per-tenant request rate (token bucket refill per second); 0 turns the limit off.
    pub rate_limit_per_second: f64,
    /// Per-tenant burst (bucket size).
    pub rate_limit_burst: f64,
    /// Lookups of API keys this node has not verified that may fail, per second and client
    /// address (token bucket refill); 0 turns the limit off.
    pub auth_failure_rate_per_second: f64,
    /// Such lookups one client address may make at once (bucket size).
    pub auth_failure_burst: f64,
    /// Addresses or networks of gateways whose `X-Forwarded-For` names the client, for the limit
    /// on failed authentication (docs/operator.md, "Auth").
    pub trusted_proxies: Vec<String>,
    /// Requests in flight beyond which new ones are shed with 503.
    pub max_concurrent_requests: usize,
    /// Requests in flight one tenant may hold on this node (429 beyond); unset: an eighth of
    /// `max_concurrent_requests`, at least 1.
    pub max_concurrent_requests_per_tenant: Option<usize>,
    /// Longest a request body may take to arrive in full, milliseconds (408 beyond).
    pub body_read_timeout_ms: u64,
    /// Longest a request's head may take to arrive, milliseconds (the connection is closed).
    pub header_read_timeout_ms: u64,
    /// Open connections beyond which new ones are closed at once.
    pub max_connections: usize,
    /// Longest a response may wait for a client that stopped reading it, milliseconds (the
    /// connection is closed).
    pub write_stall_timeout_ms: u64,
    pub limits: toolexec_engine::Limits,
    /// How `shell` commands are isolated (see docs/operator.md, "Sandbox").
    pub sandbox: toolexec_sandbox::SandboxConfig,
    /// What the web tools may do (see docs/operator.md, "Web tools"); the networks they may
    /// reach beyond the public internet are `sandbox.egress_allow_cidrs`.
    pub web: toolexec_tools::web::WebConfig,
    /// How this node works with other replicas on the same database (see docs/operator.md,
    /// "Several replicas").
    pub cluster: toolexec_engine::ClusterConfig,
    /// Tools the operator adds (see docs/operator.md, "Custom tools").
    pub tools: toolexec_tools::operator::custom::CustomToolsConfig,
    /// Where traces go (see docs/operator.md, "Traces"); off by default.
    pub telemetry: crate::telemetry::TelemetryConfig,
    /// Where blobs live: the database (default) or S3-compatible object storage (see
    /// docs/operator.md, "Blobs in object storage").
    pub blobs: toolexec_store::objects::BlobsConfig,
    /// OCI images sessions may run in (see docs/environments.md); pulled and managed with
    /// `toolexec images`, not used by sessions yet.
    pub environments: toolexec_image::EnvironmentsConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:8080".into(),
            database_url: None,
            data_dir: PathBuf::from(".toolexec"),
            workspace_root: None,
            node: None,
            auto_migrate: true,
            max_db_connections: 16,
            body_limit_bytes: toolexec_api::DEFAULT_BODY_LIMIT_BYTES,
            trusted_identity_header: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            log_format: "json".into(),
            recorder_writers: 1,
            durable_start_for_read_only: false,
            rate_limit_per_second: 1000.0,
            rate_limit_burst: 2000.0,
            auth_failure_rate_per_second: 1.0,
            auth_failure_burst: 20.0,
            trusted_proxies: Vec::new(),
            max_concurrent_requests: toolexec_api::DEFAULT_MAX_CONCURRENT_REQUESTS,
            max_concurrent_requests_per_tenant: None,
            body_read_timeout_ms: millis(toolexec_api::DEFAULT_BODY_READ_TIMEOUT),
            header_read_timeout_ms: millis(toolexec_api::DEFAULT_HEADER_READ_TIMEOUT),
            max_connections: toolexec_api::DEFAULT_MAX_CONNECTIONS,
            write_stall_timeout_ms: millis(toolexec_api::DEFAULT_WRITE_STALL_TIMEOUT),
            limits: toolexec_engine::Limits::default(),
            sandbox: toolexec_sandbox::SandboxConfig::default(),
            web: toolexec_tools::web::WebConfig::default(),
            cluster: toolexec_engine::ClusterConfig::default(),
            tools: toolexec_tools::operator::custom::CustomToolsConfig::default(),
            telemetry: crate::telemetry::TelemetryConfig::default(),
            blobs: toolexec_store::objects::BlobsConfig::default(),
            environments: toolexec_image::EnvironmentsConfig::default(),
        }
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("bind", &self.bind)
            .field(
                "database_url",
                &self.database_url.as_deref().map(redact_url),
            )
            .field("data_dir", &self.data_dir)
            .field("workspace_root", &self.workspace_root)
            .field("node", &self.node)
            .field("auto_migrate", &self.auto_migrate)
            .field("max_db_connections", &self.max_db_connections)
            .field("body_limit_bytes", &self.body_limit_bytes)
            .field("trusted_identity_header", &self.trusted_identity_header)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("allowed_origins", &self.allowed_origins)
            .field("log_format", &self.log_format)
            .field("recorder_writers", &self.recorder_writers)
            .field(
                "durable_start_for_read_only",
                &self.durable_start_for_read_only,
            )
            .field("rate_limit_per_second", &self.rate_limit_per_second)
            .field("rate_limit_burst", &self.rate_limit_burst)
            .field(
                "auth_failure_rate_per_second",
                &self.auth_failure_rate_per_second,
            )
            .field("auth_failure_burst", &self.auth_failure_burst)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("max_concurrent_requests", &self.max_concurrent_requests)
            .field(
                "max_concurrent_requests_per_tenant",
                &self.max_concurrent_requests_per_tenant,
            )
            .field("body_read_timeout_ms", &self.body_read_timeout_ms)
            .field("header_read_timeout_ms", &self.header_read_timeout_ms)
            .field("max_connections", &self.max_connections)
            .field("write_stall_timeout_ms", &self.write_stall_timeout_ms)
            .field("limits", &self.limits)
            .field("sandbox", &self.sandbox)
            .field("web", &self.web)
            .field("cluster", &self.cluster)
            .field("telemetry", &self.telemetry)
            .field("blobs", &self.blobs)
            .field("tools", &self.tools)
            .field("environments", &self.environments)
            .finish()
    }
}

/// Where the value of a setting came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Default,
    File(PathBuf),
    /// The variable's name.
    Env(String),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(p) => write!(f, "file {}", p.display()),
            Source::Env(v) => write!(f, "environment {v}"),
        }
    }
}

/// A configuration and where each of its settings came from.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: Config,
    /// Every setting's key (`bind`, `limits.max_blob_bytes`, …) and its source.
    pub sources: BTreeMap<String, Source>,
}

/// The prefix of the environment variables that set configuration keys.
pub const ENV_PREFIX: &str = "TOOLEXEC_";

/// `TOOLEXEC_*` variables that are not settings and are left alone: `TOOLEXEC_CONFIG` (the
/// file to read), the service-link variables Kubernetes defines for a Service named `toolexec`
/// (`TOOLEXEC_SERVICE_HOST`, `TOOLEXEC_PORT_8080_TCP_ADDR`, …), and the variables of this
/// repository's own build, test, fuzz and bench tooling (`TOOLEXEC_TEST_*`, `TOOLEXEC_FUZZ_*`,
/// `TOOLEXEC_BENCH_*`, `TOOLEXEC_STATIC_INIT*`), which a service started from a test inherits.
/// Any other variable with the prefix must name a setting: a typo is an error, not a default
/// silently kept.
fn is_foreign_variable(rest: &str) -> bool {
    const TOOLING: [&str; 4] = ["TEST_", "FUZZ_", "BENCH_", "STATIC_INIT"];
    if rest == "CONFIG"
        || rest == "PORT"
        || rest.starts_with("SERVICE_")
        || TOOLING.iter().any(|t| rest.starts_with(t))
    {
        return true;
    }
    // PORT_<number>_<TCP|UDP|SCTP>[_PROTO|_PORT|_ADDR]
    let mut parts = rest.split('_');
    parts.next() == Some("PORT")
        && parts
            .next()
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        && parts
            .next()
            .is_some_and(|p| ["TCP", "UDP", "SCTP"].contains(&p))
        && parts
            .next()
            .is_none_or(|f| ["PROTO", "PORT", "ADDR"].contains(&f))
        && parts.next().is_none()
}

/// The default configuration as JSON: every field serializes (unset options as null).
fn defaults_json() -> serde_json::Value {
    serde_json::to_value(Config::default()).unwrap_or_default()
}

/// The value at a dotted key of a JSON object.
fn at_key<'a>(root: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    key.split('.').try_fold(root, |v, part| v.get(part))
}

/// Every setting's key: the leaves of the default configuration, nested tables joined by `.`.
pub fn setting_keys() -> BTreeSet<String> {
    fn walk(prefix: &str, value: &serde_json::Value, out: &mut BTreeSet<String>) {
        match value {
            serde_json::Value::Object(fields) => {
                for (name, v) in fields {
                    let key = if prefix.is_empty() {
                        name.clone()
                    } else {
                        format!("{prefix}.{name}")
                    };
                    walk(&key, v, out);
                }
            }
            _ => {
                out.insert(prefix.to_owned());
            }
        }
    }
    let mut keys = BTreeSet::new();
    walk("", &defaults_json(), &mut keys);
    keys
}

/// `LIMITS__MAX_BLOB_BYTES` (the prefix stripped) → `limits.max_blob_bytes`.
fn env_key(rest: &str) -> String {
    rest.to_ascii_lowercase().replace("__", ".")
}

/// `limits.max_blob_bytes` → `TOOLEXEC_LIMITS__MAX_BLOB_BYTES`.
pub fn env_name(key: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        key.to_ascii_uppercase().replace('.', "__")
    )
}

/// Settings that were renamed: the old key, and what to write instead. Named in the error a
/// file or variable that still uses the old key gets (rather than "unknown field").
const MOVED: &[(&str, &str)] = &[
    (
        "mcp.allowed_hosts",
        "allowed_hosts (TOOLEXEC_ALLOWED_HOSTS): the Host check covers every route now, not only MCP",
    ),
    (
        "mcp.allowed_origins",
        "allowed_origins (TOOLEXEC_ALLOWED_ORIGINS): the Origin check covers every route now, not only MCP",
    ),
];

/// Fails on a setting that was renamed, saying what it is now.
fn check_moved<'a>(keys: impl Iterator<Item = (&'a str, String)>) -> anyhow::Result<()> {
    for (key, source) in keys {
        if let Some((old, new)) = MOVED.iter().find(|(old, _)| *old == key) {
            anyhow::bail!("{source} sets {old}, which is now {new}");
        }
        if key == "mcp" || key.starts_with("mcp.") {
            anyhow::bail!(
                "{source} sets {key}: the [mcp] settings are now allowed_hosts and allowed_origins, at the top level (docs/operator.md, \"Host and Origin\")"
            );
        }
    }
    Ok(())
}

/// The settings the environment sets: `(key, variable, value)`. Fails on a `TOOLEXEC_*`
/// variable that names no setting, saying which setting it probably meant.
fn settings_from_env(
    vars: impl Iterator<Item = (String, String)>,
    keys: &BTreeSet<String>,
) -> anyhow::Result<Vec<(String, String, String)>> {
    let mut found = Vec::new();
    let mut unknown = Vec::new();
    for (var, value) in vars {
        let Some(rest) = var.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if is_foreign_variable(rest) {
            continue;
        }
        let key = env_key(rest);
        check_moved(std::iter::once((
            key.as_str(),
            format!("the variable {var}"),
        )))?;
        if keys.contains(&key) {
            found.push((key, var, value));
        } else {
            let hint = keys
                .iter()
                .map(|k| (strsim::jaro_winkler(k, &key), k))
                .filter(|(score, _)| *score > 0.85)
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, k)| format!(" (did you mean {}?)", env_name(k)))
                .unwrap_or_default();
            unknown.push(format!("{var}{hint}"));
        }
    }
    if !unknown.is_empty() {
        unknown.sort();
        anyhow::bail!(
            "{} no setting: {}. Every TOOLEXEC_* variable must name a key of docs/operator.md (nested keys with `__`, e.g. TOOLEXEC_LIMITS__MAX_BLOB_BYTES); only TOOLEXEC_CONFIG and Kubernetes service-link variables are ignored",
            if unknown.len() == 1 {
                "this variable names"
            } else {
                "these variables name"
            },
            unknown.join(", ")
        );
    }
    Ok(found)
}

/// An environment variable's text as the type the setting has (the type of its default):
/// strings stay strings (`TOOLEXEC_NODE=42` is the name "42"), numbers and booleans are parsed,
/// lists are a JSON array or comma-separated.
fn env_value(key: &str, var: &str, text: &str) -> anyhow::Result<serde_json::Value> {
    use serde_json::Value;
    let defaults = defaults_json();
    let wrong = |what: &str| anyhow::anyhow!("{var}: expected {what}, got {text:?}");
    Ok(match at_key(&defaults, key) {
        Some(Value::Bool(_)) => match text.trim() {
            "true" | "1" => Value::Bool(true),
            "false" | "0" => Value::Bool(false),
            _ => return Err(wrong("true or false")),
        },
        Some(Value::Number(n)) if n.is_f64() => {
            Value::from(text.trim().parse::<f64>().map_err(|_| wrong("a number"))?)
        }
        Some(Value::Number(_)) => Value::from(
            text.trim()
                .parse::<u64>()
                .map_err(|_| wrong("a whole number"))?,
        ),
        Some(Value::Array(_)) => {
            if text.trim_start().starts_with('[') {
                serde_json::from_str(text).map_err(|_| wrong("a JSON array"))?
            } else {
                Value::Array(
                    text.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(|s| Value::String(s.to_owned()))
                        .collect(),
                )
            }
        }
        // An unset option has no default to take the type from: the first reading of the text
        // that the setting accepts (a string, else a number, a boolean, JSON).
        None | Some(Value::Null) => {
            let trimmed = text.trim();
            let candidates = [
                Some(Value::String(text.to_owned())),
                trimmed.parse::<u64>().ok().map(Value::from),
                trimmed.parse::<f64>().ok().map(Value::from),
                match trimmed {
                    "true" => Some(Value::Bool(true)),
                    "false" => Some(Value::Bool(false)),
                    _ => None,
                },
                serde_json::from_str(trimmed).ok(),
            ];
            candidates
                .into_iter()
                .flatten()
                .find(|v| accepts(key, v.clone()))
                .ok_or_else(|| wrong("a value of the setting's type"))?
        }
        Some(_) => Value::String(text.to_owned()),
    })
}

/// Whether the configuration takes `value` at `key` (the rest left at the defaults).
fn accepts(key: &str, value: serde_json::Value) -> bool {
    let mut overrides = serde_json::Map::new();
    insert_at(&mut overrides, key, value);
    Figment::from(Serialized::defaults(Config::default()))
        .merge(Serialized::defaults(serde_json::Value::Object(overrides)))
        .extract::<Config>()
        .is_ok()
}

/// A nested JSON object with `value` at the dotted `key`.
fn insert_at(
    root: &mut serde_json::Map<String, serde_json::Value>,
    key: &str,
    value: serde_json::Value,
) {
    match key.split_once('.') {
        None => {
            root.insert(key.to_owned(), value);
        }
        Some((head, rest)) => {
            let child = root
                .entry(head.to_owned())
                .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
            if let serde_json::Value::Object(map) = child {
                insert_at(map, rest, value);
            }
        }
    }
}

/// The leaf keys of a provider's data (what a file sets).
fn provided_keys(provider: &impl figment::Provider) -> BTreeSet<String> {
    fn walk(prefix: &str, dict: &figment::value::Dict, out: &mut BTreeSet<String>) {
        for (name, value) in dict {
            let key = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            match value {
                figment::value::Value::Dict(_, inner) => walk(&key, inner, out),
                _ => {
                    out.insert(key);
                }
            }
        }
    }
    let mut keys = BTreeSet::new();
    if let Ok(data) = provider.data() {
        for dict in data.values() {
            walk("", dict, &mut keys);
        }
    }
    keys
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`, and the password given as a
/// query parameter (`?password=…`, `sslpassword=…`, which libpq and sqlx also take) likewise.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    // The userinfo ends at the last '@' before the path (a password may itself hold '@').
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let mut out = match rest[..authority_end].rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{}", &rest[authority_end..]),
            None => format!("{scheme}://{rest}"),
        },
        None => format!("{scheme}://{rest}"),
    };
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _))
                    if k.eq_ignore_ascii_case("password")
                        || k.eq_ignore_ascii_case("sslpassword") =>
                {
                    format!("{k}=***")
                }
                _ => p.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

impl Config {
    /// Defaults ← file ← `TOOLEXEC_*` environment (see [`Config::load_from`]).
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        Ok(Self::load_with_sources(file)?.config)
    }

    /// [`Config::load_from`] with this process's environment.
    pub fn load_with_sources(file: Option<&Path>) -> anyhow::Result<Loaded> {
        Self::load_from(
            file,
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
    }

    /// Defaults, then the file (`file`, else `./toolexec.toml` if it exists), then the
    /// `TOOLEXEC_*` variables of `env` (`TOOLEXEC_LIMITS__MAX_BLOB_BYTES` for nested keys). An
    /// unknown key in the file or the environment is an error that names it.
    pub fn load_from(
        file: Option<&Path>,
        env: impl Iterator<Item = (String, String)>,
    ) -> anyhow::Result<Loaded> {
        let keys = setting_keys();
        let from_env = settings_from_env(env, &keys)?;
        let path = match file {
            Some(p) => Some(p.to_path_buf()),
            None => Some(PathBuf::from("toolexec.toml")).filter(|p| p.is_file()),
        };
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        let mut from_file = BTreeSet::new();
        if let Some(p) = &path {
            let toml = Toml::file_exact(p);
            from_file = provided_keys(&toml);
            check_moved(
                from_file
                    .iter()
                    .map(|k| (k.as_str(), format!("the file {}", p.display()))),
            )?;
            fig = fig.merge(toml);
        }
        let mut overrides = serde_json::Map::new();
        for (key, var, text) in &from_env {
            insert_at(&mut overrides, key, env_value(key, var, text)?);
        }
        fig = fig.merge(Serialized::defaults(serde_json::Value::Object(overrides)));
        let config: Config = fig.extract().map_err(|e| {
            // Figment names the key; say which variable set it when one did.
            let mut text = e.to_string();
            for (key, var, _) in &from_env {
                if text.contains(key.as_str()) {
                    text.push_str(&format!(" (set by {var})"));
                }
            }
            anyhow::anyhow!(text)
        })?;
        let sources = keys
            .into_iter()
            .map(|key| {
                let source = match (from_env.iter().find(|(k, ..)| *k == key), &path) {
                    (Some((_, var, _)), _) => Source::Env(var.clone()),
                    (None, Some(p)) if from_file.contains(&key) => Source::File(p.clone()),
                    _ => Source::Default,
                };
                (key, source)
            })
            .collect();
        Ok(Loaded { config, sources })
    }

    /// The effective configuration, one `key = value  # source` line per setting (TOML values;
    /// the database password redacted), for `toolexec config`.
    pub fn describe(loaded: &Loaded) -> String {
        let values = serde_json::to_value(&loaded.config).unwrap_or_default();
        let mut out = String::new();
        for (key, source) in &loaded.sources {
            let mut value = at_key(&values, key).cloned().unwrap_or_default();
            if key == "database_url"
                && let serde_json::Value::String(url) = &value
            {
                value = serde_json::Value::String(redact_url(url));
            }
            let secret = key == "web.summarizer_api_key"
                || key == "web.search_api_key"
                || toolexec_store::objects::SECRET_KEYS.contains(&key.as_str());
            if secret && !value.is_null() {
                value = serde_json::Value::String("***".to_owned());
            }
            // Registry passwords (`environments.credentials`): the registry and user only.
            if let serde_json::Value::Array(entries) = &mut value
                && key == "environments.credentials"
            {
                for entry in entries {
                    if let Some(password) = entry.get_mut("password")
                        && !password.is_null()
                    {
                        *password = serde_json::Value::String("***".to_owned());
                    }
                }
            }
            // The operator APIs' and MCP servers' tokens (`tools.openapi`, `tools.mcp`).
            if let serde_json::Value::Array(entries) = &mut value
                && key.starts_with("tools.")
            {
                for entry in entries {
                    if let Some(token) = entry.get_mut("bearer_token")
                        && !token.is_null()
                    {
                        *token = serde_json::Value::String("***".to_owned());
                    }
                    // A command tool's fixed variables may hold a token: names only.
                    if let Some(serde_json::Value::Object(env)) = entry.get_mut("env") {
                        for value in env.values_mut() {
                            *value = serde_json::Value::String("***".to_owned());
                        }
                    }
                }
            }
            let shown = match &value {
                serde_json::Value::Null => "(unset)".to_owned(),
                v => v.to_string(),
            };
            out.push_str(&format!("{key} = {shown}  # {source}\n"));
        }
        out
    }

    pub fn bind_addr(&self) -> anyhow::Result<SocketAddr> {
        self.bind
            .parse()
            .map_err(|e| anyhow::anyhow!("bind '{}' is not an address: {e}", self.bind))
    }

    pub fn workspace_root(&self) -> PathBuf {
        self.workspace_root
            .clone()
            .unwrap_or_else(|| self.data_dir.join("workspaces"))
    }

    pub fn node(&self) -> String {
        self.node.clone().unwrap_or_else(|| {
            std::env::var("HOSTNAME")
                .ok()
                .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "local".into())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env(vars: &[(&str, &str)]) -> impl Iterator<Item = (String, String)> {
        vars.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn every_setting_has_a_key_and_nested_ones_use_dots() {
        let keys = setting_keys();
        for k in [
            "bind",
            "database_url",
            "node",
            "limits.max_blob_bytes",
            "sandbox.max_background",
            "sandbox.ro_binds",
        ] {
            assert!(keys.contains(k), "{k}");
        }
        assert!(!keys.contains("limits") && !keys.contains("sandbox"));
    }

    #[test]
    fn variables_set_settings_with_their_types() {
        let loaded = Config::load_from(
            None,
            env(&[
                ("TOOLEXEC_BIND", "127.0.0.1:9000"),
                ("TOOLEXEC_DATABASE_URL", "postgres://app:pw@db/x"),
                ("TOOLEXEC_NODE", "42"),
                ("TOOLEXEC_SANDBOX__MAX_BACKGROUND", "3"),
                ("TOOLEXEC_SANDBOX__CPU_CORES", "0.5"),
                ("TOOLEXEC_SANDBOX__EGRESS", "false"),
                ("TOOLEXEC_SANDBOX__RO_BINDS", "/etc, /opt/tools"),
                ("TOOLEXEC_LIMITS__MAX_BLOB_BYTES", "1024"),
                ("PATH", "/bin"),
            ]),
        )
        .unwrap();
        let c = &loaded.config;
        assert_eq!(c.bind, "127.0.0.1:9000");
        assert_eq!(c.database_url.as_deref(), Some("postgres://app:pw@db/x"));
        assert_eq!(c.node.as_deref(), Some("42"));
        assert_eq!(c.sandbox.max_background, 3);
        assert_eq!(c.sandbox.cpu_cores, 0.5);
        assert!(!c.sandbox.egress);
        assert_eq!(
            c.sandbox.ro_binds,
            vec![PathBuf::from("/etc"), PathBuf::from("/opt/tools")]
        );
        assert_eq!(c.limits.max_blob_bytes, 1024);
        assert_eq!(loaded.sources["bind"], Source::Env("TOOLEXEC_BIND".into()));
        assert_eq!(loaded.sources["log_format"], Source::Default);
        let shown = Config::describe(&loaded);
        assert!(
            shown.contains(
                "database_url = \"postgres://app:***@db/x\"  # environment TOOLEXEC_DATABASE_URL"
            ),
            "{shown}"
        );
        assert!(!shown.contains("pw@"), "{shown}");
    }

    #[test]
    fn a_misspelled_variable_is_an_error_that_names_it_and_the_likely_setting() {
        let err = Config::load_from(None, env(&[("TOOLEXEC_BNID", "127.0.0.1:1")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("TOOLEXEC_BNID"), "{err}");
        assert!(err.contains("did you mean TOOLEXEC_BIND"), "{err}");
        let err = Config::load_from(None, env(&[("TOOLEXEC_SANDBOX__MAX_BAKGROUND", "1")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("TOOLEXEC_SANDBOX__MAX_BACKGROUND"), "{err}");
        let err = Config::load_from(None, env(&[("TOOLEXEC_LIMITS__MAX_BLOB_BYTES", "lots")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("TOOLEXEC_LIMITS__MAX_BLOB_BYTES"), "{err}");
    }

    #[test]
    fn the_mcp_host_and_origin_settings_are_refused_with_their_new_names() {
        let err = Config::load_from(None, env(&[("TOOLEXEC_MCP__ALLOWED_HOSTS", "a.example")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("TOOLEXEC_ALLOWED_HOSTS"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(&file, "[mcp]\nallowed_origins = [\"https://a.example\"]\n").unwrap();
        let err = Config::load_from(Some(&file), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("allowed_origins (TOOLEXEC_ALLOWED_ORIGINS)"),
            "{err}"
        );
        let loaded = Config::load_from(
            None,
            env(&[
                (
                    "TOOLEXEC_ALLOWED_HOSTS",
                    "tools.example.com, gw.example.com:443",
                ),
                ("TOOLEXEC_ALLOWED_ORIGINS", "https://app.example.com"),
            ]),
        )
        .unwrap();
        assert_eq!(
            loaded.config.allowed_hosts,
            ["tools.example.com", "gw.example.com:443"]
        );
        assert_eq!(loaded.config.allowed_origins, ["https://app.example.com"]);
    }

    #[test]
    fn the_config_file_and_service_links_are_not_settings() {
        let loaded = Config::load_from(
            None,
            env(&[
                ("TOOLEXEC_CONFIG", "/etc/toolexec/toolexec.toml"),
                ("TOOLEXEC_SERVICE_HOST", "10.0.0.1"),
                ("TOOLEXEC_SERVICE_PORT", "8080"),
                ("TOOLEXEC_SERVICE_PORT_HTTP", "8080"),
                ("TOOLEXEC_PORT", "tcp://10.0.0.1:8080"),
                ("TOOLEXEC_PORT_8080_TCP", "tcp://10.0.0.1:8080"),
                ("TOOLEXEC_PORT_8080_TCP_ADDR", "10.0.0.1"),
            ]),
        );
        assert!(loaded.is_ok(), "{:?}", loaded.err());
        assert!(is_foreign_variable("PORT_8080_TCP_PROTO"));
        assert!(is_foreign_variable("TEST_DATABASE_URL"));
        assert!(!is_foreign_variable("PORT_EIGHTY_TCP"));
        assert!(!is_foreign_variable("BIND"));
    }

    /// A value for a setting whose default is unset, one per such key: a new optional setting
    /// must be added here, so that it too is shown to work from the environment.
    fn sample_for_unset(key: &str) -> Option<(&'static str, serde_json::Value)> {
        Some(match key {
            "database_url" => ("postgres://app@db/x", json!("postgres://app@db/x")),
            "workspace_root" => ("/srv/ws", json!("/srv/ws")),
            "node" => ("7", json!("7")),
            "trusted_identity_header" => ("x-tenant", json!("x-tenant")),
            "max_concurrent_requests_per_tenant" => ("32", json!(32)),
            "limits.max_inotify_instances" => ("64", json!(64)),
            "limits.max_inotify_watches" => ("5000", json!(5000)),
            "sandbox.init" => ("/usr/libexec/init", json!("/usr/libexec/init")),
            "web.summarizer_url" => ("http://llm:8000/v1", json!("http://llm:8000/v1")),
            "web.summarizer_model" => ("qwen3", json!("qwen3")),
            "web.summarizer_api_key" => ("sk-test", json!("sk-test")),
            "web.search_provider" => ("searxng", json!("searxng")),
            "web.search_url" => ("http://searx:8888", json!("http://searx:8888")),
            "web.search_api_key" => ("bsk-test", json!("bsk-test")),
            "cluster.advertise_url" => ("http://ts-0.ts:8080", json!("http://ts-0.ts:8080")),
            "tools.dir" => ("/etc/toolexec/tools", json!("/etc/toolexec/tools")),
            "telemetry.otlp_endpoint" => ("http://otel:4318", json!("http://otel:4318")),
            "blobs.s3_endpoint" => ("http://127.0.0.1:9000", json!("http://127.0.0.1:9000")),
            "blobs.s3_bucket" => ("toolexec-blobs", json!("toolexec-blobs")),
            "blobs.s3_region" => ("eu-west-1", json!("eu-west-1")),
            "blobs.s3_access_key_id" => ("AKIDEXAMPLE", json!("AKIDEXAMPLE")),
            "blobs.s3_secret_access_key" => ("s3-secret", json!("s3-secret")),
            "blobs.s3_session_token" => ("s3-token", json!("s3-token")),
            "environments.default" => ("py312", json!("py312")),
            _ => return None,
        })
    }

    #[test]
    fn environments_are_set_by_the_file_and_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("toolexec.toml");
        std::fs::write(
            &file,
            "[[environments.images]]\nname = \"py312\"\nimage = \"registry.local:5000/py:3.12\"\n\n\
             [environments]\ndefault = \"py312\"\n",
        )
        .unwrap();
        let loaded = Config::load_from(
            Some(&file),
            env(&[
                (
                    "TOOLEXEC_ENVIRONMENTS__ALLOW_REGISTRIES",
                    "ghcr.io, registry.local:5000",
                ),
                (
                    "TOOLEXEC_ENVIRONMENTS__INSECURE_REGISTRIES",
                    "registry.local:5000",
                ),
                ("TOOLEXEC_LIMITS__MAX_IMAGE_BYTES", "1048576"),
            ]),
        )
        .unwrap();
        let e = &loaded.config.environments;
        assert_eq!(e.images[0].name, "py312");
        assert_eq!(e.default.as_deref(), Some("py312"));
        assert_eq!(e.allow_registries, ["ghcr.io", "registry.local:5000"]);
        assert_eq!(e.insecure_registries, ["registry.local:5000"]);
        assert_eq!(loaded.config.limits.max_image_bytes, 1_048_576);
        e.validate().unwrap();
        assert_eq!(e.resolve("py312").unwrap(), "registry.local:5000/py:3.12");
        assert!(e.resolve("docker.io/library/python:3").is_err());
        let err = Config::load_from(
            None,
            env(&[("TOOLEXEC_ENVIRONMENTS__ALOW_REGISTRIES", "x")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("TOOLEXEC_ENVIRONMENTS__ALLOW_REGISTRIES"),
            "{err}"
        );
    }

    #[test]
    fn registry_credentials_come_from_the_environment_and_are_never_shown() {
        let loaded = Config::load_from(
            None,
            env(&[(
                "TOOLEXEC_ENVIRONMENTS__CREDENTIALS",
                r#"[{"registry":"registry.local:5000","username":"alice","password":"s3cr3t-pw"},
                    {"registry":"ghcr.io","username":"bot","password_file":"/run/secrets/ghcr"}]"#,
            )]),
        )
        .unwrap();
        let e = &loaded.config.environments;
        e.validate().unwrap();
        let c = e.credential("registry.local:5000").unwrap();
        assert_eq!(c.password().unwrap(), "s3cr3t-pw");
        assert_eq!(
            e.credential("ghcr.io").unwrap().password_file.as_deref(),
            Some(Path::new("/run/secrets/ghcr"))
        );
        let shown = Config::describe(&loaded);
        assert!(!shown.contains("s3cr3t-pw"), "{shown}");
        assert!(shown.contains("alice"), "{shown}");
        assert!(shown.contains("/run/secrets/ghcr"), "{shown}");
        let debug = format!("{:?}", loaded.config);
        assert!(!debug.contains("s3cr3t-pw"), "{debug}");
        // One of password and password_file.
        let both = Config::load_from(
            None,
            env(&[(
                "TOOLEXEC_ENVIRONMENTS__CREDENTIALS",
                r#"[{"registry":"r.local","username":"a","password":"x","password_file":"/f"}]"#,
            )]),
        )
        .unwrap();
        assert!(both.config.environments.validate().is_err());
    }

    #[test]
    fn every_setting_can_be_set_from_the_environment() {
        let defaults = defaults_json();
        for key in setting_keys() {
            let (text, expected) = match at_key(&defaults, &key).cloned().unwrap_or_default() {
                serde_json::Value::Null => sample_for_unset(&key)
                    .map(|(t, v)| (t.to_owned(), v))
                    .unwrap_or_else(|| panic!("{key}: add a sample to sample_for_unset")),
                serde_json::Value::Bool(b) => ((!b).to_string(), json!(!b)),
                serde_json::Value::Number(n) if n.is_f64() => {
                    let v = n.as_f64().unwrap() + 1.5;
                    (v.to_string(), json!(v))
                }
                serde_json::Value::Number(n) => {
                    let v = n.as_u64().unwrap() + 1;
                    (v.to_string(), json!(v))
                }
                serde_json::Value::Array(_) if key == "tools.command" => {
                    // An array of tables: JSON in the variable.
                    let v = json!([{"name": "t", "description": "d", "entrypoint": "t.sh",
                        "input_schema": {"type": "object"}, "read_only": false,
                        "timeout_ms": null, "env": {"MODE": "strict"}, "env_passthrough": [],
                        "max_output_chars": null}]);
                    (v.to_string(), v)
                }
                serde_json::Value::Array(_) if key == "tools.openapi" => {
                    let v = json!([{"name": "pets", "spec": "/etc/toolexec/pets.json",
                        "base_url": "https://pets.example/v1", "operations": ["listPets"],
                        "bearer_token": null, "bearer_token_env": "PETS_TOKEN",
                        "allow_cidrs": [], "timeout_ms": null, "max_response_bytes": null}]);
                    (v.to_string(), v)
                }
                serde_json::Value::Array(_) if key == "tools.mcp" => {
                    let v = json!([{"name": "docs", "url": "https://mcp.example/mcp",
                        "bearer_token": null, "bearer_token_env": "DOCS_MCP_TOKEN",
                        "tools": ["search"], "allow_cidrs": [], "timeout_ms": 20000}]);
                    (v.to_string(), v)
                }
                serde_json::Value::Array(_) if key == "environments.credentials" => {
                    let v = json!([{"registry": "registry.local:5000", "username": "bot",
                        "password_file": "/run/secrets/registry"}]);
                    (v.to_string(), v)
                }
                serde_json::Value::Array(_) if key == "environments.images" => {
                    let v = json!([{"name": "py312", "image": "registry.local:5000/py:3.12"}]);
                    (v.to_string(), v)
                }
                serde_json::Value::Array(_) => {
                    ("/opt/a,/opt/b".into(), json!(["/opt/a", "/opt/b"]))
                }
                serde_json::Value::String(s) => {
                    // A string setting with a fixed set of values: the other documented one.
                    let v = match key.as_str() {
                        "log_format" => "text".to_owned(),
                        "sandbox.mode" => "unsandboxed".to_owned(),
                        "bind" => "127.0.0.1:9999".to_owned(),
                        "blobs.backend" => "s3".to_owned(),
                        _ => format!("{s}-x"),
                    };
                    (v.clone(), json!(v))
                }
                other => panic!("{key}: unexpected default {other}"),
            };
            let var = env_name(&key);
            let loaded = Config::load_from(None, env(&[(var.as_str(), text.as_str())]))
                .unwrap_or_else(|e| panic!("{var}={text}: {e}"));
            let got = serde_json::to_value(&loaded.config).unwrap();
            assert_eq!(at_key(&got, &key), Some(&expected), "{var}={text}");
            assert_eq!(loaded.sources[&key], Source::Env(var.clone()), "{var}");
        }
    }

    /// The Kubernetes example (deploy/k8s) as the binary would see it: the ConfigMap's
    /// `toolexec.toml` with every `TOOLEXEC_*` variable the StatefulSet sets (or shows,
    /// commented out) on top. A key renamed here without the manifests following fails this.
    #[test]
    fn the_kubernetes_manifests_configure_the_service() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/k8s");
        let configmap = std::fs::read_to_string(root.join("11-configmap.yaml")).unwrap();
        let mut lines = configmap
            .lines()
            .skip_while(|l| l.trim() != "toolexec.toml: |");
        lines.next();
        let toml: String = lines
            .take_while(|l| l.is_empty() || l.starts_with("    "))
            .map(|l| format!("{}\n", l.get(4..).unwrap_or("")))
            .collect();
        assert!(
            toml.contains("bind = "),
            "no toolexec.toml in the ConfigMap"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("toolexec.toml");
        std::fs::write(&file, &toml).unwrap();

        let statefulset = std::fs::read_to_string(root.join("31-statefulset.yaml")).unwrap();
        let names: BTreeSet<&str> = statefulset
            .lines()
            .filter_map(|l| l.trim().trim_start_matches("# ").strip_prefix("- name: "))
            .filter(|n| n.starts_with(ENV_PREFIX))
            .collect();
        for want in [
            "TOOLEXEC_NODE",
            "TOOLEXEC_CLUSTER__ADVERTISE_URL",
            "TOOLEXEC_TELEMETRY__OTLP_ENDPOINT",
        ] {
            assert!(
                names.contains(want),
                "{want} not in the StatefulSet: {names:?}"
            );
        }
        let values = |name: &str| match name {
            "TOOLEXEC_NODE" => "toolexec-1",
            "TOOLEXEC_CLUSTER__ADVERTISE_URL" => "http://10.1.2.3:8080",
            "TOOLEXEC_TELEMETRY__OTLP_ENDPOINT" => "http://otel-collector:4318",
            _ => "1",
        };
        let vars: Vec<(&str, &str)> = names.iter().map(|n| (*n, values(n))).collect();
        let loaded = Config::load_from(Some(&file), env(&vars))
            .unwrap_or_else(|e| panic!("the Kubernetes configuration does not load: {e:#}"));
        let c = &loaded.config;
        assert_eq!(c.bind, "0.0.0.0:8080");
        assert!(!c.auto_migrate);
        assert_eq!(c.node.as_deref(), Some("toolexec-1"));
        assert_eq!(
            c.cluster.advertise_url.as_deref(),
            Some("http://10.1.2.3:8080")
        );
        assert_eq!(
            c.telemetry.otlp_endpoint.as_deref(),
            Some("http://otel-collector:4318")
        );
        assert_eq!(loaded.sources["recorder_writers"], Source::File(file));
    }

    #[test]
    fn a_password_in_the_query_string_is_redacted_too() {
        for (url, shown) in [
            (
                "postgres://app@db/x?password=hunter2&sslmode=disable",
                "postgres://app@db/x?password=***&sslmode=disable",
            ),
            (
                "postgres://app:p@ss@db:5432/x",
                "postgres://app:***@db:5432/x",
            ),
            (
                "postgres://db/x?sslpassword=k",
                "postgres://db/x?sslpassword=***",
            ),
            ("sqlite:.toolexec/db.sqlite", "sqlite:.toolexec/db.sqlite"),
        ] {
            assert_eq!(redact_url(url), shown);
        }
    }

    #[test]
    fn the_summarizer_and_search_api_keys_are_never_shown() {
        let loaded = Config::load_from(
            None,
            env(&[
                ("TOOLEXEC_WEB__SUMMARIZER_API_KEY", "sk-secret-1"),
                ("TOOLEXEC_WEB__SEARCH_API_KEY", "bsk-secret-2"),
            ]),
        )
        .unwrap();
        assert_eq!(
            loaded.config.web.summarizer_api_key.as_deref(),
            Some("sk-secret-1")
        );
        assert_eq!(
            loaded.config.web.search_api_key.as_deref(),
            Some("bsk-secret-2")
        );
        let described = Config::describe(&loaded);
        for key in ["web.summarizer_api_key", "web.search_api_key"] {
            assert!(
                described.contains(&format!("{key} = \"***\"")),
                "{described}"
            );
        }
        for shown in [described, format!("{:?}", loaded.config)] {
            assert!(!shown.contains("sk-secret-1"), "{shown}");
            assert!(!shown.contains("bsk-secret-2"), "{shown}");
        }
    }

    #[test]
    fn the_tokens_of_operator_apis_are_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(
            &file,
            "[[tools.openapi]]\nname = \"pets\"\nspec = \"/x.json\"\nbase_url = \"https://p.example\"\noperations = [\"a\"]\nbearer_token = \"pets-secret-6\"\n\n[[tools.command]]\nname = \"lint\"\ndescription = \"d\"\nentrypoint = \"lint.sh\"\ninput_schema = { type = \"object\" }\nenv = { LINT_TOKEN = \"lint-secret-7\" }\n",
        )
        .unwrap();
        let loaded = Config::load_from(Some(&file), env(&[])).unwrap();
        assert_eq!(
            loaded.config.tools.openapi[0].bearer_token.as_deref(),
            Some("pets-secret-6")
        );
        let described = Config::describe(&loaded);
        assert!(
            described.contains("\"bearer_token\":\"***\""),
            "{described}"
        );
        assert!(
            described.contains("\"env\":{\"LINT_TOKEN\":\"***\"}"),
            "{described}"
        );
        for shown in [described, format!("{:?}", loaded.config)] {
            assert!(!shown.contains("pets-secret-6"), "{shown}");
            assert!(!shown.contains("lint-secret-7"), "{shown}");
        }
    }

    #[test]
    fn the_object_store_credentials_are_never_shown() {
        let loaded = Config::load_from(
            None,
            env(&[
                ("TOOLEXEC_BLOBS__BACKEND", "s3"),
                ("TOOLEXEC_BLOBS__S3_ACCESS_KEY_ID", "AKID-secret-3"),
                ("TOOLEXEC_BLOBS__S3_SECRET_ACCESS_KEY", "s3-secret-4"),
                ("TOOLEXEC_BLOBS__S3_SESSION_TOKEN", "s3-secret-5"),
            ]),
        )
        .unwrap();
        assert_eq!(
            loaded.config.blobs.s3_secret_access_key.as_deref(),
            Some("s3-secret-4")
        );
        let described = Config::describe(&loaded);
        for key in toolexec_store::objects::SECRET_KEYS {
            assert!(
                described.contains(&format!("{key} = \"***\"")),
                "{described}"
            );
        }
        for shown in [described, format!("{:?}", loaded.config)] {
            for secret in ["AKID-secret-3", "s3-secret-4", "s3-secret-5"] {
                assert!(!shown.contains(secret), "{shown}");
            }
        }
    }

    #[test]
    fn the_database_password_is_redacted_in_debug_output() {
        let c = Config {
            database_url: Some("postgres://app:hunter2@db:5432/toolexec".into()),
            ..Config::default()
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("postgres://app:***@db:5432/toolexec"));
    }
}
