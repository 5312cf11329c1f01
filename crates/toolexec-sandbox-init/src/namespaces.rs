//! The namespaces and the filesystem view of a sandboxed command, built by the init itself (the
//! same kernel steps bubblewrap takes, without its extra exec):
//!
//! ```text
//! outer init (host PID namespace, the sandbox uid, no capabilities on the host)
//!   unshare(user, mount, pid, net, ipc, uts, cgroup); map its uid/gid 1:1; fork
//!   └─ pid 1 (full capabilities, but only over the new namespaces)
//!        private mounts; a tmpfs root with read-only binds of /usr and the configured
//!        directories, the workspace read-write at /workspace, a size-capped /tmp, a new /proc,
//!        a minimal /dev; pivot_root, old root detached; root made read-only; hostname; lo up;
//!        drops every capability and becomes undumpable, then forks
//!        └─ the command: rlimits, no_new_privs, Landlock, seccomp, exec /bin/bash -c …
//! ```
//!
//! pid 1 reaps orphans and exits with the command's status; its exit ends the PID namespace, so
//! everything the command left running is killed by the kernel. The outer init exits with the
//! same status; the service kills it (and the cgroup) on timeouts, and pid 1 has
//! `PDEATHSIG=SIGKILL` on it.
//!
//! Everything here runs in a small single-threaded program (the init), so `fork` and raw system
//! calls are safe to use; sources are opened (O_PATH) before the first mount so that a
//! workspace under `/tmp` stays reachable once `/tmp` is covered.
//!
//! The workspace and the egress socket are found beneath the directory the service passed as
//! [`ROOT_FD`], never by a host path: the init changes into it before `unshare` (which carries
//! the working directory over into the new mount namespace, where a bind needs its source) and
//! opens them relative to it, so only search permission on that one directory is needed.
use std::ffi::CString;
use std::io;

use crate::spec::{ROOT_FD, Spec};

fn cstr(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("NUL in {s:?}"))
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

fn check(rc: libc::c_long, what: &str) -> Result<(), String> {
    if rc < 0 { Err(os_err(what)) } else { Ok(()) }
}

fn write_proc(path: &str, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("writing {path}: {e}"))
}

/// An O_PATH descriptor of a source, and its `/proc/self/fd/N` name for mount(2).
struct Source {
    fd: libc::c_int,
    name: CString,
}

fn open_source(path: &str) -> Result<Source, String> {
    open_source_bytes(path.as_bytes())
}

fn open_source_bytes(path: &[u8]) -> Result<Source, String> {
    let shown = String::from_utf8_lossy(path);
    let c = CString::new(path).map_err(|_| format!("NUL in {shown:?}"))?;
    // SAFETY: a valid C string; the descriptor is ours.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(os_err(&format!("opening {shown}")));
    }
    Ok(Source {
        fd,
        name: cstr(&format!("/proc/self/fd/{fd}"))?,
    })
}

impl Drop for Source {
    fn drop(&mut self) {
        // SAFETY: closing our own descriptor.
        unsafe { libc::close(self.fd) };
    }
}

fn mount(
    source: Option<&CString>,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), String> {
    let t = cstr(target)?;
    let f = fstype.map(cstr).transpose()?;
    let d = data.map(cstr).transpose()?;
    // SAFETY: every pointer is a valid C string or null.
    let rc = unsafe {
        libc::mount(
            source.map_or(std::ptr::null(), |s| s.as_ptr()),
            t.as_ptr(),
            f.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            d.as_ref()
                .map_or(std::ptr::null(), |s| s.as_ptr().cast::<libc::c_void>()),
        )
    };
    check(rc.into(), &format!("mount {target}"))
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const AT_RECURSIVE: libc::c_uint = 0x8000;

/// Sets attributes on a mount and every mount beneath it.
fn set_attrs(target: &str, attrs: u64) -> Result<(), String> {
    let t = cstr(target)?;
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: valid path and attribute struct of the size passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            t.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(rc, &format!("mount_setattr {target}"))
}

fn mkdir(path: &str, mode: libc::mode_t) -> Result<(), String> {
    let c = cstr(path)?;
    // SAFETY: valid C string.
    let rc = unsafe { libc::mkdir(c.as_ptr(), mode) };
    if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
        return Err(os_err(&format!("mkdir {path}")));
    }
    Ok(())
}

/// Creates every missing directory of `path` (below the new root).
fn mkdirs(path: &str) -> Result<(), String> {
    let mut at = String::new();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        at.push('/');
        at.push_str(part);
        mkdir(&at, 0o755)?;
    }
    Ok(())
}

fn touch(path: &str) -> Result<(), String> {
    let c = cstr(path)?;
    // SAFETY: valid C string; the descriptor is closed at once.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_WRONLY | libc::O_CLOEXEC,
            0o644,
        )
    };
    if fd < 0 {
        return Err(os_err(&format!("creating {path}")));
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    Ok(())
}

fn symlink(target: &str, link: &str) -> Result<(), String> {
    let (t, l) = (cstr(target)?, cstr(link)?);
    // SAFETY: valid C strings.
    let rc = unsafe { libc::symlink(t.as_ptr(), l.as_ptr()) };
    check(rc.into(), &format!("symlink {link}"))
}

/// Enters new namespaces and forks pid 1, which builds the filesystem and returns (in pid 1,
/// without capabilities, not dumpable). The outer process never returns: it waits for pid 1 and
/// exits with its status. The caller then either forks the one command ([`fork_command`]) or
/// stays resident as the session's agent.
pub fn enter(layout: &Spec) -> Result<(), String> {
    // SAFETY: plain getters.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP;
    // Into the workspace root first: unshare moves the working directory into the new mount
    // namespace, so what is opened relative to it there can be bound.
    // SAFETY: fchdir takes a descriptor number; ROOT_FD was passed by the service.
    check(
        unsafe { libc::fchdir(ROOT_FD) }.into(),
        "entering the workspace root (fd 5; the sandbox user needs search permission on it)",
    )?;
    // SAFETY: unshare takes flags only.
    check(unsafe { libc::unshare(flags) }.into(), "unshare")?;
    write_proc("/proc/self/setgroups", "deny")?;
    write_proc("/proc/self/uid_map", &format!("{uid} {uid} 1"))?;
    write_proc("/proc/self/gid_map", &format!("{gid} {gid} 1"))?;

    // The first child is pid 1 of the new PID namespace.
    wait_in_parent("pid 1")?;
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };

    // Sources before the first mount (once /tmp is covered, a workspace below it is out of
    // reach by path), and after unshare (a bind needs a source in this mount namespace).
    let workspace = open_source_bytes(&layout.workspace)?;
    // In an image, its tree stands for the host's system directories: neither /usr nor the
    // read-only binds of /usr and /etc are taken from the host.
    let image = layout.image.as_deref().map(image_entries).transpose()?;
    let usr = if image.is_none() {
        Some(open_source("/usr")?)
    } else {
        None
    };
    let ro: Vec<(String, Source)> = layout
        .ro
        .iter()
        .filter(|p| image.is_none() || !is_system_dir(p))
        .map(|p| {
            let p = String::from_utf8(p.clone()).map_err(|_| "a read-only bind is not UTF-8")?;
            open_source(&p).map(|s| (p, s))
        })
        .collect::<Result<_, _>>()?;
    // /dev/tty is a command's own controlling terminal, if it has one: only a `tty: true`
    // terminal's, made in the sandbox's own devpts instance; never one shared with the service
    // (TIOCSTI is refused anyway). Without one, opening it fails (ENXIO).
    const DEVICES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];
    let devices: Vec<(&str, Source)> = DEVICES
        .iter()
        .filter_map(|d| open_source(&format!("/dev/{d}")).ok().map(|s| (*d, s)))
        .collect();
    let host_links: &[&str] = if image.is_none() {
        &["bin", "lib", "lib64", "sbin"]
    } else {
        &[]
    };
    let links: Vec<(String, String)> = host_links
        .iter()
        .filter_map(|name| {
            std::fs::read_link(format!("/{name}"))
                .ok()
                .map(|t| (name.to_string(), t.to_string_lossy().into_owned()))
        })
        .collect();

    let egress = layout
        .egress_socket
        .as_deref()
        .map(open_source_bytes)
        .transpose()?;
    // SAFETY: closing a descriptor number; nothing else is opened beneath the root.
    unsafe { libc::close(ROOT_FD) };
    build_root(
        layout,
        &workspace,
        usr.as_ref(),
        image.as_deref(),
        &ro,
        &devices,
        &links,
        egress.as_ref(),
    )?;
    drop((workspace, usr, image, ro, devices, egress));

    // SAFETY: sethostname with a valid buffer.
    let host = b"sandbox";
    check(
        unsafe { libc::sethostname(host.as_ptr().cast(), host.len()) }.into(),
        "sethostname",
    )?;
    loopback_up()?;
    let mut dir = b"/workspace".to_vec();
    if !layout.workdir.is_empty() {
        dir.push(b'/');
        dir.extend_from_slice(&layout.workdir);
    }
    let dir = <std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(dir);
    std::env::set_current_dir(&dir).map_err(|e| format!("chdir {}: {e}", dir.display()))?;

    // pid 1 keeps no power over the sandbox it supervises, and no process of the sandbox may
    // read its memory or descriptors (`/proc/1/fd`, `/proc/1/mem` need it dumpable).
    drop_capabilities()?;
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if layout.egress_socket.is_some() {
        start_relay()?;
    }
    Ok(())
}

/// The network way out of a sandbox whose session may use the network: a process listening on
/// 127.0.0.1:3128 in the sandbox's own network namespace, relaying each connection to the
/// service's egress proxy through the bound UNIX socket. It is listening before the command
/// starts, and dies with the PID namespace.
fn start_relay() -> Result<(), String> {
    let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, crate::PROXY_PORT))
        .map_err(|e| format!("egress relay on 127.0.0.1:{}: {e}", crate::PROXY_PORT))?;
    // SAFETY: single-threaded program.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(os_err("fork egress relay"));
    }
    if pid > 0 {
        // pid 1 and the command do not keep the listening socket.
        drop(listener);
        return Ok(());
    }
    // The relay: the only process of the sandbox that is not the command's; no stdio of its own.
    // SAFETY: closing descriptor numbers.
    unsafe {
        libc::close(0);
        libc::close(1);
        libc::close(2);
        libc::close(crate::STATUS_FD);
    }
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        std::thread::spawn(move || relay(tcp));
    }
    // SAFETY: ends the relay.
    unsafe { libc::_exit(0) }
}

fn relay(tcp: std::net::TcpStream) {
    let Ok(unix) = std::os::unix::net::UnixStream::connect(crate::SOCKET_IN_SANDBOX) else {
        return;
    };
    let (Ok(mut tcp_r), Ok(mut unix_w)) = (tcp.try_clone(), unix.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut tcp_r, &mut unix_w);
        let _ = unix_w.shutdown(std::net::Shutdown::Write);
    });
    let (mut unix_r, mut tcp_w) = (unix, tcp);
    let _ = std::io::copy(&mut unix_r, &mut tcp_w);
    let _ = tcp_w.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}

/// Forks: the parent waits for the child and exits with its status (never returns); the child
/// returns.
fn wait_in_parent(what: &str) -> Result<(), String> {
    // SAFETY: single-threaded program.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(os_err(&format!("fork {what}")));
    }
    if pid == 0 {
        return Ok(());
    }
    // Not interested in anything but our child's end: the status pipe or control socket, the
    // workspace root are the child's business (an agent's service must see end-of-file on the
    // control socket when pid 1 dies, so nothing else may hold it).
    // SAFETY: close_range takes integers only.
    unsafe { libc::syscall(libc::SYS_close_range, 3, libc::c_uint::MAX, 0) };
    let status = wait_for(pid);
    exit_like(status)
}

fn wait_for(pid: libc::pid_t) -> libc::c_int {
    let mut status = 0;
    loop {
        // SAFETY: valid out pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
        if rc == pid {
            return status;
        }
        if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 0;
        }
    }
}

fn exit_like(status: libc::c_int) -> ! {
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    };
    // SAFETY: ends the process without running destructors (like after fork).
    unsafe { libc::_exit(code) }
}

/// pid 1 of a one-command sandbox: forks the command (returns in it), reaps everything, exits
/// with the command's status.
pub fn fork_command() -> Result<(), String> {
    // SAFETY: single-threaded program.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(os_err("fork command"));
    }
    if pid == 0 {
        return Ok(());
    }
    // Do not hold the status pipe: the service learns about setup from the command's side.
    // SAFETY: closing a descriptor number.
    unsafe { libc::close(crate::STATUS_FD) };
    let mut status = 0;
    loop {
        let mut s = 0;
        // SAFETY: valid out pointer.
        let rc = unsafe { libc::waitpid(-1, &mut s, 0) };
        if rc == pid {
            status = s;
            break;
        }
        if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break;
        }
    }
    exit_like(status)
}

/// One top-level entry of an image's tree, bound (a directory or file) or recreated (a link)
/// on the sandbox's root.
enum ImageEntry {
    Dir(String, Source),
    File(String, Source),
    Link(String, String),
}

/// Top-level entries an image's tree may have, at most (a root has about twenty).
const MAX_IMAGE_ENTRIES: usize = 1024;

/// Directories of the root the sandbox mounts itself: an image's entries of these names are
/// not used.
const MOUNTED_BY_SANDBOX: [&str; 4] = ["workspace", "tmp", "dev", "proc"];

/// Whether a read-only bind is one of the host's system directories, which an image replaces.
fn is_system_dir(path: &[u8]) -> bool {
    ["/etc", "/usr"]
        .iter()
        .any(|d| path == d.as_bytes() || path.starts_with(format!("{d}/").as_bytes()))
}

/// The top-level entries of the image's tree at `path`, beneath the workspace root (the
/// working directory here, already in the new mount namespace: a bind needs its source there).
/// Names that are not UTF-8 and entries that are neither directories, files nor links are left
/// out.
fn image_entries(path: &[u8]) -> Result<Vec<ImageEntry>, String> {
    let tree = open_source_bytes(path)?;
    let base = format!("/proc/self/fd/{}", tree.fd);
    let failed = |e: io::Error| format!("reading the image's tree: {e}");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&base).map_err(failed)? {
        let entry = entry.map_err(failed)?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if MOUNTED_BY_SANDBOX.contains(&name.as_str()) {
            continue;
        }
        if out.len() == MAX_IMAGE_ENTRIES {
            return Err(format!(
                "the image's root has more than {MAX_IMAGE_ENTRIES} entries"
            ));
        }
        let path = format!("{base}/{name}");
        let kind = entry.file_type().map_err(failed)?;
        if kind.is_symlink() {
            let target = std::fs::read_link(&path).map_err(failed)?;
            let Ok(target) = target.into_os_string().into_string() else {
                continue;
            };
            out.push(ImageEntry::Link(name, target));
        } else if kind.is_dir() {
            out.push(ImageEntry::Dir(name, open_source(&path)?));
        } else if kind.is_file() {
            out.push(ImageEntry::File(name, open_source(&path)?));
        }
    }
    drop(tree);
    Ok(out)
}

/// The image's entries on the new root: each directory and file a read-only, `nosuid,nodev`
/// bind of the one cached tree (shared by every sandbox on that image), each link recreated.
fn bind_image(entries: &[ImageEntry], at: &dyn Fn(&str) -> String) -> Result<(), String> {
    let bind = (libc::MS_BIND | libc::MS_REC) as libc::c_ulong;
    for entry in entries {
        let name = match entry {
            ImageEntry::Dir(name, _) | ImageEntry::File(name, _) | ImageEntry::Link(name, _) => {
                name
            }
        };
        // A name the sandbox made itself (or that an operator's read-only bind begins with)
        // stays the sandbox's. Nothing else runs in this mount namespace yet, so what is absent
        // now is still absent when it is made below (and mkdir, a link and an O_EXCL create
        // fail rather than follow one).
        if std::fs::symlink_metadata(at(&format!("/{name}"))).is_ok() {
            continue;
        }
        let (name, src) = match entry {
            ImageEntry::Link(name, target) => {
                symlink(target, &at(&format!("/{name}")))?;
                continue;
            }
            ImageEntry::Dir(name, src) => {
                mkdir(&at(&format!("/{name}")), 0o755)?;
                (name, src)
            }
            ImageEntry::File(name, src) => {
                touch(&at(&format!("/{name}")))?;
                (name, src)
            }
        };
        let target = at(&format!("/{name}"));
        mount(Some(&src.name), &target, None, bind, None)?;
        set_attrs(
            &target,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        )?;
    }
    Ok(())
}

/// Terminals one sandbox's devpts instance holds: `limits.max_terminals_per_session` (16 by
/// default) and room for those its programs open themselves.
const PTYS_PER_SANDBOX: u32 = 64;

#[allow(clippy::too_many_arguments)]
fn build_root(
    layout: &Spec,
    workspace: &Source,
    usr: Option<&Source>,
    image: Option<&[ImageEntry]>,
    ro: &[(String, Source)],
    devices: &[(&str, Source)],
    links: &[(String, String)],
    egress: Option<&Source>,
) -> Result<(), String> {
    let rec_private = (libc::MS_REC | libc::MS_PRIVATE) as libc::c_ulong;
    mount(None, "/", None, rec_private, None)?;
    let root = "/tmp";
    let tmpfs = cstr("tmpfs")?;
    mount(
        Some(&tmpfs),
        root,
        Some("tmpfs"),
        (libc::MS_NOSUID | libc::MS_NODEV) as libc::c_ulong,
        Some("mode=0755,size=1m"),
    )?;
    let bind = (libc::MS_BIND | libc::MS_REC) as libc::c_ulong;
    let at = |p: &str| format!("{root}{p}");

    if let Some(usr) = usr {
        mkdir(&at("/usr"), 0o755)?;
        mount(Some(&usr.name), &at("/usr"), None, bind, None)?;
        set_attrs(
            &at("/usr"),
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        )?;
    }
    for (name, target) in links {
        symlink(target, &at(&format!("/{name}")))?;
    }
    for (path, src) in ro {
        mkdirs(&at(path))?;
        mount(Some(&src.name), &at(path), None, bind, None)?;
        set_attrs(
            &at(path),
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        )?;
    }

    mkdir(&at("/workspace"), 0o755)?;
    mount(Some(&workspace.name), &at("/workspace"), None, bind, None)?;
    set_attrs(&at("/workspace"), MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)?;

    mkdir(&at("/tmp"), 0o1777)?;
    mount(
        Some(&tmpfs),
        &at("/tmp"),
        Some("tmpfs"),
        (libc::MS_NOSUID | libc::MS_NODEV) as libc::c_ulong,
        Some(&format!(
            "mode=1777,size={}",
            layout.tmp_size.max(1024 * 1024)
        )),
    )?;

    mkdir(&at("/dev"), 0o755)?;
    mount(
        Some(&tmpfs),
        &at("/dev"),
        Some("tmpfs"),
        (libc::MS_NOSUID | libc::MS_NOEXEC) as libc::c_ulong,
        Some("mode=0755,size=64k"),
    )?;
    for (name, src) in devices {
        let node = at(&format!("/dev/{name}"));
        touch(&node)?;
        mount(Some(&src.name), &node, None, bind, None)?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(target, &at(&format!("/dev/{link}")))?;
    }
    // A devpts instance of the sandbox's own (never the host's): `exec_command`'s terminals are
    // made from its `ptmx` inside the sandbox, so `/dev/pts` lists the session's terminals and
    // nothing else. No `gid=` (the tty group is not mapped in the user namespace: a slave belongs
    // to the sandbox user's group); at most PTYS_PER_SANDBOX terminals, those a program inside
    // opens (`script`, tmux) included.
    mkdir(&at("/dev/pts"), 0o755)?;
    let devpts = cstr("devpts")?;
    mount(
        Some(&devpts),
        &at("/dev/pts"),
        Some("devpts"),
        (libc::MS_NOSUID | libc::MS_NOEXEC) as libc::c_ulong,
        Some(&format!(
            "newinstance,ptmxmode=0666,mode=0620,max={PTYS_PER_SANDBOX}"
        )),
    )?;
    symlink("pts/ptmx", &at("/dev/ptmx"))?;
    mkdir(&at("/dev/shm"), 0o1777)?;
    mount(
        Some(&tmpfs),
        &at("/dev/shm"),
        Some("tmpfs"),
        (libc::MS_NOSUID | libc::MS_NODEV) as libc::c_ulong,
        Some("mode=1777,size=64m"),
    )?;

    if let Some(src) = egress {
        let node = at(crate::SOCKET_IN_SANDBOX);
        touch(&node)?;
        mount(Some(&src.name), &node, None, bind, None)?;
    }

    mkdir(&at("/proc"), 0o555)?;
    let proc_ = cstr("proc")?;
    mount(
        Some(&proc_),
        &at("/proc"),
        Some("proc"),
        (libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC) as libc::c_ulong,
        None,
    )?;

    // The image's entries last, each only where the sandbox made nothing: no path the init
    // itself makes or mounts on (the egress socket, the operator's read-only binds, /workspace,
    // /tmp, /dev, /proc) can lead through a link the image supplied, and the image cannot take
    // any of those names.
    if let Some(entries) = image {
        bind_image(entries, &at)?;
    }

    // Swap roots and forget the old one.
    std::env::set_current_dir(root).map_err(|e| format!("chdir {root}: {e}"))?;
    let dot = cstr(".")?;
    // SAFETY: valid C strings; pivot_root(".", ".") stacks the old root on the new one.
    check(
        unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) },
        "pivot_root",
    )?;
    // SAFETY: valid C string.
    check(
        unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) }.into(),
        "detaching the old root",
    )?;
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;
    // The root itself (a tmpfs holding mount points) is read-only; /workspace, /tmp, /dev/shm
    // are their own mounts and stay writable.
    let slash = cstr("/")?;
    let ro_remount =
        (libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV)
            as libc::c_ulong;
    mount(Some(&slash), "/", None, ro_remount, None)?;
    Ok(())
}

fn loopback_up() -> Result<(), String> {
    // SAFETY: socket/ioctl on a zeroed ifreq with a NUL-terminated name; the fd is closed.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(os_err("socket for lo"));
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        let rc = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req);
        if rc < 0 {
            libc::close(fd);
            return Err(os_err("SIOCGIFFLAGS lo"));
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        let rc = libc::ioctl(fd, libc::SIOCSIFFLAGS, &req);
        libc::close(fd);
        if rc < 0 {
            return Err(os_err("bringing lo up"));
        }
    }
    Ok(())
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Empties the bounding set and every capability set of this process.
fn drop_capabilities() -> Result<(), String> {
    for cap in 0..=63 {
        // SAFETY: prctl with integer arguments; EINVAL past the last capability is expected.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            break;
        }
    }
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    let header = CapHeader {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset with a version-3 header and two data structs.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) };
    check(rc, "capset")
}
