//! What the operator configures of the sandbox (`[sandbox]`): its mode and settings.

use super::*;

/// Whether commands run sandboxed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// Namespaces, unprivileged uid, Landlock, seccomp, cgroups; fail closed if unavailable.
    #[default]
    Enforce,
    /// No isolation at all: commands run as the service's user on the host. Only for
    /// development; shown in `/readyz` and on every shell result.
    Unsandboxed,
}

/// The operator's sandbox settings (`[sandbox]` in the config file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SandboxConfig {
    pub mode: SandboxMode,
    /// A statically linked `toolexec-sandbox-init` to use instead of the one built into the
    /// service (a dynamically linked file is refused). Default: the built-in one.
    pub init: Option<PathBuf>,
    /// The unprivileged user and group commands run as when the service is root.
    pub uid: u32,
    pub gid: u32,
    /// Host directories bound read-only at the same place in the sandbox (besides `/usr`, whose
    /// `/bin`, `/lib`, `/lib64`, `/sbin` links are recreated). Each must exist.
    pub ro_binds: Vec<PathBuf>,
    /// Size of the private `/tmp` (a tmpfs), bytes: a session's, for as long as its resident
    /// sandbox lives (its contents count against the session's memory), or a command's.
    pub tmp_size_bytes: u64,
    /// One sandbox per session, kept while the session runs commands (an agent forks each
    /// command: a fork and an exec per command), rather than one built and torn down for every
    /// command. Needs the service to be root with the cgroup v2 hierarchy (each command gets its
    /// own cgroup); otherwise commands get a sandbox each whatever this says.
    pub resident: bool,
    /// Memory of all the session's processes together, bytes.
    pub memory_bytes: u64,
    /// Processes (and threads) of all the session's processes together.
    pub pids: u64,
    /// CPU bandwidth of the session, in cores.
    pub cpu_cores: f64,
    /// CPU time of one command, seconds (RLIMIT_CPU).
    pub cpu_seconds: u64,
    /// Largest file a command may write, bytes (RLIMIT_FSIZE).
    pub file_size_bytes: u64,
    /// Open files per process (RLIMIT_NOFILE).
    pub open_files: u64,
    /// Output captured from one command (stdout and stderr together), bytes; past it the
    /// command is stopped.
    pub max_output_bytes: usize,
    /// Background processes a session may have running at once.
    pub max_background: usize,
    /// Longest a background process may run (unless its call asks for less), milliseconds.
    pub max_background_ms: u64,
    /// Variables of the service's environment passed to commands (for example a proxy setting).
    pub env_passthrough: Vec<String>,
    /// Whether sessions whose policy allows the network get egress (through the service's
    /// filtering proxy). When false, `policy.network = "allow"` is refused at session creation.
    pub egress: bool,
    /// Non-public networks the egress proxy may reach anyway (CIDRs, e.g. an internal package
    /// mirror). Loopback, private, link-local and metadata addresses are refused otherwise.
    pub egress_allow_cidrs: Vec<String>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        Self {
            mode: SandboxMode::Enforce,
            init: None,
            uid: 65534,
            gid: 65534,
            ro_binds: vec![PathBuf::from("/etc")],
            tmp_size_bytes: 256 * 1024 * 1024,
            resident: true,
            memory_bytes: 1024 * 1024 * 1024,
            pids: 256,
            cpu_cores: 1.0,
            cpu_seconds: 600,
            file_size_bytes: 1024 * 1024 * 1024,
            open_files: 1024,
            max_output_bytes: 1024 * 1024,
            max_background: 8,
            max_background_ms: 3_600_000,
            env_passthrough: Vec::new(),
            egress: true,
            egress_allow_cidrs: Vec::new(),
        }
    }
}
