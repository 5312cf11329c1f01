//! The tools: each one a file under `builtin/`, each registered with one line in
//! [`Registry::builtin`]. A tool gets validated, typed arguments and a [`ToolContext`] (the
//! session's workspace jail and read-state) and returns a [`ToolOutput`]: what the model reads
//! plus the file changes it made, which the engine records.
//!
//! Tools never touch the filesystem except through [`Workspace`], which resolves every
//! path in the kernel beneath the workspace directory (`openat2` with `RESOLVE_BENEATH`).
//!
//! [`toolexec_workspace::scan`] finds what a process (a sandboxed shell command) changed in the workspace, recorded
//! like the file tools' changes.
//!
//! Shared by several tools: [`patch`] (the apply_patch format, parsing and applying to text),
//! `walk` (the jailed tree walk of grep and glob, with `.gitignore` rules, bounded in entries
//! and time), `text` (decoding files for editing, line endings, near-match hints) and
//! [`deadline`] (a call's time limit, which long loops check and mutations commit against).
//! [`web`] is the fetch of the web tools, through the network policy of toolexec-net.
//! [`operator`] holds the tools an operator adds by configuration (custom commands, OpenAPI
//! operations, an MCP server's tools).
//!
//! A tool failure is data for the model ([`ToolOutput`] with an error status), never a Rust error
//! that could turn into an HTTP error.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use toolexec_core::{CallStatus, Capability, EventKind, Policy, ToolSpec};
use uuid::Uuid;

pub mod builtin;
pub mod deadline;
pub mod observe;
pub mod operator;
pub mod patch;
pub mod reads;
pub mod registry;
pub mod schema;
pub mod search;
pub(crate) mod text;
pub(crate) mod walk;
pub mod web;

pub use deadline::Deadline;
pub use reads::{CallReads, ReadTracker};
pub use registry::{ArgumentError, Registry, Resolved};
pub use toolexec_workspace::{RecordedChange, Workspace};

/// What a tool runs against: one session's workspace, its read-state and its policy, and the
/// recorded outputs of the session's earlier calls.
#[derive(Clone)]
pub struct ToolContext {
    pub session_id: Uuid,
    pub workspace: Arc<Workspace>,
    /// The session's read-state, as this call sees and records it.
    pub reads: CallReads,
    pub policy: Policy,
    pub env: BTreeMap<String, String>,
    pub outputs: Arc<dyn OutputSource>,
    /// The session's sandbox and background processes; `None` where no commands can run (the
    /// process tools then say so).
    pub processes: Option<Arc<toolexec_sandbox::ProcessTable>>,
    /// The operator's ceiling on a command's timeout, milliseconds.
    pub max_timeout_ms: u64,
    /// Bytes of file text one read_file or read_many_files call may return (the operator's
    /// `limits.max_read_bytes_per_call`).
    pub max_read_bytes: usize,
    /// Directory entries one walk (grep, glob, list_dir) may read before it stops and says
    /// its result is partial (the operator's `limits.max_walk_entries`).
    pub max_walk_entries: usize,
    /// Terminals (`exec_command`) a session may have open (`limits.max_terminals_per_session`).
    pub max_terminals: usize,
    /// How long a terminal may go untouched before it is killed, milliseconds.
    pub terminal_idle_timeout_ms: u64,
    /// When this call must stop (see [`deadline`]); [`Deadline::none`] until the engine runs
    /// the call with [`run_within_deadline`].
    pub deadline: Deadline,
    /// Cancelled when the client stops the call. [`run_within_deadline`] stops a tool with a
    /// deadline the way its deadline would (abandoned unless its change has begun); tools
    /// without one (commands) watch it themselves: `shell` kills its command, `process_read`
    /// stops waiting.
    pub cancel: CancellationToken,
    /// What the web tools may reach (the operator's network policy and resolver) and the
    /// summarizer of `web_fetch`'s `prompt`.
    pub web: Arc<web::WebAccess>,
    /// Where the web tools' observations come from: the network, or in a verify replay the
    /// record of the call being re-run.
    pub observed: observe::Observed,
    /// What the call's web tools sent and got back, as they go: the engine records whatever is
    /// in it when the call ends, also when the tool was abandoned halfway.
    pub journal: Arc<observe::Journal>,
    /// The tenant the session belongs to (per-tenant quotas of the operator's paid services).
    pub tenant_id: Uuid,
    /// The session's todos (plan steps and tasks), as its log folds them.
    pub todos: Arc<std::sync::Mutex<toolexec_core::todo::Todos>>,
    /// The session's disk quota (bytes), when its workspace is a filesystem of that size: a
    /// command that leaves it full is told so.
    pub disk_quota: Option<u64>,
}

/// Default of [`ToolContext::max_read_bytes`]: 1 MiB, more than any output limit a session can
/// be shown (200,000 characters) needs, and small enough that a call's output stays cheap to
/// hold and to record.
pub const DEFAULT_MAX_READ_BYTES: usize = 1024 * 1024;

/// Default of [`ToolContext::max_walk_entries`]: a large source tree (the Linux kernel has about
/// 85,000 files and directories) fits; a workspace full of generated files stops after about a
/// second of walking instead of holding a thread for minutes.
pub const DEFAULT_MAX_WALK_ENTRIES: usize = 200_000;

impl ToolContext {
    /// A context with a fresh read-state, the default policy and no recorded outputs.
    pub fn new(session_id: Uuid, workspace: Arc<Workspace>) -> Self {
        Self {
            session_id,
            workspace,
            reads: CallReads::new(Arc::new(ReadTracker::default())),
            policy: Policy::default(),
            env: BTreeMap::new(),
            outputs: Arc::new(NoOutputs),
            processes: None,
            max_timeout_ms: 600_000,
            max_read_bytes: DEFAULT_MAX_READ_BYTES,
            max_walk_entries: DEFAULT_MAX_WALK_ENTRIES,
            max_terminals: 16,
            terminal_idle_timeout_ms: 30 * 60 * 1000,
            deadline: Deadline::none(),
            cancel: CancellationToken::new(),
            web: Arc::new(web::WebAccess::default()),
            observed: observe::Observed::Live,
            journal: Arc::new(observe::Journal::default()),
            tenant_id: Uuid::nil(),
            todos: Arc::default(),
            disk_quota: None,
        }
    }
}

/// The deadline a call of `spec` gets from the operator's per-call time limit. Tools that run
/// commands (they declare [`Capability::Process`]) have none: their own time limits (a shell
/// call's `timeout_ms`, `process_read`'s `wait_ms`) are what the model chose and the sandbox
/// enforces.
pub fn deadline_for(spec: &ToolSpec, limit: std::time::Duration) -> Deadline {
    if spec.capabilities.contains(&Capability::Process) {
        Deadline::none()
    } else {
        Deadline::after(limit)
    }
}

/// Runs `tool` within `ctx.deadline`: the tool is expected to stop by itself at the deadline
/// with what it has (`timed_out`); if it has not answered [`deadline::STOP_GRACE`] later, it
/// is stuck where it cannot check the clock, and the call ends `timed_out` without output —
/// unless the tool had already begun its change ([`Deadline::commit_change`]), which is then
/// waited for so that it is recorded as it happened.
///
/// A cancel (`ctx.cancel`) stops it the same way, at once: abandoned (`cancelled`, no output,
/// nothing changed) if its change has not begun, else waited for, keeping its real result.
/// Tools without a deadline (commands) are left to watch `ctx.cancel` themselves.
pub async fn run_within_deadline(
    tool: &dyn Tool,
    ctx: &ToolContext,
    args: serde_json::Value,
) -> ToolOutput {
    let (Some(remaining), Some(budget)) = (ctx.deadline.remaining(), ctx.deadline.budget()) else {
        return tool.run(ctx, args).await;
    };
    let mut run = std::pin::pin!(tool.run(ctx, args));
    let cancelled = tokio::select! {
        // A result that is there wins over a stop that comes at the same moment.
        biased;
        out = &mut run => return out,
        () = ctx.cancel.cancelled() => true,
        () = tokio::time::sleep(remaining + deadline::STOP_GRACE) => false,
    };
    if !ctx.deadline.abandon() {
        // Its change is under way: it is waited for and recorded as it happened.
        return run.await;
    }
    let spec = tool.spec();
    let nothing_changed = if spec.read_only {
        ""
    } else {
        ", and nothing was changed"
    };
    if cancelled {
        return ToolOutput::cancelled(format!(
            "{} was cancelled by the client before it finished; it has no result to show{nothing_changed}.",
            spec.name
        ));
    }
    tracing::warn!(tool = %spec.name, session = %ctx.session_id, "tool did not stop at its deadline; abandoned");
    ToolOutput::timed_out(format!(
        "{} did not finish within its time limit of {} and was stopped; it has no \
         result to show{nothing_changed}. Narrow the call (a smaller `path`, fewer files) or use \
         the shell for long work.",
        spec.name,
        deadline::human_duration(budget),
    ))
}

/// Where `read_output` finds the full output of an earlier invocation: the recording store, as
/// the engine provides it. Only invocations of the asking session are visible.
#[async_trait]
pub trait OutputSource: Send + Sync {
    /// The full output as recorded, or a sentence for the model saying why there is none.
    async fn output(&self, session_id: Uuid, invocation_id: Uuid)
    -> Result<RecordedOutput, String>;

    /// The `process.started` record of a background process of this session, if the log has
    /// one (a process of an earlier run of the service, gone with it).
    async fn process_started(
        &self,
        _session_id: Uuid,
        _process_id: &str,
    ) -> Option<serde_json::Value> {
        None
    }
}

/// An earlier invocation's output as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedOutput {
    pub text: String,
    /// Characters of the output the tool produced: more than `text` holds when the service
    /// recorded only its beginning and end (`limits.max_stored_output_bytes`).
    pub output_chars: usize,
}

impl RecordedOutput {
    /// `output_chars` as the invocation recorded it (`None`: the text is all there was).
    pub fn new(text: String, output_chars: Option<i64>) -> Self {
        let stored = text.chars().count();
        Self {
            output_chars: output_chars
                .and_then(|n| usize::try_from(n).ok())
                .unwrap_or(stored),
            text,
        }
    }
}

/// No recorded outputs (a context outside a running service).
#[derive(Debug, Clone, Copy)]
pub struct NoOutputs;

#[async_trait]
impl OutputSource for NoOutputs {
    async fn output(&self, _: Uuid, invocation_id: Uuid) -> Result<RecordedOutput, String> {
        Err(format!(
            "No recorded output for invocation {invocation_id}."
        ))
    }
}

/// A log event a tool adds besides file changes (for example `plan.updated`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolEvent {
    pub kind: EventKind,
    pub data: serde_json::Value,
    /// Bytes the event names by SHA-256 (a fetched body), stored as a blob with it. If the
    /// engine does not store them (over `limits.max_blob_bytes`), it sets the event's
    /// `body_stored` to false.
    pub blob: Option<bytes::Bytes>,
}

impl ToolEvent {
    pub fn new(kind: EventKind, data: serde_json::Value) -> Self {
        Self {
            kind,
            data,
            blob: None,
        }
    }
}

/// What a tool returns: the full text for the model (the engine truncates it), its file changes
/// and any other events it records.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub status: CallStatus,
    pub content: String,
    pub changes: Vec<RecordedChange>,
    pub events: Vec<ToolEvent>,
    /// Machine-readable parts of the result, beside the text: `shell`'s stdout and stderr
    /// apart (what OpenAI's `shell_call_output` is built from, so no output can pass for a
    /// section of the text), `bash`'s `shell_restarted`. Handed to the call's result in the
    /// response that ran it; not stored.
    pub structured: Option<serde_json::Value>,
}

impl ToolOutput {
    pub fn ok(content: impl Into<String>) -> Self {
        Self {
            status: CallStatus::Ok,
            content: content.into(),
            changes: Vec::new(),
            events: Vec::new(),
            structured: None,
        }
    }

    pub fn error(content: impl Into<String>) -> Self {
        Self {
            status: CallStatus::Error,
            content: content.into(),
            changes: Vec::new(),
            events: Vec::new(),
            structured: None,
        }
    }

    /// Stopped at the call's deadline; `content` is what it had so far and says so.
    pub fn timed_out(content: impl Into<String>) -> Self {
        Self {
            status: CallStatus::TimedOut,
            content: content.into(),
            changes: Vec::new(),
            events: Vec::new(),
            structured: None,
        }
    }

    /// Stopped because the client cancelled the call; `content` says what had happened.
    pub fn cancelled(content: impl Into<String>) -> Self {
        Self {
            status: CallStatus::Cancelled,
            content: content.into(),
            changes: Vec::new(),
            events: Vec::new(),
            structured: None,
        }
    }

    pub fn denied(content: impl Into<String>) -> Self {
        Self {
            status: CallStatus::Denied,
            content: content.into(),
            changes: Vec::new(),
            events: Vec::new(),
            structured: None,
        }
    }

    pub fn with_change(mut self, change: RecordedChange) -> Self {
        self.changes.push(change);
        self
    }
}

/// A tool. Implementations live in `builtin/`, one file each.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    fn spec(&self) -> &ToolSpec;

    /// Runs with arguments that already passed `spec().input_schema`. A tool whose work can
    /// be long checks `ctx.deadline` and returns what it has when it expires; a tool that
    /// changes the workspace calls [`Deadline::commit_change`] right before its first change
    /// and changes nothing if it answers `false` (see [`deadline`]).
    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput;

    /// Why this service cannot run the tool at all (a provider the operator did not
    /// configure), for the catalog; `None` when it can. Its calls then fail with that reason.
    fn unavailable(&self, _web: &web::WebAccess) -> Option<String> {
        None
    }
}

/// Deserializes validated arguments into a tool's typed struct. A failure here is reported to
/// the model as `invalid_arguments` by the caller, naming the field. A whole number written as
/// `1.0` is an integer to JSON Schema, so it is one here too.
pub fn parse_args<T: serde::de::DeserializeOwned>(
    mut args: serde_json::Value,
) -> Result<T, ToolOutput> {
    toolexec_core::json::integral_floats_as_integers(&mut args);
    serde_path_to_error::deserialize(args).map_err(|e| {
        let at = e.path().to_string();
        let field = if at == "." {
            String::new()
        } else {
            format!(" at '{at}'")
        };
        ToolOutput {
            status: CallStatus::InvalidArguments,
            content: format!(
                "Invalid arguments{field}: {}. Check the tool's input schema and try again.",
                e.into_inner()
            ),
            changes: Vec::new(),
            events: Vec::new(),
            structured: None,
        }
    })
}
