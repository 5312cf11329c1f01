//! Terminals (`exec_command` / `write_stdin`): programs a session starts and then talks to,
//! through pipes (`tty: false`) or a pseudo-terminal (`tty: true`), their output kept in a
//! bounded buffer of what the model has not read yet.
//!
//! - A terminal is a command of the session's sandbox like any other (its own cgroup, the same
//!   layers); its stdin is a pipe, or the PTY's slave (and its controlling terminal), and its
//!   stdout and stderr are one stream.
//! - The PTY is made inside the session's resident sandbox, from its own devpts instance (its
//!   `/dev/pts`, mounted when the sandbox was built): the command's process opens `/dev/ptmx`
//!   before its exec, keeps the slave as its stdio and controlling terminal and hands the master
//!   to the service over its socket. The host's devpts is never used (but unsandboxed, where
//!   there is no sandbox); pushing input into a terminal (`TIOCSTI`) is refused by the seccomp
//!   filter.
//! - Unread output is kept up to a cap (1 MiB): its first half and its last half, the bytes
//!   dropped between them counted and said.
//! - Ids are random in 1000–99999, unique in the session (as Codex allocates them).
//! - A terminal ends with its program, after `idle` without a call touching it, with its
//!   session (close, rewind, take-over: its cgroup is killed) and with the service.
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

use crate::cgroup::CommandGroup;

/// How long a killed terminal's end is waited for before its reader gives it up (its group is
/// killed again on each tick meanwhile).
const KILL_REPORT: Duration = Duration::from_secs(10);
use crate::run::{Lost, Process};

/// Unread output kept per terminal.
pub const BUFFER_BYTES: usize = 1024 * 1024;

/// How far back `write_stdin` with `until` looks for a match that spans reads.
pub const UNTIL_WINDOW: usize = 64 * 1024;

/// Longest text `until`'s patterns are searched in on the calling (async) thread; a longer one
/// is searched on the blocking pool. A search is linear in the text (the `regex` crate), but a
/// pattern that defeats its lazy DFA runs at a few MB/s: 1 KiB costs well under a millisecond.
pub const INLINE_SEARCH_BYTES: usize = 1024;

/// A search that took longer than this makes the call wait as long before the next one.
const SEARCH_PACE_AFTER: Duration = Duration::from_millis(1);

/// Writes `chars` to a terminal's program (nothing for none): only a PTY's program reads
/// input, and one that does not read it within 5 s fails the write.
async fn write_input(term: &Term, chars: &[u8]) -> Result<(), TermError> {
    if chars.is_empty() {
        return Ok(());
    }
    if !term.tty {
        return Err(TermError::StdinClosed);
    }
    let mut stdin = term.stdin.lock().await;
    let Some(w) = stdin.as_mut() else {
        return Err(TermError::StdinClosed);
    };
    match tokio::time::timeout(Duration::from_secs(5), w.write_all(chars)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(TermError::Write(e.to_string())),
        Err(_) => Err(TermError::Write(
            "the program did not read its input within 5 s".into(),
        )),
    }
}

/// Searches `window` for `until`, off the async workers when it is long: the window back, the
/// match, and how long the search took.
async fn search(
    window: Vec<u8>,
    until: &Arc<dyn Until>,
) -> (Vec<u8>, Option<(usize, usize)>, Duration) {
    let run = |window: Vec<u8>, until: &dyn Until| {
        let t = Instant::now();
        let found = until.find(&window);
        (window, found, t.elapsed())
    };
    if window.len() <= INLINE_SEARCH_BYTES {
        return run(window, until.as_ref());
    }
    let until = until.clone();
    tokio::task::spawn_blocking(move || run(window, until.as_ref()))
        .await
        // The search panicked (a bug in a pattern engine): no match, the window starts over.
        .unwrap_or_else(|_| (Vec::new(), None, Duration::ZERO))
}

/// What `write_stdin`'s `until` waits for in a terminal's output (raw bytes, escape sequences
/// included): the end of the earliest match in `haystack` and which pattern it was.
pub trait Until: Send + Sync {
    fn find(&self, haystack: &[u8]) -> Option<(usize, usize)>;
}

/// How a terminal ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TermExit {
    pub exit_code: Option<i32>,
    /// Set when the service ended it: why.
    pub killed_by: Option<String>,
}

/// What a call gets back from a terminal.
#[derive(Debug, Clone)]
pub struct TermRead {
    pub id: u32,
    /// Raw output (escape sequences included) since the last read.
    pub output: Vec<u8>,
    /// Bytes dropped from the middle of it (the buffer keeps its head and its tail).
    pub dropped: u64,
    /// Set once the program has ended and all its output was read: the id is then forgotten.
    pub exit: Option<TermExit>,
    pub wall: Duration,
}

/// Why a terminal call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TermError {
    Unknown(u32),
    StdinClosed,
    Write(String),
}

struct Unread {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    dropped: u64,
    cap: usize,
}

impl Unread {
    fn push(&mut self, bytes: &[u8]) {
        let half = self.cap / 2;
        let mut rest = bytes;
        if self.tail.is_empty() && self.dropped == 0 && self.head.len() < half {
            let take = (half - self.head.len()).min(rest.len());
            self.head.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
        }
        self.tail.extend(rest);
        let over = self.tail.len().saturating_sub(self.cap - half);
        if over > 0 {
            self.tail.drain(..over);
            self.dropped += over as u64;
        }
    }

    fn is_empty(&self) -> bool {
        self.head.is_empty() && self.tail.is_empty() && self.dropped == 0
    }

    fn take(&mut self) -> (Vec<u8>, u64) {
        let mut out = std::mem::take(&mut self.head);
        out.extend(self.tail.drain(..));
        (out, std::mem::take(&mut self.dropped))
    }
}

/// Where a terminal's output is read and its input written.
pub(crate) enum Io {
    Pipes {
        stdin: Option<tokio::net::unix::pipe::Sender>,
        output: tokio::net::unix::pipe::Receiver,
    },
    Pty(Arc<AsyncFd<OwnedFd>>),
}

struct Term {
    id: u32,
    tty: bool,
    command: String,
    unread: Mutex<Unread>,
    exit: Mutex<Option<TermExit>>,
    /// The reader saw the end of the output (after the exit: everything is in `unread`).
    drained: std::sync::atomic::AtomicBool,
    changed: Notify,
    last_used: Mutex<Instant>,
    stdin: tokio::sync::Mutex<Option<Writer>>,
    kill: tokio_util::sync::CancellationToken,
    killed_by: Mutex<Option<String>>,
}

enum Writer {
    Pipe(tokio::net::unix::pipe::Sender),
    Pty(Arc<AsyncFd<OwnedFd>>),
}

impl Writer {
    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Writer::Pipe(p) => {
                p.write_all(bytes).await?;
                p.flush().await
            }
            Writer::Pty(fd) => {
                let mut rest = bytes;
                while !rest.is_empty() {
                    let mut guard = fd.writable().await?;
                    match guard.try_io(|f| rustix::io::write(f.get_ref(), rest).map_err(Into::into))
                    {
                        Ok(Ok(n)) => rest = &rest[n..],
                        Ok(Err(e)) => return Err(e),
                        Err(_would_block) => continue,
                    }
                }
                Ok(())
            }
        }
    }
}

impl Term {
    fn exit(&self) -> Option<TermExit> {
        self.exit.lock().ok().and_then(|e| e.clone())
    }

    fn finished(&self) -> bool {
        self.exit().is_some() && self.drained.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn touch(&self) {
        if let Ok(mut t) = self.last_used.lock() {
            *t = Instant::now();
        }
    }
}

/// A session's terminals.
#[derive(Default)]
pub(crate) struct Terminals {
    terms: Mutex<BTreeMap<u32, Arc<Term>>>,
}

/// A terminal as listed (for recording and for the session's close).
#[derive(Debug, Clone)]
pub struct TermInfo {
    pub id: u32,
    pub command: String,
    pub tty: bool,
}

impl Terminals {
    /// Terminals whose program still runs (ended ones wait for a call to read their end).
    pub(crate) fn running(&self) -> usize {
        self.terms
            .lock()
            .map(|t| t.values().filter(|t| t.exit().is_none()).count())
            .unwrap_or(0)
    }

    pub(crate) fn count(&self) -> usize {
        self.terms.lock().map(|t| t.len()).unwrap_or(0)
    }

    pub(crate) fn list(&self) -> Vec<TermInfo> {
        self.terms
            .lock()
            .map(|t| {
                t.values()
                    .map(|t| TermInfo {
                        id: t.id,
                        command: t.command.clone(),
                        tty: t.tty,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A fresh id, random in 1000–99999, not in use.
    pub(crate) fn fresh_id(&self) -> u32 {
        let used: Vec<u32> = self
            .terms
            .lock()
            .map(|t| t.keys().copied().collect())
            .unwrap_or_default();
        loop {
            let mut b = [0u8; 4];
            let _ = getrandom::fill(&mut b);
            let id = 1000 + u32::from_le_bytes(b) % 99_000;
            if !used.contains(&id) {
                return id;
            }
        }
    }

    /// Registers a started program and starts reading it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add(
        &self,
        id: u32,
        command: String,
        tty: bool,
        io: Io,
        mut process: Process,
        group: Option<CommandGroup>,
        idle: Duration,
        admitted: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) {
        let (writer, mut reader) = match io {
            Io::Pipes { stdin, output } => (stdin.map(Writer::Pipe), Reader::Pipe(output)),
            Io::Pty(fd) => (Some(Writer::Pty(fd.clone())), Reader::Pty(fd)),
        };
        let term = Arc::new(Term {
            id,
            tty,
            command,
            unread: Mutex::new(Unread {
                head: Vec::new(),
                tail: VecDeque::new(),
                dropped: 0,
                cap: BUFFER_BYTES,
            }),
            exit: Mutex::new(None),
            drained: std::sync::atomic::AtomicBool::new(false),
            changed: Notify::new(),
            last_used: Mutex::new(Instant::now()),
            stdin: tokio::sync::Mutex::new(writer),
            kill: tokio_util::sync::CancellationToken::new(),
            killed_by: Mutex::new(None),
        });
        if let Ok(mut terms) = self.terms.lock() {
            terms.insert(id, term.clone());
        }
        let t = term;
        tokio::spawn(async move {
            let _admitted = admitted;
            // Small: one per terminal, idle ones included (a PTY gives at most 4 KiB a read).
            let mut buf = vec![0u8; 16 * 1024];
            let mut open = true;
            let mut status: Option<Result<std::process::ExitStatus, Lost>> = None;
            let mut drain_until: Option<tokio::time::Instant> = None;
            // When the kill was sent: it is sent once (a cancelled token stays ready, and a
            // branch that is always ready would spin this task without ever yielding, starving
            // whatever shares its worker, the report of the very exit it waits for included).
            let mut killed_at: Option<tokio::time::Instant> = None;
            let tick = Duration::from_secs(1).min(idle);
            loop {
                let wake = drain_until.unwrap_or_else(|| tokio::time::Instant::now() + tick);
                tokio::select! {
                    n = reader.read(&mut buf), if open => match n {
                        Ok(0) | Err(_) => open = false,
                        Ok(n) => {
                            if let Ok(mut u) = t.unread.lock() { u.push(&buf[..n]); }
                            t.changed.notify_waiters();
                        }
                    },
                    s = process.wait(), if status.is_none() => {
                        status = Some(s);
                        drain_until = Some(tokio::time::Instant::now() + Duration::from_secs(2));
                    }
                    () = t.kill.cancelled(), if status.is_none() && killed_at.is_none() => {
                        if let Some(g) = &group { g.kill_nowait(); }
                        process.start_kill();
                        killed_at = Some(tokio::time::Instant::now());
                    }
                    () = tokio::time::sleep_until(wake) => {
                        if drain_until.is_some() { break; }
                        if let Some(at) = killed_at {
                            // Killed, not reported gone yet: kill again (a process forked as
                            // the first kill went out), and wait no longer than KILL_REPORT.
                            if at.elapsed() >= KILL_REPORT {
                                tracing::warn!(terminal = t.id, "a killed terminal's end was not reported in time; it is given up");
                                break;
                            }
                            if let Some(g) = &group { g.kill_nowait(); }
                            continue;
                        }
                        let idle_for = t.last_used.lock().map(|l| l.elapsed()).unwrap_or_default();
                        if idle_for >= idle && !t.kill.is_cancelled() {
                            if let Ok(mut k) = t.killed_by.lock() {
                                k.get_or_insert_with(|| format!(
                                    "it was idle for {} s (limits.terminal_idle_timeout_ms)", idle.as_secs()
                                ));
                            }
                            t.kill.cancel();
                        }
                    }
                }
                if !open && status.is_some() {
                    break;
                }
            }
            // Nothing of it stays: background children included.
            if let Some(g) = &group {
                g.kill_nowait();
            }
            drop(group);
            use std::os::unix::process::ExitStatusExt;
            let code = match status {
                Some(Ok(s)) => s.code().or_else(|| s.signal().map(|sig| 128 + sig)),
                _ => None,
            };
            let killed_by = t.killed_by.lock().ok().and_then(|k| k.clone());
            if let Ok(mut e) = t.exit.lock() {
                *e = Some(TermExit {
                    exit_code: code,
                    killed_by,
                });
            }
            t.drained.store(true, std::sync::atomic::Ordering::SeqCst);
            t.changed.notify_waiters();
        });
    }

    fn get(&self, id: u32) -> Result<Arc<Term>, TermError> {
        self.terms
            .lock()
            .ok()
            .and_then(|t| t.get(&id).cloned())
            .ok_or(TermError::Unknown(id))
    }

    /// Writes `chars` (if any), then waits: until `yield_for` has passed or the program ended
    /// (`until_output`: or some output arrived); returns what it printed since the last read.
    pub(crate) async fn interact(
        &self,
        id: u32,
        chars: &[u8],
        yield_for: Duration,
        until_output: bool,
        t0: Instant,
    ) -> Result<TermRead, TermError> {
        let term = self.get(id)?;
        term.touch();
        write_input(&term, chars).await?;
        let deadline = tokio::time::Instant::now() + yield_for;
        loop {
            let notified = term.changed.notified();
            if term.finished() {
                break;
            }
            if until_output && term.unread.lock().is_ok_and(|u| !u.is_empty()) {
                break;
            }
            // `timeout_at` polls its future first: with output arriving all the time, only
            // this check ends the wait at its deadline.
            if tokio::time::Instant::now() >= deadline
                || tokio::time::timeout_at(deadline, notified).await.is_err()
            {
                break;
            }
        }
        term.touch();
        let finished = term.finished();
        let (output, dropped) = term.unread.lock().map(|mut u| u.take()).unwrap_or_default();
        let exit = if finished {
            if let Ok(mut terms) = self.terms.lock() {
                terms.remove(&id);
            }
            term.exit()
        } else {
            None
        };
        Ok(TermRead {
            id,
            output,
            dropped,
            exit,
            wall: t0.elapsed(),
        })
    }

    /// [`Terminals::interact`] that also returns as soon as the output matches `until`: the
    /// output up to the end of the match is returned (with which pattern matched), and what
    /// came after it stays unread, for the next call. Output already unread when it starts is
    /// searched too (as `expect` searches what a program printed before it was called).
    ///
    /// The patterns are the caller's (regular expressions a tenant wrote): a search longer than
    /// [`INLINE_SEARCH_BYTES`] runs on the blocking pool, never on the async workers that serve
    /// other sessions, and after a search that took more than a millisecond the call waits as
    /// long before the next (the output gathers meanwhile and is searched in one go): however
    /// the output trickles in and whatever the patterns, one call searches at most half a core.
    pub(crate) async fn interact_until(
        &self,
        id: u32,
        chars: &[u8],
        yield_for: Duration,
        until: Arc<dyn Until>,
        t0: Instant,
    ) -> Result<(TermRead, Option<usize>), TermError> {
        let term = self.get(id)?;
        term.touch();
        write_input(&term, chars).await?;
        let deadline = tokio::time::Instant::now() + yield_for;
        // What this call returns (bounded like the terminal's own buffer), and the end of the
        // stream it searches: a match may span chunks, not more than UNTIL_WINDOW bytes back.
        let mut got = Unread {
            head: Vec::new(),
            tail: VecDeque::new(),
            dropped: 0,
            cap: BUFFER_BYTES,
        };
        let mut window: Vec<u8> = Vec::new();
        let mut matched = None;
        loop {
            let notified = term.changed.notified();
            let finished = term.finished();
            let (chunk, dropped) = term.unread.lock().map(|mut u| u.take()).unwrap_or_default();
            got.dropped += dropped;
            if !chunk.is_empty() {
                let before = window.len();
                window.extend_from_slice(&chunk);
                let (searched, found, took) = search(window, &until).await;
                window = searched;
                if let Some((end, which)) = found {
                    let keep = end.saturating_sub(before).min(chunk.len());
                    got.push(&chunk[..keep]);
                    if keep < chunk.len()
                        && let Ok(mut u) = term.unread.lock()
                    {
                        // Ahead of whatever the reader added since: the stream's order holds.
                        u.head.splice(0..0, chunk[keep..].iter().copied());
                    }
                    matched = Some(which);
                    break;
                }
                got.push(&chunk);
                if window.len() > UNTIL_WINDOW {
                    window.drain(..window.len() - UNTIL_WINDOW);
                }
                if took > SEARCH_PACE_AFTER {
                    tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + took))
                        .await;
                }
            }
            if finished {
                break;
            }
            // As in `interact`: output that never pauses must not keep the call past its time.
            if tokio::time::Instant::now() >= deadline
                || tokio::time::timeout_at(deadline, notified).await.is_err()
            {
                break;
            }
        }
        term.touch();
        let finished = matched.is_none() && term.finished();
        let (output, dropped) = got.take();
        let exit = if finished {
            if let Ok(mut terms) = self.terms.lock() {
                terms.remove(&id);
            }
            term.exit()
        } else {
            None
        };
        Ok((
            TermRead {
                id,
                output,
                dropped,
                exit,
                wall: t0.elapsed(),
            },
            matched,
        ))
    }

    /// Kills every terminal (the session closes): their ends, for recording.
    pub(crate) async fn shutdown(&self, why: &str) -> Vec<(TermInfo, TermExit)> {
        let terms: Vec<Arc<Term>> = self
            .terms
            .lock()
            .map(|mut t| std::mem::take(&mut *t).into_values().collect())
            .unwrap_or_default();
        // Every terminal is killed first, then all are waited for under one deadline: a
        // session's 16 terminals cost at most 5 s together, not 5 s each.
        for t in &terms {
            if let Ok(mut k) = t.killed_by.lock() {
                k.get_or_insert_with(|| why.to_owned());
            }
            t.kill.cancel();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut ended = Vec::new();
        for t in terms {
            while !t.finished() && tokio::time::Instant::now() < deadline {
                let notified = t.changed.notified();
                if t.finished() {
                    break;
                }
                let _ = tokio::time::timeout_at(deadline, notified).await;
            }
            ended.push((
                TermInfo {
                    id: t.id,
                    command: t.command.clone(),
                    tty: t.tty,
                },
                t.exit().unwrap_or(TermExit {
                    exit_code: None,
                    killed_by: Some(why.to_owned()),
                }),
            ));
        }
        ended
    }
}

impl Drop for Terminals {
    fn drop(&mut self) {
        if let Ok(terms) = self.terms.lock() {
            for t in terms.values() {
                t.kill.cancel();
            }
        }
    }
}

enum Reader {
    Pipe(tokio::net::unix::pipe::Receiver),
    Pty(Arc<AsyncFd<OwnedFd>>),
}

impl Reader {
    async fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Reader::Pipe(p) => p.read(buf).await,
            Reader::Pty(fd) => loop {
                let mut guard = fd.readable().await?;
                match guard.try_io(|f| rustix::io::read(f.get_ref(), &mut *buf).map_err(Into::into))
                {
                    // EIO: every slave descriptor is closed (the program and its children
                    // ended): the end of the output.
                    Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                    Ok(r) => return r,
                    Err(_would_block) => continue,
                }
            },
        }
    }
}

/// A pseudo-terminal of `cols`×`rows` from the host's `/dev/ptmx`, for an unsandboxed service
/// only: the master (non-blocking, for the service) and the slave (for the program's stdio).
pub(crate) fn open_pty(cols: u16, rows: u16) -> std::io::Result<(OwnedFd, OwnedFd)> {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    rustix::termios::tcsetwinsize(
        &master,
        rustix::termios::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        },
    )?;
    rustix::io::ioctl_fionbio(&master, true)?;
    Ok((master, slave))
}

/// Registers a PTY master with the runtime.
pub(crate) fn register(fd: OwnedFd) -> std::io::Result<Arc<AsyncFd<OwnedFd>>> {
    // SAFETY: an `OwnedFd` owns its descriptor until it is dropped and always yields the same
    // number; the `AsyncFd` owns it from here on and nothing swaps it.
    #[allow(unsafe_code)]
    let registered = unsafe { AsyncFd::register(fd) };
    Ok(Arc::new(registered?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_buffer_keeps_its_head_and_tail_and_counts_the_rest() {
        let mut u = Unread {
            head: Vec::new(),
            tail: VecDeque::new(),
            dropped: 0,
            cap: 10,
        };
        u.push(b"0123");
        u.push(b"456789abcdef");
        let (out, dropped) = u.take();
        assert_eq!(out, b"01234bcdef");
        assert_eq!(dropped, 6);
        u.push(b"xy");
        assert_eq!(u.take(), (b"xy".to_vec(), 0));
    }
}

#[cfg(test)]
mod until_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    struct Literal(&'static [u8]);

    impl Until for Literal {
        fn find(&self, hay: &[u8]) -> Option<(usize, usize)> {
            hay.windows(self.0.len())
                .position(|w| w == self.0)
                .map(|at| (at + self.0.len(), 0))
        }
    }

    /// The output up to the match comes back at once; what follows it stays unread, in order,
    /// for the next call; without a match the call waits its time and returns what came.
    #[tokio::test]
    async fn until_returns_at_the_match_and_leaves_the_rest_unread() {
        let (out_r, out_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
        let output = tokio::net::unix::pipe::Receiver::from_owned_fd(out_r).unwrap();
        let (_tx, rx) = tokio::sync::oneshot::channel();
        let terms = Terminals::default();
        terms.add(
            1000,
            "test".into(),
            false,
            Io::Pipes {
                stdin: None,
                output,
            },
            Process::Resident(Some(rx)),
            None,
            Duration::from_secs(60),
            None,
        );
        rustix::io::write(&out_w, b"abc-MA").unwrap();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            rustix::io::write(&out_w, b"TCH-rest").unwrap();
            out_w
        });
        let t0 = Instant::now();
        let (read, matched) = terms
            .interact_until(
                1000,
                b"",
                Duration::from_secs(20),
                Arc::new(Literal(b"MATCH")),
                t0,
            )
            .await
            .unwrap();
        assert_eq!(matched, Some(0));
        assert_eq!(read.output, b"abc-MATCH");
        assert!(t0.elapsed() < Duration::from_secs(5));
        let _out_w = writer.await.unwrap();
        let (read, matched) = terms
            .interact_until(
                1000,
                b"",
                Duration::from_millis(300),
                Arc::new(Literal(b"never")),
                Instant::now(),
            )
            .await
            .unwrap();
        assert_eq!(matched, None);
        assert_eq!(read.output, b"-rest");
        assert!(read.exit.is_none());
    }

    /// A search as slow as a pattern that defeats the regex engine's DFA (here: 200 ms each).
    struct Slow(std::sync::atomic::AtomicUsize);

    impl Until for Slow {
        fn find(&self, _hay: &[u8]) -> Option<(usize, usize)> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(200));
            None
        }
    }

    /// A tenant's slow pattern over a long output costs its own call, not the async thread
    /// other sessions' calls run on; while output keeps trickling in, the call searches at
    /// most half the time (each slow search is followed by as long a wait), and output that
    /// never pauses does not keep it past its time.
    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_search_never_holds_the_async_thread() {
        let (out_r, out_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
        let output = tokio::net::unix::pipe::Receiver::from_owned_fd(out_r).unwrap();
        let (_tx, rx) = tokio::sync::oneshot::channel();
        let terms = Terminals::default();
        terms.add(
            1000,
            "test".into(),
            false,
            Io::Pipes {
                stdin: None,
                output,
            },
            Process::Resident(Some(rx)),
            None,
            Duration::from_secs(60),
            None,
        );
        // Output that keeps coming, each piece past the inline bound.
        let writer = std::thread::spawn(move || {
            for _ in 0..40 {
                rustix::io::write(&out_w, &[b'x'; 4 * INLINE_SEARCH_BYTES]).unwrap();
                std::thread::sleep(Duration::from_millis(25));
            }
            out_w
        });
        // Another session's work on the same (only) async thread: its longest wait.
        let ticker = tokio::spawn(async {
            let mut worst = Duration::ZERO;
            let mut last = Instant::now();
            for _ in 0..80 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                worst = worst.max(last.elapsed());
                last = Instant::now();
            }
            worst
        });
        let slow = Arc::new(Slow(std::sync::atomic::AtomicUsize::new(0)));
        let t0 = Instant::now();
        let (read, matched) = terms
            .interact_until(1000, b"", Duration::from_secs(1), slow.clone(), t0)
            .await
            .unwrap();
        let took = t0.elapsed();
        let searched = slow.0.load(std::sync::atomic::Ordering::Relaxed);
        let worst = ticker.await.unwrap();
        let _out_w = writer.join().unwrap();
        assert_eq!(matched, None);
        assert!(!read.output.is_empty());
        assert!(
            worst < Duration::from_millis(150),
            "the async thread was held {worst:?}"
        );
        // One second: a 200 ms search, then a 200 ms wait, … — three searches at most, and
        // the call ends at its time (plus the search under way), although output keeps coming.
        assert!(
            (1..=3).contains(&searched),
            "{searched} searches in {took:?}"
        );
        assert!(took < Duration::from_millis(1400), "the call took {took:?}");
    }
}

#[cfg(test)]
mod kill_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::resident::SpareEnd;

    /// A killed terminal whose end is reported by another task (a resident agent's) must let
    /// that task run: on a single thread, a reader that never yields would wait for ever.
    #[test]
    fn a_killed_terminal_yields_until_its_end_is_reported() {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let ended = rt.block_on(async {
                let (out_r, out_w) =
                    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).unwrap();
                let output = tokio::net::unix::pipe::Receiver::from_owned_fd(out_r).unwrap();
                let (tx, rx) = tokio::sync::oneshot::channel();
                let terms = Terminals::default();
                terms.add(
                    1000,
                    "cat".into(),
                    false,
                    Io::Pipes {
                        stdin: None,
                        output,
                    },
                    Process::Resident(Some(rx)),
                    None,
                    Duration::from_secs(60),
                    None,
                );
                // The agent's report, after the kill went out.
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    let _ = tx.send(SpareEnd::Exited(9));
                });
                let ended = terms.shutdown("the workspace was rewound").await;
                drop(out_w);
                ended
            });
            let _ = done_tx.send(ended);
        });
        let ended = done_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the shutdown did not end within 30 s");
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].1.exit_code, Some(137));
        assert_eq!(
            ended[0].1.killed_by.as_deref(),
            Some("the workspace was rewound")
        );
    }
}
