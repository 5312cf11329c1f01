//! Failed authentication is limited per client address: keys the service has never seen cost a
//! store lookup each, and past a small budget a source gets 429 `too_many_auth_failures` with
//! `Retry-After` and no lookup — while keys verified before keep working, and, behind a gateway
//! named in `trusted_proxies`, other clients are counted apart. Also: bytes of a workspace are
//! served with `X-Content-Type-Options: nosniff`.
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};
use toolexec_server::Config;
use toolexec_tests::app::{TestApp, spawn_app_with, spawn_sqlite_app};
use toolexec_tests::counting::CountingStore;

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

/// A service in API-key mode with a failure budget of 5 (refilled at one every 10 s, so that
/// none comes back while a test runs), its store's key lookups counted, and three keys:
/// `alice`'s, `bob`'s and `carol`'s.
async fn keyed_service(
    adjust: impl FnOnce(&mut Config),
) -> (TestApp, Arc<CountingStore>, [String; 3]) {
    let mut app = spawn_app_with(|c| {
        c.auth_failure_rate_per_second = 0.1;
        c.auth_failure_burst = 5.0;
        adjust(c);
    })
    .await;
    let keys = [
        key_for(&app, "alice").await,
        key_for(&app, "bob").await,
        key_for(&app, "carol").await,
    ];
    app.stop().await;
    let slot = Arc::new(std::sync::Mutex::new(None));
    let put = slot.clone();
    let app = TestApp::start_wrapped(app.config.clone(), app.data.clone(), app.db.clone(), |s| {
        let counting = CountingStore::new(s);
        *put.lock().unwrap() = Some(counting.clone());
        counting
    })
    .await;
    let counting = slot.lock().unwrap().take().unwrap();
    (app, counting, keys)
}

/// `GET /v1/sessions` with `key` (and `x-forwarded-for`, when given): (status, Retry-After, body).
async fn list(app: &TestApp, key: &str, forwarded: Option<&str>) -> (u16, Option<u64>, Value) {
    let mut req = app.http.get(app.url("/v1/sessions")).bearer_auth(key);
    if let Some(f) = forwarded {
        req = req.header("x-forwarded-for", f);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (status, retry, resp.json().await.unwrap_or(Value::Null))
}

fn bad_key(i: usize) -> String {
    format!("tx_guess_{i:08}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_keys_are_limited_per_source_without_a_store_lookup_and_known_keys_still_work() {
    let (app, store, [alice, bob, carol]) = keyed_service(|_| {}).await;
    let lookups = || store.key_lookups.load(Ordering::SeqCst);
    // alice's key works (and is now one this node has verified).
    assert_eq!(list(&app, &alice, None).await.0, 200);
    // Valid keys spend nothing of the budget: forty requests at once with a key never seen
    // (a burst after a restart, behind one gateway) all pass.
    let burst: Vec<_> = (0..40)
        .map(|_| {
            let (http, url, key) = (app.http.clone(), app.url("/v1/sessions"), carol.clone());
            tokio::spawn(async move {
                http.get(url)
                    .bearer_auth(key)
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    for task in burst {
        assert_eq!(task.await.unwrap(), 200);
    }

    // The budget of guesses: each one a lookup, answered 401.
    let before = lookups();
    for i in 0..5 {
        let (status, _, body) = list(&app, &bad_key(i), None).await;
        assert_eq!(status, 401, "{body}");
    }
    assert_eq!(lookups() - before, 5);
    // Then a flood of guesses: 429 with Retry-After, and not one more lookup.
    let flood: Vec<_> = (5..205)
        .map(|i| {
            let (http, url) = (app.http.clone(), app.url("/v1/sessions"));
            tokio::spawn(async move {
                let resp = http.get(url).bearer_auth(bad_key(i)).send().await.unwrap();
                let retry = resp.headers().get("retry-after").cloned();
                (
                    resp.status().as_u16(),
                    retry,
                    resp.json::<Value>().await.unwrap(),
                )
            })
        })
        .collect();
    for task in flood {
        let (status, retry, body) = task.await.unwrap();
        assert_eq!(status, 429, "{body}");
        assert_eq!(body["code"], "too_many_auth_failures", "{body}");
        let retry: u64 = retry.unwrap().to_str().unwrap().parse().unwrap();
        assert!((1..=10).contains(&retry), "Retry-After {retry}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("auth_failure_rate_per_second"),
            "{body}"
        );
    }
    assert_eq!(
        lookups() - before,
        5,
        "refused guesses cost no store lookup"
    );

    // A key verified before still works meanwhile, its cache entry fresh or not.
    assert_eq!(list(&app, &alice, None).await.0, 200);
    // A key never seen from this address waits like a guess (the documented trade-off).
    let (status, retry, body) = list(&app, &bob, None).await;
    assert_eq!(status, 429, "{body}");
    assert!(retry.is_some_and(|s| (1..=10).contains(&s)), "{retry:?}");
    // X-Forwarded-For from a client that is not a trusted proxy changes nothing.
    let (status, _, body) = list(&app, &bad_key(999), Some("198.51.100.50")).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(lookups() - before, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_gateway_each_client_has_its_own_budget() {
    // The gateway (here: this test, on 127.0.0.1) names the client in X-Forwarded-For.
    let (app, _store, [alice, bob, _]) =
        keyed_service(|c| c.trusted_proxies = vec!["127.0.0.1/32".into()]).await;
    let attacker = "203.0.113.7";
    for i in 0..5 {
        assert_eq!(list(&app, &bad_key(i), Some(attacker)).await.0, 401);
    }
    let (status, _, body) = list(&app, &bad_key(5), Some(attacker)).await;
    assert_eq!(status, 429, "{body}");
    // The attacker cannot pass as someone else: the gateway appends the address it saw.
    let spoofed = format!("198.51.100.9, {attacker}");
    assert_eq!(list(&app, &bad_key(6), Some(&spoofed)).await.0, 429);
    // Other clients of the same gateway, with keys never seen before, are not locked out.
    let (status, _, body) = list(&app, &bob, Some("198.51.100.9")).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = list(&app, &alice, Some("2001:db8:1::5")).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn workspace_bytes_are_served_with_nosniff() {
    let app = spawn_sqlite_app().await;
    let sid = app
        .session(json!({"files": {
            "page.html": "<script>alert(document.cookie)</script>",
            "blob.bin": "\u{0}\u{1}<html>"
        }}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .call(
            &sid,
            "c1",
            "shell",
            json!({"command": "echo '<html><script>x()</script>' ; cat page.html"}),
        )
        .await;
    let invocation = r["invocation_id"].as_str().unwrap().to_owned();
    for path in [
        format!("/v1/sessions/{sid}/files/page.html"),
        format!("/v1/sessions/{sid}/files/blob.bin"),
        format!("/v1/sessions/{sid}/files/page.html?at=1"),
        format!("/v1/sessions/{sid}/archive"),
        format!("/v1/invocations/{invocation}/output"),
        format!("/v1/sessions/{sid}/files/no-such-file"),
        "/v1/sessions".to_owned(),
    ] {
        let resp = app.get(&path).await;
        assert_eq!(
            resp.headers()
                .get("x-content-type-options")
                .map(|v| v.to_str().unwrap()),
            Some("nosniff"),
            "{path}: {}",
            resp.status()
        );
    }
    let resp = app
        .get(&format!("/v1/sessions/{sid}/files/page.html"))
        .await;
    assert_eq!(resp.headers()["content-type"], "text/plain; charset=utf-8");
}
