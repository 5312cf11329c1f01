//! A session's `env` may not hold the variables that make a shell, an interpreter or a common
//! tool run code of the environment's choosing when it starts (issue 23 §3): refused with 422
//! `invalid_env` naming the variable and why; ordinary variables are kept.
use serde_json::{Value, json};
use toolexec_tests::app::spawn_sqlite_app;

/// One of each family docs/security.md lists, with a value that would run code.
const START_UP_HOOKS: &[(&str, &str)] = &[
    ("BASH_ENV", "/workspace/pwn.sh"),
    ("ENV", "/workspace/pwn.sh"),
    ("SHELLOPTS", "xtrace"),
    ("BASHOPTS", "extdebug"),
    ("PS4", "$(sh /workspace/pwn.sh)"),
    ("PROMPT_COMMAND", "sh /workspace/pwn.sh"),
    ("BASH_FUNC_cat", "() { sh /workspace/pwn.sh; }"),
    ("IFS", "/"),
    ("CDPATH", "/workspace"),
    ("PYTHONSTARTUP", "/workspace/pwn.py"),
    ("PYTHONPATH", "/workspace"),
    ("PYTHONHOME", "/workspace"),
    ("PYTHONWARNINGS", "ignore::pwn.Warning"),
    ("PERL5OPT", "-Mpwn"),
    ("PERL5LIB", "/workspace"),
    ("RUBYOPT", "-rpwn"),
    ("NODE_OPTIONS", "--require /workspace/pwn.js"),
    ("NODE_PATH", "/workspace"),
    ("JAVA_TOOL_OPTIONS", "-javaagent:/workspace/pwn.jar"),
    ("LUA_INIT", "@/workspace/pwn.lua"),
    ("PHPRC", "/workspace"),
    ("OPENSSL_CONF", "/workspace/pwn.cnf"),
    ("GIT_CONFIG_COUNT", "1"),
    ("GIT_SSH_COMMAND", "sh /workspace/pwn.sh"),
    ("GIT_EXEC_PATH", "/workspace"),
    ("LESSOPEN", "|sh /workspace/pwn.sh %s"),
    ("LD_PRELOAD", "/workspace/pwn.so"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_hooks_in_a_session_env_are_refused_naming_the_variable() {
    let app = spawn_sqlite_app().await;
    for (name, value) in START_UP_HOOKS {
        let resp = app
            .post(
                "/v1/sessions",
                &json!({"env": {*name: value, "HARMLESS": "1"}}),
            )
            .await;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap();
        assert_eq!(status, 422, "{name}: {body}");
        assert_eq!(body["code"], "invalid_env", "{name}: {body}");
        let detail = body["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(&format!("env.{name}")), "{name}: {body}");
        assert!(
            detail.contains("in the command"),
            "says what to do instead: {body}"
        );
    }
    let list: Value = app.get("/v1/sessions").await.json().await.unwrap();
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(0), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordinary_variables_in_a_session_env_reach_its_commands() {
    let app = spawn_sqlite_app().await;
    let env = json!({
        "PATH": "/workspace/bin:/usr/bin:/bin",
        "HOME": "/workspace/home",
        "EDITOR": "vi",
        "NODE_ENV": "production",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "GIT_AUTHOR_NAME": "Agent",
        "TMPDIR": "/tmp",
        "TZ": "UTC",
        "CI": "true",
    });
    let sid = app.session(json!({"env": env})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .call(
            &sid,
            "c1",
            "shell",
            json!({"command": "echo $PATH $HOME $EDITOR $NODE_ENV $PYTHONUNBUFFERED $GIT_AUTHOR_NAME $TZ $CI"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(
        r["content"].as_str().unwrap_or_default().contains(
            "/workspace/bin:/usr/bin:/bin /workspace/home vi production 1 Agent UTC true"
        ),
        "{r}"
    );
}

/// A command starts with the base environment, `SHELL` included (the shell it runs in: without
/// it every `bash` looks its user up in the password database to set it), and a session's
/// `env` still wins over every base variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_start_with_the_base_environment_and_the_session_env_over_it() {
    let app = spawn_sqlite_app().await;
    let echo = json!({"command": "echo \"[$SHELL] [$HOME] [$LANG] [$TERM]\""});
    let plain = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app.call(&plain, "c1", "shell", echo.clone()).await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(
        r["content"]
            .as_str()
            .unwrap_or_default()
            .contains("[/bin/bash] [/workspace] [C.UTF-8] [dumb]"),
        "{r}"
    );
    let own = app
        .session(json!({"env": {"SHELL": "/bin/sh", "LANG": "C"}}))
        .await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app.call(&own, "c1", "shell", echo).await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(
        r["content"]
            .as_str()
            .unwrap_or_default()
            .contains("[/bin/sh] [/workspace] [C] [dumb]"),
        "{r}"
    );
}
