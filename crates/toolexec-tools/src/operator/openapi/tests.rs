use super::*;
use crate::schema::import::typed_input_schema;

fn doc() -> Value {
    json!({
        "openapi": "3.0.3",
        "info": {"title": "Pets", "version": "1"},
        "paths": {
            "/pets": {
                "get": {
                    "operationId": "listPets",
                    "summary": "List pets.",
                    "parameters": [
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "maximum": 100}},
                        {"name": "tag", "in": "query", "schema": {"type": "array", "items": {"type": "string"}}},
                        {"name": "X-Trace", "in": "header", "schema": {"type": "string"}}
                    ]
                },
                "post": {
                    "operationId": "create.pet",
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewPet"}}}}
                }
            },
            "/pets/{petId}/photos/{name}.png": {
                "parameters": [{"name": "petId", "in": "path", "required": true, "schema": {"type": "string"}}],
                "get": {
                    "operationId": "getPhoto",
                    "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}]
                }
            },
            "/free": {"post": {"operationId": "free", "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object"}}}}}},
            "/tree": {"post": {"operationId": "tree", "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Node"}}}}}},
            "/either": {"post": {"operationId": "either", "requestBody": {"content": {"application/json": {"schema": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}}}}},
            "/hdr": {"get": {"operationId": "hdr", "parameters": [{"name": "X-Key", "in": "header", "required": true, "schema": {"type": "string"}}]}},
            "/upload": {"put": {"operationId": "upload", "requestBody": {"required": true, "content": {"application/octet-stream": {}}}}}
        },
        "components": {"schemas": {
            "Base": {"type": "object", "properties": {"name": {"type": "string"}, "id": {"type": "integer", "readOnly": true}}, "required": ["name"]},
            "NewPet": {"allOf": [{"$ref": "#/components/schemas/Base"}, {"type": "object", "properties": {"tag": {"type": "string", "nullable": true}, "kind": {"enum": ["cat", "dog"]}}}]},
            "Node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/components/schemas/Node"}}}}
        }}
    })
}

struct Fixture {
    _dir: tempfile::TempDir,
    config: OpenApiToolsConfig,
}

fn fixture(operations: &[&str]) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("api.json");
    std::fs::write(&spec, doc().to_string()).unwrap();
    Fixture {
        _dir: dir,
        config: OpenApiToolsConfig {
            name: "pets".into(),
            spec,
            base_url: "http://127.0.0.1:9/api/".into(),
            operations: operations.iter().map(|s| (*s).to_owned()).collect(),
            bearer_token: Some("tok-secret".into()),
            bearer_token_env: None,
            allow_cidrs: vec!["127.0.0.1/32".into()],
            timeout_ms: None,
            max_response_bytes: None,
        },
    }
}

fn net() -> LoadNet {
    LoadNet {
        egress_allow: vec![],
        resolver: Arc::new(toolexec_net::StaticResolver::new()),
    }
}

async fn load_one(f: &Fixture) -> Result<Vec<Arc<dyn Tool>>, String> {
    load(&f.config, &mut BTreeSet::from(["shell".to_owned()]), &net()).await
}

#[tokio::test]
async fn admitted_operations_become_typed_tools() {
    let f = fixture(&["listPets", "create.pet", "getPhoto"]);
    let tools = load_one(&f).await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.spec().name.as_str()).collect();
    assert_eq!(
        names,
        ["pets__listPets", "pets__create_pet", "pets__getPhoto"]
    );
    let list = tools[0].spec();
    assert!(list.read_only);
    assert_eq!(list.capabilities, vec![Capability::Network]);
    let s = &list.input_schema;
    assert_eq!(s["additionalProperties"], false);
    assert_eq!(s["required"], json!([]));
    assert_eq!(s["properties"]["limit"]["type"], json!(["integer", "null"]));
    assert_eq!(s["properties"]["tag"]["items"]["type"], "string");
    assert!(
        s["properties"].get("X-Trace").is_none(),
        "optional headers are left out"
    );
    let create = tools[1].spec();
    assert!(!create.read_only);
    let body = &create.input_schema["properties"]["body"];
    assert_eq!(create.input_schema["required"], json!(["body"]));
    assert_eq!(body["required"], json!(["name"]), "{body}");
    assert!(
        body["properties"].get("id").is_none(),
        "readOnly is not sent: {body}"
    );
    assert_eq!(body["properties"]["tag"]["type"], json!(["string", "null"]));
    assert_eq!(
        body["properties"]["kind"]["enum"],
        json!(["cat", "dog", null])
    );
    assert_eq!(body["additionalProperties"], false);
    // Every schema compiles, and a strict model's nulls pass it.
    for t in &tools {
        jsonschema::draft202012::new(&t.spec().input_schema).unwrap();
    }
    let v = jsonschema::draft202012::new(&tools[0].spec().input_schema).unwrap();
    assert!(v.is_valid(&json!({"limit": null, "tag": null})));
    assert!(!v.is_valid(&json!({"limit": 101})));
    assert!(!tools[0].spec().description.contains("tok-secret"));
}

#[tokio::test]
async fn what_cannot_be_typed_is_refused_at_load_with_the_reason() {
    for (op, says) in [
        ("free", "free-form object"),
        ("tree", "refers to itself"),
        ("either", "oneOf with 2 choices"),
        ("hdr", "required header parameter"),
        ("upload", "not JSON"),
        ("nope", "no operationId of the document"),
    ] {
        let f = fixture(&[op]);
        let err = load_one(&f).await.err().unwrap_or_default();
        assert!(err.contains(says), "{op}: {err}");
        assert!(err.contains("tools.openapi \"pets\""), "{err}");
    }
    let f = fixture(&[]);
    assert!(
        load_one(&f)
            .await
            .err()
            .unwrap()
            .contains("operations is empty")
    );
}

#[tokio::test]
async fn the_base_url_must_be_allowed_by_the_network_policy() {
    let mut f = fixture(&["listPets"]);
    f.config.allow_cidrs.clear();
    let err = load_one(&f).await.err().unwrap();
    assert!(
        err.contains("not allowed by the network policy (loopback"),
        "{err}"
    );
    assert!(!err.contains("tok-secret"), "{err}");
    f.config.base_url = "http://169.254.169.254/latest".into();
    let err = load_one(&f).await.err().unwrap();
    assert!(err.contains("metadata"), "{err}");
    f.config.base_url = "http://localhost:8080/".into();
    f.config.allow_cidrs = vec!["127.0.0.1/32".into()];
    let err = load_one(&f).await.err().unwrap();
    assert!(err.contains("localhost"), "{err}");
    // A name is checked on what it resolves to.
    f.config.base_url = "http://internal.example:8080/".into();
    let n = LoadNet {
        egress_allow: vec![],
        resolver: Arc::new(
            toolexec_net::StaticResolver::new()
                .with("internal.example", ["10.1.2.3".parse().unwrap()]),
        ),
    };
    let err = load(&f.config, &mut BTreeSet::new(), &n)
        .await
        .err()
        .unwrap();
    assert!(err.contains("private"), "{err}");
    f.config.allow_cidrs = vec!["10.1.2.0/24".into()];
    assert!(load(&f.config, &mut BTreeSet::new(), &n).await.is_ok());
}

#[tokio::test]
async fn names_are_sanitized_and_collisions_refused() {
    let mut f = fixture(&["listPets"]);
    let mut taken = BTreeSet::from(["pets__listPets".to_owned()]);
    let err = load(&f.config, &mut taken, &net()).await.err().unwrap();
    assert!(err.contains("already taken"), "{err}");
    f.config.name = "a".repeat(60);
    let err = load_one(&f).await.err().unwrap();
    assert!(err.contains("1 to 32"), "{err}");
    f.config.name = "pets".into();
    f.config.bearer_token_env = Some("TOOLEXEC_TEST_SURELY_UNSET_VARIABLE".into());
    let err = load_one(&f).await.err().unwrap();
    assert!(err.contains("not both"), "{err}");
    f.config.bearer_token = None;
    let err = load_one(&f).await.err().unwrap();
    assert!(err.contains("is not set"), "{err}");
    assert_eq!(
        tool_name("api", "get pet/{id}").unwrap(),
        "api__get_pet__id_"
    );
}

#[tokio::test]
async fn path_arguments_stay_inside_their_segment() {
    let f = fixture(&["getPhoto", "listPets"]);
    let tools = load_one(&f).await.unwrap();
    let photo = tools[0].spec().name.clone();
    let cfg = &f.config;
    let api = Arc::new(Api {
        name: "pets".into(),
        base: Url::parse(&cfg.base_url).unwrap(),
        policy: NetPolicy::public_only(),
        token: None,
        timeout: Duration::from_secs(1),
        max_response_bytes: 10,
    });
    let d = doc();
    let ops = operations(&d, &["getPhoto".to_owned(), "listPets".to_owned()]).unwrap();
    let t = OperationTool::new(photo, api.clone(), &d, &ops[0]).unwrap();
    let url = |pet: &str, name: &str| t.url(&json!({"petId": pet, "name": name}));
    assert_eq!(
        url("7", "a").unwrap().as_str(),
        "http://127.0.0.1:9/api/pets/7/photos/a.png"
    );
    assert_eq!(
        url("../../admin", "x/y?z#w%2e").unwrap().as_str(),
        "http://127.0.0.1:9/api/pets/..%2F..%2Fadmin/photos/x%2Fy%3Fz%23w%252e.png"
    );
    assert_eq!(
        url("%2e%2e", "a").unwrap().path(),
        "/api/pets/%252e%252e/photos/a.png"
    );
    for bad in ["..", ".", ""] {
        let err = url(bad, "a").unwrap_err();
        assert!(err.contains("change the path"), "{bad:?}: {err}");
    }
    let list = OperationTool::new("pets__listPets".into(), api, &d, &ops[1]).unwrap();
    assert_eq!(
        list.url(&json!({"limit": 5, "tag": ["a b", "c&d"]}))
            .unwrap()
            .as_str(),
        "http://127.0.0.1:9/api/pets?limit=5&tag=a+b&tag=c%26d"
    );
    assert_eq!(
        list.url(&json!({})).unwrap().as_str(),
        "http://127.0.0.1:9/api/pets"
    );
}

#[test]
fn a_strict_models_nulls_are_not_sent() {
    let schema = json!({"type": "object", "required": ["a"], "properties": {
        "a": {"type": ["string", "null"]},
        "b": {"type": ["string", "null"]},
        "o": {"type": "object", "required": [], "properties": {"c": {"type": ["integer", "null"]}}}
    }});
    assert_eq!(
        without_absent(&json!({"a": null, "b": null, "o": {"c": null}}), &schema),
        json!({"a": null, "o": {}})
    );
}

/// An API on loopback that reads one request, says so, and answers `answer` after
/// `delay` (never, for `None`).
async fn slow_api(
    delay: Duration,
    answer: Option<&'static str>,
) -> (u16, tokio::sync::oneshot::Receiver<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (arrived, wait) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = vec![0; 8192];
        let _ = sock.read(&mut buf).await;
        let _ = arrived.send(());
        tokio::time::sleep(delay).await;
        match answer {
            Some(a) => {
                let _ = sock.write_all(a.as_bytes()).await;
            }
            None => tokio::time::sleep(Duration::from_secs(60)).await,
        }
    });
    (port, wait)
}

fn live_ctx(dir: &tempfile::TempDir, budget: Duration) -> ToolContext {
    let ws = Arc::new(crate::Workspace::open(dir.path()).unwrap());
    let mut ctx = ToolContext::new(uuid::Uuid::now_v7(), ws);
    ctx.policy.network = toolexec_core::NetworkPolicy::Allow;
    ctx.deadline = crate::Deadline::after(budget);
    ctx
}

#[tokio::test]
async fn a_write_that_went_out_is_waited_for_and_not_recorded_as_nothing_changed() {
    const CREATED: &str =
        "HTTP/1.1 201 Created\r\ncontent-length: 7\r\nconnection: close\r\n\r\ncreated";
    let ws = tempfile::tempdir().unwrap();
    // The client cancels once the POST has reached the API: its real answer is kept.
    let (port, arrived) = slow_api(Duration::from_millis(300), Some(CREATED)).await;
    let mut f = fixture(&["create.pet"]);
    f.config.base_url = format!("http://127.0.0.1:{port}/api/");
    let tools = load_one(&f).await.unwrap();
    let ctx = live_ctx(&ws, Duration::from_secs(10));
    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        let _ = arrived.await;
        cancel.cancel();
    });
    let out =
        crate::run_within_deadline(tools[0].as_ref(), &ctx, json!({"body": {"name": "Rex"}})).await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert!(out.content.contains("HTTP 201 Created"), "{}", out.content);

    // An API that never answers: the call ends at its time limit saying the request went
    // out, not that nothing was changed.
    let (port, _arrived) = slow_api(Duration::ZERO, None).await;
    f.config.base_url = format!("http://127.0.0.1:{port}/api/");
    let tools = load_one(&f).await.unwrap();
    let ctx = live_ctx(&ws, Duration::from_millis(500));
    let out =
        crate::run_within_deadline(tools[0].as_ref(), &ctx, json!({"body": {"name": "Rex"}})).await;
    assert_eq!(out.status, CallStatus::TimedOut, "{}", out.content);
    assert!(
        out.content.contains("the request was sent")
            && !out.content.contains("nothing was changed"),
        "{}",
        out.content
    );

    // A read that is cancelled is simply cancelled.
    let (port, arrived) = slow_api(Duration::ZERO, None).await;
    let mut f = fixture(&["listPets"]);
    f.config.base_url = format!("http://127.0.0.1:{port}/api/");
    let tools = load_one(&f).await.unwrap();
    let ctx = live_ctx(&ws, Duration::from_secs(10));
    let cancel = ctx.cancel.clone();
    tokio::spawn(async move {
        let _ = arrived.await;
        cancel.cancel();
    });
    let out = crate::run_within_deadline(tools[0].as_ref(), &ctx, json!({})).await;
    assert_eq!(out.status, CallStatus::Cancelled, "{}", out.content);

    // Past its deadline before sending, a write sends nothing.
    let ctx = live_ctx(&ws, Duration::ZERO);
    let mut f = fixture(&["create.pet"]);
    f.config.base_url = format!("http://127.0.0.1:{port}/api/");
    let tools = load_one(&f).await.unwrap();
    let out = tools[0].run(&ctx, json!({"body": {"name": "Rex"}})).await;
    assert_ne!(out.status, CallStatus::Ok, "{}", out.content);
}

#[test]
fn hostile_schemas_are_refused_quickly_with_the_reason() {
    // An allOf part that comes back to itself through its own allOf.
    let err = typed_input_schema(&json!({
        "allOf": [{"$ref": "#/$defs/A"}],
        "$defs": {"A": {"allOf": [{"$ref": "#/$defs/A"}]}}
    }))
    .unwrap_err();
    assert!(err.contains("refers to itself"), "{err}");
    // The same through two definitions.
    let err = typed_input_schema(&json!({
        "allOf": [{"$ref": "#/$defs/A"}],
        "$defs": {"A": {"allOf": [{"$ref": "#/$defs/B"}]}, "B": {"allOf": [{"$ref": "#/$defs/A"}]}}
    }))
    .unwrap_err();
    assert!(err.contains("refers to itself"), "{err}");
    // 7 levels of 20 properties, each referring to the next level: ~10^9 nodes expanded.
    let mut defs = Map::new();
    for level in 0..7 {
        let next = if level == 6 {
            json!({"type": "string"})
        } else {
            json!({"$ref": format!("#/$defs/L{}", level + 1)})
        };
        let props: Map<String, Value> = (0..20).map(|i| (format!("p{i}"), next.clone())).collect();
        defs.insert(
            format!("L{level}"),
            json!({"type": "object", "properties": props}),
        );
    }
    let started = std::time::Instant::now();
    let err = typed_input_schema(&json!({"$ref": "#/$defs/L0", "$defs": defs})).unwrap_err();
    assert!(err.contains("more than 10000 schema nodes"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The same through allOf parts.
    let mut defs = Map::new();
    for level in 0..7 {
        let parts: Vec<Value> = (0..20)
            .map(|i| {
                if level == 6 {
                    json!({"type": "object", "properties": {format!("p{i}"): {"type": "string"}}})
                } else {
                    json!({"$ref": format!("#/$defs/L{}", level + 1)})
                }
            })
            .collect();
        defs.insert(format!("L{level}"), json!({"allOf": parts}));
    }
    let err =
        typed_input_schema(&json!({"allOf": [{"$ref": "#/$defs/L0"}], "$defs": defs})).unwrap_err();
    assert!(err.contains("more than 10000 schema nodes"), "{err}");
}

#[test]
fn an_optional_const_can_be_left_out() {
    let s = typed_input_schema(&json!({"type": "object", "properties": {
        "kind": {"type": "string", "const": "x"}}}))
    .unwrap();
    assert_eq!(s["properties"]["kind"]["enum"], json!(["x", null]));
    assert!(s["properties"]["kind"].get("const").is_none());
    let v = jsonschema::draft202012::new(&s).unwrap();
    assert!(v.is_valid(&json!({"kind": null})));
    assert!(v.is_valid(&json!({"kind": "x"})));
    assert!(!v.is_valid(&json!({"kind": "y"})));
    // Required, it stays a const.
    let s = typed_input_schema(&json!({"type": "object", "required": ["kind"],
        "properties": {"kind": {"type": "string", "const": "x"}}}))
    .unwrap();
    assert_eq!(s["properties"]["kind"]["const"], "x");
}

#[test]
fn keywords_beside_a_ref_or_a_single_choice_are_kept_or_refused() {
    let defs = json!({"S": {"type": "string"}});
    for (prop, says) in [
        (
            json!({"$ref": "#/$defs/S", "maxLength": 3}),
            "\"maxLength\" beside $ref",
        ),
        (
            json!({"$ref": "#/$defs/S", "enum": ["a"]}),
            "\"enum\" beside $ref",
        ),
        (
            json!({"anyOf": [{"$ref": "#/$defs/S"}, {"type": "null"}], "maxLength": 3}),
            "\"maxLength\" beside anyOf",
        ),
        (
            json!({"oneOf": [{"type": "string"}], "enum": ["a"]}),
            "\"enum\" beside oneOf",
        ),
    ] {
        let err = typed_input_schema(&json!({"type": "object", "required": ["p"],
            "properties": {"p": prop}, "$defs": defs}))
        .unwrap_err();
        assert!(err.contains(says), "{err}");
    }
    // 3.0's nullable beside them lets null through; a description is kept.
    for prop in [
        json!({"$ref": "#/$defs/S", "nullable": true, "description": "d"}),
        json!({"oneOf": [{"$ref": "#/$defs/S"}], "nullable": true, "description": "d", "title": "t"}),
    ] {
        let s = typed_input_schema(&json!({"type": "object", "required": ["p"],
            "properties": {"p": prop}, "$defs": defs}))
        .unwrap();
        assert_eq!(
            s["properties"]["p"]["type"],
            json!(["string", "null"]),
            "{s}"
        );
        assert_eq!(s["properties"]["p"]["description"], "d");
    }
}

#[test]
fn a_token_split_by_the_cut_is_masked_whole() {
    let s = Secret::new("tok-secret-123".into());
    // The cap falls inside the token: no prefix of it is shown.
    for limit in 5..20 {
        let (body, cut) = scrubbed_within(
            Bytes::from_static(b"12345tok-secret-123 and more"),
            Some(&s),
            limit,
        );
        let text = String::from_utf8_lossy(&body);
        assert!(cut, "{limit}");
        assert!(!text.contains("tok-"), "{limit}: {text}");
        if limit > 5 {
            assert_eq!(text, "12345***", "{limit}");
        }
    }
    let (body, cut) = scrubbed_within(Bytes::from_static(b"tok-secret-123"), Some(&s), 100);
    assert_eq!((body, cut), (Bytes::from_static(b"***"), false));
    // Echoed in JSON, a token with a quote or a backslash is escaped: masked too.
    let q = Secret::new(r#"t"o\k"#.into());
    let (body, _) = scrubbed_within(
        Bytes::from_static(br#"{"you_sent": "Bearer t\"o\\k"} t"o\k"#),
        Some(&q),
        100,
    );
    assert_eq!(
        body,
        Bytes::from_static(br#"{"you_sent": "Bearer ***"} ***"#)
    );
    assert_eq!(scrub_overlap(Some(&q)), 6);
    let (body, cut) = scrubbed_within(Bytes::from_static(b"abcdef"), None, 3);
    assert_eq!((body, cut), (Bytes::from_static(b"abc"), true));
}

#[test]
fn a_token_echoed_by_the_api_is_scrubbed() {
    let s = Secret::new("tok-1".into());
    assert_eq!(
        scrubbed(Bytes::from_static(b"Bearer tok-1 and tok-1!"), Some(&s)),
        Bytes::from_static(b"Bearer *** and ***!")
    );
    assert_eq!(format!("{s:?}"), "***");
}
