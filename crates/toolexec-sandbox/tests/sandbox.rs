//! The sandbox on its own: the start-up probe, the init run by a non-root service, and setup
//! failures that must stop the command from running.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use toolexec_sandbox::{ProcessTable, RunLimits, Sandbox, SandboxConfig};

const INIT: &str = env!("CARGO_BIN_EXE_toolexec-sandbox-init");

fn config() -> SandboxConfig {
    SandboxConfig {
        init: Some(PathBuf::from(INIT)),
        ..SandboxConfig::default()
    }
}

fn open_dir(owner: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(dir.path(), Some(owner), Some(owner)).unwrap();
    dir
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
    let ws = open_dir(65534);
    let table = ProcessTable::new(sandbox.clone(), "t1", ws.path().to_path_buf(), 1);
    let limits = RunLimits {
        timeout: Duration::from_secs(10),
        idle_timeout: None,
        max_output_bytes: 1 << 20,
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
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
}

/// A service that does not run as root starts the init as itself: the sandbox must still leave
/// the command without capabilities, with its filters, unable to read what the user cannot and
/// to write outside /workspace and /tmp.
#[test]
fn a_non_root_service_gets_the_same_sandbox_under_its_own_uid() {
    let ws = open_dir(10001);
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
    let out = Command::new("setpriv")
        .args([
            "--reuid=10001",
            "--regid=10001",
            "--clear-groups",
            INIT,
            "__sandbox-init",
        ])
        .arg(format!("--workspace={}", ws.path().display()))
        .args([
            "--ro=/etc",
            "--tmp-size=1048576",
            "--cpu=10",
            "--fsize=1048576",
            "--nofile=64",
            "--as=0",
            "--",
            "/bin/bash",
            "-c",
            &script,
        ])
        .env_clear()
        .output()
        .unwrap();
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
    assert!(ws.path().join("inside").exists());
    // pid 1 (the init), bash, ps and wc: nothing of the host.
    let processes: usize = lines.last().unwrap().trim().parse().unwrap();
    assert!(processes <= 4, "{stdout}");
}

#[test]
fn a_layer_that_cannot_be_set_up_stops_the_command() {
    let missing = Path::new("/nonexistent-workspace");
    let out = Command::new(INIT)
        .arg("__sandbox-init")
        .arg(format!("--workspace={}", missing.display()))
        .args(["--", "/bin/bash", "-c", "echo ran"])
        .env_clear()
        .output()
        .unwrap();
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
    assert!(stderr.contains("/nonexistent-workspace"), "{stderr}");
    let bad = Command::new(INIT)
        .args(["__sandbox-init", "--cpu=many", "--", "/bin/true"])
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(
        bad.status.code(),
        Some(toolexec_sandbox::init::SETUP_FAILED)
    );
}

/// The sandbox user runs the init through the descriptor the service opened: a build under a
/// directory it cannot enter (a clone under /root) still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_under_a_private_directory_still_starts() {
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
