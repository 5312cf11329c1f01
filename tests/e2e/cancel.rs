//! Cancelling what runs (issue 9): a running call cancelled by its invocation id, a session's
//! pending calls cancelled at once, and a client that goes away in the middle of a batch — over
//! HTTP, on both stores, with the host's `/proc` as the judge of what still runs.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use toolexec_tests::app::{TestApp, spawn_app, spawn_sqlite_app};
use toolexec_tests::procs::{assert_no_host_process, sleep_arg, wait_for_sleep};

/// The recorded state of each call id of a session, from its log: `running` between its
/// `invocation.started` and `invocation.finished` events, then the finished status (a read
/// recorded in one event is only ever finished).
async fn call_states(app: &TestApp, sid: &str) -> BTreeMap<String, String> {
    let mut states = BTreeMap::new();
    for e in app.events(sid).await {
        let call_id = e["data"]["call_id"].as_str().unwrap_or_default().to_owned();
        match e["kind"].as_str() {
            Some("invocation.started") => {
                states
                    .entry(call_id)
                    .or_insert_with(|| "running".to_owned());
            }
            Some("invocation.finished") => {
                states.insert(call_id, e["data"]["status"].as_str().unwrap().to_owned());
            }
            _ => {}
        }
    }
    states
}

/// Waits (up to `limit`) until the log records every one of `calls` as finished; the states.
async fn wait_recorded(
    app: &TestApp,
    sid: &str,
    calls: &[&str],
    limit: Duration,
) -> BTreeMap<String, String> {
    let deadline = Instant::now() + limit;
    loop {
        let states = call_states(app, sid).await;
        let done = calls
            .iter()
            .all(|c| states.get(*c).is_some_and(|s| s != "running"));
        if done || Instant::now() >= deadline {
            return states;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends a POST over a raw connection and returns it unread: dropping it is a client that goes
/// away (the user closed the tab, the network dropped) without waiting for the answer.
async fn post_and_keep_connection(
    app: &TestApp,
    path: &str,
    body: &Value,
) -> tokio::net::TcpStream {
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let body = serde_json::to_vec(body).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body).await.unwrap();
    stream.flush().await.unwrap();
    stream
}

/// Waits (up to 10 s) for the `invocation.started` event of `call_id`; its invocation id.
async fn started_invocation(app: &TestApp, sid: &str, call_id: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = app
            .events(sid)
            .await
            .into_iter()
            .find(|e| e["kind"] == "invocation.started" && e["data"]["call_id"] == call_id);
        if let Some(e) = found {
            return e["invocation_id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "{call_id} never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Posts a batch in the background; its response (status and body) when it comes.
fn post_batch(app: &TestApp, sid: &str, calls: &Value) -> tokio::task::JoinHandle<(u16, Value)> {
    let req = app
        .http
        .post(app.url(&format!("/v1/sessions/{sid}/calls")))
        .json(&json!({ "calls": calls }));
    tokio::spawn(async move {
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap())
    })
}

/// `POST` with no body; status, body and how long it took.
async fn post_empty(app: &TestApp, path: &str) -> (u16, Value, Duration) {
    let t0 = Instant::now();
    let resp = app.http.post(app.url(path)).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap(), t0.elapsed())
}

fn paths_of(inv: &Value) -> Vec<String> {
    inv["side_effects"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["data"]["path"].as_str().map(str::to_owned))
        .collect()
}

/// Whether `path` exists in the session's workspace, asked the way a model would.
async fn exists(app: &TestApp, sid: &str, probe_id: &str, path: &str) -> bool {
    let r = app
        .call(sid, probe_id, "glob", json!({"pattern": path}))
        .await;
    r["content"].as_str().unwrap().lines().any(|l| l == path)
}

// ---------------------------------------------------------------------------------------------
// A client that disconnects in the middle of a batch
// ---------------------------------------------------------------------------------------------

async fn a_client_that_disconnects_mid_batch_leaves_no_call_running(app: &TestApp) {
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let arg = sleep_arg(2);
    let calls = json!([
        {"id": "running", "name": "shell", "arguments": {
            "command": format!("echo started; echo x > before.txt; sleep {arg}; echo y > after.txt; echo finished"),
            "timeout_ms": 60_000}},
        {"id": "queued-write", "name": "write_file", "arguments": {"file_path": "queued.txt", "content": "never"}},
        {"id": "queued-read", "name": "read_file", "arguments": {"file_path": "before.txt"}},
    ]);
    let path = format!("/v1/sessions/{sid}/calls");
    let conn = post_and_keep_connection(app, &path, &json!({ "calls": calls })).await;
    wait_for_sleep(&arg)
        .await
        .expect("the shell call never started");
    drop(conn);

    // The running call finishes and is recorded; the queued ones are recorded cancelled.
    let states = wait_recorded(
        app,
        &sid,
        &["running", "queued-write", "queued-read"],
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(
        states.get("running").map(String::as_str),
        Some("ok"),
        "{states:?}"
    );
    assert_eq!(
        states.get("queued-write").map(String::as_str),
        Some("cancelled"),
        "{states:?}"
    );
    assert_eq!(
        states.get("queued-read").map(String::as_str),
        Some("cancelled"),
        "{states:?}"
    );

    // A retry of the batch after the network came back: the command's real result and the
    // cancelled records, nothing run again.
    let events_before = app.events(&sid).await.len();
    let results = app.calls(&sid, calls.clone()).await;
    assert_eq!(results[0]["status"], "ok", "{results:?}");
    let content = results[0]["content"].as_str().unwrap();
    assert!(
        content.contains("started") && content.contains("finished"),
        "{content}"
    );
    for r in &results[1..] {
        assert_eq!(r["status"], "cancelled", "{r}");
        let text = r["content"].as_str().unwrap();
        assert!(
            text.contains("client") && text.contains("Nothing ran"),
            "{text}"
        );
    }
    assert_eq!(
        app.events(&sid).await.len(),
        events_before,
        "a retry ran something"
    );

    // The command's files are recorded; the queued write never happened.
    let inv = app.invocation_of(&results[0]).await;
    let paths: Vec<&str> = inv["side_effects"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["data"]["path"].as_str())
        .collect();
    assert!(
        paths.contains(&"before.txt") && paths.contains(&"after.txt"),
        "{inv}"
    );
    let listing = app
        .call(&sid, "look", "list_dir", json!({"path": "."}))
        .await;
    let listing = listing["content"].as_str().unwrap();
    assert!(!listing.contains("queued.txt"), "{listing}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_a_client_that_disconnects_mid_batch_leaves_no_call_running_on_postgres() {
    a_client_that_disconnects_mid_batch_leaves_no_call_running(&spawn_app().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_a_client_that_disconnects_mid_batch_leaves_no_call_running_on_sqlite() {
    a_client_that_disconnects_mid_batch_leaves_no_call_running(&spawn_sqlite_app().await).await;
}

/// A batch outlives its request, so a service that stops must wait for it too: the call whose
/// client went away is recorded as it ended, not found `running` and marked `interrupted` at the
/// next start.
async fn a_batch_whose_client_went_away_finishes_before_the_service_stops(app: TestApp) {
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let arg = sleep_arg(1);
    let calls = json!([{"id": "running", "name": "shell", "arguments": {
        "command": format!("sleep {arg}; echo done > after.txt"), "timeout_ms": 60_000}}]);
    let path = format!("/v1/sessions/{sid}/calls");
    let conn = post_and_keep_connection(&app, &path, &json!({ "calls": calls })).await;
    wait_for_sleep(&arg)
        .await
        .expect("the shell call never started");
    drop(conn);
    // Let the server see the connection go, then stop it while the command still runs.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let app = app.restart().await;
    let states = call_states(&app, &sid).await;
    assert_eq!(
        states.get("running").map(String::as_str),
        Some("ok"),
        "{states:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_a_batch_whose_client_went_away_finishes_before_the_service_stops_on_postgres() {
    a_batch_whose_client_went_away_finishes_before_the_service_stops(spawn_app().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_a_batch_whose_client_went_away_finishes_before_the_service_stops_on_sqlite() {
    a_batch_whose_client_went_away_finishes_before_the_service_stops(spawn_sqlite_app().await)
        .await;
}

// ---------------------------------------------------------------------------------------------
// Cancelling one running call
// ---------------------------------------------------------------------------------------------

async fn cancelling_a_running_command_kills_its_tree_and_records_what_it_did(app: &TestApp) {
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (child, main) = (sleep_arg(300), sleep_arg(301));
    let call = json!({"id": "long", "name": "shell", "arguments": {
        "command": format!("echo before; echo data > made.txt; (sleep {child} &); sleep {main}; echo after"),
        "timeout_ms": 600_000}});
    let batch = post_batch(app, &sid, &json!([call]));
    wait_for_sleep(&main)
        .await
        .expect("the command never started");
    let inv_id = started_invocation(app, &sid, "long").await;

    let (status, inv, took) = post_empty(app, &format!("/v1/invocations/{inv_id}/cancel")).await;
    assert_eq!(status, 200, "{inv}");
    assert!(took < Duration::from_secs(3), "the cancel took {took:?}");
    assert_eq!(inv["status"], "cancelled", "{inv}");
    let content = inv["content"].as_str().unwrap();
    assert!(content.contains("[cancelled after"), "{content}");
    assert!(
        content.contains("before") && !content.contains("after\n"),
        "{content}"
    );
    assert!(paths_of(&inv).contains(&"made.txt".to_owned()), "{inv}");
    for arg in [&child, &main] {
        assert_no_host_process(&format!("sleep {arg}"), "a cancelled command").await;
    }

    // The batch's own answer says the same.
    let (code, body) = batch.await.unwrap();
    assert_eq!(code, 200, "{body}");
    let r = &body["results"][0];
    assert_eq!(r["status"], "cancelled", "{r}");
    assert_eq!(r["invocation_id"], inv_id.as_str(), "{r}");

    // Cancelling again changes nothing; a retry of the call id returns the cancelled record.
    let events = app.events(&sid).await.len();
    let (status, again, _) = post_empty(app, &format!("/v1/invocations/{inv_id}/cancel")).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["status"], "cancelled");
    assert_eq!(again["finished_seq"], inv["finished_seq"]);
    let retry = app.calls(&sid, json!([call])).await;
    assert_eq!(retry[0]["status"], "cancelled", "{retry:?}");
    assert_eq!(retry[0]["invocation_id"], inv_id.as_str());
    assert_eq!(
        app.events(&sid).await.len(),
        events,
        "a retry or a second cancel ran something"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_a_running_command_kills_its_tree_and_records_what_it_did_on_postgres() {
    cancelling_a_running_command_kills_its_tree_and_records_what_it_did(&spawn_app().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_a_running_command_kills_its_tree_and_records_what_it_did_on_sqlite() {
    cancelling_a_running_command_kills_its_tree_and_records_what_it_did(&spawn_sqlite_app().await)
        .await;
}

/// A read-only call has an invocation id while it runs when the operator records its start
/// first; `process_read` waiting for output then stops at a cancel and says what it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_read_only_call_waiting_for_output_when_its_start_is_recorded() {
    let app =
        toolexec_tests::app::spawn_sqlite_app_with(|c| c.durable_start_for_read_only = true).await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let arg = sleep_arg(300);
    let started = app
        .call(
            &sid,
            "bg",
            "shell",
            json!({"command": format!("echo hi; sleep {arg}"), "background": true}),
        )
        .await;
    assert_eq!(started["status"], "ok", "{started}");
    let batch = post_batch(
        &app,
        &sid,
        &json!([{"id": "wait", "name": "process_read", "arguments": {"process_id": "p1", "after": 3, "wait_ms": 30_000}}]),
    );
    let inv = started_invocation(&app, &sid, "wait").await;
    let (status, body, took) = post_empty(&app, &format!("/v1/invocations/{inv}/cancel")).await;
    assert_eq!(status, 200, "{body}");
    assert!(took < Duration::from_secs(3), "the cancel took {took:?}");
    assert_eq!(body["status"], "cancelled", "{body}");
    let content = body["content"].as_str().unwrap();
    assert!(
        content.contains("cancelled by the client while waiting"),
        "{content}"
    );
    assert_eq!(batch.await.unwrap().1["results"][0]["status"], "cancelled");
    // The background process itself still runs.
    assert!(wait_for_sleep(&arg).await.is_some());
}

// ---------------------------------------------------------------------------------------------
// Cancelling a session's pending calls
// ---------------------------------------------------------------------------------------------

async fn cancelling_a_sessions_pending_calls_stops_the_running_one_and_the_rest_never_run(
    app: &TestApp,
) {
    let sid = app.session(json!({"files": {"seen.txt": "hello\n"}})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let arg = sleep_arg(300);
    let calls = json!([
        {"id": "sleep", "name": "shell", "arguments": {"command": format!("echo so-far; sleep {arg}"), "timeout_ms": 600_000}},
        {"id": "write", "name": "write_file", "arguments": {"file_path": "new.txt", "content": "x"}},
        {"id": "read", "name": "read_file", "arguments": {"file_path": "seen.txt"}},
    ]);
    let batch = post_batch(app, &sid, &calls);
    wait_for_sleep(&arg)
        .await
        .expect("the command never started");

    let (status, report, took) = post_empty(app, &format!("/v1/sessions/{sid}/cancel")).await;
    assert_eq!(status, 200, "{report}");
    assert!(took < Duration::from_secs(3), "the cancel took {took:?}");
    assert_eq!(report["ended"], true, "{report}");
    let stopped: Vec<&str> = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(stopped, ["sleep", "write", "read"], "{report}");
    assert_no_host_process(&format!("sleep {arg}"), "a cancelled session").await;

    let (code, body) = batch.await.unwrap();
    assert_eq!(code, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    for r in results {
        assert_eq!(r["status"], "cancelled", "{r}");
    }
    assert!(
        results[0]["content"].as_str().unwrap().contains("so-far"),
        "{body}"
    );
    for r in &results[1..] {
        let text = r["content"].as_str().unwrap();
        assert!(
            text.contains("cancelled this session's pending calls"),
            "{text}"
        );
        assert!(text.contains("Nothing ran"), "{text}");
    }
    assert_eq!(report["results"], body["results"]);
    assert!(
        !exists(app, &sid, "probe-1", "new.txt").await,
        "the cancelled write ran"
    );

    // Each cancelled call id, retried on its own, returns its cancelled record; nothing runs.
    let events = app.events(&sid).await.len();
    for (i, call) in calls.as_array().unwrap().iter().enumerate() {
        let r = app.calls(&sid, json!([call])).await;
        assert_eq!(r[0]["status"], "cancelled", "{r:?}");
        assert_eq!(r[0]["invocation_id"], results[i]["invocation_id"], "{r:?}");
    }
    assert_eq!(
        app.events(&sid).await.len(),
        events,
        "a retry ran something"
    );
    assert!(
        !exists(app, &sid, "probe-2", "new.txt").await,
        "a retried write ran"
    );

    // With nothing pending, a cancel is an empty report.
    let (status, idle, _) = post_empty(app, &format!("/v1/sessions/{sid}/cancel")).await;
    assert_eq!(status, 200, "{idle}");
    assert_eq!(idle["results"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_a_sessions_pending_calls_stops_the_running_one_and_the_rest_never_run_on_postgres()
{
    cancelling_a_sessions_pending_calls_stops_the_running_one_and_the_rest_never_run(
        &spawn_app().await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_a_sessions_pending_calls_stops_the_running_one_and_the_rest_never_run_on_sqlite() {
    cancelling_a_sessions_pending_calls_stops_the_running_one_and_the_rest_never_run(
        &spawn_sqlite_app().await,
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// What a cancel does not touch
// ---------------------------------------------------------------------------------------------

async fn cancelling_a_finished_call_changes_nothing(app: &TestApp) {
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .call(
            &sid,
            "w",
            "write_file",
            json!({"file_path": "a.txt", "content": "x"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let before = app.invocation_of(&r).await;
    let events = app.events(&sid).await.len();
    for _ in 0..2 {
        let id = r["invocation_id"].as_str().unwrap();
        let (status, inv, _) = post_empty(app, &format!("/v1/invocations/{id}/cancel")).await;
        assert_eq!(status, 200, "{inv}");
        assert_eq!(inv, before);
    }
    assert_eq!(app.events(&sid).await.len(), events);
    assert!(exists(app, &sid, "probe", "a.txt").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_a_finished_call_changes_nothing_on_postgres() {
    cancelling_a_finished_call_changes_nothing(&spawn_app().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_a_finished_call_changes_nothing_on_sqlite() {
    cancelling_a_finished_call_changes_nothing(&spawn_sqlite_app().await).await;
}

async fn key_for(app: &TestApp, tenant: &str) -> String {
    let store = app.state.engine.store();
    let t = store.ensure_tenant(tenant).await.unwrap();
    let key = format!("tx_test_{}", uuid::Uuid::new_v4().simple());
    store
        .create_api_key(t.id, &toolexec_api::key_hash(&key), &key[..11])
        .await
        .unwrap();
    key
}

async fn another_tenant_cannot_cancel_anything(app: TestApp) {
    let alice = key_for(&app, "alice").await;
    let bob = key_for(&app, "bob").await;
    // Keys exist now: a restart switches to API-key auth.
    let app = app.restart().await;
    let post = |key: &str, path: String| app.http.post(app.url(&path)).bearer_auth(key.to_owned());

    let s: Value = post(&alice, "/v1/sessions".into())
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sid = s["id"].as_str().unwrap().to_owned();
    let arg = sleep_arg(300);
    let batch = {
        let req = post(&alice, format!("/v1/sessions/{sid}/calls")).json(&json!({"calls": [
            {"id": "long", "name": "shell", "arguments": {"command": format!("sleep {arg}"), "timeout_ms": 600_000}}
        ]}));
        tokio::spawn(async move { req.send().await.unwrap().json::<Value>().await.unwrap() })
    };
    wait_for_sleep(&arg)
        .await
        .expect("the command never started");
    let inv = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let page: Value = app
                .http
                .get(app.url(&format!("/v1/sessions/{sid}/events")))
                .bearer_auth(&alice)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let started = page["events"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["kind"] == "invocation.started")
                .map(|e| e["invocation_id"].as_str().unwrap().to_owned());
            if let Some(id) = started {
                break id;
            }
            assert!(Instant::now() < deadline, "the call never started");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let unknown = uuid::Uuid::now_v7();
    for path in [
        format!("/v1/invocations/{inv}/cancel"),
        format!("/v1/sessions/{sid}/cancel"),
        format!("/v1/invocations/{unknown}/cancel"),
        format!("/v1/sessions/{unknown}/cancel"),
        "/v1/invocations/not-an-id/cancel".to_owned(),
    ] {
        let resp = post(&bob, path.clone()).send().await.unwrap();
        assert_eq!(resp.status(), 404, "{path}");
        let p: Value = resp.json().await.unwrap();
        assert_eq!(p["code"], "not_found", "{path}: {p}");
    }
    assert!(
        wait_for_sleep(&arg).await.is_some(),
        "another tenant's cancel stopped the command"
    );
    let resp = post(&alice, format!("/v1/invocations/{inv}/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(batch.await.unwrap()["results"][0]["status"], "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_by_another_tenant_is_not_found_on_postgres() {
    another_tenant_cannot_cancel_anything(spawn_app().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_by_another_tenant_is_not_found_on_sqlite() {
    another_tenant_cannot_cancel_anything(spawn_sqlite_app().await).await;
}

/// Two replicas on one database: the node that does not run a call says so, and where to send
/// the cancel, instead of pretending to have stopped it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_of_a_call_running_on_another_node_says_where_it_runs() {
    let a = spawn_app().await;
    let mut config = a.config.clone();
    config.node = Some("other-node".into());
    let data = toolexec_tests::app::data_dir();
    config.data_dir = data.path().to_owned();
    let b = TestApp::start(config, data, a.db.clone()).await;
    let sid = a.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let arg = sleep_arg(300);
    let batch = post_batch(
        &a,
        &sid,
        &json!([{"id": "long", "name": "shell", "arguments": {"command": format!("sleep {arg}"), "timeout_ms": 600_000}}]),
    );
    wait_for_sleep(&arg)
        .await
        .expect("the command never started");
    let inv = started_invocation(&a, &sid, "long").await;
    let (status, problem, _) = post_empty(&b, &format!("/v1/invocations/{inv}/cancel")).await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["code"], "not_running_here", "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("POST /v1/sessions/{sid}/cancel")),
        "{problem}"
    );
    let (status, report, _) = post_empty(&a, &format!("/v1/sessions/{sid}/cancel")).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(batch.await.unwrap().1["results"][0]["status"], "cancelled");
}

// ---------------------------------------------------------------------------------------------
// Closing a session stops what runs; a batch longer than the request limit goes on
// ---------------------------------------------------------------------------------------------

/// SPEC §2: closing a session kills its running processes — a foreground command too, which is
/// recorded `cancelled`, and what was queued behind it never runs.
async fn closing_a_session_stops_its_running_command(backend: toolexec_tests::app::Backend) {
    let app = backend.spawn().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let main = sleep_arg(302);
    let batch = post_batch(
        &app,
        &sid,
        &json!([
            {"id": "long", "name": "shell", "arguments": {"command": format!("sleep {main}"), "timeout_ms": 600_000}},
            {"id": "later", "name": "write_file", "arguments": {"file_path": "later.txt", "content": "x"}},
        ]),
    );
    wait_for_sleep(&main)
        .await
        .expect("the command never started");
    let t0 = Instant::now();
    let resp = app.delete(&format!("/v1/sessions/{sid}")).await;
    assert_eq!(resp.status(), 200);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "closing waited for the command: {:?}",
        t0.elapsed()
    );
    assert_no_host_process(&format!("sleep {main}"), "a closed session's command").await;
    let (code, body) = batch.await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["results"][0]["status"], "cancelled", "{body}");
    assert_eq!(body["results"][1]["status"], "cancelled", "{body}");
    let states = call_states(&app, &sid).await;
    assert_eq!(states["long"], "cancelled", "{states:?}");
    assert_eq!(states["later"], "cancelled", "{states:?}");
}

/// A batch that outlives `limits.request_timeout_ms` is answered 503 `still_running` on time,
/// goes on, and the same calls sent again return its results, each call having run once.
async fn a_batch_longer_than_the_request_limit_goes_on_and_a_retry_collects_it(
    backend: toolexec_tests::app::Backend,
) {
    let app = backend
        .spawn_with(|c| c.limits.request_timeout_ms = 1_000)
        .await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let calls = json!([
        {"id": "slow", "name": "shell", "arguments": {"command": "sleep 2; echo slow >> runs.txt"}},
        {"id": "then", "name": "shell", "arguments": {"command": "echo then >> runs.txt"}},
    ]);
    let t0 = Instant::now();
    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/calls"),
            &json!({ "calls": calls }),
        )
        .await;
    let took = t0.elapsed();
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "still_running", "{body}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(2),
        "{took:?}"
    );
    // Retries (each also within the limit) wait for the running call; one returns both results.
    let mut results = None;
    for _ in 0..10 {
        let resp = app
            .post(
                &format!("/v1/sessions/{sid}/calls"),
                &json!({ "calls": calls }),
            )
            .await;
        if resp.status() == 200 {
            let body: Value = resp.json().await.unwrap();
            results = Some(body["results"].as_array().unwrap().clone());
            break;
        }
        assert_eq!(resp.status(), 503);
    }
    let results = results.expect("no retry collected the batch's results");
    assert_eq!(results[0]["status"], "ok", "{results:?}");
    assert_eq!(results[1]["status"], "ok", "{results:?}");
    let r = app
        .call(&sid, "look", "read_file", json!({"file_path": "runs.txt"}))
        .await;
    let content = r["content"].as_str().unwrap();
    assert_eq!(content.matches("slow").count(), 1, "{content}");
    assert_eq!(content.matches("then").count(), 1, "{content}");
}

toolexec_tests::on_both_stores!(
    closing_a_session_stops_its_running_command,
    a_batch_longer_than_the_request_limit_goes_on_and_a_retry_collects_it,
);
