//! The service's side of a session's resident sandbox: one agent per session (pid 1 of the
//! sandbox, started on the session's first command, see `toolexec-sandbox-init`'s `agent`
//! module), and the pre-forked processes ("spares") that become its commands.
//!
//! ```text
//! service ──control socket (socketpair, fd 3 of the agent)──▶ agent: Prepare{slot} + a socket
//!    ▲                                                           └─ fork ─▶ spare: Hello
//!    └──────────── spare socket (SO_PASSCRED: its pid) ─────────────────────────┘
//!      the service moves the spare into the command's cgroup (from the host), then, when a
//!      command comes: Command + stdin, stdout, stderr, spec ─▶ spare execs it ─▶ end of file
//! ```
//!
//! The service never enters the sandbox's namespaces and hands nothing of the host into it but
//! the command's own pipes and spec: no cgroup directory, no socket path (both sockets are
//! socket pairs), no descriptor of its own. Everything the agent or a spare says is read as
//! untrusted input (bounded, decoded strictly, descriptors that come along are closed), and the
//! only thing done with a pid it yields is placing that process in a cgroup beneath the
//! session's own — the credentials of a message are the kernel's, not the sender's word.
//!
//! A spare is kept ready, the next one prepared as soon as one is taken, so a command normally
//! finds its process forked and already in its cgroup: what is left on the command's path is one
//! message and the exec. If the agent dies (the OOM killer, a kill from the host), its PID
//! namespace takes every process of the session with it; commands in flight fail with
//! [`SandboxError::AgentLost`] and the session's next command starts a fresh agent.
use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::Duration;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::SandboxError;
use crate::cgroup::{CommandGroup, SessionTree};
use crate::init::protocol::{
    COMMAND_FDS, FromAgent, FromSpare, MAX_INLINE_SPEC, MAX_MESSAGE, ToAgent, ToSpare,
};

/// Longest the agent may take to build the sandbox, and a spare to get ready.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Spares kept ready per session. Placing one in its cgroup usually takes ~0.05 ms but waits
/// for an RCU grace period (~10 ms here) when no cgroup move happened for a while; a command
/// whose spare is still being placed waits for it (measured with one: a tenth of commands waited,
/// one in a hundred ~11 ms). A second spare hides most of that, for a process, a socket and a
/// cgroup more per idle session — and a command then sees seven processes in a fresh sandbox
/// where the escape suite allows six; one it is.
const SPARES: usize = 1;

/// How a spare (and the command it became) ended.
#[derive(Debug)]
pub(crate) enum SpareEnd {
    /// `waitpid`'s status, as the agent reaped it.
    Exited(i32),
    /// The agent could not fork it.
    NotStarted(String),
    /// The agent is gone, and with it every process of the session.
    AgentGone(String),
}

/// What the agent's reader and the spares' preparations share.
struct Shared {
    ctl: AsyncFd<OwnedFd>,
    /// Who waits for the end of each slot's spare.
    waiters: Mutex<HashMap<u64, oneshot::Sender<SpareEnd>>>,
    alive: AtomicBool,
    /// Why the agent ended, once it has.
    ended: Mutex<Option<String>>,
    next_slot: AtomicU64,
    /// The outer init, in the service's PID namespace (the agent's parent).
    outer: tokio::sync::Mutex<Option<tokio::process::Child>>,
}

impl Shared {
    fn gone(&self) -> SandboxError {
        let why = self
            .ended
            .lock()
            .ok()
            .and_then(|e| e.clone())
            .unwrap_or_else(|| "its agent is stopping".to_owned());
        SandboxError::AgentLost(why)
    }
}

/// A process forked by the agent, in its command's cgroup, waiting for its command.
struct Spare {
    sock: AsyncFd<OwnedFd>,
    group: CommandGroup,
    exit: oneshot::Receiver<SpareEnd>,
    /// Its pid in the service's PID namespace.
    pid: i32,
}

/// A command the agent's spare is running.
pub(crate) struct Started {
    pub group: CommandGroup,
    pub exit: oneshot::Receiver<SpareEnd>,
    /// The command's pid in the service's PID namespace (the kernel's word, from the spare's
    /// credentials; the command is the spare, exec'd).
    pub pid: i32,
}

/// A session's resident agent.
pub(crate) struct Agent {
    shared: Arc<Shared>,
    tree: Arc<SessionTree>,
    reader: JoinHandle<()>,
    /// Spares being prepared or ready, oldest first ([`SPARES`] of them).
    next_spare: Mutex<VecDeque<JoinHandle<Result<Spare, SandboxError>>>>,
    /// Whether the sandbox was built with the session's egress socket.
    pub network: bool,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("cgroup", &self.tree.path())
            .field("alive", &self.is_alive())
            .finish_non_exhaustive()
    }
}

fn setup(what: &str, e: impl std::fmt::Display) -> SandboxError {
    SandboxError::Setup(format!("{what}: {e}"))
}

/// A `SOCK_SEQPACKET` socket pair: the service's end non-blocking (and, for a spare's, asking
/// the kernel for the sender's credentials), the other end blocking, both close-on-exec.
pub(crate) fn socket_pair(credentials: bool) -> io::Result<(OwnedFd, OwnedFd)> {
    let (mine, theirs) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    if credentials {
        rustix::net::sockopt::set_socket_passcred(&mine, true)?;
    }
    rustix::io::ioctl_fionbio(&mine, true)?;
    Ok((mine, theirs))
}

/// Registers a socket with the runtime's reactor.
fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` owns its descriptor until it is dropped and always yields the same
    // number; the `AsyncFd` owns it from here on and nothing swaps it (`get_mut` is not used).
    #[allow(unsafe_code)]
    let registered = unsafe { AsyncFd::register(fd) };
    Ok(registered?)
}

async fn send_with_fds(
    sock: &AsyncFd<OwnedFd>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<()> {
    loop {
        let mut guard = sock.writable().await?;
        let sent = guard.try_io(|inner| {
            let mut space =
                [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(COMMAND_FDS))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
                return Err(io::Error::other("too many descriptors for one message"));
            }
            rustix::net::sendmsg(
                inner.get_ref(),
                &[IoSlice::new(bytes)],
                &mut control,
                SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
            )
            .map_err(io::Error::from)
        });
        match sent {
            Ok(result) => return result.map(|_| ()),
            Err(_would_block) => continue,
        }
    }
}

/// One message: its length (0 at end of file) and, when the kernel attached them, the sender's
/// pid in the service's PID namespace. Descriptors that came along are closed.
/// One message: its length, the sender's pid (when the kernel attached its credentials) and the
/// descriptors that came with it (close-on-exec).
async fn receive(
    sock: &AsyncFd<OwnedFd>,
    buf: &mut [u8],
) -> io::Result<(usize, Option<i32>, Vec<OwnedFd>)> {
    loop {
        let mut guard = sock.readable().await?;
        let received = guard.try_io(|inner| {
            let mut space = [MaybeUninit::<u8>::uninit();
                rustix::cmsg_space!(ScmCredentials(1), ScmRights(COMMAND_FDS))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [IoSliceMut::new(buf)];
            let msg = rustix::net::recvmsg(
                inner.get_ref(),
                &mut iov,
                &mut control,
                RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
            )?;
            let mut pid = None;
            let mut fds = Vec::new();
            for m in control.drain() {
                match m {
                    RecvAncillaryMessage::ScmCredentials(cred) => {
                        pid = Some(cred.pid.as_raw_nonzero().get());
                    }
                    RecvAncillaryMessage::ScmRights(received) => fds.extend(received),
                    _ => {}
                }
            }
            if msg
                .flags
                .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC)
            {
                return Err(io::Error::other("a message from the sandbox was cut short"));
            }
            Ok((msg.bytes, pid, fds))
        });
        match received {
            Ok(result) => return result,
            Err(_would_block) => continue,
        }
    }
}

/// A descriptor opened from a `ptmx` (a devpts instance's: character device 5:2), as a master
/// handed over by a spare must be; anything else is refused.
fn is_pty_master(fd: &OwnedFd) -> bool {
    rustix::fs::fstat(fd).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::CharacterDevice
            && rustix::fs::major(st.st_rdev) == 5
            && rustix::fs::minor(st.st_rdev) == 2
    })
}

/// Reads the agent's messages until it is gone, then fails everything still waiting on it.
async fn read_control(shared: Arc<Shared>, ready: oneshot::Sender<Result<(), String>>) {
    let mut ready = Some(ready);
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut why = None;
    loop {
        let n = match receive(&shared.ctl, &mut buf).await {
            Ok((0, _, _)) => break,
            Ok((n, _, _)) => n,
            Err(e) => {
                why = Some(format!("its control socket failed: {e}"));
                break;
            }
        };
        let message = match FromAgent::decode(&buf[..n]) {
            Ok(m) => m,
            Err(e) => {
                // Only the agent writes here: a message it never sends means it is not itself.
                why = Some(format!("it sent what it never sends ({e}); it was stopped"));
                break;
            }
        };
        match message {
            FromAgent::Ready => {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(Ok(()));
                }
            }
            FromAgent::SetupFailed { reason } => {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(Err(reason.clone()));
                }
                why = Some(reason);
            }
            FromAgent::Exited { slot, status } => {
                let waiter = shared.waiters.lock().ok().and_then(|mut w| w.remove(&slot));
                if let Some(tx) = waiter {
                    let _ = tx.send(SpareEnd::Exited(status));
                }
            }
            FromAgent::PrepareFailed { slot, reason } => {
                let waiter = shared.waiters.lock().ok().and_then(|mut w| w.remove(&slot));
                if let Some(tx) = waiter {
                    let _ = tx.send(SpareEnd::NotStarted(reason));
                }
            }
        }
    }
    shared.alive.store(false, Ordering::SeqCst);
    // The outer init exits with pid 1's status (128 + its signal when it was killed).
    let status = {
        let mut outer = shared.outer.lock().await;
        match outer.as_mut() {
            Some(child) => {
                // It exits as soon as pid 1 is gone; killed only if it does not.
                let waited = tokio::time::timeout(Duration::from_secs(1), child.wait()).await;
                match waited {
                    Ok(status) => status.ok(),
                    Err(_) => {
                        let _ = child.start_kill();
                        None
                    }
                }
            }
            None => None,
        }
    };
    let why = why.unwrap_or_else(|| match status.and_then(|s| s.code()) {
        Some(code) if code > 128 && code < 160 => format!(
            "its agent (pid 1 of the session's sandbox) was killed by signal {}{}",
            code - 128,
            if code == 137 {
                " (SIGKILL: the kernel's OOM killer when the session ran out of memory, or an operator)"
            } else {
                ""
            }
        ),
        Some(code) => format!("its agent (pid 1 of the session's sandbox) exited with status {code}"),
        None => "its agent (pid 1 of the session's sandbox) ended".to_owned(),
    });
    tracing::warn!(reason = %why, "a session's resident sandbox ended");
    if let Ok(mut ended) = shared.ended.lock() {
        *ended = Some(why.clone());
    }
    if let Some(tx) = ready.take() {
        let _ = tx.send(Err(why.clone()));
    }
    let waiters: Vec<_> = shared
        .waiters
        .lock()
        .map(|mut w| w.drain().map(|(_, tx)| tx).collect())
        .unwrap_or_default();
    for tx in waiters {
        let _ = tx.send(SpareEnd::AgentGone(why.clone()));
    }
}

impl Agent {
    /// Starts the agent: `command` is the init, set up to join the session's cgroups and to
    /// find `theirs` (the agent's end of the control socket) as fd 3; `keep` holds descriptors
    /// the init gets that must stay open until it is started.
    pub(crate) async fn start(
        command: tokio::process::Command,
        mine: OwnedFd,
        keep: Vec<OwnedFd>,
        tree: SessionTree,
        network: bool,
    ) -> Result<Self, SandboxError> {
        let ctl = register(mine).map_err(|e| setup("control socket", e))?;
        let child = spawn_on_spawner(command)
            .await
            .map_err(|e| setup("starting the session's sandbox", e))?;
        drop(keep);
        let shared = Arc::new(Shared {
            ctl,
            waiters: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
            ended: Mutex::new(None),
            next_slot: AtomicU64::new(1),
            outer: tokio::sync::Mutex::new(Some(child)),
        });
        let (ready_tx, ready_rx) = oneshot::channel();
        let reader = tokio::spawn(read_control(shared.clone(), ready_tx));
        let agent = Agent {
            shared,
            tree: Arc::new(tree),
            reader,
            next_spare: Mutex::new(VecDeque::new()),
            network,
        };
        let failed = match tokio::time::timeout(SETUP_TIMEOUT, ready_rx).await {
            Ok(Ok(Ok(()))) => None,
            Ok(Ok(Err(reason))) => Some(reason),
            Ok(Err(_)) => Some("the sandbox's agent ended during its setup".to_owned()),
            Err(_) => Some(format!(
                "the sandbox was not set up within {} s",
                SETUP_TIMEOUT.as_secs()
            )),
        };
        if let Some(reason) = failed {
            agent.stop().await;
            return Err(SandboxError::Setup(reason));
        }
        // The first commands' processes, forked while the caller prepares the command.
        if let Ok(mut next) = agent.next_spare.lock() {
            while next.len() < SPARES {
                next.push_back(agent.prepare_task());
            }
        }
        Ok(agent)
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    fn prepare_task(&self) -> JoinHandle<Result<Spare, SandboxError>> {
        tokio::spawn(prepare(self.shared.clone(), self.tree.clone()))
    }

    /// The oldest spare prepared (or one prepared now), and another one started.
    async fn take_spare(&self) -> Result<Spare, SandboxError> {
        let pending = {
            let mut next = self
                .next_spare
                .lock()
                .map_err(|_| SandboxError::Setup("spare lock poisoned".into()))?;
            let pending = next.pop_front().unwrap_or_else(|| self.prepare_task());
            while next.len() < SPARES {
                next.push_back(self.prepare_task());
            }
            pending
        };
        let first = pending
            .await
            .map_err(|e| setup("preparing the command's process", e))?;
        match first {
            // A spare can die on its own while it waits (the OOM killer, the session's process
            // limit): one fresh try before the command fails.
            Err(SandboxError::Setup(_)) if self.is_alive() => {
                prepare(self.shared.clone(), self.tree.clone()).await
            }
            other => other,
        }
    }

    /// Starts a command: its spec (a [`crate::init::CommandSpec`], encoded) and its stdin,
    /// stdout and stderr (the caller drops its copies of the write ends once this returns).
    /// Returns once it has been exec'd.
    pub(crate) async fn start_command(
        &self,
        spec: &[u8],
        stdio: [BorrowedFd<'_>; 3],
    ) -> Result<Started, SandboxError> {
        let (started, _) = self.start_spare(spec, Some(stdio), None).await?;
        Ok(started)
    }

    /// Starts a command in a new `cols`×`rows` pseudo-terminal, made inside the sandbox (from
    /// its own devpts instance) by the command's process before its exec: the terminal's master
    /// comes back (non-blocking), the slave is the command's stdio and controlling terminal.
    pub(crate) async fn start_tty_command(
        &self,
        spec: &[u8],
        cols: u16,
        rows: u16,
    ) -> Result<(Started, OwnedFd), SandboxError> {
        let (started, master) = self.start_spare(spec, None, Some((cols, rows))).await?;
        let master = master.ok_or_else(|| {
            SandboxError::Setup("the command started without its terminal".into())
        })?;
        Ok((started, master))
    }

    async fn start_spare(
        &self,
        spec: &[u8],
        stdio: Option<[BorrowedFd<'_>; 3]>,
        tty: Option<(u16, u16)>,
    ) -> Result<(Started, Option<OwnedFd>), SandboxError> {
        if !self.is_alive() {
            return Err(self.shared.gone());
        }
        let spare = self.take_spare().await?;
        let stdio: Vec<BorrowedFd<'_>> = stdio.map(Vec::from).unwrap_or_default();
        // Small specs (every ordinary command) travel in the message; a large one in a memfd.
        let sent = if spec.len() <= MAX_INLINE_SPEC {
            let message = match tty {
                Some((cols, rows)) => ToSpare::TtyCommand {
                    cols,
                    rows,
                    spec: spec.to_vec(),
                },
                None => ToSpare::Command {
                    spec: spec.to_vec(),
                },
            };
            send_with_fds(&spare.sock, &message.encode(), &stdio).await
        } else {
            let memfd = crate::image::spec_memfd(spec).map_err(|e| setup("spec memfd", e))?;
            let message = match tty {
                Some((cols, rows)) => ToSpare::TtyCommandInMemfd { cols, rows },
                None => ToSpare::CommandInMemfd,
            };
            let mut fds = stdio;
            fds.push(memfd.as_fd());
            send_with_fds(&spare.sock, &message.encode(), &fds).await
        };
        if let Err(e) = sent {
            return Err(self.lost_or(setup("handing the command to its process", e)));
        }
        let mut buf = vec![0u8; MAX_MESSAGE];
        let mut master: Option<OwnedFd> = None;
        let deadline = tokio::time::Instant::now() + SETUP_TIMEOUT;
        loop {
            let out_of_turn = || {
                spare.group.kill();
                SandboxError::Setup(
                    "the command's process answered out of turn; it was stopped".into(),
                )
            };
            match tokio::time::timeout_at(deadline, receive(&spare.sock, &mut buf)).await {
                // End of file: the socket was close-on-exec, the command runs.
                Ok(Ok((0, _, fds))) if fds.is_empty() => {
                    return Ok((
                        Started {
                            group: spare.group,
                            exit: spare.exit,
                            pid: spare.pid,
                        },
                        master,
                    ));
                }
                Ok(Ok((n, _, mut fds))) => match FromSpare::decode(&buf[..n]) {
                    Ok(FromSpare::Failed { reason }) => return Err(SandboxError::Setup(reason)),
                    // Once, asked for, with exactly one descriptor, which must be a PTY master.
                    Ok(FromSpare::Pty) if tty.is_some() && master.is_none() && fds.len() == 1 => {
                        let fd = fds.pop().ok_or_else(out_of_turn)?;
                        if !is_pty_master(&fd) {
                            return Err(out_of_turn());
                        }
                        rustix::io::ioctl_fionbio(&fd, true).map_err(|e| setup("terminal", e))?;
                        master = Some(fd);
                    }
                    Ok(FromSpare::Pty | FromSpare::Hello) | Err(_) => return Err(out_of_turn()),
                },
                Ok(Err(e)) => return Err(self.lost_or(setup("starting the command", e))),
                Err(_) => {
                    spare.group.kill();
                    return Err(SandboxError::Setup(format!(
                        "the command did not start within {} s",
                        SETUP_TIMEOUT.as_secs()
                    )));
                }
            }
        }
    }

    fn lost_or(&self, other: SandboxError) -> SandboxError {
        if self.is_alive() {
            other
        } else {
            self.shared.gone()
        }
    }

    /// Kills the session's sandbox (agent, spare, commands, background processes) and waits,
    /// bounded, for the agent's parent to be gone.
    pub(crate) async fn stop(&self) {
        self.shared.alive.store(false, Ordering::SeqCst);
        if let Ok(mut next) = self.next_spare.lock() {
            next.drain(..).for_each(|task| task.abort());
        }
        self.tree.kill();
        let mut outer = self.shared.outer.lock().await;
        if let Some(child) = outer.as_mut() {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        }
    }
}

impl Drop for Agent {
    /// Everything of the session's sandbox dies with its handle: the control socket closes (the
    /// agent exits on end of file), the outer init is killed (pid 1 has PDEATHSIG on it), and
    /// the session's cgroup subtree is killed and removed by the reaper thread.
    fn drop(&mut self) {
        self.reader.abort();
        if let Ok(mut next) = self.next_spare.lock() {
            next.drain(..).for_each(|task| task.abort());
        }
        self.tree.kill();
        if let Ok(mut outer) = self.shared.outer.try_lock()
            && let Some(child) = outer.as_mut()
        {
            let _ = child.start_kill();
        }
    }
}

/// Forks a spare for the next command and places it in a fresh cgroup of the session.
async fn prepare(shared: Arc<Shared>, tree: Arc<SessionTree>) -> Result<Spare, SandboxError> {
    if !shared.alive.load(Ordering::SeqCst) {
        return Err(shared.gone());
    }
    let slot = shared.next_slot.fetch_add(1, Ordering::Relaxed);
    let group = tree.command().map_err(|e| setup("command cgroup", e))?;
    let (mine, theirs) = socket_pair(true).map_err(|e| setup("command socket", e))?;
    let sock = register(mine).map_err(|e| setup("command socket", e))?;
    let (tx, exit) = oneshot::channel();
    if let Ok(mut w) = shared.waiters.lock() {
        w.insert(slot, tx);
    }
    let sent = send_with_fds(
        &shared.ctl,
        &ToAgent::Prepare { slot }.encode(),
        &[theirs.as_fd()],
    )
    .await;
    drop(theirs);
    if sent.is_err() {
        return Err(shared.gone());
    }
    let mut buf = vec![0u8; MAX_MESSAGE];
    let pid = match tokio::time::timeout(SETUP_TIMEOUT, receive(&sock, &mut buf)).await {
        Ok(Ok((n, pid, _))) if n > 0 => match FromSpare::decode(&buf[..n]) {
            Ok(FromSpare::Hello) => pid.ok_or_else(|| {
                SandboxError::Setup("the command's process came without credentials".into())
            })?,
            Ok(FromSpare::Failed { reason }) => return Err(SandboxError::Setup(reason)),
            Ok(FromSpare::Pty) => {
                return Err(SandboxError::Setup(
                    "the command's process answered out of turn".into(),
                ));
            }
            Err(e) => return Err(SandboxError::Setup(e)),
        },
        Ok(Ok(_)) => {
            // It never said hello: the agent could not fork it, or is gone.
            let why = match tokio::time::timeout(Duration::from_secs(2), exit).await {
                Ok(Ok(SpareEnd::NotStarted(reason))) => {
                    return Err(SandboxError::Setup(format!(
                        "the command's process could not be started: {reason}"
                    )));
                }
                Ok(Ok(SpareEnd::AgentGone(reason))) => return Err(SandboxError::AgentLost(reason)),
                Ok(Ok(SpareEnd::Exited(status))) => format!("it ended with status {status}"),
                _ => "it ended".to_owned(),
            };
            return Err(SandboxError::Setup(format!(
                "the command's process ended before it was ready: {why}"
            )));
        }
        Ok(Err(e)) => return Err(setup("command socket", e)),
        Err(_) => {
            return Err(SandboxError::Setup(format!(
                "the command's process was not ready within {} s",
                SETUP_TIMEOUT.as_secs()
            )));
        }
    };
    // Into its cgroup before it can fork: it waits for its command until then. Off the async
    // threads: moving a process between cgroups can wait for an RCU grace period.
    let group = tokio::task::spawn_blocking(move || group.adopt(pid).map(|()| group))
        .await
        .map_err(|e| setup("command cgroup", e))?
        .map_err(|e| setup("placing the command in its cgroup", e))?;
    Ok(Spare {
        sock,
        group,
        exit,
        pid,
    })
}

type Job = Box<dyn FnOnce() + Send>;

/// The thread agents are started from. `PR_SET_PDEATHSIG` (which kills an agent when the
/// service dies) fires when the *thread* that forked it exits, so agents are forked from one
/// thread that lives as long as the process; it also keeps the fork of the large service
/// process off the async worker threads.
fn spawner() -> &'static Mutex<Option<mpsc::Sender<Job>>> {
    static SPAWNER: OnceLock<Mutex<Option<mpsc::Sender<Job>>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let started = std::thread::Builder::new()
            .name("sandbox-spawner".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            });
        match started {
            Ok(_) => Mutex::new(Some(tx)),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the sandbox spawner thread; agents are started from the calling thread");
                Mutex::new(None)
            }
        }
    })
}

async fn spawn_on_spawner(
    mut command: tokio::process::Command,
) -> io::Result<tokio::process::Child> {
    let handle = tokio::runtime::Handle::current();
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move || {
        let _runtime = handle.enter();
        let _ = tx.send(command.spawn());
    });
    let sender = spawner().lock().ok().and_then(|s| s.clone());
    match sender {
        Some(s) => {
            if let Err(mpsc::SendError(job)) = s.send(job) {
                job();
            }
        }
        None => job(),
    }
    rx.await
        .map_err(|_| io::Error::other("the spawner thread dropped the request"))?
}
