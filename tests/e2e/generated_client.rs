//! The OpenAPI document through a standard generator: `openapi-python-client` makes a Python
//! client from `openapi/openapi.json` (every endpoint, none skipped), and that client drives a
//! session of the real service (tests/python/generated_client.py).
use toolexec_tests::app::spawn_app;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_generated_from_the_openapi_document_drives_a_session() {
    let app = spawn_app().await;
    let out = tempfile::tempdir().unwrap();
    let package = out.path().join("toolexec_client");
    let doc = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/openapi.json");
    let generated = {
        let package = package.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new("openapi-python-client")
                .args(["generate", "--path", doc, "--meta", "none", "--output-path"])
                .arg(&package)
                .output()
        })
        .await
        .unwrap()
        .unwrap_or_else(|e| {
            panic!(
                "openapi-python-client: {e} (needs `pip install openapi-python-client==0.29.1`; .ci/run installs it)"
            )
        })
    };
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&generated.stdout),
        String::from_utf8_lossy(&generated.stderr)
    );
    assert!(generated.status.success(), "{said}");
    assert!(
        !said.contains("will not be generated"),
        "an endpoint was skipped:\n{said}"
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/generated_client.py");
    let base = app.base.clone();
    let dir = out.path().to_owned();
    let ran = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .arg(&base)
            .arg(&dir)
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        ran.status.success() && String::from_utf8_lossy(&ran.stdout).trim() == "ok",
        "{}\n{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
}
