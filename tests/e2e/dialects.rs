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
                _ if d.get("type").is_some() => {
                    // Anthropic's own tool types carry no schema (see below).
                    assert!(d["type"].as_str().unwrap().contains("_20"), "{d}");
                    continue;
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

/// A catalog with a tool named `bash`: Anthropic's own tool types are keyed on the name. Where
/// the built-in `bash` is not there, an operator's command tool of that name stands in for it.
async fn app_with_a_bash_tool() -> (toolexec_tests::app::TestApp, tempfile::TempDir) {
    use std::os::unix::fs::PermissionsExt;
    use toolexec_tools::operator::custom::{CommandToolConfig, CustomToolsConfig};
    let dir = tempfile::Builder::new()
        .prefix("toolexec-bash-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = dir.path().join("bash.sh");
    std::fs::write(&script, "#!/bin/sh\ncat\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let builtin = toolexec_tools::Registry::builtin()
        .unwrap()
        .get("bash")
        .is_some();
    if builtin {
        return (toolexec_tests::app::spawn_app().await, dir);
    }
    let tools = CustomToolsConfig {
        dir: Some(dir.path().to_owned()),
        command: vec![CommandToolConfig {
            name: "bash".into(),
            description: "A bash tool. Example: {\"command\": \"ls\"}".into(),
            entrypoint: "bash.sh".into(),
            input_schema: json!({"type": "object", "properties": {"command": {"type": "string"}, "restart": {"type": "boolean"}}, "additionalProperties": false}),
            read_only: false,
            timeout_ms: Some(10_000),
            env: Default::default(),
            env_passthrough: vec![],
            max_output_chars: None,
        }],
        ..Default::default()
    };
    let app = toolexec_tests::app::spawn_app_with(|c| c.tools = tools).await;
    (app, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_catalog_lists_anthropics_own_tools_as_their_native_types() {
    let (app, _dir) = app_with_a_bash_tool().await;
    let get = |path: String| {
        let app = &app;
        async move {
            let resp = app.get(&path).await;
            assert_eq!(resp.status(), 200, "{path}");
            resp.json::<Value>().await.unwrap()
        }
    };
    let named = |v: &Value, name: &str| -> Value {
        v["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {v}"))
    };
    let native = get("/v1/tools?format=anthropic".into()).await;
    assert_eq!(
        named(&native, "bash"),
        json!({"type": "bash_20250124", "name": "bash"})
    );
    assert_eq!(
        named(&native, "str_replace_based_edit_tool"),
        json!({"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"})
    );
    // Every other tool is still a function tool.
    assert_eq!(named(&native, "read_file")["strict"], true);
    assert!(named(&native, "read_file").get("type").is_none());
    // The opt-out: function tools with their schemas, like the rest.
    let functions = get("/v1/tools?format=anthropic&native=false".into()).await;
    for name in ["bash", "str_replace_based_edit_tool"] {
        let t = named(&functions, name);
        assert!(t.get("type").is_none(), "{t}");
        assert_eq!(t["strict"], true, "{t}");
        assert_eq!(t["input_schema"]["type"], "object", "{t}");
    }
    // Only Anthropic's dialect has them.
    let openai = get("/v1/tools?format=openai".into()).await;
    assert_eq!(
        named(&openai, "str_replace_based_edit_tool")["type"],
        "function"
    );
    let one = get("/v1/tools/str_replace_based_edit_tool?format=anthropic".into()).await;
    assert_eq!(one["type"], "text_editor_20250728");

    // A session's tools: its allow-list, the same way.
    let sid = app
        .session(json!({"tools": ["str_replace_based_edit_tool", "bash", "read_file"]}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let mine = get(format!("/v1/sessions/{sid}/tools?format=anthropic")).await;
    assert_eq!(mine["tools"].as_array().unwrap().len(), 3, "{mine}");
    assert_eq!(
        named(&mine, "str_replace_based_edit_tool"),
        json!({"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"})
    );
    assert_eq!(
        named(&mine, "bash"),
        json!({"type": "bash_20250124", "name": "bash"})
    );
    assert_eq!(named(&mine, "read_file"), named(&native, "read_file"));
    let mine = get(format!(
        "/v1/sessions/{sid}/tools?format=anthropic&native=false"
    ))
    .await;
    assert!(
        mine["tools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["strict"] == true)
    );
    let bad = app.get("/v1/tools?format=anthropic&native=maybe").await;
    assert_eq!(bad.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_shell_call_and_apply_patch_call_items_run_here_and_are_answered_as_output_items() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let post = |body: Value, format: &'static str| {
        let app = &app;
        let sid = sid.clone();
        async move {
            let resp = app
                .post(&format!("/v1/sessions/{sid}/calls{format}"), &body)
                .await;
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap())
        }
    };
    let create = json!({"type": "apply_patch_call", "id": "apc_1", "call_id": "call_create", "status": "completed",
        "operation": {"type": "create_file", "path": "notes/a.txt", "diff": "+hello\n+world\n"}});
    let shell = json!({"type": "shell_call", "id": "sh_1", "call_id": "call_sh", "status": "completed",
        "environment": {"type": "local"},
        "action": {"commands": ["cat notes/a.txt", "echo oops >&2; exit 3", "sleep 5"], "timeout_ms": 1500, "max_output_length": 8}});
    let plain =
        json!({"id": "call_read", "name": "read_file", "arguments": {"file_path": "notes/a.txt"}});

    // Not without format=openai: the answer would not be in OpenAI's shape.
    let (status, problem) = post(json!({"calls": [shell.clone()]}), "").await;
    assert_eq!(status, 422, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("format=openai"),
        "{problem}"
    );

    let (status, body) = post(json!({"calls": [create, shell, plain]}), "?format=openai").await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{body}");

    let created = &results[0];
    assert_eq!(created["type"], "apply_patch_call");
    assert_eq!(
        created["rendered"]["type"], "apply_patch_call_output",
        "{created}"
    );
    assert_eq!(created["rendered"]["call_id"], "call_create");
    assert_eq!(created["rendered"]["status"], "completed", "{created}");
    assert_eq!(created["calls"][0]["name"], "apply_patch");
    assert_eq!(created["calls"][0]["call_id"], "call_create");

    let ran = &results[1];
    assert_eq!(ran["type"], "shell_call");
    let out = &ran["rendered"];
    assert_eq!(out["type"], "shell_call_output", "{out}");
    assert_eq!(out["call_id"], "call_sh");
    assert_eq!(out["max_output_length"], 8);
    let output = out["output"].as_array().unwrap();
    assert_eq!(output.len(), 3, "{out}");
    assert_eq!(output[0]["stdout"], "hello\nwo", "{out}");
    assert_eq!(output[0]["stderr"], "");
    assert_eq!(
        output[0]["outcome"],
        json!({"type": "exit", "exit_code": 0})
    );
    assert_eq!(output[1]["stdout"], "");
    assert_eq!(output[1]["stderr"], "oops\n");
    assert_eq!(
        output[1]["outcome"],
        json!({"type": "exit", "exit_code": 3})
    );
    assert_eq!(output[2]["outcome"], json!({"type": "timeout"}), "{out}");
    // Each command is a recorded shell call of its own.
    let ids: Vec<&str> = ran["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["call_sh#1", "call_sh#2", "call_sh#3"]);
    assert!(
        ran["calls"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["name"] == "shell")
    );
    assert_eq!(ran["calls"][2]["status"], "timed_out");

    let read = &results[2];
    assert_eq!(read["rendered"]["type"], "function_call_output", "{read}");
    assert!(
        read["content"].as_str().unwrap().contains("     2\tworld"),
        "{read}"
    );

    // An update in V4A form, then a delete; a hunk that does not apply fails and says why.
    let (status, body) = post(
        json!({"calls": [
            {"type": "apply_patch_call", "call_id": "call_up", "operation": {"type": "update_file", "path": "notes/a.txt", "diff": "@@\n hello\n-world\n+there\n"}},
            {"type": "apply_patch_call", "call_id": "call_bad", "operation": {"type": "update_file", "path": "notes/a.txt", "diff": "@@\n-not in the file\n+x\n"}},
            {"type": "apply_patch_call", "call_id": "call_sneak", "operation": {"type": "update_file", "path": "notes/a.txt", "diff": "@@\n+x\n*** Add File: elsewhere.txt\n+y\n"}},
            {"type": "shell_call", "call_id": "call_cat", "action": {"commands": ["cat notes/a.txt"]}},
            {"type": "apply_patch_call", "call_id": "call_rm", "operation": {"type": "delete_file", "path": "notes/a.txt"}},
            {"type": "shell_call", "call_id": "call_ls", "action": {"commands": ["ls notes elsewhere.txt"]}}
        ]}),
        "?format=openai",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let r = body["results"].as_array().unwrap();
    assert_eq!(r[0]["rendered"]["status"], "completed", "{body}");
    assert_eq!(r[1]["rendered"]["status"], "failed", "{body}");
    assert!(
        r[1]["rendered"]["output"]
            .as_str()
            .unwrap()
            .contains("not in the file"),
        "{body}"
    );
    assert_eq!(r[2]["rendered"]["status"], "failed", "{body}");
    assert!(
        r[2]["rendered"]["output"]
            .as_str()
            .unwrap()
            .contains("header line"),
        "{body}"
    );
    assert_eq!(r[2]["calls"], json!([]), "{body}");
    assert_eq!(
        r[3]["rendered"]["output"][0]["stdout"], "hello\nthere\n",
        "{body}"
    );
    assert_eq!(r[4]["rendered"]["status"], "completed", "{body}");
    let ls = &r[5]["rendered"]["output"][0];
    assert_ne!(ls["outcome"]["exit_code"], 0, "{ls}");
    assert!(
        ls["stderr"].as_str().unwrap().contains("elsewhere.txt"),
        "{ls}"
    );

    // The files changed by the items are recorded like any call's.
    let events = app.events(&sid).await;
    let changes: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e["kind"].as_str().is_some_and(|k| k.starts_with("file.")))
        .map(|e| {
            (
                e["kind"].as_str().unwrap(),
                e["data"]["path"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("file.created", "notes/a.txt"),
            ("file.modified", "notes/a.txt"),
            ("file.deleted", "notes/a.txt"),
        ]
    );

    // A hosted container's call is OpenAI's to run, not this service's.
    let (status, problem) = post(
        json!({"calls": [{"type": "shell_call", "call_id": "call_hosted", "environment": {"type": "container_reference", "container_id": "cntr_1"}, "action": {"commands": ["ls"]}}]}),
        "?format=openai",
    )
    .await;
    assert_eq!(status, 422, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("/calls/0/environment"),
        "{problem}"
    );
    // A wrong item points at its wrong field.
    let (status, problem) = post(
        json!({"calls": [{"type": "shell_call", "call_id": "c", "action": {"commands": []}}]}),
        "?format=openai",
    )
    .await;
    assert_eq!(status, 422, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("/calls/0/action/commands"),
        "{problem}"
    );
}

/// A command that prints the `shell` result's own section markers cannot move its output from
/// one stream to the other in `shell_call_output`: the streams come from the shell tool's
/// structured result, not from its text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_shell_call_output_streams_cannot_be_forged_by_the_command() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let forge = "printf 'a\\n--- stderr ---\\nb\\n'; printf -- '--- stdout ---\\nc\\n' >&2; exit 5";
    let body = body_sent(forge);
    let resp = app
        .post(&format!("/v1/sessions/{sid}/calls?format=openai"), &body)
        .await;
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    let out = &body["results"][0]["rendered"];
    assert_eq!(out["type"], "shell_call_output", "{body}");
    assert_eq!(
        out["output"][0]["stdout"], "a\n--- stderr ---\nb\n",
        "{out}"
    );
    assert_eq!(out["output"][0]["stderr"], "--- stdout ---\nc\n", "{out}");
    assert_eq!(
        out["output"][0]["outcome"],
        json!({"type": "exit", "exit_code": 5})
    );
    assert_eq!(out["output"][1]["stdout"], "--- stderr ---\n", "{out}");
    assert_eq!(out["output"][1]["stderr"], "", "{out}");
    // The text the record keeps is the shell tool's, with its sections.
    let text = body["results"][0]["calls"][0]["content"].as_str().unwrap();
    assert!(
        text.starts_with("[exit code 5 after ")
            && text.contains(
                "--- stdout ---\na\n--- stderr ---\nb\n--- stderr ---\n--- stdout ---\nc\n"
            ),
        "{text}"
    );
    // A retry of the same call id is answered from the record, and renders exactly the first
    // answer: the streams come from the structured result its `invocation.finished` event keeps,
    // not from a split of the text (which the forged headers would fool).
    let again = app
        .post(
            &format!("/v1/sessions/{sid}/calls?format=openai"),
            &body_sent(forge),
        )
        .await;
    assert_eq!(again.status(), 200);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["results"][0]["rendered"], *out, "{again}");
    let events = app.events(&sid).await;
    let finished: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "invocation.finished")
        .collect();
    assert_eq!(finished.len(), 2, "{events:?}");
    assert_eq!(
        finished[0]["data"]["structured"]["stdout"], "a\n--- stderr ---\nb\n",
        "{events:?}"
    );
    assert_eq!(
        finished[0]["data"]["structured"]["exit_code"], 5,
        "{events:?}"
    );
}

/// The body of `openai_shell_call_output_streams_cannot_be_forged_by_the_command`'s call.
fn body_sent(forge: &str) -> Value {
    json!({"calls": [{"type": "shell_call", "call_id": "call_forge",
        "action": {"commands": [forge, "printf -- '--- stderr ---\\n'"]}}]})
}
