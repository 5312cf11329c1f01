//! The binary's command line, run as a process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn stray_toolexec_variables_do_not_stop_the_binary_from_starting() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolexec.toml");
    std::fs::write(&config, "bind = \"127.0.0.1:9\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolexec"))
        .arg("tools-doc")
        .env("TOOLEXEC_CONFIG", &config)
        .env("TOOLEXEC_SERVICE_HOST", "10.0.0.1")
        .env("TOOLEXEC_PORT_8080_TCP", "tcp://10.0.0.1:8080")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("# Tools reference"));
}

#[test]
fn a_typo_in_the_config_file_is_an_error_that_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolexec.toml");
    std::fs::write(&config, "bnid = \"127.0.0.1:9\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_toolexec"))
        .args(["--config", config.to_str().unwrap(), "tools-doc"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bnid"));
}
