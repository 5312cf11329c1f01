//! Requests the service cannot act on get problem+json with a stable code — in-process, through
//! the router itself (no socket), on the embedded store.
use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

async fn app() -> (axum::Router, tempfile::TempDir) {
    let data = tempfile::tempdir().unwrap();
    let config = toolexec_server::Config {
        bind: "127.0.0.1:0".into(),
        data_dir: data.path().to_owned(),
        body_limit_bytes: 64 * 1024,
        ..Default::default()
    };
    let state = toolexec_server::build_state(&config).await.unwrap();
    (toolexec_api::app(state), data)
}

async fn send(
    app: &axum::Router,
    req: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, Value) {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, headers, body)
}

fn post(path: &str, content_type: Option<&str>, body: impl Into<Body>) -> Request<Body> {
    let mut b = Request::post(path);
    if let Some(ct) = content_type {
        b = b.header("content-type", ct);
    }
    b.body(body.into()).unwrap()
}

fn assert_problem(
    status: StatusCode,
    headers: &axum::http::HeaderMap,
    body: &Value,
    want: StatusCode,
    code: &str,
) {
    assert_eq!(status, want, "{body}");
    assert_eq!(headers["content-type"], "application/problem+json");
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["status"], want.as_u16());
    assert!(body["type"].as_str().unwrap().ends_with(code));
    assert!(!body["detail"].as_str().unwrap().is_empty());
}

#[tokio::test]
async fn malformed_json_is_a_400_problem() {
    let (app, _d) = app().await;
    let (s, h, b) = send(
        &app,
        post("/v1/sessions", Some("application/json"), "{not json"),
    )
    .await;
    assert_problem(s, &h, &b, StatusCode::BAD_REQUEST, "malformed_json");
}

#[tokio::test]
async fn a_body_that_is_not_json_is_a_415_problem() {
    let (app, _d) = app().await;
    let (s, h, b) = send(&app, post("/v1/sessions", Some("text/plain"), "{}")).await;
    assert_problem(
        s,
        &h,
        &b,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    );
    let (s, h, b) = send(&app, post("/v1/sessions", None, "{}")).await;
    assert_problem(
        s,
        &h,
        &b,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
    );
}

#[tokio::test]
async fn a_body_over_the_limit_is_a_413_problem() {
    let (app, _d) = app().await;
    let big = format!(
        "{{\"metadata\": {{\"x\": \"{}\"}}}}",
        "a".repeat(100 * 1024)
    );
    let (s, h, b) = send(&app, post("/v1/sessions", Some("application/json"), big)).await;
    assert_problem(s, &h, &b, StatusCode::PAYLOAD_TOO_LARGE, "body_too_large");
}

#[tokio::test]
async fn json_of_the_wrong_shape_is_a_422_problem_that_names_the_field() {
    let (app, _d) = app().await;
    let (s, h, b) = send(
        &app,
        post("/v1/sessions", Some("application/json"), r#"{"toolz": []}"#),
    )
    .await;
    assert_problem(
        s,
        &h,
        &b,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_request",
    );
    assert!(b["detail"].as_str().unwrap().contains("toolz"), "{b}");
    let (s, h, b) = send(
        &app,
        post(
            "/v1/sessions",
            Some("application/json"),
            r#"{"policy": {"default_timeout_ms": 99999999}}"#,
        ),
    )
    .await;
    assert_problem(
        s,
        &h,
        &b,
        StatusCode::UNPROCESSABLE_ENTITY,
        "policy_above_ceiling",
    );
    let (s, h, b) = send(
        &app,
        post(
            "/v1/sessions",
            Some("application/json"),
            r#"{"tools": ["nope"]}"#,
        ),
    )
    .await;
    assert_problem(s, &h, &b, StatusCode::UNPROCESSABLE_ENTITY, "unknown_tool");
}

#[tokio::test]
async fn an_empty_batch_and_an_unknown_session_are_problems() {
    let (app, _d) = app().await;
    let (s, _h, b) = send(&app, post("/v1/sessions", Some("application/json"), "{}")).await;
    assert_eq!(s, StatusCode::CREATED);
    let sid = b["id"].as_str().unwrap();
    let (s, h, b) = send(
        &app,
        post(
            &format!("/v1/sessions/{sid}/calls"),
            Some("application/json"),
            r#"{"calls": []}"#,
        ),
    )
    .await;
    assert_problem(
        s,
        &h,
        &b,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_request",
    );
    assert!(b["detail"].as_str().unwrap().contains("'/calls'"), "{b}");
    let (s, h, b) = send(
        &app,
        post(
            &format!("/v1/sessions/{}/calls", uuid::Uuid::now_v7()),
            Some("application/json"),
            r#"{"calls": [{"id": "c", "name": "list_dir", "arguments": {}}]}"#,
        ),
    )
    .await;
    assert_problem(s, &h, &b, StatusCode::NOT_FOUND, "not_found");
    let (s, h, b) = send(
        &app,
        Request::get("/v1/sessions/not-a-uuid")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_problem(s, &h, &b, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test]
async fn unknown_routes_and_methods_are_problems() {
    let (app, _d) = app().await;
    let (s, h, b) = send(
        &app,
        Request::get("/v2/nothing").body(Body::empty()).unwrap(),
    )
    .await;
    assert_problem(s, &h, &b, StatusCode::NOT_FOUND, "no_route");
    let (s, h, b) = send(
        &app,
        Request::put("/v1/sessions").body(Body::empty()).unwrap(),
    )
    .await;
    assert_problem(
        s,
        &h,
        &b,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
}

#[tokio::test]
async fn every_response_carries_a_request_id_and_the_gateways_id_is_kept() {
    let (app, _d) = app().await;
    let (_, h, _) = send(&app, Request::get("/healthz").body(Body::empty()).unwrap()).await;
    let id = h["x-request-id"].to_str().unwrap();
    assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");
    let (_, h, _) = send(
        &app,
        Request::get("/v2/nothing")
            .header("x-request-id", "gw-123")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(h["x-request-id"], "gw-123");
}

#[tokio::test]
async fn a_tenant_over_its_rate_limit_gets_429_with_retry_after() {
    let data = tempfile::tempdir().unwrap();
    let config = toolexec_server::Config {
        bind: "127.0.0.1:0".into(),
        data_dir: data.path().to_owned(),
        rate_limit_per_second: 0.5,
        rate_limit_burst: 2.0,
        ..Default::default()
    };
    let app = toolexec_api::app(toolexec_server::build_state(&config).await.unwrap());
    for _ in 0..2 {
        let (s, _, _) = send(
            &app,
            Request::get("/v1/sessions").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::OK);
    }
    let (s, h, b) = send(
        &app,
        Request::get("/v1/sessions").body(Body::empty()).unwrap(),
    )
    .await;
    assert_problem(s, &h, &b, StatusCode::TOO_MANY_REQUESTS, "rate_limited");
    assert_eq!(h["retry-after"], "2");
    // Probes are not rate limited.
    let (s, _, _) = send(&app, Request::get("/healthz").body(Body::empty()).unwrap()).await;
    assert_eq!(s, StatusCode::OK);
}
