//! The compiled binary, configured the ways docs/operator.md documents — environment only, file
//! only, both, a typo in either, `--config` — and checked over HTTP. (The in-process tests
//! build `Config` by hand; these are the ones that see what an operator sees.)
use std::process::Command;

use serde_json::{Value, json};
use toolexec_tests::binary::{Served, Started, serve, start, toolexec};
use toolexec_tests::db::TestPgDatabase;

async fn get(served: &Served, path: &str) -> Value {
    reqwest::get(format!("{}{path}", served.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn post(served: &Served, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", served.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

async fn call(served: &Served, sid: &str, id: &str, name: &str, args: Value) -> Value {
    let (status, body) = post(
        served,
        &format!("/v1/sessions/{sid}/calls"),
        json!({"calls": [{"id": id, "name": name, "arguments": args}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body["results"][0].clone()
}

/// What every configured service below must show: its store, its node name, a working sandbox
/// under a 0700 data directory, and `sandbox.max_background` in force.
async fn check_service(served: &Served, store: &str, node: &str, max_background: usize) {
    let ready = get(served, "/readyz").await;
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["store"], store, "{ready}");
    assert_eq!(ready["sandbox"]["mode"], "enforced", "{ready}");
    let (status, session) = post(served, "/v1/sessions", json!({})).await;
    assert_eq!(status, 201, "{session}");
    let sid = session["id"].as_str().unwrap().to_owned();
    let events = get(served, &format!("/v1/sessions/{sid}/events")).await;
    assert_eq!(events["events"][0]["data"]["node"], node, "{events}");
    let r = call(
        served,
        &sid,
        "c1",
        "shell",
        json!({"command": "echo hi > f && cat f"}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    for i in 0..max_background {
        let r = call(
            served,
            &sid,
            &format!("bg{i}"),
            "shell",
            json!({"command": "sleep 30", "background": true}),
        )
        .await;
        assert_eq!(r["status"], "ok", "background {i}: {r}");
    }
    let r = call(
        served,
        &sid,
        "bg-over",
        "shell",
        json!({"command": "sleep 30", "background": true}),
    )
    .await;
    assert_eq!(r["status"], "error", "{r}");
    assert!(
        r["content"]
            .as_str()
            .unwrap()
            .contains(&format!("the limit is {max_background}")),
        "{r}"
    );
    let resp = reqwest::Client::new()
        .delete(format!("{}/v1/sessions/{sid}", served.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// A data directory as `mktemp -d` makes it: 0700, owned by root, which the sandbox user cannot
/// enter.
fn private_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_alone_configures_the_binary() {
    let db = TestPgDatabase::create().await;
    let data = private_dir();
    let mut cmd = toolexec(data.path());
    cmd.arg("serve")
        .env("TOOLEXEC_BIND", "127.0.0.1:0")
        .env("TOOLEXEC_DATA_DIR", data.path())
        .env("TOOLEXEC_DATABASE_URL", db.url())
        .env("TOOLEXEC_LOG_FORMAT", "json")
        .env("TOOLEXEC_NODE", "env-node")
        .env("TOOLEXEC_SANDBOX__MAX_BACKGROUND", "1");
    let served = serve(cmd);
    assert!(!served.base.ends_with(":8080"), "{}", served.base);
    check_service(&served, "postgres", "env-node", 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_file_alone_configures_the_binary() {
    let data = private_dir();
    let file = data.path().join("service.toml");
    std::fs::write(
        &file,
        format!(
            "bind = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nlog_format = \"json\"\nnode = \"file-node\"\n\n[sandbox]\nmax_background = 2\n",
            data.path().display()
        ),
    )
    .unwrap();
    let mut cmd = toolexec(data.path());
    cmd.args(["--config", file.to_str().unwrap(), "serve"]);
    let served = serve(cmd);
    check_service(&served, "sqlite", "file-node", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_overrides_the_file_key_by_key() {
    let db = TestPgDatabase::create().await;
    let data = private_dir();
    // ./toolexec.toml is read when no --config is given.
    std::fs::write(
        data.path().join("toolexec.toml"),
        format!(
            "bind = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nlog_format = \"json\"\nnode = \"file-node\"\n\n[sandbox]\nmax_background = 2\ncpu_cores = 0.5\n",
            data.path().display()
        ),
    )
    .unwrap();
    let env = [
        ("TOOLEXEC_NODE", "env-node"),
        ("TOOLEXEC_DATABASE_URL", db.url()),
    ];
    let mut cmd = toolexec(data.path());
    cmd.arg("serve").envs(env);
    let served = serve(cmd);
    check_service(&served, "postgres", "env-node", 2).await;

    // `toolexec config` says the same, and where each value came from; a database password,
    // in the userinfo or as a query parameter, never shows.
    let secret_url =
        "postgres://app:hunter2-userinfo@db.internal:5432/x?sslmode=disable&password=hunter2-query";
    let out = toolexec(data.path())
        .arg("config")
        .envs(env)
        .env("TOOLEXEC_DATABASE_URL", secret_url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for line in [
        "node = \"env-node\"  # environment TOOLEXEC_NODE",
        "sandbox.max_background = 2  # file toolexec.toml",
        "sandbox.cpu_cores = 0.5  # file toolexec.toml",
        "sandbox.pids = 256  # default",
        "database_url = \"postgres://app:***@db.internal:5432/x?sslmode=disable&password=***\"  # environment TOOLEXEC_DATABASE_URL",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
    assert!(!text.contains("hunter2"), "{text}");
}

fn assert_refused(cmd: Command, names: &[&str]) {
    match start(cmd) {
        Started::Serving(s) => panic!("started on {} despite the typo", s.base),
        Started::Exited(log) => {
            for name in names {
                assert!(log.contains(name), "{name} not named in:\n{log}");
            }
        }
    }
}

#[test]
fn a_misspelled_setting_in_the_environment_or_the_file_stops_the_binary() {
    let data = private_dir();
    let mut cmd = toolexec(data.path());
    cmd.arg("serve")
        .env("TOOLEXEC_BIND", "127.0.0.1:0")
        .env("TOOLEXEC_DATA_DIR", data.path())
        .env("TOOLEXEC_SANDBOX__MAX_BAKGROUND", "1");
    assert_refused(
        cmd,
        &[
            "TOOLEXEC_SANDBOX__MAX_BAKGROUND",
            "did you mean TOOLEXEC_SANDBOX__MAX_BACKGROUND",
        ],
    );

    let file = data.path().join("typo.toml");
    std::fs::write(
        &file,
        "bind = \"127.0.0.1:0\"\n[sandbox]\nmax_bakground = 1\n",
    )
    .unwrap();
    let mut cmd = toolexec(data.path());
    cmd.args(["--config", file.to_str().unwrap(), "serve"]);
    assert_refused(cmd, &["max_bakground"]);

    // A value of the wrong type, named with its variable.
    let mut cmd = toolexec(data.path());
    cmd.arg("serve")
        .env("TOOLEXEC_DATA_DIR", data.path())
        .env("TOOLEXEC_LIMITS__MAX_BLOB_BYTES", "ten");
    assert_refused(cmd, &["TOOLEXEC_LIMITS__MAX_BLOB_BYTES"]);

    // The config file's own variable and Kubernetes' service links are not settings.
    let ok = toolexec(data.path())
        .arg("config")
        .env("TOOLEXEC_CONFIG", &file)
        .env("TOOLEXEC_SERVICE_HOST", "10.0.0.1")
        .env("TOOLEXEC_PORT_8080_TCP", "tcp://10.0.0.1:8080")
        .output()
        .unwrap();
    // (This file has the typo, so it is refused — by the file, not by the variables.)
    let err = String::from_utf8_lossy(&ok.stderr);
    assert!(err.contains("max_bakground"), "{err}");
    assert!(!err.contains("TOOLEXEC_SERVICE_HOST"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_disk_quota_from_the_environment_holds_while_a_command_writes() {
    let data = private_dir();
    let mut cmd = toolexec(data.path());
    cmd.arg("serve")
        .env("TOOLEXEC_BIND", "127.0.0.1:0")
        .env("TOOLEXEC_DATA_DIR", data.path())
        .env("TOOLEXEC_LIMITS__SESSION_DISK_BYTES", "16777216");
    let served = serve(cmd);
    let (status, session) = post(&served, "/v1/sessions", json!({})).await;
    assert_eq!(status, 201, "{session}");
    let sid = session["id"].as_str().unwrap().to_owned();
    let r = call(
        &served,
        &sid,
        "fill",
        "shell",
        json!({"command": "head -c 64M /dev/zero > big; echo rc=$?"}),
    )
    .await;
    let text = r["content"].as_str().unwrap();
    assert!(text.contains("No space left on device"), "{r}");
    assert!(text.contains("disk quota of 16 MiB is used up"), "{r}");
    // Closed, its disk goes (the binary is killed at the end, which would leave it mounted
    // for the next start to reuse).
    let resp = reqwest::Client::new()
        .delete(format!("{}/v1/sessions/{sid}", served.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        !std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(&sid),
        "the session's disk is still mounted"
    );
}

#[test]
fn a_session_disk_quota_that_cannot_hold_a_filesystem_stops_the_binary() {
    let data = private_dir();
    let mut cmd = toolexec(data.path());
    cmd.arg("serve")
        .env("TOOLEXEC_BIND", "127.0.0.1:0")
        .env("TOOLEXEC_DATA_DIR", data.path())
        .env("TOOLEXEC_LIMITS__SESSION_DISK_BYTES", "4096");
    assert_refused(cmd, &["limits.session_disk_bytes", "minimum"]);
}

#[test]
fn a_command_tool_whose_entrypoint_leaves_its_folder_stops_the_binary() {
    let data = private_dir();
    let tools = data.path().join("tools");
    std::fs::create_dir(&tools).unwrap();
    let file = data.path().join("service.toml");
    std::fs::write(
        &file,
        format!(
            "bind = \"127.0.0.1:0\"\n[tools]\ndir = \"{}\"\n[[tools.command]]\nname = \"evil\"\ndescription = \"x\"\nentrypoint = \"../../bin/sh\"\ninput_schema = {{ type = \"object\" }}\n",
            tools.display()
        ),
    )
    .unwrap();
    let mut cmd = toolexec(data.path());
    cmd.args(["--config", file.to_str().unwrap(), "serve"])
        .env("TOOLEXEC_DATA_DIR", data.path());
    assert_refused(cmd, &["tools.command \"evil\"", "without '..'"]);
}
