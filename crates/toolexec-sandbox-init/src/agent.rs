//! The resident agent: pid 1 of a session's sandbox, built once (namespaces, mounts, `/tmp`) and
//! kept while the session runs commands. It is the only part of the sandbox that talks to the
//! service, over the control socket of [`crate::protocol`]:
//!
//! ```text
//! agent (pid 1: no capabilities, not dumpable, no_new_privs, Landlock, seccomp; single-threaded)
//!   └─ fork on Prepare ─▶ spare: own session, default signals, rlimits, a Landlock domain of
//!                         its own (so no command can signal or trace the agent or another
//!                         command), says Hello, waits
//!                           └─ on Command (stdio + spec) ─▶ dup2, chdir, execve the command
//! ```
//!
//! The agent applies the layers every command needs to itself before the first fork, so a spare
//! inherits them; what is left per command is a fork (done ahead of time, while the previous
//! command runs) and an exec. The service places each spare in its command's cgroup from the
//! host, knowing its pid from the credentials the kernel attaches to the spare's Hello; nothing
//! of the host's cgroup tree is ever handed in. The agent reaps every process of the sandbox
//! (orphans are re-parented to it) and reports when a spare ends. It exits when the service
//! closes the control socket, which ends the PID namespace and with it every process of the
//! session.
use std::collections::HashMap;
use std::io::{IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use landlock::{CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreated, Scope};
use rustix::event::{PollFd, PollFlags, poll};
use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, send, sendmsg,
};

use crate::protocol::{
    COMMAND_FDS, CONTROL_FD, FromAgent, FromSpare, MAX_INLINE_SPEC, MAX_MESSAGE, ToAgent, ToSpare,
};
use crate::spec::{CommandSpec, InitLimits, MAX_SPEC_BYTES, Spec};
use crate::{ERROR_PREFIX, Never, Prepared, SETUP_FAILED};

/// Builds the session's sandbox and serves it; returns only on a setup failure (after telling
/// the service why).
pub fn run(spec: &Spec) -> Result<Never, String> {
    let result = build_and_serve(spec);
    if let Err(reason) = &result {
        let _ = send_message(
            control(),
            &FromAgent::SetupFailed {
                reason: reason.clone(),
            }
            .encode(),
        );
    }
    result
}

/// The control socket, fd 3 for the agent's whole life.
fn control() -> BorrowedFd<'static> {
    // SAFETY: the service passes the control socket as fd 3 and nothing in this program closes
    // it (a spare replaces it with its own socket, in its own descriptor table).
    unsafe { BorrowedFd::borrow_raw(CONTROL_FD) }
}

fn build_and_serve(spec: &Spec) -> Result<Never, String> {
    crate::namespaces::enter(spec)?;
    // Every command is forked from here: its layers go on the agent itself, once.
    crate::no_new_privs()?;
    crate::landlock_domain()?;
    crate::seccomp_filter()?;
    let scope = command_domain()?;
    let sigchld = sigchld_fd()?;
    send_message(control(), &FromAgent::Ready.encode())
        .map_err(|e| format!("telling the service the sandbox is ready: {e}"))?;
    serve(&spec.limits, &scope, &sigchld)
}

/// The domain each spare adds beneath the agent's: no filesystem rule of its own (the agent's
/// apply), but signals and abstract UNIX sockets scoped to it, so that a command can neither
/// signal the agent nor another command of the session (Landlock also refuses tracing across
/// domains). Built once; each spare enforces a copy.
fn command_domain() -> Result<RulesetCreated, String> {
    let fail = |e: landlock::RulesetError| format!("landlock (command domain): {e}");
    Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(fail)?
        .create()
        .map_err(fail)
}

/// `SIGCHLD` as a descriptor, to wait for it next to the control socket.
fn sigchld_fd() -> Result<OwnedFd, String> {
    // SAFETY: sigset calls on a zeroed set; signalfd returns a new descriptor we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(format!("sigprocmask: {}", std::io::Error::last_os_error()));
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(format!("signalfd: {}", std::io::Error::last_os_error()));
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// A message and one descriptor (`SCM_RIGHTS`).
fn send_with_fd(fd: BorrowedFd<'_>, bytes: &[u8], with: BorrowedFd<'_>) -> Result<(), Errno> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [with];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(Errno::NOBUFS);
    }
    loop {
        match sendmsg(
            fd,
            &[std::io::IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
            Ok(_) => return Ok(()),
        }
    }
}

fn send_message(fd: BorrowedFd<'_>, bytes: &[u8]) -> Result<(), Errno> {
    loop {
        match send(fd, bytes, SendFlags::NOSIGNAL) {
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e),
            Ok(_) => return Ok(()),
        }
    }
}

/// One message and the descriptors that came with it (close-on-exec); `None` at end of file.
fn receive(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<Option<(usize, Vec<OwnedFd>)>, String> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(COMMAND_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = loop {
        let mut iov = [IoSliceMut::new(buf)];
        match recvmsg(fd, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Err(Errno::INTR) => continue,
            other => break other.map_err(|e| format!("recvmsg: {e}"))?,
        }
    };
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    if msg
        .flags
        .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC)
    {
        return Err("a message or its descriptors were cut short".into());
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    Ok(Some((msg.bytes, fds)))
}

fn serve(limits: &InitLimits, scope: &RulesetCreated, sigchld: &OwnedFd) -> Result<Never, String> {
    let ctl = control();
    // Spares (and the commands they became) by pid, with their slot.
    let mut spares: HashMap<libc::pid_t, u64> = HashMap::new();
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let mut fds = [
            PollFd::new(&ctl, PollFlags::IN),
            PollFd::new(sigchld, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Err(Errno::INTR) => continue,
            Err(e) => return Err(format!("poll: {e}")),
            Ok(_) => {}
        }
        let (ctl_ready, child_ended) = (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
        if child_ended {
            let mut info = [0u8; 128 * 8];
            while matches!(rustix::io::read(sigchld, &mut info), Ok(n) if n > 0) {}
            reap(&mut spares);
        }
        if ctl_ready {
            let Some((n, mut received)) = receive(ctl, &mut buf)? else {
                // The service is gone or closed the session: as pid 1, our exit ends every
                // process of the sandbox.
                std::process::exit(0)
            };
            match ToAgent::decode(&buf[..n]) {
                Ok(ToAgent::Prepare { slot }) if received.len() == 1 => {
                    if let Some(sock) = received.pop() {
                        match fork_spare(sock, limits, scope) {
                            Ok(pid) => {
                                spares.insert(pid, slot);
                            }
                            Err(reason) => {
                                let m = FromAgent::PrepareFailed { slot, reason };
                                if send_message(ctl, &m.encode()).is_err() {
                                    std::process::exit(0)
                                }
                            }
                        }
                    }
                }
                // Anything else is dropped (its descriptors closed): only the service writes
                // here, and it does not send what this does not understand.
                _ => drop(received),
            }
        }
    }
}

/// Reaps every ended child (orphans of commands included: they are re-parented to pid 1) and
/// reports spares.
fn reap(spares: &mut HashMap<libc::pid_t, u64>) {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid out pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
        if let Some(slot) = spares.remove(&pid)
            && send_message(control(), &FromAgent::Exited { slot, status }.encode()).is_err()
        {
            std::process::exit(0)
        }
    }
}

fn fork_spare(
    sock: OwnedFd,
    limits: &InitLimits,
    scope: &RulesetCreated,
) -> Result<libc::pid_t, String> {
    // SAFETY: this program is single-threaded, so the child may do anything the parent could.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        spare(sock, limits, scope)
    }
    Ok(pid)
}

/// The spare, in the forked child: never returns.
fn spare(sock: OwnedFd, limits: &InitLimits, scope: &RulesetCreated) -> ! {
    // Its own socket takes the control socket's number: from here on fd 3 reaches the service's
    // end for this spare only, and the agent's control socket is not in this process.
    // SAFETY: dup3 onto fd 3 and fcntl on descriptors this process owns.
    let moved = unsafe {
        let rc = if sock.as_raw_fd() == CONTROL_FD {
            0
        } else {
            libc::dup3(sock.as_raw_fd(), CONTROL_FD, libc::O_CLOEXEC)
        };
        rc >= 0
    };
    if !moved {
        // Nothing can be said to the service; the agent reports the exit.
        // SAFETY: ends this process.
        unsafe { libc::_exit(SETUP_FAILED) }
    }
    drop(sock);
    let reason = match become_command(limits, scope) {
        Ok(never) => match never {},
        Err(reason) => reason,
    };
    let _ = send_message(
        control(),
        &FromSpare::Failed {
            reason: reason.clone(),
        }
        .encode(),
    );
    eprintln!("{ERROR_PREFIX} {reason}");
    // SAFETY: ends this process without running the agent's destructors.
    unsafe { libc::_exit(SETUP_FAILED) }
}

fn become_command(limits: &InitLimits, scope: &RulesetCreated) -> Result<Never, String> {
    // A session of its own: no controlling terminal, its own process group.
    // SAFETY: setsid takes no arguments.
    if unsafe { libc::setsid() } < 0 {
        return Err(format!("setsid: {}", std::io::Error::last_os_error()));
    }
    crate::apply_rlimits(limits)?;
    scope
        .try_clone()
        .map_err(|e| format!("landlock (command domain): {e}"))?
        .restrict_self()
        .map_err(|e| format!("landlock (command domain): {e}"))?;
    // Nothing of the agent's (its signal descriptor, the rulesets) stays.
    crate::close_from(CONTROL_FD as libc::c_uint + 1)?;
    let sock = control();
    send_message(sock, &FromSpare::Hello.encode()).map_err(|e| format!("hello: {e}"))?;
    // A spare waits with no buffer of its own: the message's length first (peeked, the message
    // and its descriptors stay queued), then a buffer of that size — a spare that zero-filled
    // the largest one while it waits would hold 60 KiB more in every idle session.
    let len = loop {
        let mut probe = [0u8; 1];
        match rustix::net::recv(sock, &mut probe, RecvFlags::PEEK | RecvFlags::TRUNC) {
            Err(Errno::INTR) => continue,
            other => break other.map_err(|e| format!("recv: {e}"))?,
        }
    };
    let mut buf = vec![0u8; len.1.clamp(1, MAX_INLINE_SPEC + 1)];
    let Some((n, mut fds)) = receive(sock, &mut buf)? else {
        // Not needed after all (the session closed).
        // SAFETY: ends this process.
        unsafe { libc::_exit(0) }
    };
    let message = ToSpare::decode(&buf[..n])?;
    if fds.len() != message.fds() {
        return Err(format!(
            "{} descriptors instead of {}",
            fds.len(),
            message.fds()
        ));
    }
    let tty = message.tty();
    let bytes = match message {
        ToSpare::Command { spec } | ToSpare::TtyCommand { spec, .. } => spec,
        ToSpare::CommandInMemfd | ToSpare::TtyCommandInMemfd { .. } => {
            let mut bytes = Vec::new();
            let spec = fds.pop().ok_or("no spec descriptor")?;
            std::fs::File::from(spec)
                .take(MAX_SPEC_BYTES as u64 + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| format!("reading the command: {e}"))?;
            if bytes.len() > MAX_SPEC_BYTES {
                return Err(format!("the command is larger than {MAX_SPEC_BYTES} bytes"));
            }
            bytes
        }
    };
    let command = CommandSpec::decode(&bytes)?;
    let prepared = Prepared::new(command.argv, command.env)?;
    let [stdin, stdout, stderr]: [OwnedFd; 3] = match tty {
        Some((cols, rows)) => {
            let slave = crate::pty::open_in_sandbox(cols, rows, |master| {
                send_with_fd(sock, &FromSpare::Pty.encode(), master)
                    .map_err(|e| format!("handing the terminal over: {e}"))
            })?;
            let dup = |fd: &OwnedFd| {
                fd.try_clone()
                    .map_err(|e| format!("the terminal's slave: {e}"))
            };
            [dup(&slave)?, dup(&slave)?, slave]
        }
        None => fds
            .try_into()
            .map_err(|fds: Vec<OwnedFd>| format!("{} descriptors instead of 3", fds.len()))?,
    };
    for (fd, target) in [(stdin, 0), (stdout, 1), (stderr, 2)] {
        // SAFETY: dup2 between descriptors this process owns; the received ones are above 3.
        if unsafe { libc::dup2(fd.as_raw_fd(), target) } < 0 {
            return Err(format!("dup2: {}", std::io::Error::last_os_error()));
        }
    }
    // A terminal as stdin (`exec_command` with `tty: true`) becomes the command's controlling
    // terminal — the spare leads a session of its own and has none — so that Ctrl-C typed into
    // it reaches the command's foreground process group. Failing that, it is still a terminal.
    // SAFETY: isatty and ioctl(TIOCSCTTY) on fd 0, which this process owns.
    unsafe {
        if libc::isatty(0) == 1 {
            libc::ioctl(0, libc::TIOCSCTTY, 0);
        }
    }
    let mut dir = b"/workspace".to_vec();
    if !command.workdir.is_empty() {
        dir.push(b'/');
        dir.extend_from_slice(&command.workdir);
    }
    let dir = <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(dir);
    std::env::set_current_dir(&dir).map_err(|e| format!("chdir {}: {e}", dir.display()))?;
    crate::default_signals();
    Err(prepared.exec())
}
