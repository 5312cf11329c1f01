//! The SWE-ReX remote API (`/v1/sessions/{id}/swerex`, docs/swerex.md) driven by the official
//! client, pinned (swe-rex 1.4.0 and aiohttp, in the venv `.ci/swerex` makes), against the
//! compiled binary with API keys of two tenants: every call of the client, the exception
//! classes it re-raises, another tenant's key, path refusals, uploads, X-Request-ID repeats
//! and a verify replay of a session driven only through this API
//! (tests/python/swerex_client.py); and the example, examples/swerex_remote.py.
use std::path::PathBuf;
use std::time::Duration;

use toolexec_tests::binary::{Served, serve, toolexec};

/// The venv's python: `TOOLEXEC_TEST_SWEREX_VENV`, else where `.ci/swerex` puts it.
fn python() -> PathBuf {
    let venv = std::env::var_os("TOOLEXEC_TEST_SWEREX_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                        .join(".cache")
                });
            cache.join("toolexec-ci/swerex-1.4.0")
        });
    let python = venv.join("bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run .ci/swerex (it installs swe-rex==1.4.0 and aiohttp in a venv of their own)",
        python.display()
    );
    python
}

/// A data directory only root may enter, as `mktemp -d` makes it.
fn private_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    dir
}

/// A new API key of `tenant`, made as an operator makes one.
fn key(data: &std::path::Path, tenant: &str) -> String {
    let out = toolexec(data)
        .args(["keys", "create", "--tenant", tenant])
        .env("TOOLEXEC_DATA_DIR", data)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The binary with two tenants' keys (SQLite in its data directory).
fn served(data: &std::path::Path) -> (Served, String, String) {
    let a = key(data, "swerex-a");
    let b = key(data, "swerex-b");
    let mut cmd = toolexec(data);
    cmd.arg("serve")
        .env("TOOLEXEC_BIND", "127.0.0.1:0")
        .env("TOOLEXEC_DATA_DIR", data)
        .env("TOOLEXEC_LOG_FORMAT", "json");
    (serve(cmd), a, b)
}

async fn run_python(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let run = tokio::process::Command::new(python())
        .args(args)
        .envs(env.iter().copied())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(240), run)
        .await
        .expect("the SWE-ReX client finished within 4 minutes")
        .expect("python");
    let text = format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_swerex_client_drives_a_recorded_session() {
    let data = private_dir();
    let (served, a, b) = served(data.path());
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/swerex_client.py");
    let (ok, out) = run_python(&[script.to_str().unwrap(), &served.base, &a, &b], &[]).await;
    // The client prints each re-raised exception's module and class on stdout; "ok" is last.
    let stdout = out.split("\n--- stderr ---\n").next().unwrap_or("");
    assert!(ok && stdout.trim_end().ends_with("\nok"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_swerex_example_runs() {
    let data = private_dir();
    let (served, a, _) = served(data.path());
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/swerex_remote.py");
    let (ok, out) = run_python(
        &[example.to_str().unwrap()],
        &[
            ("TOOLEXEC_URL", served.base.as_str()),
            ("TOOLEXEC_API_KEY", a.as_str()),
        ],
    )
    .await;
    assert!(ok, "{out}");
    for line in [
        "run_in_session: 42 exit 0",
        "timed out: timeout after 1 seconds while running command 'sleep 60'",
        "execute: ['app.py']",
        "read_file: print(6 * 7)",
    ] {
        assert!(out.contains(line), "{line:?} not in:\n{out}");
    }
    // What the example did is the session's record.
    let sid = out
        .lines()
        .find_map(|l| l.strip_prefix("session "))
        .and_then(|l| l.split(':').next())
        .unwrap()
        .to_owned();
    let events: serde_json::Value = reqwest::Client::new()
        .get(format!(
            "{}/v1/sessions/{sid}/events?limit=1000",
            served.base
        ))
        .bearer_auth(&a)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let calls: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "invocation.started")
        .map(|e| e["data"]["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(calls.first(), Some(&"exec_command"), "{calls:?}");
    assert!(
        calls.contains(&"write_file") && calls.contains(&"shell"),
        "{calls:?}"
    );
    assert!(
        calls.iter().filter(|c| **c == "write_stdin").count() >= 4,
        "{calls:?}"
    );
}
