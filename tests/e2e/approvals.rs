//! Approval gates (issue 14): a session's `policy.approval` makes calls of named tools, or of
//! tools with named capabilities, wait for a person. Over HTTP, on both stores: the call is
//! answered `pending_approval` at once and nothing runs; a person approves (it runs, in the
//! log after who decided) or denies (recorded `denied`, never run); a retried decision is
//! harmless, the opposite one a conflict; a wait nobody ends becomes a recorded denial, across a
//! restart too; the MCP door waits for the decision; a replay asks again before it re-runs
//! what was approved.
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolexec_tests::app::{Backend, TestApp};

toolexec_tests::on_both_stores!(
    a_person_decides_and_the_log_names_them,
    a_replay_asks_again_before_it_re_runs_an_approved_call,
    waits_end_in_a_recorded_denial,
    what_else_ends_a_wait
);

async fn gated_session(app: &TestApp, approval: Value) -> String {
    app.session(json!({"policy": {"approval": approval}, "files": {"notes.txt": "hi\n"}}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn decide(app: &TestApp, id: &str, verb: &str, body: Value) -> (u16, Value) {
    let resp = app
        .post(&format!("/v1/invocations/{id}/{verb}"), &body)
        .await;
    (resp.status().as_u16(), resp.json().await.unwrap())
}

async fn wait_for(app: &TestApp, id: &str, secs: u64) -> Value {
    let resp = app.get(&format!("/v1/invocations/{id}?wait={secs}")).await;
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// The kinds of the events of one invocation, in log order.
async fn kinds_of(app: &TestApp, sid: &str, invocation: &str) -> Vec<(String, Value)> {
    app.events(sid)
        .await
        .into_iter()
        .filter(|e| e["invocation_id"] == invocation)
        .map(|e| (e["kind"].as_str().unwrap().to_owned(), e["data"].clone()))
        .collect()
}

/// What `ask` finds, asked every 100 ms, up to 30 s.
async fn poll<T>(mut ask: impl AsyncFnMut() -> Option<T>, what: &str) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(found) = ask().await {
            return found;
        }
        assert!(Instant::now() < deadline, "no {what} within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A verify replay does not re-run a call its source's person approved on that approval alone
/// (issue 23, §8): the approval was for one run, in the source. The replay's call waits for a
/// person like any gated call of the session — recorded `approval.requested` in the replay's
/// log, naming the call it re-runs (`replay_of`), nothing written meanwhile — and the replay
/// goes on when someone decides: approved, the call runs and matches its record; denied, it
/// never runs and the report shows the status it diverged by.
async fn a_replay_asks_again_before_it_re_runs_an_approved_call(backend: Backend) {
    let app = backend.spawn().await;
    let sid = gated_session(&app, json!({"tools": ["write_file"]})).await;
    let w = app
        .call(
            &sid,
            "w1",
            "write_file",
            json!({"file_path": "made.txt", "content": "made\n"}),
        )
        .await;
    assert_eq!(w["status"], "pending_approval");
    let inv = w["invocation_id"].as_str().unwrap().to_owned();
    let (status, _) = decide(&app, &inv, "approve", json!({"by": "alice"})).await;
    assert_eq!(status, 200);
    assert_eq!(wait_for(&app, &inv, 30).await["status"], "ok");

    let mut replays_seen = Vec::new();
    for (verb, by) in [("approve", "carol"), ("deny", "dave")] {
        let replay = {
            let url = app.url(&format!("/v1/sessions/{sid}/replay"));
            let http = app.http.clone();
            tokio::spawn(async move {
                let resp = http
                    .post(url)
                    .json(&json!({"mode": "verify"}))
                    .send()
                    .await
                    .unwrap();
                (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
            })
        };
        // The replay's session, in the tenant's list.
        let rsid = poll(
            async || {
                let list: Value = app.get("/v1/sessions").await.json().await.unwrap();
                list["sessions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|s| {
                        s["origin"]["kind"] == "replay"
                            && s["origin"]["session_id"] == sid.as_str()
                            && !replays_seen.contains(&s["id"])
                    })
                    .map(|s| s["id"].as_str().unwrap().to_owned())
            },
            "replay session",
        )
        .await;
        replays_seen.push(json!(rsid));
        // Its re-run of w1 waits for a person, and nothing was written.
        let requested = poll(
            async || {
                app.events(&rsid)
                    .await
                    .into_iter()
                    .find(|e| e["kind"] == "approval.requested")
            },
            "approval.requested in the replay",
        )
        .await;
        assert_eq!(requested["data"]["call_id"], "w1", "{requested}");
        assert_eq!(requested["data"]["replay_of"], inv.as_str(), "{requested}");
        assert_eq!(requested["data"]["reasons"], json!(["tool:write_file"]));
        let file = format!("/v1/sessions/{rsid}/files/made.txt");
        assert_eq!(app.get(&file).await.status(), 404, "nothing ran yet");
        assert!(!replay.is_finished(), "the replay waits for the decision");
        let waiting = requested["invocation_id"].as_str().unwrap().to_owned();
        let (status, decided) = decide(&app, &waiting, verb, json!({"by": by})).await;
        assert_eq!(status, 200, "{decided}");

        let (status, report) = tokio::time::timeout(Duration::from_secs(60), replay)
            .await
            .expect("the replay ends once decided")
            .unwrap();
        assert_eq!(status, 200, "{report:#}");
        assert_eq!(report["status"], "finished", "{report:#}");
        let call = &report["calls"][0];
        assert_eq!(call["call_id"], "w1");
        assert_eq!(call["replayed_invocation_id"], waiting.as_str());
        let decision = app
            .events(&rsid)
            .await
            .into_iter()
            .find(|e| e["kind"] == "approval.decided")
            .unwrap();
        assert_eq!(decision["data"]["by"]["name"], by);
        if verb == "approve" {
            assert_eq!(decision["data"]["decision"], "approved");
            assert!(
                call["status_matched"] == true
                    && call["output_matched"] == true
                    && call["side_effects_matched"] == true,
                "approved again, the call replays as it ran: {call}"
            );
            assert_eq!(app.get(&file).await.text().await.unwrap(), "made\n");
        } else {
            assert_eq!(decision["data"]["decision"], "denied");
            assert_eq!(call["replayed_status"], "denied", "{call}");
            assert_eq!(call["status_matched"], false, "{call}");
            assert_eq!(report["calls_diverged"], 1);
            assert_eq!(
                app.get(&file).await.status(),
                404,
                "a denied re-run never ran"
            );
        }
    }
}

async fn a_person_decides_and_the_log_names_them(backend: Backend) {
    let app = backend.spawn().await;
    let sid = gated_session(
        &app,
        json!({"tools": ["write_file"], "capabilities": ["process"]}),
    )
    .await;
    // A gated command and an ungated read in one batch: the read runs, the command waits.
    let results = app
        .calls(
            &sid,
            json!([
                {"id": "c1", "name": "shell", "arguments": {"command": "echo made > made.txt; echo done"}},
                {"id": "c2", "name": "read_file", "arguments": {"file_path": "notes.txt"}},
            ]),
        )
        .await;
    assert_eq!(results[0]["status"], "pending_approval", "{}", results[0]);
    assert_eq!(results[0]["is_error"], false);
    let inv = results[0]["invocation_id"].as_str().unwrap().to_owned();
    assert!(
        results[0]["content"]
            .as_str()
            .unwrap()
            .contains(&format!("/v1/invocations/{inv}/approve"))
    );
    assert_eq!(results[1]["status"], "ok", "{}", results[1]);
    let made = app
        .call(&sid, "c3", "read_file", json!({"file_path": "made.txt"}))
        .await;
    assert_eq!(
        made["is_error"], true,
        "nothing ran before approval: {made}"
    );
    // Waiting with nobody deciding: the invocation as it is when the wait ends.
    let t0 = Instant::now();
    let still = wait_for(&app, &inv, 1).await;
    assert_eq!(still["status"], "pending_approval");
    assert!(t0.elapsed() >= Duration::from_millis(900));
    // A retry of the call id answers the same, and runs nothing.
    let again = app
        .call(
            &sid,
            "c1",
            "shell",
            json!({"command": "echo made > made.txt; echo done"}),
        )
        .await;
    assert_eq!(again["status"], "pending_approval");
    assert_eq!(again["invocation_id"], inv.as_str());

    // A client waits; a person approves meanwhile.
    let waiter = {
        let url = app.url(&format!("/v1/invocations/{inv}?wait=30"));
        let http = app.http.clone();
        tokio::spawn(async move {
            let t0 = Instant::now();
            let v: Value = http.get(url).send().await.unwrap().json().await.unwrap();
            (v, t0.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, approved) = decide(
        &app,
        &inv,
        "approve",
        json!({"by": "alice", "reason": "looks fine"}),
    )
    .await;
    assert_eq!(status, 200, "{approved}");
    let (done, waited) = waiter.await.unwrap();
    assert_eq!(done["status"], "ok", "{done}");
    assert!(done["content"].as_str().unwrap().contains("done"), "{done}");
    assert!(
        waited < Duration::from_secs(25),
        "the wait ended with the call"
    );
    // Approving again is harmless; denying now is a conflict that says who approved.
    let (status, _) = decide(&app, &inv, "approve", json!({})).await;
    assert_eq!(status, 200);
    let (status, problem) = decide(&app, &inv, "deny", json!({"reason": "late"})).await;
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["code"], "already_decided");
    assert!(
        problem["detail"].as_str().unwrap().contains("alice"),
        "{problem}"
    );
    // The retry now gets the result; the file is there.
    let again = app
        .call(
            &sid,
            "c1",
            "shell",
            json!({"command": "echo made > made.txt; echo done"}),
        )
        .await;
    assert_eq!(again["status"], "ok");
    let made = app
        .call(&sid, "c4", "read_file", json!({"file_path": "made.txt"}))
        .await;
    assert_eq!(made["status"], "ok");
    // The log: requested (why, until when), decided (who, why), then started, the file, the end.
    let log = kinds_of(&app, &sid, &inv).await;
    let kinds: Vec<&str> = log.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "approval.requested",
            "approval.decided",
            "invocation.started",
            "file.created",
            "invocation.finished"
        ],
        "{log:#?}"
    );
    assert_eq!(log[0].1["reasons"], json!(["capability:process"]));
    assert_eq!(log[0].1["call_id"], "c1");
    assert!(log[0].1["expires_at"].is_string());
    assert_eq!(log[1].1["decision"], "approved");
    assert_eq!(log[1].1["by"]["name"], "alice");
    assert_eq!(log[1].1["by"]["tenant"], "local");
    assert_eq!(log[1].1["reason"], "looks fine");
    assert_eq!(log[1].1["expired"], false);

    // Gated by name: write_file waits; a person denies it; it never runs.
    let w = app
        .call(
            &sid,
            "w1",
            "write_file",
            json!({"file_path": "x.txt", "content": "x"}),
        )
        .await;
    assert_eq!(w["status"], "pending_approval");
    let winv = w["invocation_id"].as_str().unwrap().to_owned();
    let (status, denied) = decide(
        &app,
        &winv,
        "deny",
        json!({"by": "bob", "reason": "not that file"}),
    )
    .await;
    assert_eq!(status, 200, "{denied}");
    assert_eq!(denied["status"], "denied");
    let content = denied["content"].as_str().unwrap();
    assert!(
        content.contains("not that file") && content.contains("did not run"),
        "{content}"
    );
    let (status, problem) = decide(&app, &winv, "approve", json!({})).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("already_decided"))
    );
    let (status, _) = decide(&app, &winv, "deny", json!({})).await;
    assert_eq!(status, 200, "denying again is harmless");
    let kinds: Vec<String> = kinds_of(&app, &sid, &winv)
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        kinds,
        [
            "approval.requested",
            "approval.decided",
            "invocation.finished"
        ]
    );
    let x = app
        .call(&sid, "c5", "read_file", json!({"file_path": "x.txt"}))
        .await;
    assert_eq!(x["is_error"], true, "a denied call never ran: {x}");
    // The retry of the denied call id answers the denial.
    let w = app
        .call(
            &sid,
            "w1",
            "write_file",
            json!({"file_path": "x.txt", "content": "x"}),
        )
        .await;
    assert_eq!(w["status"], "denied");

    // An ungated call, or one that never waited, cannot be decided; another tenant's is not found.
    let ok = app.invocation_of(&results[1]).await;
    let (status, problem) = decide(&app, ok["id"].as_str().unwrap(), "approve", json!({})).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("already_decided"))
    );
    let (status, _) = decide(
        &app,
        &uuid::Uuid::new_v4().to_string(),
        "approve",
        json!({}),
    )
    .await;
    assert_eq!(status, 404);
    let (status, problem) = decide(&app, &inv, "approve", json!({"by": "x", "extra": 1})).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (422, Some("invalid_request"))
    );

    // Closing the session denies what still waits.
    let p = app
        .call(&sid, "c6", "shell", json!({"command": "true"}))
        .await;
    assert_eq!(p["status"], "pending_approval");
    assert_eq!(
        app.delete(&format!("/v1/sessions/{sid}")).await.status(),
        200
    );
    let closed = app.invocation_of(&p).await;
    assert_eq!(closed["status"], "denied", "{closed}");
}

/// A call nobody decides is denied when its wait ends — also when the service restarted in
/// between — and one decided after a restart runs.
async fn waits_end_in_a_recorded_denial(backend: Backend) {
    let app = backend.spawn().await;
    let short = gated_session(
        &app,
        json!({"capabilities": ["fs.write"], "timeout_ms": 1500}),
    )
    .await;
    let long = gated_session(&app, json!({"capabilities": ["fs.write"]})).await;
    let s = app
        .call(
            &short,
            "s1",
            "write_file",
            json!({"file_path": "a.txt", "content": "a"}),
        )
        .await;
    let l = app
        .call(
            &long,
            "l1",
            "write_file",
            json!({"file_path": "b.txt", "content": "b"}),
        )
        .await;
    let r = app
        .call(&long, "r1", "read_file", json!({"file_path": "notes.txt"}))
        .await;
    assert_eq!(r["status"], "ok", "fs.write does not gate a read");
    assert_eq!(s["status"], "pending_approval");
    assert_eq!(l["status"], "pending_approval");
    // The node stops with both waiting and starts again: the short wait ends while it is down
    // or soon after, and is denied; the long one still waits and can be approved.
    let app = app.restart().await;
    let t0 = Instant::now();
    let expired = wait_for(&app, s["invocation_id"].as_str().unwrap(), 20).await;
    assert_eq!(expired["status"], "denied", "{expired}");
    assert!(t0.elapsed() < Duration::from_secs(15));
    assert!(expired["content"].as_str().unwrap().contains("in time"));
    let decided = app
        .events(&short)
        .await
        .into_iter()
        .find(|e| e["kind"] == "approval.decided")
        .unwrap();
    assert_eq!(decided["data"]["expired"], true);
    assert_eq!(decided["data"]["by"]["service"], "toolexec");
    let linv = l["invocation_id"].as_str().unwrap();
    assert_eq!(wait_for(&app, linv, 0).await["status"], "pending_approval");
    let (status, _) = decide(&app, linv, "approve", json!({"by": "carol"})).await;
    assert_eq!(status, 200);
    assert_eq!(wait_for(&app, linv, 20).await["status"], "ok");
    let b = app
        .call(&long, "r2", "read_file", json!({"file_path": "b.txt"}))
        .await;
    assert_eq!(b["status"], "ok", "{b}");
}

/// What a policy may say: known tools, a wait within the operator's ceiling; a fork keeps its
/// source's gates and may only add to them.
#[tokio::test]
async fn approval_policies_are_checked_and_forks_keep_them() {
    let app = Backend::Sqlite
        .spawn_with(|c| c.limits.max_approval_wait_ms = 60_000)
        .await;
    for (approval, code) in [
        (json!({"tools": ["no_such_tool"]}), "unknown_tool"),
        (
            json!({"tools": ["shell"], "timeout_ms": 60_001}),
            "policy_above_ceiling",
        ),
        (json!({"capabilities": ["teleport"]}), "invalid_request"),
    ] {
        let resp = app
            .post("/v1/sessions", &json!({"policy": {"approval": approval}}))
            .await;
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap();
        assert_eq!((status, body["code"].as_str()), (422, Some(code)), "{body}");
    }
    let sid = gated_session(&app, json!({"tools": ["shell"]})).await;
    let resp = app
        .post(&format!("/v1/sessions/{sid}/fork"), &json!({"policy": {}}))
        .await;
    assert_eq!(resp.status(), 201);
    let fork: Value = resp.json().await.unwrap();
    assert_eq!(
        fork["policy"]["approval"]["tools"],
        json!(["shell"]),
        "{fork}"
    );
    let fid = fork["id"].as_str().unwrap();
    let r = app
        .call(fid, "f1", "shell", json!({"command": "true"}))
        .await;
    assert_eq!(r["status"], "pending_approval");
    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/fork"),
            &json!({"policy": {"approval": {"tools": ["write_file"]}}}),
        )
        .await;
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("policy_not_tighter")),
        "{body}"
    );
}

/// The MCP door has no "come back later": its `tools/call` waits for the decision and answers
/// with the call's result.
#[tokio::test]
async fn an_mcp_call_waits_for_the_decision() {
    let app = Backend::Sqlite.spawn().await;
    let sid = gated_session(&app, json!({"tools": ["shell"]})).await;
    let request = app
        .http
        .post(app.url(&format!("/v1/sessions/{sid}/mcp")))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2025-11-25")
        .timeout(Duration::from_secs(60))
        .body(
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                   "params": {"name": "shell", "arguments": {"command": "echo approved-run"}}})
            .to_string(),
        );
    let pending = tokio::spawn(async move { request.send().await.unwrap().text().await.unwrap() });
    // The call is recorded waiting; a person approves it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let inv = loop {
        let found = app
            .events(&sid)
            .await
            .into_iter()
            .find(|e| e["kind"] == "approval.requested");
        if let Some(e) = found {
            break e["invocation_id"].as_str().unwrap().to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the MCP call was not recorded waiting"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        !pending.is_finished(),
        "the MCP request waits for the decision"
    );
    let (status, _) = decide(&app, &inv, "approve", json!({"by": "dave"})).await;
    assert_eq!(status, 200);
    let text = pending.await.unwrap();
    let body: Value = serde_json::from_str(
        text.lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap_or(&text),
    )
    .unwrap_or(Value::String(text.clone()));
    assert_eq!(body["id"], 7, "{text}");
    assert_eq!(body["result"]["isError"], false, "{text}");
    assert!(
        body["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("approved-run"),
        "{text}"
    );
}

/// A wait ends without a person too: a cancel of the call denies it, a rewind denies what
/// waits (asked for in a state that is gone), a session with too many waiting calls denies the
/// next one at once; a denied call lists no side effect; an approved call waiting for its turn
/// behind a running command can still be cancelled, and then never runs.
async fn what_else_ends_a_wait(backend: Backend) {
    let app = backend
        .spawn_with(|c| c.limits.max_waiting_approvals_per_session = 2)
        .await;
    let sid = gated_session(&app, json!({"tools": ["write_file"]})).await;
    let write = |id: &'static str, file: &'static str| json!([{"id": id, "name": "write_file", "arguments": {"file_path": file, "content": "x"}}]);
    let a = app.calls(&sid, write("a", "a.txt")).await.remove(0);
    let b = app.calls(&sid, write("b", "b.txt")).await.remove(0);
    assert_eq!(a["status"], "pending_approval");
    assert_eq!(b["status"], "pending_approval");
    let c = app.calls(&sid, write("c", "c.txt")).await.remove(0);
    assert_eq!(
        c["status"], "denied",
        "the third waiting call is one too many: {c}"
    );
    assert!(
        c["content"].as_str().unwrap().contains("already wait"),
        "{c}"
    );

    // Cancelling a waiting call denies it, by the tenant that cancelled it.
    let ainv = a["invocation_id"].as_str().unwrap();
    let resp = app
        .post(&format!("/v1/invocations/{ainv}/cancel"), &json!({}))
        .await;
    assert_eq!(resp.status(), 200);
    let cancelled: Value = resp.json().await.unwrap();
    assert_eq!(cancelled["status"], "denied", "{cancelled}");
    assert_eq!(
        cancelled["side_effects_total"], 0,
        "a denied call changed nothing: {cancelled}"
    );

    // A rewind denies what still waits.
    let resp = app
        .post(&format!("/v1/sessions/{sid}/rewind"), &json!({"to_seq": 1}))
        .await;
    assert_eq!(
        resp.status(),
        200,
        "{}",
        resp.text().await.unwrap_or_default()
    );
    let b = app.invocation_of(&b).await;
    assert_eq!(b["status"], "denied", "{b}");
    assert!(b["content"].as_str().unwrap().contains("rewound"), "{b}");

    // An approved call queued behind a running command is cancellable from its approval on.
    let slow = {
        let url = app.url(&format!("/v1/sessions/{sid}/calls"));
        let http = app.http.clone();
        tokio::spawn(async move {
            http.post(url)
                .json(&json!({"calls": [{"id": "slow", "name": "shell", "arguments": {"command": "sleep 3"}}]}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let d = app.calls(&sid, write("d", "d.txt")).await.remove(0);
    assert_eq!(d["status"], "pending_approval");
    let dinv = d["invocation_id"].as_str().unwrap();
    let (status, approved) = decide(&app, dinv, "approve", json!({"by": "erin"})).await;
    assert_eq!(status, 200);
    assert_eq!(
        approved["status"], "running",
        "queued behind the command: {approved}"
    );
    let resp = app
        .post(&format!("/v1/invocations/{dinv}/cancel"), &json!({}))
        .await;
    assert!(
        resp.status() == 200 || resp.status() == 202,
        "{}",
        resp.status()
    );
    assert_eq!(slow.await.unwrap(), 200);
    let d = wait_for(&app, dinv, 20).await;
    assert_eq!(d["status"], "cancelled", "{d}");
    let file = app
        .call(&sid, "r", "read_file", json!({"file_path": "d.txt"}))
        .await;
    assert_eq!(
        file["is_error"], true,
        "the cancelled call never ran: {file}"
    );
    // A NUL in what is recorded is refused, not a 500.
    let e = app.calls(&sid, write("e", "e.txt")).await.remove(0);
    let (status, problem) = decide(
        &app,
        e["invocation_id"].as_str().unwrap(),
        "deny",
        json!({"reason": "bad\u{0}"}),
    )
    .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (422, Some("invalid_request"))
    );
}
