//! Descriptors and kernel objects one node spends on its sessions: a node with more open
//! sessions than its open-file limit allows keeps serving all of them, dropping idle sessions'
//! handles instead of failing with "too many open files" (their read-state comes back from the
//! log).
use serde_json::{Value, json};
use toolexec_tests::app::{TestApp, spawn_app_with, spawn_sqlite_app_with};

/// The open-file limit the tests run the service under (soft and hard: the service cannot raise
/// it), far below what 200 sessions would hold without a budget.
const LIMIT: u64 = 256;

fn limit_open_files() {
    use rustix::process::{Resource, Rlimit, setrlimit};
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(LIMIT),
            maximum: Some(LIMIT),
        },
    )
    .expect("lowering RLIMIT_NOFILE (nextest runs each test in a process of its own)");
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

async fn many_sessions_share_a_small_descriptor_budget(app: TestApp) {
    let mut first: Option<String> = None;
    let mut peak = 0;
    for i in 0..200 {
        let s = app.session(json!({})).await;
        let sid = s["id"].as_str().unwrap().to_owned();
        let r = app
            .call(
                &sid,
                "w",
                "write_file",
                json!({"file_path": "a.txt", "content": "one\n"}),
            )
            .await;
        assert_eq!(r["status"], "ok", "session {i}: {r}");
        if i % 10 == 0 {
            // A command: the session's change scans get an inotify instance too. (It also runs
            // under the service's low hard limit: the init never asks for more than that.)
            let r = app
                .call(&sid, "sh", "shell", json!({"command": "echo two >> a.txt"}))
                .await;
            assert_eq!(r["status"], "ok", "session {i}: {r}");
        }
        first.get_or_insert(sid);
        peak = peak.max(open_fds());
    }
    assert!(
        peak < LIMIT as usize - 32,
        "the process held {peak} descriptors of {LIMIT}"
    );
    let evicted = app.metric("toolexec_session_runtimes_evicted_total").await;
    assert!(evicted > 0.0, "no idle session was dropped");

    // The first session, long dropped from the cache, still works; what it wrote (which counts
    // as read) comes back from its log, and its shell changed the file since: a write asks
    // for a fresh read (and says so).
    let sid = first.unwrap();
    let r = app
        .call(
            &sid,
            "e1",
            "edit_file",
            json!({"file_path": "a.txt", "old_string": "one", "new_string": "uno"}),
        )
        .await;
    assert_eq!(r["status"], "denied", "{r}");
    assert!(
        r["content"]
            .as_str()
            .unwrap()
            .contains("has changed since you read it"),
        "{r}"
    );
    let r = app
        .call(&sid, "r1", "read_file", json!({"file_path": "a.txt"}))
        .await;
    assert!(r["content"].as_str().unwrap().contains("two"), "{r}");
    let r = app
        .call(
            &sid,
            "e2",
            "edit_file",
            json!({"file_path": "a.txt", "old_string": "one", "new_string": "uno"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let r: Value = app
        .call(&sid, "sh2", "shell", json!({"command": "cat a.txt"}))
        .await;
    assert!(r["content"].as_str().unwrap().contains("uno\ntwo"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_sessions_than_descriptors_allow_all_keep_working_on_postgres() {
    limit_open_files();
    let app = spawn_app_with(|_| {}).await;
    many_sessions_share_a_small_descriptor_budget(app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_sessions_than_descriptors_allow_all_keep_working_on_sqlite() {
    limit_open_files();
    let app = spawn_sqlite_app_with(|_| {}).await;
    many_sessions_share_a_small_descriptor_budget(app).await;
}
