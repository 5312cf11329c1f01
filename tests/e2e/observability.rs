//! What an operator sees of the service besides its answers: traces exported over OTLP/HTTP to a
//! collector (here one written for the test, on loopback, decoding the protobuf the way a real
//! collector does), and request metrics by route template at `/metrics`.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind};
use prost::Message;
use serde_json::{Value, json};
use toolexec_tests::app::spawn_app;
use toolexec_tests::binary::{serve, toolexec};
use toolexec_tests::db::TestPgDatabase;

/// A span as the collector received it, with its resource's attributes.
#[derive(Debug, Clone)]
struct Received {
    span: Span,
    resource: HashMap<String, String>,
}

impl Received {
    fn attr(&self, key: &str) -> Option<String> {
        attr(&self.span.attributes, key)
    }
}

fn text(v: &AnyValue) -> String {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    attrs
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .map(text)
}

/// The collector's inbox: every span of every export request, and the requests it refused.
#[derive(Default)]
struct Inbox {
    spans: Vec<Received>,
    refused: Vec<String>,
}

type Shared = Arc<Mutex<Inbox>>;

/// `POST /v1/traces` as OTLP/HTTP specifies it: a protobuf `ExportTraceServiceRequest`,
/// answered 200 with an (empty) `ExportTraceServiceResponse`.
async fn receive(State(inbox): State<Shared>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let mut inbox = inbox.lock().unwrap();
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type != "application/x-protobuf" {
        inbox.refused.push(format!("content-type {content_type:?}"));
        return StatusCode::UNSUPPORTED_MEDIA_TYPE;
    }
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(r) => r,
        Err(e) => {
            inbox.refused.push(format!("undecodable body: {e}"));
            return StatusCode::BAD_REQUEST;
        }
    };
    for rs in request.resource_spans {
        let resource: HashMap<String, String> = rs
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .filter_map(|kv| Some((kv.key.clone(), text(kv.value.as_ref()?))))
            .collect();
        for ss in rs.scope_spans {
            for span in ss.spans {
                inbox.spans.push(Received {
                    span,
                    resource: resource.clone(),
                });
            }
        }
    }
    StatusCode::OK
}

/// Starts the collector on a loopback port; its base URL and inbox. It stops with the test's
/// runtime.
async fn collector() -> (String, Shared) {
    let inbox = Shared::default();
    let app = axum::Router::new()
        .route("/v1/traces", axum::routing::post(receive))
        .with_state(inbox.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), inbox)
}

fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The one span named `name` whose attribute `key` is `value`.
fn one<'a>(spans: &'a [Received], name: &str, key: &str, value: &str) -> &'a Received {
    let found: Vec<&Received> = spans
        .iter()
        .filter(|s| s.span.name == name && s.attr(key).as_deref() == Some(value))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "spans named {name:?} with {key} = {value:?}: {found:#?}\nall span names: {:?}",
        spans.iter().map(|s| &s.span.name).collect::<Vec<_>>()
    );
    found[0]
}

/// `child`'s parent is `parent`, in the same trace.
fn assert_child(child: &Received, parent: &Received) {
    assert_eq!(
        hex(&child.span.trace_id),
        hex(&parent.span.trace_id),
        "{} is not in the trace of {}",
        child.span.name,
        parent.span.name
    );
    assert_eq!(
        hex(&child.span.parent_span_id),
        hex(&parent.span.span_id),
        "the parent of {} is not {}",
        child.span.name,
        parent.span.name
    );
}

fn children<'a>(spans: &'a [Received], parent: &Received, name: &str) -> Vec<&'a Received> {
    spans
        .iter()
        .filter(|s| s.span.name == name && s.span.parent_span_id == parent.span.span_id)
        .collect()
}

/// A caller's trace context (W3C `traceparent`), as an agent loop that traces would send it.
const CALLER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CALLER_SPAN: &str = "b7ad6b7169203331";

/// SIGTERM, then waits (bounded) for a clean exit: the service flushes the spans still queued
/// before it exits (the batch processor's own schedule is 5 s; the tests do not wait for it).
async fn terminate(served: &mut toolexec_tests::binary::Served) {
    let t0 = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(served.child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let exited = loop {
        if let Some(status) = served.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "toolexec did not stop within 30 s of SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exited.success(), "toolexec exited with {exited}");
}

/// A replica of the binary on a port known in advance (it advertises it to the others),
/// exporting traces to `endpoint`.
fn replica(
    name: &str,
    db: &TestPgDatabase,
    endpoint: &str,
) -> (toolexec_tests::binary::Served, tempfile::TempDir) {
    let data = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        data.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = toolexec(data.path());
    cmd.arg("serve")
        .env("TOOLEXEC_BIND", format!("127.0.0.1:{port}"))
        .env("TOOLEXEC_DATA_DIR", data.path())
        .env("TOOLEXEC_DATABASE_URL", db.url())
        .env("TOOLEXEC_NODE", name)
        .env(
            "TOOLEXEC_CLUSTER__ADVERTISE_URL",
            format!("http://127.0.0.1:{port}"),
        )
        .env("TOOLEXEC_TELEMETRY__OTLP_ENDPOINT", endpoint);
    (serve(cmd), data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_forwarded_to_its_sessions_replica_is_one_trace_across_both() {
    let (endpoint, inbox) = collector().await;
    let db = TestPgDatabase::create().await;
    let (mut a, _a_data) = replica("trace-a", &db, &endpoint);
    let (mut b, _b_data) = replica("trace-b", &db, &endpoint);
    let http = reqwest::Client::new();
    let resp = http
        .post(format!("{}/v1/sessions", a.base))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let sid = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Sent to the replica the session does not live on: it forwards the call to trace-a.
    let resp = http
        .post(format!("{}/v1/sessions/{sid}/calls", b.base))
        .json(&json!({"calls": [{"id": "c1", "name": "shell", "arguments": {"command": "echo hop"}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["results"][0]["status"], "ok", "{body}");
    terminate(&mut b).await;
    terminate(&mut a).await;

    let inbox = inbox.lock().unwrap();
    let spans = &inbox.spans;
    let on = |node: &str| {
        spans
            .iter()
            .filter(|s| {
                s.span.name == "POST /v1/sessions/{id}/calls"
                    && s.resource.get("service.instance.id").map(String::as_str) == Some(node)
            })
            .collect::<Vec<_>>()
    };
    let (at_b, at_a) = (on("trace-b"), on("trace-a"));
    assert_eq!(at_b.len(), 1, "the request on trace-b: {spans:#?}");
    assert_eq!(
        at_a.len(),
        1,
        "the forwarded request on trace-a: {spans:#?}"
    );
    assert_child(at_a[0], at_b[0]);
    let call = one(spans, "call shell", "session.id", &sid);
    assert_eq!(
        call.resource.get("service.instance.id").map(String::as_str),
        Some("trace-a"),
        "the call ran where its session lives"
    );
    assert_child(call, at_a[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_of_requests_calls_sandbox_runs_and_store_writes_reach_an_otlp_collector() {
    let (endpoint, inbox) = collector().await;
    let db = TestPgDatabase::create().await;
    let data = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        data.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let mut cmd = toolexec(data.path());
    cmd.arg("serve")
        .env("TOOLEXEC_BIND", "127.0.0.1:0")
        .env("TOOLEXEC_DATA_DIR", data.path())
        .env("TOOLEXEC_DATABASE_URL", db.url())
        .env("TOOLEXEC_NODE", "traced-node")
        .env("TOOLEXEC_TELEMETRY__OTLP_ENDPOINT", &endpoint);
    let mut served = serve(cmd);
    let http = reqwest::Client::new();
    let post = |path: String, body: Value| {
        let req = http.post(format!("{}{path}", served.base)).json(&body);
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        }
    };
    let (status, session) = post("/v1/sessions".into(), json!({})).await;
    assert_eq!(status, 201, "{session}");
    let sid = session["id"].as_str().unwrap().to_owned();
    let (status, body) = post(
        format!("/v1/sessions/{sid}/calls"),
        json!({"calls": [{"id": "c1", "name": "shell", "arguments": {"command": "echo traced > f.txt"}}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["status"], "ok", "{body}");
    let (status, body) = post(
        format!("/v1/sessions/{sid}/calls"),
        json!({"calls": [{"id": "c3", "name": "shell", "arguments": {"command": "sleep 30", "background": true}}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["status"], "ok", "{body}");
    // This one continues a caller's trace (an agent loop that traces, a gateway).
    let resp = http
        .post(format!("{}/v1/sessions/{sid}/calls", served.base))
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .json(&json!({"calls": [{"id": "c2", "name": "read_file", "arguments": {"file_path": "nope.txt"}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["results"][0]["status"], "error", "{body}");

    // SIGTERM: the service stops, and flushes the spans still queued before it exits (the
    // batch processor's own schedule is 5 s; the test does not wait for it).
    terminate(&mut served).await;

    let inbox = inbox.lock().unwrap();
    assert!(inbox.refused.is_empty(), "{:?}", inbox.refused);
    let spans = &inbox.spans;
    assert!(!spans.is_empty(), "no span reached the collector");
    for s in spans {
        assert_eq!(
            s.resource.get("service.name").map(String::as_str),
            Some("toolexec")
        );
        assert_eq!(
            s.resource.get("service.instance.id").map(String::as_str),
            Some("traced-node")
        );
        // Names are templates: no session id in any of them.
        assert!(
            !s.span.name.contains(&sid),
            "a span named by a raw id: {}",
            s.span.name
        );
    }

    // The request: a server span named by method and route template, with its status, session
    // and tenant.
    let shell_call = one(spans, "call shell", "call.id", "c1");
    let request = spans
        .iter()
        .find(|s| s.span.span_id == shell_call.span.parent_span_id)
        .unwrap_or_else(|| panic!("the request span of the shell call is missing: {spans:#?}"));
    assert_eq!(request.span.name, "POST /v1/sessions/{id}/calls");
    assert_eq!(request.span.kind, SpanKind::Server as i32);
    assert_eq!(
        request.attr("http.route").as_deref(),
        Some("/v1/sessions/{id}/calls")
    );
    assert_eq!(
        request.attr("http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(request.attr("session.id").as_deref(), Some(sid.as_str()));
    let tenant = request.attr("tenant.id").expect("the request's tenant.id");
    uuid::Uuid::parse_str(&tenant).expect("tenant.id is the tenant's id");
    assert_child(shell_call, request);

    // The call: tool, status, session and tenant; its tool run, the sandbox run within it,
    // and the two store writes of a mutating call (its start before the tool, its finish).
    assert_eq!(shell_call.attr("tool").as_deref(), Some("shell"));
    assert_eq!(shell_call.attr("status").as_deref(), Some("ok"));
    assert_eq!(
        shell_call.attr("tenant.id").as_deref(),
        Some(tenant.as_str())
    );
    assert_eq!(shell_call.attr("call.id").as_deref(), Some("c1"));
    let tool = children(spans, shell_call, "tool shell");
    assert_eq!(tool.len(), 1, "the shell call's tool span: {spans:#?}");
    let sandbox = children(spans, tool[0], "sandbox.run");
    assert_eq!(
        sandbox.len(),
        1,
        "the sandbox run under the tool span: {spans:#?}"
    );
    assert_eq!(sandbox[0].attr("exit_code").as_deref(), Some("0"));
    let start = children(spans, shell_call, "store.write start");
    let finish = children(spans, shell_call, "store.write finish");
    assert_eq!(
        start.len(),
        1,
        "the start write of the shell call: {spans:#?}"
    );
    assert_eq!(
        finish.len(),
        1,
        "the finish write of the shell call: {spans:#?}"
    );
    assert_eq!(finish[0].attr("outcome").as_deref(), Some("committed"));
    // Children fit in their parents' time.
    for child in [tool[0], start[0], finish[0]] {
        assert!(child.span.start_time_unix_nano >= shell_call.span.start_time_unix_nano);
        assert!(child.span.end_time_unix_nano <= shell_call.span.end_time_unix_nano);
    }
    assert!(
        start[0].span.end_time_unix_nano <= tool[0].span.start_time_unix_nano,
        "a mutating call's start is durable before its tool runs"
    );

    // A background command: its start is traced, not its life.
    let background = one(spans, "call shell", "call.id", "c3");
    let tool = children(spans, background, "tool shell");
    assert_eq!(tool.len(), 1, "{spans:#?}");
    assert_eq!(
        children(spans, tool[0], "sandbox.start").len(),
        1,
        "{spans:#?}"
    );
    assert!(
        children(spans, tool[0], "sandbox.run").is_empty(),
        "{spans:#?}"
    );

    // A read-only call that failed: its status as the model saw it, recorded in one write.
    let read = one(spans, "call read_file", "call.id", "c2");
    assert_eq!(read.attr("status").as_deref(), Some("error"));
    assert_eq!(read.attr("session.id").as_deref(), Some(sid.as_str()));
    assert_eq!(
        children(spans, read, "store.write record").len(),
        1,
        "{spans:#?}"
    );
    let read_request = spans
        .iter()
        .find(|s| s.span.span_id == read.span.parent_span_id)
        .expect("the read's request span");
    assert_ne!(
        hex(&read_request.span.trace_id),
        hex(&request.span.trace_id),
        "each request is a trace of its own"
    );
    assert_eq!(
        hex(&read_request.span.trace_id),
        CALLER_TRACE,
        "a request with a traceparent continues the caller's trace"
    );
    assert_eq!(hex(&read_request.span.parent_span_id), CALLER_SPAN);

    // Session creation is traced too, by its route.
    let create = spans
        .iter()
        .find(|s| s.span.name == "POST /v1/sessions")
        .expect("the session's creation");
    assert_eq!(
        create.attr("http.response.status_code").as_deref(),
        Some("201")
    );
}

/// The value of one sample line of a Prometheus text exposition, by its series (name and
/// labels as written).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|v| v.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_metrics_are_counted_by_route_template_and_status_never_by_raw_path() {
    let app = spawn_app().await;
    let a = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let b = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    for (sid, id) in [(&a, "c1"), (&b, "c1"), (&b, "c2")] {
        app.call(
            sid,
            id,
            "write_file",
            json!({"file_path": "x.txt", "content": "x"}),
        )
        .await;
    }
    // A command too (a sandbox run and a workspace scan), on the same route.
    let r = app
        .call(&a, "c2", "shell", json!({"command": "echo y > y.txt"}))
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let missing = uuid::Uuid::now_v7();
    let resp = app.get(&format!("/v1/sessions/{missing}/events")).await;
    assert_eq!(resp.status(), 404);
    let resp = app.get("/v1/no/such/route/for/sure").await;
    assert_eq!(resp.status(), 404);
    let resp = app.get(&format!("/v1/no-route/{missing}")).await;
    assert_eq!(resp.status(), 404);

    let text = app.get("/metrics").await.text().await.unwrap();
    assert!(
        text.contains("# TYPE toolexec_http_requests counter"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE toolexec_http_request_duration_seconds histogram"),
        "{text}"
    );
    let calls = r#"method="POST",route="/v1/sessions/{id}/calls""#;
    assert_eq!(
        sample(
            &text,
            &format!("toolexec_http_requests_total{{{calls},status=\"200\"}}")
        ),
        Some(4.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            &format!("toolexec_http_request_duration_seconds_count{{{calls}}}")
        ),
        Some(4.0),
        "{text}"
    );
    let sum = sample(
        &text,
        &format!("toolexec_http_request_duration_seconds_sum{{{calls}}}"),
    )
    .unwrap();
    assert!(sum > 0.0 && sum < 60.0, "{sum}");
    assert_eq!(
        sample(
            &text,
            r#"toolexec_http_requests_total{method="POST",route="/v1/sessions",status="201"}"#
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"toolexec_http_requests_total{method="GET",route="/v1/sessions/{id}/events",status="404"}"#
        ),
        Some(1.0),
        "{text}"
    );
    // Paths that match no route share one label value, whatever they were.
    assert_eq!(
        sample(
            &text,
            r#"toolexec_http_requests_total{method="GET",route="unmatched",status="404"}"#
        ),
        Some(2.0),
        "{text}"
    );
    for id in [&a, &b, &missing.to_string()] {
        assert!(
            !text.contains(id.as_str()),
            "a raw id in /metrics: {id}\n{text}"
        );
    }
    assert_eq!(
        sample(&text, "toolexec_sessions_created_total"),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "toolexec_sessions_cached"),
        Some(2.0),
        "{text}"
    );
    // Every series the example Grafana dashboard queries is one the service exposes: a
    // renamed metric fails here, not on an operator's empty panel.
    let dashboard = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/toolexec.json"),
    )
    .unwrap();
    let dashboard: Value = serde_json::from_str(&dashboard).unwrap();
    let mut queried = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(at) = rest.find("toolexec_") {
                let name: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                rest = &rest[at + name.len()..];
                queried.insert(name);
            }
        }
    }
    assert!(queried.len() >= 15, "{queried:?}");
    for name in &queried {
        let exposed = text
            .lines()
            .any(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")));
        assert!(
            exposed,
            "the dashboard queries {name}, which /metrics does not have:\n{text}"
        );
    }
    // The scrape itself is counted once it is answered: the next scrape shows it.
    let again = app.get("/metrics").await.text().await.unwrap();
    assert_eq!(
        sample(
            &again,
            r#"toolexec_http_requests_total{method="GET",route="/metrics",status="200"}"#
        ),
        Some(1.0),
        "{again}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_spans_not_requests_and_the_log_says_so() {
    // A port nothing listens on: every export fails to connect.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let data = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        data.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let log_path = data.path().join("toolexec.log");
    let mut cmd = toolexec(data.path());
    cmd.arg("serve")
        .env("TOOLEXEC_BIND", "127.0.0.1:0")
        .env("TOOLEXEC_DATA_DIR", data.path())
        .env(
            "TOOLEXEC_TELEMETRY__OTLP_ENDPOINT",
            format!("http://127.0.0.1:{dead}"),
        )
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap());
    let child = cmd.spawn().unwrap();
    let mut served = toolexec_tests::binary::Served {
        child,
        base: String::new(),
        log: Vec::new(),
    };
    let lines = || -> Vec<Value> {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let t0 = Instant::now();
    served.base = loop {
        if let Some(l) = lines().iter().find(|l| l["message"] == "listening") {
            break format!("http://{}", l["address"].as_str().unwrap());
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "not listening: {:?}",
            lines()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    toolexec_tools::web::install_tls_provider();
    let http = reqwest::Client::new();
    for _ in 0..3 {
        let t = Instant::now();
        let resp = http
            .post(format!("{}/v1/sessions", served.base))
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "a request waited for the collector: {:?}",
            t.elapsed()
        );
    }
    terminate(&mut served).await;
    let log = lines();
    let failed = log.iter().find(|l| {
        l["level"] == "ERROR"
            && l["target"] == "opentelemetry_sdk"
            && l["error"]
                .as_str()
                .is_some_and(|e| e.contains("export failed"))
    });
    assert!(
        failed.is_some(),
        "no log line says the spans could not be exported: {log:#?}"
    );
}
