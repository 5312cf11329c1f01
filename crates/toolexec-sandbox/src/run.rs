//! A foreground command: run to the end (or to a limit), capturing stdout and stderr, whether it
//! runs in a sandbox of its own or is forked by the session's resident agent.
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

use std::os::fd::AsFd;

use crate::cgroup::SessionGroup;
use crate::resident::{Agent, SpareEnd, Started};
use crate::{Launch, Sandbox, SandboxError, Spawned};

/// When the service stops a command.
#[derive(Debug, Clone)]
pub struct RunLimits {
    pub timeout: Duration,
    /// Stop the command after this long without any output.
    pub idle_timeout: Option<Duration>,
    /// stdout and stderr together; past it the command is stopped.
    pub max_output_bytes: usize,
    /// Cancelled when the client asks to stop the call: the command's whole tree is killed and
    /// what it printed so far comes back, like at a timeout. A token nobody cancels (`new()`)
    /// for commands no one can stop.
    pub cancel: CancellationToken,
}

/// Why the service stopped a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    Timeout(Duration),
    Idle(Duration),
    OutputLimit(usize),
    /// The client cancelled the call (its token in [`RunLimits::cancel`]).
    Cancelled,
}

/// How a command ended.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The exit code of bash (`None` if it was killed by a signal).
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Set when the service stopped the command.
    pub killed: Option<KillReason>,
    /// The kernel's OOM killer struck a process of the command.
    pub oom_killed: bool,
    pub duration: Duration,
}

/// How long output is still read after the command exited (its processes are all dead by then,
/// so the pipes are at EOF at once unless something escaped).
const DRAIN_GRACE: Duration = Duration::from_secs(2);
const CHUNK: usize = 64 * 1024;

/// A started command, as the service waits for its end.
pub(crate) enum Process {
    /// The service's own child: a per-command init (its exit status is the command's) or, with
    /// the sandbox off, bash itself.
    Child(tokio::process::Child),
    /// Forked by the session's resident agent, which reports its end.
    Resident(Option<tokio::sync::oneshot::Receiver<SpareEnd>>),
}

/// Why waiting for a command ended without its exit status.
pub(crate) enum Lost {
    Wait(std::io::Error),
    Agent(String),
}

impl Process {
    /// Waits for the command's end. Cancel-safe.
    pub(crate) async fn wait(&mut self) -> Result<std::process::ExitStatus, Lost> {
        match self {
            Process::Child(child) => child.wait().await.map_err(Lost::Wait),
            Process::Resident(exit) => {
                let Some(rx) = exit.as_mut() else {
                    return std::future::pending().await;
                };
                let end = rx.await;
                *exit = None;
                match end {
                    Ok(SpareEnd::Exited(status)) => Ok(like_an_init(status)),
                    Ok(SpareEnd::AgentGone(why) | SpareEnd::NotStarted(why)) => {
                        Err(Lost::Agent(why))
                    }
                    Err(_) => Err(Lost::Agent(
                        "its agent stopped reporting (the session is closing)".into(),
                    )),
                }
            }
        }
    }

    /// Host pid of the service's child, if it is one.
    pub(crate) fn child_pid(&self) -> Option<u32> {
        match self {
            Process::Child(c) => c.id(),
            Process::Resident(_) => None,
        }
    }

    /// Kills the service's child (a resident command is killed through its cgroup alone).
    pub(crate) fn start_kill(&mut self) {
        if let Process::Child(c) = self {
            let _ = c.start_kill();
        }
    }
}

/// A resident command's status as a per-command sandbox reports it (its init exits with bash's
/// status, `128 + signal` when bash was killed), so that results read the same either way.
fn like_an_init(status: i32) -> std::process::ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    let raw = std::process::ExitStatus::from_raw(status);
    match raw.signal() {
        Some(sig) => std::process::ExitStatus::from_raw(((128 + sig) & 0xff) << 8),
        None => raw,
    }
}

/// A command's output pipes, as the service reads them.
pub(crate) type Pipe = Box<dyn AsyncRead + Unpin + Send>;

impl Sandbox {
    /// Runs a command in a sandbox built for it alone, to its end or until a limit stops it,
    /// with `input` on its stdin (else `/dev/null`). On return, no process of the command is
    /// left.
    pub async fn run(
        &self,
        launch: &Launch,
        session: Option<&SessionGroup>,
        limits: &RunLimits,
        input: Option<Vec<u8>>,
    ) -> Result<Finished, SandboxError> {
        let t0 = Instant::now();
        let oom_before = session.map_or(0, SessionGroup::oom_kills);
        let stdin = if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        };
        let Spawned {
            mut child,
            group,
            started,
        } = self
            .spawn(launch, session, stdin, Stdio::piped(), Stdio::piped())
            .await?;
        if !started {
            return Err(SandboxError::Setup(setup_failure(child).await));
        }
        // Written beside the reading of the output (a pipe holds 64 KiB): a command that reads
        // its input slowly, or not at all, holds up nothing. Its end of file closes the pipe.
        let writer = match (input, child.stdin.take()) {
            (Some(bytes), Some(mut pipe)) => Some(tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let _ = pipe.write_all(&bytes).await;
                let _ = pipe.shutdown().await;
            })),
            _ => None,
        };
        let stdout = child.stdout.take().map(|p| Box::new(p) as Pipe);
        let stderr = child.stderr.take().map(|p| Box::new(p) as Pipe);
        let mut process = Process::Child(child);
        let finished = self
            .drive(
                &mut process,
                group,
                stdout,
                stderr,
                session,
                oom_before,
                limits,
                t0,
            )
            .await;
        if let Some(w) = writer {
            w.abort();
        }
        finished
    }

    /// Runs a command through a session's resident agent.
    pub(crate) async fn run_resident(
        &self,
        agent: &Agent,
        launch: &Launch,
        session: Option<&SessionGroup>,
        limits: &RunLimits,
    ) -> Result<Finished, SandboxError> {
        let t0 = Instant::now();
        let oom_before = session.map_or(0, SessionGroup::oom_kills);
        let setup = |what: &str, e: std::io::Error| SandboxError::Setup(format!("{what}: {e}"));
        let spec = self
            .command_spec(launch)
            .encode()
            .map_err(|e| SandboxError::Setup(format!("the command cannot be passed on: {e}")))?;
        let null = self.dev_null().map_err(|e| setup("/dev/null", e))?;
        let (out_r, out_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| setup("output pipe", e.into()))?;
        let (err_r, err_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| setup("output pipe", e.into()))?;
        let started = agent
            .start_command(&spec, [null, out_w.as_fd(), err_w.as_fd()])
            .await;
        // Only the command holds its pipes' write ends now: their end of file is its end.
        drop((out_w, err_w));
        let Started { group, exit, .. } = started?;
        let pipe = |fd| {
            tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
                .map(|p| Box::new(p) as Pipe)
                .map_err(|e| setup("output pipe", e))
        };
        let (stdout, stderr) = (pipe(out_r)?, pipe(err_r)?);
        let mut process = Process::Resident(Some(exit));
        self.drive(
            &mut process,
            Some(group),
            Some(stdout),
            Some(stderr),
            session,
            oom_before,
            limits,
            t0,
        )
        .await
    }

    /// Reads a started command's output until it ended (or a limit stopped it), then makes sure
    /// nothing of it is left.
    #[allow(clippy::too_many_arguments)]
    async fn drive(
        &self,
        process: &mut Process,
        group: Option<crate::cgroup::CommandGroup>,
        mut stdout: Option<Pipe>,
        mut stderr: Option<Pipe>,
        session: Option<&SessionGroup>,
        oom_before: u64,
        limits: &RunLimits,
        t0: Instant,
    ) -> Result<Finished, SandboxError> {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let deadline = tokio::time::Instant::now() + limits.timeout;
        let mut last_output = tokio::time::Instant::now();
        let mut killed = None;
        let mut status = None;
        let mut drain_until: Option<tokio::time::Instant> = None;
        loop {
            if stdout.is_none() && stderr.is_none() && status.is_some() {
                break;
            }
            let idle_at = limits.idle_timeout.map(|d| last_output + d);
            let wake = match drain_until {
                Some(t) => t,
                None => idle_at.map_or(deadline, |i| i.min(deadline)),
            };
            tokio::select! {
                n = read_some(&mut stdout, &mut out) => {
                    match n {
                        Some(_) => last_output = tokio::time::Instant::now(),
                        None => stdout = None,
                    }
                }
                n = read_some(&mut stderr, &mut err) => {
                    match n {
                        Some(_) => last_output = tokio::time::Instant::now(),
                        None => stderr = None,
                    }
                }
                s = process.wait(), if status.is_none() => {
                    status = Some(s);
                    // Anything the command left behind (`sleep 1000 &`, a setsid daemon) dies
                    // with it: its cgroup is killed (and a per-command sandbox's PID namespace
                    // is gone).
                    if let Some(g) = &group { g.kill_nowait(); }
                    drain_until = Some(tokio::time::Instant::now() + DRAIN_GRACE);
                }
                // Only while the command runs and nothing else stopped it: once cancelled, the
                // token stays cancelled, and the loop goes on to drain what is left.
                () = limits.cancel.cancelled(), if killed.is_none() && status.is_none() => {
                    killed = Some(KillReason::Cancelled);
                    self.stop(process, group.as_ref()).await;
                }
                _ = tokio::time::sleep_until(wake) => {
                    if drain_until.is_some() {
                        break;
                    }
                    killed = Some(if idle_at.is_some_and(|i| i <= tokio::time::Instant::now() && i < deadline) {
                        KillReason::Idle(limits.idle_timeout.unwrap_or_default())
                    } else {
                        KillReason::Timeout(limits.timeout)
                    });
                    self.stop(process, group.as_ref()).await;
                }
            }
            if killed.is_none() && out.len() + err.len() > limits.max_output_bytes {
                killed = Some(KillReason::OutputLimit(limits.max_output_bytes));
                self.stop(process, group.as_ref()).await;
            }
        }
        let status = match status {
            Some(s) => s,
            None => process.wait().await,
        };
        drop(group);
        let status = match status {
            Ok(s) => s,
            Err(Lost::Wait(e)) => {
                return Err(SandboxError::Setup(format!("waiting for the command: {e}")));
            }
            Err(Lost::Agent(why)) => return Err(SandboxError::AgentLost(why)),
        };
        let cap = limits.max_output_bytes;
        if out.len() + err.len() > cap {
            out.truncate(cap);
            err.truncate(cap.saturating_sub(out.len()));
        }
        use std::os::unix::process::ExitStatusExt;
        let oom_killed = session.is_some_and(|s| s.oom_kills() > oom_before);
        Ok(Finished {
            exit_code: status.code(),
            signal: status.signal(),
            stdout: out,
            stderr: err,
            killed,
            oom_killed,
            duration: t0.elapsed(),
        })
    }

    /// Kills the command's whole tree: the cgroup if there is one, and the outer init of a
    /// per-command sandbox (its death kills pid 1 by PDEATHSIG, which tears down the PID
    /// namespace).
    async fn stop(&self, process: &mut Process, group: Option<&crate::cgroup::CommandGroup>) {
        if let Some(g) = group {
            g.kill();
        }
        if self.is_unsandboxed()
            && let Some(pid) = process.child_pid()
        {
            // The unsandboxed command leads its own process group.
            let _ = rustix::process::kill_process_group(
                rustix::process::Pid::from_raw(pid as i32).unwrap_or(rustix::process::Pid::INIT),
                rustix::process::Signal::KILL,
            );
        }
        process.start_kill();
    }
}

/// What the init said when the sandbox failed before the command started.
pub(crate) async fn setup_failure(mut child: tokio::process::Child) -> String {
    let mut text = Vec::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = tokio::time::timeout(Duration::from_secs(2), e.read_to_end(&mut text)).await;
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
    let text = String::from_utf8_lossy(&text).trim().to_owned();
    if text.is_empty() {
        "toolexec-sandbox-init exited before the command started".into()
    } else {
        text
    }
}

/// Appends what `r` has to `into`, read straight into its spare capacity (at least [`CHUNK`]
/// bytes of it): no buffer of its own to zero and copy from. `None` at end of file.
async fn read_some<R: AsyncRead + Unpin>(r: &mut Option<R>, into: &mut Vec<u8>) -> Option<usize> {
    match r {
        Some(r) => {
            into.reserve(CHUNK);
            match r.read_buf(into).await {
                Ok(0) | Err(_) => None,
                Ok(n) => Some(n),
            }
        }
        None => std::future::pending().await,
    }
}
