//! The resident agent's wire protocol: what the service and a session's agent (and the agent's
//! pre-forked command processes, "spares") say to each other. Every channel is a `SOCK_SEQPACKET`
//! socket pair made by the service (no path on disk, nothing another process can connect to), so
//! each message arrives whole or not at all; descriptors travel with a message as `SCM_RIGHTS`.
//!
//! ```text
//! control socket (fd 3 of the agent)
//!   service → agent   Prepare{slot}              + 1 fd: the spare's end of a new socket pair
//!   agent → service   Ready                       the sandbox is built, every layer in place
//!                     SetupFailed{reason}         then the agent exits
//!                     PrepareFailed{slot, reason} the spare could not be forked (pids limit, …)
//!                     Exited{slot, status}        the spare (or the command it became) ended
//! spare socket (fd 3 of a spare, close-on-exec)
//!   spare → service   Hello                       the kernel attaches the spare's credentials
//!                                                 (SO_PASSCRED): its pid in the service's PID
//!                                                 namespace, to put it in its cgroup
//!   service → spare   Command{spec}               + 3 fds: stdin, stdout, stderr
//!                     CommandInMemfd              + 4 fds: the same and a memfd with the spec
//!                                                 (a spec too large for one message)
//!                     TtyCommand{cols, rows, spec} no fd: the spare makes a pseudo-terminal in
//!                                                 the sandbox's own devpts instance, the slave
//!                                                 the command's stdio and controlling terminal
//!                     TtyCommandInMemfd{cols, rows} + 1 fd: the memfd with the spec
//!   spare → service   Pty                         + 1 fd: that terminal's master (tty only,
//!                                                 before the exec)
//!                     Failed{reason}              the command could not be started
//!                     (end of file)               exec happened: the socket was close-on-exec
//! ```
//!
//! Nothing here makes a system call: both sides encode and decode with these functions, and the
//! decoders treat their input as hostile (the service reads what a process inside the sandbox
//! wrote).

/// The agent's end of the control socket.
pub const CONTROL_FD: i32 = 3;

/// Largest message either side sends (a reason is cut to fit).
pub const MAX_MESSAGE: usize = 4096;

/// Most descriptors that come with a message: stdin, stdout, stderr and, with
/// [`ToSpare::CommandInMemfd`], the command's spec.
pub const COMMAND_FDS: usize = 4;

/// Largest spec sent inside [`ToSpare::Command`]; larger ones go in a memfd. Well below the
/// smallest send buffer a `SOCK_SEQPACKET` message must fit in (`net.core.wmem_default`, 208 KiB
/// by default).
pub const MAX_INLINE_SPEC: usize = 60 * 1024;

/// Service → agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToAgent {
    /// Fork a spare for `slot`, talking on the one descriptor that comes with the message.
    Prepare { slot: u64 },
}

/// Agent → service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromAgent {
    Ready,
    SetupFailed {
        reason: String,
    },
    PrepareFailed {
        slot: u64,
        reason: String,
    },
    /// `status` as `waitpid` reports it.
    Exited {
        slot: u64,
        status: i32,
    },
}

/// Service → spare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToSpare {
    /// The command's spec (a [`crate::CommandSpec`], encoded), at most [`MAX_INLINE_SPEC`].
    Command { spec: Vec<u8> },
    /// The spec is in the fourth descriptor.
    CommandInMemfd,
    /// The command with a new `cols`×`rows` pseudo-terminal as its stdio, made by the spare
    /// from the sandbox's own `/dev/ptmx`; its master goes back as [`FromSpare::Pty`].
    TtyCommand { cols: u16, rows: u16, spec: Vec<u8> },
    /// The same, the spec in the one descriptor that comes with it.
    TtyCommandInMemfd { cols: u16, rows: u16 },
}

/// Spare → service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromSpare {
    Hello,
    /// The master of the command's pseudo-terminal comes with it.
    Pty,
    Failed {
        reason: String,
    },
}

fn with_reason(kind: u8, slot: Option<u64>, reason: &str) -> Vec<u8> {
    let mut out = vec![kind];
    if let Some(slot) = slot {
        out.extend_from_slice(&slot.to_le_bytes());
    }
    let room = MAX_MESSAGE - out.len();
    let mut end = reason.len().min(room);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    out.extend_from_slice(&reason.as_bytes()[..end]);
    out
}

fn slot_at(bytes: &[u8]) -> Result<u64, String> {
    let b: [u8; 8] = bytes
        .get(1..9)
        .and_then(|b| b.try_into().ok())
        .ok_or("a message too short for its slot")?;
    Ok(u64::from_le_bytes(b))
}

fn text_from(bytes: &[u8], at: usize) -> String {
    String::from_utf8_lossy(bytes.get(at..).unwrap_or_default()).into_owned()
}

impl ToAgent {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            ToAgent::Prepare { slot } => {
                let mut out = vec![b'P'];
                out.extend_from_slice(&slot.to_le_bytes());
                out
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        match bytes.first() {
            Some(b'P') if bytes.len() == 9 => Ok(ToAgent::Prepare {
                slot: slot_at(bytes)?,
            }),
            _ => Err(format!(
                "an unknown message to the agent ({} bytes)",
                bytes.len()
            )),
        }
    }
}

impl FromAgent {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            FromAgent::Ready => vec![b'R'],
            FromAgent::SetupFailed { reason } => with_reason(b'E', None, reason),
            FromAgent::PrepareFailed { slot, reason } => with_reason(b'F', Some(*slot), reason),
            FromAgent::Exited { slot, status } => {
                let mut out = vec![b'X'];
                out.extend_from_slice(&slot.to_le_bytes());
                out.extend_from_slice(&status.to_le_bytes());
                out
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        match bytes.first() {
            Some(b'R') if bytes.len() == 1 => Ok(FromAgent::Ready),
            Some(b'E') => Ok(FromAgent::SetupFailed {
                reason: text_from(bytes, 1),
            }),
            Some(b'F') if bytes.len() >= 9 => Ok(FromAgent::PrepareFailed {
                slot: slot_at(bytes)?,
                reason: text_from(bytes, 9),
            }),
            Some(b'X') if bytes.len() == 13 => {
                let status: [u8; 4] = bytes
                    .get(9..13)
                    .and_then(|b| b.try_into().ok())
                    .ok_or("a short exit message")?;
                Ok(FromAgent::Exited {
                    slot: slot_at(bytes)?,
                    status: i32::from_le_bytes(status),
                })
            }
            _ => Err(format!(
                "an unknown message from the agent ({} bytes)",
                bytes.len()
            )),
        }
    }
}

impl ToSpare {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            ToSpare::Command { spec } => {
                let mut out = Vec::with_capacity(spec.len() + 1);
                out.push(b'C');
                out.extend_from_slice(spec);
                out
            }
            ToSpare::CommandInMemfd => vec![b'M'],
            ToSpare::TtyCommand { cols, rows, spec } => {
                let mut out = Vec::with_capacity(spec.len() + 5);
                out.push(b'T');
                out.extend_from_slice(&cols.to_le_bytes());
                out.extend_from_slice(&rows.to_le_bytes());
                out.extend_from_slice(spec);
                out
            }
            ToSpare::TtyCommandInMemfd { cols, rows } => {
                let mut out = vec![b'U'];
                out.extend_from_slice(&cols.to_le_bytes());
                out.extend_from_slice(&rows.to_le_bytes());
                out
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        match bytes.split_first() {
            Some((b'C', spec)) if !spec.is_empty() && spec.len() <= MAX_INLINE_SPEC => {
                Ok(ToSpare::Command {
                    spec: spec.to_vec(),
                })
            }
            Some((b'M', [])) => Ok(ToSpare::CommandInMemfd),
            Some((b'T', [c0, c1, r0, r1, spec @ ..]))
                if !spec.is_empty() && spec.len() <= MAX_INLINE_SPEC =>
            {
                Ok(ToSpare::TtyCommand {
                    cols: u16::from_le_bytes([*c0, *c1]),
                    rows: u16::from_le_bytes([*r0, *r1]),
                    spec: spec.to_vec(),
                })
            }
            Some((b'U', [c0, c1, r0, r1])) => Ok(ToSpare::TtyCommandInMemfd {
                cols: u16::from_le_bytes([*c0, *c1]),
                rows: u16::from_le_bytes([*r0, *r1]),
            }),
            _ => Err(format!(
                "an unknown message to a spare ({} bytes)",
                bytes.len()
            )),
        }
    }

    /// Descriptors that come with it.
    pub fn fds(&self) -> usize {
        match self {
            ToSpare::Command { .. } => 3,
            ToSpare::CommandInMemfd => 4,
            ToSpare::TtyCommand { .. } => 0,
            ToSpare::TtyCommandInMemfd { .. } => 1,
        }
    }

    /// The pseudo-terminal's size, for a command that gets one.
    pub fn tty(&self) -> Option<(u16, u16)> {
        match self {
            ToSpare::TtyCommand { cols, rows, .. } | ToSpare::TtyCommandInMemfd { cols, rows } => {
                Some((*cols, *rows))
            }
            _ => None,
        }
    }
}

impl FromSpare {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            FromSpare::Hello => vec![b'H'],
            FromSpare::Pty => vec![b'P'],
            FromSpare::Failed { reason } => with_reason(b'E', None, reason),
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        match bytes.first() {
            Some(b'H') if bytes.len() == 1 => Ok(FromSpare::Hello),
            Some(b'P') if bytes.len() == 1 => Ok(FromSpare::Pty),
            Some(b'E') => Ok(FromSpare::Failed {
                reason: text_from(bytes, 1),
            }),
            _ => Err(format!(
                "an unknown message from a spare ({} bytes)",
                bytes.len()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_message_survives_encoding() {
        for m in [
            FromAgent::Ready,
            FromAgent::SetupFailed {
                reason: "mount /tmp: EPERM".into(),
            },
            FromAgent::PrepareFailed {
                slot: 7,
                reason: "fork: EAGAIN".into(),
            },
            FromAgent::Exited {
                slot: u64::MAX,
                status: -9,
            },
        ] {
            assert_eq!(FromAgent::decode(&m.encode()).unwrap(), m);
        }
        let p = ToAgent::Prepare { slot: 1 << 40 };
        assert_eq!(ToAgent::decode(&p.encode()).unwrap(), p);
        assert_eq!(
            ToSpare::decode(&ToSpare::CommandInMemfd.encode()).unwrap(),
            ToSpare::CommandInMemfd
        );
        let inline = ToSpare::Command {
            spec: b"arg=/bin/true\0".to_vec(),
        };
        assert_eq!(ToSpare::decode(&inline.encode()).unwrap(), inline);
        for m in [
            ToSpare::TtyCommand {
                cols: 80,
                rows: 24,
                spec: b"arg=/bin/bash\0".to_vec(),
            },
            ToSpare::TtyCommandInMemfd {
                cols: 300,
                rows: 1000,
            },
        ] {
            assert_eq!(ToSpare::decode(&m.encode()).unwrap(), m);
            assert_eq!(m.fds() == 0, matches!(m, ToSpare::TtyCommand { .. }));
        }
        for m in [
            FromSpare::Hello,
            FromSpare::Pty,
            FromSpare::Failed {
                reason: "chdir /workspace/x: ENOENT".into(),
            },
        ] {
            assert_eq!(FromSpare::decode(&m.encode()).unwrap(), m);
        }
    }

    #[test]
    fn malformed_messages_are_refused_not_guessed() {
        for bad in [&b""[..], b"R1", b"X123", b"Q", b"X\0\0\0\0\0\0\0\0\0\0\0"] {
            assert!(FromAgent::decode(bad).is_err(), "{bad:?}");
        }
        for bad in [&b""[..], b"P", b"P12345678x", b"C"] {
            assert!(ToAgent::decode(bad).is_err(), "{bad:?}");
        }
        for bad in [&b""[..], b"H1", b"C"] {
            assert!(FromSpare::decode(bad).is_err(), "{bad:?}");
        }
        let mut too_long = vec![b'C'];
        too_long.resize(MAX_INLINE_SPEC + 2, b'x');
        for bad in [
            &b""[..],
            b"C",
            b"MM",
            b"X",
            b"T\x50\0\x18\0",
            b"U\x50\0\x18",
            &too_long,
        ] {
            assert!(ToSpare::decode(bad).is_err(), "{} bytes", bad.len());
        }
    }

    #[test]
    fn a_long_reason_is_cut_to_the_message_size_on_a_character_boundary() {
        let reason = "é".repeat(MAX_MESSAGE);
        let bytes = FromAgent::PrepareFailed { slot: 1, reason }.encode();
        assert!(bytes.len() <= MAX_MESSAGE);
        let FromAgent::PrepareFailed { reason, .. } = FromAgent::decode(&bytes).unwrap() else {
            panic!("wrong kind")
        };
        assert!(reason.chars().all(|c| c == 'é'));
    }
}
