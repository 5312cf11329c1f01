//! `shell`: run a bash command in the session's sandbox, in the foreground or in the background.
use std::time::Duration;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use toolexec_core::{CallStatus, Capability, EventKind, OutputLimit, ToolSpec, TruncationMode};
use toolexec_sandbox::{Finished, KillReason, RunLimits, SandboxError};

use super::jail_failure;
use crate::{Tool, ToolContext, ToolEvent, ToolOutput, parse_args};

const DESCRIPTION: &str = "\
Runs a command with `/bin/bash -c` in a sandbox whose working directory is /workspace (your \
workspace, read-write). Returns the exit code, then stdout and stderr as two separate sections.

Use it to build, run tests, run scripts, use git, install into the workspace, and for file \
operations the file tools do not cover (moving directories, archives). Prefer read_file, grep, \
glob and edit_file/apply_patch for reading, searching and editing: they are faster, their output \
is made for you, and edits through them are checked.

The sandbox: an unprivileged user with no capabilities; only /workspace and a private /tmp are \
writable (the system directories are read-only); no network unless the session's policy grants \
it, and then only HTTP and HTTPS to public addresses through a proxy the sandbox is already set \
up to use (HTTP_PROXY/HTTPS_PROXY; tools that ignore them have no network); no access to other \
sessions, to the host's processes or to the service. HOME is /workspace; \
stdin is empty (/dev/null), so commands that prompt get end-of-file: pass flags such as `-y` or \
`--no-input` instead. Every file the command creates, changes or deletes in /workspace is \
recorded, and files you read earlier and a command changed must be read again before you edit \
them.

Time: `timeout_ms` (default 10 s unless the session sets another, at most the operator's ceiling, \
600 s by default). When it expires the command and every process it started are killed and the \
output so far is returned with a 'timed out' note. `idle_timeout_ms` also stops a command that \
prints nothing for that long (useful for commands that might wait for input). Processes a \
command leaves running in the background (`cmd &`, daemons) are killed when it exits: for a \
server or a watcher use `background: true`, which returns a process id at once; then use \
process_read to see its output, process_write to send it input and process_kill to stop it.

Examples:
{\"command\": \"cargo test --quiet 2>&1 | tail -n 50\", \"timeout_ms\": 120000}
{\"command\": \"python -m pytest -x -q\", \"workdir\": \"backend\"}
{\"command\": \"python -m http.server 8000\", \"background\": true}

Limits: output is captured up to the operator's cap (1 MiB by default; past it the command is \
stopped) and you see at most 50,000 characters (the beginning and the end; read_output pages \
through the rest). Memory, processes, CPU and file sizes are limited per session.";

pub struct Shell {
    spec: ToolSpec,
}

impl Default for Shell {
    fn default() -> Self {
        Self::new()
    }
}

/// Default timeout when the session does not set one (SPEC §4).
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;

impl Shell {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "shell".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: false,
                capabilities: vec![Capability::Process, Capability::FsRead, Capability::FsWrite],
                output_limit: OutputLimit::new(50_000, TruncationMode::HeadTail),
            },
        }
    }
}

/// `shell`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The bash command line to run (bash -c).
    #[schemars(length(min = 1, max = 100_000))]
    command: String,
    /// Stop the command after this many milliseconds (default: the session's default timeout, 10000 unless set; capped by the operator's maximum). Ignored with background: true unless given.
    #[schemars(range(min = 1, max = 600_000))]
    timeout_ms: Option<u64>,
    /// Stop the command if it prints nothing for this many milliseconds.
    #[schemars(range(min = 100, max = 600_000))]
    idle_timeout_ms: Option<u64>,
    /// Working directory, relative to /workspace or absolute under it (default /workspace). It must exist.
    #[schemars(length(min = 1))]
    workdir: Option<String>,
    /// What the command does, in a few words (recorded, shown to people reviewing the session).
    #[schemars(length(max = 1000))]
    #[expect(
        dead_code,
        reason = "recorded with the arguments; not used to run the command"
    )]
    description: Option<String>,
    /// Start the command and return its process id at once, without waiting for it to finish.
    background: Option<bool>,
}

/// The message for a sandbox that cannot run commands (an operator problem, not the model's).
pub(crate) fn sandbox_failure(e: &SandboxError) -> ToolOutput {
    match e {
        SandboxError::Limit(m) => ToolOutput::error(m.clone()),
        SandboxError::AgentLost(why) => ToolOutput::error(format!(
            "Infrastructure error, not a problem with your command: the session's sandbox stopped while the command ran ({why}). Its processes, background ones included, are gone, and /tmp is empty again; files it wrote in /workspace stay. The next command starts a fresh sandbox: check what the command changed, then run it again if needed."
        )),
        e => ToolOutput::error(format!(
            "Infrastructure error, not a problem with your command: {e}. Nothing was run. Retrying will not help until the operator fixes the sandbox; continue with the file tools if you can."
        )),
    }
}

pub(crate) fn no_sandbox() -> ToolOutput {
    ToolOutput::error(
        "Commands cannot run here: this service has no sandbox configured for the session. Use the file tools instead.",
    )
}

#[async_trait]
impl Tool for Shell {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(out) => return out,
        };
        let Some(table) = ctx.processes.clone() else {
            return no_sandbox();
        };
        let workdir = match &args.workdir {
            None => String::new(),
            Some(w) => match ctx.workspace.open_dir(w) {
                Ok(dir) if dir.path() == "." => String::new(),
                Ok(dir) => dir.path().to_owned(),
                Err(e) => return jail_failure(&e),
            },
        };
        let ceiling = ctx.max_timeout_ms;
        let default = ctx
            .policy
            .default_timeout_ms
            .unwrap_or(DEFAULT_TIMEOUT_MS)
            .min(ceiling);
        if let Some(t) = args.timeout_ms
            && t > ceiling
        {
            return ToolOutput {
                status: CallStatus::InvalidArguments,
                content: format!(
                    "timeout_ms {t} is above this service's ceiling of {ceiling} ms. Use at most {ceiling}, or run long jobs with background: true and poll them with process_read."
                ),
                changes: Vec::new(),
                events: Vec::new(),
                structured: None,
            };
        }
        let unsandboxed = table.sandbox().is_unsandboxed();
        let network = ctx.policy.network == toolexec_core::NetworkPolicy::Allow;
        if args.background.unwrap_or(false) {
            let cfg = table.sandbox().config();
            let lifetime = Duration::from_millis(args.timeout_ms.unwrap_or(cfg.max_background_ms));
            return match table
                .start(&workdir, &args.command, &ctx.env, network, lifetime)
                .await
            {
                Err(e) => sandbox_failure(&e),
                Ok(info) => {
                    let mut out = ToolOutput::ok(format!(
                        "{}Started background process {id}. It runs until it exits, is stopped with process_kill, or reaches its time limit of {secs} s. Next: process_read with process_id \"{id}\" (and wait_ms to wait for output) to see what it prints; process_write sends it input.",
                        if unsandboxed { UNSANDBOXED_NOTE } else { "" },
                        id = info.id,
                        secs = lifetime.as_secs(),
                    ));
                    out.events.extend(network_events(&table));
                    out.events.push(ToolEvent {
                        blob: None,
                        kind: EventKind::ProcessStarted,
                        data: json!({
                            "process_id": info.id,
                            "command": args.command,
                            "workdir": workdir,
                            "time_limit_ms": lifetime.as_millis() as u64,
                            "sandboxed": !unsandboxed,
                        }),
                    });
                    out
                }
            };
        }
        let limits = RunLimits {
            timeout: Duration::from_millis(args.timeout_ms.unwrap_or(default)),
            idle_timeout: args.idle_timeout_ms.map(Duration::from_millis),
            max_output_bytes: table.sandbox().config().max_output_bytes,
            cancel: ctx.cancel.clone(),
        };
        match table
            .run(&workdir, &args.command, &ctx.env, network, &limits)
            .await
        {
            Err(e) => sandbox_failure(&e),
            Ok(f) => {
                let mut out = render(&f, unsandboxed, table.sandbox().config().memory_bytes);
                if let Some(note) = full_disk_note(ctx) {
                    out.content.push_str(&note);
                }
                out.events.extend(network_events(&table));
                out
            }
        }
    }
}

/// The session's connections through its egress proxy that ended since the last `shell` call
/// (this command's, and a background process's): one `network.request` event each, and a last
/// one counting those past the proxy's 1,000 kept records.
pub(crate) fn network_events(table: &toolexec_sandbox::ProcessTable) -> Vec<ToolEvent> {
    let (records, more) = table.drain_egress();
    let mut events: Vec<ToolEvent> = records
        .into_iter()
        .map(|r| ToolEvent {
            blob: None,
            kind: EventKind::NetworkRequest,
            data: json!({
                "method": r.method,
                "host": r.host,
                "port": r.port,
                "allowed": r.allowed,
                "refused": r.refused,
                "bytes_sent": r.bytes_sent,
                "bytes_received": r.bytes_received,
                "duration_ms": r.duration_ms,
            }),
        })
        .collect();
    if more > 0 {
        events.push(ToolEvent {
            blob: None,
            kind: EventKind::NetworkRequest,
            data: json!({"not_recorded": more}),
        });
    }
    events
}

pub(crate) const UNSANDBOXED_NOTE: &str =
    "[UNSANDBOXED: the operator disabled the sandbox; this command ran directly on the host]\n";

/// Characters of each of stdout and stderr kept in the structured result (the beginning and
/// the end, as the text's limit).
const STRUCTURED_STREAM_CHARS: usize = 50_000;

/// A finished command's streams apart, for renderings that hand them over separately (OpenAI's
/// `shell_call_output`): `stdout`, `stderr` (each cut to its beginning and end past
/// [`STRUCTURED_STREAM_CHARS`]), `exit_code` (128 + the signal for a signal; `null` when the
/// command was stopped before it ended), `timed_out`, and `note`: the status line when the
/// command did not simply exit (a limit, a signal, the memory limit, an unsandboxed service).
fn structured_run(f: &Finished, unsandboxed: bool, status: &str) -> serde_json::Value {
    let limit = OutputLimit::new(STRUCTURED_STREAM_CHARS, TruncationMode::HeadTail);
    let cut = |bytes: &[u8]| {
        toolexec_core::truncate::truncate(
            &String::from_utf8_lossy(bytes),
            limit,
            "the call's full output has the rest",
        )
        .0
    };
    let mut note = String::new();
    if unsandboxed {
        note.push_str(UNSANDBOXED_NOTE);
    }
    if f.killed.is_some() || !status.starts_with("[exit code ") || status.contains(':') {
        note.push_str(status);
        note.push('\n');
    }
    let exit_code = match (f.killed, f.exit_code, f.signal) {
        (Some(_), ..) => None,
        (None, Some(code), _) => Some(code),
        (None, None, Some(sig)) => Some(128 + sig),
        (None, None, None) => None,
    };
    serde_json::json!({
        "stdout": cut(&f.stdout),
        "stderr": cut(&f.stderr),
        "exit_code": exit_code,
        "timed_out": matches!(f.killed, Some(KillReason::Timeout(_) | KillReason::Idle(_))),
        "note": note,
    })
}

/// The model's view of a finished command.
/// When the session's disk quota is (all but) used up after a command: what the model should
/// know, since the command's own error (`No space left on device`) does not say it is a quota.
pub(crate) fn full_disk_note(ctx: &ToolContext) -> Option<String> {
    let quota = ctx.disk_quota?;
    let st = rustix::fs::statvfs(ctx.workspace.root_path()).ok()?;
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    (free < (quota / 100).max(256 * 1024)).then(|| {
        format!(
            "[the session's workspace is full: its disk quota of {} MiB is used up, so writes \
             fail with 'No space left on device'. Delete what you no longer need (build \
             outputs, caches, large logs), then run the command again]\n",
            quota / (1024 * 1024)
        )
    })
}

fn render(f: &Finished, unsandboxed: bool, memory_bytes: u64) -> ToolOutput {
    let mut text = String::new();
    if unsandboxed {
        text.push_str(UNSANDBOXED_NOTE);
    }
    let secs = f.duration.as_secs_f64();
    let status = match (f.killed, f.exit_code, f.signal) {
        (Some(KillReason::Timeout(t)), ..) => {
            format!(
                "[timed out after {} ms: the command and every process it started were killed; output so far below]",
                t.as_millis()
            )
        }
        (Some(KillReason::Idle(t)), ..) => format!(
            "[stopped: no output for {} ms. The command was probably waiting for input (stdin is empty) or hung; pass non-interactive flags (-y, --no-input, CI=1) or run it with background: true and use process_write]",
            t.as_millis()
        ),
        (Some(KillReason::Cancelled), ..) => format!(
            "[cancelled after {secs:.2} s: the client stopped this call; the command and every process it started were killed; output so far below. Files it changed before it was stopped are recorded; check them before running it again]"
        ),
        (Some(KillReason::OutputLimit(n)), ..) => format!(
            "[stopped: the command printed more than {n} bytes, the output cap; output so far below. Redirect bulky output to a file and inspect it with grep or read_file, or pipe it through tail/head]"
        ),
        (None, Some(code), _) if f.oom_killed => format!(
            "[exit code {code} after {secs:.2} s: a process was killed for going over the session's memory limit of {} MiB]",
            memory_bytes / (1024 * 1024)
        ),
        (None, Some(code), _) if code > 128 && code < 160 => format!(
            "[exit code {code} after {secs:.2} s: killed by signal {}{}]",
            code - 128,
            if f.oom_killed { " (out of memory)" } else { "" }
        ),
        (None, Some(code), _) => format!("[exit code {code} after {secs:.2} s]"),
        (None, None, Some(sig)) => format!("[killed by signal {sig} after {secs:.2} s]"),
        (None, None, None) => format!("[ended after {secs:.2} s]"),
    };
    text.push_str(&status);
    text.push('\n');
    let structured = structured_run(f, unsandboxed, &status);
    let section = |name: &str, bytes: &[u8], text: &mut String| {
        if bytes.is_empty() {
            return;
        }
        text.push_str(&format!("--- {name} ---\n"));
        text.push_str(&String::from_utf8_lossy(bytes));
        if !bytes.ends_with(b"\n") {
            text.push('\n');
        }
    };
    if f.stdout.is_empty() && f.stderr.is_empty() {
        text.push_str("(no output)\n");
    }
    section("stdout", &f.stdout, &mut text);
    section("stderr", &f.stderr, &mut text);
    let status = match (f.killed, f.exit_code) {
        (Some(KillReason::Timeout(_) | KillReason::Idle(_)), _) => CallStatus::TimedOut,
        (Some(KillReason::Cancelled), _) => CallStatus::Cancelled,
        (None, Some(0)) => CallStatus::Ok,
        _ => CallStatus::Error,
    };
    ToolOutput {
        status,
        content: text,
        changes: Vec::new(),
        events: Vec::new(),
        structured: Some(structured),
    }
}
