//! Quotas that hold while a command runs: a session's disk (its workspace a filesystem of its
//! own), a tenant's disk (what its open sessions reserve) and a tenant's running commands.
#![allow(
    clippy::disallowed_methods,
    reason = "the tests look at the service's workspaces from the host"
)]
use std::os::unix::fs::MetadataExt;

use serde_json::{Value, json};
use toolexec_tests::app::{TestApp, spawn_app_with};

const QUOTA: u64 = 16 << 20;

fn content(r: &Value) -> &str {
    r["content"].as_str().unwrap_or_default()
}

fn mounts_beneath(root: &std::path::Path) -> Vec<String> {
    let root = root.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&root))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_writes_past_its_disk_quota_is_stopped_and_no_one_else_is() {
    let app = spawn_app_with(|c| {
        c.limits.session_disk_bytes = QUOTA;
        c.limits.tenant_disk_bytes = 3 * QUOTA;
    })
    .await;
    let root = app.config.data_dir.join("workspaces");
    let a = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let b = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // A fills its disk while B writes beside it: A's writes fail as they happen, B's do not.
    let (filled, beside) = tokio::join!(
        app.call(
            &a,
            "fill",
            "shell",
            json!({"command": "head -c 40M /dev/zero > big; echo rc=$?; ls -l big"}),
        ),
        app.call(
            &b,
            "beside",
            "shell",
            json!({"command": "head -c 4M /dev/zero > ok && wc -c < ok"}),
        ),
    );
    let text = content(&filled);
    assert!(text.contains("No space left on device"), "{filled}");
    assert!(text.contains("rc=1"), "{filled}");
    assert!(text.contains("disk quota of 16 MiB is used up"), "{filled}");
    assert_eq!(beside["status"], "ok", "{beside}");
    assert!(content(&beside).contains("4194304"), "{beside}");

    // The host gave A no more than its quota.
    let image = std::fs::metadata(root.join(".disks").join(format!("{a}.img"))).unwrap();
    assert!(
        image.blocks() * 512 <= QUOTA,
        "the image takes {} bytes",
        image.blocks() * 512
    );

    // The file tools meet the same wall, and say what to do.
    let w = app
        .call(
            &a,
            "write",
            "write_file",
            json!({"file_path": "more.txt", "content": "x".repeat(1 << 20)}),
        )
        .await;
    assert_eq!(w["status"], "error", "{w}");
    assert!(content(&w).contains("disk quota is used up"), "{w}");
    // Freed, the disk takes writes again.
    let r = app
        .call(
            &a,
            "free",
            "shell",
            json!({"command": "rm big && echo ok > small && cat small"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(!content(&r).contains("disk quota"), "{r}");

    // The tenant's disk (3 quotas) holds three sessions; a fourth is refused and says why.
    let c = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let resp = app.post("/v1/sessions", &json!({})).await;
    assert_eq!(resp.status(), 409);
    let p: Value = resp.json().await.unwrap();
    assert_eq!(p["code"], "too_many_open_sessions", "{p}");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("limits.tenant_disk_bytes"),
        "{p}"
    );

    // A fork gets a disk of its own: its writes count against it, not its source's.
    let f = app
        .post(&format!("/v1/sessions/{b}/fork"), &json!({}))
        .await;
    assert_eq!(f.status(), 409, "the tenant's disk is still full");
    let closed = app.delete(&format!("/v1/sessions/{c}")).await;
    assert_eq!(closed.status(), 200);
    let f: Value = app
        .post(&format!("/v1/sessions/{b}/fork"), &json!({}))
        .await
        .json()
        .await
        .unwrap();
    let fid = f["id"].as_str().unwrap_or_else(|| panic!("{f}")).to_owned();
    let r = app
        .call(
            &fid,
            "fill",
            "shell",
            json!({"command": "cat ok > copy; head -c 40M /dev/zero > big; echo rc=$?"}),
        )
        .await;
    assert!(content(&r).contains("No space left on device"), "{r}");
    let r = app
        .call(
            &b,
            "still",
            "shell",
            json!({"command": "echo fine > f2 && cat f2"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");

    // Closed, every session takes its disk with it: no image, no mount left.
    for s in [&a, &b, &fid] {
        let resp = app.delete(&format!("/v1/sessions/{s}")).await;
        assert_eq!(resp.status(), 200);
    }
    let left: Vec<_> = std::fs::read_dir(root.join(".disks"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(mounts_beneath(&root), Vec::<String>::new());
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_runs_at_most_its_commands_at_once_and_other_tenants_are_unaffected() {
    let app = spawn_app_with(|c| c.limits.max_processes_per_tenant = 2).await;
    let alice = key_for(&app, "alice").await;
    let bob = key_for(&app, "bob").await;
    let app = app.restart().await;
    let post = |key: &str, path: String, body: Value| {
        app.http
            .post(app.url(&path))
            .bearer_auth(key.to_owned())
            .json(&body)
            .send()
    };
    let session = |key: &'static str| {
        let key = key.to_owned();
        let post = &post;
        async move {
            let s: Value = post(&key, "/v1/sessions".into(), json!({}))
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            s["id"].as_str().unwrap().to_owned()
        }
    };
    let call = |key: &str, sid: &str, id: &str, args: Value| {
        let req = post(
            key,
            format!("/v1/sessions/{sid}/calls"),
            json!({"calls": [{"id": id, "name": "shell", "arguments": args}]}),
        );
        async move {
            let body: Value = req.await.unwrap().json().await.unwrap();
            body["results"][0].clone()
        }
    };
    let alice: &'static str = Box::leak(alice.into_boxed_str());
    let bob: &'static str = Box::leak(bob.into_boxed_str());
    let (a1, a2, b1) = (
        session(alice).await,
        session(alice).await,
        session(bob).await,
    );

    // Alice's two sessions hold her two commands: one background, one foreground.
    let bg = call(
        alice,
        &a1,
        "bg",
        json!({"command": "sleep 30", "background": true}),
    )
    .await;
    assert_eq!(bg["status"], "ok", "{bg}");
    let fg = call(alice, &a2, "fg", json!({"command": "sleep 3; echo slept"}));
    let over = async {
        tokio::time::sleep(std::time::Duration::from_millis(800)).await;
        call(alice, &a1, "over", json!({"command": "echo never"})).await
    };
    let other = async {
        tokio::time::sleep(std::time::Duration::from_millis(800)).await;
        call(bob, &b1, "other", json!({"command": "echo bob"})).await
    };
    let (fg, over, other) = tokio::join!(fg, over, other);
    assert_eq!(fg["status"], "ok", "{fg}");
    assert_eq!(over["status"], "error", "{over}");
    assert!(content(&over).contains("Not started"), "{over}");
    assert!(
        content(&over).contains("limits.max_processes_per_tenant"),
        "{over}"
    );
    assert!(!content(&over).contains("never"), "{over}");
    assert_eq!(other["status"], "ok", "bob is not alice: {other}");

    // Back under the cap once a command ends; a background process counts until it is gone.
    let again = call(alice, &a1, "again", json!({"command": "echo yes"})).await;
    assert_eq!(again["status"], "ok", "{again}");
    let p2 = call(
        alice,
        &a2,
        "bg2",
        json!({"command": "sleep 30", "background": true}),
    )
    .await;
    assert_eq!(p2["status"], "ok", "{p2}");
    let full = call(alice, &a2, "full", json!({"command": "true"})).await;
    assert!(content(&full).contains("Not started"), "{full}");
    let killed: Value = post(
        alice,
        format!("/v1/sessions/{a1}/calls"),
        json!({"calls": [{"id": "kill", "name": "process_kill", "arguments": {"process_id": "p1"}}]}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(killed["results"][0]["status"], "ok", "{killed}");
    let mut freed = Value::Null;
    for i in 0..50 {
        freed = call(
            alice,
            &a1,
            &format!("after-kill-{i}"),
            json!({"command": "true"}),
        )
        .await;
        if freed["status"] == "ok" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(freed["status"], "ok", "{freed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_disk_is_mounted_once_however_many_calls_open_it_at_once() {
    let app = spawn_app_with(|c| c.limits.session_disk_bytes = QUOTA).await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let w = app
        .call(
            &sid,
            "w",
            "write_file",
            json!({"file_path": "a.txt", "content": "kept"}),
        )
        .await;
    assert_eq!(w["status"], "ok", "{w}");
    let mounts = |sid: &str| {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(sid))
            .count()
    };
    assert_eq!(mounts(&sid), 1);
    // A restart: the disk is unmounted with the engine, and opened again by the first calls,
    // four at once.
    let app = app.restart().await;
    let ids: Vec<String> = (0..4).map(|i| format!("r{i}")).collect();
    let calls = ids
        .iter()
        .map(|id| app.call(&sid, id, "read_file", json!({"file_path": "a.txt"})));
    for r in futures::future::join_all(calls).await {
        assert_eq!(r["status"], "ok", "{r}");
        assert!(r["content"].as_str().unwrap().contains("kept"), "{r}");
    }
    assert_eq!(
        mounts(&sid),
        1,
        "one mount of the image, not one per racing call"
    );
    assert_eq!(
        app.delete(&format!("/v1/sessions/{sid}")).await.status(),
        200
    );
    assert_eq!(mounts(&sid), 0);
}
