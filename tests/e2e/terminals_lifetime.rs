//! Terminals at their edges: a command too large for one message to the sandbox still gets
//! its PTY made inside; a running terminal keeps the session's runtime (and with it the
//! terminal) from being dropped from the node's cache.
use serde_json::json;
use toolexec_tests::app::{spawn_app, spawn_app_with};

/// A command over the 60 KiB that travel inside the message to the sandbox goes in a memfd
/// (`TtyCommandInMemfd`): its terminal is still the sandbox's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_too_large_for_one_message_still_gets_the_sandboxs_own_pty() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let padding = "x".repeat(80 * 1024);
    let cmd = format!(": {padding}; tty; stty size");
    let r = app
        .call(
            &sid,
            "big",
            "exec_command",
            json!({"cmd": cmd, "tty": true, "cols": 100, "rows": 30, "yield_time_ms": 5000}),
        )
        .await;
    let text = r["content"].as_str().unwrap().replace("\r\n", "\n");
    assert!(
        text.contains("Process exited with code 0"),
        "{}",
        &text[..text.len().min(400)]
    );
    assert!(
        text.ends_with("Output:\n/dev/pts/0\n30 100\n"),
        "{}",
        &text[text.len().saturating_sub(400)..]
    );
}

/// A session whose terminal still runs keeps its runtime on the node: using other sessions
/// past `limits.max_cached_sessions` does not drop it (which would kill the terminal without a
/// record); once the program ended, it may be dropped again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_terminal_keeps_its_sessions_runtime_from_eviction() {
    let app = spawn_app_with(|c| c.limits.max_cached_sessions = 1).await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .call(
            &sid,
            "t1",
            "exec_command",
            json!({"cmd": "cat", "tty": true, "yield_time_ms": 250}),
        )
        .await;
    let text = r["content"].as_str().unwrap();
    let id: u32 = text
        .lines()
        .find_map(|l| l.strip_prefix("Process running with session ID "))
        .unwrap_or_else(|| panic!("not running: {r}"))
        .parse()
        .unwrap();
    let evicted = app.metric("toolexec_session_runtimes_evicted_total").await;
    for n in 0..3 {
        let other = app.session(json!({})).await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let r = app
            .call(
                &other,
                &format!("o{n}"),
                "write_file",
                json!({"file_path": "o.txt", "content": "o\n"}),
            )
            .await;
        assert_eq!(r["status"], "ok", "{r}");
    }
    let r = app
        .call(
            &sid,
            "t2",
            "write_stdin",
            json!({"session_id": id, "chars": "still here\n", "yield_time_ms": 1000}),
        )
        .await;
    assert!(r["content"].as_str().unwrap().contains("still here"), "{r}");
    // The other sessions' runtimes were dropped instead (one cached runtime).
    assert!(
        app.metric("toolexec_session_runtimes_evicted_total").await >= evicted + 2.0,
        "nothing was evicted"
    );
    let events = app.events(&sid).await;
    assert!(
        !events.iter().any(|e| e["kind"] == "terminal.exited"),
        "{events:?}"
    );
}
