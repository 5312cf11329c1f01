//! What one write may cost the store and the other sessions, against the real service on both
//! stores (Postgres first), checked from the host side: big change sets are written in bounded
//! statements and recorded once, a write the store refuses becomes a failed call (never an
//! endless retry, never another session's failure), NUL in ids, names and metadata is a 422, no
//! database text reaches a response, unknown process ids cost one indexed lookup or none, and
//! the per-tenant cap on open sessions holds under concurrent creates.
//!
//! `both_stores!` turns every listed body into `budget_store::postgres::<name>` and
//! `budget_store::sqlite::<name>`.
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};
use toolexec_core::{EventKind, sha256_hex};
use toolexec_store::{NewEvent, NewInvocation, Outcome, Write};
use toolexec_tests::app::Backend;
use toolexec_tests::app::{DbControl, TestApp, spawn_app_with};
use toolexec_tests::counting::CountingStore;

toolexec_tests::on_both_stores!(
    a_change_set_larger_than_one_statement_is_recorded_completely_in_bounded_statements,
    contents_beyond_the_per_call_budget_are_recorded_by_hash_only,
    a_write_the_store_refuses_becomes_a_failed_call_and_its_retry_returns_at_once,
    nul_in_call_ids_names_and_metadata_is_refused_with_422_and_a_pointer,
    one_sessions_unstorable_calls_never_fail_another_sessions_reads,
    a_5xx_answer_names_the_request_but_no_database_text,
    an_unknown_process_id_costs_one_indexed_lookup_or_none,
    the_open_session_cap_holds_under_concurrent_creates,
);

// --- helpers ---

fn sqlite_path(app: &TestApp) -> std::path::PathBuf {
    app.data.path().join("toolexec.db")
}

/// Runs statements on the service's own database, behind its back (a rule the database then
/// enforces, a size): Postgres through the test database's URL, SQLite on the file.
async fn sql(app: &TestApp, statements: &[&str]) {
    match &app.db {
        Some(db) => {
            let mut conn = sqlx::PgConnection::connect(db.url()).await.unwrap();
            for s in statements {
                sqlx::query(AssertSqlSafe(s.to_string()))
                    .execute(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{s}: {e}"));
            }
        }
        None => {
            let mut conn = sqlx::sqlite::SqliteConnectOptions::from_str("sqlite:")
                .unwrap()
                .filename(sqlite_path(app))
                .connect()
                .await
                .unwrap();
            for s in statements {
                sqlx::query(AssertSqlSafe(s.to_string()))
                    .execute(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{s}: {e}"));
            }
        }
    }
}

/// Bytes the database holds: `pg_database_size`, or SQLite's pages (the WAL's included).
async fn database_bytes(app: &TestApp) -> i64 {
    match &app.db {
        Some(db) => {
            let mut conn = sqlx::PgConnection::connect(db.url()).await.unwrap();
            sqlx::query_scalar("SELECT pg_database_size(current_database())")
                .fetch_one(&mut conn)
                .await
                .unwrap()
        }
        None => {
            let mut conn = sqlx::sqlite::SqliteConnectOptions::from_str("sqlite:")
                .unwrap()
                .filename(sqlite_path(app))
                .connect()
                .await
                .unwrap();
            sqlx::query_scalar(
                "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
            )
            .fetch_one(&mut conn)
            .await
            .unwrap()
        }
    }
}

async fn new_session(app: &TestApp, body: Value) -> String {
    app.session(body).await["id"].as_str().unwrap().to_owned()
}

fn workspace(app: &TestApp, sid: &str) -> std::path::PathBuf {
    app.data.path().join("workspaces").join(sid)
}

/// One line of /metrics (a sample with labels), 0 if absent.
async fn sample(app: &TestApp, series: &str) -> f64 {
    let text = app.get("/metrics").await.text().await.unwrap();
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|v| v.strip_prefix(' '))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0.0)
}

/// A call that must answer promptly (a retry of a recorded call id): never a hang.
async fn call_within(app: &TestApp, sid: &str, id: &str, name: &str, args: Value) -> Value {
    tokio::time::timeout(Duration::from_secs(10), app.call(sid, id, name, args))
        .await
        .unwrap_or_else(|_| panic!("the call {id} did not answer within 10 s"))
}

/// Words of database errors (Postgres and SQLite), which no response may carry.
const DATABASE_WORDS: &[&str] = &[
    "constraint",
    "violates",
    "sqlstate",
    "sqlite",
    "postgres",
    "pool",
    "connection",
    "error returned from database",
    "test rule",
    "test_refuse",
];

fn assert_no_database_text(text: &str) {
    let lower = text.to_lowercase();
    for word in DATABASE_WORDS {
        assert!(!lower.contains(word), "{word:?} leaked in: {text}");
    }
}

// --- tests ---

/// With the statement bound lowered to 4 MiB, 16 files of 1.5 MB (24 MB, random) go to the store
/// in 8 statements of two files each: the bound is what splits them. Everything is recorded
/// once, the call is not left running, and its retry answers at once.
async fn a_change_set_larger_than_one_statement_is_recorded_completely_in_bounded_statements(
    backend: Backend,
) {
    const BOUND: usize = 4 * 1024 * 1024;
    const FILES: usize = 16;
    const SIZE: usize = 1_500_000;
    let app = backend
        .spawn_with(|c| c.limits.blob_bytes_per_statement = BOUND)
        .await;
    let sid = new_session(&app, json!({})).await;
    let series = "toolexec_store_blob_statement_bytes";
    let count0 = sample(&app, &format!("{series}_count")).await;
    let sum0 = sample(&app, &format!("{series}_sum")).await;
    let within0 = sample(&app, &format!("{series}_bucket{{le=\"4194304.0\"}}")).await;
    let half0 = sample(&app, &format!("{series}_bucket{{le=\"2097152.0\"}}")).await;
    let size0 = database_bytes(&app).await;

    let args = json!({"command": format!(
        "for i in $(seq 1 {FILES}); do head -c {SIZE} /dev/urandom > f$i.bin; done"
    )});
    let first = app.call(&sid, "big", "shell", args.clone()).await;
    assert_eq!(first["status"], "ok", "{first}");

    // Every file's contents are stored, byte for byte, under the hash the event names.
    let inv = app.invocation_of(&first).await;
    assert_eq!(inv["status"], "ok");
    let effects = inv["side_effects"].as_array().unwrap();
    let files: Vec<&Value> = effects
        .iter()
        .filter(|e| e["kind"] == "file.created")
        .collect();
    assert_eq!(files.len(), FILES, "{inv}");
    let store = app.state.engine.store();
    for e in &files {
        let path = e["data"]["path"].as_str().unwrap();
        let on_disk = std::fs::read(workspace(&app, &sid).join(path)).unwrap();
        assert_eq!(e["data"]["after_stored"], true, "{e}");
        assert_eq!(e["data"]["after_sha256"], sha256_hex(&on_disk).as_str());
        let stored = store
            .blob(e["data"]["after_sha256"].as_str().unwrap())
            .await
            .unwrap()
            .expect("blob stored");
        assert!(stored == on_disk, "{path}: stored contents differ");
    }

    // 24 MB in 8 statements of 3 MB: all within the 4 MiB bound, none a single 1.5 MB file.
    let statements = sample(&app, &format!("{series}_count")).await - count0;
    let sent = sample(&app, &format!("{series}_sum")).await - sum0;
    let within = sample(&app, &format!("{series}_bucket{{le=\"4194304.0\"}}")).await - within0;
    let half = sample(&app, &format!("{series}_bucket{{le=\"2097152.0\"}}")).await - half0;
    assert_eq!(sent, (FILES * SIZE) as f64, "every byte sent once");
    assert_eq!(statements, 8.0, "two 1.5 MB files per 4 MiB statement");
    assert_eq!(within, statements, "no statement above the bound");
    assert_eq!(
        half, 0.0,
        "statements filled up to the bound, not one file each"
    );

    // The database grew by about the stored bytes, not a multiple of them.
    let grown = database_bytes(&app).await - size0;
    let stored = (FILES * SIZE) as i64;
    assert!(
        grown >= stored * 9 / 10 && grown <= stored * 3 / 2,
        "database grew by {grown} bytes for {stored} bytes of contents"
    );

    // The retry of the call id answers at once with the record; nothing runs again.
    let events = app.events(&sid).await.len();
    let again = call_within(&app, &sid, "big", "shell", args).await;
    assert_eq!(again, first);
    assert_eq!(app.events(&sid).await.len(), events);
}

/// One call stores at most `limits.max_blob_bytes_per_call` of contents: with 3 MB allowed, of
/// four 1 MB files three are stored and one is recorded by hash, saying why.
async fn contents_beyond_the_per_call_budget_are_recorded_by_hash_only(backend: Backend) {
    let app = backend
        .spawn_with(|c| c.limits.max_blob_bytes_per_call = 3_000_000)
        .await;
    let sid = new_session(&app, json!({})).await;
    let size0 = database_bytes(&app).await;
    let r = app
        .call(
            &sid,
            "four",
            "shell",
            json!({"command": "for i in 1 2 3 4; do head -c 1000000 /dev/urandom > m$i.bin; done"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let inv = app.invocation_of(&r).await;
    let files: Vec<&Value> = inv["side_effects"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "file.created")
        .collect();
    assert_eq!(files.len(), 4);
    let store = app.state.engine.store();
    let mut stored = 0;
    for e in &files {
        let sha = e["data"]["after_sha256"].as_str().unwrap();
        let on_disk =
            std::fs::read(workspace(&app, &sid).join(e["data"]["path"].as_str().unwrap())).unwrap();
        assert_eq!(sha, sha256_hex(&on_disk), "the hash is recorded either way");
        if e["data"]["after_stored"] == true {
            stored += 1;
            assert!(store.blob(sha).await.unwrap().is_some());
        } else {
            assert_eq!(e["data"]["after_unstored"], "call_budget", "{e}");
            assert!(store.blob(sha).await.unwrap().is_none());
        }
    }
    assert_eq!(stored, 3);
    let grown = database_bytes(&app).await - size0;
    assert!(grown < 3_600_000, "database grew by {grown} bytes");
}

/// The database refuses some rows for good (a rule installed behind the service's back): the
/// call is recorded as failed, in plain words, and a retry of its id returns that at once. A
/// mutating call's finish and a read's one-write record alike.
async fn a_write_the_store_refuses_becomes_a_failed_call_and_its_retry_returns_at_once(
    backend: Backend,
) {
    let app = backend.spawn().await;
    let sid = new_session(&app, json!({"files": {"marker.txt": "FORBIDDEN-MARKER\n"}})).await;
    install_refusal_rules(&app).await;
    let refused0 = app.metric("toolexec_store_writes_refused_total").await;

    let args = json!({"command": "echo ok > fine.txt; echo no > forbidden.txt"});
    let r = app.call(&sid, "s1", "shell", args.clone()).await;
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["is_error"], true);
    let content = r["content"].as_str().unwrap();
    assert!(
        content.contains(
            "its result could not be recorded: it breaks a rule of the database's schema"
        ),
        "{content}"
    );
    assert!(
        content.contains("could not be recorded either"),
        "{content}"
    );
    assert_no_database_text(content);
    // The side effects did happen; the record says the call failed, and is not left running.
    assert!(workspace(&app, &sid).join("forbidden.txt").exists());
    let inv = app.invocation_of(&r).await;
    assert_eq!(inv["status"], "error");
    assert_eq!(inv["content"], r["content"]);
    let last = app.events(&sid).await.pop().unwrap();
    assert_eq!(last["kind"], "invocation.finished");
    assert_eq!(last["data"]["status"], "error");
    assert_eq!(call_within(&app, &sid, "s1", "shell", args).await, r);

    // A read whose output the database refuses: recorded as an error, the output not shown.
    let read = json!({"file_path": "marker.txt"});
    let r = app.call(&sid, "r1", "read_file", read.clone()).await;
    assert_eq!(r["status"], "error", "{r}");
    let content = r["content"].as_str().unwrap();
    assert!(content.contains("could not be recorded"), "{content}");
    assert!(!content.contains("FORBIDDEN-MARKER"), "{content}");
    assert_no_database_text(content);
    assert_eq!(app.invocation_of(&r).await["status"], "error");
    assert_eq!(call_within(&app, &sid, "r1", "read_file", read).await, r);

    // The session goes on: a call the store can hold is recorded as usual.
    let ok = app
        .call(
            &sid,
            "s2",
            "shell",
            json!({"command": "echo fine > other.txt"}),
        )
        .await;
    assert_eq!(ok["status"], "ok", "{ok}");
    assert!(app.metric("toolexec_store_writes_refused_total").await >= refused0 + 2.0);
}

/// Rules the store cannot know in advance, so only the database refuses: no file event for a
/// path starting `forbidden`, no invocation whose content holds `FORBIDDEN-MARKER`, no call id
/// `poison`.
async fn install_refusal_rules(app: &TestApp) {
    if app.db.is_some() {
        sql(
            app,
            &[
                "ALTER TABLE events ADD CONSTRAINT test_refuse_forbidden \
                 CHECK (kind NOT LIKE 'file.%' OR data->>'path' NOT LIKE 'forbidden%') NOT VALID",
                "ALTER TABLE invocations ADD CONSTRAINT test_refuse_marker \
                 CHECK (content IS NULL OR content NOT LIKE '%FORBIDDEN-MARKER%') NOT VALID",
                "ALTER TABLE invocations ADD CONSTRAINT test_refuse_poison \
                 CHECK (call_id <> 'poison') NOT VALID",
            ],
        )
        .await;
    } else {
        sql(
            app,
            &[
                "CREATE TRIGGER test_refuse_forbidden BEFORE INSERT ON events \
                 WHEN NEW.kind LIKE 'file.%' AND json_extract(NEW.data, '$.path') LIKE 'forbidden%' \
                 BEGIN SELECT RAISE(ABORT, 'test rule: forbidden path'); END",
                "CREATE TRIGGER test_refuse_marker BEFORE INSERT ON invocations \
                 WHEN NEW.content LIKE '%FORBIDDEN-MARKER%' \
                 BEGIN SELECT RAISE(ABORT, 'test rule: marker'); END",
                "CREATE TRIGGER test_refuse_poison BEFORE INSERT ON invocations \
                 WHEN NEW.call_id = 'poison' \
                 BEGIN SELECT RAISE(ABORT, 'test rule: poison'); END",
            ],
        )
        .await;
    }
}

async fn nul_in_call_ids_names_and_metadata_is_refused_with_422_and_a_pointer(backend: Backend) {
    let app = backend.spawn().await;
    for (metadata, pointer) in [
        (json!({"a": {"b": ["x", "y\u{0}"]}}), "metadata/a/b/1"),
        (json!({"k\u{0}": 1}), "metadata/k\u{0}"),
    ] {
        let r = app
            .post("/v1/sessions", &json!({"metadata": metadata}))
            .await;
        assert_eq!(r.status(), 422);
        let p: Value = r.json().await.unwrap();
        assert_eq!(p["code"], "invalid_metadata", "{p}");
        assert!(
            p["detail"].as_str().unwrap().starts_with(pointer),
            "{p} should name {pointer:?}"
        );
    }
    let sessions: Value = app.get("/v1/sessions").await.json().await.unwrap();
    assert_eq!(sessions["sessions"].as_array().unwrap().len(), 0);

    let sid = new_session(&app, json!({"files": {"a.txt": "a\n"}})).await;
    let before = app.events(&sid).await.len();
    let read = json!({"file_path": "a.txt"});
    for (calls, code, pointer) in [
        (
            json!([{"id": "a\u{0}b", "name": "read_file", "arguments": read}]),
            "invalid_call_id",
            "calls/0/id",
        ),
        (
            json!([
                {"id": "fine", "name": "read_file", "arguments": read},
                {"id": "n", "name": "read\u{0}file", "arguments": read}
            ]),
            "invalid_tool_name",
            "calls/1/name",
        ),
    ] {
        let r = app
            .post(
                &format!("/v1/sessions/{sid}/calls"),
                &json!({"calls": calls}),
            )
            .await;
        assert_eq!(r.status(), 422);
        let p: Value = r.json().await.unwrap();
        assert_eq!(p["code"], code, "{p}");
        assert!(p["detail"].as_str().unwrap().starts_with(pointer), "{p}");
    }
    // Refused for that request alone: nothing of it ran or was recorded, the session works.
    assert_eq!(app.events(&sid).await.len(), before);
    let r = app.call(&sid, "fine", "read_file", read).await;
    assert_eq!(r["status"], "ok");
}

/// While one session sends calls that cannot be stored — NUL in ids (422 before anything runs)
/// and reads whose record the database refuses (found only when committing, in group commits
/// shared with everyone) — another session's 300 reads all succeed.
async fn one_sessions_unstorable_calls_never_fail_another_sessions_reads(backend: Backend) {
    let app = Arc::new(backend.spawn().await);
    let hostile = new_session(&app, json!({"files": {"marker.txt": "FORBIDDEN-MARKER\n"}})).await;
    let victim = new_session(&app, json!({"files": {"b.txt": "hello\n"}})).await;
    install_refusal_rules(&app).await;

    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..4 {
        let (app, sid) = (app.clone(), hostile.clone());
        tasks.spawn(async move {
            let mut refused = 0;
            for i in 0..30 {
                let nul = app
                    .post(
                        &format!("/v1/sessions/{sid}/calls"),
                        &json!({"calls": [{"id": format!("x\u{0}{worker}-{i}"), "name": "read_file", "arguments": {"file_path": "marker.txt"}}]}),
                    )
                    .await;
                assert_eq!(nul.status(), 422);
                let r = app
                    .call(
                        &sid,
                        &format!("m{worker}-{i}"),
                        "read_file",
                        json!({"file_path": "marker.txt"}),
                    )
                    .await;
                assert_eq!(r["status"], "error", "{r}");
                refused += 1;
            }
            (false, refused)
        });
    }
    for worker in 0..10 {
        let (app, sid) = (app.clone(), victim.clone());
        tasks.spawn(async move {
            let mut ok = 0;
            for i in 0..30 {
                let r = app
                    .post(
                        &format!("/v1/sessions/{sid}/calls"),
                        &json!({"calls": [{"id": format!("v{worker}-{i}"), "name": "read_file", "arguments": {"file_path": "b.txt"}}]}),
                    )
                    .await;
                let status = r.status();
                let body: Value = r.json().await.unwrap();
                assert_eq!(status, 200, "{body}");
                assert_eq!(body["results"][0]["status"], "ok", "{body}");
                ok += 1;
            }
            (true, ok)
        });
    }
    let (mut ok, mut refused) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        match done.unwrap() {
            (true, n) => ok += n,
            (false, n) => refused += n,
        }
    }
    assert_eq!(ok, 300);
    assert_eq!(refused, 120);
    assert!(app.metric("toolexec_store_writes_refused_total").await >= 120.0);
}

async fn a_5xx_answer_names_the_request_but_no_database_text(backend: Backend) {
    let app = backend.spawn().await;
    let sid = new_session(&app, json!({})).await;
    install_refusal_rules(&app).await;
    // A call whose start the database refuses does not run, and the 500 says nothing of why.
    let r = app
        .post(
            &format!("/v1/sessions/{sid}/calls"),
            &json!({"calls": [{"id": "poison", "name": "write_file", "arguments": {"file_path": "p.txt", "content": "x"}}]}),
        )
        .await;
    assert_eq!(r.status(), 500);
    let request_id = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    let body = r.text().await.unwrap();
    assert!(body.contains(&format!("request id {request_id}")), "{body}");
    assert!(!body.contains("poison"), "{body}");
    assert_no_database_text(&body);
    assert!(!workspace(&app, &sid).join("p.txt").exists());

    let Some(db) = app.db.clone() else {
        return;
    };
    // The store unreachable: 503s with a generic detail, on every route that needs it.
    db.set_reachable(false).await;
    let calls = app
        .post(
            &format!("/v1/sessions/{sid}/calls"),
            &json!({"calls": [{"id": "w", "name": "write_file", "arguments": {"file_path": "w.txt", "content": "x"}}]}),
        )
        .await;
    let show = app.get(&format!("/v1/sessions/{sid}")).await;
    let ready = app.get("/readyz").await;
    for r in [calls, show] {
        assert_eq!(r.status(), 503);
        let request_id = r.headers()["x-request-id"].to_str().unwrap().to_owned();
        let body = r.text().await.unwrap();
        assert!(body.contains(&format!("request id {request_id}")), "{body}");
        assert_no_database_text(&body);
    }
    assert_eq!(ready.status(), 503);
    let ready: Value = ready.json().await.unwrap();
    assert_no_database_text(ready["store_status"].as_str().unwrap());
    db.set_reachable(true).await;
}

/// A session whose log holds 60,000 events and 101 shell calls, two of which started `p2` and
/// `p64` in an earlier run of the service: 64 lookups of ids the log may hold cost 64 indexed
/// queries (no paging through the log), ids it cannot hold cost none, and the query's plan uses
/// the index.
async fn an_unknown_process_id_costs_one_indexed_lookup_or_none(backend: Backend) {
    let app = backend.spawn().await;
    let sid = new_session(&app, json!({})).await;
    let session_id: uuid::Uuid = sid.parse().unwrap();
    let store = app.state.engine.store().clone();
    let shell = |n: usize, side_effects: Vec<NewEvent>| {
        let arguments = json!({"command": format!("echo {n}")});
        Write::Record {
            invocation: NewInvocation {
                id: toolexec_core::new_id(),
                session_id,
                call_id: format!("old-{n}"),
                name: "shell".into(),
                arguments_sha256: toolexec_engine::arguments_sha256(&arguments),
                arguments,
                read_only: false,
                capabilities: vec![],
                node: "test-node".into(),
                started_at: chrono::Utc::now(),
            },
            outcome: Outcome {
                status: toolexec_core::CallStatus::Ok,
                content: String::new(),
                truncated: None,
                output_chars: 0,
                output_sha256: None,
                finished_at: chrono::Utc::now(),
                duration_ms: 1.0,
                reads: Vec::new(),
                structured: None,
            },
            side_effects,
            blobs: vec![],
        }
    };
    let started = NewEvent {
        kind: EventKind::ProcessStarted,
        data: json!({"process_id": "p2", "command": "sleep 100"}),
    };
    let mut writes = vec![shell(0, vec![started])];
    for n in 1..=3 {
        let effects = (0..20_000)
            .map(|i| NewEvent {
                kind: EventKind::FileModified,
                data: json!({"path": format!("f{n}-{i}")}),
            })
            .collect();
        writes.push(shell(n, effects));
    }
    writes.extend((4..100).map(|n| shell(n, vec![])));
    // The last process id that run gave: the restarted service numbers its own above it.
    writes.push(shell(
        100,
        vec![NewEvent {
            kind: EventKind::ProcessStarted,
            data: json!({"process_id": "p64", "command": "sleep 64"}),
        }],
    ));
    for w in writes {
        let r = store.commit(&[w]).await.unwrap();
        assert!(r[0].is_ok(), "{r:?}");
    }

    // A restart (the processes of that run are gone), with the store's log reads counted.
    let mut app = app;
    app.stop().await;
    let mut counting = None;
    let app = TestApp::start_wrapped(app.config.clone(), app.data.clone(), app.db.clone(), |s| {
        let c = CountingStore::new(s);
        counting = Some(c.clone());
        c
    })
    .await;
    let counting = counting.unwrap();

    let batch: Vec<Value> = (1..=64)
        .map(|n| json!({"id": format!("r{n}"), "name": "process_read", "arguments": {"process_id": format!("p{n}")}}))
        .collect();
    let t0 = Instant::now();
    let results = app.calls(&sid, json!(batch)).await;
    let took = t0.elapsed();
    assert_eq!(results.len(), 64);
    assert!(
        results[1]["content"]
            .as_str()
            .unwrap()
            .contains("the service restarted"),
        "{}",
        results[1]
    );
    assert!(
        !results[0]["content"]
            .as_str()
            .unwrap()
            .contains("the service restarted")
    );
    assert_eq!(
        counting
            .process_lookups
            .load(std::sync::atomic::Ordering::SeqCst),
        64
    );
    assert_eq!(
        counting
            .event_pages
            .load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no paging through the log"
    );
    // Loading the session folded its plan and tasks with one probe of the todo index.
    assert_eq!(
        counting
            .todo_lookups
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    // It took 25 s by paging; one probe per id is far under this (generous, for a busy machine).
    assert!(took < Duration::from_secs(5), "64 lookups took {took:?}");

    // Ids no run of the service could have given (p65 on is this runtime's own range, which it
    // knows): answered without a query.
    let impossible: Vec<Value> = ["p65", "p102", "p999999", "p0", "p01", "x7", "p", "p-1"]
        .iter()
        .enumerate()
        .map(|(i, id)| json!({"id": format!("i{i}"), "name": "process_kill", "arguments": {"process_id": id}}))
        .collect();
    let results = app.calls(&sid, json!(impossible)).await;
    assert!(results.iter().all(|r| r["status"] == "error"));
    assert_eq!(
        counting.log_reads(),
        64,
        "no query for ids that cannot exist"
    );

    assert_plan_uses_the_process_index(&app).await;
}

async fn assert_plan_uses_the_process_index(app: &TestApp) {
    match &app.db {
        Some(db) => {
            // As the store's connections run it: a generic plan, sequential scans off.
            let mut conn = sqlx::PgConnection::connect(db.url()).await.unwrap();
            for s in [
                "SET enable_seqscan = off",
                "SET plan_cache_mode = force_generic_plan",
            ] {
                sqlx::query(s).execute(&mut conn).await.unwrap();
            }
            sqlx::query(AssertSqlSafe(format!(
                "PREPARE lookup(uuid, uuid, text) AS {}",
                toolexec_store::postgres::PROCESS_STARTED
            )))
            .execute(&mut conn)
            .await
            .unwrap();
            let plan: Vec<String> = sqlx::query_scalar(
                "EXPLAIN EXECUTE lookup('00000000-0000-0000-0000-000000000000', \
                 '00000000-0000-0000-0000-000000000000', 'p1')",
            )
            .fetch_all(&mut conn)
            .await
            .unwrap();
            let plan = plan.join("\n");
            assert!(plan.contains("events_process_started"), "{plan}");
        }
        None => {
            let mut conn = sqlx::sqlite::SqliteConnectOptions::from_str("sqlite:")
                .unwrap()
                .filename(sqlite_path(app))
                .connect()
                .await
                .unwrap();
            let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as(AssertSqlSafe(format!(
                "EXPLAIN QUERY PLAN {}",
                toolexec_store::sqlite::PROCESS_STARTED
            )))
            .bind(uuid::Uuid::nil())
            .bind(uuid::Uuid::nil())
            .bind("p1")
            .fetch_all(&mut conn)
            .await
            .unwrap();
            let plan: Vec<String> = rows.into_iter().map(|r| r.3).collect();
            assert!(
                plan.iter()
                    .any(|d| d.contains("USING INDEX events_process_started")),
                "{plan:?}"
            );
        }
    }
}

/// With a cap of 5 open sessions and 3 open, 20 concurrent creates make exactly 2 more; the
/// rest are told to close sessions. Closing one makes room for one.
async fn the_open_session_cap_holds_under_concurrent_creates(backend: Backend) {
    let app = Arc::new(
        backend
            .spawn_with(|c| c.limits.max_open_sessions_per_tenant = 5)
            .await,
    );
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(new_session(&app, json!({})).await);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let app = app.clone();
        tasks.spawn(async move {
            let r = app
                .post("/v1/sessions", &json!({"files": {"a.txt": "a\n"}}))
                .await;
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        });
    }
    let mut created = 0;
    let mut refused = 0;
    while let Some(done) = tasks.join_next().await {
        let (status, body) = done.unwrap();
        match status {
            201 => created += 1,
            409 => {
                assert_eq!(body["code"], "too_many_open_sessions", "{body}");
                let detail = body["detail"].as_str().unwrap();
                assert!(detail.contains("5 open sessions"), "{detail}");
                assert!(detail.contains("close sessions"), "{detail}");
                refused += 1;
            }
            other => panic!("{other}: {body}"),
        }
    }
    assert_eq!((created, refused), (2, 18));
    let listed: Value = app
        .get("/v1/sessions?limit=200")
        .await
        .json()
        .await
        .unwrap();
    let active = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["status"] == "active")
        .count();
    assert_eq!(active, 5);
    // A refused create leaves no workspace behind.
    // (`.layers` holds forks' layers, none here.)
    let workspaces = std::fs::read_dir(app.data.path().join("workspaces"))
        .unwrap()
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .count();
    assert_eq!(workspaces, 5);

    assert_eq!(
        app.delete(&format!("/v1/sessions/{}", open[0]))
            .await
            .status(),
        200
    );
    new_session(&app, json!({})).await;
    let r = app.post("/v1/sessions", &json!({})).await;
    assert_eq!(r.status(), 409);
}

/// A finish that meets a store outage is retried until the store is back (the request gives up
/// after its grace with a 503 that says so), then recorded once, blobs included; the retry of
/// the call id returns it. Postgres only: the outage is real, the database refusing connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_finish_delayed_by_an_outage_is_recorded_once_the_store_is_back() {
    let app = Arc::new(spawn_app_with(|c| c.limits.blob_bytes_per_statement = 1024 * 1024).await);
    let sid = new_session(&app, json!({})).await;
    let args = json!({"command": "sleep 2; head -c 3000000 /dev/urandom > late.bin"});
    let call = {
        let (app, sid, args) = (app.clone(), sid.clone(), args.clone());
        tokio::spawn(async move {
            app.post(
                &format!("/v1/sessions/{sid}/calls"),
                &json!({"calls": [{"id": "late", "name": "shell", "arguments": args}]}),
            )
            .await
        })
    };
    // The start is durable long before the command ends; then the database goes away.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let db = app.db.clone().unwrap();
    db.set_reachable(false).await;
    let r = call.await.unwrap();
    assert_eq!(r.status(), 503);
    let p: Value = r.json().await.unwrap();
    assert!(
        p["detail"].as_str().unwrap().contains("not recorded yet"),
        "{p}"
    );
    db.set_reachable(true).await;

    let r = tokio::time::timeout(
        Duration::from_secs(30),
        app.call(&sid, "late", "shell", args),
    )
    .await
    .expect("the retry answers once the finish is recorded");
    assert_eq!(r["status"], "ok", "{r}");
    let inv = app.invocation_of(&r).await;
    let late = inv["side_effects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["data"]["path"] == "late.bin")
        .cloned()
        .expect("late.bin recorded");
    assert_eq!(late["data"]["after_stored"], true);
    let on_disk = std::fs::read(workspace(&app, &sid).join("late.bin")).unwrap();
    let blob = app
        .state
        .engine
        .store()
        .blob(late["data"]["after_sha256"].as_str().unwrap())
        .await
        .unwrap();
    assert!(blob == Some(on_disk));
    let finished = app
        .events(&sid)
        .await
        .iter()
        .filter(|e| e["kind"] == "invocation.finished")
        .count();
    assert_eq!(finished, 1, "recorded once");
}
