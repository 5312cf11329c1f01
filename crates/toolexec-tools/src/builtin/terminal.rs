//! `exec_command` and `write_stdin`: Codex's unified exec — its names, arguments, defaults,
//! result block and error texts — over the session's terminals (`toolexec_sandbox::terminal`).
//!
//! What the model sees of a program's output is plain text: escape sequences (colours, cursor
//! moves, titles) are removed and a line rewritten with carriage returns (a progress bar) shows
//! its last state; the raw bytes are kept in the record (`terminal.output` events). Codex's
//! approval arguments (`sandbox_permissions`, `justification`, `prefix_rule`) are accepted and
//! ignored: a call waits for a person when the session's `policy.approval` says so, like any
//! call of a tool that runs processes.
use std::time::Duration;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use toolexec_core::{CallStatus, Capability, EventKind, OutputLimit, ToolSpec, TruncationMode};
use toolexec_sandbox::{TermError, TermRead};

use super::jail_failure;
use super::shell::{network_events, no_sandbox, sandbox_failure};
use crate::{Tool, ToolContext, ToolEvent, ToolOutput, parse_args};

const EXEC_DESCRIPTION: &str = "\
Runs a command in a terminal of the session's sandbox (Codex's exec_command) and returns its \
output after `yield_time_ms` or when it exits, whichever comes first. A program still running \
then gets a session ID: send it input and read its output with write_stdin.

`tty: false` (default): pipes, stdin closed to you (for builds, tests, servers whose output you \
poll). `tty: true`: a pseudo-terminal (80x24, or `cols`/`rows`), for programs that need one: \
REPLs (python3 -i, node), prompts, pagers, debuggers. TERM=dumb NO_COLOR=1 PAGER=cat are set; \
what you see has escape sequences removed. The command runs with `shell` (default /bin/bash) as \
a login shell (`login`, default true) in `workdir` (default /workspace). The sandbox is \
`shell`'s: no network unless the session's policy allows it.

Examples:
{\"cmd\": \"python3 -i\", \"tty\": true}
{\"cmd\": \"npm run dev\", \"yield_time_ms\": 5000}

Limits: yield_time_ms 250-30000 (default 10000); max_output_tokens (default 10000) caps the \
output returned (its middle is cut); at most 16 terminals open per session (an error past it); \
a terminal nobody touched for 30 minutes is killed; 1 MiB of unread output is kept per terminal \
(its beginning and end).";

const WRITE_DESCRIPTION: &str = "\
Writes `chars` to a running exec_command session (Codex's write_stdin) and returns its output \
since the last call: after `yield_time_ms` (default 250) or when it exits. Empty `chars` polls: \
it waits until output arrives or `yield_time_ms` passes (5000-300000 ms for a poll). End lines \
with \\n; \\u0003 is Ctrl-C, \\u0004 Ctrl-D (end of input). Only tty: true sessions take input.

`until` (a list of regular expressions) returns as soon as the output matches one, like \
`expect`; the block then says `Matched: N` (or `none`).

Examples:
{\"session_id\": 4711, \"chars\": \"print(6*7)\\n\"}
{\"session_id\": 4711, \"chars\": \"\", \"yield_time_ms\": 30000}";

/// Codex's defaults and bounds.
const DEFAULT_EXEC_YIELD_MS: u64 = 10_000;
const DEFAULT_WRITE_YIELD_MS: u64 = 250;
const MIN_YIELD_MS: u64 = 250;
const MAX_YIELD_MS: u64 = 30_000;
const MIN_POLL_MS: u64 = 5_000;
const MAX_POLL_MS: u64 = 300_000;
const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 10_000;
/// Bytes per token, as Codex approximates it.
const BYTES_PER_TOKEN: usize = 4;
/// Most raw output bytes one `terminal.output` event keeps (the rest is counted).
const MAX_RECORDED_RAW: usize = 256 * 1024;

fn spec(name: &str, description: &str, schema: serde_json::Value) -> ToolSpec {
    ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        input_schema: schema,
        read_only: false,
        capabilities: vec![Capability::Process, Capability::FsRead, Capability::FsWrite],
        // The block is cut by `max_output_tokens` already; this only bounds the worst case.
        output_limit: OutputLimit::new(200_000, TruncationMode::HeadTail),
    }
}

pub struct ExecCommand {
    spec: ToolSpec,
}

impl Default for ExecCommand {
    fn default() -> Self {
        Self::new()
    }
}

impl ExecCommand {
    pub fn new() -> Self {
        Self {
            spec: spec(
                "exec_command",
                EXEC_DESCRIPTION,
                crate::schema::arguments_schema::<ExecArgs>(),
            ),
        }
    }
}

pub struct WriteStdin {
    spec: ToolSpec,
}

impl Default for WriteStdin {
    fn default() -> Self {
        Self::new()
    }
}

impl WriteStdin {
    pub fn new() -> Self {
        Self {
            spec: spec(
                "write_stdin",
                WRITE_DESCRIPTION,
                crate::schema::arguments_schema::<WriteArgs>(),
            ),
        }
    }
}

/// `exec_command`'s arguments: Codex's, and `cols`/`rows`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ExecArgs {
    /// Shell command to execute.
    #[schemars(length(min = 1, max = 100_000))]
    cmd: String,
    /// Working directory, relative to /workspace or absolute under it (default /workspace).
    workdir: Option<String>,
    /// Shell binary to launch (default /bin/bash).
    #[schemars(length(min = 1, max = 200))]
    shell: Option<String>,
    /// Run the shell as a login shell (-l; default true).
    login: Option<bool>,
    /// Allocate a pseudo-terminal (default false): needed to send input later.
    tty: Option<bool>,
    /// How long to wait for output before returning, ms (default 10000, clamped to 250-30000).
    yield_time_ms: Option<u64>,
    /// Most tokens of output to return (default 10000).
    #[schemars(range(min = 1, max = 1_000_000))]
    max_output_tokens: Option<u64>,
    /// Terminal width with tty: true (default 80). An extension of Codex's arguments.
    #[schemars(range(min = 10, max = 1000))]
    cols: Option<u16>,
    /// Terminal height with tty: true (default 24). An extension of Codex's arguments.
    #[schemars(range(min = 2, max = 1000))]
    rows: Option<u16>,
    /// Codex's approval argument: accepted and ignored (the session's policy.approval decides).
    #[expect(dead_code, reason = "accepted for Codex compatibility")]
    #[schemars(length(max = 100))]
    sandbox_permissions: Option<String>,
    /// Codex's approval argument: accepted and ignored.
    #[expect(dead_code, reason = "accepted for Codex compatibility")]
    #[schemars(length(max = 10_000))]
    justification: Option<String>,
    /// Codex's approval argument: accepted and ignored.
    #[expect(dead_code, reason = "accepted for Codex compatibility")]
    #[schemars(length(max = 64))]
    prefix_rule: Option<Vec<String>>,
}

/// `write_stdin`'s arguments: Codex's.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    /// Identifier of the running exec_command session.
    session_id: u32,
    /// Bytes to write to stdin (may be empty to poll).
    #[schemars(length(max = 100_000))]
    chars: Option<String>,
    /// How long to wait for output before returning, ms (default 250; a poll 5000-300000).
    yield_time_ms: Option<u64>,
    /// Most tokens of output to return (default 10000).
    #[schemars(range(min = 1, max = 1_000_000))]
    max_output_tokens: Option<u64>,
    /// Return as soon as the output matches one of these regular expressions (Rust syntax, on the raw output), like `expect`: the output up to the end of the match comes back with a `Matched: N` line, the rest stays unread; `yield_time_ms` is then the most to wait (250-300000, default 30000). An extension of Codex's arguments.
    #[schemars(length(min = 1, max = 16))]
    until: Option<Vec<String>>,
}

/// Most characters of one `until` pattern.
const MAX_UNTIL_CHARS: usize = 1000;
/// Default wait with `until`.
const DEFAULT_UNTIL_YIELD_MS: u64 = 30_000;

/// `until`'s patterns, compiled: the earliest match wins, then the first pattern listed.
struct Patterns(Vec<regex::bytes::Regex>);

impl toolexec_sandbox::Until for Patterns {
    fn find(&self, haystack: &[u8]) -> Option<(usize, usize)> {
        self.0
            .iter()
            .enumerate()
            .filter_map(|(i, re)| re.find(haystack).map(|m| (m.start(), m.end(), i)))
            .min_by_key(|(start, _, i)| (*start, *i))
            .map(|(_, end, i)| (end, i))
    }
}

fn patterns(until: &[String]) -> Result<Patterns, String> {
    until
        .iter()
        .enumerate()
        .map(|(i, p)| {
            if p.chars().count() > MAX_UNTIL_CHARS {
                return Err(format!(
                    "`until[{i}]` is longer than {MAX_UNTIL_CHARS} characters."
                ));
            }
            regex::bytes::RegexBuilder::new(p)
                .size_limit(1 << 20)
                .build()
                .map_err(|e| format!("`until[{i}]` is not a regular expression: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Patterns)
}

fn invalid(text: String) -> ToolOutput {
    ToolOutput {
        status: CallStatus::InvalidArguments,
        content: text,
        changes: Vec::new(),
        events: Vec::new(),
        structured: None,
    }
}

#[async_trait]
impl Tool for ExecCommand {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: ExecArgs = match parse_args(args) {
            Ok(args) => args,
            Err(out) => return out,
        };
        let Some(table) = ctx.processes.clone() else {
            return no_sandbox();
        };
        if args.cmd.contains('\0') {
            return invalid("`cmd` contains a NUL character, which a shell cannot run.".into());
        }
        let workdir = match &args.workdir {
            None => String::new(),
            Some(w) => match ctx.workspace.open_dir(w) {
                Ok(dir) if dir.path() == "." => String::new(),
                Ok(dir) => dir.path().to_owned(),
                Err(e) => return jail_failure(&e),
            },
        };
        let shell = args.shell.as_deref().unwrap_or("/bin/bash");
        if !shell
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+".contains(&b))
        {
            return invalid(format!(
                "`shell` {shell:?} is not a program path (letters, digits and / . _ - + only)."
            ));
        }
        let flag = if args.login.unwrap_or(true) {
            "-lc"
        } else {
            "-c"
        };
        let quoted = format!("'{}'", args.cmd.replace('\'', r"'\''"));
        let shell_command = format!("exec {shell} {flag} {quoted}");
        let tty = args
            .tty
            .unwrap_or(false)
            .then(|| (args.cols.unwrap_or(80), args.rows.unwrap_or(24)));
        let yield_ms = args
            .yield_time_ms
            .unwrap_or(DEFAULT_EXEC_YIELD_MS)
            .clamp(MIN_YIELD_MS, MAX_YIELD_MS);
        let network = ctx.policy.network == toolexec_core::NetworkPolicy::Allow;
        let started = table
            .exec_terminal(
                &workdir,
                &shell_command,
                &args.cmd,
                tty,
                &ctx.env,
                network,
                ctx.max_terminals,
                Duration::from_millis(ctx.terminal_idle_timeout_ms),
                Duration::from_millis(yield_ms),
            )
            .await;
        let read = match started {
            Err(e) => return sandbox_failure(&e),
            Ok(Err(e)) => return term_failure(&e),
            Ok(Ok(read)) => read,
        };
        let mut out = respond(&read, args.max_output_tokens);
        out.events.insert(
            0,
            ToolEvent {
                blob: None,
                kind: EventKind::TerminalOpened,
                data: json!({
                    "terminal_id": read.id,
                    "command": args.cmd,
                    "workdir": workdir,
                    "tty": tty.is_some(),
                    "cols": tty.map(|t| t.0),
                    "rows": tty.map(|t| t.1),
                }),
            },
        );
        out.events.extend(network_events(&table));
        out
    }
}

#[async_trait]
impl Tool for WriteStdin {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: WriteArgs = match parse_args(args) {
            Ok(args) => args,
            Err(out) => return out,
        };
        let Some(table) = ctx.processes.clone() else {
            return no_sandbox();
        };
        let chars = args.chars.unwrap_or_default();
        if let Some(until) = &args.until {
            let until = match patterns(until) {
                Ok(p) => p,
                Err(e) => return invalid(e),
            };
            let yield_ms = args
                .yield_time_ms
                .unwrap_or(DEFAULT_UNTIL_YIELD_MS)
                .clamp(MIN_YIELD_MS, MAX_POLL_MS);
            return match table
                .terminal_input_until(
                    args.session_id,
                    chars.as_bytes(),
                    Duration::from_millis(yield_ms),
                    std::sync::Arc::new(until),
                )
                .await
            {
                Err(e) => term_failure(&e),
                Ok((read, matched)) => {
                    let mut out = respond(&read, args.max_output_tokens);
                    let line = match matched {
                        Some(i) => format!("Matched: {i}"),
                        None => "Matched: none".to_owned(),
                    };
                    // Before "Output:", among the block's header lines.
                    if let Some(at) = out.content.find("\nOriginal token count: ") {
                        out.content.insert_str(at, &format!("\n{line}"));
                    }
                    out.events.extend(network_events(&table));
                    out
                }
            };
        }
        let (yield_ms, until_output) = if chars.is_empty() {
            (
                args.yield_time_ms
                    .unwrap_or(MIN_POLL_MS)
                    .clamp(MIN_POLL_MS, MAX_POLL_MS),
                true,
            )
        } else {
            (
                args.yield_time_ms
                    .unwrap_or(DEFAULT_WRITE_YIELD_MS)
                    .clamp(MIN_YIELD_MS, MAX_YIELD_MS),
                false,
            )
        };
        match table
            .terminal_input(
                args.session_id,
                chars.as_bytes(),
                Duration::from_millis(yield_ms),
                until_output,
            )
            .await
        {
            Err(e) => term_failure(&e),
            Ok(read) => {
                let mut out = respond(&read, args.max_output_tokens);
                out.events.extend(network_events(&table));
                out
            }
        }
    }
}

fn term_failure(e: &TermError) -> ToolOutput {
    ToolOutput::error(match e {
        TermError::Unknown(id) => format!("write_stdin failed: Unknown process id {id}"),
        TermError::StdinClosed => {
            "stdin is closed for this session; rerun exec_command with tty=true to keep stdin open"
                .to_owned()
        }
        TermError::Write(why) => format!("write_stdin failed: {why}"),
    })
}

/// Codex's result block, and the record of what the program printed.
fn respond(read: &TermRead, max_output_tokens: Option<u64>) -> ToolOutput {
    let text = plain_text(&read.output);
    let original_tokens = text.len().div_ceil(BYTES_PER_TOKEN);
    let max_bytes = usize::try_from(max_output_tokens.unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS))
        .unwrap_or(usize::MAX)
        .saturating_mul(BYTES_PER_TOKEN);
    let mut shown = cut_middle(&text, max_bytes);
    if read.dropped > 0 {
        shown.insert_str(
            0,
            &format!(
                "[{} bytes of output were dropped from the middle: more than 1 MiB was not read]\n",
                read.dropped
            ),
        );
    }
    let chunk_id: String = uuid::Uuid::new_v4().as_bytes()[..3]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut lines = vec![
        format!("Chunk ID: {chunk_id}"),
        format!("Wall time: {:.4} seconds", read.wall.as_secs_f64()),
    ];
    match &read.exit {
        Some(exit) => {
            let code = exit.exit_code.unwrap_or(-1);
            lines.push(format!("Process exited with code {code}"));
            if let Some(why) = &exit.killed_by {
                lines.push(format!("Process was killed: {why}"));
            }
        }
        None => lines.push(format!("Process running with session ID {}", read.id)),
    }
    lines.push(format!("Original token count: {original_tokens}"));
    lines.push("Output:".to_owned());
    lines.push(shown);
    let status = match &read.exit {
        Some(e) if e.exit_code != Some(0) => CallStatus::Error,
        _ => CallStatus::Ok,
    };
    let mut events = Vec::new();
    if !read.output.is_empty() || read.dropped > 0 {
        let keep = read.output.len().min(MAX_RECORDED_RAW);
        events.push(ToolEvent {
            blob: None,
            kind: EventKind::TerminalOutput,
            data: json!({
                "terminal_id": read.id,
                "raw": String::from_utf8_lossy(&read.output[..keep]),
                "raw_bytes": read.output.len(),
                "raw_not_recorded": read.output.len() - keep,
                "dropped_bytes": read.dropped,
            }),
        });
    }
    if let Some(exit) = &read.exit {
        events.push(ToolEvent {
            blob: None,
            kind: EventKind::TerminalExited,
            data: json!({
                "terminal_id": read.id,
                "exit_code": exit.exit_code,
                "killed_by": exit.killed_by,
            }),
        });
    }
    ToolOutput {
        status,
        content: lines.join("\n"),
        changes: Vec::new(),
        events,
        structured: None,
    }
}

/// `text` cut to `max` bytes: its beginning and its end, the middle said.
fn cut_middle(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut head = max / 2;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - (max - head);
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    let cut = (tail - head).div_ceil(BYTES_PER_TOKEN);
    format!(
        "{}\n…{cut} tokens truncated…\n{}",
        &text[..head],
        &text[tail..]
    )
}

/// What a terminal shows, as text: escape sequences (CSI, OSC, DCS, two-byte ESC ones) and
/// control characters other than newline and tab removed, `\r\n` as a newline, a line rewritten
/// with `\r` (a progress bar) as its last state, a backspace removing the character before it.
pub fn plain_text(raw: &[u8]) -> String {
    let mut bytes = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b == 0x1b {
            match raw.get(i + 1) {
                Some(b'[') => {
                    i += 2;
                    while i < raw.len() && !(0x40..=0x7e).contains(&raw[i]) {
                        i += 1;
                    }
                    i += 1;
                }
                Some(b']' | b'P' | b'_' | b'^' | b'X') => {
                    i += 2;
                    while i < raw.len() {
                        if raw[i] == 0x07 {
                            i += 1;
                            break;
                        }
                        if raw[i] == 0x1b && raw.get(i + 1) == Some(&b'\\') {
                            i += 2;
                            break;
                        }
                        i += 1;
                    }
                }
                Some(b'(' | b')' | b'*' | b'+' | b'#' | b'%') => i += 3,
                Some(_) => i += 2,
                None => i += 1,
            }
            continue;
        }
        match b {
            b'\n' | b'\t' | b'\r' | 0x08 => bytes.push(b),
            0..=0x1f | 0x7f => {}
            _ => bytes.push(b),
        }
        i += 1;
    }
    let text = String::from_utf8_lossy(&bytes).replace("\r\n", "\n");
    let mut out = String::with_capacity(text.len());
    for (n, line) in text.split('\n').enumerate() {
        if n > 0 {
            out.push('\n');
        }
        // The last non-empty state of a line rewritten with carriage returns.
        let last = line.split('\r').rfind(|s| !s.is_empty()).unwrap_or("");
        let mut shown = String::with_capacity(last.len());
        for c in last.chars() {
            if c == '\u{8}' {
                shown.pop();
            } else {
                shown.push(c);
            }
        }
        out.push_str(&shown);
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn colours_titles_and_progress_bars_become_plain_text() {
        let raw = b"\x1b[1;31mred\x1b[0m\r\n\x1b]0;title\x07 10%\r 50%\r100%\nab\x08c\n";
        assert_eq!(plain_text(raw), "red\n100%\nac\n");
    }

    #[test]
    fn until_finds_the_earliest_match_then_the_first_pattern() {
        use toolexec_sandbox::Until;
        let p = patterns(&["b+".into(), "a".into(), "ab".into()]).unwrap();
        // "a" starts first; "ab" starts there too but is listed after it.
        assert_eq!(p.find(b"xxabbb"), Some((3, 1)));
        assert_eq!(p.find(b"xxbbb"), Some((5, 0)));
        assert_eq!(p.find(b"zzz"), None);
        assert!(patterns(&["(".into()]).is_err());
        assert!(patterns(&["x".repeat(1001)]).is_err());
    }

    #[test]
    fn the_middle_is_cut_on_character_boundaries() {
        let s = "é".repeat(100);
        let cut = cut_middle(&s, 21);
        assert!(cut.contains("tokens truncated"), "{cut}");
        assert_eq!(cut_middle("short", 10), "short");
    }
}
