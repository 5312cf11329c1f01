//! Control groups for sandboxed commands, created beneath the service's own cgroup (never at the
//! hierarchy root, and the service's processes are never moved).
//!
//! - per **session**, in the v1 `pids`, `memory` and `cpu` hierarchies: the session's limits
//!   (process count, memory, CPU bandwidth), shared by all its commands, background ones included,
//!   so one session's fork or memory bomb cannot starve another;
//! - per **command**, in the cgroup v2 hierarchy (`/sys/fs/cgroup/unified` on hybrid hosts, or
//!   `/sys/fs/cgroup`): `cgroup.kill` stops the whole process tree at once, forks racing the kill
//!   included, and `cgroup.events` says when it is empty. With a resident agent per session, the
//!   session has a v2 subtree (`s-<id>/agent`, `s-<id>/c<n>`): the agent is started in `agent/`,
//!   and the service moves each command's process into its own `c<n>/` from the host before it
//!   execs, so `cgroup.kill` still takes down exactly one command's tree — and the subtree's,
//!   the whole session's sandbox.
//!
//! Hosts without these hierarchies (or a service that is not root) still get the PID namespace
//! (killing the outer init kills every process of the command) and the rlimits; `/readyz` says which.
use std::fs;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

/// The limits a session's cgroups enforce.
#[derive(Debug, Clone, PartialEq)]
pub struct CgroupLimits {
    pub memory_bytes: u64,
    pub pids: u64,
    /// CPU bandwidth in cores (1.0 = one full core).
    pub cpu_cores: f64,
}

const V1_CONTROLLERS: [&str; 3] = ["pids", "memory", "cpu"];

/// The cgroup directories this service instance owns.
#[derive(Debug)]
pub struct Cgroups {
    /// `(controller, <mount>/<own path>/toolexec-<pid>)` for each v1 controller found.
    v1: Vec<(&'static str, PathBuf)>,
    /// `<v2 mount>/<own path>/toolexec-<pid>`.
    v2: PathBuf,
    next: AtomicU64,
}

fn own_path(controller: &str) -> io::Result<String> {
    let text = fs::read_to_string("/proc/self/cgroup")?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next(), parts.next(), parts.next());
        let (Some(ctrls), Some(path)) = (ctrls, path) else {
            continue;
        };
        if ctrls.split(',').any(|c| c == controller) {
            return Ok(path.trim_start_matches('/').to_owned());
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("no '{controller}' line in /proc/self/cgroup"),
    ))
}

/// `toolexec-<pid>-<n>`: unique per instance, also for several instances in one process (tests).
fn prefix() -> String {
    static INSTANCE: AtomicU64 = AtomicU64::new(0);
    format!(
        "toolexec-{}-{}",
        std::process::id(),
        INSTANCE.fetch_add(1, Ordering::Relaxed)
    )
}

impl Cgroups {
    /// Finds the hierarchies, removes what dead instances left behind, and creates this
    /// instance's directories. Fails unless at least the v2 hierarchy (for `cgroup.kill`) is
    /// usable.
    pub fn setup() -> Result<Self, String> {
        let v2_mount = if Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists() {
            PathBuf::from("/sys/fs/cgroup/unified")
        } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            PathBuf::from("/sys/fs/cgroup")
        } else {
            return Err("no cgroup v2 hierarchy mounted".into());
        };
        let v2_parent = v2_mount.join(own_path("").map_err(|e| format!("cgroup v2: {e}"))?);
        if !v2_parent.join("cgroup.kill").exists() && v2_parent != v2_mount {
            return Err("cgroup.kill missing (Linux 5.14+ needed)".into());
        }
        cleanup_stale(&v2_parent);
        let name = prefix();
        let v2 = v2_parent.join(&name);
        fs::create_dir_all(&v2).map_err(|e| format!("cannot create {}: {e}", v2.display()))?;
        let mut v1 = Vec::new();
        for ctrl in V1_CONTROLLERS {
            let mount = Path::new("/sys/fs/cgroup").join(ctrl);
            if !mount.join("tasks").exists() {
                continue;
            }
            let Ok(own) = own_path(ctrl) else { continue };
            let parent = mount.join(own);
            cleanup_stale(&parent);
            let dir = parent.join(&name);
            match fs::create_dir_all(&dir) {
                Ok(()) => v1.push((ctrl, dir)),
                Err(e) => {
                    tracing::warn!(controller = ctrl, error = %e, "cgroup v1 controller not usable");
                }
            }
        }
        Ok(Self {
            v1,
            v2,
            next: AtomicU64::new(1),
        })
    }

    /// Whether a memory cgroup limits each session.
    pub fn limits_memory(&self) -> bool {
        self.v1.iter().any(|(c, _)| *c == "memory")
    }

    /// Which limits are enforced by cgroups (for `/readyz`).
    pub fn describe(&self) -> String {
        let ctrls: Vec<&str> = self.v1.iter().map(|(c, _)| *c).collect();
        format!(
            "cgroup.kill per command; session limits by {}",
            if ctrls.is_empty() {
                "rlimits only".to_owned()
            } else {
                format!("v1 {}", ctrls.join(", "))
            }
        )
    }

    /// A session's cgroups with its limits.
    pub fn session(&self, name: &str, limits: &CgroupLimits) -> io::Result<SessionGroup> {
        let mut dirs = Vec::new();
        let mut memory = None;
        for (ctrl, base) in &self.v1 {
            let dir = base.join(name);
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            match *ctrl {
                "pids" => write_file(&dir.join("pids.max"), &limits.pids.to_string())?,
                "memory" => {
                    write_file(
                        &dir.join("memory.limit_in_bytes"),
                        &limits.memory_bytes.to_string(),
                    )?;
                    // With swap accounting, swap counts too (else a memory bomb just swaps).
                    let memsw = dir.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        write_file(&memsw, &limits.memory_bytes.to_string())?;
                    }
                    memory = Some(dir.clone());
                }
                "cpu" => {
                    let period: u64 = 100_000;
                    let quota = (limits.cpu_cores * period as f64).round().max(1000.0) as u64;
                    write_file(&dir.join("cpu.cfs_period_us"), &period.to_string())?;
                    write_file(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
                }
                _ => {}
            }
            dirs.push(dir);
        }
        Ok(SessionGroup { dirs, memory })
    }

    /// A session's v2 subtree, for a resident agent (`agent/`) and its commands (`c<n>/`).
    /// Dropping it kills everything in it and removes it.
    pub fn session_tree(&self, name: &str) -> io::Result<SessionTree> {
        let dir = self.v2.join(name);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let agent = dir.join("agent");
        match fs::create_dir(&agent) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        Ok(SessionTree {
            dir,
            next: AtomicU64::new(1),
            free: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// A fresh v2 cgroup for one command.
    pub fn command(&self) -> io::Result<CommandGroup> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let dir = self.v2.join(format!("c{n}"));
        fs::create_dir(&dir)?;
        Ok(CommandGroup {
            dir,
            free: None,
            found_empty: AtomicBool::new(false),
        })
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        kill_tree(&self.v2);
        for (_, dir) in &self.v1 {
            remove_tree(dir);
        }
    }
}

/// A session's v1 cgroups (limits). Removed when dropped (after its commands are gone).
#[derive(Debug)]
pub struct SessionGroup {
    dirs: Vec<PathBuf>,
    memory: Option<PathBuf>,
}

impl SessionGroup {
    /// `cgroup.procs` of each of the session's cgroups, opened for the child to join them.
    pub fn procs_files(&self) -> io::Result<Vec<OwnedFd>> {
        self.dirs.iter().map(|d| open_procs(d)).collect()
    }

    /// How many times the kernel's OOM killer struck in this session so far.
    pub fn oom_kills(&self) -> u64 {
        let Some(dir) = &self.memory else { return 0 };
        fs::read_to_string(dir.join("memory.oom_control"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("oom_kill "))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }
}

impl Drop for SessionGroup {
    /// Removed by the reaper thread, after whatever was handed to it before (a session's
    /// resident sandbox, still dying, keeps these populated for a moment).
    fn drop(&mut self) {
        for dir in self.dirs.drain(..) {
            remove_later(dir);
        }
    }
}

/// A session's v2 subtree: `agent/` holds its resident agent (and the outer init above it),
/// `c<n>/` each command the agent forked, placed there from the host. Dropping it kills every
/// process in it (`cgroup.kill` on the subtree) and removes it, off the caller's thread.
#[derive(Debug)]
pub struct SessionTree {
    dir: PathBuf,
    next: AtomicU64,
    /// Command cgroups found empty when their command was done, for the next commands: making
    /// and removing a cgroup per command is work on every command's path otherwise.
    free: Arc<Mutex<Vec<PathBuf>>>,
}

/// Empty command cgroups a session keeps for reuse.
const KEPT_FREE: usize = 4;

impl SessionTree {
    /// `cgroup.procs` of `agent/`, for the agent to join when it is started.
    pub fn agent_procs(&self) -> io::Result<OwnedFd> {
        open_procs(&self.dir.join("agent"))
    }

    /// An empty cgroup for one command of the session: one an earlier command left empty, or
    /// a new one.
    pub fn command(&self) -> io::Result<CommandGroup> {
        let reused = self.free.lock().ok().and_then(|mut f| f.pop());
        let dir = match reused {
            Some(dir) => dir,
            None => {
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                let dir = self.dir.join(format!("c{n}"));
                fs::create_dir(&dir)?;
                dir
            }
        };
        Ok(CommandGroup {
            dir,
            free: Some(self.free.clone()),
            found_empty: AtomicBool::new(false),
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Kills every process of the session's sandbox now (the removal follows on drop).
    pub fn kill(&self) {
        if populated(&self.dir) {
            let _ = write_file(&self.dir.join("cgroup.kill"), "1");
        }
    }
}

impl Drop for SessionTree {
    fn drop(&mut self) {
        remove_later(std::mem::take(&mut self.dir));
    }
}

/// One command's v2 cgroup. Dropping it kills whatever is left in it and removes it.
#[derive(Debug)]
pub struct CommandGroup {
    dir: PathBuf,
    /// Where it goes back to when it is found empty (a session's command cgroups).
    free: Option<Arc<Mutex<Vec<PathBuf>>>>,
    /// [`CommandGroup::kill_nowait`] found nothing in it. Nothing can enter it after that (no
    /// process is left to fork, and the service moves processes only into new groups), so
    /// dropping it need not read `cgroup.events` again.
    found_empty: AtomicBool,
}

impl CommandGroup {
    pub fn procs_file(&self) -> io::Result<OwnedFd> {
        open_procs(&self.dir)
    }

    /// Moves a process (by its pid in the service's PID namespace) into this cgroup. The
    /// process must not have forked yet: its children would stay where they were.
    pub fn adopt(&self, pid: i32) -> io::Result<()> {
        write_file(&self.dir.join("cgroup.procs"), &pid.to_string())
    }

    /// SIGKILLs every process in the cgroup (new forks included) and waits, bounded, until it
    /// is empty.
    pub fn kill(&self) {
        kill_and_wait(&self.dir);
    }

    /// Host pids of the processes in the cgroup.
    pub fn pids(&self) -> Vec<i32> {
        fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        !populated(&self.dir)
    }
}

impl CommandGroup {
    /// SIGKILLs whatever is in the cgroup without waiting for it to go.
    pub fn kill_nowait(&self) {
        if populated(&self.dir) {
            let _ = write_file(&self.dir.join("cgroup.kill"), "1");
        } else {
            self.found_empty.store(true, Ordering::Relaxed);
        }
    }
}

impl Drop for CommandGroup {
    /// The cgroup is emptied and removed by a reaper thread: a command's answer does not wait
    /// for the kernel to finish tearing its processes down.
    fn drop(&mut self) {
        let dir = std::mem::take(&mut self.dir);
        // Reused only if nothing is in it: a process the kill has not taken yet goes to the
        // reaper with its cgroup.
        if let Some(free) = &self.free
            && (self.found_empty.load(Ordering::Relaxed) || !populated(&dir))
            && let Ok(mut free) = free.lock()
            && free.len() < KEPT_FREE
        {
            free.push(dir);
            return;
        }
        remove_later(dir);
    }
}

/// Hands a cgroup directory (and what is beneath it) to the reaper thread, or kills and removes
/// it here if there is none.
fn remove_later(dir: PathBuf) {
    if dir.as_os_str().is_empty() {
        return;
    }
    if let Err(mpsc::SendError(dir)) = reaper().lock().map_or_else(
        |_| Err(mpsc::SendError(dir.clone())),
        |tx| tx.send(dir.clone()),
    ) {
        kill_tree(&dir);
    }
}

/// The thread that kills, waits for and removes dropped command cgroups.
fn reaper() -> &'static Mutex<mpsc::Sender<PathBuf>> {
    static REAPER: OnceLock<Mutex<mpsc::Sender<PathBuf>>> = OnceLock::new();
    REAPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<PathBuf>();
        let spawned = std::thread::Builder::new()
            .name("cgroup-reaper".into())
            .spawn(move || {
                for dir in rx {
                    kill_tree(&dir);
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the cgroup reaper; cgroups are removed inline");
        }
        Mutex::new(tx)
    })
}

fn open_procs(dir: &Path) -> io::Result<OwnedFd> {
    let file = fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.procs"))?;
    Ok(OwnedFd::from(file))
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(value.as_bytes())
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

fn populated(dir: &Path) -> bool {
    match fs::read_to_string(dir.join("cgroup.events")) {
        Ok(t) => t.lines().any(|l| l.trim() == "populated 1"),
        // v1 directory (no cgroup.events): look at its tasks.
        Err(_) => fs::read_to_string(dir.join("tasks")).is_ok_and(|t| !t.trim().is_empty()),
    }
}

fn kill_and_wait(dir: &Path) {
    if !populated(dir) {
        return;
    }
    let _ = write_file(&dir.join("cgroup.kill"), "1");
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut delay = Duration::from_micros(200);
    while populated(dir) && Instant::now() < deadline {
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(20));
    }
    if populated(dir) {
        tracing::error!(dir = %dir.display(), "cgroup still populated 5 s after cgroup.kill");
    }
}

/// Kills (v2) and removes a cgroup directory and everything beneath it, deepest first.
fn kill_tree(dir: &Path) {
    kill_and_wait(dir);
    remove_tree(dir);
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                kill_tree(&e.path());
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while let Err(e) = fs::remove_dir(dir) {
        if e.kind() == io::ErrorKind::NotFound || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Removes the `toolexec-<pid>` directories of instances that no longer run (a crash leaves
/// them behind), killing anything still in them.
fn cleanup_stale(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("toolexec-"))
            .and_then(|p| p.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            tracing::info!(dir = %e.path().display(), "removing cgroups of a stopped instance");
            kill_tree(&e.path());
        }
    }
}
