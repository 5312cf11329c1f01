//! Tools the operator adds by configuration, listed beside the built-ins and run through the
//! same pipeline (validated against their schema, recorded, side effects scanned).
//!
//! **Command tools** (`[[tools.command]]`): an executable in the operator's tool folder
//! (`tools.dir`), run in a sandbox of the session's kind — same namespaces, limits, uid and
//! workspace, but a sandbox of its own, not the session's resident one — with the call's
//! arguments as JSON on its stdin and its stdout as the result. A non-zero exit makes the
//! result an error with its stderr. What it changes in the workspace is recorded as for any
//! command.
//!
//! **The operator's environment, not the tenant's.** The entrypoint is exec'd directly (no
//! shell in between) with exactly the environment its entry defines: [`default_env`] with the
//! entry's `env` over it, its `env_passthrough` variables and `TOOLEXEC_TOOL_NAME` (and the
//! egress proxy's variables when the session may use the network). The session's `env` never
//! reaches it: a tenant's `BASH_ENV`, `PATH` or `PYTHONPATH` would otherwise run the tenant's
//! code inside the operator's tool, with the operator's secrets. Its `HOME` is its own empty
//! `/tmp`, not the workspace, so no dotfile of the tenant's configures it. What stays the
//! tenant's is the workspace itself, its working directory: a tool must read it as input (a
//! program that takes configuration from its working directory — git, npm, make — takes the
//! tenant's).
//!
//! Checked at start-up, so a bad entry stops the service with its reason rather than failing
//! calls later: the name follows the providers' rules (`[a-zA-Z0-9_-]{1,64}`) and is not a
//! built-in's; the entrypoint is relative, has no `..`, and resolves (symlinks followed) to a
//! regular, executable file inside the folder; the schema is an object schema that compiles.
//! The entrypoints named are the allow-list: nothing else in the folder is ever run by the
//! service. The folder is bound read-only into every session's sandbox (at its own path), so the
//! sandbox runs the operator's file, not a copy the model could change.
//!
//! **HTTP operation tools** (`[[tools.openapi]]`) are [`crate::operator::openapi`]'s, **MCP proxy
//! tools** (`[[tools.mcp]]`) [`crate::operator::mcp_proxy`]'s.
#![allow(
    clippy::disallowed_methods,
    reason = "the operator's tool folder and entrypoints are host paths from the configuration, not a model's"
)]
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use toolexec_core::{CallStatus, Capability, OutputLimit, ToolSpec, TruncationMode};
use toolexec_sandbox::RunLimits;

use crate::builtin::shell::{no_sandbox, sandbox_failure};
use crate::{Tool, ToolContext, ToolOutput};

/// Arguments larger than this (as JSON) are refused: a tool's arguments are parameters, far
/// below this in any schema; data that large belongs in the workspace (pass its path).
pub const MAX_INPUT_BYTES: usize = 1024 * 1024;

/// The environment of every command tool unless its entry's `env` says otherwise: the system's
/// `PATH` (nothing of the workspace), `HOME` in its own, empty `/tmp` (not the tenant's
/// workspace: no dotfile of the tenant's configures the tool), a UTF-8 locale.
pub fn default_env() -> BTreeMap<String, String> {
    [
        ("PATH", toolexec_sandbox::DEFAULT_PATH),
        ("HOME", "/tmp"),
        ("LANG", "C.UTF-8"),
        ("TERM", "dumb"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// The operator's tools (`[tools]` in the configuration file).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CustomToolsConfig {
    /// The folder holding the command tools' executables; bound read-only into every sandbox.
    pub dir: Option<PathBuf>,
    /// Command tools.
    pub command: Vec<CommandToolConfig>,
    /// HTTP operation tools from OpenAPI documents (see [`crate::operator::openapi`]).
    pub openapi: Vec<crate::operator::openapi::OpenApiToolsConfig>,
    /// Proxy tools of upstream MCP servers (see [`crate::operator::mcp_proxy`]).
    pub mcp: Vec<crate::operator::mcp_proxy::McpToolsConfig>,
}

/// One command tool.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandToolConfig {
    /// Its name in the catalog (`[a-zA-Z0-9_-]{1,64}`, not a built-in's).
    pub name: String,
    /// Its manual for the model.
    pub description: String,
    /// The executable, relative to `tools.dir`.
    pub entrypoint: String,
    /// JSON Schema (draft 2020-12) of its arguments: an object schema.
    pub input_schema: serde_json::Value,
    /// Whether it only reads (calls of read-only tools of a batch run concurrently, and no
    /// workspace scan follows them). Default false.
    #[serde(default)]
    pub read_only: bool,
    /// How long one call may run (milliseconds); default 60 s, at most `limits.max_timeout_ms`.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Variables this tool's process gets, over [`default_env`] (`PATH`, `HOME`, `LANG`,
    /// `TERM`); the session's `env` never reaches it.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of the service's environment variables this tool's process gets too (read at
    /// start-up), for example a token.
    #[serde(default)]
    pub env_passthrough: Vec<String>,
    /// Longest result the model gets, characters (default 30,000, the head and tail kept).
    #[serde(default)]
    pub max_output_chars: Option<usize>,
}

/// The values of `env` may be tokens: shown by name only.
impl std::fmt::Debug for CommandToolConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandToolConfig")
            .field("name", &self.name)
            .field("entrypoint", &self.entrypoint)
            .field("read_only", &self.read_only)
            .field("timeout_ms", &self.timeout_ms)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("env_passthrough", &self.env_passthrough)
            .field("max_output_chars", &self.max_output_chars)
            .finish_non_exhaustive()
    }
}

/// A command tool, checked and ready.
pub struct CommandTool {
    spec: ToolSpec,
    path: PathBuf,
    timeout: Duration,
    env: BTreeMap<String, String>,
}

/// The command tools of `config`, checked (see the module docs); `reserved` are the built-ins'
/// names.
pub fn load(config: &CustomToolsConfig, reserved: &[&str]) -> Result<Vec<Arc<dyn Tool>>, String> {
    if config.command.is_empty() {
        return Ok(Vec::new());
    }
    let Some(dir) = &config.dir else {
        return Err("tools.command needs tools.dir, the folder of their executables".into());
    };
    let root =
        std::fs::canonicalize(dir).map_err(|e| format!("tools.dir {}: {e}", dir.display()))?;
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    for t in &config.command {
        let at = |why: String| format!("tools.command {:?}: {why}", t.name);
        check_name(&t.name).map_err(&at)?;
        if reserved.contains(&t.name.as_str()) {
            return Err(at("a built-in tool has this name".into()));
        }
        if t.description.trim().is_empty() {
            return Err(at(
                "a description is needed: it is the model's manual".into()
            ));
        }
        let path = entrypoint(&root, &t.entrypoint).map_err(&at)?;
        if t.input_schema.get("type").and_then(|v| v.as_str()) != Some("object") {
            return Err(at(
                "input_schema must be an object schema (\"type\": \"object\")".into(),
            ));
        }
        let mut env = default_env();
        for (name, value) in &t.env {
            check_variable(name).map_err(&at)?;
            if value.contains('\0') {
                return Err(at(format!("env.{name}: a value cannot hold a NUL byte")));
            }
            env.insert(name.clone(), value.clone());
        }
        for name in &t.env_passthrough {
            check_variable(name).map_err(&at)?;
            if let Ok(value) = std::env::var(name) {
                env.insert(name.clone(), value);
            }
        }
        env.insert("TOOLEXEC_TOOL_NAME".into(), t.name.clone());
        tools.push(Arc::new(CommandTool {
            spec: ToolSpec {
                name: t.name.clone(),
                description: t.description.clone(),
                input_schema: t.input_schema.clone(),
                read_only: t.read_only,
                capabilities: if t.read_only {
                    vec![Capability::Process, Capability::FsRead]
                } else {
                    vec![Capability::Process, Capability::FsRead, Capability::FsWrite]
                },
                output_limit: OutputLimit::new(
                    t.max_output_chars.unwrap_or(30_000),
                    TruncationMode::HeadTail,
                ),
            },
            path,
            timeout: Duration::from_millis(t.timeout_ms.unwrap_or(60_000)),
            env,
        }));
    }
    Ok(tools)
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err("the name must be 1 to 64 letters, digits, '_' or '-' (the providers' rule)".into())
    }
}

/// A variable's name as the tool's environment can hold it.
fn check_variable(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a variable name (letters, digits, '_'; not starting with a digit)"
        ))
    }
}

/// The entrypoint's real path: relative, no `..`, resolving inside `root` to a regular,
/// executable file.
fn entrypoint(root: &Path, entry: &str) -> Result<PathBuf, String> {
    let rel = Path::new(entry);
    if entry.is_empty()
        || rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "entrypoint {entry:?} must be a path inside tools.dir without '..'"
        ));
    }
    let real =
        std::fs::canonicalize(root.join(rel)).map_err(|e| format!("entrypoint {entry:?}: {e}"))?;
    if !real.starts_with(root) {
        return Err(format!(
            "entrypoint {entry:?} resolves to {}, outside tools.dir",
            real.display()
        ));
    }
    let meta = std::fs::metadata(&real).map_err(|e| format!("entrypoint {entry:?}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("entrypoint {entry:?} is not a regular file"));
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(format!("entrypoint {entry:?} is not executable"));
    }
    Ok(real)
}

#[async_trait]
impl Tool for CommandTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let Some(table) = ctx.processes.clone() else {
            return no_sandbox();
        };
        let input = args.to_string();
        if input.len() > MAX_INPUT_BYTES {
            return ToolOutput {
                status: CallStatus::InvalidArguments,
                content: format!(
                    "The arguments are {} bytes as JSON, over the {MAX_INPUT_BYTES}-byte limit of a command tool's input. Send less (for example a path to a file in the workspace instead of its contents).",
                    input.len()
                ),
                changes: Vec::new(),
                events: Vec::new(),
                structured: None,
            };
        }
        let Some(path) = self.path.to_str() else {
            return ToolOutput::error(
                "This tool's executable has a path that is not UTF-8; the operator must rename it.",
            );
        };
        let limits = RunLimits {
            timeout: self.timeout.min(Duration::from_millis(ctx.max_timeout_ms)),
            idle_timeout: None,
            max_output_bytes: table.sandbox().config().max_output_bytes,
            cancel: ctx.cancel.clone(),
        };
        let network = ctx.policy.network == toolexec_core::NetworkPolicy::Allow;
        // The entrypoint itself, exec'd with the operator's environment and the arguments on
        // its stdin: no shell, nothing of the session's environment.
        let finished = match table
            .exec(
                vec![path.to_owned()],
                self.env.clone(),
                input.into_bytes(),
                network,
                &limits,
            )
            .await
        {
            Ok(f) => f,
            Err(e) => return sandbox_failure(&e),
        };
        let stdout = String::from_utf8_lossy(&finished.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&finished.stderr).into_owned();
        use toolexec_sandbox::KillReason;
        match (finished.killed, finished.exit_code) {
            (Some(KillReason::Timeout(t)), _) => ToolOutput {
                status: CallStatus::TimedOut,
                content: format!(
                    "[{} timed out after {} ms and was stopped; output so far below]\n{stdout}",
                    self.spec.name,
                    t.as_millis()
                ),
                changes: Vec::new(),
                events: Vec::new(),
                structured: None,
            },
            (Some(KillReason::Cancelled), _) => {
                ToolOutput::cancelled(format!("[cancelled; output so far below]\n{stdout}"))
            }
            (None, Some(0)) => ToolOutput::ok(stdout),
            // The sandbox was set up but the entrypoint could not be exec'd (its `#!`
            // interpreter is missing from the sandbox's system directories, say).
            (None, Some(toolexec_sandbox::init::SETUP_FAILED))
                if stderr.starts_with(toolexec_sandbox::init::ERROR_PREFIX) =>
            {
                ToolOutput::error(format!(
                    "Infrastructure error, not a problem with your arguments: the operator's tool {} could not be started ({}). Tell the operator; retrying will not help.",
                    self.spec.name,
                    stderr.trim()
                ))
            }
            (killed, code) => {
                let how = match (killed, code) {
                    (Some(KillReason::OutputLimit(n)), _) => {
                        format!("printed more than {n} bytes and was stopped")
                    }
                    (_, Some(code)) => format!("exited with code {code}"),
                    _ => "was killed".to_owned(),
                };
                ToolOutput::error(format!(
                    "{} {how}.\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
                    self.spec.name
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ok.sh"), "#!/bin/sh\ncat\n").unwrap();
        std::fs::set_permissions(
            dir.path().join("ok.sh"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::fs::write(dir.path().join("plain.txt"), "x").unwrap();
        std::os::unix::fs::symlink("/bin/sh", dir.path().join("out")).unwrap();
        std::os::unix::fs::symlink("ok.sh", dir.path().join("in")).unwrap();
        dir
    }

    fn one(dir: &Path, name: &str, entry: &str) -> Result<Vec<Arc<dyn Tool>>, String> {
        load(
            &CustomToolsConfig {
                dir: Some(dir.to_owned()),
                command: vec![CommandToolConfig {
                    name: name.into(),
                    description: "Echoes its input.".into(),
                    entrypoint: entry.into(),
                    input_schema: serde_json::json!({"type": "object"}),
                    read_only: false,
                    timeout_ms: None,
                    env: BTreeMap::new(),
                    env_passthrough: vec![],
                    max_output_chars: None,
                }],
                openapi: vec![],
                mcp: vec![],
            },
            &["shell"],
        )
    }

    #[test]
    fn a_tools_variables_are_checked_at_load() {
        let dir = folder();
        let mut config = CustomToolsConfig {
            dir: Some(dir.path().to_owned()),
            command: vec![CommandToolConfig {
                name: "t".into(),
                description: "d".into(),
                entrypoint: "ok.sh".into(),
                input_schema: serde_json::json!({"type": "object"}),
                read_only: false,
                timeout_ms: None,
                env: [("PATH".into(), "/opt/tool/bin".into())].into(),
                env_passthrough: vec!["TOOLEXEC_TEST_NEVER_SET_83".into()],
                max_output_chars: None,
            }],
            openapi: vec![],
            mcp: vec![],
        };
        assert!(load(&config, &[]).is_ok());
        config.command[0].env = [("BAD-NAME".into(), "x".into())].into();
        let err = load(&config, &[]).err().unwrap_or_default();
        assert!(err.contains("\"BAD-NAME\" is not a variable name"), "{err}");
        config.command[0].env = [("A".into(), "x\0y".into())].into();
        let err = load(&config, &[]).err().unwrap_or_default();
        assert!(
            err.contains("env.A: a value cannot hold a NUL byte"),
            "{err}"
        );
    }

    #[test]
    fn entrypoints_are_checked_at_load() {
        let dir = folder();
        assert!(one(dir.path(), "echo_input", "ok.sh").is_ok());
        assert!(
            one(dir.path(), "echo_input", "./in").is_ok(),
            "a symlink inside"
        );
        for (entry, says) in [
            ("/bin/sh", "inside tools.dir"),
            ("../ok.sh", "without '..'"),
            ("sub/../ok.sh", "without '..'"),
            ("out", "outside tools.dir"),
            ("plain.txt", "not executable"),
            ("missing.sh", "No such file"),
            ("", "inside tools.dir"),
        ] {
            let err = one(dir.path(), "t", entry).err().unwrap_or_default();
            assert!(err.contains(says), "{entry:?}: {err}");
        }
        for (name, says) in [
            ("shell", "built-in"),
            ("has space", "letters, digits"),
            (&"x".repeat(65)[..], "letters, digits"),
        ] {
            let err = one(dir.path(), name, "ok.sh").err().unwrap_or_default();
            assert!(err.contains(says), "{name:?}: {err}");
        }
    }
}
