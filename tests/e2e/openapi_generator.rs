//! A generator nobody here wrote or configured: openapi-generator (PyPI's `openapi-generator-cli`,
//! which bundles its jar; it runs on Java) makes a Python client from `openapi/openapi.json` with
//! its spec validation on, and that client drives every operation of the document against the
//! real service with an API key (tests/python/openapi_generator_client.py). It refused the
//! document while its license had no SPDX identifier, and its client crashed on a file's bytes
//! while the document called them an array of integers.
//!
//! Where it is: `TOOLEXEC_TEST_OPENAPI_GENERATOR_VENV` names a venv holding it and the client's
//! dependencies (`.ci/run` makes one, see `.ci/openapi-generator`); without it, the
//! `openapi-generator-cli` and `python3` on `PATH`.
use std::path::PathBuf;
use std::process::Command;

use toolexec_tests::app::{TestApp, spawn_app};

/// The generator, and the Python that runs its client.
fn tools() -> (PathBuf, PathBuf) {
    match std::env::var_os("TOOLEXEC_TEST_OPENAPI_GENERATOR_VENV") {
        Some(venv) => {
            let bin = PathBuf::from(venv).join("bin");
            (bin.join("openapi-generator-cli"), bin.join("python3"))
        }
        None => ("openapi-generator-cli".into(), "python3".into()),
    }
}

async fn key_for(app: &TestApp, tenant: &str) -> String {
    let store = app.state.engine.store();
    let t = store.ensure_tenant(tenant).await.unwrap();
    let key = format!("tx_test_{}", uuid::Uuid::new_v4().simple());
    store
        .create_api_key(t.id, &toolexec_api::key_hash(&key), &key[..11])
        .await
        .unwrap();
    key
}

async fn blocking(mut cmd: Command) -> std::io::Result<std::process::Output> {
    tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_openapi_generator_makes_drives_every_operation() {
    let (generator, python) = tools();
    let out = tempfile::tempdir().unwrap();
    let doc = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/openapi.json");
    let mut generate = Command::new(&generator);
    generate
        .args([
            "generate",
            "-g",
            "python",
            "--package-name",
            "toolexec_gen",
            "-i",
            doc,
            "-o",
        ])
        .arg(out.path());
    let generated = blocking(generate).await.unwrap_or_else(|e| {
        panic!(
            "{}: {e} (needs `pip install openapi-generator-cli==7.26.0` and Java; .ci/openapi-generator installs it)",
            generator.display()
        )
    });
    assert!(
        generated.status.success(),
        "openapi-generator refused the document:\n{}{}",
        String::from_utf8_lossy(&generated.stdout),
        String::from_utf8_lossy(&generated.stderr)
    );

    let app = spawn_app().await;
    let key = key_for(&app, "generated").await;
    // A key exists now: after a restart every `/v1` request needs one, as in production.
    let app = app.restart().await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/python/openapi_generator_client.py"
    );
    let mut drive = Command::new(&python);
    drive.arg(script).arg(&app.base).arg(out.path()).arg(&key);
    let ran = blocking(drive).await.unwrap();
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success() && stdout.trim().starts_with("ok "),
        "{stdout}\n{}",
        String::from_utf8_lossy(&ran.stderr)
    );
}
