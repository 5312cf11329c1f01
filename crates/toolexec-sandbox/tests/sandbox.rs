//! The sandbox on its own: the start-up probe, the init run by a non-root service, and setup
//! failures that must stop the command from running.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use toolexec_sandbox::init::{InitLimits, Spec};
use toolexec_sandbox::{ProcessTable, RunLimits, Sandbox, SandboxConfig};

/// The static init the crate embeds (build.rs), as a file, for running it by hand.
const INIT: &str = env!("TOOLEXEC_STATIC_INIT");

fn config() -> SandboxConfig {
    SandboxConfig::default()
}

fn open_dir(owner: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(dir.path(), Some(owner), Some(owner)).unwrap();
    dir
}

/// A directory beneath `parent`, owned by `owner`.
fn sub_dir(parent: &Path, name: &str, owner: u32) -> PathBuf {
    let dir = parent.join(name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&dir, Some(owner), Some(owner)).unwrap();
    dir
}

/// Runs the static init by hand as `uid` the way the service does: no arguments, an empty
/// environment, the spec on fd 4 and the workspace root on fd 5 (set up by bash, which then
/// replaces itself with the init and an empty environment).
fn run_init_as(uid: u32, root: &Path, spec: &[u8]) -> std::process::Output {
    let spec_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(spec_file.path(), spec).unwrap();
    std::fs::set_permissions(spec_file.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .args([
            "--clear-groups",
            "/bin/bash",
            "-c",
            r#"exec -c "$0" 4<"$1" 5<"$2""#,
            INIT,
        ])
        .arg(spec_file.path())
        .arg(root)
        .env_clear()
        .output()
        .unwrap()
}

fn bash_spec(workspace: &str, script: &str) -> Spec {
    Spec {
        workspace: workspace.as_bytes().to_vec(),
        workdir: Vec::new(),
        tmp_size: 1 << 20,
        ro: vec![b"/etc".to_vec()],
        egress_socket: None,
        limits: InitLimits {
            cpu_seconds: 10,
            file_size_bytes: 1 << 20,
            open_files: 64,
            address_space_bytes: 0,
        },
        argv: vec![
            b"/bin/bash".to_vec(),
            b"-c".to_vec(),
            script.as_bytes().to_vec(),
        ],
        env: vec![(b"PATH".to_vec(), b"/usr/bin:/bin".to_vec())],
        agent: false,
        image: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_finds_every_layer_and_a_command_runs_as_the_sandbox_user() {
    let root = open_dir(0);
    let sandbox = Sandbox::probe(config(), root.path()).await;
    let status = sandbox.status();
    assert!(status.ready, "{status:?}");
    assert_eq!(status.mode, "enforced");
    for layer in [
        "uid 65534",
        "no capabilities",
        "no_new_privs",
        "Landlock",
        "seccomp",
        "cgroup.kill",
    ] {
        assert!(
            status.detail.contains(layer),
            "{layer} missing from {}",
            status.detail
        );
    }
    let ws = sub_dir(root.path(), "t1", 65534);
    let table = ProcessTable::new(sandbox.clone(), "t1", ws.clone(), 1);
    let limits = RunLimits {
        timeout: Duration::from_secs(10),
        idle_timeout: None,
        max_output_bytes: 1 << 20,
        cancel: Default::default(),
    };
    let f = table
        .run(
            "",
            "id -u; echo hi > f; cat f",
            &BTreeMap::new(),
            false,
            &limits,
        )
        .await
        .unwrap();
    assert_eq!(
        f.exit_code,
        Some(0),
        "{}",
        String::from_utf8_lossy(&f.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&f.stdout), "65534\nhi\n");
    // The probe's own directory is gone again.
    let left: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("t1")]);
}

/// A cancelled command stops at once, whatever its timeout: its whole tree is killed (the
/// cgroup is empty), and what it printed before comes back with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_command_dies_with_its_tree_and_keeps_its_output() {
    let root = open_dir(0);
    let sandbox = Sandbox::probe(config(), root.path()).await;
    assert!(sandbox.status().ready, "{:?}", sandbox.status());
    let ws = sub_dir(root.path(), "t1", 65534);
    let table = ProcessTable::new(sandbox.clone(), "t1", ws.clone(), 1);
    let cancel = tokio_util::sync::CancellationToken::new();
    let limits = RunLimits {
        timeout: Duration::from_secs(300),
        idle_timeout: None,
        max_output_bytes: 1 << 20,
        cancel: cancel.clone(),
    };
    let canceller = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            cancel.cancel();
        })
    };
    // Durations unique to this test process, to find its sleeps in the host's /proc.
    let args: Vec<String> = (1..=3)
        .map(|n| format!("30{n}.{}", std::process::id()))
        .collect();
    let command = format!(
        "echo before; echo err >&2; (sleep {} &); setsid sleep {} & sleep {}; echo after",
        args[0], args[1], args[2]
    );
    let t0 = std::time::Instant::now();
    let f = table
        .run("", &command, &BTreeMap::new(), false, &limits)
        .await
        .unwrap();
    canceller.await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    assert_eq!(f.killed, Some(toolexec_sandbox::KillReason::Cancelled));
    assert_eq!(String::from_utf8_lossy(&f.stdout), "before\n");
    assert_eq!(String::from_utf8_lossy(&f.stderr), "err\n");
    for arg in &args {
        let want = format!("sleep\0{arg}\0");
        let alive: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want.as_bytes()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(alive.is_empty(), "sleep {arg} still runs: pids {alive:?}");
    }
}

/// A service that does not run as root starts the init as itself: the sandbox must still leave
/// the command without capabilities, with its filters, unable to read what the user cannot and
/// to write outside /workspace and /tmp.
#[test]
fn a_non_root_service_gets_the_same_sandbox_under_its_own_uid() {
    let root = open_dir(10001);
    sub_dir(root.path(), "ws", 10001);
    let outside = open_dir(10001);
    let script = format!(
        "id -u; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; \
         cat /etc/shadow >/dev/null 2>&1 && echo shadow-read; \
         touch {outside}/escaped 2>/dev/null && echo outside-written; \
         ls {outside} >/dev/null 2>&1 && echo outside-visible; \
         touch /workspace/inside /tmp/t && echo inside-written; \
         ps -e --no-headers | wc -l",
        outside = outside.path().display()
    );
    let out = run_init_as(
        10001,
        root.path(),
        &bash_spec("ws", &script).encode().unwrap(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "10001");
    assert!(stdout.contains("CapEff:\t0000000000000000"), "{stdout}");
    assert!(stdout.contains("CapBnd:\t0000000000000000"), "{stdout}");
    assert!(stdout.contains("NoNewPrivs:\t1"), "{stdout}");
    assert!(stdout.contains("Seccomp:\t2"), "{stdout}");
    assert!(!stdout.contains("shadow-read"), "{stdout}");
    // The host directory is not even mounted in the sandbox.
    assert!(
        !stdout.contains("outside-written") && !stdout.contains("outside-visible"),
        "{stdout}"
    );
    assert!(!outside.path().join("escaped").exists());
    assert!(stdout.contains("inside-written"), "{stdout}");
    assert!(root.path().join("ws/inside").exists());
    // pid 1 (the init), bash, ps and wc: nothing of the host.
    let processes: usize = lines.last().unwrap().trim().parse().unwrap();
    assert!(processes <= 4, "{stdout}");
}

#[test]
fn a_layer_that_cannot_be_set_up_stops_the_command() {
    let root = open_dir(10001);
    let out = run_init_as(
        10001,
        root.path(),
        &bash_spec("nonexistent-workspace", "echo ran")
            .encode()
            .unwrap(),
    );
    assert_eq!(
        out.status.code(),
        Some(toolexec_sandbox::init::SETUP_FAILED)
    );
    assert!(out.stdout.is_empty(), "the command must not run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(toolexec_sandbox::init::ERROR_PREFIX),
        "{stderr}"
    );
    assert!(stderr.contains("nonexistent-workspace"), "{stderr}");
    // A spec it cannot read, or none at all.
    for spec in [&b"cpu=many\0"[..], b""] {
        let bad = run_init_as(10001, root.path(), spec);
        assert_eq!(
            bad.status.code(),
            Some(toolexec_sandbox::init::SETUP_FAILED),
            "{}",
            String::from_utf8_lossy(&bad.stderr)
        );
        assert!(bad.stdout.is_empty());
    }
}

/// The workspace root is handed to the init as a descriptor: a data directory the sandbox user
/// cannot enter (`mktemp -d` makes it 0700) still works, as long as the root itself is
/// searchable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_root_under_a_private_directory_still_works() {
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let root = sub_dir(private.path(), "workspaces", 0);
    let sandbox = Sandbox::probe(config(), &root).await;
    assert!(sandbox.status().ready, "{:?}", sandbox.status());
    let ws = sub_dir(&root, "s1", 65534);
    let table = ProcessTable::new(sandbox.clone(), "s1", ws.clone(), 1);
    let limits = RunLimits {
        timeout: Duration::from_secs(10),
        idle_timeout: None,
        max_output_bytes: 1 << 20,
        cancel: Default::default(),
    };
    let f = table
        .run(
            "",
            "echo hi > f; cat /proc/1/cmdline | tr '\\0' ' '",
            &BTreeMap::new(),
            false,
            &limits,
        )
        .await
        .unwrap();
    assert_eq!(
        f.exit_code,
        Some(0),
        "{}",
        String::from_utf8_lossy(&f.stderr)
    );
    assert_eq!(std::fs::read_to_string(ws.join("f")).unwrap(), "hi\n");
    // pid 1 shows its name only: no host path, no arguments.
    assert_eq!(
        String::from_utf8_lossy(&f.stdout).trim(),
        "toolexec-sandbox-init"
    );
}

/// An operator-supplied init is copied into a sealed memfd from wherever it is (a build under a
/// private directory works); a dynamically linked one is refused at start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_init_must_be_static() {
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let init = private.path().join("toolexec-sandbox-init");
    std::fs::copy(INIT, &init).unwrap();
    let root = open_dir(0);
    let sandbox = Sandbox::probe(
        SandboxConfig {
            init: Some(init),
            ..SandboxConfig::default()
        },
        root.path(),
    )
    .await;
    assert!(sandbox.status().ready, "{:?}", sandbox.status());
    let dynamic = Sandbox::probe(
        SandboxConfig {
            init: Some(PathBuf::from("/bin/bash")),
            ..SandboxConfig::default()
        },
        root.path(),
    )
    .await;
    let status = dynamic.status();
    assert!(!status.ready);
    assert!(status.detail.contains("dynamically linked"), "{status:?}");
}

/// A crashed instance leaves its cgroups behind; the next start kills what is in them and
/// removes them (only those of instances that are gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgroups_left_by_a_stopped_instance_are_removed_at_start() {
    let v2 = Path::new("/sys/fs/cgroup/unified");
    let dead_pid = (400_000..500_000)
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
        .unwrap();
    let stale = v2.join(format!("toolexec-{dead_pid}-0"));
    // A process left running in it, as after a crash. (Any instance starting meanwhile — other
    // tests run in parallel — may clean it up first: then set it up again.)
    let mut orphan = Command::new("sleep").arg("300").spawn().unwrap();
    let mut placed = false;
    for _ in 0..50 {
        let _ = std::fs::create_dir_all(stale.join("c7"));
        if std::fs::write(stale.join("c7/cgroup.procs"), orphan.id().to_string()).is_ok() {
            placed = true;
            break;
        }
    }
    if !placed {
        let _ = orphan.kill();
    }
    assert!(placed, "could not set up the stale cgroup");
    let mine = v2.join(format!("toolexec-{}-999", std::process::id()));
    std::fs::create_dir_all(&mine).unwrap();

    let root = open_dir(0);
    let sandbox = Sandbox::probe(config(), root.path()).await;
    assert!(sandbox.status().ready, "{:?}", sandbox.status());
    assert!(!stale.exists(), "{} is still there", stale.display());
    let status = orphan.wait().unwrap();
    assert!(!status.success(), "the orphan was killed: {status:?}");
    // A live instance's cgroups (this process's) are left alone.
    assert!(mine.exists());
    std::fs::remove_dir(&mine).unwrap();
}

fn limits() -> RunLimits {
    RunLimits {
        timeout: Duration::from_secs(10),
        idle_timeout: None,
        max_output_bytes: 1 << 20,
        cancel: Default::default(),
    }
}

/// Host pids of the processes whose command line is `sleep <arg>`.
fn sleeping(arg: &str) -> Vec<i32> {
    let want = format!("sleep\0{arg}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want.as_bytes()))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

async fn gone_soon(arg: &str) -> bool {
    for _ in 0..60 {
        if sleeping(arg).is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// By default a session's commands share one resident sandbox: its `/tmp` lasts between
/// commands and pid 1 stays the same process, while what a command leaves running still dies
/// with it. With `resident = false` every command gets a sandbox of its own again (the way a
/// service that is not root always runs them): a fresh `/tmp`, and the same containment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_one_sandbox_unless_told_to_build_one_per_command() {
    let root = open_dir(0);
    for resident in [true, false] {
        let sandbox = Sandbox::probe(
            SandboxConfig {
                resident,
                ..config()
            },
            root.path(),
        )
        .await;
        let status = sandbox.status();
        assert!(status.ready, "{status:?}");
        assert_eq!(sandbox.is_resident(), resident);
        let kind = if resident {
            "a resident sandbox per session"
        } else {
            "a sandbox per command"
        };
        assert!(status.detail.contains(kind), "{status:?}");
        let name = format!("r{resident}");
        let ws = sub_dir(root.path(), &name, 65534);
        let table = ProcessTable::new(sandbox.clone(), name.as_str(), ws, 1);
        let left = format!("30{}.{}", u8::from(resident), std::process::id());
        let run = |cmd: String| {
            let table = &table;
            async move {
                let f = table
                    .run("", &cmd, &BTreeMap::new(), false, &limits())
                    .await
                    .unwrap();
                assert_eq!(
                    f.exit_code,
                    Some(0),
                    "{cmd}: {}",
                    String::from_utf8_lossy(&f.stderr)
                );
                String::from_utf8_lossy(&f.stdout).into_owned()
            }
        };
        let first = run(format!(
            "echo kept > /tmp/mark; readlink /proc/self/ns/pid; (setsid sleep {left} &); echo started"
        ))
        .await;
        assert!(first.ends_with("started\n"), "{first}");
        assert!(
            gone_soon(&left).await,
            "resident {resident}: the command's leftover still runs"
        );
        let second =
            run("cat /tmp/mark 2>/dev/null || echo fresh; readlink /proc/self/ns/pid".into()).await;
        let (ns1, ns2) = (
            first.lines().next().unwrap_or_default(),
            second.lines().nth(1).unwrap_or_default(),
        );
        if resident {
            assert!(second.starts_with("kept\n"), "{second}");
            assert_eq!(ns1, ns2, "one PID namespace for the session");
        } else {
            assert!(second.starts_with("fresh\n"), "{second}");
            assert_ne!(ns1, ns2, "a PID namespace per command");
        }
        table.shutdown().await;
    }
}

/// A command too large to travel inside one message (the shell tool allows 100,000
/// characters) reaches its process through a memfd, whole; a small one inside the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_of_any_size_arrive_whole() {
    let root = open_dir(0);
    let sandbox = Sandbox::probe(config(), root.path()).await;
    assert!(sandbox.is_resident(), "{:?}", sandbox.status());
    let ws = sub_dir(root.path(), "big", 65534);
    let table = ProcessTable::new(sandbox.clone(), "big", ws, 1);
    // Command and environment together: about 2 × size (the memfd from ~30 KB on).
    for size in [10, 30_000, 31_000, 100_000] {
        let word = "x".repeat(size);
        let f = table
            .run(
                "",
                &format!("printf %s {word} | wc -c"),
                &BTreeMap::from([("BIG".to_owned(), word.clone())]),
                false,
                &limits(),
            )
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&f.stdout).trim(),
            size.to_string(),
            "{}",
            String::from_utf8_lossy(&f.stderr)
        );
    }
    table.shutdown().await;
}
