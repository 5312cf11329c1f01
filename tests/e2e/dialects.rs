//! The catalog in the agent ecosystems' shapes: every tool passes a checker of OpenAI's and
//! Anthropic's published strict-mode rules; the official Python SDKs build requests from the
//! definitions offline without changing them; a strict model's arguments (every optional one
//! `null`) are understood; results come back in each dialect's shape.
use serde_json::{Value, json};
use toolexec_tests::app::spawn_app;

/// What a strict checker found wrong with one tool, or nothing.
pub(crate) fn strict_violations(name: &str, schema: &Value, openai: bool) -> Vec<String> {
    let mut out = Vec::new();
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !name_ok {
        out.push(format!("name {name:?} is not [a-zA-Z0-9_-]{{1,64}}"));
    }
    if schema["type"] != "object" {
        out.push("the root is not an object".into());
    }
    if schema.get("anyOf").is_some() {
        out.push("anyOf at the root".into());
    }
    let mut properties = 0;
    walk(schema, 1, openai, "", &mut out, &mut properties);
    if properties > 5000 {
        out.push(format!("{properties} properties (at most 5000)"));
    }
    out
}

/// Keywords each strict mode accepts in a schema.
fn allowed(openai: bool) -> &'static [&'static str] {
    const COMMON: &[&str] = &[
        "type",
        "description",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "anyOf",
        "format",
    ];
    const OPENAI: &[&str] = &[
        "type",
        "description",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "anyOf",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
        "pattern",
    ];
    if openai { OPENAI } else { COMMON }
}

fn walk(
    s: &Value,
    depth: usize,
    openai: bool,
    at: &str,
    out: &mut Vec<String>,
    properties: &mut usize,
) {
    let Some(map) = s.as_object() else {
        out.push(format!("{at}: not a schema object"));
        return;
    };
    if depth > 10 {
        out.push(format!("{at}: nested deeper than 10"));
    }
    for key in map.keys() {
        if !allowed(openai).contains(&key.as_str()) {
            out.push(format!(
                "{at}: keyword {key} is not supported in strict mode"
            ));
        }
    }
    let types: Vec<&str> = match &map.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if types.is_empty() && map.get("anyOf").is_none() && map.get("const").is_none() {
        out.push(format!("{at}: no type"));
    }
    if let Some(Value::Array(values)) = map.get("enum")
        && values.iter().any(Value::is_null)
        && !types.contains(&"null")
    {
        out.push(format!("{at}: null in enum but not in type"));
    }
    if types.contains(&"object") {
        if map.get("additionalProperties") != Some(&Value::Bool(false)) {
            out.push(format!("{at}: additionalProperties is not false"));
        }
        let props = map
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let required: Vec<&str> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for (name, p) in &props {
            *properties += 1;
            if !required.contains(&name.as_str()) {
                out.push(format!("{at}/{name}: not in required"));
            }
            walk(
                p,
                depth + 1,
                openai,
                &format!("{at}/{name}"),
                out,
                properties,
            );
        }
        if required.len() != props.len() {
            out.push(format!("{at}: required names what properties does not"));
        }
    }
    if let Some(items) = map.get("items") {
        walk(
            items,
            depth + 1,
            openai,
            &format!("{at}[]"),
            out,
            properties,
        );
    }
    if let Some(Value::Array(all)) = map.get("anyOf") {
        for (i, v) in all.iter().enumerate() {
            walk(v, depth + 1, openai, &format!("{at}|{i}"), out, properties);
        }
    }
}

async fn tools(app: &toolexec_tests::app::TestApp, format: &str) -> Vec<Value> {
    let body: Value = app
        .get(&format!("/v1/tools?format={format}"))
        .await
        .json()
        .await
        .unwrap();
    body["tools"].as_array().unwrap().clone()
}

/// Checks the catalog's tools whose names start with `prefix` (an operator's API or upstream)
/// against both providers' strict rules, and returns their MCP definitions.
pub(crate) async fn strict_tools_named(
    app: &toolexec_tests::app::TestApp,
    prefix: &str,
) -> Vec<Value> {
    for (format, openai) in [("openai", true), ("anthropic", false)] {
        for d in tools(app, format).await {
            let name = d["name"].as_str().unwrap();
            if !name.starts_with(prefix) {
                continue;
            }
            let schema = if openai {
                &d["parameters"]
            } else {
                &d["input_schema"]
            };
            let wrong = strict_violations(name, schema, openai);
            assert!(wrong.is_empty(), "{format} {name}: {wrong:#?}\n{schema:#}");
        }
    }
    tools(app, "mcp")
        .await
        .into_iter()
        .filter(|t| t["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        .collect()
}

#[tokio::test]
async fn every_tool_passes_openai_and_anthropic_strict_mode_rules() {
    let app = spawn_app().await;
    let own = tools(&app, "toolexec").await;
    let available = own.iter().filter(|t| t["available"] == true).count();
    for (format, openai) in [
        ("openai", true),
        ("openai_chat", true),
        ("anthropic", false),
    ] {
        let defs = tools(&app, format).await;
        assert_eq!(defs.len(), available, "{format}");
        for d in &defs {
            let (name, schema) = match format {
                "openai" => {
                    assert_eq!(d["type"], "function");
                    assert_eq!(d["strict"], true);
                    (d["name"].as_str().unwrap(), &d["parameters"])
                }
                "openai_chat" => {
                    assert_eq!(d["type"], "function");
                    assert_eq!(d["function"]["strict"], true);
                    (
                        d["function"]["name"].as_str().unwrap(),
                        &d["function"]["parameters"],
                    )
                }
                _ => {
                    assert_eq!(d["strict"], true);
                    (d["name"].as_str().unwrap(), &d["input_schema"])
                }
            };
            let wrong = strict_violations(name, schema, openai);
            assert!(wrong.is_empty(), "{format} {name}: {wrong:#?}\n{schema:#}");
        }
    }
    // The checker catches what strict mode refuses (it can fail).
    let loose = json!({"type": "object", "properties": {"a": {"type": "string", "minLength": 1}}});
    let wrong = strict_violations("bad name!", &loose, false);
    assert!(wrong.len() >= 4, "{wrong:?}");
}

#[tokio::test]
async fn the_official_python_sdks_build_requests_from_the_definitions_as_they_are() {
    let app = spawn_app().await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/provider_sdks.py");
    let out = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(&app.base)
        .output()
        .await
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.starts_with("ok"),
        "the SDKs refused the definitions (needs `pip install openai anthropic`; .ci/run installs them):\n{stdout}\n{stderr}"
    );
}

#[tokio::test]
async fn a_strict_models_arguments_with_nulls_are_understood_and_results_come_back_in_each_dialect()
{
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let w = app
        .call(
            &sid,
            "w1",
            "write_file",
            json!({"file_path": "a.txt", "content": "one\ntwo\n"}),
        )
        .await;
    assert_eq!(w["status"], "ok", "{w}");
    // What a strict model sends: every property, the ones it does not mean to give as null.
    for (format, key) in [
        ("anthropic", "content"),
        ("openai", "output"),
        ("openai_chat", "content"),
        ("mcp", "content"),
    ] {
        let resp = app
            .post(
                &format!("/v1/sessions/{sid}/calls?format={format}"),
                &json!({"calls": [
                    {"id": format!("r-{format}"), "name": "read_file", "arguments": {"file_path": "a.txt", "offset": null, "limit": null}},
                    {"id": format!("g-{format}"), "name": "grep", "arguments": {"pattern": "two", "path": null, "glob_filter": null, "case_insensitive": null, "max_results": null}},
                    {"id": format!("e-{format}"), "name": "read_file", "arguments": {"file_path": "missing.txt", "offset": null, "limit": null}}
                ]}),
            )
            .await;
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.unwrap();
        let results = body["results"].as_array().unwrap();
        assert_eq!(results[0]["status"], "ok", "{body}");
        assert_eq!(results[1]["status"], "ok", "{body}");
        assert_eq!(results[2]["status"], "error", "{body}");
        let ok = &results[0]["rendered"];
        let failed = &results[2]["rendered"];
        assert!(ok.get(key).is_some() || format == "mcp", "{format}: {ok}");
        match format {
            "anthropic" => {
                assert_eq!(ok["type"], "tool_result");
                assert_eq!(ok["tool_use_id"], "r-anthropic");
                assert_eq!(ok["is_error"], false);
                assert_eq!(failed["is_error"], true);
            }
            "openai" => {
                assert_eq!(ok["type"], "function_call_output");
                assert_eq!(ok["call_id"], "r-openai");
                assert!(failed["output"].as_str().unwrap().starts_with("[error] "));
            }
            "openai_chat" => {
                assert_eq!(ok["role"], "tool");
                assert_eq!(ok["tool_call_id"], "r-openai_chat");
            }
            _ => {
                assert_eq!(ok["isError"], false);
                assert_eq!(ok["content"][0]["type"], "text");
                assert_eq!(failed["isError"], true);
            }
        }
    }
    // Without format, no rendering.
    let r = app
        .call(&sid, "plain", "read_file", json!({"file_path": "a.txt"}))
        .await;
    assert!(r.get("rendered").is_none(), "{r}");
}

#[tokio::test]
async fn a_sessions_tools_are_its_allow_list_in_any_format() {
    let app = spawn_app().await;
    let sid = app.session(json!({"tools": ["read_file", "shell"]})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let names = |v: &Value| -> Vec<String> {
        v["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let own: Value = app
        .get(&format!("/v1/sessions/{sid}/tools"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(names(&own), ["read_file", "shell"], "{own}");
    assert!(own["tools"][0]["capabilities"].is_array(), "{own}");
    let anthropic: Value = app
        .get(&format!("/v1/sessions/{sid}/tools?format=anthropic"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(names(&anthropic), ["read_file", "shell"]);
    assert_eq!(
        anthropic["tools"][1]["input_schema"]["additionalProperties"],
        false
    );
    let openai: Value = app
        .get(&format!("/v1/sessions/{sid}/tools?format=openai"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(openai["tools"][0]["strict"], true, "{openai}");
    // Without an allow-list: the whole catalog, as GET /v1/tools shows it.
    let all = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let every: Value = app
        .get(&format!("/v1/sessions/{all}/tools"))
        .await
        .json()
        .await
        .unwrap();
    let catalog: Value = app.get("/v1/tools").await.json().await.unwrap();
    assert_eq!(names(&every), names(&catalog));
    let missing = app
        .get(&format!("/v1/sessions/{}/tools", uuid::Uuid::now_v7()))
        .await;
    assert_eq!(missing.status(), 404);
}
