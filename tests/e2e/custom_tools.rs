//! Command tools the operator adds by configuration: listed beside the built-ins, validated
//! against their schema, run in the session's sandbox with the arguments on stdin, recorded.
#![allow(
    clippy::disallowed_methods,
    reason = "the test writes the operator's tool folder on the host"
)]
use std::os::unix::fs::PermissionsExt;

use serde_json::{Value, json};
use toolexec_tests::app::spawn_app_with;
use toolexec_tools::operator::custom::{CommandToolConfig, CustomToolsConfig};

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
        env: Default::default(),
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

// ---------------------------------------------------------------------------------------------
// A tenant against the operator's tool (issue 23 §3): the tool runs in the operator's
// environment, with the operator's secret, and nothing of the session's reaches it.
// ---------------------------------------------------------------------------------------------

/// What the operator gives the tool through `env_passthrough`, and what must never show up in
/// the tenant's workspace.
const SECRET: &str = "operator-secret-51b7";

/// A compiled `toolexec serve` configured by a file, as an operator runs it: one command tool
/// (`lint`) with `OPERATOR_SECRET` passed through from the service's environment. The tool
/// resolves `cat` and `sleep` through `PATH`, as any script does.
struct OperatorService {
    served: toolexec_tests::binary::Served,
    http: reqwest::Client,
    _tools: Folder,
    _data: tempfile::TempDir,
}

impl OperatorService {
    fn start() -> Self {
        let tools = folder();
        let lint = tools.0.join("lint.sh");
        std::fs::write(
            &lint,
            "#!/bin/sh\ninput=$(cat)\necho \"input: $input\"\necho \"secret-length: ${#OPERATOR_SECRET}\"\ncase \"$input\" in *slow*) sleep 3;; esac\n",
        )
        .unwrap();
        std::fs::set_permissions(&lint, std::fs::Permissions::from_mode(0o755)).unwrap();
        let data = tempfile::tempdir().unwrap();
        std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let file = data.path().join("service.toml");
        std::fs::write(
            &file,
            format!(
                "bind = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nlog_format = \"json\"\n\n[tools]\ndir = \"{}\"\n\n[[tools.command]]\nname = \"lint\"\ndescription = \"Lints the project.\"\nentrypoint = \"lint.sh\"\ninput_schema = {{ type = \"object\" }}\ntimeout_ms = 20000\nenv_passthrough = [\"OPERATOR_SECRET\"]\n",
                data.path().display(),
                tools.0.display()
            ),
        )
        .unwrap();
        let mut cmd = toolexec_tests::binary::toolexec(data.path());
        cmd.args(["--config", file.to_str().unwrap(), "serve"])
            .env("OPERATOR_SECRET", SECRET);
        let served = toolexec_tests::binary::serve(cmd);
        OperatorService {
            served,
            http: reqwest::Client::new(),
            _tools: tools,
            _data: data,
        }
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.served.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }

    async fn call(&self, sid: &str, id: &str, name: &str, args: Value) -> Value {
        let (status, body) = self
            .post(
                &format!("/v1/sessions/{sid}/calls"),
                json!({"calls": [{"id": id, "name": name, "arguments": args}]}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body["results"][0].clone()
    }

    /// Files of the session's workspace that hold the secret (read by `/bin/grep`, whatever
    /// the session's PATH says); empty when none does.
    async fn leaks(&self, sid: &str) -> String {
        let r = self
            .call(
                sid,
                "look",
                "shell",
                json!({"command": format!("/bin/grep -rl -e '{SECRET}' /workspace || echo CLEAN")}),
            )
            .await;
        assert_eq!(r["status"], "ok", "{r}");
        let text = r["content"].as_str().unwrap_or_default();
        if text.contains("CLEAN") {
            String::new()
        } else {
            text.to_owned()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_bash_env_runs_nothing_in_an_operators_command_tool() {
    let svc = OperatorService::start();
    // The attack of the issue: BASH_ENV names a script of the tenant's, which bash ran before
    // the tool (with the tool's environment, secret included).
    let (status, body) = svc
        .post(
            "/v1/sessions",
            json!({"env": {"BASH_ENV": "/workspace/pwn.sh"}}),
        )
        .await;
    let mut leaked = String::new();
    if status == 201 {
        let sid = body["id"].as_str().unwrap().to_owned();
        let w = svc
            .call(
                &sid,
                "w",
                "write_file",
                json!({"file_path": "pwn.sh", "content": "echo \"leak=$OPERATOR_SECRET\" >> /workspace/leak.txt\n"}),
            )
            .await;
        assert_eq!(w["status"], "ok", "{w}");
        let r = svc.call(&sid, "t", "lint", json!({"x": 1})).await;
        assert_eq!(r["status"], "ok", "{r}");
        leaked = svc.leaks(&sid).await;
    }
    assert!(
        leaked.is_empty(),
        "the tool's secret reached the workspace: {leaked}"
    );
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["code"], "invalid_env", "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("BASH_ENV"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_path_cannot_put_its_own_cat_into_an_operators_command_tool() {
    let svc = OperatorService::start();
    // PATH stays allowed for the session's own commands; it must not reach the tool.
    let (status, body) = svc
        .post(
            "/v1/sessions",
            json!({"env": {"PATH": "/workspace/bin:/usr/bin:/bin"}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let sid = body["id"].as_str().unwrap().to_owned();
    let fake = svc
        .call(
            &sid,
            "fake",
            "shell",
            json!({"command": "mkdir -p bin && printf '#!/bin/sh\\necho \"leak=$OPERATOR_SECRET\" >> /workspace/leak.txt\\nexec /bin/cat \"$@\"\\n' > bin/cat && chmod +x bin/cat && command -v cat"}),
        )
        .await;
    assert!(
        fake["content"]
            .as_str()
            .unwrap_or_default()
            .contains("/workspace/bin/cat"),
        "the session's own commands use its PATH: {fake}"
    );
    let r = svc.call(&sid, "t", "lint", json!({"x": 1})).await;
    assert_eq!(r["status"], "ok", "{r}");
    let text = r["content"].as_str().unwrap_or_default();
    assert!(text.contains(r#"input: {"x":1}"#), "{r}");
    assert!(
        text.contains(&format!("secret-length: {}", SECRET.len())),
        "the operator's variable reaches its tool: {r}"
    );
    let leaked = svc.leaks(&sid).await;
    assert!(
        leaked.is_empty(),
        "the tool's secret reached the workspace: {leaked}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_background_process_cannot_read_a_running_tools_environment() {
    let svc = OperatorService::start();
    // The session's own variable of that name shows the watcher does read the environments it
    // can see.
    let (status, body) = svc
        .post(
            "/v1/sessions",
            json!({"env": {"OPERATOR_SECRET": "the-tenants-own"}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let sid = body["id"].as_str().unwrap().to_owned();
    // Same user as the tool: a process of the session that shared the tool's PID namespace
    // and Landlock domain could read its /proc/PID/environ. (Landlock already kept sibling
    // commands of a resident sandbox apart; the tool now runs in a sandbox of its own.)
    let watcher = svc
        .call(
            &sid,
            "watch",
            "shell",
            json!({"command": "for i in $(seq 1 80); do for f in /proc/[0-9]*/environ; do cat $f 2>/dev/null | tr '\\0' '\\n'; done | grep -a '^OPERATOR_SECRET=' >> /workspace/proc-leak.txt; sleep 0.05; done; echo watched", "background": true}),
        )
        .await;
    assert_eq!(watcher["status"], "ok", "{watcher}");
    let r = svc.call(&sid, "t", "lint", json!({"mode": "slow"})).await;
    assert_eq!(r["status"], "ok", "{r}");
    let done = svc
        .call(
            &sid,
            "wait",
            "process_read",
            json!({"process_id": "p1", "wait_ms": 20000}),
        )
        .await;
    assert!(
        done["content"]
            .as_str()
            .unwrap_or_default()
            .contains("watched"),
        "{done}"
    );
    let seen = svc
        .call(
            &sid,
            "seen",
            "read_file",
            json!({"file_path": "proc-leak.txt"}),
        )
        .await;
    assert!(
        seen["content"]
            .as_str()
            .unwrap_or_default()
            .contains("OPERATOR_SECRET=the-tenants-own"),
        "{seen}"
    );
    let leaked = svc.leaks(&sid).await;
    assert!(
        leaked.is_empty(),
        "the tool's secret reached the workspace: {leaked}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_tool_gets_its_input_on_stdin_and_the_operators_environment_only() {
    let dir = folder();
    for (name, body) in [
        (
            "env.sh",
            "#!/bin/sh\necho \"bytes: $(wc -c)\"\necho \"argv: $0 $#\"\necho \"tmp: $(ls -A /tmp)\"\nenv | LC_ALL=C sort\n",
        ),
        ("slow.sh", "#!/bin/sh\necho started\nsleep 30\necho never\n"),
        ("broken.sh", "#!/no/such/interpreter\n"),
    ] {
        let path = dir.0.join(name);
        std::fs::write(&path, body).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let mut slow = tool("slow", "slow.sh", json!({"type": "object"}));
    slow.timeout_ms = Some(1000);
    let mut show_env = tool("show_env", "env.sh", json!({"type": "object"}));
    show_env.env = [("TOOL_MODE".to_owned(), "strict".to_owned())].into();
    let tools = CustomToolsConfig {
        dir: Some(dir.0.clone()),
        command: vec![
            show_env,
            slow,
            tool("broken", "broken.sh", json!({"type": "object"})),
        ],
        ..Default::default()
    };
    let app = spawn_app_with(|c| c.tools = tools).await;
    let sid = app
        .session(json!({"env": {"FROM_TENANT": "tenant-value", "PATH": "/workspace/bin"}}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Whatever the session's own commands leave in their /tmp is not the tool's.
    let planted = app
        .call(
            &sid,
            "p1",
            "shell",
            json!({"command": "/bin/mkdir -p /tmp/.config && /bin/touch /tmp/.gitconfig /tmp/planted"}),
        )
        .await;
    assert_eq!(planted["status"], "ok", "{planted}");
    // An input far above what an environment variable could carry (128 KiB) comes whole on
    // stdin.
    let big = "x".repeat(300 * 1024);
    let r = app.call(&sid, "e1", "show_env", json!({"text": big})).await;
    assert_eq!(
        r["status"],
        "ok",
        "{}",
        &r.to_string()[..500.min(r.to_string().len())]
    );
    let text = r["content"].as_str().unwrap();
    let expected_bytes = json!({"text": big}).to_string().len();
    assert!(text.contains(&format!("bytes: {expected_bytes}")), "{text}");
    // Exec'd directly: no shell in between, the entrypoint is the process.
    assert!(
        text.contains(&format!("argv: {}/env.sh 0", dir.0.display())),
        "{text}"
    );
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        // The script's shell adds its own (PWD, SHLVL, _): not the service's doing.
        .filter(|k| !k.contains(' ') && !["PWD", "OLDPWD", "SHLVL", "_"].contains(k))
        .collect();
    assert_eq!(
        names,
        [
            "HOME",
            "LANG",
            "PATH",
            "TERM",
            "TOOLEXEC_TOOL_NAME",
            "TOOL_MODE"
        ],
        "{text}"
    );
    assert!(
        text.contains("\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"),
        "{text}"
    );
    assert!(text.contains("\nHOME=/tmp\n"), "{text}");
    assert!(text.contains("\nTOOL_MODE=strict\n"), "{text}");
    assert!(
        text.contains("\ntmp: \n"),
        "an empty /tmp of its own: {text}"
    );
    assert!(!text.contains("tenant-value"), "{text}");
    // A tool past its time is stopped, with what it printed.
    let t0 = std::time::Instant::now();
    let s = app.call(&sid, "s1", "slow", json!({})).await;
    assert_eq!(s["status"], "timed_out", "{s}");
    let text = s["content"].as_str().unwrap();
    assert!(text.contains("started") && !text.contains("never"), "{s}");
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        t0.elapsed()
    );
    // An entrypoint that cannot be exec'd is the operator's problem, and the result says so.
    let b = app.call(&sid, "b1", "broken", json!({})).await;
    assert_eq!(b["status"], "error", "{b}");
    let text = b["content"].as_str().unwrap();
    assert!(
        text.contains("could not be started") && text.contains("Tell the operator"),
        "{b}"
    );
}
