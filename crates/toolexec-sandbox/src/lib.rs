//! The shell sandbox. Where the service can make cgroups (root, a cgroup v2 hierarchy), each
//! session gets a **resident sandbox**: the init below is started once, on the session's first
//! command, and stays as the sandbox's pid 1 (the agent, `resident.rs`); it forks each command
//! (ahead of time), which the service places in its own cgroup from the host and then hands its
//! stdio and spec over a socket pair. Per command that is one fork and one exec; the layers
//! are the same, built once. Otherwise (a service that is not root: without a cgroup per
//! command, only a PID namespace per command can kill a command's whole tree), every command of
//! the `shell` tool runs in a sandbox of its own, as
//!
//! ```text
//! service (root) ─fork─▶ [join the session's and the command's cgroups; setgroups(0);
//!                          setresgid/setresuid(unprivileged); PDEATHSIG; fds 3-5: status pipe,
//!                          spec, workspace root] ─exec (empty environment, no arguments)─▶
//!                          toolexec-sandbox-init (static, from a sealed memfd)
//!     unshare(user, mount, pid, net, ipc, uts, cgroup) ─fork─▶ pid 1: tmpfs root, read-only
//!     /usr and /etc, /workspace read-write, private /tmp, /proc, minimal /dev, pivot_root, lo
//!     up, drop all capabilities ─fork─▶ rlimits, no_new_privs, Landlock, seccomp
//!     ─execve (the command's environment)─▶ /bin/bash -c COMMAND
//! ```
//!
//! The namespaces and mounts are the ones bubblewrap sets up (see the `toolexec-sandbox-init`
//! crate), made by our own init instead: no external binary to install, and one exec fewer per
//! command (exec dominates the cost of a sandboxed command on small VMs). The uid drop happens in
//! the service before the init runs — a sandbox started by root keeps root's powers otherwise.
//! Nothing a session controls reaches the init while it is outside the sandbox: it is statically
//! linked (no dynamic loader to honour `LD_PRELOAD`), starts with an empty environment and no
//! arguments, and reads the command, its environment and the layout from a memfd (`spec`); the
//! command's environment is applied by the final `execve` only, so `/proc/1/environ` and
//! `/proc/1/cmdline` in the sandbox hold nothing (no host path either).
//! See docs/security.md for what each layer guarantees.
//!
//! [`Sandbox::probe`] checks all of this at start-up by running a command (through an agent, on
//! a host where sandboxes are resident) that reports its own credentials and the agent's; if
//! anything is missing the sandbox is unavailable and `shell` fails closed.
mod background;
pub mod bash;
pub mod cgroup;
mod config;
pub mod egress;
mod environment;
mod image;
mod resident;
mod run;
pub mod terminal;

/// The init's protocol and constants (exit status, error prefix, descriptors).
pub use toolexec_sandbox_init as init;

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use background::{Admission, ProcessInfo, ProcessRead, ProcessState, ProcessTable};
pub use bash::{BashLimits, BashRun};
pub use cgroup::CgroupLimits;
pub use config::{SandboxConfig, SandboxMode};
pub use environment::SessionImage;
pub use run::{Finished, KillReason, RunLimits};
pub use terminal::{TermError, TermExit, TermInfo, TermRead, UNTIL_WINDOW, Until};

/// Why a command could not be run. The command did not start (or started unsandboxed never).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("the sandbox is unavailable: {0}")]
    Unavailable(String),
    #[error("the sandbox could not be set up for this command: {0}")]
    Setup(String),
    #[error("{0}")]
    Limit(String),
    /// The session's resident sandbox ended while the command ran (or was about to): every
    /// process of the session died with it. The next command starts a fresh one.
    #[error("the session's sandbox stopped: {0}")]
    AgentLost(String),
}

/// What `/readyz` shows about the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxStatus {
    /// `enforced`, `unsandboxed` or `unavailable`.
    pub mode: &'static str,
    pub ready: bool,
    pub detail: String,
}

/// Longest the init may take to set up the sandbox before the command starts.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// `PATH` of the session's commands, and of an operator's command tool unless it sets its own:
/// the system's directories (bound read-only), nothing of the workspace.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The fixed part of every session command's environment.
const BASE_ENV: [(&str, &str); 4] = [
    ("PATH", DEFAULT_PATH),
    ("HOME", "/workspace"),
    ("LANG", "C.UTF-8"),
    ("TERM", "dumb"),
];

/// The sandbox of a service instance. Shared by all sessions.
#[derive(Debug)]
pub struct Sandbox {
    config: SandboxConfig,
    /// The static init in a sealed memfd (`Err`: why there is none).
    init: Result<image::InitImage, String>,
    /// The directory holding the workspaces, opened once (`O_PATH`): the init finds a workspace
    /// beneath it by name, so the sandbox user needs search permission on it alone, not on the
    /// directories above it (a data directory made by `mktemp -d` is 0700).
    root: Result<OwnedFd, String>,
    workspace_root: PathBuf,
    cgroups: Option<cgroup::Cgroups>,
    status: Mutex<SandboxStatus>,
    /// Values of `env_passthrough` read once at start-up.
    passthrough: Vec<(String, String)>,
    /// Who the egress proxies let sessions reach (`Err`: the configured allow-list is invalid).
    egress_policy: Result<Arc<egress::EgressPolicy>, String>,
    /// Where the sessions' egress proxy sockets live (beside the workspaces, never inside one).
    egress_dir: PathBuf,
    drop_privileges: bool,
    /// `/dev/null`, opened once: a resident command's stdin.
    null: Result<std::fs::File, String>,
}

/// A command to start.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The workspace on the host (bound at `/workspace`): a directory beneath the workspace root
    /// the sandbox was probed with.
    pub workspace: PathBuf,
    /// Working directory relative to the workspace (`""` for the workspace itself); the caller
    /// checked it is a directory inside it.
    pub workdir: String,
    pub program: Program,
    /// The session's egress proxy socket, when the command may use the network.
    pub egress_socket: Option<PathBuf>,
    /// The image the session runs in; `None`: the host's `/usr` and `/etc`.
    pub image: Option<Arc<SessionImage>>,
}

/// What a command runs, and with which environment.
impl Launch {
    /// The shell of a `Program::Shell`: the image's (`/bin/sh` in one without bash), else
    /// `/bin/bash`.
    fn shell(&self) -> &'static str {
        self.image.as_ref().map_or("/bin/bash", |i| i.shell)
    }
}

#[derive(Debug, Clone)]
pub enum Program {
    /// A session's own command: `/bin/bash -c COMMAND`, with `BASE_ENV`, the operator's
    /// `sandbox.env_passthrough`, the egress proxy's variables and the session's `env` over
    /// them.
    Shell {
        command: String,
        env: BTreeMap<String, String>,
    },
    /// An operator's program (a command tool): `argv[0]`, an absolute path, exec'd directly —
    /// no shell that a variable could hook into — with exactly `env` (over the egress proxy's
    /// variables when it has the network). Nothing of the session's environment reaches it.
    Exec {
        argv: Vec<String>,
        env: BTreeMap<String, String>,
    },
}

impl Program {
    fn argv(&self, shell: &str) -> Vec<Vec<u8>> {
        match self {
            Program::Shell { command, .. } => vec![
                shell.as_bytes().to_vec(),
                b"-c".to_vec(),
                command.as_bytes().to_vec(),
            ],
            Program::Exec { argv, .. } => argv.iter().map(|a| a.as_bytes().to_vec()).collect(),
        }
    }
}

/// A session's running egress proxy.
#[derive(Debug)]
pub struct EgressHandle {
    pub path: PathBuf,
    /// The connections it served that are not recorded yet.
    pub log: Arc<egress::EgressLog>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EgressHandle {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A started command and what the service holds of it.
pub(crate) struct Spawned {
    pub child: tokio::process::Child,
    pub group: Option<cgroup::CommandGroup>,
    /// False when the init failed before the command started: the reason is on
    /// the child's stderr.
    pub started: bool,
}

impl Sandbox {
    /// Builds the sandbox and checks it works (see [`Sandbox::status`]). Never fails: an
    /// unusable sandbox reports `ready: false`, and every command fails closed.
    ///
    /// The probe runs in a directory made beneath `workspace_root`, so that a root the sandbox
    /// user cannot reach (a parent directory with mode 0700, say) shows up here.
    pub async fn probe(config: SandboxConfig, workspace_root: &Path) -> Arc<Self> {
        let root = rustix::process::geteuid().is_root();
        let cgroups = if root {
            match cgroup::Cgroups::setup() {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(error = %e, "cgroups unavailable: limits by rlimits only, tree kill by PID namespace");
                    None
                }
            }
        } else {
            None
        };
        let passthrough = config
            .env_passthrough
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.clone(), v)))
            .collect();
        let workspace_dir = std::fs::create_dir_all(workspace_root)
            .and_then(|()| {
                Ok(rustix::fs::open(
                    workspace_root,
                    rustix::fs::OFlags::PATH
                        | rustix::fs::OFlags::DIRECTORY
                        | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )?)
            })
            .map_err(|e| {
                format!(
                    "the workspace root {} cannot be opened: {e}",
                    workspace_root.display()
                )
            });
        let sandbox = Arc::new(Self {
            drop_privileges: root,
            init: image::InitImage::load(config.init.as_deref()),
            root: workspace_dir,
            workspace_root: workspace_root.to_path_buf(),
            egress_policy: egress::EgressPolicy::new(&config.egress_allow_cidrs)
                .map(|p| Arc::new(p.refusing_this_host()))
                .map_err(|e| e.to_string()),
            egress_dir: workspace_root.join(".egress"),
            null: std::fs::File::open("/dev/null").map_err(|e| e.to_string()),
            cgroups,
            passthrough,
            status: Mutex::new(SandboxStatus {
                mode: "unavailable",
                ready: false,
                detail: "not probed yet".into(),
            }),
            config,
        });
        let status = sandbox.self_check(workspace_root).await;
        if let Ok(mut s) = sandbox.status.lock() {
            *s = status;
        }
        sandbox
    }

    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    pub fn status(&self) -> SandboxStatus {
        self.status
            .lock()
            .map(|s| s.clone())
            .unwrap_or(SandboxStatus {
                mode: "unavailable",
                ready: false,
                detail: "status lock poisoned".into(),
            })
    }

    /// The user and group that must own workspaces, when commands run as another user than
    /// the service (the service is root and the sandbox is on).
    pub fn workspace_owner(&self) -> Option<(u32, u32)> {
        (self.drop_privileges && !self.is_unsandboxed())
            .then_some((self.config.uid, self.config.gid))
    }

    pub fn is_unsandboxed(&self) -> bool {
        self.config.mode == SandboxMode::Unsandboxed
    }

    pub(crate) fn dev_null(&self) -> io::Result<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.null
            .as_ref()
            .map(|f| f.as_fd())
            .map_err(|e| io::Error::other(e.clone()))
    }

    /// Starts a session's egress proxy: a UNIX socket beside the workspaces that the sandbox of
    /// each of its network-enabled commands gets bound in. Stops when the handle is dropped.
    pub fn start_egress(&self, session: &str) -> Result<EgressHandle, SandboxError> {
        let setup =
            |what: &str, e: io::Error| SandboxError::Setup(format!("egress proxy: {what}: {e}"));
        let policy = self
            .egress_policy
            .clone()
            .map_err(|e| SandboxError::Unavailable(format!("sandbox.egress_allow_cidrs: {e}")))?;
        std::fs::create_dir_all(&self.egress_dir).map_err(|e| setup("directory", e))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&self.egress_dir, std::fs::Permissions::from_mode(0o711))
            .map_err(|e| setup("directory", e))?;
        let path = self.egress_dir.join(format!("{session}.sock"));
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).map_err(|e| setup("bind", e))?;
        if let Some((uid, gid)) = self.workspace_owner() {
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(|e| setup("chown", e))?;
        }
        let log = Arc::new(egress::EgressLog::default());
        let task = tokio::spawn(egress::serve(listener, policy, log.clone()));
        Ok(EgressHandle { path, log, task })
    }

    /// The cgroups of a new session (its limits), if cgroups are in use.
    pub fn session_group(&self, session: &str) -> io::Result<Option<cgroup::SessionGroup>> {
        let Some(cg) = &self.cgroups else {
            return Ok(None);
        };
        cg.session(
            &format!("s-{session}"),
            &CgroupLimits {
                memory_bytes: self.config.memory_bytes,
                pids: self.config.pids,
                cpu_cores: self.config.cpu_cores,
            },
        )
        .map(Some)
    }

    /// Runs a command in a throw-away workspace and checks the sandbox is what it claims.
    async fn self_check(&self, workspace_root: &Path) -> SandboxStatus {
        if self.is_unsandboxed() {
            return SandboxStatus {
                mode: "unsandboxed",
                ready: true,
                detail: "sandbox disabled by the operator (sandbox.mode = \"unsandboxed\"): commands run on the host as the service's user".into(),
            };
        }
        let unavailable = |detail: String| SandboxStatus {
            mode: "unavailable",
            ready: false,
            detail,
        };
        if let Err(e) = &self.egress_policy {
            return unavailable(format!("sandbox.egress_allow_cidrs: {e}"));
        }
        if let Err(e) = &self.init {
            return unavailable(e.clone());
        }
        if let Err(e) = &self.root {
            return unavailable(e.clone());
        }
        let dir = match probe_dir(workspace_root, self.workspace_owner()) {
            Ok(d) => d,
            Err(e) => {
                return unavailable(format!(
                    "cannot create a probe directory in {}: {e}",
                    workspace_root.display()
                ));
            }
        };
        let resident = self.is_resident();
        // A resident sandbox's pid 1 is the agent every command is forked from: it must carry
        // the same layers, and its descriptors must be out of the command's reach.
        let command = if resident {
            "grep -E '^(Uid|CapEff|NoNewPrivs|Seccomp):' /proc/self/status; echo @@agent; \
             grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/1/status; \
             ls /proc/1/fd >/dev/null 2>&1 && echo 'AgentFds: readable'; true"
        } else {
            "grep -E '^(Uid|CapEff|NoNewPrivs|Seccomp):' /proc/self/status"
        };
        let launch = Launch {
            workspace: dir.clone(),
            workdir: String::new(),
            program: Program::Shell {
                command: command.into(),
                env: BTreeMap::new(),
            },
            egress_socket: None,
            image: None,
        };
        let group = match self.session_group("probe") {
            Ok(g) => g,
            Err(e) => return unavailable(format!("cannot create the probe's cgroups: {e}")),
        };
        let limits = run::RunLimits {
            timeout: Duration::from_secs(10),
            idle_timeout: None,
            max_output_bytes: 64 * 1024,
            cancel: Default::default(),
        };
        let result = if resident {
            match self
                .start_agent("probe", &dir, None, None, group.as_ref())
                .await
            {
                Ok(agent) => {
                    let r = self
                        .run_resident(&agent, &launch, group.as_ref(), &limits)
                        .await;
                    agent.stop().await;
                    r
                }
                Err(e) => Err(e),
            }
        } else {
            self.run(&launch, group.as_ref(), &limits, None).await
        };
        let result = match result {
            Err(SandboxError::Setup(m)) if m.contains("Permission denied") => {
                Err(SandboxError::Setup(format!(
                    "{m} (the sandbox user {}:{} needs search permission on the workspace root {} itself — not on the directories above it: make it at least mode 0711, or set workspace_root)",
                    self.config.uid,
                    self.config.gid,
                    workspace_root.display()
                )))
            }
            other => other,
        };
        let _ = std::fs::remove_dir_all(&dir);
        drop(group);
        let finished = match result {
            Ok(f) => f,
            Err(e) => return unavailable(e.to_string()),
        };
        let text = String::from_utf8_lossy(&finished.stdout);
        let (out, agent_out) = text.split_once("@@agent\n").unwrap_or((&text, ""));
        let field_in = |part: &str, name: &str| {
            part.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().next().unwrap_or("").to_owned())
                .unwrap_or_default()
        };
        let field = |name: &str| field_in(out, name);
        let (uid, cap, nnp, seccomp) = (
            field("Uid:"),
            field("CapEff:"),
            field("NoNewPrivs:"),
            field("Seccomp:"),
        );
        let mut problems = Vec::new();
        if resident {
            let (cap, nnp, seccomp) = (
                field_in(agent_out, "CapEff:"),
                field_in(agent_out, "NoNewPrivs:"),
                field_in(agent_out, "Seccomp:"),
            );
            if cap.is_empty() || cap.chars().any(|c| c != '0') {
                problems.push(format!("the agent's effective capabilities '{cap}'"));
            }
            if nnp != "1" || seccomp != "2" {
                problems.push("the agent lacks no_new_privs or its seccomp filter".into());
            }
            if agent_out.contains("AgentFds: readable") {
                problems.push("a command can read the agent's descriptors".into());
            }
        }
        if finished.exit_code != Some(0) {
            problems.push(format!(
                "probe command failed: {}",
                String::from_utf8_lossy(&finished.stderr).trim()
            ));
        }
        if uid == "0" || uid.is_empty() {
            problems.push(format!("runs as uid '{uid}'"));
        }
        if cap.is_empty() || cap.chars().any(|c| c != '0') {
            problems.push(format!("effective capabilities '{cap}'"));
        }
        if nnp != "1" {
            problems.push("no_new_privs not set".into());
        }
        if seccomp != "2" {
            problems.push("no seccomp filter".into());
        }
        if !problems.is_empty() {
            return unavailable(format!(
                "sandbox self-check failed: {}",
                problems.join("; ")
            ));
        }
        SandboxStatus {
            mode: "enforced",
            ready: true,
            detail: format!(
                "namespaces (user, mount, pid, net, ipc, uts, cgroup), uid {uid}, no capabilities, no_new_privs, Landlock, seccomp; {}; {}",
                if resident {
                    "a resident sandbox per session (one agent, each command forked from it)"
                } else {
                    "a sandbox per command"
                },
                self.cgroups
                    .as_ref()
                    .map_or_else(|| "no cgroups: rlimits only".to_owned(), |c| c.describe())
            ),
        }
    }

    fn check_ready(&self) -> Result<(), SandboxError> {
        let status = self.status();
        if status.ready || status.detail == "not probed yet" {
            Ok(())
        } else {
            Err(SandboxError::Unavailable(status.detail))
        }
    }

    /// The environment a command starts with.
    fn command_env(&self, launch: &Launch) -> Vec<(String, String)> {
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        if let Program::Shell { .. } = &launch.program {
            env.extend(
                BASE_ENV
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
            );
            // The shell commands run in. Without it, every `bash` looks its user up in the
            // password database at start (NSS: /etc/nsswitch.conf, /etc/passwd, two connects
            // to nscd's socket) to set it — ~0.1 ms of each command's CPU, for this answer.
            env.insert("SHELL".to_owned(), launch.shell().to_owned());
            // The image's `Env` (its `PATH` first of all), then the operator's and the
            // session's variables over it.
            if let Some(image) = &launch.image {
                env.extend(image.env.iter().cloned());
            }
            env.extend(self.passthrough.iter().cloned());
        }
        if launch.egress_socket.is_some() {
            let proxy = format!("http://127.0.0.1:{}", egress::PROXY_PORT);
            for k in [
                "HTTP_PROXY",
                "HTTPS_PROXY",
                "http_proxy",
                "https_proxy",
                "ALL_PROXY",
                "all_proxy",
            ] {
                env.insert(k.to_owned(), proxy.clone());
            }
            for k in ["NO_PROXY", "no_proxy"] {
                env.insert(k.to_owned(), "localhost,127.0.0.1,::1".to_owned());
            }
        }
        let (Program::Shell { env: own, .. } | Program::Exec { env: own, .. }) = &launch.program;
        env.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
        env.into_iter().collect()
    }

    /// Whether commands run in a resident sandbox per session (an agent that forks each
    /// command) rather than in a sandbox built for each command. It needs the v2 cgroup
    /// hierarchy: a command's own cgroup is what kills its tree when the PID namespace is the
    /// session's, not the command's.
    pub fn is_resident(&self) -> bool {
        self.config.resident && !self.is_unsandboxed() && self.cgroups.is_some()
    }

    /// What a session's agent is told: the layout and limits, no command.
    fn agent_spec(
        &self,
        workspace: &Path,
        egress: Option<&Path>,
        image: Option<&Arc<SessionImage>>,
    ) -> Result<init::Spec, SandboxError> {
        let launch = Launch {
            workspace: workspace.to_path_buf(),
            workdir: String::new(),
            program: Program::Shell {
                command: String::new(),
                env: BTreeMap::new(),
            },
            egress_socket: egress.map(Path::to_path_buf),
            image: image.cloned(),
        };
        let mut spec = self.spec(&launch)?;
        spec.agent = true;
        spec.argv.clear();
        spec.env.clear();
        Ok(spec)
    }

    /// What an agent's spare is told for a command.
    fn command_spec(&self, launch: &Launch) -> init::CommandSpec {
        init::CommandSpec {
            workdir: launch.workdir.as_bytes().to_vec(),
            argv: launch.program.argv(launch.shell()),
            env: self
                .command_env(launch)
                .into_iter()
                .map(|(k, v)| (k.into_bytes(), v.into_bytes()))
                .collect(),
        }
    }

    /// Starts a session's resident sandbox: the init as its agent, in the session's cgroups.
    pub(crate) async fn start_agent(
        &self,
        session: &str,
        workspace: &Path,
        egress: Option<&Path>,
        image: Option<&Arc<SessionImage>>,
        limits: Option<&cgroup::SessionGroup>,
    ) -> Result<resident::Agent, SandboxError> {
        self.check_ready()?;
        let setup = |what: &str, e: io::Error| SandboxError::Setup(format!("{what}: {e}"));
        let cgroups = self.cgroups.as_ref().ok_or_else(|| {
            SandboxError::Unavailable("a resident sandbox needs the cgroup v2 hierarchy".into())
        })?;
        let not_ready = |e: &String| SandboxError::Unavailable(e.clone());
        let init = self.init.as_ref().map_err(not_ready)?;
        let root = self.root.as_ref().map_err(not_ready)?;
        // A subtree per agent, not per session: an agent that died and the one replacing it
        // must never share one (dropping the old handle kills its whole subtree).
        static AGENTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = AGENTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tree = cgroups
            .session_tree(&format!("s-{session}.{n}"))
            .map_err(|e| setup("session cgroup", e))?;
        let mut procs: Vec<OwnedFd> = match limits {
            Some(s) => s.procs_files().map_err(|e| setup("session cgroup", e))?,
            None => Vec::new(),
        };
        procs.push(tree.agent_procs().map_err(|e| setup("session cgroup", e))?);
        let spec = self
            .agent_spec(workspace, egress, image)?
            .encode()
            .map_err(|e| SandboxError::Setup(format!("the sandbox cannot be described: {e}")))?;
        let spec = image::spec_memfd(&spec).map_err(|e| setup("spec memfd", e))?;
        let (mine, theirs) =
            resident::socket_pair(false).map_err(|e| setup("control socket", e))?;
        let passed = vec![
            (theirs.as_raw_fd(), init::protocol::CONTROL_FD),
            (spec.as_raw_fd(), init::SPEC_FD),
            (root.as_raw_fd(), init::ROOT_FD),
        ];
        let mut cmd = tokio::process::Command::new(init.exec_path());
        cmd.arg0("toolexec-sandbox-init");
        cmd.env_clear();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        self.child_setup_for(&mut cmd, &procs, passed, true);
        let mut keep = procs;
        keep.push(theirs);
        keep.push(OwnedFd::from(spec));
        resident::Agent::start(cmd, mine, keep, tree, egress.is_some()).await
    }

    /// Runs `child_setup` in the forked child of `cmd`: join the cgroups behind `procs`, put
    /// `passed` at their numbers, drop to the sandbox user (when sandboxed and root), die with
    /// the service. The descriptors must stay open until `cmd` is spawned.
    fn child_setup_for(
        &self,
        cmd: &mut tokio::process::Command,
        procs: &[OwnedFd],
        passed: Vec<(i32, i32)>,
        sandboxed: bool,
    ) {
        let drop_to =
            (self.drop_privileges && sandboxed).then_some((self.config.uid, self.config.gid));
        let proc_fds: Vec<i32> = procs.iter().map(AsRawFd::as_raw_fd).collect();
        let rlimits: Vec<(libc::__rlimit_resource_t, u64)> = if sandboxed {
            Vec::new()
        } else {
            vec![
                (libc::RLIMIT_CPU, self.config.cpu_seconds),
                (libc::RLIMIT_FSIZE, self.config.file_size_bytes),
                (libc::RLIMIT_NOFILE, self.config.open_files),
                (libc::RLIMIT_CORE, 0),
            ]
        };
        // SAFETY: the closure runs in the forked child before exec and only makes raw,
        // async-signal-safe system calls on values prepared before the fork (no allocation,
        // no locks).
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || child_setup(&proc_fds, &passed, drop_to, &rlimits));
        }
    }

    /// What the init is told for a command: the filesystem layout, the limits, the command and
    /// its environment.
    fn spec(&self, launch: &Launch) -> Result<init::Spec, SandboxError> {
        let beneath = |path: &Path, what: &str| {
            path.strip_prefix(&self.workspace_root)
                .ok()
                .filter(|rel| !rel.as_os_str().is_empty())
                .map(|rel| rel.as_os_str().as_bytes().to_vec())
                .ok_or_else(|| {
                    SandboxError::Setup(format!(
                        "the {what} {} is not beneath the workspace root {}",
                        path.display(),
                        self.workspace_root.display()
                    ))
                })
        };
        Ok(init::Spec {
            workspace: beneath(&launch.workspace, "workspace")?,
            workdir: launch.workdir.as_bytes().to_vec(),
            tmp_size: self.config.tmp_size_bytes,
            ro: self
                .config
                .ro_binds
                .iter()
                .map(|d| d.as_os_str().as_bytes().to_vec())
                .collect(),
            egress_socket: launch
                .egress_socket
                .as_deref()
                .map(|s| beneath(s, "egress socket"))
                .transpose()?,
            limits: init::InitLimits {
                cpu_seconds: self.config.cpu_seconds,
                file_size_bytes: self.config.file_size_bytes,
                open_files: self.config.open_files,
                // Without a memory cgroup, the per-process address space is the only memory
                // bound (a session of several processes can then use more in total).
                address_space_bytes: if self.cgroups.as_ref().is_some_and(|c| c.limits_memory()) {
                    0
                } else {
                    self.config.memory_bytes
                },
            },
            argv: launch.program.argv(launch.shell()),
            env: self
                .command_env(launch)
                .into_iter()
                .map(|(k, v)| (k.into_bytes(), v.into_bytes()))
                .collect(),
            agent: false,
            image: launch
                .image
                .as_ref()
                .map(|i| beneath(&i.rootfs, "image"))
                .transpose()?,
        })
    }

    /// Starts a command: stdout and stderr to `stdout`/`stderr`, stdin from `stdin`. Returns
    /// once the sandbox is set up and the command is about to run.
    pub(crate) async fn spawn(
        &self,
        launch: &Launch,
        session: Option<&cgroup::SessionGroup>,
        stdin: Stdio,
        stdout: Stdio,
        stderr: Stdio,
    ) -> Result<Spawned, SandboxError> {
        self.check_ready()?;
        let setup = |what: &str, e: io::Error| SandboxError::Setup(format!("{what}: {e}"));
        let group = match &self.cgroups {
            Some(cg) => Some(cg.command().map_err(|e| setup("command cgroup", e))?),
            None => None,
        };
        let mut procs: Vec<OwnedFd> = match session {
            Some(s) => s.procs_files().map_err(|e| setup("session cgroup", e))?,
            None => Vec::new(),
        };
        if let Some(g) = &group {
            procs.push(g.procs_file().map_err(|e| setup("command cgroup", e))?);
        }
        let (status_r, status_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| setup("status pipe", e.into()))?;
        // The descriptors the init gets besides stdio: (what, target number). Kept open until
        // the child has them.
        let mut passed: Vec<(i32, i32)> = Vec::new();
        let mut spec_file = None;
        let mut cmd = if self.is_unsandboxed() {
            if launch.image.is_some() {
                return Err(SandboxError::Unavailable(
                    "a session in an image needs the sandbox (sandbox.mode = \"enforce\"): \
                     without it commands would run on the host's own files"
                        .into(),
                ));
            }
            let mut c = match &launch.program {
                Program::Shell { command, .. } => {
                    let mut c = tokio::process::Command::new("/bin/bash");
                    c.arg("-c").arg(command);
                    c
                }
                Program::Exec { argv, .. } => {
                    let (program, args) = argv.split_first().ok_or_else(|| {
                        SandboxError::Setup("a program to exec needs its path".into())
                    })?;
                    let mut c = tokio::process::Command::new(program);
                    c.args(args);
                    c
                }
            };
            c.current_dir(launch.workspace.join(&launch.workdir));
            // Unsandboxed, the command's environment is simply bash's (or the program's).
            c.env_clear();
            for (k, v) in self.command_env(launch) {
                c.env(k, v);
            }
            c
        } else {
            let not_ready = |e: &String| SandboxError::Unavailable(e.clone());
            let init = self.init.as_ref().map_err(not_ready)?;
            let root = self.root.as_ref().map_err(not_ready)?;
            let spec = self.spec(launch)?.encode().map_err(|e| {
                SandboxError::Setup(format!("the command cannot be passed on: {e}"))
            })?;
            let file = image::spec_memfd(&spec).map_err(|e| setup("spec memfd", e))?;
            passed.push((status_w.as_raw_fd(), init::STATUS_FD));
            passed.push((file.as_raw_fd(), init::SPEC_FD));
            passed.push((root.as_raw_fd(), init::ROOT_FD));
            spec_file = Some(file);
            let mut c = tokio::process::Command::new(init.exec_path());
            // No arguments (the name only, which shows as /proc/1/cmdline's whole content) and
            // an empty environment: nothing reaches the init but through the spec.
            c.arg0("toolexec-sandbox-init");
            c.env_clear();
            c
        };
        cmd.stdin(stdin)
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true);
        let sandboxed = !self.is_unsandboxed();
        self.child_setup_for(&mut cmd, &procs, passed, sandboxed);
        let what = match &self.init {
            Ok(image) if sandboxed => image.origin.as_str(),
            _ => "/bin/bash",
        };
        let child = cmd
            .spawn()
            .map_err(|e| setup(&format!("starting {what}"), e))?;
        drop((status_w, spec_file, procs));
        let mut started = true;
        if sandboxed {
            // One byte from the init means every layer is in place; EOF means setup failed and
            // the reason is on the command's stderr.
            let read = tokio::task::spawn_blocking(move || {
                let mut byte = [0u8; 1];
                rustix::io::read(&status_r, &mut byte).map(|n| n == 1)
            });
            // Setting up takes milliseconds; an init stuck on the way is killed (with its
            // cgroup), which also ends the blocked read.
            match tokio::time::timeout(SETUP_TIMEOUT, read).await {
                Ok(Ok(read)) => started = matches!(read, Ok(true)),
                Ok(Err(e)) => return Err(SandboxError::Setup(format!("status pipe: {e}"))),
                Err(_) => {
                    if let Some(g) = &group {
                        g.kill();
                    }
                    let mut child = child;
                    let _ = child.start_kill();
                    return Err(SandboxError::Setup(format!(
                        "the sandbox was not set up within {} s",
                        SETUP_TIMEOUT.as_secs()
                    )));
                }
            }
        }
        Ok(Spawned {
            child,
            group,
            started,
        })
    }
}

/// In the forked child, before exec: join the cgroups (as root, before dropping privileges),
/// put the descriptors the init gets at their numbers, drop to the sandbox user, die with the
/// service.
fn child_setup(
    proc_fds: &[i32],
    passed: &[(i32, i32)],
    drop_to: Option<(u32, u32)>,
    rlimits: &[(libc::__rlimit_resource_t, u64)],
) -> io::Result<()> {
    let check = |rc: libc::c_int| {
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: raw system calls on descriptors and values owned by this (single-threaded) child.
    #[allow(unsafe_code)]
    unsafe {
        for fd in proc_fds {
            let rc = libc::write(*fd, b"0".as_ptr().cast(), 1);
            check(rc as libc::c_int)?;
        }
        // Each source first to a number above every target (a source may sit on another's
        // target number), then to its target; dup2 leaves the target without close-on-exec.
        let mut high = [-1; 8];
        for (slot, (source, _)) in high.iter_mut().zip(passed) {
            *slot = libc::fcntl(*source, libc::F_DUPFD_CLOEXEC, 16);
            check(*slot)?;
        }
        for (slot, (_, target)) in high.iter().zip(passed) {
            check(libc::dup2(*slot, *target))?;
        }
        // A session of its own: no controlling terminal shared with the service (a terminal
        // the command could push input into), and a process group for the unsandboxed
        // fallback tree kill.
        check(libc::setsid())?;
        for (resource, value) in rlimits {
            let lim = libc::rlimit {
                rlim_cur: *value,
                rlim_max: *value,
            };
            check(libc::setrlimit(*resource, &lim))?;
        }
        if let Some((uid, gid)) = drop_to {
            check(libc::setgroups(0, std::ptr::null()))?;
            check(libc::setresgid(gid, gid, gid))?;
            check(libc::setresuid(uid, uid, uid))?;
        }
        // After the credential change, which clears it.
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
    }
    Ok(())
}

fn probe_dir(root: &Path, owner: Option<(u32, u32)>) -> io::Result<PathBuf> {
    std::fs::create_dir_all(root)?;
    let dir = root.join(format!(
        "toolexec-probe-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&dir)?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))?;
    }
    Ok(dir)
}
