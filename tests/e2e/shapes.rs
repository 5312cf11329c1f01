//! The API takes exactly what its OpenAPI document describes, on both stores: every JSON of
//! another shape is a 422 that points at the field, nothing is created or run, and the value
//! JSON Schema calls an integer (`1.0`) is one.
use serde_json::{Value, json};
use toolexec_tests::app::{TestApp, spawn_app, spawn_sqlite_app};

async fn post_raw(app: &TestApp, path: &str, body: &str) -> (u16, Value) {
    let resp = app
        .http
        .post(app.url(path))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or(Value::Null),
    )
}

fn assert_points_at(status: u16, body: &Value, pointer: &str) {
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "invalid_request", "{body}");
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(&format!("'{pointer}'")),
        "expected a pointer to {pointer}: {body}"
    );
}

async fn wrong_shapes_are_refused(app: TestApp) {
    for metadata in ["false", "0", "\"s\"", "[1]"] {
        let (s, b) = post_raw(
            &app,
            "/v1/sessions",
            &format!("{{\"metadata\": {metadata}}}"),
        )
        .await;
        assert_points_at(s, &b, "/metadata");
    }
    // serde's sequence form of a struct: an array where the document says object.
    let (s, b) = post_raw(&app, "/v1/sessions", "[null, null]").await;
    assert_points_at(s, &b, "/");
    let (s, b) = post_raw(&app, "/v1/sessions", r#"{"policy": ["allow"]}"#).await;
    assert_points_at(s, &b, "/policy");
    let (s, b) = post_raw(&app, "/v1/sessions", r#"{"env": {"A": 1}}"#).await;
    assert_points_at(s, &b, "/env/A");
    let list: Value = app.get("/v1/sessions").await.json().await.unwrap();
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(0), "{list}");

    let session = app.session(json!({"metadata": {"agent": "shapes"}})).await;
    let sid = session["id"].as_str().unwrap();
    let calls = format!("/v1/sessions/{sid}/calls");
    for (body, pointer) in [
        (r#"{"calls": [["id", "list_dir", {}]]}"#, "/calls/0"),
        (r#"{"calls": []}"#, "/calls"),
        (r#"{"calls": {"id": "a"}}"#, "/calls"),
        (
            r#"{"calls": [{"id": "", "name": "list_dir"}]}"#,
            "/calls/0/id",
        ),
        (
            r#"{"calls": [{"id": 7, "name": "list_dir"}]}"#,
            "/calls/0/id",
        ),
        (
            r#"{"calls": [{"id": "a", "name": "list_dir", "arguments": [1]}]}"#,
            "/calls/0/arguments",
        ),
    ] {
        let (s, b) = post_raw(&app, &calls, body).await;
        assert_points_at(s, &b, pointer);
    }
    let long = "x".repeat(257);
    let (s, b) = post_raw(
        &app,
        &calls,
        &json!({"calls": [{"id": long, "name": "list_dir"}]}).to_string(),
    )
    .await;
    assert_points_at(s, &b, "/calls/0/id");
    // None of them ran: the log holds the session's creation only.
    let events = app.events(sid).await;
    assert_eq!(events.len(), 1, "{events:?}");
    // Every later response still has the documented shape.
    let got: Value = app
        .get(&format!("/v1/sessions/{sid}"))
        .await
        .json()
        .await
        .unwrap();
    assert!(got["metadata"].is_object(), "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_shapes_are_refused_with_a_pointer_on_postgres() {
    wrong_shapes_are_refused(spawn_app().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_shapes_are_refused_with_a_pointer_on_sqlite() {
    wrong_shapes_are_refused(spawn_sqlite_app().await).await;
}

async fn whole_floats_are_integers(app: TestApp) {
    let (s, b) = post_raw(
        &app,
        "/v1/sessions",
        r#"{"policy": {"default_timeout_ms": 5000.0, "output_limits": {"read_file": 2e3}}}"#,
    )
    .await;
    assert_eq!(s, 201, "{b}");
    assert_eq!(b["policy"]["default_timeout_ms"], 5000, "{b}");
    assert_eq!(b["policy"]["output_limits"]["read_file"], 2000, "{b}");
    let sid = b["id"].as_str().unwrap();
    let r = app
        .call(
            sid,
            "c1",
            "shell",
            json!({"command": "echo ok", "timeout_ms": 4000.0}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let r = app
        .call(sid, "c2", "list_dir", json!({"path": ".", "depth": 1.5}))
        .await;
    assert_eq!(r["status"], "invalid_arguments", "{r}");
    assert!(r["content"].as_str().unwrap().contains("depth"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_number_written_as_a_float_is_an_integer_on_postgres() {
    whole_floats_are_integers(spawn_app().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_number_written_as_a_float_is_an_integer_on_sqlite() {
    whole_floats_are_integers(spawn_sqlite_app().await).await;
}

/// Every bounded integer query parameter the served document states (`limit`s and the like),
/// found in the document itself so that no endpoint is left out: its maximum is served, one
/// above it is a 400 `invalid_query` that names the parameter — never silently clamped.
async fn query_bounds_are_the_documented_ones(app: TestApp) {
    let session = app.session(json!({})).await;
    let sid = session["id"].as_str().unwrap().to_owned();
    let r = app
        .call(
            &sid,
            "c1",
            "write_file",
            json!({"file_path": "a.txt", "content": "a\n"}),
        )
        .await;
    let inv = r["invocation_id"].as_str().unwrap().to_owned();
    let doc: Value = app.get("/openapi.json").await.json().await.unwrap();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let Some(params) = item["get"]["parameters"].as_array() else {
            continue;
        };
        let concrete = path
            .replace("/v1/sessions/{id}", &format!("/v1/sessions/{sid}"))
            .replace("/v1/invocations/{id}", &format!("/v1/invocations/{inv}"));
        if concrete.contains('{') {
            continue;
        }
        for p in params {
            let (Some(max), "query") = (
                p["schema"]["maximum"].as_u64(),
                p["in"].as_str().unwrap_or_default(),
            ) else {
                continue;
            };
            let name = p["name"].as_str().unwrap();
            let ok = app.get(&format!("{concrete}?{name}={max}")).await;
            assert!(
                ok.status().is_success(),
                "{path}?{name}={max}: {}",
                ok.status()
            );
            let over = app.get(&format!("{concrete}?{name}={}", max + 1)).await;
            assert_eq!(over.status().as_u16(), 400, "{path}?{name}={}", max + 1);
            let body: Value = over.json().await.unwrap();
            assert_eq!(body["code"], "invalid_query", "{body}");
            assert!(body["detail"].as_str().unwrap().contains(name), "{body}");
            checked += 1;
        }
    }
    // sessions, events, an invocation's side effects, its output: at least these four.
    assert!(checked >= 4, "only {checked} bounded parameters found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_parameters_above_their_documented_maximum_are_refused_on_postgres() {
    query_bounds_are_the_documented_ones(spawn_app().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_parameters_above_their_documented_maximum_are_refused_on_sqlite() {
    query_bounds_are_the_documented_ones(spawn_sqlite_app().await).await;
}
