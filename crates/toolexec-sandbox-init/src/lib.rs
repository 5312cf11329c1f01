//! `toolexec-sandbox-init`: started by the service as the unprivileged sandbox user, with no
//! arguments and an empty environment, it reads what to run from the descriptors the service
//! passed ([`spec`]), makes the namespaces and the filesystem view (see `namespaces`), then, in
//! the command's process, adds the second layers in this order and `exec`s the command with the
//! command's environment:
//!
//! 1. rlimits (CPU seconds, file size, open files, no core dumps; address space where no memory
//!    cgroup limits the session);
//! 2. `PR_SET_NO_NEW_PRIVS`;
//! 3. a Landlock domain: read and execute everywhere, write only beneath `/workspace`, `/tmp`
//!    and `/dev/shm` (and the device nodes of the private `/dev`), no abstract UNIX sockets or signals to
//!    processes outside the domain;
//! 4. a seccomp filter refusing what builds and tests never need (see [`denied_syscalls`]).
//!
//! The service runs a **statically linked** build of this crate (toolexec-sandbox's build script
//! makes it and embeds it): no dynamic loader runs before `main`, so no loader variable and no
//! library planted anywhere can run code in this process while it is still outside the sandbox.
//!
//! Any failure exits with [`SETUP_FAILED`] and a line on stderr starting with [`ERROR_PREFIX`]:
//! the command is never run with a layer missing. Just before `exec` it writes one byte to the
//! status descriptor the service passed down, so the service can tell "the sandbox failed to
//! start" from "the command failed".
#![allow(unsafe_code)]

mod agent;
mod namespaces;
pub mod protocol;
mod pty;
pub mod spec;

pub use spec::{CommandSpec, InitLimits, ROOT_FD, SPEC_FD, STATUS_FD, Spec};

use std::collections::BTreeMap;
use std::ffi::CString;

use spec::MAX_SPEC_BYTES;

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, Scope, path_beneath_rules,
};
use seccompiler::{
    SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    TargetArch,
};

/// Exit status of the init when a layer could not be applied.
pub const SETUP_FAILED: i32 = 125;
/// Start of the init's error line on stderr.
pub const ERROR_PREFIX: &str = "toolexec-sandbox-init:";
/// Port of the egress relay inside a sandbox whose session may use the network
/// (`HTTP_PROXY=http://127.0.0.1:3128`).
pub const PROXY_PORT: u16 = 3128;
/// Where the session's egress proxy socket is bound inside the sandbox.
pub const SOCKET_IN_SANDBOX: &str = "/.toolexec-egress.sock";

/// Entry point of the `toolexec-sandbox-init` binary. Must run in a single-threaded process,
/// with the descriptors of [`spec`].
pub fn main() -> ! {
    match run() {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("{ERROR_PREFIX} {e}");
            std::process::exit(SETUP_FAILED)
        }
    }
}

enum Never {}

/// Closes every descriptor from `first` up: whatever the service itself inherited without
/// close-on-exec (a supervisor's pipe, a socket-activation socket, a shell redirection) must not
/// reach the command, and Landlock does not restrict descriptors already open.
fn close_from(first: libc::c_uint) -> Result<(), String> {
    // SAFETY: close_range takes integers only.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0) };
    if rc < 0 {
        return Err(format!("close_range: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn run() -> Result<Never, String> {
    // Keep stdin, stdout, stderr and the descriptors of the protocol only.
    close_from(ROOT_FD as libc::c_uint + 1)?;
    let spec = read_spec()?;
    if spec.agent {
        return agent::run(&spec);
    }
    namespaces::enter(&spec)?;
    namespaces::fork_command()?;
    apply_rlimits(&spec.limits)?;
    no_new_privs()?;
    landlock_domain()?;
    seccomp_filter()?;
    exec(spec.argv, spec.env)
}

/// Reads and closes [`SPEC_FD`].
fn read_spec() -> Result<Spec, String> {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    // SAFETY: the service passed SPEC_FD for this process alone; nothing else owns it.
    let file = unsafe { std::fs::File::from_raw_fd(SPEC_FD) };
    let mut bytes = Vec::new();
    file.take(MAX_SPEC_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("reading the spec (fd {SPEC_FD}): {e}"))?;
    if bytes.len() > MAX_SPEC_BYTES {
        return Err(format!("the spec is larger than {MAX_SPEC_BYTES} bytes"));
    }
    Spec::decode(&bytes)
}

fn apply_rlimits(limits: &InitLimits) -> Result<(), String> {
    let set = |resource, value: u64, name: &str| -> Result<(), String> {
        if value == 0 {
            return Ok(());
        }
        // Never above the limit the init inherited: an unprivileged process cannot raise a hard
        // limit, and a service started with a lower one (a container's, say) must still run
        // commands — under the lower limit, which is tighter, never looser.
        let mut current = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes a valid rlimit struct.
        if unsafe { libc::getrlimit(resource, &mut current) } != 0 {
            return Err(format!(
                "getrlimit {name}: {}",
                std::io::Error::last_os_error()
            ));
        }
        let value = value.min(current.rlim_max);
        let lim = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        // SAFETY: setrlimit reads a valid rlimit struct.
        let rc = unsafe { libc::setrlimit(resource, &lim) };
        if rc != 0 {
            return Err(format!(
                "setrlimit {name}: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    };
    set(libc::RLIMIT_CPU, limits.cpu_seconds, "CPU")?;
    set(libc::RLIMIT_FSIZE, limits.file_size_bytes, "FSIZE")?;
    set(libc::RLIMIT_NOFILE, limits.open_files, "NOFILE")?;
    set(libc::RLIMIT_AS, limits.address_space_bytes, "AS")?;
    let core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: as above.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_CORE, &core) };
    if rc != 0 {
        return Err(format!(
            "setrlimit CORE: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn no_new_privs() -> Result<(), String> {
    rustix::thread::set_no_new_privs(true).map_err(|e| format!("PR_SET_NO_NEW_PRIVS: {e}"))
}

/// Write access is granted beneath these; everything else is read and execute only.
const WRITABLE: [&str; 3] = ["/workspace", "/tmp", "/dev/shm"];

fn landlock_domain() -> Result<(), String> {
    // ABI 5 covers every filesystem right this kernel family knows (incl. truncate and device
    // ioctls); ABI 6 adds the scopes. Newer kernels keep these semantics.
    let abi = ABI::V5;
    let fail = |e: landlock::RulesetError| format!("landlock: {e}");
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(fail)?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(fail)?
        .create()
        .map_err(fail)?
        .add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi)))
        .map_err(fail)?
        .add_rules(path_beneath_rules(WRITABLE, AccessFs::from_all(abi)))
        .map_err(fail)?
        .add_rules(path_beneath_rules(
            ["/dev"],
            AccessFs::from_read(abi) | AccessFs::WriteFile | AccessFs::IoctlDev,
        ))
        .map_err(fail)?
        .restrict_self()
        .map_err(fail)?;
    match status.ruleset {
        RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => Ok(()),
        RulesetStatus::NotEnforced => Err(
            "landlock: not enforced by this kernel (Linux 5.13+ with landlock in the LSM list is required)"
                .into(),
        ),
    }
}

/// Syscalls refused with `EPERM` inside the sandbox: tracing other processes, kernel attack
/// surface builds never use, mount and namespace changes, keyrings (not namespaced), module and
/// machine control.
pub fn denied_syscalls() -> Vec<(&'static str, i64)> {
    vec![
        ("ptrace", libc::SYS_ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv),
        ("process_vm_writev", libc::SYS_process_vm_writev),
        // A command runs as the same uid as a session's resident agent: comparing or taking
        // its descriptors, or getting a handle on it, is refused (it is not dumpable either).
        ("kcmp", libc::SYS_kcmp),
        ("pidfd_getfd", libc::SYS_pidfd_getfd),
        ("pidfd_open", libc::SYS_pidfd_open),
        ("bpf", libc::SYS_bpf),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("io_uring_enter", libc::SYS_io_uring_enter),
        ("io_uring_register", libc::SYS_io_uring_register),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("pivot_root", libc::SYS_pivot_root),
        ("chroot", libc::SYS_chroot),
        ("move_mount", libc::SYS_move_mount),
        ("open_tree", libc::SYS_open_tree),
        ("fsopen", libc::SYS_fsopen),
        ("fsconfig", libc::SYS_fsconfig),
        ("fsmount", libc::SYS_fsmount),
        ("fspick", libc::SYS_fspick),
        ("mount_setattr", libc::SYS_mount_setattr),
        ("unshare", libc::SYS_unshare),
        ("setns", libc::SYS_setns),
        ("kexec_load", libc::SYS_kexec_load),
        ("kexec_file_load", libc::SYS_kexec_file_load),
        ("init_module", libc::SYS_init_module),
        ("finit_module", libc::SYS_finit_module),
        ("delete_module", libc::SYS_delete_module),
        ("reboot", libc::SYS_reboot),
        ("swapon", libc::SYS_swapon),
        ("swapoff", libc::SYS_swapoff),
        ("acct", libc::SYS_acct),
        ("syslog", libc::SYS_syslog),
        ("name_to_handle_at", libc::SYS_name_to_handle_at),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("quotactl", libc::SYS_quotactl),
        ("lookup_dcookie", libc::SYS_lookup_dcookie),
        ("vhangup", libc::SYS_vhangup),
    ]
}

/// Namespace flags `clone` may not carry (a new user namespace would be a kernel attack surface
/// with fresh capabilities; the others are not needed inside a sandbox that already has them).
const CLONE_NS_FLAGS: [u64; 7] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// Socket families allowed: UNIX, IPv4, IPv6 (no network exists unless granted) and netlink
/// (`ip addr` and glibc's getaddrinfo use it). Everything else — AF_VSOCK to the VM host, AF_PACKET,
/// AF_BLUETOOTH, AF_ALG, … — is refused.
const ALLOWED_FAMILIES: [u64; 4] = [
    libc::AF_UNIX as u64,
    libc::AF_INET as u64,
    libc::AF_INET6 as u64,
    libc::AF_NETLINK as u64,
];

fn seccomp_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, String> {
    let cond = |arg: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
            .map_err(|e| format!("seccomp condition: {e}"))
    };
    let rule = |conds: Vec<SeccompCondition>| {
        SeccompRule::new(conds).map_err(|e| format!("seccomp rule: {e}"))
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, nr) in denied_syscalls() {
        rules.insert(nr, Vec::new());
    }
    // socket(domain, …) / socketpair(domain, …) with a family outside the allow-list.
    let family_rule = || -> Result<SeccompRule, String> {
        let conds = ALLOWED_FAMILIES
            .iter()
            .map(|f| cond(0, SeccompCmpOp::Ne, *f))
            .collect::<Result<Vec<_>, _>>()?;
        rule(conds)
    };
    rules.insert(libc::SYS_socket, vec![family_rule()?]);
    rules.insert(libc::SYS_socketpair, vec![family_rule()?]);
    // clone(flags, …) with any namespace flag. clone3 passes its flags in memory a filter cannot
    // read, so it is refused as a whole (ENOSYS below would be nicer; EPERM makes glibc fall back
    // to clone as well).
    let mut clone_rules = Vec::new();
    for flag in CLONE_NS_FLAGS {
        clone_rules.push(rule(vec![cond(0, SeccompCmpOp::MaskedEq(flag), flag)?])?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    // Pushing input into a terminal (TIOCSTI) or the console (TIOCLINUX): the classic way out
    // of a sandbox that shares a terminal with its parent (CVE-2017-5226). The sandbox has no
    // terminal (its own session, no /dev/tty); this is the second net.
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, SeccompCmpOp::Eq, libc::TIOCSTI)?])?,
            rule(vec![cond(1, SeccompCmpOp::Eq, libc::TIOCLINUX)?])?,
        ],
    );
    Ok(rules)
}

fn seccomp_filter() -> Result<(), String> {
    let deny = SeccompFilter::new(
        seccomp_rules()?,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::x86_64,
    )
    .map_err(|e| format!("seccomp: {e}"))?;
    // clone3 gets ENOSYS, which glibc and Go's runtime treat as "use clone instead".
    let mut clone3 = BTreeMap::new();
    clone3.insert(libc::SYS_clone3, Vec::new());
    let no_clone3 = SeccompFilter::new(
        clone3,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        TargetArch::x86_64,
    )
    .map_err(|e| format!("seccomp: {e}"))?;
    for filter in [deny, no_clone3] {
        let program: seccompiler::BpfProgram = filter
            .try_into()
            .map_err(|e: seccompiler::BackendError| format!("seccomp: {e}"))?;
        seccompiler::apply_filter(&program).map_err(|e| format!("seccomp: {e}"))?;
    }
    Ok(())
}

/// A command ready for `execve`: its arguments and environment as C strings, made before the
/// last steps so that nothing is allocated between them and the exec.
struct Prepared {
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl Prepared {
    fn new(argv: Vec<Vec<u8>>, env: Vec<(Vec<u8>, Vec<u8>)>) -> Result<Self, String> {
        let cstring = |b: Vec<u8>| CString::new(b).map_err(|_| "NUL in the command".to_string());
        let argv: Vec<CString> = argv.into_iter().map(cstring).collect::<Result<_, _>>()?;
        if argv.is_empty() {
            return Err("no command".into());
        }
        let envp: Vec<CString> = env
            .into_iter()
            .map(|(mut name, value)| {
                name.push(b'=');
                name.extend_from_slice(&value);
                cstring(name)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { argv, envp })
    }

    /// Execs the command; returns only if that failed.
    fn exec(&self) -> String {
        let mut argv_ptrs: Vec<*const libc::c_char> =
            self.argv.iter().map(|a| a.as_ptr()).collect();
        argv_ptrs.push(std::ptr::null());
        let mut env_ptrs: Vec<*const libc::c_char> = self.envp.iter().map(|e| e.as_ptr()).collect();
        env_ptrs.push(std::ptr::null());
        // The command's environment takes effect here, inside every layer, and nowhere before.
        // SAFETY: argv and envp are NULL-terminated arrays of valid C strings that outlive the
        // call.
        unsafe {
            libc::execve(self.argv[0].as_ptr(), argv_ptrs.as_ptr(), env_ptrs.as_ptr());
        }
        let err = std::io::Error::last_os_error();
        format!("exec {:?}: {err}", self.argv[0])
    }
}

/// Signals as a freshly started program expects them: none blocked, none ignored. Rust's
/// runtime ignores `SIGPIPE` in this program (the only disposition it sets that survives
/// `execve`: handlers are reset by it, ignored signals are not), and an agent blocks `SIGCHLD`;
/// a command inheriting either would behave unlike one started from a shell (`yes | head -1`
/// would never see SIGPIPE).
fn default_signals() {
    // SAFETY: sigaction and sigprocmask calls on valid, zeroed structures.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
    }
}

fn exec(argv: Vec<Vec<u8>>, env: Vec<(Vec<u8>, Vec<u8>)>) -> Result<Never, String> {
    let prepared = Prepared::new(argv, env)?;
    default_signals();
    // Tell the service the command is starting, then close the status descriptor so the command
    // does not inherit it.
    // SAFETY: writing one byte from a valid buffer.
    unsafe {
        libc::write(STATUS_FD, b"1".as_ptr().cast(), 1);
    }
    close_from(STATUS_FD as libc::c_uint)?;
    Err(prepared.exec())
}
