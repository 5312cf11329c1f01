//! Clients that must not hold the service: a body larger than allowed is refused from its
//! declared size, a body that never arrives and a head that never ends are cut off on time,
//! and connections beyond the cap are closed — while everyone else is served.
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use toolexec_tests::app::{TestApp, spawn_app_with};

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.base.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Reads what the server sends until it closes the connection or `limit` passes.
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(0) | Err(_)) => return (String::from_utf8_lossy(&buf).into_owned(), true),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return (String::from_utf8_lossy(&buf).into_owned(), false),
        }
    }
}

async fn healthy(app: &TestApp) {
    let t0 = Instant::now();
    let resp = app.get("/healthz").await;
    assert_eq!(resp.status(), 200);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_body_over_the_limit_is_refused_before_it_is_sent() {
    let app = spawn_app_with(|c| c.body_limit_bytes = 1024 * 1024).await;
    let mut s = connect(&app).await;
    let t0 = Instant::now();
    s.write_all(
        b"POST /v1/sessions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n{",
    )
    .await
    .unwrap();
    let (text, closed) = read_until_closed(&mut s, Duration::from_secs(5)).await;
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("body_too_large"), "{text}");
    assert!(text.contains("1048576"), "the limit is named: {text}");
    assert!(closed, "the connection is closed, not drained");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    healthy(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_arrives_gets_408_on_time() {
    let app = spawn_app_with(|c| c.body_read_timeout_ms = 1000).await;
    let mut s = connect(&app).await;
    let t0 = Instant::now();
    s.write_all(
        b"POST /v1/sessions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"meta",
    )
    .await
    .unwrap();
    // Others are served meanwhile.
    healthy(&app).await;
    let (text, _) = read_until_closed(&mut s, Duration::from_secs(10)).await;
    let took = t0.elapsed();
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // Nothing was created by the request that never finished.
    let list: serde_json::Value = app.get("/v1/sessions").await.json().await.unwrap();
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(0), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_never_ends_is_cut_off() {
    let app = spawn_app_with(|c| c.header_read_timeout_ms = 1000).await;
    let mut stalled = Vec::new();
    for _ in 0..20 {
        let mut s = connect(&app).await;
        s.write_all(b"POST /v1/sessions HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
            .await
            .unwrap();
        stalled.push(s);
    }
    healthy(&app).await;
    let t0 = Instant::now();
    for s in &mut stalled {
        let (_, closed) = read_until_closed(s, Duration::from_secs(5)).await;
        assert!(closed, "a connection with an unfinished head was kept open");
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // An idle keep-alive connection that never sends a request is closed too.
    let mut idle = connect(&app).await;
    let (_, closed) = read_until_closed(&mut idle, Duration::from_secs(5)).await;
    assert!(closed, "an idle connection was kept open");
    healthy(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed_at_once_and_freed_slots_are_reused() {
    let app = spawn_app_with(|c| c.max_connections = 4).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = connect(&app).await;
        // A complete request on each keeps them open (keep-alive) and proves they were served.
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        held.push(s);
    }
    let mut over = connect(&app).await;
    let _ = over
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await;
    let (text, closed) = read_until_closed(&mut over, Duration::from_secs(3)).await;
    assert!(closed && text.is_empty(), "over the cap: {text:?}");
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut again = connect(&app).await;
    again
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (text, _) = read_until_closed(&mut again, Duration::from_secs(3)).await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_its_responses_is_cut_off() {
    let app = spawn_app_with(|c| c.write_stall_timeout_ms = 1000).await;
    // A small receive window, and 200 pipelined requests for the ~120 KB document that are
    // never read: the server's writes stall within the first few responses.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket
        .connect(app.base.trim_start_matches("http://").parse().unwrap())
        .await
        .unwrap();
    const ASKED: usize = 200;
    let request = b"GET /openapi.json HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(ASKED);
    s.write_all(&request).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    healthy(&app).await;
    // By now the server has given up on the connection: reading drains what the kernel
    // buffered, then the connection is closed, long before every response was sent.
    let (text, closed) = read_until_closed(&mut s, Duration::from_secs(5)).await;
    let answered = text.matches("HTTP/1.1 200").count();
    assert!(closed, "the stalled connection is still open");
    assert!(
        answered < ASKED,
        "all {answered} responses were sent to a client that did not read"
    );
    healthy(&app).await;
}

// ---------------------------------------------------------------------------------------------
// Request slots per tenant (issue 23 §4): one tenant's slow bodies held every slot of the node,
// and every other tenant got 503 `overloaded`.
// ---------------------------------------------------------------------------------------------

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

/// The node's pool: 16 requests in flight (so, by default, 2 per tenant).
const POOL: usize = 16;

/// Starts a request whose body never comes (100 bytes announced, 6 sent) and returns the
/// connection with what the server answered within 500 ms (nothing: the request holds a slot
/// and waits for its body).
async fn slow_body(app: &TestApp, path: &str, key: &str) -> (TcpStream, String) {
    let mut s = connect(app).await;
    s.write_all(
        format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"meta"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = vec![0u8; 4096];
    let text = match tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await {
        Ok(Ok(n)) => String::from_utf8_lossy(&buf[..n]).into_owned(),
        _ => String::new(),
    };
    (s, text)
}

/// A session made and a call run with `key`: what another tenant must still get.
async fn served(app: &TestApp, key: &str) -> Result<(), String> {
    let resp = app
        .http
        .post(app.url("/v1/sessions"))
        .bearer_auth(key)
        .json(&serde_json::json!({}))
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    if status != 201 {
        return Err(format!("create: {status} {body}"));
    }
    let sid = body["id"].as_str().unwrap_or_default();
    let resp = app
        .http
        .post(app.url(&format!("/v1/sessions/{sid}/calls")))
        .bearer_auth(key)
        .json(&serde_json::json!({"calls": [{"id": "c", "name": "write_file", "arguments": {"file_path": "a.txt", "content": "x"}}]}))
        .send()
        .await
        .unwrap();
    if resp.status() != 200 {
        return Err(format!(
            "calls: {} {}",
            resp.status(),
            resp.text().await.unwrap_or_default()
        ));
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_slow_bodies_hold_its_share_of_the_slots_and_no_more() {
    let app = spawn_app_with(|c| c.max_concurrent_requests = POOL).await;
    let (a, b) = (key_for(&app, "alice").await, key_for(&app, "bob").await);
    // Keys exist now: a restart switches to API-key auth.
    let app = app.restart().await;

    // Alice opens as many slow uploads as the node has slots.
    let mut held = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..POOL {
        let (s, text) = slow_body(&app, "/v1/sessions", &a).await;
        held.push(s);
        answers.push(text);
    }
    // Bob is served all the same, and so are the probes.
    for _ in 0..3 {
        served(&app, &b)
            .await
            .unwrap_or_else(|e| panic!("bob: {e}"));
    }
    healthy(&app).await;
    // Alice's first uploads hold her share; the others were refused at once, before their
    // bodies, with when to retry.
    let waiting = answers.iter().filter(|t| t.is_empty()).count();
    assert_eq!(waiting, POOL / 8, "{answers:?}");
    for text in answers.iter().filter(|t| !t.is_empty()) {
        assert!(text.starts_with("HTTP/1.1 429"), "{text}");
        assert!(
            text.to_ascii_lowercase().contains("retry-after: 1"),
            "{text}"
        );
        assert!(text.contains("too_many_concurrent"), "{text}");
        assert!(
            text.contains("max_concurrent_requests_per_tenant"),
            "{text}"
        );
    }
    let resp = app
        .http
        .get(app.url("/v1/sessions"))
        .bearer_auth(&a)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    // Her slots come back when her uploads end.
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match served(&app, &a).await {
            Ok(()) => break,
            Err(e) if std::time::Instant::now() > deadline => panic!("alice after: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_with_a_wrong_key_hold_no_slot_even_where_requests_are_forwarded() {
    // A node of a cluster buffers a session's request to forward it to where the session
    // lives: the body was read before anyone was authenticated.
    let app = spawn_app_with(|c| {
        c.max_concurrent_requests = POOL;
        c.cluster.advertise_url = Some("http://127.0.0.1:9".into());
    })
    .await;
    let b = key_for(&app, "bob").await;
    let app = app.restart().await;
    let mut held = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..POOL {
        let path = format!("/v1/sessions/{}/calls", uuid::Uuid::now_v7());
        let (s, text) = slow_body(&app, &path, "tx_wrong_key").await;
        held.push(s);
        answers.push(text);
    }
    let bob = served(&app, &b).await;
    for text in &answers {
        assert!(text.starts_with("HTTP/1.1 401"), "{text:?}");
    }
    bob.unwrap_or_else(|e| panic!("bob: {e}"));
    drop(held);
}
