//! How the service starts the init: no arguments and an empty environment, so nothing a session
//! controls reaches a process that runs outside the sandbox (the dynamic loader honours
//! `LD_PRELOAD` & co. in a program's environment before `main`; the init is also linked
//! statically, so there is no loader at all). What to build and what to run comes on
//! descriptors instead:
//!
//! | fd | what |
//! |---|---|
//! | 0, 1, 2 | the command's stdin, stdout, stderr |
//! | [`STATUS_FD`] | write end of a pipe: one byte just before the command's `exec` |
//! | [`SPEC_FD`] | a [`Spec`], encoded by [`Spec::encode`] (a sealed memfd) |
//! | [`ROOT_FD`] | the directory holding the workspaces; the spec names paths beneath it |
//!
//! With [`Spec::agent`] set, the init becomes a session's resident agent instead of running one
//! command: fd 3 is then the control socket of [`crate::protocol`] (not a status pipe), the spec
//! carries no command, and each command comes later as a [`CommandSpec`].
//!
//! The workspace is reached through [`ROOT_FD`], not by a host path: the sandbox user needs
//! search permission on that directory alone, not on the directories above it (a data directory
//! made with `mktemp -d` is 0700), and the command never sees a host path in `/proc/1/cmdline`.
//! The command's environment is applied only by the final `execve`, after every layer is in
//! place.

/// The descriptor the service reads to learn that the command is about to start.
pub const STATUS_FD: i32 = 3;
/// The descriptor the init reads its [`Spec`] from.
pub const SPEC_FD: i32 = 4;
/// The descriptor of the directory the spec's `workspace` and `egress_socket` are beneath.
pub const ROOT_FD: i32 = 5;

/// Largest spec the init reads: the command and the environment come from one request, which
/// the service caps far below this.
pub const MAX_SPEC_BYTES: usize = 64 * 1024 * 1024;

/// Limits the init applies with `setrlimit` (0 = leave unchanged).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InitLimits {
    pub cpu_seconds: u64,
    pub file_size_bytes: u64,
    pub open_files: u64,
    /// Address space per process, set only where no memory cgroup limits the session.
    pub address_space_bytes: u64,
}

/// Everything the init builds and runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spec {
    /// The workspace: a path beneath [`ROOT_FD`] (a session's directory name), bound read-write
    /// at `/workspace`. Never absolute, never with a `..` component.
    pub workspace: Vec<u8>,
    /// The working directory, relative to `/workspace` (empty for `/workspace` itself).
    pub workdir: Vec<u8>,
    /// Size of the private `/tmp`, bytes.
    pub tmp_size: u64,
    /// Host directories bound read-only at the same path (absolute).
    pub ro: Vec<Vec<u8>>,
    /// The session's egress proxy socket, beneath [`ROOT_FD`], when its policy allows network.
    pub egress_socket: Option<Vec<u8>>,
    pub limits: InitLimits,
    /// The command; `argv[0]` is an absolute path (no `PATH` search outside the sandbox).
    /// Empty for an agent.
    pub argv: Vec<Vec<u8>>,
    /// The command's environment, `(name, value)`.
    pub env: Vec<(Vec<u8>, Vec<u8>)>,
    /// Stay resident as the session's agent (see [`crate::protocol`]) instead of running `argv`.
    pub agent: bool,
    /// The image's unpacked tree, a path beneath [`ROOT_FD`] (the image cache is there, so
    /// that the sandbox user reaches it as it reaches a workspace): the root is made of its
    /// top-level entries, bound read-only, instead of the host's `/usr` and `/etc`.
    pub image: Option<Vec<u8>>,
}

/// One command for a resident agent's spare: what the per-command spec of the init was, minus
/// everything the session's sandbox already fixed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandSpec {
    /// Relative to `/workspace` (empty for `/workspace` itself).
    pub workdir: Vec<u8>,
    /// `argv[0]` is an absolute path.
    pub argv: Vec<Vec<u8>>,
    pub env: Vec<(Vec<u8>, Vec<u8>)>,
}

/// `name=value` records, each ended by a NUL.
#[derive(Default)]
struct Records(Vec<u8>);

impl Records {
    /// Fails on a NUL inside a value (the kernel could not pass it on either).
    fn put(&mut self, name: &str, value: &[u8]) -> Result<(), String> {
        if value.contains(&0) {
            return Err(format!("{name}: contains a NUL byte"));
        }
        self.0.extend_from_slice(name.as_bytes());
        self.0.push(b'=');
        self.0.extend_from_slice(value);
        self.0.push(0);
        Ok(())
    }

    /// Fails on an empty name or an `=` in an environment variable's name.
    fn put_env(&mut self, env: &[(Vec<u8>, Vec<u8>)]) -> Result<(), String> {
        for (name, value) in env {
            if name.is_empty() || name.contains(&b'=') {
                return Err(format!(
                    "environment variable name {:?} is empty or contains '='",
                    String::from_utf8_lossy(name)
                ));
            }
            let mut pair = name.clone();
            pair.push(b'=');
            pair.extend_from_slice(value);
            self.put("env", &pair)?;
        }
        Ok(())
    }
}

/// Splits encoded records into `(name, value)`.
fn records(bytes: &[u8]) -> Result<Vec<(&str, &[u8])>, String> {
    let body = bytes
        .strip_suffix(&[0])
        .ok_or("the spec does not end with a NUL")?;
    body.split(|b| *b == 0)
        .map(|record| {
            let eq = record
                .iter()
                .position(|b| *b == b'=')
                .ok_or("a spec record without '='")?;
            let name = std::str::from_utf8(&record[..eq])
                .map_err(|_| "a spec record name is not UTF-8")?;
            Ok((name, &record[eq + 1..]))
        })
        .collect()
}

fn env_record(value: &[u8]) -> Result<(Vec<u8>, Vec<u8>), String> {
    let eq = value
        .iter()
        .position(|b| *b == b'=')
        .filter(|at| *at > 0)
        .ok_or("an env record without a name")?;
    Ok((value[..eq].to_vec(), value[eq + 1..].to_vec()))
}

/// A path relative to some directory, without `..` or empty components.
fn check_beneath(what: &str, p: &[u8]) -> Result<(), String> {
    if p.is_empty()
        || p.starts_with(b"/")
        || p.split(|b| *b == b'/').any(|c| c == b".." || c.is_empty())
    {
        return Err(format!(
            "{what} {:?} is not a plain path beneath the workspace root",
            String::from_utf8_lossy(p)
        ));
    }
    Ok(())
}

fn check_command(argv: &[Vec<u8>]) -> Result<(), String> {
    match argv.first() {
        None => Err("no command".into()),
        Some(a) if !a.starts_with(b"/") => Err(format!(
            "the command {:?} is not an absolute path",
            String::from_utf8_lossy(a)
        )),
        Some(_) => Ok(()),
    }
}

impl CommandSpec {
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = Records::default();
        out.put("workdir", &self.workdir)?;
        for arg in &self.argv {
            out.put("arg", arg)?;
        }
        out.put_env(&self.env)?;
        Ok(out.0)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut spec = CommandSpec::default();
        for (name, value) in records(bytes)? {
            match name {
                "workdir" => spec.workdir = value.to_vec(),
                "arg" => spec.argv.push(value.to_vec()),
                "env" => spec.env.push(env_record(value)?),
                other => return Err(format!("unknown command record {other:?}")),
            }
        }
        if !spec.workdir.is_empty() {
            check_beneath("workdir", &spec.workdir)?;
        }
        check_command(&spec.argv)?;
        Ok(spec)
    }
}

impl Spec {
    /// `name=value` records, each ended by a NUL. Fails on a NUL inside a value (the kernel
    /// could not pass it on either) or an `=` in an environment variable's name.
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = Records::default();
        out.put("workspace", &self.workspace)?;
        out.put("workdir", &self.workdir)?;
        out.put("tmp", self.tmp_size.to_string().as_bytes())?;
        for dir in &self.ro {
            out.put("ro", dir)?;
        }
        if let Some(sock) = &self.egress_socket {
            out.put("egress", sock)?;
        }
        let l = &self.limits;
        out.put("cpu", l.cpu_seconds.to_string().as_bytes())?;
        out.put("fsize", l.file_size_bytes.to_string().as_bytes())?;
        out.put("nofile", l.open_files.to_string().as_bytes())?;
        out.put("as", l.address_space_bytes.to_string().as_bytes())?;
        if self.agent {
            out.put("agent", b"1")?;
        }
        if let Some(image) = &self.image {
            out.put("image", image)?;
        }
        for arg in &self.argv {
            out.put("arg", arg)?;
        }
        out.put_env(&self.env)?;
        Ok(out.0)
    }

    /// The inverse of [`Spec::encode`], checking what the init relies on.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let mut spec = Spec::default();
        let number = |name: &str, v: &[u8]| -> Result<u64, String> {
            std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("{name}: not a number"))
        };
        for (name, value) in records(bytes)? {
            match name {
                "workspace" => spec.workspace = value.to_vec(),
                "workdir" => spec.workdir = value.to_vec(),
                "tmp" => spec.tmp_size = number(name, value)?,
                "ro" => spec.ro.push(value.to_vec()),
                "egress" => spec.egress_socket = Some(value.to_vec()),
                "cpu" => spec.limits.cpu_seconds = number(name, value)?,
                "fsize" => spec.limits.file_size_bytes = number(name, value)?,
                "nofile" => spec.limits.open_files = number(name, value)?,
                "as" => spec.limits.address_space_bytes = number(name, value)?,
                "agent" if value == b"1" => spec.agent = true,
                "image" => spec.image = Some(value.to_vec()),
                "arg" => spec.argv.push(value.to_vec()),
                "env" => spec.env.push(env_record(value)?),
                other => return Err(format!("unknown spec record {other:?}")),
            }
        }
        spec.check()?;
        Ok(spec)
    }

    fn check(&self) -> Result<(), String> {
        check_beneath("workspace", &self.workspace)?;
        if let Some(sock) = &self.egress_socket {
            check_beneath("egress socket", sock)?;
        }
        if let Some(image) = &self.image {
            check_beneath("image", image)?;
        }
        if !self.workdir.is_empty() {
            check_beneath("workdir", &self.workdir)?;
        }
        if let Some(dir) = self.ro.iter().find(|d| !d.starts_with(b"/")) {
            return Err(format!(
                "read-only bind {:?} is not absolute",
                String::from_utf8_lossy(dir)
            ));
        }
        if self.agent {
            // An agent's commands come one by one, each with its own environment.
            if !self.argv.is_empty() || !self.env.is_empty() {
                return Err("an agent's spec carries no command".into());
            }
            return Ok(());
        }
        check_command(&self.argv)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sample() -> Spec {
        Spec {
            workspace: b"0199-abc".to_vec(),
            workdir: b"src/app".to_vec(),
            tmp_size: 1 << 20,
            ro: vec![b"/etc".to_vec(), b"/opt/tools".to_vec()],
            egress_socket: Some(b".egress/0199-abc.sock".to_vec()),
            limits: InitLimits {
                cpu_seconds: 600,
                file_size_bytes: 1 << 30,
                open_files: 1024,
                address_space_bytes: 0,
            },
            argv: vec![
                b"/bin/bash".to_vec(),
                b"-c".to_vec(),
                b"echo 'a=b' \xff".to_vec(),
            ],
            env: vec![
                (b"PATH".to_vec(), b"/usr/bin:/bin".to_vec()),
                (b"EMPTY".to_vec(), Vec::new()),
                (b"EQ".to_vec(), b"x=y=z".to_vec()),
            ],
            agent: false,
            image: Some(b".images/sha256/0123/rootfs".to_vec()),
        }
    }

    #[test]
    fn a_spec_survives_encoding_byte_for_byte() {
        let spec = sample();
        assert_eq!(Spec::decode(&spec.encode().unwrap()).unwrap(), spec);
    }

    #[test]
    fn a_nul_in_any_value_cannot_be_encoded() {
        let mut spec = sample();
        spec.argv.push(b"a\0b".to_vec());
        assert!(spec.encode().is_err());
        let mut spec = sample();
        spec.env.push((b"K".to_vec(), b"v\0".to_vec()));
        assert!(spec.encode().is_err());
        let mut spec = sample();
        spec.env.push((b"K=J".to_vec(), b"v".to_vec()));
        assert!(spec.encode().is_err());
    }

    #[test]
    fn paths_that_leave_the_workspace_root_are_refused() {
        for bad in [&b"/work/ws"[..], b"../other", b"a/../../b", b"", b"a//b"] {
            let spec = Spec {
                workspace: bad.to_vec(),
                ..sample()
            };
            assert!(
                Spec::decode(&spec.encode().unwrap()).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let relative_command = Spec {
            argv: vec![b"bash".to_vec()],
            ..sample()
        };
        assert!(Spec::decode(&relative_command.encode().unwrap()).is_err());
    }

    #[test]
    fn unknown_or_malformed_records_are_refused() {
        assert!(Spec::decode(b"frobnicate=1\0").is_err());
        assert!(Spec::decode(b"workspace=a").is_err());
        assert!(Spec::decode(b"noequals\0").is_err());
        assert!(Spec::decode(b"cpu=many\0").is_err());
    }

    #[test]
    fn an_agent_spec_carries_no_command_and_a_command_spec_no_layout() {
        let agent = Spec {
            argv: Vec::new(),
            env: Vec::new(),
            agent: true,
            ..sample()
        };
        assert_eq!(Spec::decode(&agent.encode().unwrap()).unwrap(), agent);
        let with_command = Spec {
            agent: true,
            ..sample()
        };
        assert!(Spec::decode(&with_command.encode().unwrap()).is_err());
        let cmd = CommandSpec {
            workdir: b"src".to_vec(),
            argv: sample().argv,
            env: sample().env,
        };
        assert_eq!(CommandSpec::decode(&cmd.encode().unwrap()).unwrap(), cmd);
        for bad in [
            CommandSpec {
                workdir: b"../x".to_vec(),
                ..cmd.clone()
            },
            CommandSpec {
                argv: vec![b"bash".to_vec()],
                ..cmd
            },
        ] {
            assert!(
                CommandSpec::decode(&bad.encode().unwrap()).is_err(),
                "{bad:?}"
            );
        }
        assert!(CommandSpec::decode(b"workspace=x\0arg=/bin/true\0").is_err());
    }
}
