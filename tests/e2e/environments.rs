//! Sessions in OCI images (issue 26), end to end: a real registry on loopback
//! (`docker-registry`), images built here (busybox-static, the host's python3; GNU tar and an
//! OCI image layout) and pushed with `skopeo`, the compiled binary configured as an operator
//! would, driven over HTTP.
//! A missing tool fails these tests (it is installed by `.ci/run`); none is skipped.
use std::path::Path;

use serde_json::{Value, json};
use toolexec_tests::binary::{Served, serve, toolexec};
use toolexec_tests::registry::{Registry, busybox_root, python_root};

pub(crate) async fn post(served: &Served, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}{path}", served.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

async fn get(served: &Served, path: &str) -> Value {
    reqwest::get(format!("{}{path}", served.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn session(served: &Served, body: Value) -> Value {
    let (status, s) = post(served, "/v1/sessions", body).await;
    assert_eq!(status, 201, "{s}");
    s
}

/// `shell` in session `sid`: (exit code, output).
async fn sh(served: &Served, sid: &str, id: &str, command: &str) -> (i64, String) {
    let (status, body) = post(
        served,
        &format!("/v1/sessions/{sid}/calls"),
        json!({"calls": [{"id": id, "name": "shell", "arguments": {"command": command}}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let content = body["results"][0]["content"].as_str().unwrap_or_default();
    // "[exit code N after S s]\n--- stdout ---\n…\n--- stderr ---\n…"
    let code = content
        .strip_prefix("[exit code ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1);
    let stdout = content
        .split_once("--- stdout ---\n")
        .map(|(_, r)| r.split("--- stderr ---\n").next().unwrap_or_default())
        .unwrap_or_default();
    assert!(code != -1, "{content}");
    (code, stdout.to_owned())
}

/// One call of `name` in session `sid`: its result.
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

fn content(result: &Value) -> &str {
    result["content"].as_str().unwrap_or_default()
}

/// A data directory as `mktemp -d` makes it (0700): the sandbox user cannot enter it, and
/// still runs in the images cached beneath it.
pub(crate) fn private_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    dir
}

/// `toolexec serve` storing in `data`, allowed to pull from `registries` (comma-separated
/// `host:port`s) over plain HTTP, with `allow_cidrs` as `environments.allow_cidrs` if given.
pub(crate) fn serve_command(
    registries: &str,
    data: &Path,
    allow_cidrs: Option<&str>,
) -> std::process::Command {
    let mut cmd = toolexec(data);
    cmd.arg("serve")
        .env("TOOLEXEC_BIND", "127.0.0.1:0")
        .env("TOOLEXEC_DATA_DIR", data)
        .env("TOOLEXEC_LOG_FORMAT", "json")
        .env("TOOLEXEC_ENVIRONMENTS__ALLOW_REGISTRIES", registries)
        .env("TOOLEXEC_ENVIRONMENTS__INSECURE_REGISTRIES", registries);
    if let Some(cidrs) = allow_cidrs {
        cmd.env("TOOLEXEC_ENVIRONMENTS__ALLOW_CIDRS", cidrs);
    }
    cmd
}

/// The binary, allowed to pull from `registries` over plain HTTP on loopback (which the egress
/// policy refuses unless named: 127.0.0.1 is), storing in `data`, with `extra` set.
pub(crate) fn serve_pulling_from(registries: &str, data: &Path, extra: &[(&str, &str)]) -> Served {
    let mut cmd = serve_command(registries, data, Some("127.0.0.1"));
    for (k, v) in extra {
        cmd.env(k, v);
    }
    serve(cmd)
}

/// The binary, allowed to pull from `registry` over plain HTTP, storing in `data`.
pub(crate) fn serve_with(registry: &Registry, data: &Path, extra: &[(&str, &str)]) -> Served {
    serve_pulling_from(&registry.host, data, extra)
}

pub(crate) fn image_dirs(data: &Path) -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(data.join("workspaces/.images/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    dirs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_run_in_the_image_they_name_side_by_side() {
    let registry = Registry::start();
    let roots = tempfile::tempdir().unwrap();
    let bb_root = roots.path().join("bb");
    busybox_root(&bb_root);
    let bb_digest = registry.push(&bb_root, &["PATH=/bin", "FROM_IMAGE=busybox"], "bb:1");
    let py_root = roots.path().join("py");
    python_root(&py_root);
    let py_digest = registry.push(
        &py_root,
        &["PATH=/usr/bin:/bin", "FROM_IMAGE=python"],
        "py:3",
    );
    assert_ne!(bb_digest, py_digest);
    let data = private_dir();
    let served = serve_with(
        &registry,
        data.path(),
        &[(
            "TOOLEXEC_ENVIRONMENTS__IMAGES",
            &format!(r#"[{{"name":"python","image":"{}/py:3"}}]"#, registry.host),
        )],
    );

    let bb_ref = format!("{}/bb:1", registry.host);
    let bb = session(
        &served,
        json!({"environment": {"image": bb_ref}, "env": {"MINE": "session"}}),
    )
    .await;
    assert_eq!(
        bb["environment"],
        json!({"image": bb_ref, "digest": bb_digest}),
        "{bb}"
    );
    let py = session(&served, json!({"environment": {"image": "python"}})).await;
    assert_eq!(py["environment"]["digest"], py_digest, "{py}");
    assert_eq!(py["environment"]["name"], "python", "{py}");
    let host = session(&served, json!({})).await;
    assert!(host.get("environment").is_none(), "{host}");
    let (bb_id, py_id, host_id) = (
        bb["id"].as_str().unwrap(),
        py["id"].as_str().unwrap(),
        host["id"].as_str().unwrap(),
    );

    // The busybox image: its shell (no bash), its PATH and Env, then the session's env; no
    // python3 anywhere; the workspace as always.
    let (code, out) = sh(
        &served,
        bb_id,
        "b1",
        "echo \"$PATH $FROM_IMAGE $MINE\"; test -e /bin/bash || echo no-bash; \
         command -v python3 || echo no-python; ls /usr/bin/python3* 2>&1 | head -1; \
         echo hi > f && cat /workspace/f && pwd",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("/bin busybox session"), "{out}");
    assert!(out.contains("no-bash"), "{out}");
    assert!(out.contains("no-python"), "{out}");
    assert!(out.contains("hi\n/workspace"), "{out}");
    // Read-only, and the host's /usr is not there.
    let (code, out) = sh(
        &served,
        bb_id,
        "b2",
        "touch /bin/x 2>&1; touch /etc/x 2>&1; test -d /usr && echo has-usr; \
         grep -E ' /(bin|etc) ' /proc/self/mounts",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(!out.contains("has-usr"), "{out}");
    for mount in [" /bin ", " /etc "] {
        let line = out.lines().find(|l| l.contains(mount)).unwrap_or_default();
        assert!(
            line.contains("ro,") && line.contains("nosuid") && line.contains("nodev"),
            "{mount}: {out}"
        );
    }

    // The Python image has python3, and runs it.
    let (code, out) = sh(
        &served,
        py_id,
        "p1",
        "python3 -c 'import json, sys; print(json.dumps({\"v\": sys.version_info[0] * 14}))' 2>&1; \
         echo $FROM_IMAGE",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("{\"v\": 42}"), "{out}");
    assert!(out.contains("python"), "{out}");

    // The persistent bash shell and a terminal run in the Python image too (it has bash).
    let r = call(
        &served,
        py_id,
        "p2",
        "bash",
        json!({"command": "cd /tmp && export KEPT=yes"}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    let r = call(
        &served,
        py_id,
        "p3",
        "bash",
        json!({"command": "echo $KEPT $(pwd) $FROM_IMAGE; python3 -c 'print(6 * 7)'"}),
    )
    .await;
    assert!(content(&r).contains("yes /tmp python\n42"), "{r}");
    let r = call(
        &served,
        py_id,
        "p4",
        "exec_command",
        json!({"cmd": "python3 -c 'import sys; print(sys.prefix)'; echo $FROM_IMAGE", "yield_time_ms": 5000}),
    )
    .await;
    assert!(content(&r).contains("/usr\npython"), "{r}");
    // A background process in the busybox image, read back.
    let r = call(
        &served,
        bb_id,
        "b3",
        "shell",
        json!({"command": "echo bg-$FROM_IMAGE; test -e /usr/bin/python3 || echo no-python", "background": true}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    let r = call(
        &served,
        bb_id,
        "b4",
        "process_read",
        json!({"process_id": "p1", "wait_ms": 5000}),
    )
    .await;
    assert!(content(&r).contains("bg-busybox\nno-python"), "{r}");

    // The host session beside them still sees the host's /usr (bash included).
    let (code, out) = sh(
        &served,
        host_id,
        "h1",
        "echo $BASH_VERSION; ls /usr/bin | wc -l",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(!out.lines().next().unwrap_or_default().is_empty(), "{out}");

    // The record: `session.created` holds the digest, and so does the session.
    let events = get(&served, &format!("/v1/sessions/{bb_id}/events")).await;
    assert_eq!(
        events["events"][0]["data"]["environment"]["digest"], bb_digest,
        "{events}"
    );
    let got = get(&served, &format!("/v1/sessions/{py_id}")).await;
    assert_eq!(got["environment"]["digest"], py_digest, "{got}");
    let list = get(&served, "/v1/sessions").await;
    let listed = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == bb_id)
        .cloned()
        .unwrap_or_default();
    assert_eq!(listed["environment"]["digest"], bb_digest, "{list}");
    assert_eq!(image_dirs(data.path()).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_sessions_on_one_image_share_one_copy() {
    let registry = Registry::start();
    let roots = tempfile::tempdir().unwrap();
    busybox_root(roots.path());
    let digest = registry.push(roots.path(), &["PATH=/bin"], "bb:shared");
    let data = private_dir();
    let served = serve_with(&registry, data.path(), &[]);
    let image = format!("{}/bb:shared", registry.host);
    // Created at once: one pull for all of them.
    let creates = (0..12).map(|_| session(&served, json!({"environment": {"image": image}})));
    let sessions = futures::future::join_all(creates).await;
    for (i, s) in sessions.iter().enumerate() {
        assert_eq!(s["environment"]["digest"], digest, "{s}");
        let sid = s["id"].as_str().unwrap();
        let (code, out) = sh(&served, sid, "c1", &format!("echo {i} > mine; cat mine")).await;
        assert_eq!((code, out.trim()), (0, i.to_string().as_str()), "{out}");
    }
    let dirs = image_dirs(data.path());
    assert_eq!(dirs, vec![digest.trim_start_matches("sha256:").to_owned()]);
    // One copy: the images folder is one image's size (busybox is ~2 MB), not twelve.
    let du = std::process::Command::new("du")
        .args(["-sk"])
        .arg(data.path().join("workspaces/.images"))
        .output()
        .unwrap();
    let kib: u64 = String::from_utf8_lossy(&du.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let busybox_kib = std::fs::metadata("/bin/busybox").unwrap().len() / 1024;
    assert!(
        kib < busybox_kib * 2,
        "{kib} KiB of images for a {busybox_kib} KiB busybox"
    );
    let metrics = reqwest::get(format!("{}/metrics", served.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(-1.0)
    };
    assert_eq!(
        value("toolexec_image_pulls_total") + value("toolexec_image_cache_hits_total"),
        12.0,
        "{metrics}"
    );
    assert!(value("toolexec_image_cache_bytes") > 0.0, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_after_the_tag_moved_runs_in_the_old_digest() {
    let registry = Registry::start();
    let roots = tempfile::tempdir().unwrap();
    let (one, two) = (roots.path().join("one"), roots.path().join("two"));
    for (root, version) in [(&one, "one"), (&two, "two")] {
        busybox_root(root);
        std::fs::write(root.join("etc/version"), format!("{version}\n")).unwrap();
    }
    let first = registry.push(&one, &["PATH=/bin"], "moving:latest");
    let data = private_dir();
    let served = serve_with(&registry, data.path(), &[]);
    let image = format!("{}/moving:latest", registry.host);
    let s = session(&served, json!({"environment": {"image": image}})).await;
    let sid = s["id"].as_str().unwrap();
    let (_, out) = sh(&served, sid, "c1", "cat /etc/version; echo kept > w").await;
    assert_eq!(out.trim(), "one");

    let second = registry.push(&two, &["PATH=/bin"], "moving:latest");
    assert_ne!(first, second);
    // A verify replay re-runs the session's command in the recorded digest: same output ("one",
    // not the "two" the tag names now), no divergence.
    let (status, replay) = post(
        &served,
        &format!("/v1/sessions/{sid}/replay"),
        json!({"mode": "verify"}),
    )
    .await;
    assert_eq!(status, 200, "{replay}");
    assert_eq!(replay["status"], "finished", "{replay}");
    assert_eq!(replay["calls_replayed"], 1, "{replay}");
    assert_eq!(replay["calls_diverged"], 0, "{replay:#}");
    let replayed = get(
        &served,
        &format!("/v1/sessions/{}", replay["session_id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(replayed["environment"]["digest"], first, "{replayed}");
    let (status, fork) = post(&served, &format!("/v1/sessions/{sid}/fork"), json!({})).await;
    assert_eq!(status, 201, "{fork}");
    assert_eq!(fork["environment"]["digest"], first, "{fork}");
    let (_, out) = sh(
        &served,
        fork["id"].as_str().unwrap(),
        "f1",
        "cat /etc/version; cat w",
    )
    .await;
    assert_eq!(out.trim(), "one\nkept");
    // A new session on the tag gets what it names now.
    let fresh = session(&served, json!({"environment": {"image": image}})).await;
    assert_eq!(fresh["environment"]["digest"], second, "{fresh}");
    let (_, out) = sh(
        &served,
        fresh["id"].as_str().unwrap(),
        "n1",
        "cat /etc/version",
    )
    .await;
    assert_eq!(out.trim(), "two");

    // The cache emptied (another node, a lost disk): the session's digest is pulled again by
    // digest, not by the tag that moved.
    drop(served);
    std::fs::remove_dir_all(data.path().join("workspaces/.images")).unwrap();
    let served = serve_with(&registry, data.path(), &[]);
    let (_, out) = sh(&served, sid, "c2", "cat /etc/version; cat w").await;
    assert_eq!(out.trim(), "one\nkept");
    assert!(image_dirs(data.path()).contains(&first.trim_start_matches("sha256:").to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_that_cannot_be_had_are_refused_with_their_own_codes() {
    let registry = Registry::start();
    let roots = tempfile::tempdir().unwrap();
    busybox_root(roots.path());
    registry.push(roots.path(), &["PATH=/bin"], "bb:1");
    let data = private_dir();
    // A registry that is allowed but where nothing listens.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let served = serve_pulling_from(&format!("{},{closed}", registry.host), data.path(), &[]);
    for (image, status, code) in [
        (format!("{}/bb:nope", registry.host), 422, "image_not_found"),
        (
            format!("{}/nothing:1", registry.host),
            422,
            "image_not_found",
        ),
        ("ghcr.io/o/r:1".to_owned(), 422, "image_not_allowed"),
        (format!("{closed}/bb:1"), 502, "registry_unreachable"),
        ("not a reference".to_owned(), 422, "invalid_image"),
    ] {
        let (got, body) = post(
            &served,
            "/v1/sessions",
            json!({"environment": {"image": image}}),
        )
        .await;
        assert_eq!(
            (got, body["code"].as_str()),
            (status, Some(code)),
            "{image}: {body}"
        );
    }
    // Nothing was created by the refusals.
    let list = get(&served, "/v1/sessions").await;
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(0), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_environments_configured_an_image_is_refused_and_sessions_see_the_host() {
    let data = private_dir();
    let mut cmd = toolexec(data.path());
    cmd.arg("serve")
        .env("TOOLEXEC_BIND", "127.0.0.1:0")
        .env("TOOLEXEC_DATA_DIR", data.path())
        .env("TOOLEXEC_LOG_FORMAT", "json");
    let served = serve(cmd);
    let (status, body) = post(
        &served,
        "/v1/sessions",
        json!({"environment": {"image": "127.0.0.1:5000/bb:1"}}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("image_not_allowed")),
        "{body}"
    );
    let s = session(&served, json!({})).await;
    assert!(s.get("environment").is_none(), "{s}");
    let (code, out) = sh(
        &served,
        s["id"].as_str().unwrap(),
        "h",
        "echo $BASH_VERSION",
    )
    .await;
    assert_eq!(code, 0);
    assert!(!out.trim().is_empty(), "{out}");
    assert!(!data.path().join("workspaces/.images").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_pull_reports_progress_and_the_first_session_finds_the_image_cached() {
    let registry = Registry::start();
    let roots = tempfile::tempdir().unwrap();
    python_root(roots.path());
    let digest = registry.push(roots.path(), &["PATH=/usr/bin:/bin"], "py:pre");
    let data = private_dir();
    let served = serve_with(&registry, data.path(), &[]);
    let image = format!("{}/py:pre", registry.host);
    let text = reqwest::Client::new()
        .post(format!("{}/v1/environments", served.base))
        .header("accept", "text/event-stream")
        .json(&json!({"image": image}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // `event: progress` … then one `event: pulled`, whose data names the digest.
    let events: Vec<(&str, Value)> = text
        .split("\n\n")
        .filter_map(|block| {
            let event = block.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((event, serde_json::from_str(data).unwrap()))
        })
        .collect();
    let (last, pulled) = events.last().unwrap();
    assert_eq!(*last, "pulled", "{text}");
    assert_eq!(pulled["environment"]["digest"], digest, "{text}");
    assert_eq!(pulled["cached"], false, "{text}");
    let progress: Vec<&Value> = events
        .iter()
        .filter(|(e, _)| *e == "progress")
        .map(|(_, d)| d)
        .collect();
    assert!(!progress.is_empty(), "{text}");
    let total = progress[0]["bytes_total"].as_u64().unwrap();
    assert!(total > 1_000_000, "{text}");
    assert!(
        progress
            .windows(2)
            .all(|w| w[0]["bytes_done"].as_u64() <= w[1]["bytes_done"].as_u64()),
        "{text}"
    );
    assert!(
        progress
            .iter()
            .all(|p| p["bytes_done"].as_u64().unwrap() <= total),
        "{text}"
    );
    // Again, plain JSON: cached, nothing downloaded.
    let (status, again) = post(&served, "/v1/environments", json!({"image": image})).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["cached"], true, "{again}");
    assert_eq!(again["environment"]["digest"], digest, "{again}");
    // Refusals come as problems (JSON) or as an `error` event (a stream).
    let (status, refused) = post(
        &served,
        "/v1/environments",
        json!({"image": "ghcr.io/o/r:1"}),
    )
    .await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (422, Some("image_not_allowed")),
        "{refused}"
    );
    let text = reqwest::Client::new()
        .post(format!("{}/v1/environments", served.base))
        .header("accept", "text/event-stream")
        .json(&json!({"image": format!("{}/py:nope", registry.host)}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("event: error") && text.contains("image_not_found"),
        "{text}"
    );
    // The first session finds it in the cache: a hit, not a pull.
    let s = session(&served, json!({"environment": {"image": image}})).await;
    assert_eq!(s["environment"]["digest"], digest, "{s}");
    let metrics = reqwest::get(format!("{}/metrics", served.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        line("toolexec_image_pulls_total").ends_with(" 1"),
        "{metrics}"
    );
    assert!(
        line("toolexec_image_cache_hits_total").ends_with(" 2"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_default_image_applies_to_sessions_that_name_none() {
    let registry = Registry::start();
    let roots = tempfile::tempdir().unwrap();
    busybox_root(roots.path());
    let digest = registry.push(roots.path(), &["PATH=/bin"], "bb:default");
    let data = private_dir();
    let served = serve_with(
        &registry,
        data.path(),
        &[
            (
                "TOOLEXEC_ENVIRONMENTS__IMAGES",
                &format!(
                    r#"[{{"name":"bb","image":"{}/bb:default"}}]"#,
                    registry.host
                ),
            ),
            ("TOOLEXEC_ENVIRONMENTS__DEFAULT", "bb"),
        ],
    );
    let s = session(&served, json!({})).await;
    assert_eq!(
        s["environment"],
        json!({"image": format!("{}/bb:default", registry.host), "digest": digest, "name": "bb"}),
        "{s}"
    );
    let (code, out) = sh(
        &served,
        s["id"].as_str().unwrap(),
        "d1",
        "test -e /bin/bash || echo no-bash",
    )
    .await;
    assert_eq!((code, out.trim()), (0, "no-bash"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_cannot_replace_the_sandboxs_own_mounts() {
    // An image whose root has the names the sandbox mounts itself, made to mislead: a
    // `workspace` with a file, `tmp` a link to `/etc`, `proc` and `dev` of its own, and an
    // absolute link out of the root (`host -> /`, which inside the sandbox is its own root).
    let registry = Registry::start();
    let roots = tempfile::tempdir().unwrap();
    let root = roots.path();
    busybox_root(root);
    for dir in ["workspace", "proc", "dev"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
        std::fs::write(root.join(dir).join("from-image"), "x").unwrap();
    }
    std::os::unix::fs::symlink("/etc", root.join("tmp")).unwrap();
    std::os::unix::fs::symlink("/", root.join("host")).unwrap();
    // Links where the init makes or mounts something itself, aimed at the workspace root (the
    // init's working directory while it builds the root): the egress socket's name, and the
    // first component of an operator's read-only bind.
    std::os::unix::fs::symlink(
        "/proc/self/cwd/escaped-sock",
        root.join(".toolexec-egress.sock"),
    )
    .unwrap();
    std::os::unix::fs::symlink("/proc/self/cwd/escaped-var", root.join("var")).unwrap();
    registry.push(root, &["PATH=/bin"], "tricky:1");
    let data = private_dir();
    let ro = tempfile::Builder::new()
        .prefix("toolexec-ro-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::write(ro.path().join("tool.txt"), "operator's\n").unwrap();
    let ro_binds = format!("/etc,{}", ro.path().display());
    let served = serve_with(
        &registry,
        data.path(),
        &[("TOOLEXEC_SANDBOX__RO_BINDS", ro_binds.as_str())],
    );
    let s = session(
        &served,
        json!({"environment": {"image": format!("{}/tricky:1", registry.host)},
               "policy": {"network": "allow"},
               "files": {"mine.txt": "mine\n"}}),
    )
    .await;
    let sid = s["id"].as_str().unwrap();
    let (code, out) = sh(
        &served,
        sid,
        "t1",
        "ls /workspace; test -L /tmp || echo tmp-is-a-dir; touch /tmp/w && echo tmp-writable; \
         ls /proc/self/status >/dev/null && echo proc-ok; test -e /dev/from-image || echo dev-ok; \
         test -e /proc/from-image || echo proc-own; ls /host/ | tr '\\n' ' '",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("mine.txt\n"), "{out}");
    assert!(!out.contains("from-image"), "{out}");
    for expected in [
        "tmp-is-a-dir",
        "tmp-writable",
        "proc-ok",
        "dev-ok",
        "proc-own",
    ] {
        assert!(out.contains(expected), "{expected}: {out}");
    }
    // `/host` is a link to the sandbox's own root, not the host's.
    assert!(out.contains("workspace") && !out.contains("root "), "{out}");
    // The init's own socket and the operator's bind are where they belong, and nothing was
    // made through the image's links outside the sandbox.
    let (code, out) = sh(
        &served,
        sid,
        "t2",
        &format!(
            "test -S /.toolexec-egress.sock && echo sock-ok; cat {}/tool.txt",
            ro.path().display()
        ),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("sock-ok") && out.contains("operator's"),
        "{out}"
    );
    let mut escaped = Vec::new();
    for dir in [data.path().to_path_buf(), data.path().join("workspaces")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if name.starts_with("escaped") {
                escaped.push(dir.join(name));
            }
        }
    }
    assert!(escaped.is_empty(), "made outside the sandbox: {escaped:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_keeps_to_its_bound_and_never_removes_an_image_in_use() {
    let registry = Registry::start();
    let roots = tempfile::tempdir().unwrap();
    busybox_root(roots.path());
    let one = registry.push(roots.path(), &["PATH=/bin", "WHICH=one"], "bb:one");
    let two = registry.push(roots.path(), &["PATH=/bin", "WHICH=two"], "bb:two");
    let hex = |d: &str| d.trim_start_matches("sha256:").to_owned();
    let data = private_dir();
    // Room for no more than one busybox.
    let served = serve_with(
        &registry,
        data.path(),
        &[("TOOLEXEC_ENVIRONMENTS__MAX_CACHE_BYTES", "1")],
    );
    let one_ref = format!("{}/bb:one", registry.host);
    let (status, body) = post(&served, "/v1/environments", json!({"image": one_ref})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(image_dirs(data.path()), [hex(&one)]);

    // A session in `two`: `one`, which no session runs in, is evicted for it.
    let s = session(
        &served,
        json!({"environment": {"image": format!("{}/bb:two", registry.host)}}),
    )
    .await;
    let sid = s["id"].as_str().unwrap();
    assert_eq!(
        sh(&served, sid, "c1", "echo $WHICH").await,
        (0, "two\n".into())
    );
    assert_eq!(image_dirs(data.path()), [hex(&two)]);

    // `toolexec images rm` in another process refuses to take it from under the session.
    let out = toolexec(data.path())
        .args(["images", "rm", &two])
        .env("TOOLEXEC_DATA_DIR", data.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("in use"), "{stderr}");
    assert_eq!(image_dirs(data.path()), [hex(&two)]);
    // Nor does `toolexec images list` disturb anything.
    let out = toolexec(data.path())
        .args(["images", "list"])
        .env("TOOLEXEC_DATA_DIR", data.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&two));
    assert_eq!(
        sh(&served, sid, "c2", "echo $WHICH").await,
        (0, "two\n".into())
    );

    // `one` again: `two` is in use and stays, the cache over its bound until it is released.
    let (status, body) = post(&served, "/v1/environments", json!({"image": one_ref})).await;
    assert_eq!(status, 200, "{body}");
    let mut both = vec![hex(&one), hex(&two)];
    both.sort();
    assert_eq!(image_dirs(data.path()), both);
}

/// `cmd` (`toolexec serve`), its log (JSON lines, whatever the level) written whole to
/// `log`: every line of its life, not only those before it listened.
fn serve_logging_to(mut cmd: std::process::Command, log: &Path) -> Served {
    toolexec_tools::web::install_tls_provider();
    cmd.env("RUST_LOG", "debug")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    let child = cmd.spawn().unwrap();
    let mut served = Served {
        child,
        base: String::new(),
        log: Vec::new(),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    served.base = loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(address) = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["message"] == "listening")
            .and_then(|l| l["address"].as_str().map(str::to_owned))
        {
            break format!("http://{address}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not listening:\n{text}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    served
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_wants_credentials_gets_the_operators_and_they_are_never_shown() {
    const USER: &str = "puller";
    const SECRET: &str = "reg-secret-8c1f";
    let registry = Registry::start_with_auth(USER, SECRET);
    let roots = tempfile::tempdir().unwrap();
    busybox_root(roots.path());
    let digest = registry.push(roots.path(), &["PATH=/bin"], "private/bb:1");
    let image = format!("{}/private/bb:1", registry.host);
    // What would give the secret away: itself, and as HTTP basic auth sends it.
    let basic = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{SECRET}"))
    };
    let leaks = |text: &str| text.contains(SECRET) || text.contains(&basic);

    // Without credentials: the registry's refusal, with what to do.
    let data = private_dir();
    let served = serve_with(&registry, data.path(), &[]);
    let (status, body) = post(
        &served,
        "/v1/sessions",
        json!({"environment": {"image": image}}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (502, Some("registry_unauthorized")),
        "{body}"
    );
    assert!(
        body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("environments.credentials"),
        "{body}"
    );
    drop(served);

    // With the operator's credentials for that registry (set in the environment, as a
    // Kubernetes Secret would be): pulled, and the session runs in it.
    let credentials =
        json!([{"registry": registry.host, "username": USER, "password": SECRET}]).to_string();
    let data = private_dir();
    let log = data.path().join("toolexec.log");
    let mut cmd = serve_command(&registry.host, data.path(), Some("127.0.0.1"));
    cmd.env("TOOLEXEC_ENVIRONMENTS__CREDENTIALS", &credentials);
    let served = serve_logging_to(cmd, &log);
    let mut seen = Vec::new();
    let s = session(&served, json!({"environment": {"image": image}})).await;
    seen.push(s.to_string());
    assert_eq!(s["environment"]["digest"], digest, "{s}");
    let sid = s["id"].as_str().unwrap();
    let (code, out) = sh(&served, sid, "c1", "echo in-the-image; ls /bin/busybox").await;
    assert_eq!((code, out.as_str()), (0, "in-the-image\n/bin/busybox\n"));
    seen.push(
        get(&served, &format!("/v1/sessions/{sid}"))
            .await
            .to_string(),
    );
    seen.push(
        get(&served, &format!("/v1/sessions/{sid}/events"))
            .await
            .to_string(),
    );
    let (status, pulled) = post(&served, "/v1/environments", json!({"image": image})).await;
    assert_eq!(status, 200, "{pulled}");
    seen.push(pulled.to_string());
    // A wrong tag of that registry: refused as not found, with the credentials used.
    let (status, missing) = post(
        &served,
        "/v1/sessions",
        json!({"environment": {"image": format!("{}/private/bb:nope", registry.host)}}),
    )
    .await;
    assert_eq!(
        (status, missing["code"].as_str()),
        (422, Some("image_not_found")),
        "{missing}"
    );
    seen.push(missing.to_string());
    for text in &seen {
        assert!(!leaks(text), "the secret is in a response: {text}");
    }
    drop(served);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.lines().count() > 5, "{logged}");
    assert!(!leaks(&logged), "the secret is in the log:\n{logged}");

    // Nor does `toolexec config` show it, nor the image's record in the cache.
    let out = toolexec(data.path())
        .arg("config")
        .env("TOOLEXEC_ENVIRONMENTS__CREDENTIALS", &credentials)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(shown.contains(USER), "{shown}");
    assert!(!leaks(&shown), "{shown}");
    let record = std::fs::read_to_string(
        data.path()
            .join("workspaces/.images/sha256")
            .join(digest.trim_start_matches("sha256:"))
            .join("image.json"),
    )
    .unwrap();
    assert!(!leaks(&record), "{record}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_images_env_loses_what_a_sessions_env_may_not_hold() {
    let registry = Registry::start();
    let roots = tempfile::tempdir().unwrap();
    busybox_root(roots.path());
    std::fs::write(roots.path().join("etc/hook.sh"), "echo HOOK-RAN\n").unwrap();
    registry.push(
        roots.path(),
        &[
            "PATH=/bin",
            "KEPT=yes",
            "BASH_ENV=/etc/hook.sh",
            "ENV=/etc/hook.sh",
            "LD_PRELOAD=/nowhere.so",
            "PYTHONPATH=/opt/evil",
            "GIT_CONFIG_COUNT=1",
        ],
        "bb:env",
    );
    let data = private_dir();
    let served = serve_with(&registry, data.path(), &[]);
    let s = session(
        &served,
        json!({"environment": {"image": format!("{}/bb:env", registry.host)}}),
    )
    .await;
    let sid = s["id"].as_str().unwrap();
    let (code, out) = sh(
        &served,
        sid,
        "c1",
        "echo \"$KEPT [$BASH_ENV] [$ENV] [$LD_PRELOAD] [$PYTHONPATH] [$GIT_CONFIG_COUNT]\"",
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "yes [] [] [] [] []\n"));
    // The session's own env still goes through its rule (refused, not dropped).
    let (status, body) = post(
        &served,
        "/v1/sessions",
        json!({"environment": {"image": format!("{}/bb:env", registry.host)},
               "env": {"BASH_ENV": "/etc/hook.sh"}}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("invalid_env")),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_on_a_network_the_operator_did_not_allow_is_not_reached() {
    let registry = Registry::start();
    let roots = tempfile::tempdir().unwrap();
    busybox_root(roots.path());
    registry.push(roots.path(), &["PATH=/bin"], "bb:1");
    let data = private_dir();
    // Allowed as a registry, but on loopback, which environments.allow_cidrs does not name.
    let served = serve(serve_command(&registry.host, data.path(), None));
    let (status, body) = post(
        &served,
        "/v1/sessions",
        json!({"environment": {"image": format!("{}/bb:1", registry.host)}}),
    )
    .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("image_not_allowed")),
        "{body}"
    );
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("environments.allow_cidrs"), "{body}");
    assert!(detail.contains("loopback"), "{body}");
    // What to do about it, not only what happened.
    assert!(
        detail.contains("add its address or network to environments.allow_cidrs"),
        "{body}"
    );
}
