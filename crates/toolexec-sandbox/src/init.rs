//! `toolexec-sandbox-init`: started by the service as the unprivileged sandbox user, it makes the
//! namespaces and the filesystem view (see `namespaces`), then, in the command's process, adds
//! the second layers in this order and `exec`s the command:
//!
//! 1. rlimits (CPU seconds, file size, open files, no core dumps; address space where no memory
//!    cgroup limits the session);
//! 2. `PR_SET_NO_NEW_PRIVS`;
//! 3. a Landlock domain: read and execute everywhere, write only beneath `/workspace`, `/tmp`
//!    and `/dev/shm` (and the device nodes of the private `/dev`), no abstract UNIX sockets or signals to
//!    processes outside the domain;
//! 4. a seccomp filter refusing what builds and tests never need (see [`denied_syscalls`]).
//!
//! Any failure exits with [`SETUP_FAILED`] and a line on stderr starting with [`ERROR_PREFIX`]:
//! the command is never run with a layer missing. Just before `exec` it writes one byte to the
//! status descriptor (fd 3) the service passed down, so the service can tell "the sandbox failed
//! to start" from "the command failed".
use std::collections::BTreeMap;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStringExt;

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
/// The descriptor the service reads to learn that the command is about to start.
pub const STATUS_FD: i32 = 3;

/// Limits the init applies with `setrlimit` (0 = leave unchanged).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InitLimits {
    pub cpu_seconds: u64,
    pub file_size_bytes: u64,
    pub open_files: u64,
    /// Address space per process, set only where no memory cgroup limits the session.
    pub address_space_bytes: u64,
}

impl InitLimits {
    /// The init's command-line flags for these limits.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            format!("--cpu={}", self.cpu_seconds),
            format!("--fsize={}", self.file_size_bytes),
            format!("--nofile={}", self.open_files),
            format!("--as={}", self.address_space_bytes),
        ]
    }
}

/// The first argument the service passes, so that a binary that is more than the init (the
/// `toolexec` server itself) knows to act as the init.
pub const SUBCOMMAND: &str = "__sandbox-init";

/// Entry point of the `toolexec-sandbox-init` binary (and of `toolexec __sandbox-init`). Must
/// run in a single-threaded process.
pub fn main() -> ! {
    let args: Vec<OsString> = std::env::args_os()
        .skip(1)
        .skip_while(|a| a == SUBCOMMAND)
        .collect();
    match run(args) {
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
    #[allow(unsafe_code)]
    let rc = unsafe { libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0) };
    if rc < 0 {
        return Err(format!("close_range: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

fn run(args: Vec<OsString>) -> Result<Never, String> {
    // Keep stdin, stdout, stderr and the status descriptor only.
    close_from(STATUS_FD as libc::c_uint + 1)?;
    let mut limits = InitLimits::default();
    let mut layout = crate::namespaces::Layout::default();
    let mut rest = args.into_iter();
    let mut command: Vec<OsString> = Vec::new();
    while let Some(arg) = rest.next() {
        let s = arg.to_string_lossy().into_owned();
        if s == "--" {
            command = rest.collect();
            break;
        }
        let (flag, value) = s
            .split_once('=')
            .ok_or_else(|| format!("unexpected argument {s:?}"))?;
        match flag {
            "--workspace" => {
                layout.workspace = value.to_owned();
                continue;
            }
            "--workdir" => {
                layout.workdir = value.to_owned();
                continue;
            }
            "--ro" => {
                layout.ro.push(value.to_owned());
                continue;
            }
            "--egress-socket" => {
                layout.egress_socket = Some(value.to_owned());
                continue;
            }
            _ => {}
        }
        let value: u64 = value
            .parse()
            .map_err(|_| format!("{flag}: not a number: {value:?}"))?;
        match flag {
            "--cpu" => limits.cpu_seconds = value,
            "--fsize" => limits.file_size_bytes = value,
            "--nofile" => limits.open_files = value,
            "--as" => limits.address_space_bytes = value,
            "--tmp-size" => layout.tmp_size = value,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if command.is_empty() {
        return Err("no command after --".into());
    }
    if !layout.workspace.is_empty() {
        crate::namespaces::enter(&layout)?;
    }
    apply_rlimits(&limits)?;
    no_new_privs()?;
    landlock_domain()?;
    seccomp_filter()?;
    exec(command)
}

fn apply_rlimits(limits: &InitLimits) -> Result<(), String> {
    let set = |resource, value: u64, name: &str| -> Result<(), String> {
        if value == 0 {
            return Ok(());
        }
        let lim = libc::rlimit {
            rlim_cur: value,
            rlim_max: value,
        };
        // SAFETY: setrlimit reads a valid rlimit struct.
        #[allow(unsafe_code)]
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
    #[allow(unsafe_code)]
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
        ("kcmp", libc::SYS_kcmp),
        ("pidfd_getfd", libc::SYS_pidfd_getfd),
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

fn exec(command: Vec<OsString>) -> Result<Never, String> {
    let argv: Vec<CString> = command
        .into_iter()
        .map(|a| CString::new(a.into_vec()).map_err(|_| "NUL in command".to_string()))
        .collect::<Result<_, _>>()?;
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // Tell the service the command is starting, then close the status descriptor so the command
    // does not inherit it (a missing fd 3 is fine: the init also runs by hand for debugging).
    // SAFETY: writing one byte from a valid buffer.
    #[allow(unsafe_code)]
    unsafe {
        libc::write(STATUS_FD, b"1".as_ptr().cast(), 1);
    }
    close_from(STATUS_FD as libc::c_uint)?;
    // SAFETY: argv is a NULL-terminated array of valid C strings that outlive the call.
    #[allow(unsafe_code)]
    unsafe {
        libc::execvp(argv[0].as_ptr(), ptrs.as_ptr());
    }
    let err = std::io::Error::last_os_error();
    Err(format!("exec {:?}: {err}", argv[0]))
}
