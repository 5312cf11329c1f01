//! Idempotency by call id, recording across restarts and crashes, and a store that is down.
use serde_json::{Value, json};
use toolexec_store::{NewInvocation, Write};
use toolexec_tests::app::{DbControl, spawn_app};

#[tokio::test]
async fn repeating_a_call_id_returns_the_recorded_result_and_runs_nothing() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let args = json!({"file_path": "a.txt", "content": "first\n"});
    let first = app.call(&sid, "w1", "write_file", args.clone()).await;
    assert_eq!(first["status"], "ok");
    let before = app.events(&sid).await.len();

    // The file changes behind the record's back; a retry must not write it again.
    let path = app.data.path().join("workspaces").join(&sid).join("a.txt");
    std::fs::write(&path, "changed\n").unwrap();
    // Same arguments with keys in another order are the same call.
    let again = app
        .call(
            &sid,
            "w1",
            "write_file",
            json!({"content": "first\n", "file_path": "a.txt"}),
        )
        .await;
    assert_eq!(again, first);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "changed\n");
    assert_eq!(app.events(&sid).await.len(), before, "nothing new recorded");

    // Twice in one batch: one run, two identical results.
    let both = app
        .calls(
            &sid,
            json!([
                {"id": "r9", "name": "read_file", "arguments": {"file_path": "a.txt"}},
                {"id": "r9", "name": "read_file", "arguments": {"file_path": "a.txt"}}
            ]),
        )
        .await;
    assert_eq!(both[0], both[1]);
    // One read, recorded in one event.
    assert_eq!(app.events(&sid).await.len(), before + 1);
}

#[tokio::test]
async fn the_same_call_id_with_other_arguments_is_a_conflict_and_nothing_runs() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    app.call(
        &sid,
        "w1",
        "write_file",
        json!({"file_path": "a.txt", "content": "x"}),
    )
    .await;
    let before = app.events(&sid).await.len();
    let r = app
        .post(
            &format!("/v1/sessions/{sid}/calls"),
            &json!({"calls": [
                {"id": "new", "name": "write_file", "arguments": {"file_path": "b.txt", "content": "y"}},
                {"id": "w1", "name": "write_file", "arguments": {"file_path": "a.txt", "content": "other"}}
            ]}),
        )
        .await;
    assert_eq!(r.status(), 409);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["code"], "call_id_reused");
    assert!(p["detail"].as_str().unwrap().contains("w1"));
    assert_eq!(app.events(&sid).await.len(), before);
    assert!(
        !app.data
            .path()
            .join("workspaces")
            .join(&sid)
            .join("b.txt")
            .exists()
    );

    // Within one batch too.
    let r = app
        .post(
            &format!("/v1/sessions/{sid}/calls"),
            &json!({"calls": [
                {"id": "d", "name": "read_file", "arguments": {"file_path": "a.txt"}},
                {"id": "d", "name": "read_file", "arguments": {"file_path": "b.txt"}}
            ]}),
        )
        .await;
    assert_eq!(r.status(), 409);
}

#[tokio::test]
async fn idempotency_survives_a_restart() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let args = json!({"file_path": "a.txt", "content": "one\n"});
    let first = app.call(&sid, "w1", "write_file", args.clone()).await;
    let app = app.restart().await;
    let again = app.call(&sid, "w1", "write_file", args).await;
    assert_eq!(again, first);
    // And the restarted service keeps working on the same session.
    let r = app
        .call(&sid, "r1", "read_file", json!({"file_path": "a.txt"}))
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    // The read's one event comes right after the write's finish.
    assert_eq!(
        r["seq"].as_i64().unwrap(),
        first["seq"].as_i64().unwrap() + 1
    );
}

#[tokio::test]
async fn invocations_left_running_by_a_crash_are_marked_interrupted_at_the_next_start() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let session_id: uuid::Uuid = sid.parse().unwrap();
    // What a crash leaves behind: a durable start and no finish.
    let id = toolexec_core::new_id();
    let args = json!({"file_path": "x", "content": "y"});
    let w = app
        .state
        .engine
        .store()
        .commit(&[Write::Start {
            invocation: NewInvocation {
                id,
                session_id,
                call_id: "crashed".into(),
                name: "write_file".into(),
                arguments: args.clone(),
                arguments_sha256: toolexec_engine::arguments_sha256(&args),
                read_only: false,
                capabilities: vec![toolexec_core::Capability::FsWrite],
                node: "test-node".into(),
                started_at: chrono::Utc::now(),
            },
        }])
        .await
        .unwrap();
    assert!(w[0].is_ok());
    let app = app.restart().await;
    let inv: Value = app
        .get(&format!("/v1/invocations/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(inv["status"], "interrupted");
    assert_eq!(inv["is_error"], true);
    let events = app.events(&sid).await;
    let last = events.last().unwrap();
    assert_eq!(last["kind"], "invocation.finished");
    assert_eq!(last["data"]["status"], "interrupted");
    // The retry of that call id gets the interrupted record, not a second run.
    let r = app.call(&sid, "crashed", "write_file", args).await;
    assert_eq!(r["status"], "interrupted");
    assert!(
        !app.data
            .path()
            .join("workspaces")
            .join(&sid)
            .join("x")
            .exists()
    );
}

#[tokio::test]
async fn with_the_store_down_calls_get_503_and_nothing_runs() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let db = app.db.clone().unwrap();
    db.set_reachable(false).await;
    let r = app
        .post(
            &format!("/v1/sessions/{sid}/calls"),
            &json!({"calls": [{"id": "w", "name": "write_file", "arguments": {"file_path": "new.txt", "content": "x"}}]}),
        )
        .await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status(), 503);
    assert!(
        !app.data
            .path()
            .join("workspaces")
            .join(&sid)
            .join("new.txt")
            .exists()
    );

    db.set_reachable(true).await;
    let w = app
        .call(
            &sid,
            "w",
            "write_file",
            json!({"file_path": "new.txt", "content": "x"}),
        )
        .await;
    assert_eq!(w["status"], "ok", "{w}");
    assert_eq!(app.get("/readyz").await.status(), 200);
}

async fn writes_per_read(app: &toolexec_tests::app::TestApp) -> f64 {
    let sid = app.session(json!({"files": {"a.txt": "x\n"}})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = app.metric("toolexec_store_commit_batch_size_sum").await;
    let r = app
        .call(&sid, "r1", "read_file", json!({"file_path": "a.txt"}))
        .await;
    assert_eq!(r["status"], "ok");
    app.metric("toolexec_store_commit_batch_size_sum").await - before
}

#[tokio::test]
async fn a_read_is_recorded_in_one_write_unless_the_operator_wants_its_start_durable_first() {
    let app = spawn_app().await;
    assert_eq!(writes_per_read(&app).await, 1.0);
    let strict =
        toolexec_tests::app::spawn_app_with(|c| c.durable_start_for_read_only = true).await;
    assert_eq!(writes_per_read(&strict).await, 2.0);
}
