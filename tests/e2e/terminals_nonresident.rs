//! Living terminals where the service runs each command in a sandbox of its own
//! (`sandbox.resident = false`): the persistent `bash` and pipe terminals work; `tty: true`,
//! whose PTY is made inside the resident sandbox's own devpts, is refused with a clear error.
use serde_json::json;
use toolexec_tests::app::spawn_app_with;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_resident_sandbox_bash_and_pipes_work_and_a_pty_is_refused_clearly() {
    let app = spawn_app_with(|c| c.sandbox.resident = false).await;
    let s = app.session(json!({"files": {"sub/a.txt": "x"}})).await;
    let sid = s["id"].as_str().unwrap().to_owned();
    let r = app
        .call(
            &sid,
            "b1",
            "bash",
            json!({"command": "cd sub && export FOO=bar"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let r = app
        .call(
            &sid,
            "b2",
            "bash",
            json!({"command": "pwd; echo \"$FOO\"; ls /dev/pts | wc -l"}),
        )
        .await;
    assert_eq!(r["content"], "/workspace/sub\nbar\n1\n", "{r}");
    // A pipe terminal: runs, its output polled.
    let r = app
        .call(
            &sid,
            "e1",
            "exec_command",
            json!({"cmd": "echo piped; exit 4", "yield_time_ms": 5000}),
        )
        .await;
    let text = r["content"].as_str().unwrap();
    assert!(text.contains("Process exited with code 4"), "{r}");
    assert!(text.ends_with("Output:\npiped\n"), "{r}");
    // A PTY: refused, saying why and what to do instead; nothing runs.
    let r = app
        .call(
            &sid,
            "e2",
            "exec_command",
            json!({"cmd": "touch made-by-tty", "tty": true, "yield_time_ms": 1000}),
        )
        .await;
    assert_eq!(r["status"], "error", "{r}");
    let text = r["content"].as_str().unwrap();
    assert!(
        text.contains("tty: true needs the session's resident sandbox")
            && text.contains("sandbox.resident = true")
            && text.contains("run the program with tty: false"),
        "{r}"
    );
    let r = app
        .call(&sid, "b3", "bash", json!({"command": "ls /workspace"}))
        .await;
    assert!(
        !r["content"].as_str().unwrap().contains("made-by-tty"),
        "{r}"
    );
}
