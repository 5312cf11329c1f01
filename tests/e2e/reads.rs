//! Read-before-write state comes from the log (docs/design.md, "Read-state from the log"):
//! what a session read survives every way its runtime is rebuilt — a take-over by another
//! replica on the same Postgres, a restart of its node, an eviction from the node's cache and
//! the reload — and a fork at a seq or a rewind to a seq has exactly the reads recorded at or
//! before that seq. In each case an edit of a file read before is allowed, one the shell
//! changed since is refused as stale, and after a rewind to before the reads an edit is refused
//! as unread.
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection};
use toolexec_core::{
    CallStatus, Capability, EventKind, FileRead, Policy, Session, SessionStatus, new_id, sha256_hex,
};
use toolexec_store::{NewEvent, NewInvocation, Outcome, ReadRecord, Write};
use toolexec_tests::app::{Backend, TestApp};
use toolexec_tests::binary::{Served, serve, toolexec};
use toolexec_tests::counting::CountingStore;
use toolexec_tests::db::{TestPgDatabase, TestStore};
use toolexec_tests::on_both_stores;
use uuid::Uuid;

on_both_stores!(
    reads_survive_a_restart_of_the_node,
    reads_survive_an_eviction_and_the_reload,
    a_fork_at_a_seq_has_the_reads_recorded_up_to_it,
    a_rewind_to_a_seq_keeps_the_reads_up_to_it_and_forgets_the_later_ones,
    the_record_of_a_read_names_the_path_and_the_hash_it_saw,
    loading_a_session_walks_its_read_records_once_through_their_index,
);

/// The files every scenario starts with.
fn files() -> Value {
    json!({"files": {
        "src/app.py": "print('hello')\n",
        "src/lib.py": "x = 1\n",
        "notes.txt": "todo: ship it\n",
        "cfg.toml": "debug = false\n",
    }})
}

/// A client of one service (a test server, or a replica of the binary).
struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    fn of(app: &TestApp) -> Self {
        Self::at(&app.base)
    }

    fn at(base: &str) -> Self {
        toolexec_tools::web::install_tls_provider();
        Self {
            http: reqwest::Client::new(),
            base: base.to_owned(),
        }
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .timeout(Duration::from_secs(120))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn session(&self, body: &Value) -> String {
        let (status, s) = self.post("/v1/sessions", body).await;
        assert_eq!(status, 201, "{s}");
        s["id"].as_str().unwrap().to_owned()
    }

    async fn last_seq(&self, sid: &str) -> i64 {
        self.get(&format!("/v1/sessions/{sid}")).await["last_seq"]
            .as_i64()
            .unwrap()
    }

    /// One call, retried with the same id while the answer is a 502 or 503 (what a client does
    /// while a node goes away and another takes the session over).
    async fn call(&self, sid: &str, id: &str, name: &str, args: Value) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, body) = self
                .post(
                    &format!("/v1/sessions/{sid}/calls"),
                    &json!({"calls": [{"id": id, "name": name, "arguments": args}]}),
                )
                .await;
            if status == 200 {
                return body["results"][0].clone();
            }
            assert!(
                (status == 503 || status == 502) && Instant::now() < deadline,
                "{id}: HTTP {status}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn ok(&self, sid: &str, id: &str, name: &str, args: Value) -> Value {
        let r = self.call(sid, id, name, args).await;
        assert_eq!(r["status"], "ok", "{id}: {r}");
        r
    }

    async fn edit(&self, sid: &str, id: &str, path: &str, old: &str, new: &str) -> Value {
        self.call(
            sid,
            id,
            "edit_file",
            json!({"file_path": path, "old_string": old, "new_string": new}),
        )
        .await
    }

    async fn rewind(&self, sid: &str, to_seq: i64) {
        let (status, body) = self
            .post(
                &format!("/v1/sessions/{sid}/rewind"),
                &json!({"to_seq": to_seq}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }

    async fn fork(&self, sid: &str, at_seq: i64) -> String {
        let (status, body) = self
            .post(
                &format!("/v1/sessions/{sid}/fork"),
                &json!({"at_seq": at_seq}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_str().unwrap().to_owned()
    }
}

/// The seqs of a session around its reads.
struct Marks {
    /// The last event before the first read.
    before_reads: i64,
    /// The last event of the reads (before the shell changed `src/lib.py`).
    after_reads: i64,
}

/// Reads `src/app.py` and `cfg.toml` (read_file), `src/lib.py` (read_many_files) and
/// `notes.txt` (a grep hit), then changes `src/lib.py` with the shell.
async fn read_then_change(api: &Api, sid: &str) -> Marks {
    let before_reads = api.last_seq(sid).await;
    api.ok(sid, "r1", "read_file", json!({"file_path": "src/app.py"}))
        .await;
    api.ok(
        sid,
        "r2",
        "read_many_files",
        json!({"paths": ["src/lib.py"]}),
    )
    .await;
    let hit = api
        .ok(
            sid,
            "r3",
            "grep",
            json!({"pattern": "todo", "path": "notes.txt"}),
        )
        .await;
    assert!(
        hit["content"].as_str().unwrap().contains("ship it"),
        "{hit}"
    );
    let last = api
        .ok(sid, "r4", "read_file", json!({"file_path": "cfg.toml"}))
        .await;
    let after_reads = last["seq"].as_i64().unwrap();
    api.ok(
        sid,
        "sh1",
        "shell",
        json!({"command": "echo 'y = 2' >> src/lib.py"}),
    )
    .await;
    Marks {
        before_reads,
        after_reads,
    }
}

fn assert_allowed(r: &Value) {
    assert_eq!(r["status"], "ok", "an edit of a file read before: {r}");
}

fn assert_stale(r: &Value) {
    assert_eq!(r["status"], "denied", "{r}");
    assert!(
        r["content"]
            .as_str()
            .unwrap()
            .contains("has changed since you read it"),
        "a file the shell changed since the read is refused as stale: {r}"
    );
}

fn assert_unread(r: &Value) {
    assert_eq!(r["status"], "denied", "{r}");
    assert!(
        r["content"].as_str().unwrap().contains("has not been read"),
        "refused as unread: {r}"
    );
}

/// After the session's runtime was rebuilt: the files read before can be edited (read_file,
/// read_many_files is stale, grep hit), the one the shell changed is refused as stale, and after
/// a rewind to before the reads a file read then is refused as unread.
async fn assert_reads_kept(api: &Api, sid: &str, marks: &Marks) {
    assert_allowed(&api.edit(sid, "e1", "src/app.py", "hello", "bye").await);
    assert_allowed(&api.edit(sid, "e2", "notes.txt", "ship", "test").await);
    assert_stale(&api.edit(sid, "e3", "src/lib.py", "x = 1", "x = 3").await);
    api.rewind(sid, marks.before_reads).await;
    // cfg.toml was read after that seq and is the same file as then: unread all the same.
    assert_unread(&api.edit(sid, "e4", "cfg.toml", "false", "true").await);
    assert_unread(&api.edit(sid, "e5", "src/app.py", "hello", "bye").await);
}

/// A replica of the binary on `db`, with a short lease so that a take-over comes quickly.
fn replica(name: &str, db: &TestPgDatabase, data: &std::path::Path) -> Served {
    let mut cmd = toolexec(data);
    cmd.arg("serve")
        .env("TOOLEXEC_BIND", "127.0.0.1:0")
        .env("TOOLEXEC_DATABASE_URL", db.url())
        .env("TOOLEXEC_DATA_DIR", data)
        .env("TOOLEXEC_NODE", name)
        .env("TOOLEXEC_LIMITS__LEASE_TTL_MS", "2000")
        .env("TOOLEXEC_LOG_FORMAT", "json");
    serve(cmd)
}

/// Two replicas on one Postgres: the session reads on A; A is killed (SIGKILL); B takes the
/// session over with its first call, and what was read on A counts on B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_survive_a_take_over_by_another_replica() {
    let db = TestPgDatabase::create().await;
    let (data_a, data_b) = (data_dir(), data_dir());
    let mut a = replica("node-a", &db, data_a.path());
    let b = replica("node-b", &db, data_b.path());
    let on_a = Api::at(&a.base);
    let sid = on_a.session(&files()).await;
    let marks = read_then_change(&on_a, &sid).await;
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let on_b = Api::at(&b.base);
    assert_reads_kept(&on_b, &sid, &marks).await;
    let events = on_b
        .get(&format!("/v1/sessions/{sid}/events?limit=1000"))
        .await;
    let taken = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "session.taken_over")
        .cloned()
        .expect("a session.taken_over event");
    assert_eq!(taken["data"]["from_node"], "node-a", "{taken}");
}

/// A data directory the sandbox user can traverse.
fn data_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

async fn reads_survive_a_restart_of_the_node(backend: Backend) {
    let app = backend.spawn().await;
    let api = Api::of(&app);
    let sid = api.session(&files()).await;
    let marks = read_then_change(&api, &sid).await;
    let app = app.restart().await;
    assert_reads_kept(&Api::of(&app), &sid, &marks).await;
}

async fn reads_survive_an_eviction_and_the_reload(backend: Backend) {
    // One cached runtime: using another session drops this one's.
    let app = backend
        .spawn_with(|c| c.limits.max_cached_sessions = 1)
        .await;
    let api = Api::of(&app);
    let sid = api.session(&files()).await;
    let marks = read_then_change(&api, &sid).await;
    let evicted = app.metric("toolexec_session_runtimes_evicted_total").await;
    let other = api.session(&json!({})).await;
    api.ok(
        &other,
        "w",
        "write_file",
        json!({"file_path": "o.txt", "content": "o\n"}),
    )
    .await;
    assert!(
        app.metric("toolexec_session_runtimes_evicted_total").await > evicted,
        "the session's runtime was dropped"
    );
    assert_reads_kept(&api, &sid, &marks).await;
}

async fn a_fork_at_a_seq_has_the_reads_recorded_up_to_it(backend: Backend) {
    let app = backend.spawn().await;
    let api = Api::of(&app);
    let sid = api.session(&files()).await;
    let marks = read_then_change(&api, &sid).await;

    // At the end of the reads: src/lib.py is as it was read (the shell changed it later).
    let fork = api.fork(&sid, marks.after_reads).await;
    assert_allowed(&api.edit(&fork, "e1", "src/lib.py", "x = 1", "x = 3").await);
    assert_allowed(&api.edit(&fork, "e2", "src/app.py", "hello", "bye").await);
    // The fork's own rewind back to its first event is the state it started from, reads
    // included; a change by its shell since is refused as stale.
    api.rewind(&fork, 1).await;
    assert_allowed(&api.edit(&fork, "e3", "cfg.toml", "false", "true").await);
    api.ok(
        &fork,
        "sh",
        "shell",
        json!({"command": "echo more >> notes.txt"}),
    )
    .await;
    assert_stale(&api.edit(&fork, "e4", "notes.txt", "ship", "test").await);

    // At the latest seq: the shell's change is in the fork, after the read.
    let latest = api.last_seq(&sid).await;
    let fork = api.fork(&sid, latest).await;
    assert_allowed(&api.edit(&fork, "e1", "src/app.py", "hello", "bye").await);
    assert_stale(&api.edit(&fork, "e2", "src/lib.py", "x = 1", "x = 3").await);

    // Before the reads: nothing was read there.
    let fork = api.fork(&sid, marks.before_reads).await;
    assert_unread(&api.edit(&fork, "e1", "src/app.py", "hello", "bye").await);
    assert_unread(&api.edit(&fork, "e2", "cfg.toml", "false", "true").await);

    // A fork of a fork inherits what its source had read at its seq.
    let first = api.fork(&sid, marks.after_reads).await;
    let second = api.fork(&first, 1).await;
    assert_allowed(
        &api.edit(&second, "e1", "src/lib.py", "x = 1", "x = 3")
            .await,
    );
}

async fn a_rewind_to_a_seq_keeps_the_reads_up_to_it_and_forgets_the_later_ones(backend: Backend) {
    let app = backend.spawn().await;
    let api = Api::of(&app);
    let sid = api.session(&files()).await;
    let marks = read_then_change(&api, &sid).await;
    assert_stale(&api.edit(&sid, "e1", "src/lib.py", "x = 1", "x = 3").await);

    // Back to the end of the reads: src/lib.py is as it was read again.
    api.rewind(&sid, marks.after_reads).await;
    assert_allowed(&api.edit(&sid, "e2", "src/lib.py", "x = 1", "x = 3").await);
    api.ok(
        &sid,
        "sh2",
        "shell",
        json!({"command": "echo changed >> cfg.toml"}),
    )
    .await;
    assert_stale(&api.edit(&sid, "e3", "cfg.toml", "false", "true").await);

    // Back to before the reads: cfg.toml is as it was read, but that read came later.
    api.rewind(&sid, marks.before_reads).await;
    assert_unread(&api.edit(&sid, "e4", "cfg.toml", "false", "true").await);
    assert_unread(&api.edit(&sid, "e5", "notes.txt", "ship", "test").await);

    // The same after a restart: the rewinds are in the log.
    let app = app.restart().await;
    let api = Api::of(&app);
    assert_unread(&api.edit(&sid, "e6", "cfg.toml", "false", "true").await);
    api.ok(&sid, "r5", "read_file", json!({"file_path": "cfg.toml"}))
        .await;
    assert_allowed(&api.edit(&sid, "e7", "cfg.toml", "false", "true").await);
}

async fn the_record_of_a_read_names_the_path_and_the_hash_it_saw(backend: Backend) {
    let app = backend.spawn().await;
    let api = Api::of(&app);
    let sid = api.session(&files()).await;
    let r = api
        .ok(&sid, "r1", "read_file", json!({"file_path": "src/app.py"}))
        .await;
    let events = app.events(&sid).await;
    let finished = events
        .iter()
        .find(|e| e["seq"] == r["seq"])
        .expect("the read's invocation.finished");
    assert_eq!(finished["kind"], "invocation.finished");
    assert_eq!(
        finished["data"]["reads"],
        json!([{"path": "src/app.py", "sha256": toolexec_core::sha256_hex(b"print('hello')\n")}]),
        "{finished}"
    );
    // A call that read nothing records no reads.
    let r = api.ok(&sid, "g", "glob", json!({"pattern": "*.py"})).await;
    let events = app.events(&sid).await;
    let finished = events.iter().find(|e| e["seq"] == r["seq"]).unwrap();
    assert!(finished["data"].get("reads").is_none(), "{finished}");
}

/// The store's side, on both backends: a session's read records are the `reads` of its
/// finished calls and its rewinds, newest first, up to a seq — nothing else of its log, nothing
/// of another session's.
async fn read_records_are_a_sessions_reads_and_rewinds_newest_first(db: &TestStore) {
    let tenant = db.store.ensure_tenant("acme").await.unwrap();
    let new_session = || Session {
        id: new_id(),
        tenant_id: tenant.id,
        status: SessionStatus::Active,
        tools: None,
        policy: Policy::default(),
        env: Default::default(),
        metadata: json!({}),
        created_at: chrono::Utc::now(),
        closed_at: None,
        last_seq: 0,
        origin: None,
        environment: None,
        truncated: None,
    };
    let created = || {
        vec![NewEvent {
            kind: EventKind::SessionCreated,
            data: json!({}),
        }]
    };
    let s = db
        .store
        .create_session(&new_session(), created(), vec![], u64::MAX)
        .await
        .unwrap();
    let other = db
        .store
        .create_session(&new_session(), created(), vec![], u64::MAX)
        .await
        .unwrap();
    let read = |path: &str, sha: Option<&str>| FileRead {
        path: path.to_owned(),
        sha256: sha.map(str::to_owned),
    };
    let record = |session: Uuid, call_id: &str, reads: Vec<FileRead>| Write::Record {
        invocation: NewInvocation {
            id: new_id(),
            session_id: session,
            call_id: call_id.to_owned(),
            name: "read_file".to_owned(),
            arguments: json!({}),
            arguments_sha256: sha256_hex(b"{}"),
            read_only: true,
            capabilities: vec![Capability::FsRead],
            node: "n".to_owned(),
            started_at: chrono::Utc::now(),
        },
        outcome: Outcome {
            status: CallStatus::Ok,
            content: "ok".to_owned(),
            truncated: None,
            output_chars: 2,
            output_sha256: None,
            finished_at: chrono::Utc::now(),
            duration_ms: 1.0,
            reads,
            structured: None,
        },
        side_effects: vec![],
        blobs: vec![],
    };
    let both = vec![read("a.py", Some("h1")), read("b.py", Some("h2"))];
    let writes = [
        // A read with no side effect is one event.
        record(s.id, "c1", both.clone()),             // 2
        record(s.id, "c2", vec![]),                   // 3
        record(other.id, "o1", both.clone()),         // the other session's
        record(s.id, "c3", vec![read("a.py", None)]), // 4
    ];
    for w in writes {
        let r = db.store.commit(&[w]).await.unwrap();
        assert!(r[0].is_ok(), "{r:?}");
    }
    db.store
        .append_events(
            tenant.id,
            s.id,
            vec![NewEvent {
                kind: EventKind::WorkspaceRewound,
                data: json!({"to_seq": 2, "restored": 0, "removed": 0, "unrestorable": [], "processes_stopped": []}),
            }],
            vec![],
        )
        .await
        .unwrap(); // 5
    let all: Vec<ReadRecord> = db
        .store
        .read_records(s.id, i64::MAX)
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(
        all,
        [
            ReadRecord::Rewound { seq: 5, to_seq: 2 },
            ReadRecord::Reads {
                seq: 4,
                reads: vec![read("a.py", None)]
            },
            ReadRecord::Reads {
                seq: 2,
                reads: both.clone()
            },
        ]
    );
    let up_to_3: Vec<ReadRecord> = db
        .store
        .read_records(s.id, 3)
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(
        up_to_3,
        [ReadRecord::Reads {
            seq: 2,
            reads: both
        }]
    );
    // The record in the log: `reads` on a finished call that read, none on one that did not.
    let events = db.store.events(tenant.id, s.id, 0, 100).await.unwrap();
    assert_eq!(
        events[1].data["reads"],
        json!([{"path": "a.py", "sha256": "h1"}, {"path": "b.py", "sha256": "h2"}])
    );
    assert_eq!(events[2].kind, EventKind::InvocationFinished);
    assert!(events[2].data.get("reads").is_none(), "{:?}", events[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_records_on_postgres() {
    read_records_are_a_sessions_reads_and_rewinds_newest_first(&TestStore::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_records_on_sqlite() {
    read_records_are_a_sessions_reads_and_rewinds_newest_first(&TestStore::sqlite().await).await;
}

/// Bounded cost: a restarted node folds a session's read-state with one walk of the read
/// index (no page of the log), and each backend's plan for that walk is the partial index.
async fn loading_a_session_walks_its_read_records_once_through_their_index(backend: Backend) {
    let app = backend.spawn().await;
    let api = Api::of(&app);
    let sid = api.session(&files()).await;
    read_then_change(&api, &sid).await;
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
    let api = Api::of(&app);
    assert_allowed(&api.edit(&sid, "e1", "src/app.py", "hello", "bye").await);
    assert_eq!(counting.read_lookups.load(Ordering::SeqCst), 1);
    assert_eq!(
        counting.event_pages.load(Ordering::SeqCst),
        0,
        "no page of the log"
    );
    match &app.db {
        Some(db) => {
            let mut conn = sqlx::PgConnection::connect(db.url()).await.unwrap();
            for s in [
                "SET enable_seqscan = off",
                "SET plan_cache_mode = force_generic_plan",
            ] {
                sqlx::query(s).execute(&mut conn).await.unwrap();
            }
            sqlx::query(AssertSqlSafe(format!(
                "PREPARE walk(uuid, bigint) AS {}",
                toolexec_store::reads::POSTGRES
            )))
            .execute(&mut conn)
            .await
            .unwrap();
            let plan: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
                "EXPLAIN EXECUTE walk('{sid}', 9223372036854775807)"
            )))
            .fetch_all(&mut conn)
            .await
            .unwrap();
            let plan = plan.join("\n");
            assert!(plan.contains("events_reads"), "{plan}");
        }
        None => {
            // `INDEXED BY` makes SQLite refuse the query unless the index serves it.
            let mut conn = sqlx::sqlite::SqliteConnectOptions::from_str("sqlite:")
                .unwrap()
                .filename(app.data.path().join("toolexec.db"))
                .connect()
                .await
                .unwrap();
            let rows: Vec<(i64, i64, i64, String)> = sqlx::query_as(AssertSqlSafe(format!(
                "EXPLAIN QUERY PLAN {}",
                toolexec_store::reads::SQLITE
            )))
            .bind(uuid::Uuid::parse_str(&sid).unwrap())
            .bind(i64::MAX)
            .fetch_all(&mut conn)
            .await
            .unwrap();
            assert!(
                rows.iter().any(|r| r.3.contains("events_reads")),
                "{rows:?}"
            );
        }
    }
}
