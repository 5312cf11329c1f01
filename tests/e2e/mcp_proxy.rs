//! MCP proxy tools (`[[tools.mcp]]`) against a real upstream MCP server on loopback (the
//! official Rust SDK's Streamable HTTP server, in this process, behind a bearer-token check):
//! the upstream's allow-listed tools listed as `<server>__<tool>` in every dialect, called over
//! HTTP and forwarded, recorded with their results, the token nowhere in the record, a verify
//! replay served from the record, and an upstream that goes down failing only the call made
//! while it is down.
#![allow(
    clippy::disallowed_methods,
    reason = "the test writes the operator's config file on the host"
)]
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};
use toolexec_tests::app::{Backend, TestApp};
use toolexec_tools::operator::mcp_proxy::McpToolsConfig;

const TOKEN: &str = "mcp-token-77ab10";

#[derive(Clone)]
struct Upstream;

fn schema(v: Value) -> Arc<serde_json::Map<String, Value>> {
    Arc::new(v.as_object().unwrap().clone())
}

impl ServerHandler for Upstream {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tool = |name: &'static str, description: &'static str, s: Value| {
            Tool::new(name, description, schema(s))
        };
        Ok(ListToolsResult::with_all_items(vec![
            tool(
                "echo",
                "Echoes the text.",
                json!({"type": "object", "properties": {"text": {"type": "string"}, "shout": {"type": "boolean"}}, "required": ["text"]}),
            )
            .with_annotations(ToolAnnotations::new().read_only(true)),
            tool(
                "get.weather",
                "The weather in a city.",
                json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                       "properties": {"city": {"type": "string"}, "unit": {"$ref": "#/$defs/Unit"}},
                       "required": ["city"], "$defs": {"Unit": {"type": "string", "enum": ["c", "f"]}}}),
            ),
            tool("fail", "Always fails.", json!({"type": "object"})),
            tool("whoami", "Repeats the Authorization header.", json!({"type": "object"})),
            tool("admin_reset", "Not for models.", json!({"type": "object"})),
            tool(
                "slow_write",
                "Changes something, slowly.",
                json!({"type": "object"}),
            ),
            // Schemas that must neither crash nor hang the start: an allOf that comes back to
            // itself, and 7 levels of 20 properties each referring to the next (~10^9 nodes).
            tool(
                "loop",
                "Refers to itself.",
                json!({"allOf": [{"$ref": "#/$defs/A"}], "$defs": {"A": {"allOf": [{"$ref": "#/$defs/A"}]}}}),
            ),
            tool("bomb", "Expands forever.", bomb()),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::Object(request.arguments.unwrap_or_default());
        let result = match request.name.as_ref() {
            "echo" => {
                let text = args["text"].as_str().unwrap_or("").to_owned();
                let text = if args["shout"] == true {
                    text.to_uppercase()
                } else {
                    text
                };
                CallToolResult::success(vec![ContentBlock::text(format!("{text} (args {args})"))])
            }
            "get.weather" => {
                let mut r = CallToolResult::success(vec![]);
                r.structured_content = Some(json!({"city": args["city"], "temp": 21}));
                r
            }
            "fail" => {
                CallToolResult::error(vec![ContentBlock::text("the upstream failed on purpose")])
            }
            "whoami" => {
                let auth = context
                    .extensions
                    .get::<axum::http::request::Parts>()
                    .and_then(|p| p.headers.get("authorization"))
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                CallToolResult::success(vec![ContentBlock::text(format!("you sent {auth}"))])
            }
            "admin_reset" => panic!("admin_reset must never be called through the proxy"),
            "slow_write" => {
                tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
                CallToolResult::success(vec![ContentBlock::text("written")])
            }
            other => return Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        };
        Ok(result.into())
    }
}

/// 7 levels of 20 properties, each referring to the next level.
fn bomb() -> Value {
    let mut defs = serde_json::Map::new();
    for level in 0..7 {
        let next = if level == 6 {
            json!({"type": "string"})
        } else {
            json!({"$ref": format!("#/$defs/L{}", level + 1)})
        };
        let props: serde_json::Map<String, Value> =
            (0..20).map(|i| (format!("p{i}"), next.clone())).collect();
        defs.insert(
            format!("L{level}"),
            json!({"type": "object", "properties": props}),
        );
    }
    json!({"$ref": "#/$defs/L0", "$defs": defs})
}

/// The upstream on 127.0.0.1: its URL, its request count, and its task (abort it to take it
/// down). Requests without the bearer token get 401.
async fn upstream() -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let service: StreamableHttpService<Upstream, LocalSessionManager> = StreamableHttpService::new(
        || Ok(Upstream),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let hits = Arc::new(AtomicUsize::new(0));
    let count = hits.clone();
    let app = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let count = count.clone();
                async move {
                    count.fetch_add(1, Ordering::SeqCst);
                    let ok = req
                        .headers()
                        .get("authorization")
                        .is_some_and(|v| v == format!("Bearer {TOKEN}").as_str());
                    if !ok {
                        return axum::http::StatusCode::UNAUTHORIZED.into_response();
                    }
                    next.run(req).await
                }
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://127.0.0.1:{port}/mcp"), hits, task)
}

use axum::response::IntoResponse;

fn entry(url: &str) -> McpToolsConfig {
    McpToolsConfig {
        name: "up".into(),
        url: url.into(),
        bearer_token: Some(TOKEN.into()),
        bearer_token_env: None,
        tools: Some(vec![
            "echo".into(),
            "get.weather".into(),
            "fail".into(),
            "whoami".into(),
        ]),
        allow_cidrs: vec!["127.0.0.1/32".into()],
        timeout_ms: Some(5_000),
    }
}

async fn recorded(app: &TestApp, sid: &str, results: &[Value]) -> String {
    let mut all = serde_json::to_string(&app.events(sid).await).unwrap();
    for r in results {
        all.push_str(&app.invocation_of(r).await.to_string());
    }
    all
}

toolexec_tests::on_both_stores!(
    an_upstream_mcp_servers_tools_are_proxied_recorded_and_replayed_without_the_token,
);

async fn an_upstream_mcp_servers_tools_are_proxied_recorded_and_replayed_without_the_token(
    backend: Backend,
) {
    let (url, hits, task) = upstream().await;
    let app = backend
        .spawn_with(|c| c.tools.mcp = vec![entry(&url)])
        .await;

    // Listed as <server>__<tool>, sanitized, only the allow-listed ones, strict in every dialect.
    let catalog: Value = app.get("/v1/tools").await.json().await.unwrap();
    let ours: Vec<&Value> = catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"].as_str().unwrap().starts_with("up__"))
        .collect();
    let names: Vec<&str> = ours.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["up__echo", "up__fail", "up__get_weather", "up__whoami"]
    );
    assert_eq!(ours[0]["read_only"], true);
    assert_eq!(ours[0]["capabilities"], json!(["network"]));
    assert_eq!(
        ours[2]["input_schema"]["properties"]["unit"]["enum"],
        json!(["c", "f", null]),
        "{}",
        ours[2]
    );
    let mcp = crate::dialects::strict_tools_named(&app, "up__").await;
    let echo = mcp.iter().find(|t| t["name"] == "up__echo").unwrap();
    assert_eq!(echo["annotations"]["openWorldHint"], true, "{echo}");
    assert_eq!(echo["annotations"]["readOnlyHint"], true, "{echo}");

    let sid = app.session(json!({"policy": {"network": "allow"}})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let results = app
        .calls(
            &sid,
            json!([
                // A strict model's null for "not given" is not forwarded.
                {"id": "e1", "name": "up__echo", "arguments": {"text": "hi", "shout": null}},
                {"id": "e2", "name": "up__echo", "arguments": {"text": "hi", "shout": true}},
                {"id": "w", "name": "up__get_weather", "arguments": {"city": "Oslo", "unit": null}},
                {"id": "f", "name": "up__fail", "arguments": {}},
                {"id": "who", "name": "up__whoami", "arguments": {}},
                {"id": "bad", "name": "up__echo", "arguments": {"text": 7}},
            ]),
        )
        .await;
    assert_eq!(results[0]["status"], "ok", "{results:#?}");
    assert_eq!(
        results[0]["content"], r#"hi (args {"text":"hi"})"#,
        "{results:#?}"
    );
    assert!(results[1]["content"].as_str().unwrap().starts_with("HI"));
    assert_eq!(results[2]["status"], "ok", "{results:#?}");
    assert_eq!(results[2]["content"], r#"{"city":"Oslo","temp":21}"#);
    assert_eq!(results[3]["status"], "error");
    assert_eq!(results[3]["content"], "the upstream failed on purpose");
    assert_eq!(
        results[4]["status"], "ok",
        "the token was sent: {results:#?}"
    );
    assert_eq!(results[4]["content"], "you sent Bearer ***");
    assert_eq!(results[5]["status"], "invalid_arguments");

    // Recorded like any call, with the upstream's whole result as the exchange's body.
    let events = app.events(&sid).await;
    let exchanges: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "web.exchange" && e["data"]["role"] == "mcp")
        .collect();
    assert_eq!(exchanges.len(), 5, "{exchanges:#?}");
    assert!(
        exchanges
            .iter()
            .any(|e| e["data"]["service"] == "up/get.weather" && e["data"]["body_stored"] == true),
        "{exchanges:#?}"
    );
    let inv = app.invocation_of(&results[2]).await;
    assert_eq!(inv["capabilities"], json!(["network"]));
    assert_eq!(inv["arguments"]["city"], "Oslo");
    let all = recorded(&app, &sid, &results).await;
    assert!(all.contains("Bearer ***"));
    assert!(!all.contains(TOKEN), "the token leaked into the record");
    assert!(
        !app.get("/v1/tools")
            .await
            .text()
            .await
            .unwrap()
            .contains(TOKEN)
    );

    // A verify replay is served from the record: no request upstream, nothing diverges.
    let before = hits.load(Ordering::SeqCst);
    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/replay"),
            &json!({"mode": "verify"}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let replay: Value = resp.json().await.unwrap();
    assert_eq!(replay["status"], "finished", "{replay:#}");
    assert_eq!(replay["calls_diverged"], 0, "{replay:#}");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        before,
        "the replay called upstream"
    );

    // The upstream goes down: the call made then fails with a clear error, bounded in time,
    // and the session goes on.
    task.abort();
    let _ = task.await;
    let started = std::time::Instant::now();
    let results = app
        .calls(
            &sid,
            json!([
                {"id": "down", "name": "up__echo", "arguments": {"text": "anyone?"}},
                {"id": "after", "name": "write_file", "arguments": {"file_path": "a.txt", "content": "ok\n"}},
            ]),
        )
        .await;
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!(results[0]["status"], "error", "{results:#?}");
    let text = results[0]["content"].as_str().unwrap();
    assert!(
        text.contains("Cannot call up__echo: the MCP server could not be reached")
            && text.contains("may be down"),
        "{text}"
    );
    assert!(!text.contains(TOKEN));
    assert_eq!(results[1]["status"], "ok", "{results:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_is_down_or_on_loopback_without_an_allow_list_stops_the_start() {
    let (url, hits, task) = upstream().await;
    let data = toolexec_tests::app::data_dir();
    let mut config = toolexec_server::Config {
        bind: "127.0.0.1:0".into(),
        data_dir: data.path().to_owned(),
        ..Default::default()
    };
    // The default policy refuses loopback.
    let mut e = entry(&url);
    e.allow_cidrs.clear();
    config.tools.mcp = vec![e];
    let err = toolexec_server::build_state(&config)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("tools.mcp \"up\": url") && err.contains("(loopback"),
        "{err}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0, "nothing was sent");
    // An allow-list entry the server does not list.
    let mut e = entry(&url);
    e.tools = Some(vec!["nope".into()]);
    config.tools.mcp = vec![e];
    let err = toolexec_server::build_state(&config)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("\"nope\", which the server does not list"),
        "{err}"
    );
    // Down at start-up: the start fails and says so.
    task.abort();
    let _ = task.await;
    config.tools.mcp = vec![entry(&url)];
    let err = toolexec_server::build_state(&config)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("must be up when the service starts"), "{err}");
    assert!(!err.contains(TOKEN), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_takes_an_mcp_entry_from_its_config_file_and_the_token_from_the_environment() {
    use toolexec_tests::binary::{serve, toolexec};
    let (url, _hits, _task) = upstream().await;
    let data = toolexec_tests::app::data_dir();
    let file = data.path().join("toolexec.toml");
    std::fs::write(
        &file,
        format!(
            "bind = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nlog_format = \"json\"\n\n\
             [[tools.mcp]]\nname = \"up\"\nurl = \"{url}\"\nbearer_token_env = \"UP_MCP_TOKEN\"\n\
             tools = [\"whoami\", \"echo\"]\nallow_cidrs = [\"127.0.0.1/32\"]\n",
            data.path().display()
        ),
    )
    .unwrap();
    let mut cmd = toolexec(data.path());
    cmd.args(["--config", file.to_str().unwrap(), "serve"])
        .env("UP_MCP_TOKEN", TOKEN);
    let served = serve(cmd);
    let http = reqwest::Client::new();
    let session: Value = http
        .post(format!("{}/v1/sessions", served.base))
        .json(&json!({"policy": {"network": "allow"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sid = session["id"].as_str().unwrap();
    let body: Value = http
        .post(format!("{}/v1/sessions/{sid}/calls", served.base))
        .json(&json!({"calls": [{"id": "w", "name": "up__whoami", "arguments": {}}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // The upstream answers only the right token: it came from UP_MCP_TOKEN.
    assert_eq!(body["results"][0]["status"], "ok", "{body}");
    assert_eq!(body["results"][0]["content"], "you sent Bearer ***");
    assert!(!served.log.iter().any(|l| l.to_string().contains(TOKEN)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_tool_whose_schema_cannot_be_converted_is_left_out_and_the_start_goes_on() {
    let (url, _hits, _task) = upstream().await;
    let net = toolexec_tools::operator::LoadNet {
        egress_allow: vec![],
        resolver: Arc::new(toolexec_net::StaticResolver::new()),
    };
    let mut e = entry(&url);
    e.tools = None;
    let started = std::time::Instant::now();
    let tools = toolexec_tools::operator::mcp_proxy::load(&e, &mut Default::default(), &net)
        .await
        .unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let names: Vec<&str> = tools.iter().map(|t| t.spec().name.as_str()).collect();
    assert!(names.contains(&"up__echo"), "{names:?}");
    assert!(
        !names.contains(&"up__loop") && !names.contains(&"up__bomb"),
        "{names:?}"
    );
    // Named by the operator, such a tool stops the start with the reason.
    for (name, says) in [("loop", "refers to itself"), ("bomb", "schema nodes")] {
        e.tools = Some(vec![name.into()]);
        let err = toolexec_tools::operator::mcp_proxy::load(&e, &mut Default::default(), &net)
            .await
            .err()
            .unwrap();
        assert!(err.contains(says), "{name}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_sent_upstream_is_not_recorded_as_nothing_changed_when_its_time_runs_out() {
    let (url, _hits, _task) = upstream().await;
    let mut e = entry(&url);
    e.tools = Some(vec!["slow_write".into()]);
    let app = toolexec_tests::app::spawn_app_with(|c| {
        c.tools.mcp = vec![e];
        c.limits.tool_timeout_ms = 500;
    })
    .await;
    let sid = app.session(json!({"policy": {"network": "allow"}})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let results = app
        .calls(
            &sid,
            json!([{"id": "w", "name": "up__slow_write", "arguments": {}}]),
        )
        .await;
    let text = results[0]["content"].as_str().unwrap();
    assert_ne!(results[0]["status"], "ok", "{results:?}");
    assert!(
        text.contains("whether it took effect is unknown") && !text.contains("nothing was changed"),
        "{text}"
    );
}
