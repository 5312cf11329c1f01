//! Tenancy: API keys bind requests to a tenant, and a tenant never sees another's data.
use serde_json::{Value, json};
use toolexec_tests::app::{DbControl, TestApp, spawn_app};

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

#[tokio::test]
async fn a_tenant_never_sees_another_tenants_sessions_or_invocations() {
    let app = spawn_app().await;
    let alice = key_for(&app, "alice").await;
    let bob = key_for(&app, "bob").await;
    // Keys exist now: a restart switches to API-key auth.
    let app = app.restart().await;
    let as_ = |key: &str, req: reqwest::RequestBuilder| req.bearer_auth(key.to_owned());

    let s: Value = as_(&alice, app.http.post(app.url("/v1/sessions")))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sid = s["id"].as_str().unwrap();
    let r: Value = as_(&alice, app.http.post(app.url(&format!("/v1/sessions/{sid}/calls"))))
        .json(&json!({"calls": [{"id": "c", "name": "write_file", "arguments": {"file_path": "a", "content": "x"}}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let inv = r["results"][0]["invocation_id"].as_str().unwrap();

    for (method, path) in [
        ("GET", format!("/v1/sessions/{sid}")),
        ("GET", format!("/v1/sessions/{sid}/events")),
        ("GET", format!("/v1/invocations/{inv}")),
        ("GET", format!("/v1/invocations/{inv}/output")),
        ("DELETE", format!("/v1/sessions/{sid}")),
    ] {
        let req = app.http.request(method.parse().unwrap(), app.url(&path));
        let resp = as_(&bob, req).send().await.unwrap();
        assert_eq!(resp.status(), 404, "{method} {path}");
        let p: Value = resp.json().await.unwrap();
        assert_eq!(p["code"], "not_found");
    }
    let resp = as_(
        &bob,
        app.http.post(app.url(&format!("/v1/sessions/{sid}/calls"))),
    )
    .json(&json!({"calls": [{"id": "c", "name": "read_file", "arguments": {"file_path": "a"}}]}))
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), 404);
    let list: Value = as_(&bob, app.http.get(app.url("/v1/sessions")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["sessions"], json!([]));

    // Alice still sees hers.
    let mine = as_(
        &alice,
        app.http.get(app.url(&format!("/v1/sessions/{sid}"))),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(mine.status(), 200);
}

#[tokio::test]
async fn without_a_valid_key_requests_are_unauthorized() {
    let app = spawn_app().await;
    key_for(&app, "alice").await;
    let app = app.restart().await;
    let r = app.get("/v1/sessions").await;
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["code"], "unauthorized");
    let r = app
        .http
        .get(app.url("/v1/sessions"))
        .bearer_auth("tx_wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // Health stays open for probes.
    assert_eq!(app.get("/healthz").await.status(), 200);
}

#[tokio::test]
async fn api_keys_are_stored_hashed() {
    let app = spawn_app().await;
    let key = key_for(&app, "alice").await;
    let db = app.db.clone().unwrap();
    let stored: Vec<String> = db.query_strings("SELECT key_sha256 FROM api_keys").await;
    assert_eq!(stored, [toolexec_api::key_hash(&key)]);
    assert!(!stored[0].contains(&key));
}

#[tokio::test]
async fn binding_a_public_address_without_auth_is_refused_at_start_up() {
    let app = spawn_app().await;
    let mut config = app.config.clone();
    config.bind = "0.0.0.0:0".into();
    let err = toolexec_server::build_state(&config)
        .await
        .expect_err("must refuse");
    let msg = format!("{err:#}");
    assert!(msg.contains("without authentication"), "{msg}");
    assert!(msg.contains("toolexec keys create"), "{msg}");
}
