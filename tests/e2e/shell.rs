//! The sandboxed shell over HTTP: results, limits, background processes, the recorded side
//! effects, and issue 4's "done when": a build-and-test loop fixed through the API.
use std::collections::BTreeMap;

use serde_json::{Value, json};
use toolexec_core::sha256_hex;
use toolexec_tests::app::{TestApp, spawn_app, spawn_app_with};
use toolexec_tests::fixtures::{fixture_dir, text_files};

fn content(r: &Value) -> &str {
    r["content"].as_str().unwrap_or_default()
}

/// The file events of one invocation: path → (kind, capability, data).
fn file_events(events: &[Value], invocation_id: &str) -> BTreeMap<String, (String, Value)> {
    events
        .iter()
        .filter(|e| e["invocation_id"] == invocation_id)
        .filter(|e| e["kind"].as_str().unwrap().starts_with("file."))
        .map(|e| {
            (
                e["data"]["path"].as_str().unwrap().to_owned(),
                (e["kind"].as_str().unwrap().to_owned(), e["data"].clone()),
            )
        })
        .collect()
}

async fn session_with(app: &TestApp, files: Value) -> String {
    let s = app.session(json!({"files": files})).await;
    s["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_runs_in_the_sandbox_and_reports_exit_code_stdout_stderr() {
    let app = spawn_app().await;
    let ready: Value = app.get("/readyz").await.json().await.unwrap();
    assert_eq!(ready["sandbox"]["mode"], "enforced", "{ready}");
    assert_eq!(ready["sandbox"]["ready"], true, "{ready}");
    let sid = session_with(&app, json!({})).await;
    let r = app
        .call(
            &sid,
            "c1",
            "shell",
            json!({"command": "echo out; echo err >&2; id -u; pwd; exit 3"}),
        )
        .await;
    assert_eq!(r["status"], "error");
    assert!(
        content(&r).starts_with("[exit code 3 after "),
        "{}",
        content(&r)
    );
    assert!(
        content(&r).contains("--- stdout ---\nout\n65534\n/workspace\n"),
        "{}",
        content(&r)
    );
    assert!(
        content(&r).contains("--- stderr ---\nerr\n"),
        "{}",
        content(&r)
    );
    let ok = app
        .call(&sid, "c2", "shell", json!({"command": "true"}))
        .await;
    assert_eq!(ok["status"], "ok");
    assert!(content(&ok).contains("(no output)"), "{}", content(&ok));
    // The invocation records the capabilities shell claims.
    let inv = app.invocation_of(&ok).await;
    assert_eq!(
        inv["capabilities"],
        json!(["process", "fs.read", "fs.write"]),
        "{inv}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workdir_timeouts_and_arguments_are_checked() {
    let app = spawn_app_with(|c| c.limits.max_timeout_ms = 5_000).await;
    let sid = session_with(&app, json!({"src/a.txt": "a\n"})).await;
    let r = app
        .call(
            &sid,
            "w1",
            "shell",
            json!({"command": "pwd; ls", "workdir": "src"}),
        )
        .await;
    assert!(
        content(&r).contains("/workspace/src\na.txt\n"),
        "{}",
        content(&r)
    );
    let r = app
        .call(
            &sid,
            "w2",
            "shell",
            json!({"command": "pwd", "workdir": "/workspace/src/.."}),
        )
        .await;
    assert!(
        content(&r).contains("--- stdout ---\n/workspace\n"),
        "{}",
        content(&r)
    );
    let r = app
        .call(
            &sid,
            "w3",
            "shell",
            json!({"command": "pwd", "workdir": "../.."}),
        )
        .await;
    assert_eq!(r["status"], "denied", "{r}");
    let r = app
        .call(
            &sid,
            "w4",
            "shell",
            json!({"command": "pwd", "workdir": "missing"}),
        )
        .await;
    assert!(r["is_error"].as_bool().unwrap(), "{r}");
    // Above the operator's ceiling: refused before anything runs, with what to do instead.
    let r = app
        .call(
            &sid,
            "t1",
            "shell",
            json!({"command": "true", "timeout_ms": 6_000}),
        )
        .await;
    assert_eq!(r["status"], "invalid_arguments", "{r}");
    assert!(
        content(&r).contains("ceiling of 5000 ms"),
        "{}",
        content(&r)
    );
    // The session's default timeout applies when the call gives none.
    let s = app
        .session(json!({"policy": {"default_timeout_ms": 700}}))
        .await;
    let sid2 = s["id"].as_str().unwrap();
    let t0 = std::time::Instant::now();
    let r = app
        .call(
            sid2,
            "t2",
            "shell",
            json!({"command": "echo before; sleep 20"}),
        )
        .await;
    assert_eq!(r["status"], "timed_out", "{r}");
    assert!(
        content(&r).starts_with("[timed out after 700 ms"),
        "{}",
        content(&r)
    );
    assert!(
        content(&r).contains("before"),
        "output so far is kept: {}",
        content(&r)
    );
    assert!(t0.elapsed() < std::time::Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_changes_made_by_a_command_are_recorded_with_their_contents() {
    let app = spawn_app().await;
    let sid = session_with(&app, json!({"keep.txt": "one\n", "gone.txt": "bye\n"})).await;
    let r = app
        .call(
            &sid,
            "s1",
            "shell",
            json!({"command": "echo two >> keep.txt; rm gone.txt; mkdir -p d/e; printf new > d/e/new.txt; ln -s keep.txt link"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let events = app.events(&sid).await;
    let changes = file_events(&events, r["invocation_id"].as_str().unwrap());
    let kinds: BTreeMap<&str, &str> = changes
        .iter()
        .map(|(p, (k, _))| (p.as_str(), k.as_str()))
        .collect();
    assert_eq!(
        kinds,
        BTreeMap::from([
            ("d/e/new.txt", "file.created"),
            ("gone.txt", "file.deleted"),
            ("keep.txt", "file.modified"),
            ("link", "file.created"),
        ]),
        "{changes:?}"
    );
    let keep = &changes["keep.txt"].1;
    assert_eq!(keep["capability"], "process");
    assert_eq!(keep["before_sha256"], sha256_hex(b"one\n"));
    assert_eq!(keep["after_sha256"], sha256_hex(b"one\ntwo\n"));
    assert_eq!(keep["after_stored"], true);
    assert_eq!(changes["link"].1["symlink_target"], "keep.txt");
    // The new contents are in the blob store, retrievable by hash through the invocation.
    let inv = app.invocation_of(&r).await;
    assert!(inv.to_string().contains(&sha256_hex(b"new")), "{inv}");

    // A file read earlier and changed by a command must be read again before an edit.
    let read = app
        .call(&sid, "r1", "read_file", json!({"file_path": "keep.txt"}))
        .await;
    assert_eq!(read["status"], "ok");
    app.call(
        &sid,
        "s2",
        "shell",
        json!({"command": "echo three >> keep.txt"}),
    )
    .await;
    let edit = app
        .call(
            &sid,
            "e1",
            "edit_file",
            json!({"file_path": "keep.txt", "old_string": "one", "new_string": "uno"}),
        )
        .await;
    assert_eq!(edit["status"], "denied", "{edit}");
    // A command that changes nothing records nothing.
    let quiet = app
        .call(&sid, "s3", "shell", json!({"command": "ls > /dev/null"}))
        .await;
    let events = app.events(&sid).await;
    assert!(file_events(&events, quiet["invocation_id"].as_str().unwrap()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_processes_take_input_give_output_and_their_lifecycle_is_logged() {
    let app = spawn_app().await;
    let sid = session_with(&app, json!({})).await;
    let start = app
        .call(
            &sid,
            "b1",
            "shell",
            json!({"command": "echo ready; while read line; do echo \"got:$line\"; done; echo bye", "background": true}),
        )
        .await;
    assert_eq!(start["status"], "ok", "{start}");
    assert!(
        content(&start).contains("Started background process p1"),
        "{}",
        content(&start)
    );
    let first = app
        .call(
            &sid,
            "r1",
            "process_read",
            json!({"process_id": "p1", "wait_ms": 5000}),
        )
        .await;
    assert!(content(&first).contains("running"), "{}", content(&first));
    assert!(content(&first).contains("ready\n"), "{}", content(&first));
    assert!(
        content(&first).contains("next: after=6"),
        "{}",
        content(&first)
    );
    let w = app
        .call(
            &sid,
            "w1",
            "process_write",
            json!({"process_id": "p1", "input": "hello\n"}),
        )
        .await;
    assert_eq!(w["status"], "ok", "{w}");
    let second = app
        .call(
            &sid,
            "r2",
            "process_read",
            json!({"process_id": "p1", "after": 6, "wait_ms": 5000}),
        )
        .await;
    assert!(
        content(&second).contains("got:hello\n"),
        "{}",
        content(&second)
    );
    assert!(
        !content(&second).contains("ready"),
        "only new output: {}",
        content(&second)
    );
    let kill = app
        .call(&sid, "k1", "process_kill", json!({"process_id": "p1"}))
        .await;
    assert_eq!(kill["status"], "ok", "{kill}");
    assert!(
        content(&kill).contains("stopped by process_kill (SIGTERM)"),
        "{}",
        content(&kill)
    );
    let unknown = app
        .call(&sid, "r3", "process_read", json!({"process_id": "p9"}))
        .await;
    assert_eq!(unknown["status"], "error");
    let events = app.events(&sid).await;
    let started: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "process.started")
        .collect();
    let exited: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "process.exited")
        .collect();
    assert_eq!(started.len(), 1, "{events:?}");
    assert_eq!(started[0]["invocation_id"], start["invocation_id"]);
    assert_eq!(started[0]["data"]["process_id"], "p1");
    assert_eq!(exited.len(), 1, "recorded once: {events:?}");
    assert_eq!(exited[0]["invocation_id"], kill["invocation_id"]);
    assert_eq!(exited[0]["data"]["state"]["state"], "exited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_sandbox_fails_closed_and_readyz_says_why() {
    let app =
        spawn_app_with(|c| c.sandbox.init = Some("/nonexistent/toolexec-sandbox-init".into()))
            .await;
    let resp = app.get("/readyz").await;
    assert_eq!(resp.status(), 503);
    let ready: Value = resp.json().await.unwrap();
    assert_eq!(ready["sandbox"]["mode"], "unavailable", "{ready}");
    assert!(
        ready["sandbox"]["detail"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/toolexec-sandbox-init"),
        "{ready}"
    );
    let sid = session_with(&app, json!({})).await;
    let r = app
        .call(&sid, "s1", "shell", json!({"command": "touch ran"}))
        .await;
    assert_eq!(r["status"], "error", "{r}");
    assert!(
        content(&r).contains("Infrastructure error"),
        "{}",
        content(&r)
    );
    let ls = app.call(&sid, "l1", "list_dir", json!({"path": "."})).await;
    assert!(!content(&ls).contains("ran"), "{}", content(&ls));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsandboxed_mode_is_explicit_and_shown_everywhere() {
    let app = spawn_app_with(|c| c.sandbox.mode = toolexec_sandbox::SandboxMode::Unsandboxed).await;
    let ready: Value = app.get("/readyz").await.json().await.unwrap();
    assert_eq!(ready["sandbox"]["mode"], "unsandboxed", "{ready}");
    let sid = session_with(&app, json!({})).await;
    let r = app
        .call(&sid, "s1", "shell", json!({"command": "echo hi"}))
        .await;
    assert!(content(&r).starts_with("[UNSANDBOXED"), "{}", content(&r));
}

/// Issue 4's "done when": the loop of a coding agent — build and test, read the failure, fix,
/// build and test again — through the API only, inside the sandbox, with every step logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_and_test_loop_finds_and_fixes_a_bug_through_the_api() {
    let app = spawn_app().await;
    let files = text_files(&fixture_dir("inventory"));
    let sid = session_with(&app, json!(files)).await;

    let first = app
        .call(
            &sid,
            "t1",
            "shell",
            json!({"command": "make test", "timeout_ms": 60_000}),
        )
        .await;
    assert_eq!(first["status"], "error", "{first}");
    let out = content(&first);
    assert!(
        out.contains("FAIL: test_cannot_remove_more_than_in_stock"),
        "{out}"
    );
    assert!(
        out.contains("AssertionError: OutOfStock not raised"),
        "{out}"
    );
    assert!(out.contains("Ran 3 tests"), "{out}");

    // The build wrote byte code: recorded as the command's changes.
    let events = app.events(&sid).await;
    let built = file_events(&events, first["invocation_id"].as_str().unwrap());
    assert!(
        built
            .keys()
            .any(|p| p.starts_with("inventory/__pycache__/stock.")),
        "{built:?}"
    );
    assert!(
        built
            .values()
            .all(|(k, d)| k == "file.created" && d["capability"] == "process")
    );

    // Find the check, read it, fix it.
    let grep = app
        .call(
            &sid,
            "g1",
            "grep",
            json!({"pattern": "raise OutOfStock", "path": "inventory"}),
        )
        .await;
    assert!(
        content(&grep).contains("inventory/stock.py:"),
        "{}",
        content(&grep)
    );
    let read = app
        .call(
            &sid,
            "r1",
            "read_file",
            json!({"file_path": "inventory/stock.py"}),
        )
        .await;
    assert!(
        content(&read).contains("if quantity > have + 1:"),
        "{}",
        content(&read)
    );
    let fix = app
        .call(
            &sid,
            "e1",
            "edit_file",
            json!({"file_path": "inventory/stock.py", "old_string": "if quantity > have + 1:", "new_string": "if quantity > have:"}),
        )
        .await;
    assert_eq!(fix["status"], "ok", "{fix}");

    let second = app
        .call(
            &sid,
            "t2",
            "shell",
            json!({"command": "make test", "timeout_ms": 60_000}),
        )
        .await;
    assert_eq!(second["status"], "ok", "{second}");
    assert!(
        content(&second).starts_with("[exit code 0 after "),
        "{}",
        content(&second)
    );
    assert!(
        content(&second).contains("Ran 3 tests"),
        "{}",
        content(&second)
    );
    assert!(content(&second).contains("\nOK\n"), "{}", content(&second));

    // The log: the fix is edit_file's (fs.write); the rebuild rewrote the byte code of the
    // fixed module only.
    let events = app.events(&sid).await;
    let fixed = file_events(&events, fix["invocation_id"].as_str().unwrap());
    assert_eq!(fixed.keys().collect::<Vec<_>>(), ["inventory/stock.py"]);
    assert_eq!(fixed["inventory/stock.py"].1["capability"], "fs.write");
    let rebuilt = file_events(&events, second["invocation_id"].as_str().unwrap());
    assert_eq!(rebuilt.len(), 1, "{rebuilt:?}");
    let (path, (kind, _)) = rebuilt.iter().next().unwrap();
    assert!(path.starts_with("inventory/__pycache__/stock."), "{path}");
    assert_eq!(kind, "file.modified");
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as i64).collect::<Vec<_>>(),
        "gapless log"
    );
}

/// A web server on the host, on a loopback address of its own (127.0.0.2), answering every
/// request with `hello from the host`.
async fn host_web_server() -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = s.read(&mut buf).await;
                let body = "hello from the host";
                let _ = s
                    .write_all(format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()).as_bytes())
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_network_in_the_policy_a_command_reaches_nothing() {
    let web = host_web_server().await;
    let app = spawn_app_with(|c| c.sandbox.egress_allow_cidrs = vec!["127.0.0.2/32".into()]).await;
    let sid = session_with(&app, json!({})).await;
    let r = app
        .call(
            &sid,
            "n1",
            "shell",
            json!({"command": format!("env | grep -ci proxy; curl -sS -m 3 http://{web}/")}),
        )
        .await;
    assert_eq!(r["status"], "error", "{r}");
    assert!(
        content(&r).contains("--- stdout ---\n0\n"),
        "no proxy settings: {}",
        content(&r)
    );
    assert!(
        !content(&r).contains("hello from the host"),
        "{}",
        content(&r)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_network_allowed_egress_goes_through_the_filtering_proxy() {
    let web = host_web_server().await;
    // The operator allow-lists the test server's address; everything else non-public stays shut.
    let app = spawn_app_with(|c| c.sandbox.egress_allow_cidrs = vec!["127.0.0.2/32".into()]).await;
    let s = app.session(json!({"policy": {"network": "allow"}})).await;
    let sid = s["id"].as_str().unwrap();
    let fetch = |id: &'static str, cmd: String| {
        let app = &app;
        async move {
            app.call(
                sid,
                id,
                "shell",
                json!({"command": cmd, "timeout_ms": 20_000}),
            )
            .await
        }
    };
    // Plain HTTP through the proxy, and the same through a CONNECT tunnel (what HTTPS uses).
    let r = fetch("e1", format!("curl -sS -m 5 http://{web}/")).await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(
        content(&r).contains("hello from the host"),
        "{}",
        content(&r)
    );
    let r = fetch("e2", format!("curl -sS -m 5 -p http://{web}/")).await;
    assert!(
        content(&r).contains("hello from the host"),
        "{}",
        content(&r)
    );
    let r = fetch(
        "e3",
        format!("python3 -c \"import urllib.request; print(urllib.request.urlopen('http://{web}/').read().decode())\""),
    )
    .await;
    assert!(
        content(&r).contains("hello from the host"),
        "{}",
        content(&r)
    );
    // Around the proxy there is no route at all.
    let r = fetch("e4", format!("curl -sS -m 3 --noproxy '*' http://{web}/")).await;
    assert_eq!(r["status"], "error", "{r}");
    // Through it, what is not allow-listed is refused: the service's own Postgres, the rest of
    // loopback, the metadata address, private ranges, odd spellings of loopback.
    for (i, target) in [
        "http://127.0.0.1:5432/",
        "http://127.0.0.3/",
        "http://localhost:5432/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://0x7f000001:5432/",
        "http://[::ffff:127.0.0.1]:5432/",
        "http://[::1]:5432/",
    ]
    .iter()
    .enumerate()
    {
        // The proxy named explicitly (NO_PROXY would send loopback names around it, where
        // there is no route either).
        for (k, tunnel) in ["", "-p"].iter().enumerate() {
            let id: &'static str = Box::leak(format!("d{i}-{k}").into_boxed_str());
            let r = fetch(
                id,
                format!("curl -sS -m 5 -x http://127.0.0.1:3128 --noproxy '' {tunnel} {target}; echo \"exit=$?\""),
            )
            .await;
            let out = content(&r);
            assert!(
                out.contains("403") || out.contains("non-public"),
                "{target} {tunnel} not refused by the proxy: {out}"
            );
            assert!(!out.contains("hello from the host"), "{out}");
        }
    }
    // The log says what commands reached and what they were refused, never an address's class.
    let requests: Vec<Value> = app
        .events(sid)
        .await
        .into_iter()
        .filter(|e| e["kind"] == "network.request")
        .map(|e| e["data"].clone())
        .collect();
    let web_host = web.ip().to_string();
    let allowed: Vec<&Value> = requests.iter().filter(|r| r["allowed"] == true).collect();
    assert!(allowed.len() >= 3, "{requests:?}");
    for r in &allowed {
        assert_eq!(r["host"], web_host.as_str(), "{r}");
        assert_eq!(r["port"], web.port(), "{r}");
        assert!(r["bytes_received"].as_u64().unwrap() > 0, "{r}");
        assert!(r["refused"].is_null(), "{r}");
    }
    assert!(
        allowed.iter().any(|r| r["method"] == "CONNECT"),
        "{allowed:?}"
    );
    assert!(allowed.iter().any(|r| r["method"] == "GET"), "{allowed:?}");
    let refused: Vec<&Value> = requests.iter().filter(|r| r["allowed"] == false).collect();
    assert_eq!(refused.len(), 16, "{refused:?}");
    for r in &refused {
        assert_eq!(r["refused"], "not_reachable", "{r}");
        assert_eq!(r["bytes_received"], 0, "{r}");
    }
    assert!(
        refused.iter().any(|r| r["host"] == "169.254.169.254"),
        "{refused:?}"
    );
    assert!(
        refused.iter().any(|r| r["host"] == "localhost"),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_without_egress_refuses_sessions_that_ask_for_network() {
    let app = spawn_app_with(|c| c.sandbox.egress = false).await;
    let resp = app
        .post("/v1/sessions", &json!({"policy": {"network": "allow"}}))
        .await;
    assert_eq!(resp.status(), 422);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "policy_above_ceiling", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_stops_background_processes_and_they_are_recorded_as_interrupted() {
    let app = spawn_app().await;
    let sid = session_with(&app, json!({})).await;
    let r = app
        .call(
            &sid,
            "b1",
            "shell",
            json!({"command": "sleep 4321.5", "background": true}),
        )
        .await;
    assert!(content(&r).contains("process p1"), "{}", content(&r));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !host_has(&["sleep", "4321.5"]) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        host_has(&["sleep", "4321.5"]),
        "the background process runs on the host"
    );
    let app = app.restart().await;
    // The process died with the service that started it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while host_has(&["sleep", "4321.5"]) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        !host_has(&["sleep", "4321.5"]),
        "the background process outlived the service"
    );
    let first = app
        .call(&sid, "r1", "process_read", json!({"process_id": "p1"}))
        .await;
    assert_eq!(first["status"], "error");
    assert!(
        content(&first).contains("the service restarted"),
        "{}",
        content(&first)
    );
    let again = app
        .call(&sid, "r2", "process_kill", json!({"process_id": "p1"}))
        .await;
    assert!(
        content(&again).contains("the service restarted"),
        "{}",
        content(&again)
    );
    let events = app.events(&sid).await;
    let exits: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "process.exited")
        .collect();
    assert_eq!(exits.len(), 1, "recorded once: {exits:?}");
    assert_eq!(exits[0]["invocation_id"], first["invocation_id"]);
    assert_eq!(exits[0]["data"]["state"]["state"], "interrupted");
    // A new process never reuses the id of one from before the restart.
    let r = app
        .call(
            &sid,
            "b2",
            "shell",
            json!({"command": "sleep 1", "background": true}),
        )
        .await;
    assert!(!content(&r).contains("process p1."), "{}", content(&r));
}

/// Whether a host process has exactly this command line.
fn host_has(argv: &[&str]) -> bool {
    let cmdline = argv.join("\0");
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .map(|c| c.strip_suffix(b"\0").unwrap_or(&c) == cmdline.as_bytes())
            .unwrap_or(false)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_runs_at_most_its_limit_of_background_processes() {
    let app = spawn_app_with(|c| c.sandbox.max_background = 2).await;
    let sid = session_with(&app, json!({})).await;
    let start = |id: &'static str| {
        let app = &app;
        let sid = &sid;
        async move {
            app.call(
                sid,
                id,
                "shell",
                json!({"command": "sleep 60", "background": true}),
            )
            .await
        }
    };
    assert_eq!(start("b1").await["status"], "ok");
    assert_eq!(start("b2").await["status"], "ok");
    let third = start("b3").await;
    assert_eq!(third["status"], "error", "{third}");
    assert!(
        content(&third).contains("already runs 2 background processes (the limit is 2)"),
        "{}",
        content(&third)
    );
    let kill = app
        .call(
            &sid,
            "k1",
            "process_kill",
            json!({"process_id": "p1", "signal": "KILL"}),
        )
        .await;
    assert!(
        content(&kill).contains("stopped by process_kill (SIGKILL)"),
        "{}",
        content(&kill)
    );
    assert_eq!(start("b4").await["status"], "ok");
}
