//! The session's persistent bash (the `bash` tool): one shell per session, started in the
//! session's sandbox like any command (same user, namespaces, Landlock, seccomp, cgroup) on the
//! first call, kept between calls so that the working directory, exports, functions and an
//! activated virtualenv carry over.
//!
//! # How a command's end is found without trusting its output
//!
//! The shell is `bash --noprofile --norc` reading its script from a pipe only the service writes
//! (its stdin), with three descriptors of its own:
//!
//! ```text
//! fd 0  the script pipe (service → bash)
//! fd 1  the output pipe (bash → service); fd 4 a copy of it, made by the first line
//! fd 2  the status pipe (bash → service): only the service reads it
//! ```
//!
//! Each call sends one line, the command quoted as one single-quoted word:
//!
//! ```text
//! { eval 'COMMAND' ; } </dev/null >&4 2>&4 4>&- ; printf '\036TXB<nonce> %d\n' "$?" >&2
//! ```
//!
//! - The command runs in the shell itself (`eval` in a brace group: no subshell), so what it
//!   changes stays; its stdin is empty, its stdout and stderr are the output pipe, and the status
//!   pipe is *not among its descriptors*: bash keeps its copy aside (close-on-exec, so no program
//!   the command starts has it) and puts it back when the group ends. Whatever the command
//!   prints, `exec 1>&-` included, lands on the output pipe or nowhere, never on the status pipe.
//! - The end is the status line: a per-call nonce of 128 random bits, with the group's exit
//!   status, on the status pipe. The nonce is written with `\036` escapes, so the line bash reads
//!   does not contain the marker's bytes; it is never in the shell's variables or environment,
//!   and since the whole line is parsed before the command runs, nothing of it is left in the
//!   script pipe for a command to read. A line on the status pipe that is not exactly this
//!   call's marker (bash's own messages outside the group, `set -x` traces) is shown as output.
//! - The command is quoted by the service (one single-quoted word), so the line is always valid
//!   bash whatever the command holds: a syntax error in the command is `eval`'s error (status
//!   2), never a shell left waiting for the rest of a quote.
//!
//! What remains: the command is bash code running in the shell, so a builtin can reach the
//! shell's saved copy of the status pipe (`>&10`); without the nonce it can only write text
//! that is shown as output. A shell that exits (`exit`, `kill -9 $$`, `exec` of another
//! program) is seen as its process ending; the result says its state was lost, and the next
//! call starts a fresh one.
//!
//! # Time limits
//!
//! Past its limit (or when the client cancels the call, or its output passes the cap) the
//! command's processes — every process in the shell's cgroup but the shell — get SIGINT, then
//! SIGKILL two seconds later; the shell survives and reports the status as usual. If it has not
//! within two more seconds (a loop of builtins, a `read` of its own), it is killed with its
//! cgroup: "the shell was restarted, state was lost". Without a resident sandbox (no cgroup to
//! find the command's processes by) a timeout always restarts the shell.
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::cgroup::CommandGroup;
use crate::run::{KillReason, Lost, Process};

/// How long a signalled command gets before the next step.
const STEP_GRACE: Duration = Duration::from_secs(2);
/// Longest a write of a command line may wait for the shell to read it.
const WRITE_LIMIT: Duration = Duration::from_secs(5);
/// Most bytes of shell messages (status pipe text that is not the marker) kept per call.
const MAX_MESSAGES: usize = 64 * 1024;
/// The first line the shell runs: the copy of the output pipe each command's group uses.
pub(crate) const BOOTSTRAP: &str = "exec 4>&1\n";

/// The limits of one `bash` call.
#[derive(Debug, Clone)]
pub struct BashLimits {
    pub timeout: Duration,
    /// Output kept; past it the command is stopped.
    pub max_output_bytes: usize,
    pub cancel: CancellationToken,
}

/// How a `bash` call ended.
#[derive(Debug, Clone, Default)]
pub struct BashRun {
    /// stdout and stderr of the command, as one stream, at most the cap.
    pub output: Vec<u8>,
    /// The command's exit status, when the shell reported it.
    pub exit_code: Option<i32>,
    /// Set when the service stopped the command.
    pub stopped: Option<KillReason>,
    /// The shell had to be killed (it did not come back after its command was killed): the
    /// next call starts a fresh one.
    pub restarted: bool,
    /// The shell itself ended during the command (`exit`, a signal): why.
    pub shell_ended: Option<String>,
    /// The shell was gone before this call (its sandbox ended, or it ended after the last
    /// call): this call ran in a fresh one.
    pub previous_lost: Option<String>,
    /// This call started the shell (its first, after `restart`, or after one was lost).
    pub fresh: bool,
    pub duration: Duration,
}

/// A running persistent shell.
pub(crate) struct Shell {
    pub(crate) stdin: tokio::net::unix::pipe::Sender,
    pub(crate) output: tokio::net::unix::pipe::Receiver,
    pub(crate) status: tokio::net::unix::pipe::Receiver,
    pub(crate) process: Process,
    pub(crate) group: Option<CommandGroup>,
    /// The shell's host pid, when it is a resident command (its cgroup then holds it and what
    /// it runs).
    pub(crate) pid: Option<i32>,
    pub(crate) network: bool,
    /// The session's admission, held while the shell lives.
    pub(crate) _admitted: Option<Box<dyn std::any::Any + Send + Sync>>,
    /// Set once the shell is known to have ended.
    pub(crate) ended: Option<String>,
}

impl Drop for Shell {
    fn drop(&mut self) {
        if let Some(g) = &self.group {
            g.kill_nowait();
        }
        self.process.start_kill();
    }
}

/// The command as one single-quoted bash word.
fn quote(command: &str) -> String {
    format!("'{}'", command.replace('\'', r"'\''"))
}

fn nonce() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // No randomness: a nonce from the clock and the address space is still unknown to the
        // command (it never sees the line), if weaker.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes.copy_from_slice(&t.to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn describe_status(status: Result<std::process::ExitStatus, Lost>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) if code > 128 && code < 160 => {
                format!("the shell was killed by signal {}", code - 128)
            }
            (Some(code), _) => format!("the shell exited with status {code}"),
            (None, Some(sig)) => format!("the shell was killed by signal {sig}"),
            _ => "the shell ended".to_owned(),
        },
        Err(Lost::Agent(why)) => format!("the session's sandbox stopped ({why})"),
        Err(Lost::Wait(e)) => format!("the shell could not be waited for ({e})"),
    }
}

/// Finds `marker` followed by digits and a newline in `buf`: the text before it and the status.
fn find_marker(buf: &[u8], marker: &[u8]) -> Option<(usize, usize, i32)> {
    let at = buf.windows(marker.len()).position(|w| w == marker)?;
    let rest = &buf[at + marker.len()..];
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let code = std::str::from_utf8(&rest[..nl]).ok()?.parse().ok()?;
    Some((at, at + marker.len() + nl + 1, code))
}

impl Shell {
    /// Whether the shell is still there; the reason it is not, otherwise.
    pub(crate) async fn check_alive(&mut self) -> Result<(), String> {
        if let Some(why) = &self.ended {
            return Err(why.clone());
        }
        let done = tokio::select! {
            biased;
            s = self.process.wait() => Some(s),
            () = std::future::ready(()) => None,
        };
        match done {
            None => Ok(()),
            Some(s) => {
                let why = describe_status(s);
                self.ended = Some(why.clone());
                Err(why)
            }
        }
    }

    /// Output already in the pipe, without waiting.
    fn drain_now(&mut self, into: &mut Vec<u8>, cap: usize, dropped: &mut u64) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match self.output.try_read(&mut buf) {
                Ok(0) => break,
                Ok(n) => keep(into, &buf[..n], cap, dropped),
                Err(_) => break,
            }
        }
    }

    /// Signals every process of the shell's cgroup but the shell. False when there is no way to
    /// tell them apart (the shell must then be killed).
    fn signal_command(&self, sig: rustix::process::Signal) -> bool {
        let (Some(group), Some(shell)) = (&self.group, self.pid) else {
            return false;
        };
        for pid in group.pids() {
            if pid == shell {
                continue;
            }
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, sig);
            }
        }
        true
    }

    /// Kills the shell and everything it runs.
    pub(crate) async fn kill(&mut self) {
        if let Some(g) = &self.group {
            g.kill_nowait();
        }
        self.process.start_kill();
        // A process whose end was seen already is not waited for again (it never ends twice).
        if self.ended.is_none() {
            let _ = tokio::time::timeout(STEP_GRACE, self.process.wait()).await;
        }
        self.ended
            .get_or_insert_with(|| "the shell was killed".to_owned());
    }

    /// Runs one command to its end (or its limit).
    pub(crate) async fn run(&mut self, command: &str, limits: &BashLimits) -> BashRun {
        let t0 = Instant::now();
        let cap = limits.max_output_bytes;
        let mut run = BashRun::default();
        let mut dropped = 0u64;
        // What background jobs printed since the last call comes first.
        self.drain_now(&mut run.output, cap, &mut dropped);
        let nonce = nonce();
        let line = format!(
            "\n{{ eval {} ; }} </dev/null >&4 2>&4 4>&- ; printf '\\036TXB{} %d\\n' \"$?\" >&2\n",
            quote(command),
            nonce
        );
        let marker = format!("\x1eTXB{nonce} ").into_bytes();
        let written = tokio::time::timeout(WRITE_LIMIT, async {
            self.stdin.write_all(line.as_bytes()).await?;
            self.stdin.flush().await
        })
        .await;
        if !matches!(written, Ok(Ok(()))) {
            // The shell does not read its script: it ended, or is stuck.
            let why = match self.check_alive().await {
                Err(why) => why,
                Ok(()) => "the shell did not read its next command".to_owned(),
            };
            self.kill().await;
            run.shell_ended = Some(why);
            run.restarted = true;
            run.duration = t0.elapsed();
            return run;
        }
        let mut messages: Vec<u8> = Vec::new();
        let mut obuf = vec![0u8; 64 * 1024];
        let mut sbuf = vec![0u8; 4096];
        let mut output_open = true;
        let mut status_open = true;
        let deadline = tokio::time::Instant::now() + limits.timeout;
        // Escalation once the command is being stopped: 0 = SIGINT sent, 1 = SIGKILL sent.
        let mut step: Option<(u8, tokio::time::Instant)> = None;
        loop {
            let wake = step.map_or(deadline, |(_, at)| at);
            tokio::select! {
                n = self.output.read(&mut obuf), if output_open => match n {
                    Ok(0) | Err(_) => output_open = false,
                    Ok(n) => {
                        keep(&mut run.output, &obuf[..n], cap, &mut dropped);
                        if dropped > 0 && run.stopped.is_none() {
                            run.stopped = Some(KillReason::OutputLimit(cap));
                            step = Some(self.stop_step(None));
                        }
                    }
                },
                n = self.status.read(&mut sbuf), if status_open => match n {
                    Ok(0) | Err(_) => status_open = false,
                    Ok(n) => {
                        messages.extend_from_slice(&sbuf[..n]);
                        if let Some((before, after, code)) = find_marker(&messages, &marker) {
                            let rest = messages.split_off(after);
                            messages.truncate(before);
                            messages.extend_from_slice(&rest);
                            run.exit_code = Some(code);
                            self.drain_now(&mut run.output, cap, &mut dropped);
                            break;
                        }
                        if messages.len() > MAX_MESSAGES {
                            // Not a marker: text. Keep the tail that could start one.
                            let cut = messages.len() - marker.len() - 16;
                            let head: Vec<u8> = messages.drain(..cut).collect();
                            keep(&mut run.output, &head, cap, &mut dropped);
                        }
                    }
                },
                s = self.process.wait() => {
                    let why = describe_status(s);
                    self.ended = Some(why.clone());
                    run.shell_ended = Some(why);
                    // What it printed last is in the pipe already.
                    self.drain_now(&mut run.output, cap, &mut dropped);
                    break;
                }
                () = limits.cancel.cancelled(), if run.stopped.is_none() => {
                    run.stopped = Some(KillReason::Cancelled);
                    step = Some(self.stop_step(None));
                }
                () = tokio::time::sleep_until(wake) => {
                    match step {
                        None => {
                            run.stopped = Some(KillReason::Timeout(limits.timeout));
                            step = Some(self.stop_step(None));
                        }
                        Some((0, _)) => step = Some(self.stop_step(Some(0))),
                        Some(_) => {
                            // The shell did not come back: it goes, with its state.
                            self.kill().await;
                            self.drain_now(&mut run.output, cap, &mut dropped);
                            run.restarted = true;
                            break;
                        }
                    }
                }
            }
            if !status_open && !output_open {
                // Both pipes closed: the shell ended (its end is reported a moment later), or
                // closed them and cannot be driven any more.
                match tokio::time::timeout(STEP_GRACE, self.process.wait()).await {
                    Ok(s) => {
                        let why = describe_status(s);
                        self.ended = Some(why.clone());
                        run.shell_ended = Some(why);
                    }
                    Err(_) => {
                        self.kill().await;
                        run.restarted = true;
                    }
                }
                break;
            }
        }
        if !messages.is_empty() {
            keep(&mut run.output, &messages, cap, &mut dropped);
        }
        run.duration = t0.elapsed();
        run
    }

    /// The next step of stopping the command: SIGINT first (`None`), SIGKILL after it; when the
    /// command's processes cannot be told from the shell's, straight to killing the shell.
    fn stop_step(&self, previous: Option<u8>) -> (u8, tokio::time::Instant) {
        let now = tokio::time::Instant::now();
        let (sig, n) = match previous {
            None => (rustix::process::Signal::INT, 0),
            Some(_) => (rustix::process::Signal::KILL, 1),
        };
        if self.signal_command(sig) {
            (n, now + STEP_GRACE)
        } else {
            // Nothing to signal but the shell: the next wake kills it.
            (1, now)
        }
    }
}

/// Appends `bytes` up to `cap`, counting what did not fit.
fn keep(into: &mut Vec<u8>, bytes: &[u8], cap: usize, dropped: &mut u64) {
    let room = cap.saturating_sub(into.len());
    let take = room.min(bytes.len());
    into.extend_from_slice(&bytes[..take]);
    *dropped += (bytes.len() - take) as u64;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn quoting_keeps_the_command_one_word() {
        assert_eq!(quote("echo 'a b'"), r"'echo '\''a b'\'''");
        assert_eq!(quote(""), "''");
    }

    #[test]
    fn the_marker_needs_the_nonce_and_a_number() {
        let m = b"\x1eTXBabc ";
        assert_eq!(find_marker(b"xx\x1eTXBabc 7\nyy", m), Some((2, 12, 7)));
        assert_eq!(find_marker(b"\x1eTXBabd 7\n", m), None);
        assert_eq!(find_marker(b"\x1eTXBabc 7", m), None);
        assert_eq!(find_marker(b"\x1eTXBabc x\n", m), None);
        assert_eq!(nonce().len(), 32);
        assert_ne!(nonce(), nonce());
    }
}
