//! Command tools the operator adds by configuration: listed beside the built-ins, validated
//! against their schema, run in the session's sandbox with the arguments on stdin, recorded.
#![allow(
    clippy::disallowed_methods,
    reason = "the test writes the operator's tool folder on the host"
)]
use std::os::unix::fs::PermissionsExt;

use serde_json::{Value, json};
use toolexec_tests::app::spawn_app_with;
use toolexec_tools::custom::{CommandToolConfig, CustomToolsConfig};

/// An operator's folder outside /tmp (the sandbox's /tmp is its own).
struct Folder(std::path::PathBuf);

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn folder() -> Folder {
    let dir = std::path::PathBuf::from(format!(
        "/var/tmp/toolexec-tools-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (name, body) in [
        (
            "probe.sh",
            "#!/bin/sh\ninput=$(cat)\necho \"input: $input\"\necho \"uid: $(id -u) cwd: $(pwd)\"\necho made > made-by-tool.txt\necho \"tool: $TOOLEXEC_TOOL_NAME\"\n",
        ),
        (
            "fails.sh",
            "#!/bin/sh\necho partial\necho 'it went wrong' >&2\nexit 3\n",
        ),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    Folder(dir)
}

fn tool(name: &str, entry: &str, schema: Value) -> CommandToolConfig {
    CommandToolConfig {
        name: name.into(),
        description: format!("The {name} tool."),
        entrypoint: entry.into(),
        input_schema: schema,
        read_only: false,
        timeout_ms: Some(10_000),
        env_passthrough: vec![],
        max_output_chars: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_command_tool_runs_in_the_sandbox_and_is_recorded() {
    let dir = folder();
    let tools = CustomToolsConfig {
        dir: Some(dir.0.clone()),
        command: vec![
            tool(
                "probe",
                "probe.sh",
                json!({"type": "object", "properties": {"path": {"type": "string"}},
                       "required": ["path"], "additionalProperties": false}),
            ),
            tool("fails", "fails.sh", json!({"type": "object"})),
        ],
        ..Default::default()
    };
    let app = spawn_app_with(|c| c.tools = tools).await;

    // Listed beside the built-ins, in every dialect.
    let catalog: Value = app.get("/v1/tools").await.json().await.unwrap();
    let probe = catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "probe")
        .unwrap_or_else(|| panic!("{catalog}"));
    assert_eq!(probe["input_schema"]["required"][0], "path");
    let anthropic: Value = app
        .get("/v1/tools?format=anthropic")
        .await
        .json()
        .await
        .unwrap();
    assert!(anthropic.to_string().contains("\"probe\""), "{anthropic}");

    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .call(&sid, "c1", "probe", json!({"path": "a b'c"}))
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let text = r["content"].as_str().unwrap();
    assert!(text.contains(r#"input: {"path":"a b'c"}"#), "{r}");
    assert!(
        text.contains("uid: 65534 cwd: /workspace"),
        "sandboxed like shell: {r}"
    );
    assert!(text.contains("tool: probe"), "{r}");
    // Its side effect is in the log, as a command's.
    let events = app.events(&sid).await;
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "file.created" && e["data"]["path"] == "made-by-tool.txt"),
        "{events:?}"
    );
    // Validated against its schema before it runs.
    let bad = app.call(&sid, "c2", "probe", json!({"path": 7})).await;
    assert_eq!(bad["status"], "invalid_arguments", "{bad}");
    // A failing tool is an error result with what it printed.
    let f = app.call(&sid, "c3", "fails", json!({})).await;
    assert_eq!(f["status"], "error", "{f}");
    let text = f["content"].as_str().unwrap();
    assert!(text.contains("exited with code 3"), "{f}");
    assert!(
        text.contains("it went wrong") && text.contains("partial"),
        "{f}"
    );
    // The folder is read-only to commands: the model cannot change the operator's tool.
    let w = app
        .call(
            &sid,
            "c4",
            "shell",
            json!({"command": format!("echo hacked > {}/probe.sh; echo rc=$?", dir.0.display())}),
        )
        .await;
    assert!(w["content"].as_str().unwrap().contains("rc=1"), "{w}");
    assert!(
        std::fs::read_to_string(dir.0.join("probe.sh"))
            .unwrap()
            .starts_with("#!/bin/sh\ninput")
    );
}
