//! `bash`: Anthropic's bash tool (`bash_20250124`: `command`, `restart`) over one persistent
//! shell per session, kept in the session's sandbox between calls (see
//! `toolexec_sandbox::bash` for how a command's end is found).
use std::time::Duration;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{CallStatus, Capability, OutputLimit, ToolSpec, TruncationMode};
use toolexec_sandbox::{BashLimits, BashRun, KillReason};

use super::shell::{UNSANDBOXED_NOTE, full_disk_note, network_events, no_sandbox, sandbox_failure};
use crate::{Tool, ToolContext, ToolOutput, parse_args};

const DESCRIPTION: &str = "\
Runs a command in a persistent bash shell: one shell per session, kept between calls, so the \
working directory, exported variables, functions and an activated virtualenv carry over from \
one call to the next. `restart: true` replaces it with a fresh shell (in /workspace, nothing \
kept).

The shell runs in the session's sandbox, like `shell`: an unprivileged user, only /workspace \
and a private /tmp writable, no network unless the session's policy grants it. stdin is empty \
(/dev/null): commands that prompt get end-of-file, so pass flags such as `-y` or `--no-input`; \
for programs you must talk to (a REPL, a prompt) use exec_command with tty: true and \
write_stdin. stdout and stderr come back together, in the order they were written, then \
`[exit code N]` when it is not 0. Every file the command changes in /workspace is recorded.

Time: 2 minutes a call (the session's default timeout when it sets one, up to the operator's \
ceiling). Past it the command is interrupted (SIGINT, then its processes are killed) and the \
shell is kept; a shell that does not come back is restarted, and the result says its state was \
lost. Background jobs (`cmd &`) keep running between calls until the shell is restarted; their \
output comes with the next call's.

Examples:
{\"command\": \"cd backend && source .venv/bin/activate\"}
{\"command\": \"pytest -x -q 2>&1 | tail -n 30\"}
{\"restart\": true}

Limits: output is captured up to the operator's cap (1 MiB by default; past it the command is \
stopped) and you see at most 50,000 characters (the beginning and the end; read_output pages \
through the rest).";

/// Default time a call may take when the session sets no default timeout.
pub const DEFAULT_TIMEOUT_MS: u64 = 120_000;

pub struct Bash {
    spec: ToolSpec,
}

impl Default for Bash {
    fn default() -> Self {
        Self::new()
    }
}

impl Bash {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "bash".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: false,
                capabilities: vec![Capability::Process, Capability::FsRead, Capability::FsWrite],
                output_limit: OutputLimit::new(50_000, TruncationMode::HeadTail),
            },
        }
    }
}

/// `bash`'s arguments: exactly Anthropic's `bash_20250124`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The bash command to run in the session's shell. Required unless restart is true.
    #[schemars(length(max = 100_000))]
    command: Option<String>,
    /// Replace the shell with a fresh one (nothing of the old one's state is kept). With a command, the command runs in the fresh shell.
    restart: Option<bool>,
}

#[async_trait]
impl Tool for Bash {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(out) => return out,
        };
        let restart = args.restart.unwrap_or(false);
        let command = args.command.filter(|c| !c.trim().is_empty());
        if command.is_none() && !restart {
            return invalid(
                "Give `command` (the bash command to run), or `restart: true` for a fresh shell.",
            );
        }
        if command.as_deref().is_some_and(|c| c.contains('\0')) {
            return invalid("`command` contains a NUL character, which bash cannot run.");
        }
        let Some(table) = ctx.processes.clone() else {
            return no_sandbox();
        };
        let timeout_ms = ctx
            .policy
            .default_timeout_ms
            .unwrap_or(DEFAULT_TIMEOUT_MS)
            .min(ctx.max_timeout_ms);
        let limits = BashLimits {
            timeout: Duration::from_millis(timeout_ms),
            max_output_bytes: table.sandbox().config().max_output_bytes,
            cancel: ctx.cancel.clone(),
        };
        let network = ctx.policy.network == toolexec_core::NetworkPolicy::Allow;
        let unsandboxed = table.sandbox().is_unsandboxed();
        match table
            .bash(command.as_deref(), restart, &ctx.env, network, &limits)
            .await
        {
            Err(e) => sandbox_failure(&e),
            Ok(run) => {
                let mut out = if command.is_none() {
                    ToolOutput::ok(
                        "The shell was restarted: the next command runs in a fresh bash in /workspace.",
                    )
                } else {
                    render(&run, restart)
                };
                if unsandboxed {
                    out.content.insert_str(0, UNSANDBOXED_NOTE);
                }
                if let Some(note) = full_disk_note(ctx) {
                    out.content.push_str(&note);
                }
                out.events.extend(network_events(&table));
                out
            }
        }
    }
}

fn invalid(text: &str) -> ToolOutput {
    ToolOutput {
        status: CallStatus::InvalidArguments,
        content: text.to_owned(),
        changes: Vec::new(),
        events: Vec::new(),
        structured: None,
    }
}

/// The model's view of one call.
fn render(run: &BashRun, restarted_on_request: bool) -> ToolOutput {
    let mut text = String::new();
    let lost_before = run
        .previous_lost
        .as_deref()
        .filter(|_| !restarted_on_request);
    if let Some(why) = lost_before {
        text.push_str(&format!(
            "[the shell was restarted, state was lost: {why}. This command ran in a fresh shell: the working directory is /workspace, exports, functions and aliases are back to their defaults]\n"
        ));
    }
    text.push_str(&String::from_utf8_lossy(&run.output));
    if !run.output.is_empty() && !run.output.ends_with(b"\n") {
        text.push('\n');
    }
    if run.output.is_empty() && run.exit_code == Some(0) {
        text.push_str("(no output)\n");
    }
    let lost =
        "the shell was restarted, state was lost: the next call starts a fresh shell in /workspace";
    let note = match (run.stopped, run.exit_code) {
        (Some(why), code) => {
            let what = match why {
                KillReason::Timeout(t) => format!("timed out after {} ms", t.as_millis()),
                KillReason::Idle(t) => format!("no output for {} ms", t.as_millis()),
                KillReason::OutputLimit(n) => format!(
                    "stopped: the command printed more than {n} bytes, the output cap (redirect bulky output to a file and look at it with grep or tail)"
                ),
                KillReason::Cancelled => "cancelled by the client".to_owned(),
            };
            if run.restarted {
                Some(format!(
                    "[{what}: the command was interrupted (SIGINT, then its processes killed), the shell did not come back; {lost}]"
                ))
            } else {
                Some(format!(
                    "[{what}: the command was interrupted (SIGINT, then its processes killed){}; the shell and its state are kept]",
                    code.map(|c| format!(", exit code {c}")).unwrap_or_default()
                ))
            }
        }
        (None, _) if run.shell_ended.is_some() => Some(format!(
            "[{}; {lost}]",
            run.shell_ended.as_deref().unwrap_or("the shell ended")
        )),
        (None, _) if run.restarted => Some(format!("[{lost}]")),
        (None, Some(0)) => None,
        (None, Some(code)) => Some(format!("[exit code {code}]")),
        (None, None) => Some("[the command's end was not reported]".to_owned()),
    };
    if let Some(note) = note {
        text.push_str(&note);
        text.push('\n');
    }
    let status = match (run.stopped, run.exit_code) {
        (Some(KillReason::Timeout(_) | KillReason::Idle(_)), _) => CallStatus::TimedOut,
        (Some(KillReason::Cancelled), _) => CallStatus::Cancelled,
        (None, Some(0)) if run.shell_ended.is_none() && !run.restarted => CallStatus::Ok,
        _ => CallStatus::Error,
    };
    ToolOutput {
        status,
        content: text,
        changes: Vec::new(),
        events: Vec::new(),
        // `shell_restarted`: this command ran in a fresh shell because the previous one was
        // lost (not on request), `lost_because` why; `shell_lost_after`: the shell ended during
        // the call, the next one starts fresh.
        structured: Some(serde_json::json!({
            "shell_restarted": lost_before.is_some(),
            "lost_because": lost_before,
            "shell_lost_after": run.restarted || run.shell_ended.is_some(),
            "exit_code": run.exit_code,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_shell_is_flagged_in_the_structured_result_unless_restarted_on_request() {
        let run = BashRun {
            output: b"hi\n".to_vec(),
            exit_code: Some(0),
            previous_lost: Some("the session's runtime was rebuilt".into()),
            fresh: true,
            ..BashRun::default()
        };
        let out = render(&run, false);
        let s = out.structured.clone().unwrap_or_default();
        assert_eq!(s["shell_restarted"], true, "{s}");
        assert_eq!(s["lost_because"], "the session's runtime was rebuilt");
        assert_eq!(s["shell_lost_after"], false);
        assert!(
            out.content.starts_with(
                "[the shell was restarted, state was lost: the session's runtime was rebuilt."
            ),
            "{}",
            out.content
        );
        let asked = render(&run, true);
        let s = asked.structured.unwrap_or_default();
        assert_eq!(s["shell_restarted"], false, "{s}");
        assert!(s["lost_because"].is_null());
        assert_eq!(asked.content, "hi\n");
    }
}
