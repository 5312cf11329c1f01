//! The session's persistent `bash`: starting it in the sandbox, running a command in it, and
//! ending it (a rewind, a lost runtime); the process table's side of `crate::bash`.

use super::*;

impl ProcessTable {
    /// Runs `command` in the session's persistent shell (see [`crate::bash`]), starting one if
    /// there is none (or it ended, or `restart` asks for a fresh one). Calls take turns.
    pub async fn bash(
        &self,
        command: Option<&str>,
        restart: bool,
        env: &BTreeMap<String, String>,
        network: bool,
        limits: &BashLimits,
    ) -> Result<BashRun, SandboxError> {
        let mut slot = self.bash.lock().await;
        let mut previous_lost = self.bash_ended.lock().ok().and_then(|mut e| e.take());
        if let Some(shell) = slot.as_mut() {
            if restart {
                shell.kill().await;
                *slot = None;
            } else if let Err(why) = shell.check_alive().await {
                previous_lost = Some(why);
                *slot = None;
            } else if shell.network != network {
                previous_lost = Some(if network {
                    "the session's policy now allows the network, which the shell started without"
                        .to_owned()
                } else {
                    "the session's policy no longer allows the network".to_owned()
                });
                shell.kill().await;
                *slot = None;
            }
        }
        let Some(command) = command else {
            return Ok(BashRun {
                previous_lost,
                ..BashRun::default()
            });
        };
        let fresh = slot.is_none();
        if fresh {
            *slot = Some(
                self.start_shell(env, network)
                    .instrument(tracing::info_span!("sandbox.bash_start"))
                    .await?,
            );
        }
        let Some(shell) = slot.as_mut() else {
            return Err(SandboxError::Setup("the shell is gone".into()));
        };
        let mut run = shell.run(command, limits).await;
        run.fresh = fresh;
        run.previous_lost = previous_lost;
        if (run.restarted || run.shell_ended.is_some())
            && let Some(mut gone) = slot.take()
        {
            gone.kill().await;
        }
        Ok(run)
    }

    /// Starts the session's persistent shell in its sandbox: `bash --noprofile --norc` reading
    /// its script from a pipe, with its output and status pipes (see [`crate::bash`]).
    pub(super) async fn start_shell(
        &self,
        env: &BTreeMap<String, String>,
        network: bool,
    ) -> Result<Shell, SandboxError> {
        let admitted = self.admit()?;
        let group = self.group()?;
        let launch = self.launch(
            "",
            Self::shell("exec /bin/bash --noprofile --norc", env),
            network,
        )?;
        let setup = |what: &str, e: std::io::Error| SandboxError::Setup(format!("{what}: {e}"));
        let pipe = |what: &str| {
            rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                .map_err(|e| setup(what, e.into()))
        };
        let (in_r, in_w) = pipe("script pipe")?;
        let (out_r, out_w) = pipe("output pipe")?;
        let (st_r, st_w) = pipe("status pipe")?;
        let (process, cmd_group, pid) = if self.sandbox.is_resident() {
            let agent = self.agent(&launch).await?;
            let spec = self.sandbox.command_spec(&launch).encode().map_err(|e| {
                SandboxError::Setup(format!("the command cannot be passed on: {e}"))
            })?;
            let started = agent
                .start_command(&spec, [in_r.as_fd(), out_w.as_fd(), st_w.as_fd()])
                .await;
            drop((in_r, out_w, st_w));
            let Started { group, exit, pid } = started?;
            (Process::Resident(Some(exit)), Some(group), Some(pid))
        } else {
            let spawned = self
                .sandbox
                .spawn(
                    &launch,
                    group.as_deref(),
                    Stdio::from(in_r),
                    Stdio::from(out_w),
                    Stdio::from(st_w),
                )
                .await?;
            let Spawned {
                child,
                group: cmd_group,
                started,
            } = spawned;
            if !started {
                let mut status = tokio::net::unix::pipe::Receiver::from_owned_fd(st_r)
                    .map_err(|e| setup("status pipe", e))?;
                let mut text = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(2), status.read_to_end(&mut text))
                    .await;
                let _ = setup_failure(child).await;
                return Err(SandboxError::Setup(
                    String::from_utf8_lossy(&text).trim().to_owned(),
                ));
            }
            let pid = if self.sandbox.is_unsandboxed() {
                child.id().and_then(|p| i32::try_from(p).ok())
            } else {
                None
            };
            (Process::Child(child), cmd_group, pid)
        };
        let mut shell = Shell {
            stdin: tokio::net::unix::pipe::Sender::from_owned_fd(in_w)
                .map_err(|e| setup("script pipe", e))?,
            output: tokio::net::unix::pipe::Receiver::from_owned_fd(out_r)
                .map_err(|e| setup("output pipe", e))?,
            status: tokio::net::unix::pipe::Receiver::from_owned_fd(st_r)
                .map_err(|e| setup("status pipe", e))?,
            process,
            group: cmd_group,
            pid,
            network,
            _admitted: admitted,
            ended: None,
        };
        let sent = tokio::time::timeout(Duration::from_secs(5), async {
            shell.stdin.write_all(BOOTSTRAP.as_bytes()).await?;
            shell.stdin.flush().await
        })
        .await;
        if !matches!(sent, Ok(Ok(()))) {
            shell.kill().await;
            return Err(SandboxError::Setup(
                "the shell did not start reading its commands".into(),
            ));
        }
        Ok(shell)
    }

    /// Ends the persistent shell (a rewind): its next call starts a fresh one and says why.
    pub async fn end_bash(&self, why: &str) {
        if let Some(mut shell) = self.bash.lock().await.take() {
            shell.kill().await;
            if let Ok(mut e) = self.bash_ended.lock() {
                *e = Some(why.to_owned());
            }
        }
    }

    /// The session had a persistent shell that is gone with the runtime it lived in (a
    /// take-over, an eviction, a restart): the next `bash` call says why, unless it restarts
    /// the shell on purpose.
    pub fn shell_lost(&self, why: &str) {
        if let Ok(mut e) = self.bash_ended.lock() {
            e.get_or_insert_with(|| why.to_owned());
        }
    }
}
