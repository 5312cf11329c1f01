//! The session's call index in bounded memory (docs/design.md, "The session's call index"):
//! retries of old call ids stay exact — on both stores, before and after a restart, when the
//! index cannot tell a new id from a recorded one, and while the call still runs — and a new
//! call needs no store read to know it is new.
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};
use toolexec_tests::app::{Backend, TestApp};
use toolexec_tests::counting::CountingStore;
use toolexec_tests::on_both_stores;

on_both_stores!(
    retries_of_old_call_ids_return_their_record_and_run_nothing_also_after_a_restart,
    new_calls_the_index_cannot_tell_from_recorded_ones_are_checked_against_the_store,
    a_retry_of_a_call_still_running_waits_for_it_and_it_runs_once,
    process_ids_stay_unique_across_a_restart,
);

async fn new_session(app: &TestApp, body: Value) -> String {
    app.session(body).await["id"].as_str().unwrap().to_owned()
}

/// Stops the service and starts it again on the same store and data, its store reads counted.
async fn restart_counting(mut app: TestApp) -> (TestApp, Arc<CountingStore>) {
    app.stop().await;
    let mut counting = None;
    let app = TestApp::start_wrapped(app.config.clone(), app.data.clone(), app.db.clone(), |s| {
        let c = CountingStore::new(s);
        counting = Some(c.clone());
        c
    })
    .await;
    (app, counting.unwrap())
}

fn read(id: &str, path: &str) -> Value {
    json!({"id": id, "name": "read_file", "arguments": {"file_path": path}})
}

/// A 409 `call_id_reused` for the batch, with nothing of it run or recorded.
async fn assert_reused(app: &TestApp, sid: &str, calls: Value, unwritten: &std::path::Path) {
    let before = app.events(sid).await.len();
    let r = app
        .post(
            &format!("/v1/sessions/{sid}/calls"),
            &json!({ "calls": calls }),
        )
        .await;
    assert_eq!(r.status(), 409);
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["code"], "call_id_reused", "{p}");
    assert_eq!(app.events(sid).await.len(), before, "nothing recorded");
    assert!(!unwritten.exists(), "nothing of the batch ran");
}

/// `read_file` of `a.txt` as a new call `new-{i}`.
async fn new_read(app: &TestApp, sid: &str, i: usize) -> Value {
    app.call(
        sid,
        &format!("new-{i}"),
        "read_file",
        json!({"file_path": "a.txt"}),
    )
    .await
}

/// The retries of `w-old` and `r-old` return their records and run nothing; the same ids with
/// other arguments are conflicts.
async fn check_retries(
    app: &TestApp,
    sid: &str,
    write: &Value,
    first_write: &Value,
    first_read: &Value,
) {
    let dir = app.data.path().join("workspaces").join(sid);
    let again = app.call(sid, "w-old", "write_file", write.clone()).await;
    assert_eq!(&again, first_write);
    let again = app
        .call(sid, "r-old", "read_file", json!({"file_path": "a.txt"}))
        .await;
    assert_eq!(&again, first_read);
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).unwrap(),
        "changed\n"
    );
    // With other arguments: a conflict, and nothing of its batch runs.
    let fresh = json!({"id": "fresh", "name": "write_file", "arguments": {"file_path": "b.txt", "content": "x"}});
    assert_reused(
        app,
        sid,
        json!([fresh, read("r-old", "other.txt")]),
        &dir.join("b.txt"),
    )
    .await;
    assert_reused(
        app,
        sid,
        json!([fresh, {"id": "w-old", "name": "write_file", "arguments": {"file_path": "a.txt", "content": "two\n"}}]),
        &dir.join("b.txt"),
    )
    .await;
}

async fn retries_of_old_call_ids_return_their_record_and_run_nothing_also_after_a_restart(
    backend: Backend,
) {
    let app = backend.spawn().await;
    let sid = new_session(&app, json!({})).await;
    let dir = app.data.path().join("workspaces").join(&sid);
    let write = json!({"file_path": "a.txt", "content": "one\n"});
    let first_write = app.call(&sid, "w-old", "write_file", write.clone()).await;
    assert_eq!(first_write["status"], "ok", "{first_write}");
    let first_read = app
        .call(&sid, "r-old", "read_file", json!({"file_path": "a.txt"}))
        .await;
    assert!(first_read["content"].as_str().unwrap().contains("one"));
    // Many calls after them: they are old now.
    for batch in 0..5 {
        let calls: Vec<Value> = (0..40)
            .map(|i| read(&format!("later-{batch}-{i}"), "a.txt"))
            .collect();
        let results = app.calls(&sid, json!(calls)).await;
        assert!(results.iter().all(|r| r["status"] == "ok"));
    }
    // The file changes behind the record's back: a retry that ran again would show it (a read)
    // or undo it (the write).
    std::fs::write(dir.join("a.txt"), "changed\n").unwrap();
    let recorded = app.events(&sid).await.len();

    check_retries(&app, &sid, &write, &first_write, &first_read).await;
    assert_eq!(
        app.events(&sid).await.len(),
        recorded,
        "nothing new recorded"
    );

    let (app, counting) = restart_counting(app).await;
    check_retries(&app, &sid, &write, &first_write, &first_read).await;
    assert_eq!(
        app.events(&sid).await.len(),
        recorded,
        "nothing new recorded"
    );

    // New calls are known to be new without a store read (but the first: the restarted
    // service reads the session, and with it whether the id is recorded).
    assert_eq!(new_read(&app, &sid, 0).await["status"], "ok");
    let lookups = counting.call_lookups.load(Ordering::SeqCst);
    let new_before = app
        .metric("toolexec_call_index_answers_total{answer=\"new\"}")
        .await;
    for i in 1..20 {
        let r = new_read(&app, &sid, i).await;
        assert_eq!(r["status"], "ok", "{r}");
        assert!(r["content"].as_str().unwrap().contains("changed"));
    }
    assert_eq!(
        counting.call_lookups.load(Ordering::SeqCst),
        lookups,
        "no store read to tell a new call"
    );
    let new_after = app
        .metric("toolexec_call_index_answers_total{answer=\"new\"}")
        .await;
    assert_eq!(new_after - new_before, 19.0);
    // 20 reads, one event each.
    assert_eq!(app.events(&sid).await.len(), recorded + 20);
    // And the calls made after the restart are retries like any other.
    let again = app
        .call(&sid, "new-3", "read_file", json!({"file_path": "a.txt"}))
        .await;
    assert_eq!(again["seq"].as_i64().unwrap(), recorded as i64 + 4);
    assert_eq!(app.events(&sid).await.len(), recorded + 20);
}

async fn new_calls_the_index_cannot_tell_from_recorded_ones_are_checked_against_the_store(
    backend: Backend,
) {
    // An index of one 64-bit word: after a few dozen ids it answers "maybe" for nearly every id.
    let app = backend
        .spawn_with(|c| c.limits.call_index_max_bytes = 8)
        .await;
    let sid = new_session(&app, json!({"files": {"a.txt": "one\n"}})).await;
    for i in 0..60 {
        let r = app
            .call(
                &sid,
                &format!("c{i}"),
                "read_file",
                json!({"file_path": "a.txt"}),
            )
            .await;
        assert_eq!(r["status"], "ok", "{r}");
    }
    let unneeded = app
        .metric("toolexec_call_index_answers_total{answer=\"not_recorded\"}")
        .await;
    assert!(unneeded > 0.0, "the index answered maybe for new ids");
    let events = app.events(&sid).await;
    let started = events
        .iter()
        .filter(|e| toolexec_tests::starts_call(e))
        .count();
    assert_eq!(started, 60, "each call ran and was recorded once");
    // Retries are still exact.
    let first = events
        .iter()
        .find(|e| e["kind"] == "invocation.finished" && e["data"]["call_id"] == "c0")
        .unwrap()
        .clone();
    let again = app
        .call(&sid, "c0", "read_file", json!({"file_path": "a.txt"}))
        .await;
    assert_eq!(again["seq"], first["seq"]);
    let dir = app.data.path().join("workspaces").join(&sid);
    assert_reused(
        &app,
        &sid,
        json!([
            {"id": "fresh", "name": "write_file", "arguments": {"file_path": "b.txt", "content": "x"}},
            read("c1", "other.txt"),
        ]),
        &dir.join("b.txt"),
    )
    .await;
    assert_eq!(app.events(&sid).await.len(), events.len());
}

async fn a_retry_of_a_call_still_running_waits_for_it_and_it_runs_once(backend: Backend) {
    let app = backend.spawn().await;
    let sid = new_session(&app, json!({})).await;
    for i in 0..30 {
        app.call(
            &sid,
            &format!("before-{i}"),
            "list_dir",
            json!({"path": "."}),
        )
        .await;
    }
    let slow = json!({"command": "sleep 1.5; echo ran >> runs.txt; cat runs.txt"});
    let body = json!({"calls": [{"id": "slow", "name": "shell", "arguments": slow}]});
    let url = app.url(&format!("/v1/sessions/{sid}/calls"));
    let first = tokio::spawn({
        let (http, url, body) = (app.http.clone(), url.clone(), body.clone());
        async move {
            let r = http.post(url).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()
        }
    });
    // Its start is recorded before the command runs.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !app
        .events(&sid)
        .await
        .iter()
        .any(|e| e["kind"] == "invocation.started" && e["data"]["call_id"] == "slow")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the call never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let retry = app.post(&format!("/v1/sessions/{sid}/calls"), &body).await;
    assert_eq!(retry.status(), 200);
    let retry: Value = retry.json().await.unwrap();
    let first = first.await.unwrap();
    assert_eq!(retry, first);
    assert_eq!(first["results"][0]["status"], "ok", "{first}");
    let runs = app
        .data
        .path()
        .join("workspaces")
        .join(&sid)
        .join("runs.txt");
    assert_eq!(std::fs::read_to_string(runs).unwrap(), "ran\n");
    let starts = app
        .events(&sid)
        .await
        .iter()
        .filter(|e| e["kind"] == "invocation.started" && e["data"]["call_id"] == "slow")
        .count();
    assert_eq!(starts, 1);
}

async fn process_ids_stay_unique_across_a_restart(backend: Backend) {
    let app = backend.spawn().await;
    let sid = new_session(&app, json!({})).await;
    for i in 0..3 {
        app.call(
            &sid,
            &format!("fg-{i}"),
            "shell",
            json!({"command": "true"}),
        )
        .await;
    }
    let r = app
        .call(
            &sid,
            "bg-1",
            "shell",
            json!({"command": "sleep 600", "background": true}),
        )
        .await;
    assert!(r["content"].as_str().unwrap().contains("p1"), "{r}");
    let app = app.restart().await;
    let r = app
        .call(
            &sid,
            "bg-2",
            "shell",
            json!({"command": "sleep 600", "background": true}),
        )
        .await;
    let content = r["content"].as_str().unwrap();
    assert!(content.contains("process p2"), "{r}");
    // p1 is the earlier run's: the log says what became of it.
    let old = app
        .call(&sid, "read-1", "process_read", json!({"process_id": "p1"}))
        .await;
    assert!(
        old["content"]
            .as_str()
            .unwrap()
            .contains("the service restarted"),
        "{old}"
    );
    let closed = app.delete(&format!("/v1/sessions/{sid}")).await;
    assert_eq!(closed.status(), 200);
}
