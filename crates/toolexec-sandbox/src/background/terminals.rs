//! Starting a session's terminals (`exec_command`) and talking to them (`write_stdin`): the
//! process table's side of `crate::terminal`.
use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::ProcessTable;
use crate::SandboxError;
use crate::resident::Started;
use crate::run::{Process, setup_failure};
use crate::terminal::{Io, TermError, TermRead};

impl ProcessTable {
    /// Starts a program for `exec_command`: `shell_command` run by bash (the tool builds it),
    /// its stdin a pipe or, with `tty`, the slave of a `cols`×`rows` pseudo-terminal; then
    /// waits up to `yield_for` for it to end. Refused past `max_terminals` open ones.
    #[allow(clippy::too_many_arguments)]
    pub async fn exec_terminal(
        &self,
        workdir: &str,
        shell_command: &str,
        display: &str,
        tty: Option<(u16, u16)>,
        env: &BTreeMap<String, String>,
        network: bool,
        max_terminals: usize,
        idle: Duration,
        yield_for: Duration,
    ) -> Result<Result<TermRead, TermError>, SandboxError> {
        let t0 = Instant::now();
        let open = self.terminals.count();
        if open >= max_terminals {
            return Err(SandboxError::Limit(format!(
                "this session already has {open} terminals open, its limit (limits.max_terminals_per_session = {max_terminals}); end one first: send \"\\u0003\" or an exit command with write_stdin, or wait for it to finish"
            )));
        }
        let admitted = self.admit()?;
        let group = self.group()?;
        let mut env = env.clone();
        for (k, v) in [
            ("TERM", "dumb"),
            ("NO_COLOR", "1"),
            ("PAGER", "cat"),
            ("GIT_PAGER", "cat"),
        ] {
            env.insert(k.to_owned(), v.to_owned());
        }
        let launch = self.launch(workdir, Self::shell(shell_command, &env), network)?;
        let setup = |what: &str, e: std::io::Error| SandboxError::Setup(format!("{what}: {e}"));
        let pipe = |what: &str| {
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                .map_err(|e| setup(what, e.into()))
        };
        let resident = self.sandbox.is_resident();
        if tty.is_some() && !resident && !self.sandbox.is_unsandboxed() {
            return Err(SandboxError::Limit(NO_TTY_WITHOUT_RESIDENT.into()));
        }
        // The program's stdin, stdout, stderr (none for a resident sandbox's terminal: it is
        // made inside); what the service keeps.
        let (stdio, io_parts): (Option<[OwnedFd; 3]>, Option<IoParts>) = match tty {
            Some(_) if resident => (None, None),
            Some((cols, rows)) => {
                // Unsandboxed (the operator's choice, for development): there is no sandbox to
                // make it in, the host's devpts is the only one.
                let (master, slave) =
                    crate::terminal::open_pty(cols, rows).map_err(|e| setup("terminal", e))?;
                let a = slave.try_clone().map_err(|e| setup("terminal", e))?;
                let b = slave.try_clone().map_err(|e| setup("terminal", e))?;
                (Some([slave, a, b]), Some(IoParts::Pty(master)))
            }
            None => {
                let (in_r, in_w) = pipe("input pipe")?;
                let (out_r, out_w) = pipe("output pipe")?;
                let err_w = out_w.try_clone().map_err(|e| setup("output pipe", e))?;
                (
                    Some([in_r, out_w, err_w]),
                    Some(IoParts::Pipes(in_w, out_r)),
                )
            }
        };
        let (process, cmd_group, io_parts) = if resident {
            let agent = self.agent(&launch).await?;
            let spec = self.sandbox.command_spec(&launch).encode().map_err(|e| {
                SandboxError::Setup(format!("the command cannot be passed on: {e}"))
            })?;
            match (tty, stdio, io_parts) {
                (Some((cols, rows)), _, _) => {
                    let (Started { group, exit, .. }, master) =
                        agent.start_tty_command(&spec, cols, rows).await?;
                    (
                        Process::Resident(Some(exit)),
                        Some(group),
                        IoParts::Pty(master),
                    )
                }
                (None, Some(stdio), Some(parts)) => {
                    let [a, b, c] = &stdio;
                    let started = agent
                        .start_command(&spec, [a.as_fd(), b.as_fd(), c.as_fd()])
                        .await;
                    drop(stdio);
                    let Started { group, exit, .. } = started?;
                    (Process::Resident(Some(exit)), Some(group), parts)
                }
                _ => {
                    return Err(SandboxError::Setup(
                        "the terminal's stdio is missing".into(),
                    ));
                }
            }
        } else {
            let (Some([a, b, c]), Some(parts)) = (stdio, io_parts) else {
                return Err(SandboxError::Setup(
                    "the terminal's stdio is missing".into(),
                ));
            };
            let spawned = self
                .sandbox
                .spawn(
                    &launch,
                    group.as_deref(),
                    Stdio::from(a),
                    Stdio::from(b),
                    Stdio::from(c),
                )
                .await?;
            if !spawned.started {
                let _ = setup_failure(spawned.child).await;
                return Err(SandboxError::Setup(
                    "the program's sandbox could not be set up".into(),
                ));
            }
            (Process::Child(spawned.child), spawned.group, parts)
        };
        let io = match io_parts {
            IoParts::Pty(master) => {
                Io::Pty(crate::terminal::register(master).map_err(|e| setup("terminal", e))?)
            }
            IoParts::Pipes(in_w, out_r) => Io::Pipes {
                // Held (never written: `tty: false` takes no input) so the program does not
                // read end of file, as Codex's do.
                stdin: Some(
                    tokio::net::unix::pipe::Sender::from_owned_fd(in_w)
                        .map_err(|e| setup("input pipe", e))?,
                ),
                output: tokio::net::unix::pipe::Receiver::from_owned_fd(out_r)
                    .map_err(|e| setup("output pipe", e))?,
            },
        };
        let id = self.terminals.fresh_id();
        self.terminals.add(
            id,
            display.to_owned(),
            tty.is_some(),
            io,
            process,
            cmd_group,
            idle,
            admitted,
        );
        Ok(self.terminals.interact(id, b"", yield_for, false, t0).await)
    }

    /// `write_stdin`: writes `chars` to a terminal, then waits (see `Terminals` in the terminal module).
    pub async fn terminal_input(
        &self,
        id: u32,
        chars: &[u8],
        yield_for: Duration,
        until_output: bool,
    ) -> Result<TermRead, TermError> {
        self.terminals
            .interact(id, chars, yield_for, until_output, Instant::now())
            .await
    }

    /// `write_stdin` with `until`: as [`ProcessTable::terminal_input`], returning as soon as
    /// the output matches (see `Terminals::interact_until`), with the pattern that matched.
    pub async fn terminal_input_until(
        &self,
        id: u32,
        chars: &[u8],
        yield_for: Duration,
        until: std::sync::Arc<dyn crate::terminal::Until>,
    ) -> Result<(TermRead, Option<usize>), TermError> {
        self.terminals
            .interact_until(id, chars, yield_for, until, Instant::now())
            .await
    }
}

/// `exec_command` with `tty: true` where commands do not run in a resident sandbox.
const NO_TTY_WITHOUT_RESIDENT: &str = "tty: true needs the session's resident sandbox \
(sandbox.resident = true and a delegated cgroup tree): a terminal is made inside the sandbox's \
own devpts instance by its resident agent, and this service runs each command in a sandbox of \
its own; run the program with tty: false (pipes) instead";

enum IoParts {
    Pty(OwnedFd),
    Pipes(OwnedFd, OwnedFd),
}
