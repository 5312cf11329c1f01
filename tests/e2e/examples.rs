//! The examples a newcomer reads work: `examples/agent_loop.py`, written on the Python client
//! (clients/python, imported from the source tree), drives a real session with the official
//! Anthropic SDK, against a fake model on loopback (tests/python/agent_loop_example.py); and
//! three ecosystems drive one session (tests/python/three_doors.py). The TypeScript twin,
//! examples/agent_loop.mjs, runs in the TypeScript client's suite (`.ci/clients`).
use toolexec_tests::app::spawn_app;

/// Runs `tests/python/{script}` against a fresh service; it must print "ok" within 2 minutes.
async fn python_prints_ok(script: &str, needs: &str) {
    let app = spawn_app().await;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join(script);
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .arg(&path)
            .arg(&app.base)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{script} finished within 2 minutes"))
    .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "tests/python/{script} failed (needs `pip install {needs}`; .ci/run installs it):\n{stdout}\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_agent_loop_runs_a_scripted_model_through_a_recorded_session() {
    python_prints_ok("agent_loop_example.py", "anthropic").await;
}

/// Issue 14's "done when": an Anthropic-style loop, an OpenAI-style loop and an MCP client (each
/// with its official SDK) drive one session through the same recorded pipeline, and a gated
/// call waits for a reviewer whose name the log shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_ecosystems_drive_one_session_and_a_reviewer_approves() {
    python_prints_ok("three_doors.py", "anthropic openai mcp==2.3.0").await;
}
