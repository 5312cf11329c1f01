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
    pub limits: LimitsConfig,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    pub max_calls_per_batch: usize,
    pub max_output_chars: usize,
    pub max_timeout_ms: u64,
    pub max_blob_bytes: usize,
    pub max_seed_files: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        let l = toolexec_engine::Limits::default();
        Self {
            max_calls_per_batch: l.max_calls_per_batch,
            max_output_chars: l.max_output_chars,
            max_timeout_ms: l.max_timeout_ms,
            max_blob_bytes: l.max_blob_bytes,
            max_seed_files: l.max_seed_files,
        }
    }
}

impl From<&LimitsConfig> for toolexec_engine::Limits {
    fn from(c: &LimitsConfig) -> Self {
        Self {
            max_calls_per_batch: c.max_calls_per_batch,
            max_output_chars: c.max_output_chars,
            max_timeout_ms: c.max_timeout_ms,
            max_blob_bytes: c.max_blob_bytes,
            max_seed_files: c.max_seed_files,
        }
    }
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
            limits: LimitsConfig::default(),
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
            .field("limits", &self.limits)
            .finish()
    }
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
        fig.merge(Env::prefixed("TOOLEXEC_").split("__"))
            .extract()
            .map_err(Box::new)
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
