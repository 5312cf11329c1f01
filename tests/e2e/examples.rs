//! The examples a newcomer reads work: `examples/agent_loop.py` drives a real session with the
//! official Anthropic SDK, against a fake model on loopback (tests/python/agent_loop_example.py);
//! and three ecosystems drive one session (tests/python/three_doors.py).
use toolexec_tests::app::spawn_app;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_agent_loop_runs_a_scripted_model_through_a_recorded_session() {
    let app = spawn_app().await;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/agent_loop_example.py");
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .arg(&script)
            .arg(&app.base)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the example finished within 2 minutes")
    .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "examples/agent_loop.py failed (needs `pip install anthropic`; .ci/run installs it):\n{stdout}\n{stderr}"
    );
}

/// Issue 14's "done when": an Anthropic-style loop, an OpenAI-style loop and an MCP client (each
/// with its official SDK) drive one session through the same recorded pipeline, and a gated
/// call waits for a reviewer whose name the log shows (tests/python/three_doors.py).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_ecosystems_drive_one_session_and_a_reviewer_approves() {
    let app = spawn_app().await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/three_doors.py");
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .arg(&script)
            .arg(&app.base)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the three loops finished within 2 minutes")
    .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "tests/python/three_doors.py failed (needs `pip install anthropic openai mcp==2.3.0`; .ci/run installs them):\n{stdout}\n{stderr}"
    );
}
