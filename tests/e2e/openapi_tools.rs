//! HTTP operation tools from an operator's OpenAPI document (`[[tools.openapi]]`), against a
//! real small API served on loopback (allowed for this API alone by the test configuration):
//! typed tools in every dialect, called over HTTP, recorded with their exchanges, the bearer
//! token nowhere in the record, path arguments kept inside their segment, a verify replay served
//! from the record, and the network policy refusing what is not allowed.
#![allow(
    clippy::disallowed_methods,
    reason = "the test writes the operator's OpenAPI document on the host"
)]
use std::sync::{Arc, Mutex};

use axum::extract::{Path, RawQuery, Request};
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use toolexec_tests::app::{Backend, spawn_app_with};
use toolexec_tools::operator::openapi::OpenApiToolsConfig;

pub const TOKEN: &str = "pets-token-4f1c9e";

/// The raw paths (and queries) the API was asked for, in order.
pub type Seen = Arc<Mutex<Vec<String>>>;

/// A small pet API on 127.0.0.1: its base URL (`…/api`) and what it was asked for.
/// `GET /api/whoami` echoes the `Authorization` header it got (401 without the right token);
/// `DELETE /api/admin` must never be reached.
pub async fn pet_api() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let api = axum::Router::new()
        .route(
            "/api/pets",
            axum::routing::get(|RawQuery(q): RawQuery| async move {
                axum::Json(json!({"pets": [{"id": "1", "name": "Rex"}], "query": q}))
            })
            .post(|body: axum::Json<Value>| async move {
                (StatusCode::CREATED, axum::Json(json!({"created": body.0})))
            }),
        )
        .route(
            "/api/pets/{pet_id}",
            axum::routing::get(|Path(id): Path<String>| async move {
                if id == "missing" {
                    return (
                        StatusCode::NOT_FOUND,
                        axum::Json(json!({"error": "no such pet"})),
                    );
                }
                (StatusCode::OK, axum::Json(json!({"id": id, "name": "Rex"})))
            }),
        )
        .route(
            "/api/whoami",
            axum::routing::get(|headers: HeaderMap| async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                let status = if auth == format!("Bearer {TOKEN}") {
                    StatusCode::OK
                } else {
                    StatusCode::UNAUTHORIZED
                };
                (status, axum::Json(json!({"you_sent": auth})))
            }),
        )
        .route(
            "/api/admin",
            axum::routing::delete(|| async { "everything deleted" }),
        )
        .layer(axum::middleware::from_fn(
            move |req: Request, next: axum::middleware::Next| {
                let log = log.clone();
                async move {
                    log.lock().unwrap().push(
                        req.uri()
                            .path_and_query()
                            .map(|p| p.to_string())
                            .unwrap_or_default(),
                    );
                    next.run(req).await
                }
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, api).await });
    (format!("http://127.0.0.1:{port}/api"), seen)
}

/// The API's OpenAPI 3.1 document.
pub fn pet_document() -> Value {
    json!({
        "openapi": "3.1.0",
        "info": {"title": "Pets", "version": "1.0.0"},
        "paths": {
            "/pets": {
                "get": {
                    "operationId": "listPets",
                    "summary": "List the pets.",
                    "parameters": [
                        {"name": "limit", "in": "query", "description": "How many at most.", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
                        {"name": "tag", "in": "query", "schema": {"type": "array", "items": {"type": "string"}}}
                    ]
                },
                "post": {
                    "operationId": "createPet",
                    "summary": "Add a pet.",
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewPet"}}}}
                }
            },
            "/pets/{petId}": {
                "get": {
                    "operationId": "getPet",
                    "summary": "One pet by id.",
                    "parameters": [{"name": "petId", "in": "path", "required": true, "schema": {"type": "string"}}]
                }
            },
            "/whoami": {"get": {"operationId": "whoami", "summary": "Who the API thinks the caller is."}},
            "/admin": {"delete": {"operationId": "deleteEverything", "summary": "Deletes every pet."}}
        },
        "components": {"schemas": {
            "NewPet": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "tag": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                    "kind": {"type": "string", "enum": ["cat", "dog"]},
                    "id": {"type": "string", "readOnly": true}
                }
            }
        }}
    })
}

/// The document written where the service reads it.
pub fn document_file(doc: &Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("pets.json"), doc.to_string()).unwrap();
    dir
}

pub fn pets_entry(base_url: &str, dir: &tempfile::TempDir) -> OpenApiToolsConfig {
    OpenApiToolsConfig {
        name: "pets".into(),
        spec: dir.path().join("pets.json"),
        base_url: base_url.into(),
        operations: vec![
            "listPets".into(),
            "createPet".into(),
            "getPet".into(),
            "whoami".into(),
        ],
        bearer_token: Some(TOKEN.into()),
        bearer_token_env: None,
        allow_cidrs: vec!["127.0.0.1/32".into()],
        timeout_ms: Some(10_000),
        max_response_bytes: None,
    }
}

toolexec_tests::on_both_stores!(
    openapi_operations_are_typed_tools_called_over_http_and_recorded_without_the_token,
);

async fn openapi_operations_are_typed_tools_called_over_http_and_recorded_without_the_token(
    backend: Backend,
) {
    let (base, seen) = pet_api().await;
    let dir = document_file(&pet_document());
    let entry = pets_entry(&base, &dir);
    let app = backend.spawn_with(|c| c.tools.openapi = vec![entry]).await;

    // Listed beside the built-ins: only the admitted operations, typed, strict in every dialect.
    let catalog: Value = app.get("/v1/tools").await.json().await.unwrap();
    let ours: Vec<&Value> = catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"].as_str().unwrap().starts_with("pets__"))
        .collect();
    let names: Vec<&str> = ours.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "pets__createPet",
            "pets__getPet",
            "pets__listPets",
            "pets__whoami"
        ],
        "deleteEverything is not admitted"
    );
    let get_pet = ours[1];
    assert_eq!(get_pet["input_schema"]["required"], json!(["petId"]));
    assert_eq!(get_pet["read_only"], true);
    assert_eq!(get_pet["capabilities"], json!(["network"]));
    assert!(
        get_pet["description"]
            .as_str()
            .unwrap()
            .contains("One pet by id."),
        "{get_pet}"
    );
    let create = ours[0];
    assert_eq!(create["read_only"], false);
    let body = &create["input_schema"]["properties"]["body"];
    assert_eq!(body["required"], json!(["name"]), "{body}");
    assert!(body["properties"].get("id").is_none(), "readOnly: {body}");
    let mcp = crate::dialects::strict_tools_named(&app, "pets__").await;
    let listed = mcp.iter().find(|t| t["name"] == "pets__createPet").unwrap();
    assert_eq!(listed["annotations"]["openWorldHint"], true, "{listed}");
    assert_eq!(listed["annotations"]["destructiveHint"], true, "{listed}");

    let sid = app.session(json!({"policy": {"network": "allow"}})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let results = app
        .calls(
            &sid,
            json!([
                {"id": "list", "name": "pets__listPets", "arguments": {"limit": 2, "tag": ["a b", "c"]}},
                // A strict model's nulls for "not given" are not sent.
                {"id": "list-nulls", "name": "pets__listPets", "arguments": {"limit": null, "tag": null}},
                {"id": "get", "name": "pets__getPet", "arguments": {"petId": "7"}},
                {"id": "missing", "name": "pets__getPet", "arguments": {"petId": "missing"}},
                {"id": "create", "name": "pets__createPet", "arguments": {"body": {"name": "Tom", "tag": null, "kind": "cat"}}},
                {"id": "who", "name": "pets__whoami", "arguments": {}},
                {"id": "bad", "name": "pets__listPets", "arguments": {"limit": 1000}},
            ]),
        )
        .await;
    let by_id = |id: &str| results.iter().find(|r| r["call_id"] == id).unwrap();
    let list = by_id("list");
    assert_eq!(list["status"], "ok", "{list}");
    let text = list["content"].as_str().unwrap();
    assert!(text.starts_with("HTTP 200 OK"), "{text}");
    assert!(
        text.contains(r#""query":"limit=2&tag=a+b&tag=c""#),
        "{text}"
    );
    let nulls = by_id("list-nulls");
    assert!(
        nulls["content"]
            .as_str()
            .unwrap()
            .contains(r#""query":null"#),
        "{nulls}"
    );
    assert_eq!(by_id("get")["status"], "ok");
    assert!(
        by_id("get")["content"]
            .as_str()
            .unwrap()
            .contains(r#""id":"7""#)
    );
    let missing = by_id("missing");
    assert_eq!(missing["status"], "error", "{missing}");
    let text = missing["content"].as_str().unwrap();
    assert!(
        text.contains("HTTP 404 Not Found") && text.contains("no such pet"),
        "{text}"
    );
    let created = by_id("create");
    assert_eq!(created["status"], "ok", "{created}");
    let text = created["content"].as_str().unwrap();
    assert!(text.starts_with("HTTP 201 Created"), "{text}");
    assert!(
        text.contains(r#""name":"Tom""#)
            && text.contains(r#""kind":"cat""#)
            && !text.contains("tag"),
        "the null tag was not sent: {text}"
    );
    // The API got the token and echoed it; the model sees it masked.
    let who = by_id("who");
    assert_eq!(who["status"], "ok", "the token was sent: {who}");
    assert!(
        who["content"]
            .as_str()
            .unwrap()
            .contains(r#""you_sent":"Bearer ***""#),
        "{who}"
    );
    // Validated against the typed schema before anything is sent.
    assert_eq!(by_id("bad")["status"], "invalid_arguments");

    // A path argument stays one segment: `/` and `..` are data, never structure.
    let escape = app
        .call(&sid, "esc", "pets__getPet", json!({"petId": "../admin"}))
        .await;
    assert_eq!(escape["status"], "ok", "{escape}");
    assert!(
        escape["content"]
            .as_str()
            .unwrap()
            .contains(r#""id":"../admin""#),
        "{escape}"
    );
    let slash = app
        .call(&sid, "slash", "pets__getPet", json!({"petId": "a/b?c#d"}))
        .await;
    assert!(
        slash["content"]
            .as_str()
            .unwrap()
            .contains(r#""id":"a/b?c#d""#),
        "{slash}"
    );
    for (i, dots) in ["..", "."].iter().enumerate() {
        let r = app
            .call(
                &sid,
                &format!("dots{i}"),
                "pets__getPet",
                json!({"petId": dots}),
            )
            .await;
        assert_eq!(r["status"], "invalid_arguments", "{r}");
        assert!(
            r["content"].as_str().unwrap().contains("change the path"),
            "{r}"
        );
    }
    let paths = seen.lock().unwrap().clone();
    assert!(
        paths.contains(&"/api/pets/..%2Fadmin".to_owned())
            && paths.contains(&"/api/pets/a%2Fb%3Fc%23d".to_owned()),
        "{paths:?}"
    );
    assert!(
        paths.iter().all(|p| !p.starts_with("/api/admin")),
        "nothing left its segment: {paths:?}"
    );

    // Recorded like any call: the invocation, its capability, the exchange (role api) with the
    // body as a blob.
    let events = app.events(&sid).await;
    let exchanges: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "web.exchange")
        .collect();
    assert!(
        exchanges.iter().any(|e| e["data"]["role"] == "api"
            && e["data"]["method"] == "POST"
            && e["data"]["status"] == 201
            && e["data"]["service"] == "pets"),
        "{exchanges:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "invocation.finished" && e["data"]["call_id"] == "create")
    );
    let inv = app.invocation_of(created).await;
    assert_eq!(inv["capabilities"], json!(["network"]), "{inv}");
    assert_eq!(inv["arguments"]["body"]["name"], "Tom", "{inv}");

    // The token is nowhere in what the service recorded or shows of this session.
    let mut recorded = serde_json::to_string(&events).unwrap();
    for r in &results {
        recorded.push_str(&app.invocation_of(r).await.to_string());
        let id = r["invocation_id"].as_str().unwrap();
        recorded.push_str(
            &app.get(&format!("/v1/invocations/{id}/output"))
                .await
                .text()
                .await
                .unwrap(),
        );
    }
    assert!(
        recorded.contains("Bearer ***"),
        "the echo is recorded masked"
    );
    assert!(
        !recorded.contains(TOKEN),
        "the token leaked into the record"
    );
    let catalog = app.get("/v1/tools").await.text().await.unwrap();
    assert!(!catalog.contains(TOKEN));

    // A verify replay is served from the record: the API is not called again (not even the
    // POST), and nothing diverges.
    let before = seen.lock().unwrap().len();
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
        seen.lock().unwrap().len(),
        before,
        "the replay called the API"
    );

    // A session without network access is refused, as web tools are.
    let quiet = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .call(&quiet, "n1", "pets__getPet", json!({"petId": "7"}))
        .await;
    assert_eq!(r["status"], "denied", "{r}");
    assert!(
        r["content"].as_str().unwrap().contains("policy.network"),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_host_outside_the_network_policy_stops_the_start() {
    let (base, seen) = pet_api().await;
    let dir = document_file(&pet_document());
    // The default policy: loopback is not allowed.
    let mut entry = pets_entry(&base, &dir);
    entry.allow_cidrs.clear();
    let data = toolexec_tests::app::data_dir();
    let config = toolexec_server::Config {
        bind: "127.0.0.1:0".into(),
        data_dir: data.path().to_owned(),
        tools: toolexec_tools::operator::custom::CustomToolsConfig {
            openapi: vec![entry.clone()],
            ..Default::default()
        },
        ..Default::default()
    };
    let err = toolexec_server::build_state(&config)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("tools.openapi \"pets\": base_url")
            && err.contains("not allowed by the network policy (loopback"),
        "{err}"
    );
    assert!(!err.contains(TOKEN), "{err}");
    // A private host, with only loopback allowed.
    let mut config = config;
    entry.allow_cidrs = vec!["127.0.0.1/32".into()];
    entry.base_url = "http://10.255.0.1/api".into();
    config.tools.openapi = vec![entry];
    let err = toolexec_server::build_state(&config)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("(private"), "{err}");
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_that_is_down_fails_only_that_call_with_a_clear_error() {
    // A port with nothing listening on it.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = document_file(&pet_document());
    let entry = pets_entry(&format!("http://127.0.0.1:{port}/api"), &dir);
    let app = spawn_app_with(|c| c.tools.openapi = vec![entry]).await;
    let sid = app.session(json!({"policy": {"network": "allow"}})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let results = app
        .calls(
            &sid,
            json!([
                {"id": "down", "name": "pets__getPet", "arguments": {"petId": "7"}},
                {"id": "after", "name": "write_file", "arguments": {"file_path": "a.txt", "content": "still here\n"}},
            ]),
        )
        .await;
    assert_eq!(results[0]["status"], "error", "{results:?}");
    let text = results[0]["content"].as_str().unwrap();
    assert!(
        text.contains("Cannot call pets__getPet (GET /api/pets/7)")
            && text.contains("could not connect"),
        "{text}"
    );
    assert!(!text.contains(TOKEN));
    assert_eq!(results[1]["status"], "ok", "{results:?}");
}

/// The config file an operator writes for the pet API, its token in the named variable.
fn config_file(
    data: &std::path::Path,
    base: &str,
    spec: &std::path::Path,
    allow: &str,
) -> std::path::PathBuf {
    let file = data.join("toolexec.toml");
    std::fs::write(
        &file,
        format!(
            "bind = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nlog_format = \"json\"\n\n\
             [[tools.openapi]]\nname = \"pets\"\nspec = \"{}\"\nbase_url = \"{base}\"\n\
             operations = [\"getPet\", \"whoami\"]\nbearer_token_env = \"PETS_TOKEN\"\n\
             allow_cidrs = [{allow}]\n",
            data.display(),
            spec.display()
        ),
    )
    .unwrap();
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_takes_an_openapi_entry_from_its_config_file_and_the_token_from_the_environment()
{
    use toolexec_tests::binary::{Started, serve, start, toolexec};
    let (base, seen) = pet_api().await;
    let doc = document_file(&pet_document());
    let spec = doc.path().join("pets.json");
    let data = toolexec_tests::app::data_dir();
    let file = config_file(data.path(), &base, &spec, "\"127.0.0.1/32\"");

    // `toolexec tools list` shows them, loaded and checked as `serve` loads them.
    let listed = toolexec(data.path())
        .args(["--config", file.to_str().unwrap(), "tools", "list"])
        .env("PETS_TOKEN", TOKEN)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert!(
        out.contains("pets__getPet") && out.contains("pets__whoami"),
        "{out}"
    );
    assert!(!out.contains(TOKEN));

    let mut cmd = toolexec(data.path());
    cmd.args(["--config", file.to_str().unwrap(), "serve"])
        .env("PETS_TOKEN", TOKEN);
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
        .json(&json!({"calls": [{"id": "w", "name": "pets__whoami", "arguments": {}}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let r = &body["results"][0];
    // The API answers 200 only to the right token: it came from PETS_TOKEN.
    assert_eq!(r["status"], "ok", "{r}");
    assert!(!body.to_string().contains(TOKEN), "{body}");
    assert!(!served.log.iter().any(|l| l.to_string().contains(TOKEN)));
    assert_eq!(seen.lock().unwrap().as_slice(), ["/api/whoami"]);
    drop(served);

    // Without loopback on the allow-list the binary does not start, and says why.
    let refused = data.path().join("refused");
    std::fs::create_dir_all(&refused).unwrap();
    let file = config_file(&refused, &base, &spec, "");
    let mut cmd = toolexec(&refused);
    cmd.args(["--config", file.to_str().unwrap(), "serve"])
        .env("PETS_TOKEN", TOKEN);
    match start(cmd) {
        Started::Serving(s) => panic!("started on {} with a loopback API not allowed", s.base),
        Started::Exited(log) => {
            assert!(
                log.contains("not allowed by the network policy (loopback"),
                "{log}"
            );
            assert!(!log.contains(TOKEN), "{log}");
        }
    }
}
