//! The examples a newcomer reads work: `examples/agent_loop.py` drives a real session with the
//! official Anthropic SDK, against a fake model on loopback (tests/python/agent_loop_example.py).
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
