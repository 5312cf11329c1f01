//! Adversarial suite: commands that try to get out of the shell sandbox, run for real through the
//! HTTP API. Every test asserts containment (host-side when it can: the host's `/proc`, files,
//! sockets), then that the service is still healthy and the session still runs commands.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolexec_tests::app::{TestApp, spawn_app, spawn_app_with};
use toolexec_tests::procs::{
    assert_no_host_process, describe_host_process, host_processes_matching, sleep_arg,
    wait_for_sleep,
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn content(r: &Value) -> &str {
    r["content"].as_str().unwrap_or_default()
}

/// The text of a `--- stdout ---` / `--- stderr ---` section of a shell result ("" if absent).
fn section(r: &Value, name: &str) -> String {
    let c = content(r);
    let head = format!("--- {name} ---\n");
    let Some(start) = c.find(&head) else {
        return String::new();
    };
    let rest = &c[start + head.len()..];
    let end = rest.find("\n--- std").map_or(rest.len(), |i| i + 1);
    rest[..end].to_owned()
}

/// The first 2,000 and the last 500 characters of a long text (for the test's log).
fn abbreviated(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= 3000 {
        return text.to_owned();
    }
    let head: String = chars[..2000].iter().collect();
    let tail: String = chars[chars.len() - 500..].iter().collect();
    format!("{head}\n[… {} characters …]\n{tail}", chars.len() - 2500)
}

fn stdout(r: &Value) -> String {
    section(r, "stdout")
}

/// A token unique to this test process and moment (nextest runs every test in its own process).
fn unique() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}x{nanos:x}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn host_pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| {
            !s.lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'))
        })
        .unwrap_or(false)
}

/// A session and a counter of call ids.
struct Sh<'a> {
    app: &'a TestApp,
    sid: String,
    n: AtomicUsize,
}

impl<'a> Sh<'a> {
    async fn new(app: &'a TestApp, body: Value) -> Sh<'a> {
        let s = app.session(body).await;
        Sh {
            app,
            sid: s["id"].as_str().expect("session id").to_owned(),
            n: AtomicUsize::new(0),
        }
    }

    /// One `shell` call with these arguments; the result and how long the HTTP call took.
    async fn shell(&self, args: Value) -> (Value, Duration) {
        let id = format!("c{}", self.n.fetch_add(1, Ordering::Relaxed));
        let t0 = Instant::now();
        let r = self.app.call(&self.sid, &id, "shell", args.clone()).await;
        let took = t0.elapsed();
        eprintln!(
            "--- shell {args} ({:.2} s) -> status {}\n{}",
            took.as_secs_f64(),
            r["status"],
            abbreviated(content(&r))
        );
        (r, took)
    }

    /// A command with a 20 s timeout.
    async fn run(&self, command: &str) -> Value {
        self.shell(json!({"command": command, "timeout_ms": 20_000}))
            .await
            .0
    }

    /// The service answers `/readyz` with 200 and this session still runs `echo ok`.
    async fn assert_healthy(&self) {
        let ready = self.app.get("/readyz").await;
        let code = ready.status();
        let body = ready.text().await.unwrap_or_default();
        assert_eq!(code, 200, "/readyz after the hostile command: {body}");
        let r = self.run("echo ok").await;
        assert_eq!(r["status"], "ok", "follow-up echo ok: {r}");
        assert_eq!(stdout(&r), "ok\n", "follow-up echo ok: {r}");
    }
}

fn assert_failed(r: &Value, what: &str) {
    assert_eq!(r["status"], "error", "{what} must fail: {r}");
    assert!(
        !content(r).starts_with("[exit code 0 "),
        "{what} must fail: {r}"
    );
}

/// Shell text running `cmd` (its stderr to stdout, for the failure messages) and printing
/// `@@<label>:ok` or `@@<label>:denied rc=N`.
fn attempt(label: &str, cmd: &str) -> String {
    format!(
        "if {{ {cmd}; }} 2>&1; then echo @@{label}:ok; else echo \"@@{label}:denied rc=$?\"; fi\n"
    )
}

/// A `pkill -f`/`pgrep -f` pattern matching `sleep <arg>` but not its own text (which would
/// match the bash running it).
fn sleep_pattern(arg: &str) -> String {
    format!("'sleep {}'", arg.replace('.', "[.]"))
}

/// The value after `<label>:` in a stdout made by [`attempt`].
fn attempt_result(out: &str, label: &str) -> String {
    let prefix = format!("@@{label}:");
    out.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or("<missing>")
        .to_owned()
}

/// `NAME` of each `NAME=value` line (lines without `=` are skipped).
fn env_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.to_owned()))
        .filter(|k| !k.is_empty() && !k.contains(' '))
        .collect()
}

fn find_file(root: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    let entries = std::fs::read_dir(root).ok()?;
    for e in entries.flatten() {
        let p = e.path();
        if e.file_name().to_str() == Some(name) {
            return Some(p);
        }
        if depth > 0
            && e.file_type().is_ok_and(|t| t.is_dir())
            && let Some(found) = find_file(&p, name, depth - 1)
        {
            return Some(found);
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// 1. Secrets
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_host_secrets_and_other_sessions_files_are_unreadable() {
    let app = spawn_app().await;
    let ready: Value = app.get("/readyz").await.json().await.unwrap();
    assert_eq!(ready["sandbox"]["mode"], "enforced", "{ready}");
    let sh = Sh::new(&app, json!({})).await;

    // /etc is bound read-only from the host, so /etc/shadow is there but unreadable (0640 root).
    let r = sh.run("cat /etc/shadow").await;
    assert_failed(&r, "cat /etc/shadow");
    assert!(content(&r).contains("Permission denied"), "{r}");
    assert!(!content(&r).contains("root:"), "shadow leaked: {r}");
    assert_eq!(stdout(&r), "", "{r}");

    // /root is not there at all, and none of the host's /root entries show up.
    let r = sh.run("ls -la /root; ls -la /root/.cargo").await;
    assert_failed(&r, "ls /root");
    let host_root: Vec<String> = std::fs::read_dir("/root")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|n| n.len() >= 5)
                .collect()
        })
        .unwrap_or_default();
    for name in &host_root {
        assert!(
            !stdout(&r).contains(name.as_str()),
            "host /root entry {name} visible: {r}"
        );
    }

    // The service's data directory (its store, every workspace) is not visible.
    let data = app.data.path().display().to_string();
    let r = sh.run(&format!("ls -la {data}")).await;
    assert_failed(&r, "ls of the data directory");
    assert!(content(&r).contains("No such file or directory"), "{r}");

    // Another session's workspace: write a secret there (through its own shell), then look for
    // it from this session by its host path and by searching the filesystem.
    let other = Sh::new(&app, json!({})).await;
    let secret = format!("secret-{}", unique());
    let r = other
        .run(&format!("echo {secret} > {secret}.txt && pwd"))
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let host_path = find_file(app.data.path(), &format!("{secret}.txt"), 4)
        .expect("the other session's file on the host");
    let r = sh
        .run(&format!(
            "cat {}; find / \\( -path /proc -o -path /sys -o -path /usr \\) -prune -o -name '{secret}*' -print; \
             grep -rs {secret} /tmp /workspace /etc; ls -a /workspace",
            host_path.display()
        ))
        .await;
    assert!(
        !stdout(&r).contains(&secret),
        "another session's file is readable: {r}"
    );
    assert!(content(&r).contains("No such file or directory"), "{r}");

    sh.assert_healthy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_environment_holds_nothing_of_the_service() {
    // The test process is the service: cargo/nextest set variables in it that must not leak.
    let host: BTreeSet<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .collect();
    assert!(
        host.contains("CARGO_PKG_NAME") || host.iter().any(|k| k.starts_with("NEXTEST")),
        "expected cargo/nextest variables in the test process: {host:?}"
    );
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({"env": {"FOO": "bar"}})).await;
    let expected: BTreeSet<String> = [
        "PATH", "HOME", "LANG", "TERM", "SHELL", "PWD", "SHLVL", "_", "FOO",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();

    let r = sh.run("env").await;
    assert_eq!(r["status"], "ok", "{r}");
    let out = stdout(&r);
    assert!(
        out.lines().any(|l| l == "FOO=bar"),
        "session env missing: {r}"
    );
    // The shell the command runs in, not the service's `SHELL`.
    assert!(out.lines().any(|l| l == "SHELL=/bin/bash"), "{r}");
    let names = env_names(&out);
    let unexpected: Vec<&String> = names.difference(&expected).collect();
    assert!(
        unexpected.is_empty(),
        "unexpected variables {unexpected:?}: {r}"
    );
    for leak in ["CARGO", "NEXTEST", "RUST", "DATABASE", "TOOLEXEC", "PG"] {
        assert!(!out.contains(leak), "{leak}* leaked into env: {r}");
    }

    // Every process visible in the sandbox, pid 1 (bubblewrap) first of all.
    let r = sh
        .run(
            "for f in /proc/[0-9]*/environ; do echo \"== $f\"; \
             if tr '\\0' '\\n' < $f; then echo; else echo \"unreadable rc=$?\"; fi; done",
        )
        .await;
    let out = stdout(&r);
    assert!(out.contains("== /proc/1/environ"), "{r}");
    let names = env_names(&out);
    let unexpected: Vec<&String> = names.difference(&expected).collect();
    assert!(
        unexpected.is_empty(),
        "unexpected variables in /proc/*/environ {unexpected:?}: {r}"
    );
    for leak in ["CARGO", "NEXTEST", "DATABASE", "TOOLEXEC"] {
        assert!(!out.contains(leak), "{leak}* in /proc/*/environ: {r}");
    }
    let r = sh.run("cat /proc/1/environ | tr '\\0' '\\n'").await;
    let names = env_names(&stdout(&r));
    assert!(
        names.is_subset(&expected),
        "/proc/1/environ shows {names:?}: {r}"
    );
    sh.assert_healthy().await;
}

// ---------------------------------------------------------------------------------------------
// 2. Writing outside /workspace and /tmp
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_writes_outside_workspace_and_tmp_fail_and_tmp_is_private() {
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({})).await;
    let u = unique();
    let hostname_before = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    // A host file in /tmp the sandbox must not see.
    let host_tmp = PathBuf::from(format!("/tmp/host-{u}"));
    std::fs::write(&host_tmp, "host").unwrap();

    let denied = [
        ("etc", format!("touch /etc/x-{u}")),
        ("usr", format!("touch /usr/x-{u}")),
        ("usrbin", format!("cp /bin/true /usr/bin/x-{u}")),
        ("root", format!("touch /x-{u}")),
        ("mkdirroot", format!("mkdir /d-{u}")),
        (
            "hostname",
            "echo evil > /proc/sys/kernel/hostname".to_owned(),
        ),
        ("sethostname", "hostname evil".to_owned()),
        ("sysrq", "echo h > /proc/sysrq-trigger".to_owned()),
        ("proc1root", format!("touch /proc/1/root/x-{u}")),
        ("dotdot", format!("touch /workspace/../x-{u}")),
        (
            "symlink",
            format!("ln -s /etc /workspace/etclink-{u} && touch /workspace/etclink-{u}/x-{u}"),
        ),
        ("devnew", format!("mknod /dev/x-{u} p")),
        ("hosttmp", format!("cat /tmp/host-{u}")),
    ];
    let allowed = [
        ("tmp", format!("echo t > /tmp/x-{u} && cat /tmp/x-{u}")),
        (
            "ws",
            format!("echo w > /workspace/x-{u} && cat /workspace/x-{u}"),
        ),
        ("devnull", "echo x > /dev/null".to_owned()),
        // POSIX shared memory (Python's multiprocessing needs it): the sandbox's own tmpfs.
        (
            "devshm",
            format!("echo s > /dev/shm/x-{u} && cat /dev/shm/x-{u}"),
        ),
    ];
    let script: String = denied
        .iter()
        .chain(allowed.iter())
        .map(|(l, c)| attempt(l, c))
        .collect();
    let r = sh.run(&script).await;
    let out = stdout(&r);
    for (label, cmd) in &denied {
        let res = attempt_result(&out, label);
        assert!(
            res.starts_with("denied"),
            "{cmd:?} was allowed ({res}): {r}"
        );
    }
    for (label, cmd) in &allowed {
        let res = attempt_result(&out, label);
        assert_eq!(res, "ok", "{cmd:?} failed: {r}");
    }

    // Host side: nothing appeared outside the workspace, the hostname did not change, the
    // sandbox's /tmp file is not in the host's /tmp, the workspace file is in the workspace.
    for p in [
        format!("/etc/x-{u}"),
        format!("/usr/x-{u}"),
        format!("/usr/bin/x-{u}"),
        format!("/x-{u}"),
        format!("/d-{u}"),
        format!("/tmp/x-{u}"),
        format!("/dev/shm/x-{u}"),
    ] {
        assert!(!Path::new(&p).exists(), "{p} exists on the host: {r}");
    }
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
        hostname_before
    );
    let in_ws = find_file(app.data.path(), &format!("x-{u}"), 4)
        .expect("the workspace file is in the data directory on the host");
    assert_eq!(std::fs::read_to_string(&in_ws).unwrap(), "w\n");
    let _ = std::fs::remove_file(&host_tmp);

    // The sandbox's hostname is its own.
    let r = sh.run("hostname; cat /proc/sys/kernel/hostname").await;
    assert_eq!(stdout(&r), "sandbox\nsandbox\n", "{r}");
    sh.assert_healthy().await;
}

// ---------------------------------------------------------------------------------------------
// 3. Host processes
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_host_processes_are_invisible_and_unkillable() {
    use std::os::unix::process::CommandExt;
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({})).await;
    let me = std::process::id() as i32;
    // A host process of the sandbox's own uid: same user, so only the namespaces and Landlock
    // keep the sandbox from signalling it.
    let victim_arg = sleep_arg(1270);
    let mut victim = std::process::Command::new("sleep")
        .arg(&victim_arg)
        .uid(65534)
        .gid(65534)
        .spawn()
        .expect("spawn a host process as uid 65534");
    let victim_pid = victim.id() as i32;
    let victim_re = sleep_pattern(&victim_arg);
    // The postmaster (its backends come and go with other tests' connections).
    let postgres: Vec<i32> = host_processes_matching("bin/postgres ");

    let r = sh
        .run("ls /proc | grep -E '^[0-9]+$' | tr '\\n' ' '; echo; ps -e -o pid,user,comm")
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let out = stdout(&r);
    let first = out.lines().next().unwrap_or_default();
    let pids: Vec<i32> = first
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    assert!(
        !pids.is_empty() && pids.len() <= 6,
        "the sandbox sees {} processes: {r}",
        pids.len()
    );
    assert!(pids.iter().all(|p| *p < 100), "host-like pids visible: {r}");
    assert!(
        !pids.contains(&me),
        "the service's pid {me} is visible: {r}"
    );
    assert!(
        !pids.contains(&victim_pid),
        "host pid {victim_pid} visible: {r}"
    );
    for host_name in ["postgres", "e2e", "sleep", "cargo", "nextest", "systemd"] {
        assert!(
            !out.contains(host_name),
            "host process {host_name} visible: {r}"
        );
    }

    // Kill attempts: the sandbox's pid 1, every host pid we know, everything it may signal.
    let mut targets = vec![me, victim_pid];
    targets.extend(postgres.iter().take(3));
    let kill_host = targets
        .iter()
        .map(|p| format!("kill -9 {p} 2>&1; echo kill{p}:rc=$?\n"))
        .collect::<String>();
    let r = sh
        .run(&format!(
            "kill -9 1 2>&1; echo kill1:rc=$?\n{kill_host}kill -9 -1 2>&1; echo killall:rc=$?\n\
             pkill -9 -f {victim_re}; echo pkill:rc=$?\necho still-here"
        ))
        .await;
    let out = stdout(&r);
    assert!(out.contains("still-here"), "{r}");
    for p in &targets {
        let res = attempt_result(&out, &format!("kill{p}"));
        assert_ne!(res, "rc=0", "kill -9 {p} succeeded in the sandbox: {r}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the host's uid-65534 process was killed from the sandbox: {r}"
    );
    for p in &postgres {
        assert!(host_pid_alive(*p), "postgres pid {p} died: {r}");
    }
    let _ = victim.kill();
    let _ = victim.wait();
    sh.assert_healthy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_other_sessions_processes_are_invisible_and_unkillable() {
    let app = spawn_app().await;
    let a = Sh::new(&app, json!({})).await;
    let b = Sh::new(&app, json!({})).await;
    let arg = sleep_arg(1260);
    let (r, _) = a
        .shell(json!({"command": format!("sleep {arg}"), "background": true}))
        .await;
    assert!(content(&r).contains("Started background process p1"), "{r}");
    let sleeper = wait_for_sleep(&arg)
        .await
        .expect("session A's background sleep runs on the host");

    let pattern = sleep_pattern(&arg);
    let r = b
        .run(&format!(
            "ps -e -o pid,args; pgrep -f {pattern}; echo pgrep:rc=$?; pkill -9 -f {pattern}; \
             echo pkill:rc=$?; kill -9 {sleeper}; echo kill:rc=$?; kill -9 -1; echo done"
        ))
        .await;
    assert!(
        !stdout(&r).contains(&format!("sleep {arg}")),
        "session A's process visible in B: {r}"
    );
    assert!(stdout(&r).contains("pgrep:rc=1"), "{r}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        host_pid_alive(sleeper),
        "session B killed session A's process {sleeper}: {r}"
    );
    b.assert_healthy().await;
    a.assert_healthy().await;
    let resp = app.delete(&format!("/v1/sessions/{}", a.sid)).await;
    assert_eq!(resp.status(), 200);
    assert_no_host_process(&format!("sleep {arg}"), "after closing session A").await;
}

// ---------------------------------------------------------------------------------------------
// 4. Network
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_network_is_isolated() {
    use std::os::linux::net::SocketAddrExt;
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({})).await;

    // Listeners on the host: loopback, all interfaces, an abstract UNIX socket.
    let lo = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    lo.set_nonblocking(true).unwrap();
    let lo_port = lo.local_addr().unwrap().port();
    let any = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    any.set_nonblocking(true).unwrap();
    let any_port = any.local_addr().unwrap().port();
    // The host's own address on its outward interface, if it has a route (no packet is sent).
    let host_ip = std::net::UdpSocket::bind("0.0.0.0:0")
        .ok()
        .and_then(|s| s.connect("10.255.255.1:9").ok().map(|()| s))
        .and_then(|s| s.local_addr().ok())
        .map(|a| a.ip().to_string());
    let abstract_name = format!("toolexec-escape-{}", unique());
    let addr =
        std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap();
    let unix = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    unix.set_nonblocking(true).unwrap();

    let mut tries = vec![
        ("pg", "127.0.0.1".to_owned(), 5432),
        ("lo", "127.0.0.1".to_owned(), lo_port),
        ("any", "127.0.0.1".to_owned(), any_port),
    ];
    if let Some(ip) = &host_ip {
        tries.push(("hostip", ip.clone(), any_port));
        tries.push(("hostippg", ip.clone(), 5432));
    }
    tries.push(("ext", "1.1.1.1".to_owned(), 53));
    let mut script: String = tries
        .iter()
        .map(|(l, ip, port)| {
            attempt(
                l,
                &format!("timeout 5 bash -c 'echo > /dev/tcp/{ip}/{port}'"),
            )
        })
        .collect();
    script.push_str(&attempt(
        "abstract",
        &format!(
            "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect(b'\\\\0{abstract_name}')\""
        ),
    ));
    script.push_str(&attempt("pgsock", "ls /var/run/postgresql /run/postgresql"));
    script.push_str(&attempt("dns", "timeout 5 getent hosts example.com"));
    let r = sh.run(&script).await;
    let out = stdout(&r);
    for (label, ip, port) in &tries {
        let res = attempt_result(&out, label);
        assert!(
            res.starts_with("denied"),
            "TCP to {ip}:{port} from the sandbox: {res}: {r}"
        );
    }
    for label in ["abstract", "pgsock", "dns"] {
        let res = attempt_result(&out, label);
        assert!(res.starts_with("denied"), "{label}: {res}: {r}");
    }
    // Nothing reached the host's listeners.
    for (name, l) in [("loopback", &lo), ("any", &any)] {
        match l.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("the {name} listener got a connection from the sandbox: {other:?}"),
        }
    }
    match unix.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the abstract socket got a connection from the sandbox: {other:?}"),
    }

    // Only the loopback interface exists.
    let r = sh.run("cat /proc/net/dev; ip -o link").await;
    assert_eq!(r["status"], "ok", "{r}");
    let out = stdout(&r);
    let ifaces: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(name, _)| {
            let n = name.trim();
            (!n.is_empty() && !n.contains(' ') && !n.chars().all(|c| c.is_ascii_digit()))
                .then_some(n)
        })
        .collect();
    assert!(
        !ifaces.is_empty() && ifaces.iter().all(|i| *i == "lo"),
        "interfaces other than lo in /proc/net/dev: {ifaces:?}: {r}"
    );
    let links: Vec<&str> = out
        .lines()
        .filter(|l| {
            l.split(':')
                .next()
                .is_some_and(|n| n.trim().parse::<u32>().is_ok())
        })
        .collect();
    assert!(
        !links.is_empty() && links.iter().all(|l| l.contains(": lo:")),
        "ip -o link shows more than lo: {r}"
    );
    sh.assert_healthy().await;
}

// ---------------------------------------------------------------------------------------------
// 5. Namespaces and privileges
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_namespaces_mounts_ptrace_and_privileges_are_denied() {
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({})).await;
    let denied = [
        ("unshareU", "unshare -U true"),
        ("unshareR", "unshare -r true"),
        ("unshareM", "unshare -m true"),
        ("unshareN", "unshare -n true"),
        ("mount", "mount -t tmpfs x /tmp"),
        ("bindmount", "mount --bind /workspace /tmp"),
        ("bwrap", "bwrap --ro-bind / / true"),
        ("nsenter", "nsenter -t 1 -m true"),
        ("setuid", "python3 -c 'import os; os.setuid(0)'"),
        ("chroot", "chroot /tmp /bin/true"),
        (
            "pyunshare",
            "python3 -c 'import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare(0x10000000) != 0)'",
        ),
    ];
    let script: String = denied.iter().map(|(l, c)| attempt(l, c)).collect();
    let r = sh.run(&script).await;
    let out = stdout(&r);
    for (label, cmd) in &denied {
        let res = attempt_result(&out, label);
        assert!(
            res.starts_with("denied"),
            "{cmd:?} was allowed ({res}): {r}"
        );
    }

    // ptrace is refused by seccomp (PTRACE_ATTACH to pid 1 and to a child of our own).
    let r = sh
        .run("python3 -c 'import ctypes; print(ctypes.CDLL(None).ptrace(16, 1, 0, 0))'")
        .await;
    assert_eq!(stdout(&r).trim(), "-1", "{r}");
    let r = sh
        .run(
            "sleep 30 & p=$!; python3 -c \"import ctypes, os; l = ctypes.CDLL(None, use_errno=True); \
             print(l.ptrace(16, $p, 0, 0), os.strerror(ctypes.get_errno()))\"; kill $p",
        )
        .await;
    assert_eq!(stdout(&r).trim(), "-1 Operation not permitted", "{r}");

    // Socket families outside UNIX/INET/INET6/NETLINK: AF_VSOCK (the VM host), AF_PACKET, AF_ALG.
    for (family, name) in [(40, "AF_VSOCK"), (17, "AF_PACKET"), (38, "AF_ALG")] {
        let kind = if family == 38 {
            "SOCK_SEQPACKET"
        } else {
            "SOCK_STREAM"
        };
        let kind = if family == 17 { "SOCK_RAW" } else { kind };
        let r = sh
            .run(&format!(
                "python3 -c 'import socket; socket.socket({family}, socket.{kind})'"
            ))
            .await;
        assert_failed(&r, name);
        assert!(
            content(&r).contains("PermissionError"),
            "{name} socket not refused by seccomp: {r}"
        );
    }

    // Credentials: unprivileged uid, no capabilities at all, no_new_privs, a seccomp filter.
    let r = sh
        .run("id -u; id -g; grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status")
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let out = stdout(&r);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"65534"), "{r}");
    assert_eq!(lines.get(1), Some(&"65534"), "{r}");
    for expected in [
        "CapInh:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "CapAmb:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
    ] {
        assert!(lines.contains(&expected), "missing {expected:?}: {r}");
    }
    sh.assert_healthy().await;
}

// ---------------------------------------------------------------------------------------------
// 6. Fork bomb
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_fork_bomb_is_contained() {
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({})).await;
    let other = Sh::new(&app, json!({})).await;
    let token = format!("bomb-{}", unique());
    let r = sh
        .run(&format!(
            "printf '%s\\n' ':(){{ :|:& }};:' 'sleep 30' > {token}.sh && cat {token}.sh"
        ))
        .await;
    assert_eq!(r["status"], "ok", "{r}");

    let bomb = sh.shell(json!({"command": format!("bash ./{token}.sh"), "timeout_ms": 3000}));
    let meanwhile = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let during = host_processes_matching(&token).len();
        let t0 = Instant::now();
        let ready = app.get("/readyz").await.status();
        let ready_took = t0.elapsed();
        let (echo, echo_took) = other
            .shell(json!({"command": "echo ok", "timeout_ms": 20_000}))
            .await;
        (during, ready, ready_took, echo, echo_took)
    };
    let ((r, took), (during, ready, ready_took, echo, echo_took)) = tokio::join!(bomb, meanwhile);
    eprintln!(
        "bomb: {took:?}; during it: {during} processes, readyz {ready} in {ready_took:?}, \
         echo in another session in {echo_took:?}"
    );
    assert!(
        ["timed_out", "error"].contains(&r["status"].as_str().unwrap_or_default()),
        "{r}"
    );
    assert!(
        took < Duration::from_secs(15),
        "the bomb call took {took:?}"
    );
    assert!(
        during <= 300,
        "{during} bomb processes on the host: the pids limit (256) did not hold"
    );
    assert_eq!(ready, 200, "/readyz during the bomb");
    assert_eq!(
        echo["status"], "ok",
        "another session during the bomb: {echo}"
    );
    assert_no_host_process(&token, "after the fork bomb").await;
    sh.assert_healthy().await;
}

// ---------------------------------------------------------------------------------------------
// 7. Memory bomb
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_memory_bomb_is_contained() {
    let app = spawn_app_with(|c| c.sandbox.memory_bytes = 256 * 1024 * 1024).await;
    let sh = Sh::new(&app, json!({})).await;
    for (what, cmd) in [
        ("one big allocation", "python3 -c 'x = bytearray(1024*1024*1024)'".to_owned()),
        (
            "a growing list",
            "python3 -c 'l = []\nwhile True: l.append(bytearray(8*1024*1024))'".to_owned(),
        ),
        (
            "many processes of 100 MiB each",
            "for i in 1 2 3 4; do python3 -c 'import time; x = bytearray(100*1024*1024); time.sleep(5)' & done; \
             rc=0; for p in $(jobs -p); do wait $p || rc=$?; done; exit $rc"
                .to_owned(),
        ),
    ] {
        let (r, took) = sh
            .shell(json!({"command": cmd, "timeout_ms": 30_000}))
            .await;
        assert_eq!(r["status"], "error", "{what}: {r}");
        let c = content(&r);
        assert!(
            c.contains("memory limit of 256 MiB") || c.contains("MemoryError"),
            "{what}: the result does not say memory ran out: {r}"
        );
        assert!(took < Duration::from_secs(25), "{what} took {took:?}");
        sh.assert_healthy().await;
    }
    // Host side: the session's memory cgroup never went past its limit.
    let dir = find_file(
        Path::new("/sys/fs/cgroup/memory"),
        &format!("s-{}", sh.sid),
        6,
    )
    .expect("the session's memory cgroup");
    let max: u64 = std::fs::read_to_string(dir.join("memory.max_usage_in_bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    eprintln!("{}: max usage {max}", dir.display());
    assert!(max <= 256 * 1024 * 1024, "the session used {max} bytes");
}

// ---------------------------------------------------------------------------------------------
// 8. Disk filling
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_disk_filling_stops_at_the_file_size_limit() {
    let app = spawn_app_with(|c| c.sandbox.file_size_bytes = 64 * 1024 * 1024).await;
    let sh = Sh::new(&app, json!({})).await;
    let name = format!("big-{}", unique());
    let (r, took) = sh
        .shell(json!({"command": format!("dd if=/dev/zero of={name} bs=1M count=4000"), "timeout_ms": 60_000}))
        .await;
    assert_failed(&r, "dd past the file size limit");
    assert!(
        content(&r).contains("File too large")
            || content(&r).contains("signal 25")
            || content(&r).contains("File size limit exceeded"),
        "{r}"
    );
    assert!(
        !content(&r).contains("timed out"),
        "dd ran to the timeout ({took:?}) instead of stopping at the limit: {r}"
    );
    let host = find_file(app.data.path(), &name, 4).expect("the file on the host");
    let size = std::fs::metadata(&host).unwrap().len();
    assert!(
        size <= 64 * 1024 * 1024,
        "{name} is {size} bytes on the host"
    );
    let r = sh.run(&format!("stat -c %s {name}")).await;
    assert_eq!(stdout(&r).trim(), size.to_string(), "{r}");

    // The same through a descriptor opened for append, and in /tmp.
    let r = sh
        .run(&format!(
            "head -c 70000000 /dev/zero >> {name}; echo rc=$?; stat -c %s {name}; \
             dd if=/dev/zero of=/tmp/big bs=1M count=200; stat -c '%s %n' /tmp/big"
        ))
        .await;
    let size = std::fs::metadata(&host).unwrap().len();
    assert!(size <= 64 * 1024 * 1024, "{name} grew to {size} bytes: {r}");
    assert!(
        stdout(&r).contains(&format!("{} /tmp/big", 64 * 1024 * 1024)),
        "/tmp/big not stopped at 64 MiB: {r}"
    );
    // Many files under the limit each: the private /tmp is capped by its size (256 MiB).
    let r = sh
        .run(
            "for i in 1 2 3 4 5 6; do dd if=/dev/zero of=/tmp/f$i bs=1M count=60; done; \
             du -sm /tmp | cut -f1",
        )
        .await;
    assert!(content(&r).contains("No space left on device"), "{r}");
    let used: u64 = stdout(&r)
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(u64::MAX);
    assert!(used <= 257, "/tmp holds {used} MiB: {r}");
    // The limit cannot be raised from inside.
    let r = sh
        .run(&format!(
            "ulimit -f unlimited; echo raise:rc=$?; ulimit -H -f; \
             head -c 70000000 /dev/zero > again-{name}; stat -c %s again-{name}"
        ))
        .await;
    assert!(stdout(&r).contains("raise:rc=1"), "{r}");
    assert!(
        stdout(&r).contains(&(64 * 1024 * 1024).to_string()),
        "the second file passed the limit: {r}"
    );
    // (Big files make every later call slower: the service scans the workspace for changes.)
    let r = sh.run(&format!("rm -f {name} again-{name}")).await;
    assert_eq!(r["status"], "ok", "{r}");
    sh.assert_healthy().await;
}

// ---------------------------------------------------------------------------------------------
// 9. Endless output
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_endless_output_stops_at_the_output_cap() {
    let app = spawn_app_with(|c| c.sandbox.max_output_bytes = 64 * 1024).await;
    let sh = Sh::new(&app, json!({})).await;
    let token = format!("yes-{}", unique());
    for cmd in [
        format!("yes {token}"),
        format!("yes {token} >&2"),
        format!("yes {token} & yes {token} >&2"),
    ] {
        let (r, took) = sh
            .shell(json!({"command": cmd, "timeout_ms": 60_000}))
            .await;
        assert_eq!(r["status"], "error", "{r}");
        assert!(
            content(&r).contains("the output cap"),
            "not stopped at the output cap: {r}"
        );
        assert!(took < Duration::from_secs(5), "{cmd} took {took:?}");
        assert!(
            content(&r).len() < 60_000,
            "{} bytes of content",
            content(&r).len()
        );
        assert_no_host_process(&token, &cmd).await;
    }
    sh.assert_healthy().await;
}

// ---------------------------------------------------------------------------------------------
// 10. Processes left behind by a command
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_processes_left_behind_die_with_the_command() {
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({})).await;
    let cases = [
        (sleep_arg(1234), "sleep {} & echo started"),
        (sleep_arg(1235), "setsid sleep {} & echo started"),
        (sleep_arg(1236), "nohup sleep {} & echo started"),
        (
            sleep_arg(1237),
            "(setsid bash -c 'sleep {}' &); echo started",
        ),
        (
            sleep_arg(1238),
            "(setsid sleep {} </dev/null >/dev/null 2>&1 &); echo started",
        ),
        (
            sleep_arg(1239),
            "python3 -c 'import os, time\nif os.fork() == 0:\n  os.setsid()\n  if os.fork() == 0:\n    os.closerange(0, 1024)\n    os.execvp(\"sleep\", [\"sleep\", \"{}\"])\n' ; echo started",
        ),
    ];
    for (arg, template) in &cases {
        let cmd = template.replace("{}", arg);
        let (r, took) = sh
            .shell(json!({"command": cmd, "timeout_ms": 20_000}))
            .await;
        assert_eq!(r["status"], "ok", "{r}");
        assert!(stdout(&r).contains("started"), "{r}");
        assert!(took < Duration::from_secs(5), "{cmd:?} took {took:?}");
        assert_no_host_process(&format!("sleep {arg}"), &cmd).await;
    }
    sh.assert_healthy().await;
}

// ---------------------------------------------------------------------------------------------
// 11. Input, idle and time limits
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_commands_waiting_for_input_end() {
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({})).await;

    let (r, took) = sh
        .shell(json!({"command": "read x; echo \"got:$x rc=$?\"; cat; python3 -c 'input()' 2>&1 | tail -n 1", "timeout_ms": 10_000}))
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(stdout(&r).starts_with("got: rc=1\n"), "{r}");
    assert!(stdout(&r).contains("EOFError"), "{r}");
    assert!(took < Duration::from_secs(5), "took {took:?}");

    let idle = sleep_arg(30);
    let (r, took) = sh
        .shell(json!({"command": format!("sleep {idle}"), "idle_timeout_ms": 500}))
        .await;
    assert_eq!(r["status"], "timed_out", "{r}");
    assert!(content(&r).contains("no output for 500 ms"), "{r}");
    assert!(content(&r).contains("waiting for input"), "{r}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_no_host_process(&format!("sleep {idle}"), "after the idle timeout").await;

    let slow = sleep_arg(31);
    let (r, took) = sh
        .shell(json!({"command": format!("sleep {slow}"), "timeout_ms": 1000}))
        .await;
    assert_eq!(r["status"], "timed_out", "{r}");
    assert!(content(&r).contains("timed out after 1000 ms"), "{r}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_no_host_process(&format!("sleep {slow}"), "after the timeout").await;

    // A command that ignores the signals it can catch and keeps printing: still stopped.
    let stubborn = sleep_arg(32);
    let (r, took) = sh
        .shell(json!({"command": format!("trap '' TERM INT HUP; while :; do sleep {stubborn}; done"), "timeout_ms": 1000}))
        .await;
    assert_eq!(r["status"], "timed_out", "{r}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_no_host_process(&format!("sleep {stubborn}"), "after the timeout").await;
    sh.assert_healthy().await;
}

// ---------------------------------------------------------------------------------------------
// 12. The timeout kills the whole tree
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_timeout_kills_the_whole_tree() {
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({})).await;
    let (a, b, c) = (sleep_arg(1240), sleep_arg(1241), sleep_arg(60));
    let cmd = format!("(sleep {a} &); setsid sleep {b} & sleep {c}");
    let (r, took) = sh.shell(json!({"command": cmd, "timeout_ms": 1000})).await;
    assert_eq!(r["status"], "timed_out", "{r}");
    assert!(content(&r).contains("timed out after 1000 ms"), "{r}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    for arg in [&a, &b, &c] {
        assert_no_host_process(&format!("sleep {arg}"), &cmd).await;
    }
    sh.assert_healthy().await;
}

// ---------------------------------------------------------------------------------------------
// 13. Background processes and session close
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_background_processes_do_not_outlive_session_close() {
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({})).await;
    let (arg, child_arg) = (sleep_arg(1250), sleep_arg(1251));
    let (r, took) = sh
        .shell(json!({"command": format!("(setsid sleep {child_arg} &); sleep {arg}"), "background": true}))
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(content(&r).contains("Started background process p1"), "{r}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let sleeper = wait_for_sleep(&arg)
        .await
        .expect("the background sleep runs on the host");
    let status = std::fs::read_to_string(format!("/proc/{sleeper}/status")).unwrap();
    assert!(
        status.lines().any(|l| l.starts_with("Uid:\t65534\t")),
        "the background process does not run as 65534: {status}"
    );
    assert!(
        wait_for_sleep(&child_arg).await.is_some(),
        "the setsid grandchild runs on the host"
    );
    sh.assert_healthy().await;

    let resp = app.delete(&format!("/v1/sessions/{}", sh.sid)).await;
    assert_eq!(resp.status(), 200);
    assert_no_host_process(&format!("sleep {arg}"), "after the session was closed").await;
    assert_no_host_process(
        &format!("sleep {child_arg}"),
        "after the session was closed",
    )
    .await;

    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 200);
    let fresh = Sh::new(&app, json!({})).await;
    fresh.assert_healthy().await;
}

// ---------------------------------------------------------------------------------------------
// 14. The service's session and controlling terminal
// ---------------------------------------------------------------------------------------------

/// Fields of `/proc/<pid>/stat` after the command name: state, ppid, pgrp, session, tty_nr, …
fn stat_fields(pid: &str) -> Vec<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    after.split_whitespace().map(str::to_owned).collect()
}

/// A sandboxed command must not share the service's session: if it did, it would have the
/// service's controlling terminal (when an operator runs the service from a shell) as
/// `/dev/tty`, and could type into that shell with `TIOCSTI` or read what the operator types
/// (the bubblewrap `--new-session` / CVE-2017-5226 class).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_the_services_session_and_terminal_are_out_of_reach() {
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({})).await;
    let arg = sleep_arg(1280);
    let (r, _) = sh
        .shell(json!({"command": format!("sleep {arg}"), "background": true}))
        .await;
    assert!(content(&r).contains("Started background process p1"), "{r}");
    let sleeper = wait_for_sleep(&arg)
        .await
        .expect("the background sleep runs on the host");
    let service = stat_fields("self");
    let sandboxed = stat_fields(&sleeper.to_string());
    // [3] is the session id, [4] the controlling terminal.
    eprintln!(
        "service: session {} tty {}; sandboxed sleep (pid {sleeper}): session {} tty {}",
        service[3], service[4], sandboxed[3], sandboxed[4]
    );

    // From inside: try to open the controlling terminal and push a character into its input.
    let r = sh
        .run(
            "python3 -c \"import os, fcntl, termios\nfd = os.open('/dev/tty', os.O_RDWR)\n\
             fcntl.ioctl(fd, termios.TIOCSTI, b'#')\nprint('INJECTED')\" 2>&1 | tail -n 1; \
             python3 -c 'import os; print(\"sid\", os.getsid(0))'",
        )
        .await;
    assert!(
        !stdout(&r).contains("INJECTED"),
        "the sandbox pushed input into the service's controlling terminal: {r}"
    );
    assert_ne!(
        sandboxed[3], service[3],
        "the sandboxed process (host pid {sleeper}) is in the service's session {}: it shares \
         its controlling terminal (tty_nr {}); the sandbox needs setsid() (bubblewrap's \
         --new-session) before the command runs. In the sandbox: {r}",
        service[3], service[4]
    );
    sh.assert_healthy().await;
}

// ---------------------------------------------------------------------------------------------
// 15. Inherited descriptors
// ---------------------------------------------------------------------------------------------

/// `fd -> target` of a host process's open descriptors.
fn host_fds(pid: i32) -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let mut fds: Vec<(String, String)> = entries
        .flatten()
        .map(|e| {
            let target = std::fs::read_link(e.path())
                .map(|t| t.display().to_string())
                .unwrap_or_default();
            (e.file_name().to_string_lossy().into_owned(), target)
        })
        .collect();
    fds.sort();
    fds
}

/// No descriptor of the service (its database connections, its listening socket, the data
/// directory, the cgroup files it writes) reaches a sandboxed command — nor any descriptor the
/// service itself inherited without close-on-exec (systemd socket activation, a supervisor's
/// pipe, `toolexec serve 9>>log`): Landlock does not restrict descriptors already open, so the
/// sandbox has to close everything above 2 before the command runs. This test fails wherever
/// the service (the test process) holds such a descriptor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_no_descriptor_of_the_service_is_inherited() {
    // A descriptor the service holds without close-on-exec (as a supervisor's pipe or a shell
    // redirection would be): it must not reach a command.
    let leak = std::fs::File::open("/etc/hostname").unwrap();
    rustix::io::fcntl_setfd(&leak, rustix::io::FdFlags::empty()).unwrap();
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({})).await;
    // Inside: what `ls` inherits (its own directory descriptor aside).
    let r = sh.run("ls -l /proc/self/fd/").await;
    assert_eq!(r["status"], "ok", "{r}");
    let fds: Vec<String> = stdout(&r)
        .lines()
        .filter_map(|l| l.split_once(" -> "))
        .filter_map(|(left, target)| {
            let fd = left.rsplit(' ').next()?;
            (!(fd == "3" && target.starts_with("/proc/"))).then(|| format!("{fd} -> {target}"))
        })
        .collect();
    assert!(
        fds.len() == 3
            && fds[0] == "0 -> /dev/null"
            && fds[1].starts_with("1 -> pipe:")
            && fds[2].starts_with("2 -> pipe:"),
        "a command inherits more than stdin/stdout/stderr: {fds:?}: {r}"
    );

    // Host side, for a foreground command while it runs.
    let fg = sleep_arg(1291);
    let run = sh.shell(json!({"command": format!("sleep {fg}"), "timeout_ms": 2000}));
    let look = async {
        let pid = wait_for_sleep(&fg).await;
        pid.map(|p| (p, host_fds(p)))
    };
    let ((r, _), seen) = tokio::join!(run, look);
    assert_eq!(r["status"], "timed_out", "{r}");
    let (pid, fds) = seen.expect("the foreground sleep ran on the host");
    eprintln!("sleep {fg} (host pid {pid}): {fds:?}");
    assert!(
        fds.len() == 3
            && fds[0].1 == "/dev/null"
            && fds[1].1.starts_with("pipe:")
            && fds[2].1.starts_with("pipe:"),
        "descriptors of a foreground command: {fds:?}"
    );

    // Host side, for a background command and every process of its tree.
    let arg = sleep_arg(1290);
    let (r, _) = sh
        .shell(json!({"command": format!("sleep {arg}"), "background": true}))
        .await;
    assert!(content(&r).contains("Started background process p1"), "{r}");
    let sleeper = wait_for_sleep(&arg)
        .await
        .expect("the background sleep runs on the host");
    let fds = host_fds(sleeper);
    eprintln!("sleep {arg} (host pid {sleeper}): {fds:?}");
    assert_eq!(fds.len(), 3, "{fds:?}");
    for (fd, target) in &fds {
        assert!(
            target.starts_with("pipe:"),
            "fd {fd} of the background command is {target}"
        );
    }
    for pid in host_processes_matching(&format!("sleep {arg}")) {
        let fds = host_fds(pid);
        eprintln!("{}: {fds:?}", describe_host_process(pid));
        for (fd, target) in &fds {
            assert!(
                target.starts_with("pipe:") || target == "/dev/null",
                "fd {fd} of {} is {target}",
                describe_host_process(pid)
            );
        }
    }
    sh.assert_healthy().await;
}

// ---------------------------------------------------------------------------------------------
// The session's environment: nothing runs before the sandbox exists
// ---------------------------------------------------------------------------------------------

/// Variables the dynamic loader and the C library act on before `main`.
const LOADER_VARIABLES: [&str; 19] = [
    "LD_PRELOAD",
    "LD_AUDIT",
    "LD_LIBRARY_PATH",
    "LD_DEBUG",
    "LD_DEBUG_OUTPUT",
    "LD_PROFILE",
    "LD_BIND_NOW",
    "LD_SHOW_AUXV",
    "LD_ORIGIN_PATH",
    "GLIBC_TUNABLES",
    "GCONV_PATH",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "MALLOC_CHECK_",
    "MALLOC_TRACE",
    "LOCALDOMAIN",
    "RES_OPTIONS",
    "TZDIR",
];

async fn loader_variables_are_refused(app: &TestApp) {
    for name in LOADER_VARIABLES {
        let resp = app
            .post(
                "/v1/sessions",
                &json!({"env": {name: "/workspace/x.so", "HARMLESS": "1"}}),
            )
            .await;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        assert_eq!(status, 422, "{name}: {body}");
        assert_eq!(body["code"], "invalid_env", "{name}: {body}");
        let detail = body["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(name), "{name}: {body}");
        assert!(
            detail.contains("in the command"),
            "says what to do instead: {body}"
        );
    }
    // Nothing was created by the refused requests, and ordinary variables are fine.
    let list: Value = app.get("/v1/sessions").await.json().await.unwrap();
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(0), "{list}");
    let sh = Sh::new(
        app,
        json!({"env": {"LDFLAGS": "-L/workspace/lib", "TMPDIR": "/tmp"}}),
    )
    .await;
    let r = sh.run("echo $TMPDIR $LDFLAGS").await;
    assert_eq!(stdout(&r), "/tmp -L/workspace/lib\n", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_loader_variables_in_a_session_env_are_refused_on_postgres() {
    loader_variables_are_refused(&spawn_app().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_loader_variables_in_a_session_env_are_refused_on_sqlite() {
    loader_variables_are_refused(&toolexec_tests::app::spawn_sqlite_app().await).await;
}

/// Host-side canaries for code that might run outside the sandbox: a loopback listener that
/// records whatever connects, and a marker path in a host directory the sandbox user could write.
struct Canaries {
    port: u16,
    hits: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    marker: std::path::PathBuf,
    listener: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Canaries {
    async fn start() -> Self {
        use tokio::io::AsyncReadExt;
        let canary = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = canary.local_addr().unwrap().port();
        let hits = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = hits.clone();
        let listener = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = canary.accept().await else {
                    return;
                };
                let mut text = String::new();
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), s.read_to_string(&mut text)).await;
                seen.lock().unwrap().push(text);
            }
        });
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        Self {
            port,
            hits,
            marker: dir.path().join("escaped"),
            listener,
            _dir: dir,
        }
    }
}

/// A shared library whose constructor tries everything a hostile tenant wants from code that
/// runs outside the sandbox: reach a host loopback listener, create a file at a host path, and
/// note the namespaces it ran in (in `/workspace/canary-ran`, which exists only inside).
/// `la_version` makes it loadable as an `LD_AUDIT` module too.
const CANARY_C: &str = r#"
#include <arpa/inet.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

__attribute__((constructor)) static void canary(void) {
    char ns[128] = {0};
    if (readlink("/proc/self/ns/pid", ns, sizeof ns - 1) < 0) strcpy(ns, "unknown");
    const char *marker = getenv("CANARY_MARKER");
    if (marker) {
        int fd = open(marker, O_WRONLY | O_CREAT | O_APPEND, 0666);
        if (fd >= 0) { dprintf(fd, "ran in %s\n", ns); close(fd); }
    }
    const char *port = getenv("CANARY_PORT");
    if (port) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_port = htons((unsigned short)atoi(port));
        a.sin_addr.s_addr = htonl(0x7f000001);
        if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0) write(s, ns, strlen(ns));
        if (s >= 0) close(s);
    }
    int fd = open("/workspace/canary-ran", O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd >= 0) { dprintf(fd, "%s\n", ns); close(fd); }
}

unsigned int la_version(unsigned int version) { return version; }
"#;

/// The attack of issue 8, end to end: session A builds a library in its workspace, session B
/// names it (by its host path) in loader variables of its environment and runs a command. The
/// API refuses such an environment; beneath that, the sandbox itself must never let the
/// variables reach a process outside it — checked by starting B's command through the real
/// sandbox with them set, and looking from the host: no connection to a loopback canary, no
/// marker file on the host, no trace of the library running anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_a_library_planted_by_another_session_never_runs_outside_the_sandbox() {
    let app = spawn_app().await;
    let a = Sh::new(&app, json!({"files": {"canary.c": CANARY_C}})).await;
    let r = a
        .run("gcc -shared -fPIC -o canary.so canary.c && cat /proc/1/cmdline | tr '\\0' ' '; echo; tr '\\0' '\\n' < /proc/1/environ | wc -c")
        .await;
    assert_eq!(r["status"], "ok", "the canary must build: {r}");
    let out = stdout(&r);
    let workspaces = app.config.workspace_root();
    let a_dir = workspaces.join(&a.sid);
    let library = a_dir.join("canary.so");
    assert!(library.is_file(), "{}", library.display());
    // pid 1 shows no host path (the old way to learn where a workspace lives), and holds no
    // environment at all.
    assert!(
        !out.contains(&workspaces.display().to_string()) && !out.contains("workspace"),
        "/proc/1/cmdline shows a host path: {r}"
    );
    assert_eq!(
        out.lines().nth(1),
        Some("0"),
        "/proc/1/environ is not empty: {r}"
    );

    // Host-side canaries: a loopback listener and a host directory the sandbox user could write.
    let canaries = Canaries::start().await;
    let (port, hits, marker) = (
        canaries.port,
        canaries.hits.clone(),
        canaries.marker.clone(),
    );
    let listener = &canaries.listener;
    let env = |extra: &[(&str, &str)]| -> Value {
        let mut e = serde_json::Map::new();
        e.insert("CANARY_PORT".into(), json!(port.to_string()));
        e.insert("CANARY_MARKER".into(), json!(marker.display().to_string()));
        for (k, v) in extra {
            e.insert((*k).into(), json!(v));
        }
        Value::Object(e)
    };
    let lib = library.display().to_string();

    // First layer: the API refuses the environment, and creates nothing.
    for name in ["LD_PRELOAD", "LD_AUDIT"] {
        let resp = app
            .post("/v1/sessions", &json!({"env": env(&[(name, &lib)])}))
            .await;
        assert_eq!(
            resp.status(),
            422,
            "{}",
            resp.text().await.unwrap_or_default()
        );
    }

    // The layer beneath: session B's command started through the real sandbox with the
    // variables set, as if the API had let them through.
    let b = Sh::new(&app, json!({})).await;
    let b_dir = workspaces.join(&b.sid);
    let sandbox =
        toolexec_sandbox::Sandbox::probe(toolexec_tests::app::sandbox_config(), &workspaces).await;
    assert!(sandbox.status().ready, "{:?}", sandbox.status());
    let table = toolexec_sandbox::ProcessTable::new(sandbox, b.sid.clone(), b_dir.clone(), 1);
    let limits = toolexec_sandbox::RunLimits {
        timeout: Duration::from_secs(20),
        idle_timeout: None,
        max_output_bytes: 1 << 20,
        cancel: Default::default(),
    };
    let attacks: [&[(&str, &str)]; 3] = [
        &[("LD_PRELOAD", &lib)],
        &[("LD_AUDIT", &lib)],
        &[
            ("LD_LIBRARY_PATH", a_dir.to_str().unwrap()),
            ("LD_PRELOAD", "canary.so"),
            ("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=1"),
        ],
    ];
    for attack in attacks {
        let vars: std::collections::BTreeMap<String, String> = env(attack)
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect();
        let f = table
            .run("", "echo hello", &vars, false, &limits)
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&f.stdout),
            "hello\n",
            "{attack:?}: {}",
            String::from_utf8_lossy(&f.stderr)
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        hits.lock().unwrap().is_empty(),
        "the canary was reached: {:?}",
        hits.lock().unwrap()
    );
    assert!(
        !marker.exists(),
        "code ran outside the sandbox: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    assert!(
        !b_dir.join("canary-ran").exists(),
        "the host path of A's library was loadable: {}",
        std::fs::read_to_string(b_dir.join("canary-ran")).unwrap_or_default()
    );

    // The control: the same library does load when a command inside the sandbox asks for it,
    // and runs in the sandbox's namespaces, where the canaries are out of reach. (So the checks
    // above would have seen it run.)
    std::fs::copy(&library, b_dir.join("canary.so")).unwrap();
    let r = b
        .shell(json!({"command": format!("CANARY_PORT={port} CANARY_MARKER={} LD_PRELOAD=/workspace/canary.so /bin/true && cat canary-ran", marker.display()), "timeout_ms": 20_000}))
        .await
        .0;
    assert_eq!(r["status"], "ok", "{r}");
    let ran_in = stdout(&r);
    let host_ns = std::fs::read_link("/proc/self/ns/pid").unwrap();
    assert!(ran_in.starts_with("pid:["), "{r}");
    assert!(
        !ran_in.contains(&host_ns.display().to_string()),
        "the library ran in the host's PID namespace: {r}"
    );
    assert!(
        hits.lock().unwrap().is_empty(),
        "{:?}",
        hits.lock().unwrap()
    );
    assert!(!marker.exists());
    listener.abort();
    b.assert_healthy().await;
}

/// Sets a session's stored environment behind the API's back, as a session recorded before
/// the API refused loader variables (or a bug in that check) would have it.
async fn force_session_env(app: &TestApp, sid: &str, env: &Value) {
    let id = uuid::Uuid::parse_str(sid).unwrap();
    match &app.db {
        Some(db) => {
            let pool = sqlx::PgPool::connect(db.url()).await.unwrap();
            sqlx::query("UPDATE sessions SET env = $1 WHERE id = $2")
                .bind(sqlx::types::Json(env))
                .bind(id)
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
        }
        None => {
            let path = app.config.data_dir.join("toolexec.db");
            let pool = sqlx::SqlitePool::connect(&format!("sqlite:{}", path.display()))
                .await
                .unwrap();
            let n = sqlx::query("UPDATE sessions SET env = ?1 WHERE id = ?2")
                .bind(env.to_string())
                .bind(id.as_bytes().as_slice())
                .execute(&pool)
                .await
                .unwrap()
                .rows_affected();
            assert_eq!(n, 1, "session {sid} not found in {}", path.display());
            pool.close().await;
        }
    }
}

/// Every loader and C-library variable, reaching a session's commands anyway (written into the
/// store behind the API), over HTTP: the library they name runs only inside the sandbox, never
/// before it exists. The library sits in a host directory bound read-only into every sandbox,
/// so it is loadable both outside and inside: the control that the variables did reach the
/// command (the library ran there, in the sandbox's namespaces) comes with every attack.
async fn loader_variables_run_nothing_outside(backend: toolexec_tests::app::Backend) {
    // Not under /tmp, which every sandbox replaces with its own.
    let shared = tempfile::Builder::new()
        .prefix("toolexec-canary-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(
        shared.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let shared_dir = shared.path().to_path_buf();
    let source = shared_dir.join("canary.c");
    std::fs::write(&source, CANARY_C).unwrap();
    let lib = shared_dir.join("canary.so");
    let built = std::process::Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&source)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    std::fs::set_permissions(&lib, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let bind = shared_dir.clone();
    let app = backend.spawn_with(|c| c.sandbox.ro_binds.push(bind)).await;

    let canaries = Canaries::start().await;
    let (port, hits, marker) = (
        canaries.port,
        canaries.hits.clone(),
        canaries.marker.clone(),
    );
    let listener = &canaries.listener;

    let lib_s = lib.display().to_string();
    let dir_s = shared_dir.display().to_string();
    // One session per loader that loads code, and one with every variable of the list set.
    let mut everything: Vec<(String, String)> = LOADER_VARIABLES
        .iter()
        .map(|n| ((*n).to_owned(), dir_s.clone()))
        .collect();
    everything.retain(|(n, _)| n != "LD_PRELOAD" && n != "LD_AUDIT" && n != "LD_DEBUG_OUTPUT");
    everything.push(("LD_PRELOAD".into(), lib_s.clone()));
    everything.push(("LD_DEBUG".into(), "libs".into()));
    everything.push(("LD_DEBUG_OUTPUT".into(), marker.display().to_string()));
    let attacks: Vec<(&str, Vec<(String, String)>)> = vec![
        ("LD_PRELOAD", vec![("LD_PRELOAD".into(), lib_s.clone())]),
        ("LD_AUDIT", vec![("LD_AUDIT".into(), lib_s.clone())]),
        (
            "LD_LIBRARY_PATH",
            vec![
                ("LD_LIBRARY_PATH".into(), dir_s.clone()),
                ("LD_PRELOAD".into(), "canary.so".into()),
            ],
        ),
        ("every variable", everything),
    ];
    let mut sessions = Vec::new();
    for (label, vars) in &attacks {
        let s = app.session(json!({})).await;
        let sid = s["id"].as_str().unwrap().to_owned();
        let mut env = serde_json::Map::new();
        env.insert("CANARY_PORT".into(), json!(port.to_string()));
        env.insert("CANARY_MARKER".into(), json!(marker.display().to_string()));
        for (k, v) in vars {
            env.insert(k.clone(), json!(v));
        }
        force_session_env(&app, &sid, &Value::Object(env)).await;
        sessions.push((label.to_owned(), sid));
    }
    // The runtimes cached at creation hold the environment as created: a restart reads the
    // sessions (and their forced environments) back from the store.
    let app = app.restart().await;
    let host_ns = std::fs::read_link("/proc/self/ns/pid")
        .unwrap()
        .display()
        .to_string();
    let workspaces = app.config.workspace_root();
    for (label, sid) in &sessions {
        let stored: Value = app
            .get(&format!("/v1/sessions/{sid}"))
            .await
            .json()
            .await
            .unwrap();
        assert!(
            stored["env"].as_object().unwrap().len() > 2,
            "{label}: the forced environment is not what the session has: {stored}"
        );
        let r = app
            .call(
                sid,
                "c1",
                "shell",
                json!({"command": "echo hello", "timeout_ms": 20_000}),
            )
            .await;
        assert_eq!(r["status"], "ok", "{label}: {r}");
        // (LD_DEBUG and LD_SHOW_AUXV, inside, print around it.)
        assert!(content(&r).contains("hello\n"), "{label}: {r}");
        let b = app
            .call(
                sid,
                "c2",
                "shell",
                json!({"command": "echo bg", "background": true}),
            )
            .await;
        assert_eq!(b["status"], "ok", "{label}: {b}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let ran =
            std::fs::read_to_string(workspaces.join(sid).join("canary-ran")).unwrap_or_default();
        // The control: the variables reached both commands, where the library ran.
        assert!(
            ran.lines().count() >= 2,
            "{label}: the variables never reached the command (control): {ran:?}"
        );
        for line in ran.lines() {
            assert!(line.starts_with("pid:["), "{label}: {ran:?}");
            assert_ne!(
                line, host_ns,
                "{label}: the library ran in the host's PID namespace"
            );
        }
    }
    assert!(
        hits.lock().unwrap().is_empty(),
        "a host loopback listener was reached: {:?}",
        hits.lock().unwrap()
    );
    assert!(
        !marker.exists(),
        "code ran outside the sandbox: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    listener.abort();
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 200);
}

toolexec_tests::on_both_stores!(loader_variables_run_nothing_outside);

/// Calls carry no environment of their own: `shell` takes none (a command sets variables for
/// itself, inside the sandbox), so a call's `env` is refused as an unknown argument.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_a_call_cannot_bring_an_environment() {
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({})).await;
    let r = sh
        .shell(json!({"command": "echo hi", "env": {"LD_PRELOAD": "/workspace/x.so"}}))
        .await
        .0;
    assert_eq!(r["status"], "invalid_arguments", "{r}");
    assert!(content(&r).contains("env"), "{r}");
}

// ---------------------------------------------------------------------------------------------
// 16. The resident sandbox: one agent per session, pid 1 of its sandbox
// ---------------------------------------------------------------------------------------------

/// Host pids of every process whose cgroup v2 path contains `needle`, found through the host's
/// `/proc` (not through the service).
fn host_pids_in_cgroups(needle: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| {
                c.lines()
                    .any(|l| l.starts_with("0::") && l.contains(needle))
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Every process of a session's resident sandbox (outer init, agent, spare, commands).
fn session_sandbox(sid: &str) -> Vec<i32> {
    host_pids_in_cgroups(&format!("/s-{sid}."))
}

/// A process's pids, outermost PID namespace first (`NSpid:`).
fn nspids(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|v| {
            v.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The host pid of a session's agent: the process that is pid 1 of the session's sandbox.
fn agent_of(sid: &str) -> Option<i32> {
    session_sandbox(sid)
        .into_iter()
        .find(|p| nspids(*p).last() == Some(&1) && nspids(*p).len() == 2)
}

/// `starttime` of `/proc/<pid>/stat`: with the pid, names one process even if the pid is reused.
fn start_time(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(19).map(str::to_owned)
}

/// Waits (up to 5 s) until none of these processes runs any more; those still running.
async fn wait_all_gone(procs: &[(i32, Option<String>)]) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<i32> = procs
            .iter()
            .filter(|(pid, start)| host_pid_alive(*pid) && start_time(*pid) == *start)
            .map(|(pid, _)| *pid)
            .collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn with_start_times(pids: &[i32]) -> Vec<(i32, Option<String>)> {
    pids.iter().map(|p| (*p, start_time(*p))).collect()
}

/// A command runs as the same uid as its session's agent, in the same namespaces: it must not
/// reach the agent by any way a same-uid process has — tracing it, its descriptors through
/// `/proc`, `pidfd_open`/`pidfd_getfd`/`kcmp`, signals, or its control socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_a_command_cannot_reach_its_sessions_agent() {
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({})).await;
    let r = sh.run("echo warm").await;
    assert_eq!(r["status"], "ok", "{r}");
    let agent = agent_of(&sh.sid).expect("the session's agent, seen from the host");
    let agent_start = start_time(agent);
    // The agent's control socket, as the host sees it.
    let control = std::fs::read_link(format!("/proc/{agent}/fd/3"))
        .expect("the agent's fd 3")
        .display()
        .to_string();
    assert!(control.starts_with("socket:["), "{control}");
    let status = std::fs::read_to_string(format!("/proc/{agent}/status")).unwrap();
    for want in ["CapEff:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"] {
        assert!(status.contains(want), "the agent lacks {want:?}: {status}");
    }

    let py = |code: &str| format!("python3 -c \"{code}\"");
    // Each prints "<result> <errno>"; the syscalls must fail with EPERM (1) from seccomp before
    // the kernel even looks at their arguments.
    let sys = |nr: u32, args: &str| {
        py(&format!(
            "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.syscall({nr}, {args}), ctypes.get_errno())"
        ))
    };
    let calls = [
        (
            "ptrace_attach_1",
            py(
                "import ctypes; l = ctypes.CDLL(None, use_errno=True); print(l.ptrace(16, 1, 0, 0), ctypes.get_errno())",
            ),
        ),
        ("pidfd_open_1", sys(434, "1, 0")),
        ("pidfd_getfd", sys(438, "0, 3, 0")),
        ("kcmp", sys(312, "1, 1, 0, 3, 3")),
        ("process_vm_readv", sys(310, "1, 0, 0, 0, 0, 0")),
    ];
    let mut script = String::new();
    for (label, cmd) in &calls {
        script.push_str(&format!("echo \"@@{label}:$({cmd} 2>&1 | tail -n 1)\"\n"));
    }
    let denied = [
        ("fdlist", "ls /proc/1/fd".to_owned()),
        ("fdinfo", "cat /proc/1/fdinfo/3".to_owned()),
        ("fdwrite", "echo hello > /proc/1/fd/3".to_owned()),
        ("fdopen", "exec 7<>/proc/1/fd/3".to_owned()),
        ("mem", "head -c 1 /proc/1/mem".to_owned()),
        ("environ", "head -c 1 /proc/1/environ".to_owned()),
        ("root", "ls /proc/1/root/".to_owned()),
    ];
    for (label, cmd) in &denied {
        script.push_str(&attempt(label, cmd));
    }
    for sig in ["TERM", "KILL", "SEGV", "HUP", "USR1", "STOP", "INT", "CHLD"] {
        script.push_str(&attempt(&format!("sig{sig}"), &format!("kill -{sig} 1")));
    }
    script.push_str("kill -9 -1; echo still-here\n");
    let r = sh.run(&script).await;
    let out = stdout(&r);
    assert!(out.contains("still-here"), "{r}");
    for (label, _) in &calls {
        assert_eq!(
            attempt_result(&out, label),
            "-1 1",
            "{label} must fail with EPERM: {r}"
        );
    }
    for (label, cmd) in &denied {
        let res = attempt_result(&out, label);
        assert!(
            res.starts_with("denied"),
            "{cmd:?} was allowed ({res}): {r}"
        );
    }
    for sig in ["TERM", "KILL", "SEGV", "HUP", "USR1", "STOP", "INT", "CHLD"] {
        let res = attempt_result(&out, &format!("sig{sig}"));
        assert!(res.starts_with("denied"), "kill -{sig} 1: {res}: {r}");
    }

    // Host side: the same agent, alive, not stopped; no other process of the sandbox holds its
    // control socket (commands and spares have their own; the outer init closed it).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(agent_of(&sh.sid), Some(agent), "the agent changed");
    assert_eq!(start_time(agent), agent_start);
    let state = std::fs::read_to_string(format!("/proc/{agent}/status")).unwrap();
    assert!(
        state.lines().any(|l| l == "State:\tS (sleeping)"),
        "the agent is not simply waiting: {state}"
    );
    let bg = sleep_arg(1300);
    let (r, _) = sh
        .shell(json!({"command": format!("sleep {bg}"), "background": true}))
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    wait_for_sleep(&bg).await.expect("the background sleep");
    for pid in session_sandbox(&sh.sid) {
        if pid == agent {
            continue;
        }
        let fds = host_fds(pid);
        assert!(
            fds.iter().all(|(_, target)| *target != control),
            "{} holds the agent's control socket {control}: {fds:?}",
            describe_host_process(pid)
        );
    }
    sh.assert_healthy().await;
    assert_eq!(agent_of(&sh.sid), Some(agent), "a second agent was started");
}

/// The agent killed from the host while a command runs: that command fails with an
/// infrastructure error at once (not at its timeout), the session's background process is
/// reported stopped, every process of the old sandbox is gone, and the next command gets a fresh
/// sandbox (a new agent, an empty /tmp).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_an_agent_killed_fails_its_command_and_the_next_gets_a_fresh_sandbox() {
    let app = spawn_app().await;
    let sh = Sh::new(&app, json!({})).await;
    let r = sh.run("echo kept > /tmp/marker; cat /tmp/marker").await;
    assert_eq!(stdout(&r), "kept\n", "{r}");
    let r = sh.run("cat /tmp/marker").await;
    assert_eq!(
        stdout(&r),
        "kept\n",
        "/tmp lasts as long as the session's sandbox: {r}"
    );
    let bg = sleep_arg(1310);
    let (r, _) = sh
        .shell(json!({"command": format!("sleep {bg}"), "background": true}))
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let agent = agent_of(&sh.sid).expect("the session's agent");
    let old = with_start_times(&session_sandbox(&sh.sid));
    let fg = sleep_arg(1311);
    let run = sh.shell(json!({"command": format!("sleep {fg}; echo never"), "timeout_ms": 60_000}));
    let kill = async {
        wait_for_sleep(&fg).await.expect("the foreground sleep");
        rustix::process::kill_process(
            rustix::process::Pid::from_raw(agent).unwrap(),
            rustix::process::Signal::KILL,
        )
        .unwrap();
    };
    let ((r, took), ()) = tokio::join!(run, kill);
    assert_eq!(r["status"], "error", "{r}");
    let c = content(&r);
    assert!(
        c.contains("Infrastructure error") && c.contains("sandbox stopped"),
        "{r}"
    );
    assert!(
        c.contains("killed by signal 9"),
        "says how the agent ended: {r}"
    );
    assert!(!c.contains("never"), "{r}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let left = wait_all_gone(&old).await;
    assert!(
        left.is_empty(),
        "processes of the killed sandbox still run:\n{}",
        toolexec_tests::procs::describe_all(&left)
    );
    let read = sh
        .app
        .call(
            &sh.sid,
            "read-bg",
            "process_read",
            json!({"process_id": "p1"}),
        )
        .await;
    assert!(
        content(&read).contains("stopped by the session's sandbox stopping"),
        "{read}"
    );

    let r = sh.run("cat /tmp/marker; echo rc=$?").await;
    assert!(
        stdout(&r).contains("rc=1"),
        "/tmp of the old sandbox survived: {r}"
    );
    let fresh = agent_of(&sh.sid).expect("a fresh agent");
    assert_ne!(fresh, agent);
    sh.assert_healthy().await;
}

/// The agent chosen by the kernel's OOM killer: the command that ran the session out of memory
/// fails with an infrastructure error, and the next command runs in a fresh sandbox. The memory
/// is the session's own `/tmp` (a tmpfs, charged to the session's memory cgroup for as long as
/// its sandbox lives, in no process's resident set), so killing processes frees nothing until
/// the agent goes; the agent is made the OOM killer's first choice from the host, so that the
/// test does not depend on its order among the sandbox's small processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_an_agent_killed_by_the_oom_killer_is_replaced() {
    let app = spawn_app_with(|c| c.sandbox.memory_bytes = 128 * 1024 * 1024).await;
    let sh = Sh::new(&app, json!({})).await;
    let r = sh.run("echo warm").await;
    assert_eq!(r["status"], "ok", "{r}");
    let agent = agent_of(&sh.sid).expect("the session's agent");
    std::fs::write(format!("/proc/{agent}/oom_score_adj"), "1000").unwrap();
    let (r, took) = sh
        .shell(json!({"command": "head -c 200000000 /dev/zero > /tmp/fill; echo wrote", "timeout_ms": 30_000}))
        .await;
    assert_eq!(r["status"], "error", "{r}");
    assert!(content(&r).contains("sandbox stopped"), "{r}");
    assert_eq!(stdout(&r), "", "{r}");
    assert!(took < Duration::from_secs(25), "took {took:?}");
    assert!(
        !host_pid_alive(agent) || agent_of(&sh.sid) != Some(agent),
        "the agent survived"
    );
    let memory = find_file(
        Path::new("/sys/fs/cgroup/memory"),
        &format!("s-{}", sh.sid),
        6,
    )
    .expect("the session's memory cgroup");
    let oom = std::fs::read_to_string(memory.join("memory.oom_control")).unwrap();
    assert!(
        oom.lines()
            .any(|l| l.starts_with("oom_kill ") && l != "oom_kill 0"),
        "{oom}"
    );
    sh.assert_healthy().await;
    assert_ne!(agent_of(&sh.sid), Some(agent));
}

/// Two sessions run commands at the same time, each in its own sandbox: neither sees the
/// other's /tmp, processes or agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_two_sessions_run_commands_at_once_and_share_nothing() {
    let app = spawn_app().await;
    let a = Sh::new(&app, json!({})).await;
    let b = Sh::new(&app, json!({})).await;
    // The same `sleep` in both: a session that saw the other's would count two.
    let nap = sleep_arg(3);
    let script = |me: &str| {
        format!(
            "echo {me} > /tmp/who-{me}; (sleep {nap} &); sleep 1; cat /tmp/who-*; ls /tmp; \
             ps -e -o args= | grep -c '^sleep {nap}'; readlink /proc/self/ns/pid /proc/self/ns/mnt /proc/self/ns/net"
        )
    };
    let t0 = Instant::now();
    let ((ra, _), (rb, _)) = tokio::join!(
        a.shell(json!({"command": script("A"), "timeout_ms": 20_000})),
        b.shell(json!({"command": script("B"), "timeout_ms": 20_000}))
    );
    let took = t0.elapsed();
    assert_eq!(ra["status"], "ok", "{ra}");
    assert_eq!(rb["status"], "ok", "{rb}");
    let (oa, ob) = (stdout(&ra), stdout(&rb));
    assert!(oa.starts_with("A\nwho-A\n"), "{ra}");
    assert!(ob.starts_with("B\nwho-B\n"), "{rb}");
    assert!(!oa.contains("who-B") && !ob.contains("who-A"), "{ra} {rb}");
    // Each sees its own sleep, not the other session's.
    assert!(oa.contains("\n1\n") && ob.contains("\n1\n"), "{ra} {rb}");
    let ns = |o: &str| -> Vec<String> { o.lines().rev().take(3).map(str::to_owned).collect() };
    for (x, y) in ns(&oa).iter().zip(ns(&ob).iter()) {
        assert_ne!(x, y, "the sessions share a namespace: {ra} {rb}");
    }
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let (aa, ab) = (agent_of(&a.sid).unwrap(), agent_of(&b.sid).unwrap());
    assert_ne!(aa, ab);
    for ns in ["pid", "mnt", "net", "user", "ipc", "uts"] {
        let la = std::fs::read_link(format!("/proc/{aa}/ns/{ns}")).unwrap();
        let lb = std::fs::read_link(format!("/proc/{ab}/ns/{ns}")).unwrap();
        assert_ne!(la, lb, "the agents share a {ns} namespace");
    }
    a.assert_healthy().await;
    b.assert_healthy().await;
}

/// The descriptors the test process (the service) has open, and how many are inotify
/// instances.
fn service_fds() -> (usize, usize) {
    let fds = host_fds(std::process::id() as i32);
    let inotify = fds
        .iter()
        .filter(|(_, t)| t == "anon_inode:inotify")
        .count();
    (fds.len(), inotify)
}

/// The service's descriptors by kind (`socket`, `anon_inode:[pidfd]`, a path's first
/// component, …).
fn service_fd_kinds() -> std::collections::BTreeMap<String, usize> {
    let mut kinds = std::collections::BTreeMap::new();
    for (_, target) in host_fds(std::process::id() as i32) {
        let kind = match target.split_once(':') {
            Some((k, _)) if !target.starts_with('/') => k.to_owned(),
            _ => target
                .split('/')
                .nth(1)
                .map_or_else(|| target.clone(), |c| format!("/{c}")),
        };
        *kinds.entry(kind).or_insert(0) += 1;
    }
    kinds
}

/// Directories beneath this process's own cgroups (v2 and the v1 controllers sessions use).
fn own_cgroup_dirs() -> usize {
    fn count(dir: &Path) -> usize {
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| 1 + count(&e.path()))
                    .sum()
            })
            .unwrap_or(0)
    }
    let prefix = format!("toolexec-{}-", std::process::id());
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let mut total = 0;
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (
            parts.next(),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        let mount = match ctrls {
            "" => "/sys/fs/cgroup/unified",
            "pids" | "memory" | "cpu" => &format!("/sys/fs/cgroup/{ctrls}"),
            _ => continue,
        };
        let parent = Path::new(mount).join(path.trim_start_matches('/'));
        for e in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                total += count(&e.path());
            }
        }
    }
    total
}

/// Resident set of a process, KiB (and its proportional share, where the kernel reports it).
fn rss_kib(pid: i32) -> (u64, u64) {
    let field = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    (field(&status, "VmRSS:"), field(&rollup, "Pss:"))
}

/// 200 sessions, each with its resident sandbox, from the host: processes, memory, the
/// service's descriptors and inotify instances, and cgroups grow by a small constant per
/// session, the sandboxes hold no inotify instance and no descriptor of the service; closing the
/// sessions takes every process and cgroup back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_two_hundred_sessions_each_keep_a_small_sandbox_and_give_it_all_back() {
    const SESSIONS: usize = 200;
    let app = spawn_app().await;
    let (fds_before, inotify_before) = service_fds();
    let kinds_before = service_fd_kinds();
    let cgroups_before = own_cgroup_dirs();
    let t0 = Instant::now();
    let mut sids = Vec::new();
    for chunk in 0..SESSIONS / 8 {
        let made = sessions_with_a_command(&app, 8, chunk).await;
        sids.extend(made);
    }
    let took = t0.elapsed();
    let (fds_after, inotify_after) = service_fds();
    let kinds_after = service_fd_kinds();
    let cgroups_after = own_cgroup_dirs();
    let mut procs = Vec::new();
    let (mut rss, mut pss) = (0u64, 0u64);
    let mut per_session = std::collections::BTreeMap::<usize, usize>::new();
    for sid in &sids {
        let pids = session_sandbox(sid);
        *per_session.entry(pids.len()).or_default() += 1;
        for pid in &pids {
            let (r, p) = rss_kib(*pid);
            rss += r;
            pss += p;
            let fds = host_fds(*pid);
            assert!(
                fds.iter().all(|(_, t)| t != "anon_inode:inotify"),
                "{} holds an inotify instance",
                describe_host_process(*pid)
            );
            assert!(fds.len() <= 6, "{}: {fds:?}", describe_host_process(*pid));
        }
        procs.extend(pids);
    }
    let n = SESSIONS as f64;
    eprintln!(
        "{SESSIONS} sessions, each with a resident sandbox, made and used in {took:?}: \
         sandbox processes {} ({per_session:?} sessions by processes each); RSS {} MiB ({:.0} KiB per session), \
         PSS {} MiB ({:.0} KiB per session); service descriptors {fds_before} -> {fds_after} ({:.2} per session); \
         service inotify instances {inotify_before} -> {inotify_after}; cgroup directories {cgroups_before} -> {cgroups_after} ({:.1} per session); \
         service descriptors by kind {kinds_before:?} -> {kinds_after:?}",
        procs.len(),
        rss / 1024,
        rss as f64 / n,
        pss / 1024,
        pss as f64 / n,
        (fds_after as f64 - fds_before as f64) / n,
        (cgroups_after as f64 - cgroups_before as f64) / n,
    );
    // Outer init, agent, the spare for the next command.
    assert_eq!(
        per_session.keys().copied().collect::<Vec<_>>(),
        vec![3],
        "{per_session:?}"
    );
    assert!(
        pss as f64 / n <= 2048.0,
        "{:.0} KiB proportional memory per session",
        pss as f64 / n
    );
    // Per session: its workspace directory and a share of the scan's inotify pool (the
    // engine's), the agent's control socket, the spare's socket, the outer init's pidfd.
    assert!(
        fds_after <= fds_before + 5 * SESSIONS,
        "service descriptors {fds_before} -> {fds_after}: {kinds_after:?}"
    );
    // Three v1 limit cgroups, the v2 subtree with agent/, the spare's and one kept empty.
    assert!(
        cgroups_after <= cgroups_before + 8 * SESSIONS,
        "cgroups {cgroups_before} -> {cgroups_after}"
    );
    assert!(
        inotify_after <= inotify_before + SESSIONS,
        "{inotify_before} -> {inotify_after}"
    );

    let old = with_start_times(&procs);
    for sid in &sids {
        let resp = app.delete(&format!("/v1/sessions/{sid}")).await;
        assert_eq!(resp.status(), 200);
    }
    let left = wait_all_gone(&old).await;
    assert!(
        left.is_empty(),
        "{} processes of closed sessions' sandboxes still run:\n{}",
        left.len(),
        toolexec_tests::procs::describe_all(&left[..left.len().min(10)])
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while own_cgroup_dirs() > cgroups_before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        own_cgroup_dirs(),
        cgroups_before,
        "cgroups of closed sessions remain"
    );
    let (fds_closed, _) = service_fds();
    let kinds_closed = service_fd_kinds();
    eprintln!(
        "after closing them: service descriptors {fds_closed} {kinds_closed:?}, cgroup directories {}",
        own_cgroup_dirs()
    );
    // What stays is the service's own (pooled HTTP and database connections, the scan's
    // inotify pool), not one descriptor per closed session.
    assert!(
        fds_closed <= fds_before + 64 + 40,
        "descriptors {fds_before} -> {fds_closed} after closing every session: {kinds_closed:?}"
    );
    let pidfds =
        |k: &std::collections::BTreeMap<String, usize>| k.get("anon_inode").copied().unwrap_or(0);
    assert!(
        pidfds(&kinds_closed) <= pidfds(&kinds_before) + 64,
        "{kinds_before:?} -> {kinds_closed:?}"
    );
}

/// Makes `n` sessions at once and runs a command in each; their ids.
async fn sessions_with_a_command(app: &TestApp, n: usize, chunk: usize) -> Vec<String> {
    let mut tasks = Vec::new();
    for i in 0..n {
        let http = app.http.clone();
        let base = app.base.clone();
        tasks.push(tokio::spawn(async move {
            let s: Value = http
                .post(format!("{base}/v1/sessions"))
                .json(&json!({}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let sid = s["id"].as_str().unwrap().to_owned();
            let r: Value = http
                .post(format!("{base}/v1/sessions/{sid}/calls"))
                .json(&json!({"calls": [{"id": format!("c{chunk}-{i}"), "name": "shell", "arguments": {"command": "echo ok"}}]}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(r["results"][0]["status"], "ok", "{r}");
            sid
        }));
    }
    let mut sids = Vec::new();
    for t in tasks {
        sids.push(t.await.unwrap());
    }
    sids
}

/// Agents from the host's view across the service's life: closing a session leaves nothing of
/// its sandbox; a `kill -9` of the service leaves no agent running (PDEATHSIG chain), and its
/// restart removes the dead instance's cgroups and serves the session in a fresh sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_escape_no_agent_outlives_its_session_or_a_killed_service() {
    use toolexec_tests::binary::{serve, toolexec};
    let data = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        data.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let start = || {
        let mut cmd = toolexec(data.path());
        cmd.arg("serve")
            .env("TOOLEXEC_BIND", "127.0.0.1:0")
            .env("TOOLEXEC_DATA_DIR", data.path())
            .env("TOOLEXEC_LOG_FORMAT", "json");
        serve(cmd)
    };
    toolexec_tools::web::install_tls_provider();
    let http = reqwest::Client::new();
    let session = |base: String| {
        let http = http.clone();
        async move {
            let s: Value = http
                .post(format!("{base}/v1/sessions"))
                .json(&json!({}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            s["id"].as_str().unwrap().to_owned()
        }
    };
    let call = |base: String, sid: String, id: &'static str, args: Value| {
        let http = http.clone();
        async move {
            let r: Value = http
                .post(format!("{base}/v1/sessions/{sid}/calls"))
                .json(&json!({"calls": [{"id": id, "name": "shell", "arguments": args}]}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            r["results"][0].clone()
        }
    };
    let mut served = start();
    let service_pid = served.child.id() as i32;
    let instance = format!("/toolexec-{service_pid}-");

    // Closing a session: nothing of its sandbox is left.
    let closed = session(served.base.clone()).await;
    let r = call(
        served.base.clone(),
        closed.clone(),
        "c1",
        json!({"command": "echo hi"}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    let procs = with_start_times(&session_sandbox(&closed));
    assert_eq!(procs.len(), 3, "outer init, agent, spare: {procs:?}");
    let resp = http
        .delete(format!("{}/v1/sessions/{closed}", served.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        wait_all_gone(&procs).await.is_empty(),
        "the closed session's sandbox still runs"
    );

    // A killed service: no agent survives it.
    let sid = session(served.base.clone()).await;
    let arg = sleep_arg(1320);
    let r = call(
        served.base.clone(),
        sid.clone(),
        "c1",
        json!({"command": format!("sleep {arg}"), "background": true}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    wait_for_sleep(&arg).await.expect("the background sleep");
    let running = host_pids_in_cgroups(&instance);
    assert!(
        running.iter().any(|p| nspids(*p).last() == Some(&1)),
        "no agent among {running:?}"
    );
    let procs = with_start_times(&running);
    served.child.kill().unwrap();
    served.child.wait().unwrap();
    let left = wait_all_gone(&procs).await;
    assert!(
        left.is_empty(),
        "sandbox processes outlived the killed service:\n{}",
        toolexec_tests::procs::describe_all(&left)
    );
    let v2_dirs = |needle: &str| -> Vec<PathBuf> {
        std::fs::read_dir("/sys/fs/cgroup/unified")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.display().to_string().contains(needle))
            .collect()
    };
    drop(served);

    // The restart removes the dead instance's cgroups and runs the session in a fresh sandbox.
    let served = start();
    assert!(
        v2_dirs(&instance).is_empty(),
        "cgroups of the killed instance remain: {:?}",
        v2_dirs(&instance)
    );
    let r = call(
        served.base.clone(),
        sid.clone(),
        "c2",
        json!({"command": "echo again"}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(agent_of(&sid).is_some());
    assert_no_host_process(&format!("sleep {arg}"), "after the restart").await;
    drop(served);
}
