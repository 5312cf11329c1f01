//! Configuration: defaults, then a TOML file, then `TOOLEXEC_*` environment variables.
//! Secrets (the database URL's password) never appear in `Debug` output or logs.
use std::net::SocketAddr;
use std::path::PathBuf;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
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
    /// `json` (default) or `text`.
    pub log_format: String,
    /// Concurrent group-commit loops of the recorder.
    pub recorder_writers: usize,
    /// Record `invocation.started` durably before read-only tools run too (see docs/design.md).
    pub durable_start_for_read_only: bool,
    /// Per-tenant request rate (token bucket refill per second); 0 turns the limit off.
    pub rate_limit_per_second: f64,
    /// Per-tenant burst (bucket size).
    pub rate_limit_burst: f64,
    /// Requests in flight beyond which new ones are shed with 503.
    pub max_concurrent_requests: usize,
    pub limits: toolexec_engine::Limits,
    /// How `shell` commands are isolated (see docs/operator.md, "Sandbox").
    pub sandbox: toolexec_sandbox::SandboxConfig,
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
            log_format: "json".into(),
            recorder_writers: 2,
            durable_start_for_read_only: false,
            rate_limit_per_second: 1000.0,
            rate_limit_burst: 2000.0,
            max_concurrent_requests: toolexec_api::DEFAULT_MAX_CONCURRENT_REQUESTS,
            limits: toolexec_engine::Limits::default(),
            sandbox: toolexec_sandbox::SandboxConfig::default(),
        }
    }
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
            .field("log_format", &self.log_format)
            .field("recorder_writers", &self.recorder_writers)
            .field(
                "durable_start_for_read_only",
                &self.durable_start_for_read_only,
            )
            .field("rate_limit_per_second", &self.rate_limit_per_second)
            .field("rate_limit_burst", &self.rate_limit_burst)
            .field("max_concurrent_requests", &self.max_concurrent_requests)
            .field("limits", &self.limits)
            .field("sandbox", &self.sandbox)
            .finish()
    }
}

/// Whether an environment key (prefix stripped, lowercased, `__` → `.`) names a field of
/// [`Config`]. Other `TOOLEXEC_*` variables are ignored rather than fatal: the environment is
/// shared with things we do not control (service links, our own `TOOLEXEC_CONFIG`).
fn is_config_key(key: &str) -> bool {
    let top = key.split('.').next().unwrap_or_default();
    // Every field serializes (unset options as null), so the default's keys are all the keys.
    matches!(serde_json::to_value(Config::default()), Ok(serde_json::Value::Object(f)) if f.contains_key(top))
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

impl Config {
    /// Defaults ← file (if given or `toolexec.toml` exists) ← `TOOLEXEC_*` env
    /// (`TOOLEXEC_LIMITS__MAX_BLOB_BYTES` for nested keys).
    pub fn load(file: Option<&std::path::Path>) -> Result<Self, Box<figment::Error>> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        match file {
            Some(path) => fig = fig.merge(Toml::file_exact(path)),
            None => fig = fig.merge(Toml::file("toolexec.toml")),
        }
        fig.merge(
            Env::prefixed("TOOLEXEC_")
                .split("__")
                // The filter sees the key as written (`LIMITS.MAX_BLOB_BYTES`); figment
                // lowercases it only afterwards.
                .filter(|key| is_config_key(&key.as_str().to_ascii_lowercase())),
        )
        .extract()
        .map_err(Box::new)
    }

    /// `TOOLEXEC_*` variables that name no configuration key (logged as a warning at start-up):
    /// `TOOLEXEC_CONFIG` itself, Kubernetes service links such as `TOOLEXEC_SERVICE_HOST`, typos.
    pub fn ignored_env_vars() -> Vec<String> {
        std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| {
                k.strip_prefix("TOOLEXEC_").is_some_and(|rest| {
                    !is_config_key(&rest.to_ascii_lowercase().replace("__", "."))
                })
            })
            .collect()
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

    #[test]
    fn only_toolexec_variables_that_name_a_setting_are_read() {
        assert!(is_config_key("bind"));
        assert!(is_config_key("database_url"));
        assert!(is_config_key("limits.max_blob_bytes"));
        assert!(!is_config_key("config"));
        assert!(!is_config_key("service_host"));
        assert!(!is_config_key("port_8080_tcp"));
    }

    #[test]
    #[expect(
        clippy::result_large_err,
        reason = "the closure's figment::Result is the signature Jail::expect_with takes"
    )]
    fn settings_come_from_toolexec_environment_variables() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("TOOLEXEC_BIND", "127.0.0.1:9999");
            jail.set_env("TOOLEXEC_LIMITS__MAX_BLOB_BYTES", "1234");
            jail.set_env("TOOLEXEC_SERVICE_HOST", "10.0.0.1");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            assert_eq!(c.bind, "127.0.0.1:9999");
            assert_eq!(c.limits.max_blob_bytes, 1234);
            Ok(())
        });
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
