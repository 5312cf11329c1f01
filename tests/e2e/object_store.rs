//! Blobs in S3-compatible object storage, against a real one: moto in server mode on a loopback
//! port, started and killed by each test. Large blobs become objects of the bucket (seen through
//! the S3 API), read back through the API, a fork rebuilt from them; with the object store down
//! a call is refused and nothing runs or is appended, and it works again once the store is back;
//! retention deletes expired sessions and the objects only they named, keeps shared ones and
//! origins of live forks, and a dry run changes nothing — once in-process on both stores, once
//! through the compiled binary configured by `TOOLEXEC_*` variables alone.
use std::time::Duration;

use serde_json::{Value, json};
use toolexec_core::sha256_hex;
use toolexec_store::prelude::*;
use toolexec_tests::app::Backend;
use toolexec_tests::binary::{serve, toolexec};
use toolexec_tests::db::TestPgDatabase;
use toolexec_tests::moto::{self, Moto};
use toolexec_tests::on_both_stores;

/// Blobs above this many bytes go to the bucket in these tests.
const INLINE_MAX: usize = 1024;

/// A test's bound: moto's start, a few dozen calls and a retention run fit well within it.
const TEST_TIMEOUT: Duration = Duration::from_secs(240);

/// The service's HTTP API, whichever way the service runs.
struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    fn new(base: &str) -> Api {
        toolexec_tools::web::install_tls_provider();
        Api {
            http: reqwest::Client::new(),
            base: base.to_owned(),
        }
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn bytes(&self, path: &str) -> (u16, Vec<u8>) {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.bytes().await.unwrap().to_vec())
    }

    async fn session(&self) -> String {
        let (status, s) = self.post("/v1/sessions", json!({})).await;
        assert_eq!(status, 201, "{s}");
        s["id"].as_str().unwrap().to_owned()
    }

    async fn close(&self, sid: &str) {
        let resp = self
            .http
            .delete(format!("{}/v1/sessions/{sid}", self.base))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "close: {}", resp.status());
    }

    async fn fork(&self, sid: &str, at_seq: i64) -> String {
        let (status, f) = self
            .post(
                &format!("/v1/sessions/{sid}/fork"),
                json!({"at_seq": at_seq}),
            )
            .await;
        assert_eq!(status, 201, "{f}");
        f["id"].as_str().unwrap().to_owned()
    }

    /// One call; the HTTP status and the body.
    async fn try_call(&self, sid: &str, id: &str, name: &str, args: Value) -> (u16, Value) {
        self.post(
            &format!("/v1/sessions/{sid}/calls"),
            json!({"calls": [{"id": id, "name": name, "arguments": args}]}),
        )
        .await
    }

    /// One call that must be answered; its result.
    async fn call(&self, sid: &str, id: &str, name: &str, args: Value) -> Value {
        let (status, body) = self.try_call(sid, id, name, args).await;
        assert_eq!(status, 200, "{body}");
        let r = body["results"][0].clone();
        assert_eq!(r["status"], "ok", "{r}");
        r
    }

    /// Writes a file; the seq of the call's last event.
    async fn write(&self, sid: &str, id: &str, path: &str, content: &str) -> i64 {
        let r = self
            .call(
                sid,
                id,
                "write_file",
                json!({"file_path": path, "content": content}),
            )
            .await;
        r["seq"].as_i64().unwrap()
    }

    async fn last_seq(&self, sid: &str) -> i64 {
        let (status, s) = self.get(&format!("/v1/sessions/{sid}")).await;
        assert_eq!(status, 200, "{s}");
        s["last_seq"].as_i64().unwrap()
    }

    /// A file of the workspace as the log has it at `at`.
    async fn file_at(&self, sid: &str, path: &str, at: i64) -> (u16, Vec<u8>) {
        self.bytes(&format!("/v1/sessions/{sid}/files/{path}?at={at}"))
            .await
    }
}

/// Text of about 4 KiB, distinct per tag: above [`INLINE_MAX`], so an object of the bucket.
fn large(tag: &str) -> String {
    (0..150).map(|i| format!("{tag} line {i:04}\n")).collect()
}

/// The object key of a blob under `prefix`.
fn key(prefix: &str, content: &str) -> String {
    format!("{prefix}{}", sha256_hex(content.as_bytes()))
}

async fn large_blobs_are_objects_of_the_bucket_and_read_back_through_the_api(backend: Backend) {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let moto = Moto::start().await;
        let prefix = "blobs/";
        let app = backend
            .spawn_with(|c| c.blobs = moto.config(prefix, INLINE_MAX))
            .await;
        let api = Api::new(&app.base);
        let sid = api.session().await;
        let big = large("big");
        let small = "small\n";
        let at = api.write(&sid, "w1", "big.txt", &big).await;
        api.write(&sid, "w2", "small.txt", small).await;

        // In the bucket (ListObjectsV2): the large one, not the small one.
        let keys = moto.keys().await;
        assert!(keys.contains(&key(prefix, &big)), "{keys:?}");
        assert!(!keys.contains(&key(prefix, small)), "{keys:?}");
        // And the database says where each is.
        let store = app.state.engine.store();
        let recorded = store
            .blob_objects(&[sha256_hex(big.as_bytes()), sha256_hex(small.as_bytes())])
            .await
            .unwrap();
        assert_eq!(recorded, vec![sha256_hex(big.as_bytes())]);

        // Read back through the API: the file at its seq, rebuilt from the log.
        let (status, bytes) = api.file_at(&sid, "big.txt", at).await;
        assert_eq!(status, 200);
        assert_eq!(bytes, big.as_bytes());

        // A command's output too large for its result: the full output is a blob in the bucket.
        let r = api
            .call(
                &sid,
                "s1",
                "shell",
                json!({"command": "seq 1 40000", "timeout_ms": 20000}),
            )
            .await;
        assert!(!r["truncated"].is_null(), "{r}");
        let expected: String = (1..=40000).map(|i| format!("{i}\n")).collect();
        let inv = r["invocation_id"].as_str().unwrap();
        let (status, out) = api
            .get(&format!(
                "/v1/invocations/{inv}/output?offset=0&limit=1000000"
            ))
            .await;
        assert_eq!(status, 200, "{out}");
        assert!(
            out["content"].as_str().unwrap().contains(&expected),
            "{out}"
        );
        assert!(moto.keys().await.len() > keys.len());

        // A verify replay re-runs the calls and compares their full outputs, read back from
        // the bucket (the recorded one and the replayed one).
        let (status, replay) = api
            .post(
                &format!("/v1/sessions/{sid}/replay"),
                json!({"mode": "verify"}),
            )
            .await;
        assert_eq!(status, 200, "{replay}");
        assert_eq!(replay["status"], "finished", "{replay}");
        assert_eq!(replay["calls_total"], 3, "{replay}");
        assert_eq!(replay["calls_diverged"], 0, "{replay}");

        // A fork rebuilt from those objects has the bytes.
        let fork = api.fork(&sid, at).await;
        let r = api
            .call(
                &fork,
                "f1",
                "shell",
                json!({"command": "sha256sum big.txt"}),
            )
            .await;
        assert!(
            r["content"]
                .as_str()
                .unwrap()
                .contains(&sha256_hex(big.as_bytes())),
            "{r}"
        );
    })
    .await
    .expect("the test took too long");
}

async fn a_call_is_refused_while_the_object_store_is_down_and_runs_once_it_is_back(
    backend: Backend,
) {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let mut moto = Moto::start().await;
        let app = backend
            .spawn_with(|c| c.blobs = moto.config("", INLINE_MAX))
            .await;
        let api = Api::new(&app.base);
        let sid = api.session().await;
        api.write(&sid, "w1", "before.txt", &large("before")).await;

        moto.down().await;
        // Past the second in which a recent answer of the store vouches for it.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let seq = api.last_seq(&sid).await;
        let (status, body) = api
            .try_call(
                &sid,
                "s1",
                "shell",
                json!({"command": "echo ran > ran.txt"}),
            )
            .await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["code"], "unavailable", "{body}");
        let (status, body) = api
            .try_call(
                &sid,
                "w2",
                "write_file",
                json!({"file_path": "during.txt", "content": large("during")}),
            )
            .await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(api.last_seq(&sid).await, seq, "nothing is appended");

        moto.up().await;
        // Nothing ran while it was down.
        let r = api
            .call(
                &sid,
                "c1",
                "shell",
                json!({"command": "ls; test -e ran.txt && echo RAN || echo NOT-RUN"}),
            )
            .await;
        let content = r["content"].as_str().unwrap();
        assert!(content.contains("NOT-RUN"), "{r}");
        assert!(!content.contains("during.txt"), "{r}");
        // And the refused calls run now (their ids were never recorded).
        api.call(
            &sid,
            "s1",
            "shell",
            json!({"command": "echo ran > ran.txt"}),
        )
        .await;
        let during = large("during");
        let at = api.write(&sid, "w2", "during.txt", &during).await;
        assert!(moto.keys().await.contains(&key("", &during)));
        let (status, bytes) = api.file_at(&sid, "during.txt", at).await;
        assert_eq!(status, 200);
        assert_eq!(bytes, during.as_bytes());
    })
    .await
    .expect("the test took too long");
}

/// Blobs small enough to stay rows of the database: B's own, and one C writes too.
const SMALL_ONLY_B: &str = "only b, small\n";
const SMALL_SHARED: &str = "shared, small\n";

/// The retention scenario, with `retain(dry_run)` running retention and returning its report:
/// A (closed) has a live fork F; B (closed) shares one file with C (active). Retention expires
/// B only (A is F's origin): B's own object goes, the shared one stays; a dry run first
/// changes nothing. Once F is closed, A and F expire together.
async fn retention_scenario(
    api: &Api,
    moto: &Moto,
    prefix: &str,
    retain: impl AsyncFn(bool) -> Value,
) {
    let shared = large("shared");
    let only_a = large("only-a");
    let only_b = large("only-b");
    let a = api.session().await;
    let a_at = api.write(&a, "a1", "a.txt", &only_a).await;
    let f = api.fork(&a, a_at).await;
    api.close(&a).await;
    let b = api.session().await;
    api.write(&b, "b1", "b.txt", &only_b).await;
    api.write(&b, "b2", "shared.txt", &shared).await;
    api.write(&b, "b3", "small.txt", SMALL_ONLY_B).await;
    api.write(&b, "b4", "small-shared.txt", SMALL_SHARED).await;
    api.close(&b).await;
    let c = api.session().await;
    let c_at = api.write(&c, "c1", "shared.txt", &shared).await;
    api.write(&c, "c2", "small-shared.txt", SMALL_SHARED).await;
    let all = moto.keys().await;
    for content in [&shared, &only_a, &only_b] {
        assert!(all.contains(&key(prefix, content)), "{all:?}");
    }

    let dry = retain(true).await;
    assert_eq!(dry["dry_run"], true, "{dry}");
    assert_eq!(dry["sessions"], json!([b]), "{dry}");
    assert_eq!(dry["kept_as_origin"], json!([a]), "{dry}");
    assert_eq!(moto.keys().await, all, "a dry run deletes nothing");
    assert_eq!(api.get(&format!("/v1/sessions/{b}")).await.0, 200);

    let done = retain(false).await;
    assert_eq!(done["sessions"], json!([b]), "{done}");
    assert!(done["events"].as_u64().unwrap() > 0, "{done}");
    assert_eq!(api.get(&format!("/v1/sessions/{b}")).await.0, 404);
    let keys = moto.keys().await;
    assert!(!keys.contains(&key(prefix, &only_b)), "{keys:?}");
    assert!(keys.contains(&key(prefix, &shared)), "shared: {keys:?}");
    assert!(keys.contains(&key(prefix, &only_a)), "origin: {keys:?}");
    // What stays still reads: C's shared file, the fork's workspace from its origin's log.
    let (status, bytes) = api.file_at(&c, "shared.txt", c_at).await;
    assert_eq!(status, 200);
    assert_eq!(bytes, shared.as_bytes());
    let f_seq = api.last_seq(&f).await;
    let (status, bytes) = api.file_at(&f, "a.txt", f_seq).await;
    assert_eq!(status, 200);
    assert_eq!(bytes, only_a.as_bytes());

    // Nothing more to expire: a second run deletes nothing.
    let again = retain(false).await;
    assert_eq!(again["sessions"], json!([]), "{again}");

    api.close(&f).await;
    let chain = retain(false).await;
    let mut expected = vec![a.clone(), f.clone()];
    expected.sort();
    assert_eq!(chain["sessions"], json!(expected), "{chain}");
    let keys = moto.keys().await;
    assert!(!keys.contains(&key(prefix, &only_a)), "{keys:?}");
    assert!(keys.contains(&key(prefix, &shared)), "{keys:?}");
    assert_eq!(api.get(&format!("/v1/sessions/{a}")).await.0, 404);
}

async fn retention_expires_closed_sessions_and_the_objects_only_they_name(backend: Backend) {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let moto = Moto::start().await;
        let prefix = "ret/";
        let app = backend
            .spawn_with(|c| c.blobs = moto.config(prefix, INLINE_MAX))
            .await;
        let api = Api::new(&app.base);
        let store = app.state.engine.store().clone();
        retention_scenario(&api, &moto, prefix, async |dry_run| {
            let report =
                toolexec_store::retention::run(store.as_ref(), chrono::Utc::now(), dry_run)
                    .await
                    .unwrap();
            serde_json::to_value(report).unwrap()
        })
        .await;
        // The blobs kept in the database go the same way: B's own, not the shared one.
        let only_b = store
            .blob(&sha256_hex(SMALL_ONLY_B.as_bytes()))
            .await
            .unwrap();
        assert_eq!(only_b, None);
        let shared = store
            .blob(&sha256_hex(SMALL_SHARED.as_bytes()))
            .await
            .unwrap();
        assert_eq!(shared.as_deref(), Some(SMALL_SHARED.as_bytes()));
    })
    .await
    .expect("the test took too long");
}

/// A live session that writes, while retention runs, the same bytes as a session it expires
/// (after retention read the logs, before it deletes): those blobs are kept, and the live
/// session's file reads back.
async fn blobs_written_again_while_retention_runs_are_kept(backend: Backend) {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let moto = Moto::start().await;
        let app = backend
            .spawn_with(|c| c.blobs = moto.config("", INLINE_MAX))
            .await;
        let api = Api::new(&app.base);
        let big = large("written again");
        let b = api.session().await;
        api.write(&b, "b1", "big.txt", &big).await;
        api.write(&b, "b2", "small.txt", SMALL_ONLY_B).await;
        api.close(&b).await;
        let c = api.session().await;

        let store = toolexec_tests::counting::CountingStore::new(app.state.engine.store().clone());
        let (base, sid, content) = (app.base.clone(), c.clone(), big.clone());
        let (written_tx, written_rx) = tokio::sync::oneshot::channel::<i64>();
        *store.before_delete_sessions.lock().await = Some(Box::pin(async move {
            let api = Api::new(&base);
            api.write(&sid, "c1", "small.txt", SMALL_ONLY_B).await;
            let at = api.write(&sid, "c2", "big.txt", &content).await;
            let _ = written_tx.send(at);
        }));
        let report = toolexec_store::retention::run(store.as_ref(), chrono::Utc::now(), false)
            .await
            .unwrap();
        assert_eq!(report.sessions.len(), 1, "{report:?}");
        let at = written_rx.await.expect("the write ran while retention ran");

        assert!(moto.keys().await.contains(&key("", &big)));
        let (status, bytes) = api.file_at(&c, "big.txt", at).await;
        assert_eq!(status, 200);
        assert_eq!(bytes, big.as_bytes());
        let small = store
            .blob(&sha256_hex(SMALL_ONLY_B.as_bytes()))
            .await
            .unwrap();
        assert_eq!(small.as_deref(), Some(SMALL_ONLY_B.as_bytes()));
    })
    .await
    .expect("the test took too long");
}

on_both_stores!(
    blobs_written_again_while_retention_runs_are_kept,
    large_blobs_are_objects_of_the_bucket_and_read_back_through_the_api,
    a_call_is_refused_while_the_object_store_is_down_and_runs_once_it_is_back,
    retention_expires_closed_sessions_and_the_objects_only_they_name,
);

/// The compiled binary, configured by `TOOLEXEC_*` variables alone (and the standard AWS ones
/// for the credentials): `serve` keeps large blobs in the bucket, `retention` expires them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_binary_keeps_blobs_in_s3_and_expires_them_configured_by_the_environment_alone() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let db = TestPgDatabase::create().await;
        let moto = Moto::start().await;
        let data = toolexec_tests::app::data_dir();
        let prefix = "env/";
        let env = |cmd: &mut std::process::Command| {
            cmd.env("TOOLEXEC_BIND", "127.0.0.1:0")
                .env("TOOLEXEC_DATA_DIR", data.path())
                .env("TOOLEXEC_DATABASE_URL", db.url())
                .env("TOOLEXEC_LOG_FORMAT", "json")
                .env("TOOLEXEC_NODE", "env-node")
                .env("TOOLEXEC_BLOBS__BACKEND", "s3")
                .env("TOOLEXEC_BLOBS__S3_ENDPOINT", moto.endpoint())
                .env("TOOLEXEC_BLOBS__S3_BUCKET", moto::BUCKET)
                .env("TOOLEXEC_BLOBS__S3_PREFIX", prefix)
                .env("TOOLEXEC_BLOBS__S3_ALLOW_HTTP", "true")
                .env("TOOLEXEC_BLOBS__INLINE_MAX_BYTES", INLINE_MAX.to_string())
                .env("AWS_ACCESS_KEY_ID", moto::ACCESS_KEY)
                .env("AWS_SECRET_ACCESS_KEY", moto::SECRET_KEY)
                .env("AWS_REGION", "us-east-1");
        };
        let mut cmd = toolexec(data.path());
        env(&mut cmd);
        cmd.arg("serve");
        let served = serve(cmd);
        let api = Api::new(&served.base);
        let bin = data.path().to_owned();
        retention_scenario(&api, &moto, prefix, async |dry_run| {
            let mut cmd = toolexec(&bin);
            env(&mut cmd);
            cmd.args(["retention", "--closed-before", "0s"]);
            if dry_run {
                cmd.arg("--dry-run");
            }
            let out = tokio::task::spawn_blocking(move || cmd.output())
                .await
                .unwrap()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{stderr}");
            assert!(!stderr.contains(moto::SECRET_KEY), "{stderr}");
            serde_json::from_slice(&out.stdout).unwrap()
        })
        .await;
        for line in &served.log {
            assert!(!line.to_string().contains(moto::SECRET_KEY), "{line}");
        }
    })
    .await
    .expect("the test took too long");
}

/// A bucket that does not exist (or credentials that may not write) stops the service at
/// start with a message that says so, instead of a service that refuses every call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bucket_the_service_cannot_write_stops_it_at_start() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let moto = Moto::start().await;
        let data = toolexec_tests::app::data_dir();
        let mut cmd = toolexec(data.path());
        cmd.env("TOOLEXEC_BIND", "127.0.0.1:0")
            .env("TOOLEXEC_DATA_DIR", data.path())
            .env("TOOLEXEC_LOG_FORMAT", "json")
            .env("TOOLEXEC_BLOBS__BACKEND", "s3")
            .env("TOOLEXEC_BLOBS__S3_ENDPOINT", moto.endpoint())
            .env("TOOLEXEC_BLOBS__S3_BUCKET", "no-such-bucket")
            .env("TOOLEXEC_BLOBS__S3_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", moto::ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", moto::SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .arg("serve");
        let started = tokio::task::spawn_blocking(move || toolexec_tests::binary::start(cmd))
            .await
            .unwrap();
        match started {
            toolexec_tests::binary::Started::Exited(log) => {
                assert!(log.contains("blobs: cannot write"), "{log}");
                assert!(log.contains("no-such-bucket"), "{log}");
                assert!(!log.contains(moto::SECRET_KEY), "{log}");
            }
            toolexec_tests::binary::Started::Serving(s) => {
                panic!("it serves at {} with a bucket that does not exist", s.base)
            }
        }
    })
    .await
    .expect("the test took too long");
}
