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

/// `toolexec serve` started the way an operator does, with a config file; killed on drop.
struct Served {
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `toolexec serve` through `bash -c "<prelude>; exec toolexec serve …"` (so a test can set
/// limits first) and waits until it logs that it listens.
fn serve_with(prelude: &str) -> Served {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolexec.toml");
    std::fs::write(
        &config,
        format!(
            "bind = \"127.0.0.1:0\"\nlog_format = \"text\"\ndata_dir = \"{}\"\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let mut child = Command::new("/bin/bash")
        .arg("-c")
        .arg(format!("{prelude}; exec \"$0\" --config \"$1\" serve"))
        .arg(env!("CARGO_BIN_EXE_toolexec"))
        .arg(&config)
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut seen = Vec::new();
    while std::time::Instant::now() < deadline {
        match rx.recv_timeout(std::time::Duration::from_millis(200)) {
            Ok(line) if line.contains("listening") => {
                return Served { child, _dir: dir };
            }
            Ok(line) => seen.push(line),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("toolexec serve did not start:\n{}", seen.join("\n"));
}

fn limit_of(pid: u32, name: &str) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits.lines().find(|l| l.starts_with(name)).unwrap();
    let fields: Vec<&str> = line[name.len()..].split_whitespace().collect();
    (fields[0].to_owned(), fields[1].to_owned())
}

#[test]
fn serving_raises_the_soft_open_file_limit_to_the_hard_limit() {
    let served = serve_with("ulimit -S -n 1024 && ulimit -H -n 8192");
    assert_eq!(
        limit_of(served.child.id(), "Max open files"),
        ("8192".to_owned(), "8192".to_owned())
    );
}

fn toolexec(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_toolexec"))
        .args(args)
        .env_remove("TOOLEXEC_CONFIG")
        .current_dir(dir)
        .output()
        .unwrap()
}

#[test]
fn tools_list_shows_every_tool_and_what_this_configuration_can_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = toolexec(dir.path(), &["tools", "list"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let registry = toolexec_tools::Registry::builtin().unwrap();
    for spec in registry.specs() {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(spec.name.as_str()))
            .unwrap_or_else(|| panic!("{} not listed:\n{text}", spec.name));
        let available = if spec.name == "web_search" {
            "no"
        } else {
            "yes"
        };
        assert_eq!(line.split_whitespace().nth(3), Some(available), "{line}");
    }
    // Configured with a provider, web_search is available.
    std::fs::write(
        dir.path().join("toolexec.toml"),
        "[web]\nsearch_provider = \"searxng\"\nsearch_url = \"http://127.0.0.1:9/search\"\n",
    )
    .unwrap();
    let out = toolexec(dir.path(), &["tools", "list"]);
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text.lines().find(|l| l.starts_with("web_search ")).unwrap();
    assert_eq!(line.split_whitespace().nth(3), Some("yes"), "{line}");
}

#[test]
fn tools_describe_prints_the_manual_or_a_providers_definition() {
    let dir = tempfile::tempdir().unwrap();
    let out = toolexec(dir.path(), &["tools", "describe", "web_search"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("web_search\n"), "{text}");
    assert!(text.contains("available: no ("), "{text}");
    assert!(text.contains("\"query\""), "{text}");

    let out = toolexec(
        dir.path(),
        &["tools", "describe", "read_file", "--format", "anthropic"],
    );
    assert!(out.status.success());
    let def: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(def["name"], "read_file");
    assert_eq!(def["input_schema"]["additionalProperties"], false);
    let out = toolexec(
        dir.path(),
        &["tools", "describe", "read_file", "--format", "openai"],
    );
    let def: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(def["type"], "function");
    assert_eq!(def["strict"], true);

    let out = toolexec(dir.path(), &["tools", "describe", "nope"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("toolexec tools list"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
