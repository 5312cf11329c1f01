//! One session's sandbox: its cgroups (limits shared by all its commands), its resident agent
//! (started with the first command, when the sandbox is resident), foreground commands, and its
//! background processes with their output kept for polling.
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, mpsc};
use tracing::Instrument;

use crate::bash::{BOOTSTRAP, BashLimits, BashRun, Shell};
use crate::cgroup::SessionGroup;
use crate::resident::{Agent, Started};
use crate::run::{Finished, Lost, Process, RunLimits, setup_failure};
use crate::terminal::{TermExit, TermInfo, Terminals};
use crate::{Launch, Program, Sandbox, SandboxError, Spawned};

mod shell;
mod terminals;

/// The state of a background process.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ProcessState {
    Running,
    Exited {
        exit_code: Option<i32>,
        signal: Option<i32>,
        /// Set when the service stopped it (`process_kill`, its time limit, session close).
        killed_by: Option<String>,
    },
}

/// What `process_read` returns.
#[derive(Debug, Clone)]
pub struct ProcessRead {
    pub state: ProcessState,
    /// Output from the cursor on (lossily decoded), at most the asked amount.
    pub output: Vec<u8>,
    /// Bytes before the cursor that were dropped from the kept window (the window keeps the
    /// last `max_output_bytes`).
    pub dropped: u64,
    /// Cursor to pass as `after` next time.
    pub next: u64,
    /// More output is available right now beyond `next`.
    pub more: bool,
}

/// A background process as listed.
#[derive(Debug, Clone)]
pub struct ProcessInfo {
    pub id: String,
    pub command: String,
    pub state: ProcessState,
    pub output_bytes: u64,
}

struct OutputLog {
    /// Absolute offset of `buf[0]`.
    start: u64,
    buf: VecDeque<u8>,
    cap: usize,
}

impl OutputLog {
    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend(bytes);
        let over = self.buf.len().saturating_sub(self.cap);
        if over > 0 {
            self.buf.drain(..over);
            self.start += over as u64;
        }
    }
}

enum Control {
    Signal(rustix::process::Signal, String),
}

struct Proc {
    id: String,
    command: String,
    log: Mutex<OutputLog>,
    state: Mutex<ProcessState>,
    changed: Notify,
    stdin: tokio::sync::Mutex<Option<Box<dyn AsyncWrite + Unpin + Send>>>,
    control: mpsc::UnboundedSender<Control>,
    /// Whether the exit was handed out for recording ([`ProcessTable::take_exit`]).
    exit_taken: std::sync::atomic::AtomicBool,
}

impl Proc {
    fn state(&self) -> ProcessState {
        self.state
            .lock()
            .map(|s| s.clone())
            .unwrap_or(ProcessState::Running)
    }

    /// Waits up to `limit` for the process to have exited.
    async fn wait_exit(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.state() == ProcessState::Running && Instant::now() < deadline {
            let notified = self.changed.notified();
            if self.state() != ProcessState::Running {
                break;
            }
            let _ = tokio::time::timeout_at(deadline.into(), notified).await;
        }
    }

    fn info(&self) -> ProcessInfo {
        ProcessInfo {
            id: self.id.clone(),
            command: self.command.clone(),
            state: self.state(),
            output_bytes: self.log.lock().map(|l| l.end()).unwrap_or(0),
        }
    }
}

/// Most bytes one `process_read` returns.
pub const MAX_READ_BYTES: usize = 64 * 1024;
/// Longest `process_read` waits for new output.
pub const MAX_WAIT: Duration = Duration::from_secs(30);
/// How long a signalled process gets to exit before the whole tree is killed.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long a killed process's end is waited for.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Admits each command of a session before it starts: a guard held for as long as the command
/// runs (a background one: until it exits), or the sentence that says why it may not start. The
/// service counts a tenant's running commands with it (`limits.max_processes_per_tenant`).
pub type Admission =
    Arc<dyn Fn() -> Result<Box<dyn std::any::Any + Send + Sync>, String> + Send + Sync>;

/// One session's sandbox.
pub struct ProcessTable {
    sandbox: Arc<Sandbox>,
    session: String,
    workspace: PathBuf,
    group: OnceLock<Option<Arc<SessionGroup>>>,
    procs: Mutex<BTreeMap<String, Arc<Proc>>>,
    next: AtomicU64,
    /// The session's egress proxy, started with its first network-enabled command.
    egress: Mutex<Option<crate::EgressHandle>>,
    /// Ids of processes of an earlier run of the service already reported as interrupted.
    gone_reported: Mutex<std::collections::BTreeSet<String>>,
    /// The session's resident sandbox, once a command needed it (and again after it died).
    agent: tokio::sync::Mutex<Option<Arc<Agent>>>,
    /// What each command must get before it starts, if anything.
    admission: Option<Admission>,
    /// The session's persistent shell (the `bash` tool), once a call started it.
    bash: tokio::sync::Mutex<Option<Shell>>,
    /// Programs started by `exec_command`.
    terminals: Terminals,
    /// Why the persistent shell was ended by the service (a rewind), for its next call.
    bash_ended: Mutex<Option<String>>,
    /// The image the session runs in (`None`: the host's `/usr` and `/etc`).
    image: Option<Arc<crate::SessionImage>>,
}

impl std::fmt::Debug for ProcessTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessTable")
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl ProcessTable {
    /// `first_id`: the number of the first process id (`p<N>`). Ids must not repeat within a
    /// session across restarts, so the caller starts above every id the session could have used.
    pub fn new(
        sandbox: Arc<Sandbox>,
        session: impl Into<String>,
        workspace: PathBuf,
        first_id: u64,
    ) -> Self {
        Self {
            sandbox,
            session: session.into(),
            workspace,
            group: OnceLock::new(),
            procs: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(first_id.max(1)),
            egress: Mutex::new(None),
            gone_reported: Mutex::new(std::collections::BTreeSet::new()),
            agent: tokio::sync::Mutex::new(None),
            admission: None,
            bash: tokio::sync::Mutex::new(None),
            terminals: Terminals::default(),
            bash_ended: Mutex::new(None),
            image: None,
        }
    }

    /// Runs every command of the session in `image` instead of the host's `/usr` and `/etc`.
    pub fn with_image(mut self, image: Option<Arc<crate::SessionImage>>) -> Self {
        self.image = image;
        self
    }

    /// The image the session runs in, if any.
    pub fn image(&self) -> Option<&Arc<crate::SessionImage>> {
        self.image.as_ref()
    }

    /// Every command of this table first asks `admission` (see [`Admission`]).
    pub fn with_admission(mut self, admission: Admission) -> Self {
        self.admission = Some(admission);
        self
    }

    /// The guard a command holds while it runs; [`SandboxError::Limit`] when it may not start.
    fn admit(&self) -> Result<Option<Box<dyn std::any::Any + Send + Sync>>, SandboxError> {
        match &self.admission {
            None => Ok(None),
            Some(admit) => admit().map(Some).map_err(SandboxError::Limit),
        }
    }

    /// The session's resident agent, started now if there is none (or it died).
    async fn agent(&self, launch: &Launch) -> Result<Arc<Agent>, SandboxError> {
        let mut agent = self.agent.lock().await;
        let network = launch.egress_socket.is_some();
        if let Some(a) = agent.as_ref() {
            if a.is_alive() && a.network == network {
                return Ok(a.clone());
            }
            // Dead (its processes died with it), or built without the egress socket a
            // network-enabled command needs: a fresh one.
            a.stop().await;
        }
        *agent = None;
        let group = self.group()?;
        let started = self
            .sandbox
            .start_agent(
                &self.session,
                &self.workspace,
                launch.egress_socket.as_deref(),
                launch.image.as_ref(),
                group.as_deref(),
            )
            .await?;
        let started = Arc::new(started);
        *agent = Some(started.clone());
        Ok(started)
    }

    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    /// The connections the session's commands made through its egress proxy since the last
    /// call of this (at most 1,000), and how many more there were.
    pub fn drain_egress(&self) -> (Vec<crate::egress::EgressRecord>, u64) {
        match self.egress.lock() {
            Ok(egress) => egress.as_ref().map(|e| e.log.drain()).unwrap_or_default(),
            Err(_) => (Vec::new(), 0),
        }
    }

    fn group(&self) -> Result<Option<Arc<SessionGroup>>, SandboxError> {
        if let Some(g) = self.group.get() {
            return Ok(g.clone());
        }
        let g = self
            .sandbox
            .session_group(&self.session)
            .map_err(|e| SandboxError::Setup(format!("session cgroup: {e}")))?
            .map(Arc::new);
        Ok(self.group.get_or_init(|| g).clone())
    }

    fn launch(
        &self,
        workdir: &str,
        program: Program,
        network: bool,
    ) -> Result<Launch, SandboxError> {
        let egress_socket = if network && !self.sandbox.is_unsandboxed() {
            let mut egress = self
                .egress
                .lock()
                .map_err(|_| SandboxError::Setup("egress lock poisoned".into()))?;
            if egress.is_none() {
                *egress = Some(self.sandbox.start_egress(&self.session)?);
            }
            egress.as_ref().map(|e| e.path.clone())
        } else {
            None
        };
        Ok(Launch {
            workspace: self.workspace.clone(),
            workdir: workdir.to_owned(),
            program,
            egress_socket,
            image: self.image.clone(),
        })
    }

    fn shell(command: &str, env: &BTreeMap<String, String>) -> Program {
        Program::Shell {
            command: command.to_owned(),
            env: env.clone(),
        }
    }

    /// Runs a foreground command (with egress through the session's proxy when `network`).
    pub async fn run(
        &self,
        workdir: &str,
        command: &str,
        env: &BTreeMap<String, String>,
        network: bool,
        limits: &RunLimits,
    ) -> Result<Finished, SandboxError> {
        let _admitted = self.admit()?;
        // The command's time in the sandbox, setup included (a child of the call's `tool` span
        // in traces): what a slow shell call spent where.
        let span = tracing::info_span!(
            "sandbox.run",
            sandbox.resident = self.sandbox.is_resident(),
            network,
            exit_code = tracing::field::Empty,
            signal = tracing::field::Empty,
            killed = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let finished = self
            .run_in_sandbox(workdir, command, env, network, limits)
            .instrument(span.clone())
            .await;
        record_end(&span, &finished);
        finished
    }

    /// Runs an operator's program — `argv[0]` exec'd directly, with exactly `env` and `input`
    /// on its stdin — in a sandbox of its own, never the session's resident one: its own PID
    /// namespace, Landlock domain and empty `/tmp`, so that nothing the session's processes
    /// left there or run reaches it; only the workspace (its working directory) is shared.
    /// Admitted, limited and placed in the session's cgroups like any command of the session.
    pub async fn exec(
        &self,
        argv: Vec<String>,
        env: BTreeMap<String, String>,
        input: Vec<u8>,
        network: bool,
        limits: &RunLimits,
    ) -> Result<Finished, SandboxError> {
        let _admitted = self.admit()?;
        let span = tracing::info_span!(
            "sandbox.exec",
            network,
            exit_code = tracing::field::Empty,
            signal = tracing::field::Empty,
            killed = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let finished = async {
            let group = self.group()?;
            let launch = self.launch("", Program::Exec { argv, env }, network)?;
            self.sandbox
                .run(&launch, group.as_deref(), limits, Some(input))
                .await
        }
        .instrument(span.clone())
        .await;
        record_end(&span, &finished);
        finished
    }

    async fn run_in_sandbox(
        &self,
        workdir: &str,
        command: &str,
        env: &BTreeMap<String, String>,
        network: bool,
        limits: &RunLimits,
    ) -> Result<Finished, SandboxError> {
        let group = self.group()?;
        let launch = self.launch(workdir, Self::shell(command, env), network)?;
        if self.sandbox.is_resident() {
            // The session's resident agent: started by its first command, reused after.
            let agent = self
                .agent(&launch)
                .instrument(tracing::info_span!("sandbox.agent"))
                .await?;
            return self
                .sandbox
                .run_resident(&agent, &launch, group.as_deref(), limits)
                .await;
        }
        self.sandbox
            .run(&launch, group.as_deref(), limits, None)
            .await
    }

    /// Starts a background process; its stdout and stderr are one stream.
    pub async fn start(
        &self,
        workdir: &str,
        command: &str,
        env: &BTreeMap<String, String>,
        network: bool,
        lifetime: Duration,
    ) -> Result<ProcessInfo, SandboxError> {
        // Starting it, not its life (which outlasts the call): a child of the call's `tool` span.
        let span = tracing::info_span!(
            "sandbox.start",
            sandbox.resident = self.sandbox.is_resident(),
            network,
            refused = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let started = self
            .start_in_sandbox(workdir, command, env, network, lifetime)
            .instrument(span.clone())
            .await;
        match &started {
            // A session limit is the model's to act on (its result says so), not a fault.
            Err(SandboxError::Limit(why)) => {
                span.record("refused", why.as_str());
            }
            Err(e) => {
                span.record("otel.status_code", "ERROR");
                tracing::warn!(parent: &span, error = %e, "the sandbox could not start the process");
            }
            Ok(_) => {}
        }
        started
    }

    async fn start_in_sandbox(
        &self,
        workdir: &str,
        command: &str,
        env: &BTreeMap<String, String>,
        network: bool,
        lifetime: Duration,
    ) -> Result<ProcessInfo, SandboxError> {
        let cfg = self.sandbox.config();
        let running = self
            .procs
            .lock()
            .map(|p| {
                p.values()
                    .filter(|p| p.state() == ProcessState::Running)
                    .count()
            })
            .unwrap_or(0);
        if running >= cfg.max_background {
            return Err(SandboxError::Limit(format!(
                "this session already runs {running} background processes (the limit is {}); stop one with process_kill first",
                cfg.max_background
            )));
        }
        let admitted = self.admit()?;
        let group = self.group()?;
        let launch = self.launch(workdir, Self::shell(command, env), network)?;
        let (read_end, write_end) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| SandboxError::Setup(format!("output pipe: {e}")))?;
        let write_err = write_end
            .try_clone()
            .map_err(|e| SandboxError::Setup(format!("output pipe: {e}")))?;
        let (mut process, cmd_group, stdin, mut output) = if self.sandbox.is_resident() {
            let agent = self.agent(&launch).await?;
            let (stdin_r, stdin_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
                .map_err(|e| SandboxError::Setup(format!("input pipe: {e}")))?;
            let spec = self.sandbox.command_spec(&launch).encode().map_err(|e| {
                SandboxError::Setup(format!("the command cannot be passed on: {e}"))
            })?;
            let started = agent
                .start_command(
                    &spec,
                    [stdin_r.as_fd(), write_end.as_fd(), write_err.as_fd()],
                )
                .await;
            drop((stdin_r, write_end, write_err));
            let Started { group, exit, .. } = started?;
            let stdin = tokio::net::unix::pipe::Sender::from_owned_fd(stdin_w)
                .map_err(|e| SandboxError::Setup(format!("input pipe: {e}")))?;
            let output = tokio::net::unix::pipe::Receiver::from_owned_fd(read_end)
                .map_err(|e| SandboxError::Setup(format!("output pipe: {e}")))?;
            (
                Process::Resident(Some(exit)),
                Some(group),
                Some(Box::new(stdin) as Box<dyn AsyncWrite + Unpin + Send>),
                output,
            )
        } else {
            let spawned = self
                .sandbox
                .spawn(
                    &launch,
                    group.as_deref(),
                    Stdio::piped(),
                    Stdio::from(write_end),
                    Stdio::from(write_err),
                )
                .await;
            let Spawned {
                mut child,
                group: cmd_group,
                started,
            } = spawned?;
            let mut output = tokio::net::unix::pipe::Receiver::from_owned_fd(read_end)
                .map_err(|e| SandboxError::Setup(format!("output pipe: {e}")))?;
            if !started {
                let mut text = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(2), output.read_to_end(&mut text))
                    .await;
                let _ = setup_failure(child).await;
                return Err(SandboxError::Setup(
                    String::from_utf8_lossy(&text).trim().to_owned(),
                ));
            }
            let stdin = child
                .stdin
                .take()
                .map(|s| Box::new(s) as Box<dyn AsyncWrite + Unpin + Send>);
            (Process::Child(child), cmd_group, stdin, output)
        };
        let id = format!("p{}", self.next.fetch_add(1, Ordering::Relaxed));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let proc = Arc::new(Proc {
            id: id.clone(),
            command: command.to_owned(),
            log: Mutex::new(OutputLog {
                start: 0,
                buf: VecDeque::new(),
                cap: cfg.max_output_bytes,
            }),
            state: Mutex::new(ProcessState::Running),
            changed: Notify::new(),
            stdin: tokio::sync::Mutex::new(stdin),
            control: tx,
            exit_taken: std::sync::atomic::AtomicBool::new(false),
        });
        if let Ok(mut procs) = self.procs.lock() {
            procs.insert(id, proc.clone());
        }
        let unsandboxed = self.sandbox.is_unsandboxed();
        let p = proc.clone();
        tokio::spawn(async move {
            // Held until the process has exited (end of this task).
            let _admitted = admitted;
            let deadline = tokio::time::Instant::now() + lifetime;
            let mut buf = vec![0u8; 64 * 1024];
            let mut open = true;
            let mut killed_by: Option<String> = None;
            let mut status = None;
            let mut drain_until = None;
            loop {
                let wake = drain_until.unwrap_or(deadline);
                tokio::select! {
                    n = output.read(&mut buf), if open => match n {
                        Ok(0) | Err(_) => open = false,
                        Ok(n) => {
                            if let Ok(mut log) = p.log.lock() { log.push(&buf[..n]); }
                            p.changed.notify_waiters();
                        }
                    },
                    s = process.wait(), if status.is_none() => {
                        status = Some(s);
                        if let Some(g) = &cmd_group { g.kill_nowait(); }
                        drain_until = Some(tokio::time::Instant::now() + Duration::from_secs(2));
                    }
                    c = rx.recv(), if status.is_none() => {
                        let Some(Control::Signal(sig, why)) = c else { continue };
                        killed_by.get_or_insert(why);
                        signal_tree(&mut process, cmd_group.as_ref(), sig, unsandboxed).await;
                    }
                    _ = tokio::time::sleep_until(wake) => {
                        if drain_until.is_some() { break; }
                        killed_by.get_or_insert_with(|| format!("its time limit of {} ms", lifetime.as_millis()));
                        signal_tree(&mut process, cmd_group.as_ref(), rustix::process::Signal::KILL, unsandboxed).await;
                    }
                }
                if !open && status.is_some() {
                    break;
                }
            }
            use std::os::unix::process::ExitStatusExt;
            let status = match status {
                Some(s) => s,
                None => process.wait().await,
            };
            drop(cmd_group);
            let status = match status {
                Ok(s) => Some(s),
                Err(Lost::Agent(why)) => {
                    killed_by
                        .get_or_insert_with(|| format!("the session's sandbox stopping ({why})"));
                    None
                }
                Err(Lost::Wait(_)) => None,
            };
            if let Ok(mut st) = p.state.lock() {
                *st = ProcessState::Exited {
                    exit_code: status.and_then(|s| s.code()),
                    signal: status.and_then(|s| s.signal()),
                    killed_by,
                };
            }
            p.changed.notify_waiters();
        });
        Ok(proc.info())
    }

    fn get(&self, id: &str) -> Result<Arc<Proc>, String> {
        self.procs
            .lock()
            .ok()
            .and_then(|p| p.get(id).cloned())
            .ok_or_else(|| {
                format!(
                    "No background process '{id}' in this session. Background processes are listed when started (shell with background: true); they do not survive a service restart."
                )
            })
    }

    /// Output after `after` (default: from the start of what is kept), waiting up to `wait` for
    /// some if there is none yet and the process runs.
    pub async fn read(
        &self,
        id: &str,
        after: Option<u64>,
        wait: Duration,
    ) -> Result<ProcessRead, String> {
        let p = self.get(id)?;
        let deadline = Instant::now() + wait.min(MAX_WAIT);
        loop {
            let notified = p.changed.notified();
            let state = p.state();
            let (end, start) = p.log.lock().map(|l| (l.end(), l.start)).unwrap_or((0, 0));
            let from = after.unwrap_or(start);
            if end > from || state != ProcessState::Running || Instant::now() >= deadline {
                let log = p
                    .log
                    .lock()
                    .map_err(|_| "output lock poisoned".to_owned())?;
                let begin = from.max(log.start).min(log.end());
                let skip = usize::try_from(begin - log.start).unwrap_or(usize::MAX);
                let output: Vec<u8> = log
                    .buf
                    .iter()
                    .skip(skip)
                    .take(MAX_READ_BYTES)
                    .copied()
                    .collect();
                let next = begin + output.len() as u64;
                return Ok(ProcessRead {
                    state,
                    dropped: begin.saturating_sub(from),
                    more: next < log.end(),
                    next,
                    output,
                });
            }
            let _ = tokio::time::timeout_at(deadline.into(), notified).await;
        }
    }

    /// Writes to the process's stdin.
    pub async fn write(&self, id: &str, input: &[u8]) -> Result<(), String> {
        let p = self.get(id)?;
        if p.state() != ProcessState::Running {
            return Err(format!("Process '{id}' has exited; its stdin is closed."));
        }
        let mut stdin = p.stdin.lock().await;
        let Some(pipe) = stdin.as_mut() else {
            return Err(format!("Process '{id}' has no stdin."));
        };
        let write = async {
            pipe.write_all(input).await?;
            pipe.flush().await
        };
        match tokio::time::timeout(Duration::from_secs(5), write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!(
                "Writing to process '{id}' failed: {e} (it may have closed its stdin)."
            )),
            Err(_) => Err(format!(
                "Process '{id}' did not read its input within 5 s (its input buffer is full)."
            )),
        }
    }

    /// Sends a signal; the whole tree is killed if it has not exited within a short grace
    /// period. Returns the state afterwards.
    pub async fn kill(
        &self,
        id: &str,
        signal: rustix::process::Signal,
    ) -> Result<ProcessState, String> {
        let p = self.get(id)?;
        if p.state() != ProcessState::Running {
            return Ok(p.state());
        }
        let why = format!("process_kill ({})", signal_name(signal));
        let _ = p.control.send(Control::Signal(signal, why.clone()));
        p.wait_exit(KILL_GRACE).await;
        if p.state() == ProcessState::Running {
            let _ = p
                .control
                .send(Control::Signal(rustix::process::Signal::KILL, why));
            p.wait_exit(KILL_WAIT).await;
        }
        Ok(p.state())
    }

    /// The exit of a process, the first time it is asked for after the process exited (so that
    /// it is recorded once).
    pub fn take_exit(&self, id: &str) -> Option<ProcessInfo> {
        let p = self.get(id).ok()?;
        if p.state() == ProcessState::Running || p.exit_taken.swap(true, Ordering::SeqCst) {
            return None;
        }
        Some(p.info())
    }

    /// Whether this node knows the process (it started it since the service started).
    pub fn knows(&self, id: &str) -> bool {
        self.get(id).is_ok()
    }

    /// True the first time it is asked for an id this node does not know (a process of an
    /// earlier run of the service): its interruption is then recorded once.
    pub fn first_report_of_gone(&self, id: &str) -> bool {
        !self.knows(id)
            && self
                .gone_reported
                .lock()
                .is_ok_and(|mut g| g.insert(id.to_owned()))
    }

    /// Exits not yet handed out by [`ProcessTable::take_exit`].
    pub fn take_exits(&self) -> Vec<ProcessInfo> {
        let ids: Vec<String> = self.list().into_iter().map(|p| p.id).collect();
        ids.iter().filter_map(|id| self.take_exit(id)).collect()
    }

    pub fn list(&self) -> Vec<ProcessInfo> {
        self.procs
            .lock()
            .map(|p| p.values().map(|p| p.info()).collect())
            .unwrap_or_default()
    }

    /// How many of the session's terminals still run their program.
    pub fn running_terminals(&self) -> usize {
        self.terminals.running()
    }

    /// The session's open terminals.
    pub fn terminals(&self) -> Vec<TermInfo> {
        self.terminals.list()
    }

    /// Kills every terminal (a rewind or a take-over): how each ended, for recording.
    pub async fn end_terminals(&self, why: &str) -> Vec<(TermInfo, TermExit)> {
        self.terminals.shutdown(why).await
    }

    /// Kills every running process of the session and its resident sandbox (session close).
    pub async fn shutdown(&self) {
        self.terminals.shutdown("the session was closed").await;
        if let Some(mut shell) = self.bash.lock().await.take() {
            shell.kill().await;
        }
        let ids: Vec<String> = self
            .list()
            .into_iter()
            .filter(|p| p.state == ProcessState::Running)
            .map(|p| p.id)
            .collect();
        for id in ids {
            if let Ok(p) = self.get(&id) {
                let _ = p.control.send(Control::Signal(
                    rustix::process::Signal::KILL,
                    "the session was closed".into(),
                ));
            }
        }
        for id in self.list().into_iter().map(|p| p.id) {
            let Ok(p) = self.get(&id) else { continue };
            p.wait_exit(KILL_WAIT).await;
        }
        if let Some(agent) = self.agent.lock().await.take() {
            agent.stop().await;
        }
    }
}

impl Drop for ProcessTable {
    fn drop(&mut self) {
        // The resident sandbox first (its processes are killed now, its cgroups removed by the
        // reaper), then the session's limit cgroups it was in.
        if let Ok(mut agent) = self.agent.try_lock() {
            agent.take();
        }
        if let Ok(procs) = self.procs.lock() {
            for p in procs.values() {
                let _ = p.control.send(Control::Signal(
                    rustix::process::Signal::KILL,
                    "the session was closed".into(),
                ));
            }
        }
    }
}

/// Puts how a command ended (or why it could not run) on its span.
fn record_end(span: &tracing::Span, finished: &Result<Finished, SandboxError>) {
    match finished {
        Ok(f) => {
            if let Some(code) = f.exit_code {
                span.record("exit_code", code);
            }
            if let Some(signal) = f.signal {
                span.record("signal", signal);
            }
            if let Some(why) = &f.killed {
                span.record("killed", tracing::field::debug(why));
            }
        }
        Err(e) => {
            span.record("otel.status_code", "ERROR");
            tracing::warn!(parent: span, error = %e, "the sandbox could not run the command");
        }
    }
}

pub fn signal_name(s: rustix::process::Signal) -> &'static str {
    use rustix::process::Signal;
    match s {
        Signal::KILL => "SIGKILL",
        Signal::TERM => "SIGTERM",
        Signal::INT => "SIGINT",
        Signal::HUP => "SIGHUP",
        _ => "signal",
    }
}

/// Delivers a signal to the command's processes. SIGKILL takes the whole tree down at once
/// (cgroup.kill, and for a per-command sandbox the outer init's death ends the PID namespace).
/// Other signals go to the command's own processes — for a per-command sandbox not to the outer
/// init or pid 1, whose death would kill everything without giving the command its chance to
/// exit cleanly; a resident command's cgroup holds the command's processes only.
async fn signal_tree(
    process: &mut Process,
    group: Option<&crate::cgroup::CommandGroup>,
    sig: rustix::process::Signal,
    unsandboxed: bool,
) {
    use rustix::process::{Pid, Signal, kill_process, kill_process_group};
    let outer = process.child_pid().and_then(|p| Pid::from_raw(p as i32));
    if sig == Signal::KILL {
        if let Some(g) = group {
            g.kill();
        }
        if unsandboxed && let Some(pid) = outer {
            let _ = kill_process_group(pid, Signal::KILL);
        }
        process.start_kill();
        return;
    }
    if unsandboxed {
        if let Some(pid) = outer {
            let _ = kill_process_group(pid, sig);
        }
        return;
    }
    let Some(g) = group else {
        // No cgroup to find the processes by: stopping means killing the sandbox.
        process.start_kill();
        return;
    };
    let outer_raw = outer.map_or(0, |p| p.as_raw_nonzero().get());
    let inner: Vec<i32> = if outer_raw == 0 {
        Vec::new()
    } else {
        std::fs::read_to_string(format!("/proc/{outer_raw}/task/{outer_raw}/children"))
            .map(|t| {
                t.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    for pid in g.pids() {
        if pid == outer_raw || inner.contains(&pid) {
            continue;
        }
        if let Some(pid) = Pid::from_raw(pid) {
            let _ = kill_process(pid, sig);
        }
    }
}
