//! A session's MCP endpoint (`/v1/sessions/{id}/mcp`): a real MCP client (the official Python
//! SDK) lists and calls the session's tools in both lifecycles, and every call lands in the
//! session's log as a call of its own (the JSON-RPC id is the client's correlation id; a
//! `_meta` call id makes a call idempotent); the door is checked like the REST API's (auth,
//! tenant, Origin, Host), versions are negotiated, and bad JSON-RPC gets JSON-RPC errors.
use std::time::Duration;

use serde_json::{Value, json};
use toolexec_tests::app::{TestApp, spawn_app, spawn_sqlite_app, spawn_sqlite_app_with};

/// Headers every Streamable HTTP POST carries.
fn rpc(app: &TestApp, sid: &str) -> reqwest::RequestBuilder {
    app.http
        .post(app.url(&format!("/v1/sessions/{sid}/mcp")))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .timeout(Duration::from_secs(30))
}

async fn send(req: reqwest::RequestBuilder, body: &Value) -> (u16, Value) {
    let resp = req.body(body.to_string()).send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn initialize(version: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {},
        "clientInfo": {"name": "toolexec-test", "version": "0"}}})
}

/// A tools/call of 2025-11-25 (no per-request metadata).
fn tool_call(id: Value, name: &str, args: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": name, "arguments": args}})
}

async fn session(app: &TestApp) -> String {
    app.session(json!({"files": {"notes.txt": "hello world\n"}}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A new API key of `tenant` (the service requires keys once it restarts).
async fn api_key(app: &TestApp, tenant: &str) -> String {
    let store = app.state.engine.store();
    let t = store.ensure_tenant(tenant).await.unwrap();
    let key = format!("tx_test_{}", uuid::Uuid::new_v4().simple());
    store
        .create_api_key(t.id, &toolexec_api::key_hash(&key), &key[..11])
        .await
        .unwrap();
    key
}

/// Runs tests/python/mcp_client.py against a session and returns what it printed.
async fn python_client(url: &str, mode: &str, key: Option<&str>) -> Value {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/mcp_client.py");
    let run = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(url)
        .arg(mode)
        .args(key)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .expect("the MCP client finished within 90 s")
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the MCP Python SDK failed (needs `pip install mcp==2.3.0`; .ci/run installs it):\n{stdout}\n{stderr}"
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

/// What the Python SDK saw, checked against the catalog and the session's log.
async fn check_a_python_client_run(app: &TestApp, sid: &str, run: &Value) {
    // The tools, their schemas and annotations true to each tool's declarations.
    let catalog: Value = app.get("/v1/tools").await.json().await.unwrap();
    let tools = run["tools"].as_array().unwrap();
    let available: Vec<&Value> = catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["available"] == true)
        .collect();
    assert_eq!(tools.len(), available.len(), "{run}");
    for spec in available {
        let name = spec["name"].as_str().unwrap();
        let tool = tools.iter().find(|t| t["name"] == name).unwrap();
        assert_eq!(tool["inputSchema"], spec["input_schema"], "{name}");
        let caps = spec["capabilities"].as_array().unwrap();
        let read_only = spec["read_only"] == true;
        let a = &tool["annotations"];
        assert_eq!(a["readOnlyHint"], read_only, "{name}");
        assert_eq!(a["destructiveHint"], !read_only, "{name}");
        assert_eq!(
            a["openWorldHint"],
            caps.contains(&json!("network")),
            "{name}"
        );
    }
    for (name, read_only) in [
        ("read_file", true),
        ("grep", true),
        ("glob", true),
        ("shell", false),
        ("edit_file", false),
        ("write_file", false),
    ] {
        let t = tools.iter().find(|t| t["name"] == name).unwrap();
        assert_eq!(t["annotations"]["readOnlyHint"], read_only, "{name}");
        assert_eq!(t["annotations"]["destructiveHint"], !read_only, "{name}");
    }
    let web = tools.iter().find(|t| t["name"] == "web_fetch").unwrap();
    assert_eq!(web["annotations"]["openWorldHint"], true);

    // The calls' results as CallToolResult.
    let calls = &run["calls"];
    let text = |c: &Value| {
        c["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(calls["read"]["isError"], false, "{calls}");
    assert!(text(&calls["read"]).contains("hello world"), "{calls}");
    assert_eq!(calls["shell"]["isError"], false, "{calls}");
    assert!(text(&calls["shell"]).contains("from-mcp"), "{calls}");
    assert_eq!(calls["edit"]["isError"], false, "{calls}");
    assert_eq!(calls["missing"]["isError"], true, "{calls}");
    assert!(
        text(&calls["missing"]).contains("no/such/file.txt"),
        "{calls}"
    );
    assert_eq!(calls["missing"]["_meta"]["toolexec/status"], "error");

    // What the calls did is in the workspace, through the REST API.
    let notes = app
        .get(&format!("/v1/sessions/{sid}/files/notes.txt"))
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(notes, "goodbye world\n");
    let made = app
        .get(&format!("/v1/sessions/{sid}/files/made.txt"))
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(made, "from-mcp\n");

    // Each call is in the session's log once, under the call id its result names — a new one,
    // not the JSON-RPC id the SDK sent it with — and sending that call id again through the
    // REST API returns the recorded result and runs nothing.
    let sent = run["sent"].as_array().unwrap();
    assert_eq!(sent.len(), 4, "{run}");
    let events = app.events(sid).await;
    for (s, label) in sent.iter().zip(["read", "shell", "edit", "missing"]) {
        let invocation = calls[label]["_meta"]["toolexec/invocation_id"].clone();
        let started: Vec<&Value> = events
            .iter()
            .filter(|e| toolexec_tests::starts_call(e) && e["invocation_id"] == invocation)
            .collect();
        assert_eq!(started.len(), 1, "{label} in {events:#?}");
        assert_eq!(started[0]["data"]["name"], s["tool"]);
        let call_id = &started[0]["data"]["call_id"];
        assert_eq!(
            call_id, &calls[label]["_meta"]["toolexec/call_id"],
            "{label}"
        );
        assert_ne!(call_id, &json!(rpc_id_text(&s["id"])), "{label}");
    }
    let shell_id = calls["shell"]["_meta"]["toolexec/call_id"]
        .as_str()
        .unwrap();
    let again = app
        .call(
            sid,
            shell_id,
            "shell",
            json!({"command": "echo from-mcp > made.txt; cat made.txt"}),
        )
        .await;
    assert_eq!(
        again["invocation_id"],
        calls["shell"]["_meta"]["toolexec/invocation_id"]
    );
    let after = app.events(sid).await;
    assert_eq!(after.len(), events.len(), "a retry runs nothing");
}

/// A JSON-RPC id as the text a call id would have been: a number in decimal, a string as it is.
fn rpc_id_text(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdk_drives_a_session_in_the_2025_11_25_lifecycle() {
    let app = spawn_app().await;
    let sid = session(&app).await;
    let run = python_client(
        &app.url(&format!("/v1/sessions/{sid}/mcp")),
        "handshake",
        None,
    )
    .await;
    assert_eq!(run["version"], "2025-11-25", "{run}");
    check_a_python_client_run(&app, &sid, &run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdk_drives_a_session_in_the_stateless_2026_07_28_lifecycle() {
    // With API keys: the SDK sends the key as any REST client does.
    let app = spawn_sqlite_app().await;
    let key = api_key(&app, "alice").await;
    let mut app = app.restart().await;
    let mut auth = reqwest::header::HeaderMap::new();
    auth.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {key}").parse().unwrap(),
    );
    app.http = reqwest::Client::builder()
        .default_headers(auth)
        .build()
        .unwrap();
    let sid = session(&app).await;
    let url = app.url(&format!("/v1/sessions/{sid}/mcp"));
    let run = python_client(&url, "discover", Some(&key)).await;
    assert_eq!(run["version"], "2026-07-28", "{run}");
    check_a_python_client_run(&app, &sid, &run).await;
}

#[tokio::test]
async fn initialize_negotiates_the_clients_version_or_offers_the_servers_latest() {
    let app = spawn_sqlite_app().await;
    let sid = session(&app).await;
    for (asked, answered) in [
        ("2025-11-25", "2025-11-25"),
        ("2025-06-18", "2025-06-18"),
        ("2024-11-05", "2024-11-05"),
        // An unknown version: the server answers with the latest it supports with a handshake.
        ("2099-01-01", "2025-11-25"),
    ] {
        let (status, body) = send(rpc(&app, &sid), &initialize(asked)).await;
        assert_eq!(status, 200, "{asked}: {body}");
        assert_eq!(
            body["result"]["protocolVersion"], answered,
            "{asked}: {body}"
        );
        assert_eq!(body["result"]["serverInfo"]["name"], "toolexec");
        assert!(
            body["result"]["capabilities"]["tools"].is_object(),
            "{body}"
        );
    }
    // 2026-07-28: server/discover lists the versions served.
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {}});
    let (status, body) = send(
        rpc(&app, &sid)
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "server/discover"),
        &json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": meta}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let versions = body["result"]["supportedVersions"].to_string();
    assert!(
        versions.contains("2026-07-28") && versions.contains("2025-11-25"),
        "{body}"
    );
    // A 2026-07-28 tools/list without `initialize` carries its version in `_meta`.
    let (status, body) = send(
        rpc(&app, &sid)
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/list"),
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {"_meta": meta}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["resultType"], "complete", "{body}");
    assert!(body["result"]["tools"].as_array().unwrap().len() > 5);
}

#[tokio::test]
async fn tools_list_shows_only_the_sessions_allowed_tools_and_shell_is_open_world_with_network() {
    let app = spawn_sqlite_app().await;
    let sid = app
        .session(json!({"tools": ["read_file", "shell"], "policy": {"network": "allow"}}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, body) = send(
        rpc(&app, &sid).header("mcp-protocol-version", "2025-11-25"),
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let tools = body["result"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["read_file", "shell"], "{body}");
    assert_eq!(tools[1]["annotations"]["openWorldHint"], true);
    assert_eq!(tools[0]["annotations"]["openWorldHint"], false);
    // A tool outside the allow-list is refused like over REST, and recorded.
    let (_, body) = send(
        rpc(&app, &sid).header("mcp-protocol-version", "2025-11-25"),
        &tool_call(json!(2), "glob", json!({"pattern": "*"})),
    )
    .await;
    assert_eq!(body["result"]["isError"], true, "{body}");
    assert_eq!(
        body["result"]["_meta"]["toolexec/status"], "denied",
        "{body}"
    );
}

/// The events that start a call of a session with the given call id (its `invocation.started`,
/// or a read's one `invocation.finished`).
fn started_with<'a>(events: &'a [Value], call_id: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| toolexec_tests::starts_call(e) && e["data"]["call_id"] == call_id)
        .collect()
}

#[tokio::test]
async fn a_repeated_request_id_runs_a_new_call_and_a_named_call_id_is_idempotent() {
    let app = spawn_sqlite_app().await;
    let sid = session(&app).await;
    // The same JSON-RPC id twice, as two clients (or one that reconnected) send it: two calls,
    // each run and recorded under a call id of its own.
    let stamp = tool_call(json!(2), "shell", json!({"command": "date +%s%N"}));
    let (status, first) = send(rpc(&app, &sid), &stamp).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["result"]["isError"], false, "{first}");
    let (_, second) = send(rpc(&app, &sid), &stamp).await;
    assert_eq!(second["result"]["isError"], false, "{second}");
    assert_ne!(
        first["result"]["content"], second["result"]["content"],
        "the command ran twice"
    );
    let meta = |v: &Value, k: &str| v["result"]["_meta"][k].clone();
    assert_ne!(
        meta(&first, "toolexec/invocation_id"),
        meta(&second, "toolexec/invocation_id")
    );
    let events = app.events(&sid).await;
    let shells: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "invocation.started" && e["data"]["name"] == "shell")
        .collect();
    assert_eq!(shells.len(), 2, "{events:#?}");
    assert!(
        started_with(&events, "2").is_empty(),
        "no call is named by its request id"
    );
    for (r, e) in [&first, &second].iter().zip(&shells) {
        assert_eq!(e["data"]["call_id"], meta(r, "toolexec/call_id"));
    }
    // Another request id with other arguments is not refused either.
    let (_, other) = send(
        rpc(&app, &sid),
        &tool_call(
            json!(2),
            "write_file",
            json!({"file_path": "a.txt", "content": "1"}),
        ),
    )
    .await;
    assert_eq!(other["result"]["isError"], false, "{other}");

    // `_meta` names the call: the same name again returns the recorded result and runs nothing,
    // whatever the request id; with other arguments it is refused.
    let named = |id: Value, key: &str, command: &str| {
        let mut c = tool_call(id, "shell", json!({"command": command}));
        c["params"]["_meta"] = json!({key: "toolu_07"});
        c
    };
    let (_, first) = send(
        rpc(&app, &sid),
        &named(json!(5), "dev.toolexec/call_id", "date +%s%N"),
    )
    .await;
    assert_eq!(first["result"]["isError"], false, "{first}");
    assert_eq!(meta(&first, "toolexec/call_id"), "toolu_07");
    let events = app.events(&sid).await.len();
    for (id, key) in [
        (json!(5), "dev.toolexec/call_id"),
        (json!("other"), "dev.toolexec/call_id"),
        (json!(6), "toolexec/call_id"),
    ] {
        let (_, again) = send(rpc(&app, &sid), &named(id, key, "date +%s%N")).await;
        assert_eq!(again["result"], first["result"], "{key}");
    }
    assert_eq!(
        app.events(&sid).await.len(),
        events,
        "the retries ran nothing"
    );
    let (_, body) = send(
        rpc(&app, &sid),
        &named(json!(7), "dev.toolexec/call_id", "echo other"),
    )
    .await;
    assert_eq!(body["id"], 7, "{body}");
    assert_eq!(body["error"]["code"], -32600, "{body}");
    assert_eq!(body["error"]["data"]["code"], "call_id_reused", "{body}");
    assert_eq!(body["error"]["data"]["call_id"], "toolu_07", "{body}");
    assert_eq!(started_with(&app.events(&sid).await, "toolu_07").len(), 1);
    // A call id that is not a string is the client's mistake, not a call.
    let mut bad = tool_call(json!(8), "shell", json!({"command": "true"}));
    bad["params"]["_meta"] = json!({"dev.toolexec/call_id": 42});
    let (_, body) = send(rpc(&app, &sid), &bad).await;
    assert_eq!(body["error"]["code"], -32602, "{body}");
    // Invalid arguments are the tool's failure, told to the model, not a protocol error.
    let (_, body) = send(
        rpc(&app, &sid),
        &tool_call(json!(9), "read_file", json!({"limit": 0})),
    )
    .await;
    assert_eq!(body["result"]["isError"], true, "{body}");
    assert_eq!(
        body["result"]["_meta"]["toolexec/status"],
        "invalid_arguments"
    );
    // A closed session: named calls still answer, new ones are refused with its problem code.
    assert_eq!(
        app.delete(&format!("/v1/sessions/{sid}")).await.status(),
        200
    );
    let (_, again) = send(
        rpc(&app, &sid),
        &named(json!(10), "dev.toolexec/call_id", "date +%s%N"),
    )
    .await;
    assert_eq!(again["result"], first["result"]);
    let new = tool_call(json!(11), "read_file", json!({"file_path": "a.txt"}));
    let (_, body) = send(rpc(&app, &sid), &new).await;
    assert_eq!(body["error"]["data"]["code"], "session_closed", "{body}");
}

#[tokio::test]
async fn malformed_json_rpc_gets_json_rpc_errors_and_unknown_methods_are_not_found() {
    let app = spawn_sqlite_app().await;
    let sid = session(&app).await;
    let raw = |body: &'static str| rpc(&app, &sid).body(body);
    for (body, code) in [
        ("{not json", -32700),
        ("[]", -32600),
        (r#"{"jsonrpc":"2.0","id":3}"#, -32600),
        (r#"{"jsonrpc":"1.0","id":3,"method":"tools/list"}"#, -32600),
    ] {
        let resp = raw(body).send().await.unwrap();
        assert_eq!(resp.status(), 400, "{body}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], code, "{body}: {v}");
        assert_eq!(v["jsonrpc"], "2.0");
    }
    let (_, v) = send(
        rpc(&app, &sid).header("mcp-protocol-version", "2025-11-25"),
        &json!({"jsonrpc": "2.0", "id": 4, "method": "no/such/method"}),
    )
    .await;
    assert_eq!(v["error"]["code"], -32601, "{v}");
    // A body over the API's limit is refused before it is read.
    let app = spawn_sqlite_app_with(|c| c.body_limit_bytes = 1024).await;
    let sid = session(&app).await;
    let big = tool_call(
        json!(1),
        "write_file",
        json!({"file_path": "b", "content": "x".repeat(4096)}),
    );
    let (status, body) = send(rpc(&app, &sid), &big).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["code"], "body_too_large");
}

#[tokio::test]
async fn get_and_delete_are_405_for_the_stateless_endpoint() {
    let app = spawn_sqlite_app().await;
    let sid = session(&app).await;
    for method in ["GET", "DELETE"] {
        let resp = app
            .http
            .request(
                method.parse().unwrap(),
                app.url(&format!("/v1/sessions/{sid}/mcp")),
            )
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 405, "{method}");
        assert_eq!(resp.headers()["allow"], "POST");
    }
}

#[tokio::test]
async fn browser_origins_and_hosts_off_the_allow_lists_are_refused() {
    let app = spawn_sqlite_app_with(|c| {
        c.allowed_origins = vec!["https://agent.example.com".into()];
    })
    .await;
    let sid = session(&app).await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let (status, body) = send(
        rpc(&app, &sid).header("origin", "https://evil.example"),
        &list,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "forbidden");
    let (status, body) = send(
        rpc(&app, &sid).header("origin", "https://agent.example.com"),
        &list,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // A DNS-rebinding page: its own name pointed at the service.
    let (status, body) = send(rpc(&app, &sid).header("host", "rebind.example:80"), &list).await;
    assert_eq!(status, 403, "{body}");

    // Behind a gateway: the names clients use, added by `allowed_hosts` (the loopback names
    // stay: a page cannot make a browser send them).
    let app = spawn_sqlite_app_with(|c| c.allowed_hosts = vec!["tools.example.com".into()]).await;
    let sid = session(&app).await;
    let (status, _) = send(rpc(&app, &sid).header("host", "tools.example.com"), &list).await;
    assert_eq!(status, 200);
    let (status, _) = send(rpc(&app, &sid), &list).await;
    assert_eq!(status, 200, "127.0.0.1 is still its own address");
    let (status, _) = send(rpc(&app, &sid).header("host", "rebind.example"), &list).await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn mcp_needs_the_same_api_key_as_rest_and_another_tenants_session_is_not_found() {
    let app = spawn_app().await;
    let keys = [api_key(&app, "alice").await, api_key(&app, "bob").await];
    let app = app.restart().await;
    let (alice, bob) = (&keys[0], &keys[1]);
    let sid = app
        .http
        .post(app.url("/v1/sessions"))
        .bearer_auth(alice)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let (status, body) = send(rpc(&app, &sid), &list).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["code"], "unauthorized");
    let (status, body) = send(rpc(&app, &sid).bearer_auth(bob), &list).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["code"], "not_found");
    let (status, body) = send(rpc(&app, &sid).bearer_auth("tx_wrong"), &list).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = send(rpc(&app, &sid).bearer_auth(alice), &list).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = send(
        rpc(&app, &uuid::Uuid::now_v7().to_string()).bearer_auth(alice),
        &list,
    )
    .await;
    assert_eq!(status, 404);
}

/// Runs tests/node/mcp_client.mjs (`mode`: `basic` or `stamp`) and returns what it printed.
async fn node_client(url: &str, mode: &str) -> Value {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("node");
    let run = tokio::process::Command::new("node")
        .arg(dir.join("mcp_client.mjs"))
        .arg(url)
        .arg(mode)
        .current_dir(&dir)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .expect("the MCP client finished within 90 s")
        .expect("node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the MCP TypeScript SDK failed (needs `npm ci` in tests/node; .ci/run runs it):\n{stdout}\n{stderr}"
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

#[tokio::test]
async fn the_official_typescript_sdk_lists_and_calls_a_sessions_tools() {
    let app = spawn_sqlite_app().await;
    let sid = session(&app).await;
    let run = node_client(&app.url(&format!("/v1/sessions/{sid}/mcp")), "basic").await;
    assert_eq!(run["version"], "2025-11-25", "{run}");
    let read_file = run["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "read_file")
        .unwrap();
    assert_eq!(read_file["annotations"]["readOnlyHint"], true);
    assert_eq!(run["calls"]["read"]["isError"], false, "{run}");
    assert!(
        run["calls"]["read"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("hello world")
    );
    assert_eq!(run["calls"]["missing"]["isError"], true, "{run}");
    let events = app.events(&sid).await;
    for label in ["read", "missing"] {
        let call_id = run["calls"][label]["_meta"]["toolexec/call_id"]
            .as_str()
            .unwrap();
        assert_eq!(
            started_with(&events, call_id).len(),
            1,
            "{label} in the log"
        );
    }
    assert_eq!(run["sent"].as_array().unwrap().len(), 2);
}

/// The output of a `date +%s%N` call's result (the line after `--- stdout ---`).
fn stamp_of(result: &Value) -> String {
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    text.split("--- stdout ---\n")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .unwrap_or_else(|| panic!("no stdout in {result}"))
        .to_owned()
}

/// Two MCP clients one after the other on one session — the Python SDK, then the TypeScript
/// SDK — as when the Inspector is run twice or an agent reconnects: each counts its JSON-RPC
/// ids from 0, so their ids collide, and each call still runs (a command whose output changes
/// gives two outputs and two invocations). A call named by `_meta` is idempotent: repeated, it
/// returns the recorded result without running; with other arguments it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sdk_clients_on_one_session_each_run_their_calls_though_their_request_ids_collide() {
    let app = spawn_app().await;
    let sid = session(&app).await;
    let url = app.url(&format!("/v1/sessions/{sid}/mcp"));
    let py = python_client(&url, "stamp", None).await;
    let ts = node_client(&url, "stamp").await;

    // The ids collide: each SDK counts from 0 on its connection (the Python SDK's first
    // tools/call may come an id or two later than the TypeScript SDK's).
    let ids = |run: &Value| -> Vec<String> {
        run["sent"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| rpc_id_text(&s["id"]))
            .collect()
    };
    const STAMPS: [&str; 3] = ["stamp_1", "stamp_2", "stamp_3"];
    let (py_ids, ts_ids) = (ids(&py), ids(&ts));
    assert_eq!(py_ids.len(), 6, "{py}");
    assert_eq!(ts_ids.len(), 6, "{ts}");
    let collide = py_ids[..3].iter().any(|i| ts_ids[..3].contains(i));
    assert!(
        collide,
        "the stamp calls of the two clients share JSON-RPC ids: {py_ids:?} {ts_ids:?}"
    );

    // Every stamp call ran: six outputs, six invocations, six call ids of the service's.
    let events = app.events(&sid).await;
    let mut stamps = std::collections::HashSet::new();
    let mut invocations = std::collections::HashSet::new();
    for run in [&py, &ts] {
        for label in STAMPS {
            let stamp = &run["calls"][label];
            assert_eq!(stamp["isError"], false, "{run}");
            stamps.insert(stamp_of(stamp));
            invocations.insert(stamp["_meta"]["toolexec/invocation_id"].to_string());
        }
    }
    assert_eq!(stamps.len(), 6, "every call ran: {stamps:?}");
    assert_eq!(invocations.len(), 6);
    for run in [&py, &ts] {
        for label in STAMPS {
            let call_id = run["calls"][label]["_meta"]["toolexec/call_id"].as_str();
            let call_id = call_id.unwrap_or_else(|| panic!("{label}: no call id in {run}"));
            assert!(call_id.starts_with("mcp-"), "{call_id}");
            assert_eq!(started_with(&events, call_id).len(), 1, "{call_id}");
        }
    }
    let unnamed = events
        .iter()
        .filter(|e| {
            e["kind"] == "invocation.started"
                && e["data"]["arguments"]["command"] == "date +%s%N"
                && e["data"]["call_id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("mcp-"))
        })
        .count();
    assert_eq!(unnamed, 6, "six invocations of the stamp call: {events:#?}");

    // The named call (each SDK under its own id and `_meta` key): run once, the repeat gets the
    // recorded result, other arguments under the same id are refused.
    for (run, name) in [(&py, "py-stamp-1"), (&ts, "ts-stamp-1")] {
        let calls = &run["calls"];
        assert_eq!(calls["named"]["isError"], false, "{run}");
        assert_eq!(calls["named"]["_meta"]["toolexec/call_id"], name);
        assert_eq!(
            calls["named_again"], calls["named"],
            "{name}: the recorded result"
        );
        assert_eq!(stamp_of(&calls["named_again"]), stamp_of(&calls["named"]));
        assert_eq!(started_with(&events, name).len(), 1, "{name} ran once");
        let refused = &calls["named_other"]["error"];
        assert_eq!(refused["code"], -32600, "{name}: {run}");
        assert_eq!(refused["data"]["code"], "call_id_reused", "{name}: {run}");
    }
    assert!(
        !events
            .iter()
            .any(|e| e["data"]["arguments"]["command"] == "echo other"),
        "the refused call did not run"
    );
}

/// The living terminals over MCP: listed like every tool, and a running terminal's id is in
/// the result text a client reads, for its next write_stdin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminals_are_listed_and_a_running_ones_id_is_in_the_result_text() {
    let app = spawn_app().await;
    let sid = session(&app).await;
    let (_, listed) = send(
        rpc(&app, &sid),
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    )
    .await;
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    for name in ["bash", "exec_command", "write_stdin"] {
        assert!(names.contains(&name), "{name}: {names:?}");
    }
    let (_, r) = send(
        rpc(&app, &sid),
        &tool_call(
            json!(2),
            "exec_command",
            json!({"cmd": "cat", "tty": true, "yield_time_ms": 300}),
        ),
    )
    .await;
    let text = r["result"]["content"][0]["text"].as_str().unwrap();
    let id: u32 = text
        .lines()
        .find_map(|l| l.strip_prefix("Process running with session ID "))
        .unwrap_or_else(|| panic!("{r}"))
        .parse()
        .unwrap();
    let (_, r) = send(
        rpc(&app, &sid),
        &tool_call(
            json!(3),
            "write_stdin",
            json!({"session_id": id, "chars": "ping\n", "yield_time_ms": 500}),
        ),
    )
    .await;
    let text = r["result"]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("ping"), "{r}");
    let (_, r) = send(
        rpc(&app, &sid),
        &tool_call(json!(4), "bash", json!({"command": "cd /tmp; pwd"})),
    )
    .await;
    assert_eq!(r["result"]["content"][0]["text"], "/tmp\n", "{r}");
}
