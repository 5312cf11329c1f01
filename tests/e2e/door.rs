//! Where a request comes from, on every route (DNS rebinding): the compiled binary in its
//! default local mode (no keys, loopback) answers only for its own names and addresses and the
//! names the operator lists (`allowed_hosts`), and browser pages only from its own origin and
//! the ones the operator lists (`allowed_origins`). A page that rebinds its own name to
//! 127.0.0.1 can neither list sessions, create one, nor run a command; a client-sent
//! `x-toolexec-forwarded-by` switches nothing off. The probes (`/healthz`, `/readyz`,
//! `/metrics`) answer whatever the Host: kubelets and scrapers name the pod's IP.
use serde_json::{Value, json};
use toolexec_tests::binary::{Served, serve, toolexec};

/// The binary in its default local mode on `bind`, with more settings in the environment.
fn local_service(bind: &str, env: &[(&str, &str)]) -> (Served, tempfile::TempDir) {
    let data = tempfile::tempdir().unwrap();
    let mut cmd = toolexec(data.path());
    cmd.arg("serve")
        .env("TOOLEXEC_BIND", bind)
        .env("TOOLEXEC_DATA_DIR", data.path())
        .envs(env.iter().copied());
    (serve(cmd), data)
}

/// `http://127.0.0.1:PORT` → `PORT`.
fn port_of(served: &Served) -> u16 {
    served.base.rsplit(':').next().unwrap().parse().unwrap()
}

/// A request with the given extra headers (`host`, `origin`, …), answered as (status, JSON).
async fn send(
    served: &Served,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Value) {
    let mut req =
        reqwest::Client::new().request(method.parse().unwrap(), format!("{}{path}", served.base));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn shell(id: &str, command: &str) -> Value {
    json!({"calls": [{"id": id, "name": "shell", "arguments": {"command": command}}]})
}

fn assert_refused_for(what: &str, (status, body): &(u16, Value), setting: &str, var: &str) {
    assert_eq!(*status, 403, "{what}: {body}");
    assert_eq!(body["code"], "forbidden", "{what}: {body}");
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(setting) && detail.contains(var),
        "{what}: the problem names the setting that admits it: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_on_a_foreign_host_or_origin_cannot_drive_the_api_in_the_default_local_mode() {
    let (served, _data) = local_service("127.0.0.1:0", &[]);
    let port = port_of(&served);
    let rebound = format!("rebind.example:{port}");
    let foreign = [("host", rebound.as_str())];

    // A session made the normal way, with its env: what a rebinding page would be after.
    let (status, session) = send(
        &served,
        "POST",
        "/v1/sessions",
        &[],
        Some(json!({"env": {"API_TOKEN": "secret-of-the-operator"}})),
    )
    .await;
    assert_eq!(status, 201, "{session}");
    let sid = session["id"].as_str().unwrap().to_owned();
    let events = |served: &Served| {
        let url = format!("{}/v1/sessions/{sid}/events", served.base);
        async move {
            reqwest::get(url)
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()["events"]
                .as_array()
                .unwrap()
                .len()
        }
    };
    let logged = events(&served).await;

    // The page's own name, pointed at 127.0.0.1: refused on every route, before anything runs.
    let listed = send(&served, "GET", "/v1/sessions", &foreign, None).await;
    assert_refused_for(
        "GET /v1/sessions",
        &listed,
        "allowed_hosts",
        "TOOLEXEC_ALLOWED_HOSTS",
    );
    assert!(!listed.1.to_string().contains("secret-of-the-operator"));
    let created = send(&served, "POST", "/v1/sessions", &foreign, Some(json!({}))).await;
    assert_refused_for(
        "POST /v1/sessions",
        &created,
        "allowed_hosts",
        "TOOLEXEC_ALLOWED_HOSTS",
    );
    let ran = send(
        &served,
        "POST",
        &format!("/v1/sessions/{sid}/calls"),
        &foreign,
        Some(shell("pwn-1", "touch pwned")),
    )
    .await;
    assert_refused_for(
        "a shell call",
        &ran,
        "allowed_hosts",
        "TOOLEXEC_ALLOWED_HOSTS",
    );
    for path in [
        format!("/v1/sessions/{sid}"),
        format!("/v1/sessions/{sid}/files/pwned"),
        "/v1/tools".to_owned(),
        "/openapi.json".to_owned(),
        "/docs/".to_owned(),
        "/no/such/route".to_owned(),
    ] {
        let (status, body) = send(&served, "GET", &path, &foreign, None).await;
        assert_eq!(status, 403, "GET {path}: {body}");
    }
    // A client-sent forwarding header switches nothing off, on the MCP endpoint or elsewhere.
    let forged = [
        ("host", rebound.as_str()),
        ("x-toolexec-forwarded-by", "toolexec-0"),
    ];
    let mcp = send(
        &served,
        "POST",
        &format!("/v1/sessions/{sid}/mcp"),
        &[
            forged[0],
            forged[1],
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2025-11-25"),
        ],
        Some(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                     "params": {"name": "shell", "arguments": {"command": "touch pwned"}}})),
    )
    .await;
    assert_refused_for(
        "a forged forward to MCP",
        &mcp,
        "allowed_hosts",
        "TOOLEXEC_ALLOWED_HOSTS",
    );
    let ran = send(
        &served,
        "POST",
        &format!("/v1/sessions/{sid}/calls"),
        &forged,
        Some(shell("pwn-2", "touch pwned")),
    )
    .await;
    assert_eq!(ran.0, 403, "{}", ran.1);

    // A page on another origin, sent to a Host the service answers for: refused too.
    let local = format!("127.0.0.1:{port}");
    for origin in ["https://evil.example", "http://localhost:3000", "null"] {
        let from_page = [("host", local.as_str()), ("origin", origin)];
        let listed = send(&served, "GET", "/v1/sessions", &from_page, None).await;
        assert_refused_for(
            origin,
            &listed,
            "allowed_origins",
            "TOOLEXEC_ALLOWED_ORIGINS",
        );
        let ran = send(
            &served,
            "POST",
            &format!("/v1/sessions/{sid}/calls"),
            &from_page,
            Some(shell("pwn-3", "touch pwned")),
        )
        .await;
        assert_refused_for(origin, &ran, "allowed_origins", "TOOLEXEC_ALLOWED_ORIGINS");
    }
    assert_eq!(
        events(&served).await,
        logged,
        "nothing ran, nothing was recorded"
    );
    let (_, sessions) = send(&served, "GET", "/v1/sessions", &[], None).await;
    assert_eq!(
        sessions["sessions"].as_array().unwrap().len(),
        1,
        "{sessions}"
    );

    // Its own names pass: the loopback names with any port, and its own origin (the docs
    // page's "Try it out" sends `Origin` with a POST).
    for host in [
        local.clone(),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "127.0.0.1".to_owned(),
    ] {
        let (status, body) = send(&served, "GET", "/v1/sessions", &[("host", &host)], None).await;
        assert_eq!(status, 200, "{host}: {body}");
    }
    let own_origin = format!("http://127.0.0.1:{port}");
    let (status, body) = send(
        &served,
        "POST",
        &format!("/v1/sessions/{sid}/calls"),
        &[("origin", own_origin.as_str())],
        Some(shell("own-origin", "echo from-the-docs-page")),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["status"], "ok", "{body}");

    // The probes answer whatever the Host (a kubelet names the pod IP).
    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, body) = send(&served, "GET", path, &[("host", "10.1.2.3:8080")], None).await;
        assert_eq!(status, 200, "{path}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_admits_a_gateways_names_and_browser_origins_and_the_bound_address_passes() {
    // The gateway's name from the configuration file, a browser origin from the environment;
    // bound to 127.0.0.2, which no loopback name covers.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("toolexec.toml");
    std::fs::write(&file, "allowed_hosts = [\"tools.example.com\"]\n").unwrap();
    let (served, _data) = local_service(
        "127.0.0.2:0",
        &[
            ("TOOLEXEC_CONFIG", file.to_str().unwrap()),
            ("TOOLEXEC_ALLOWED_ORIGINS", "https://app.example.com"),
        ],
    );
    let port = port_of(&served);
    for host in [
        "tools.example.com".to_owned(),
        "TOOLS.example.com:443".to_owned(),
        format!("127.0.0.2:{port}"),
        format!("localhost:{port}"),
    ] {
        let (status, body) = send(&served, "GET", "/v1/sessions", &[("host", &host)], None).await;
        assert_eq!(status, 200, "{host}: {body}");
    }
    let refused = send(
        &served,
        "GET",
        "/v1/sessions",
        &[("host", "rebind.example")],
        None,
    )
    .await;
    assert_refused_for(
        "a foreign host",
        &refused,
        "allowed_hosts",
        "TOOLEXEC_ALLOWED_HOSTS",
    );
    let (status, body) = send(
        &served,
        "POST",
        "/v1/sessions",
        &[
            ("host", "tools.example.com"),
            ("origin", "https://app.example.com"),
        ],
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let refused = send(
        &served,
        "POST",
        "/v1/sessions",
        &[
            ("host", "tools.example.com"),
            ("origin", "https://evil.example"),
        ],
        Some(json!({})),
    )
    .await;
    assert_refused_for(
        "a foreign origin",
        &refused,
        "allowed_origins",
        "TOOLEXEC_ALLOWED_ORIGINS",
    );
}
