//! Pages and streams bounded in bytes (issue 23, §4), over HTTP on both stores: what a client
//! sees of records larger than a page (truncated, with the path that serves them whole), that
//! the pages together still reach everything, and the node's cap on event streams. The memory
//! the service holds meanwhile is measured on the compiled binary (`memory_bounds`).
use std::time::Duration;

use serde_json::{Value, json};
use toolexec_tests::app::{Backend, TestApp};

toolexec_tests::on_both_stores!(
    a_session_larger_than_a_page_is_listed_truncated_and_served_whole,
    an_event_is_served_whole_by_its_seq,
    the_streams_of_a_node_are_capped_across_tenants,
);

const KIB: usize = 1024;

/// Every page of `GET /v1/sessions` (newest first), each answer's size with it.
async fn session_pages(app: &TestApp) -> Vec<(usize, Value)> {
    let mut pages = Vec::new();
    let mut cursor = String::new();
    loop {
        let path = match cursor.as_str() {
            "" => "/v1/sessions?limit=200".to_owned(),
            c => format!("/v1/sessions?limit=200&cursor={c}"),
        };
        let resp = app.get(&path).await;
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
        let body = resp.bytes().await.unwrap();
        let page: Value = serde_json::from_slice(&body).unwrap();
        let next = page["next_cursor"].as_str().map(str::to_owned);
        pages.push((body.len(), page));
        match next {
            Some(c) => cursor = c,
            None => return pages,
        }
    }
}

/// `limits.page_bytes` at its smallest (128 KiB): six sessions with 48 KiB of metadata take
/// pages of two; one with 400 KiB comes truncated — the beginning of its metadata, valid JSON —
/// with `truncated.full`, which serves it whole.
async fn a_session_larger_than_a_page_is_listed_truncated_and_served_whole(backend: Backend) {
    let app = backend
        .spawn_with(|c| c.limits.page_bytes = 128 * 1024)
        .await;
    let mut ids = Vec::new();
    for i in 0..6 {
        let s = app
            .session(json!({"metadata": {"i": i, "notes": "m".repeat(48 * KIB)}}))
            .await;
        ids.push(s["id"].as_str().unwrap().to_owned());
    }
    let large = app
        .session(json!({"metadata": {"notes": "L".repeat(400 * KIB), "owner": "eve"}}))
        .await;
    let large_id = large["id"].as_str().unwrap().to_owned();
    ids.push(large_id.clone());
    ids.reverse(); // newest first

    let pages = session_pages(&app).await;
    let mut listed = Vec::new();
    for (bytes, page) in &pages {
        assert!(*bytes <= 128 * KIB, "a page of {bytes} bytes");
        for s in page["sessions"].as_array().unwrap() {
            listed.push(s.clone());
        }
    }
    assert!(pages.len() >= 4, "pages end early: {} pages", pages.len());
    assert_eq!(
        listed
            .iter()
            .map(|s| s["id"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ids,
        "every session once, newest first"
    );
    for s in &listed[1..] {
        assert!(s["truncated"].is_null(), "{}", s["id"]);
        assert_eq!(s["metadata"]["notes"].as_str().unwrap().len(), 48 * KIB);
    }
    let cut = &listed[0];
    assert_eq!(cut["id"], large_id.as_str());
    assert_eq!(cut["truncated"]["full"], format!("/v1/sessions/{large_id}"));
    assert!(cut["truncated"]["bytes"].as_u64().unwrap() > 400 * KIB as u64);
    let notes = cut["metadata"]["notes"].as_str().unwrap();
    assert!(notes.starts_with("LLL") && notes.ends_with('…'), "{notes}");
    assert!(notes.len() < 20 * KIB, "{}", notes.len());
    assert_eq!(cut["status"], "active");
    assert!(cut["policy"].is_object());
    let whole: Value = app
        .get(cut["truncated"]["full"].as_str().unwrap())
        .await
        .json()
        .await
        .unwrap();
    assert!(whole["truncated"].is_null());
    assert_eq!(
        whole["metadata"]["notes"].as_str().unwrap().len(),
        400 * KIB
    );
    assert_eq!(whole["metadata"]["owner"], "eve");
}

/// `GET /v1/sessions/{id}/events/{seq}` serves an event as a page does, whole; a page of
/// 128 KiB shows a write of 200 KiB truncated, its pointer that path. A seq the session does not have,
/// or that is not a number, is a 404 saying so; another session's id too.
async fn an_event_is_served_whole_by_its_seq(backend: Backend) {
    let app = backend
        .spawn_with(|c| c.limits.page_bytes = 128 * 1024)
        .await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let content = "w".repeat(200 * KIB);
    let r = app
        .call(
            &sid,
            "w1",
            "write_file",
            json!({"file_path": "big.txt", "content": content}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let page: Value = app
        .get(&format!("/v1/sessions/{sid}/events?limit=1000"))
        .await
        .json()
        .await
        .unwrap();
    let events = page["events"].as_array().unwrap();
    let started = events
        .iter()
        .find(|e| e["kind"] == "invocation.started")
        .unwrap();
    let seq = started["seq"].as_i64().unwrap();
    let full = format!("/v1/sessions/{sid}/events/{seq}");
    assert_eq!(started["truncated"]["full"], full.as_str(), "{started}");
    let shown = started["data"]["arguments"]["content"].as_str().unwrap();
    assert!(shown.starts_with("www") && shown.ends_with('…'), "{shown}");

    let resp = app.get(&full).await;
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    let whole: Value = resp.json().await.unwrap();
    assert!(whole["truncated"].is_null());
    assert_eq!(whole["data"]["arguments"]["content"], content.as_str());
    let mut as_paged = started.clone();
    as_paged["data"] = whole["data"].clone();
    as_paged.as_object_mut().unwrap().remove("truncated");
    assert_eq!(whole, as_paged, "the same event, whole");
    // Small events are the same whole and in a page.
    let first: Value = app
        .get(&format!("/v1/sessions/{sid}/events/1"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(first, events[0]);

    for (path, says) in [
        (format!("/v1/sessions/{sid}/events/999"), "no event 999"),
        (format!("/v1/sessions/{sid}/events/x1"), "whole number"),
        (
            format!("/v1/sessions/{}/events/1", uuid::Uuid::new_v4()),
            "session",
        ),
    ] {
        let resp = app.get(&path).await;
        assert_eq!(resp.status(), 404, "{path}");
        let p: Value = resp.json().await.unwrap();
        assert_eq!(p["code"], "not_found", "{p}");
        assert!(p["detail"].as_str().unwrap().contains(says), "{p}");
    }
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

/// `limits.max_streams_per_node = 2`: two tenants hold one stream each, well under their own
/// cap (64); a third tenant's is refused 503 `unavailable` naming the setting, with
/// `Retry-After`; once a stream ends, it gets one.
async fn the_streams_of_a_node_are_capped_across_tenants(backend: Backend) {
    let app = backend
        .spawn_with(|c| c.limits.max_streams_per_node = 2)
        .await;
    let keys = [
        key_for(&app, "alice").await,
        key_for(&app, "bob").await,
        key_for(&app, "carol").await,
    ];
    // Keys exist now: a restart switches to API-key auth.
    let app = app.restart().await;
    let mut sessions = Vec::new();
    for key in &keys {
        let s: Value = app
            .http
            .post(app.url("/v1/sessions"))
            .bearer_auth(key)
            .json(&json!({}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        sessions.push(s["id"].as_str().unwrap().to_owned());
    }
    let stream = |i: usize| {
        app.http
            .get(app.url(&format!("/v1/sessions/{}/events/stream", sessions[i])))
            .bearer_auth(&keys[i])
            .send()
    };
    let mut alice = stream(0).await.unwrap();
    assert_eq!(alice.status(), 200);
    let bob = stream(1).await.unwrap();
    assert_eq!(bob.status(), 200);
    let refused = stream(2).await.unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let p: Value = refused.json().await.unwrap();
    assert_eq!(p["code"], "unavailable", "{p}");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("limits.max_streams_per_node"),
        "{p}"
    );
    // Alice's stream ends (her session closes): Carol's comes in.
    let first = tokio::time::timeout(Duration::from_secs(5), alice.chunk()).await;
    assert!(matches!(first, Ok(Ok(Some(_)))), "{first:?}");
    let closed = app
        .http
        .delete(app.url(&format!("/v1/sessions/{}", sessions[0])))
        .bearer_auth(&keys[0])
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 200);
    while let Ok(Ok(Some(_))) = tokio::time::timeout(Duration::from_secs(10), alice.chunk()).await {
    }
    drop(alice);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let again = stream(2).await.unwrap();
        if again.status() == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the node's stream slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(bob);
}
