//! The compiled `toolexec` binary, started the way an operator starts it (environment, config
//! file, flags) and driven over HTTP. In-process tests build the configuration by hand and so
//! cannot see what the binary does with the environment.
//! Test-only code: panicking on a failed setup is the point.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// `target/<profile>/toolexec`: cargo builds the server's binary with the workspace's tests
/// (its own integration tests need it), next to the `deps/` directory of this test binary.
pub fn toolexec_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("toolexec"))
        .expect("target directory");
    assert!(
        bin.is_file(),
        "{} is missing: run the tests with `cargo nextest run --workspace` (or build it with `cargo build -p toolexec-server`)",
        bin.display()
    );
    bin
}

/// A `toolexec` command with an empty environment but `PATH` (and the given variables), in
/// `dir`.
pub fn toolexec(dir: &std::path::Path) -> Command {
    let mut cmd = Command::new(toolexec_binary());
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .current_dir(dir);
    cmd
}

/// A running `toolexec serve`, killed on drop.
pub struct Served {
    pub child: Child,
    /// `http://127.0.0.1:PORT`, from the "listening" line of its log.
    pub base: String,
    /// Log lines so far (JSON objects).
    pub log: Vec<serde_json::Value>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What became of a start.
pub enum Started {
    Serving(Served),
    /// It exited; its stderr.
    Exited(String),
}

/// Spawns `cmd` (a `toolexec … serve` command) with JSON logs and waits until it logs that it
/// listens (or exits).
pub fn start(mut cmd: Command) -> Started {
    // The tests' HTTP clients need a rustls provider (see `install_tls_provider`).
    toolexec_tools::web::install_tls_provider();
    cmd.env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawning toolexec");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut lines: Vec<String> = Vec::new();
    let mut log = Vec::new();
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if v["message"] == "listening" {
                        let address = v["address"].as_str().expect("address").to_owned();
                        log.push(v);
                        return Started::Serving(Served {
                            child,
                            base: format!("http://{address}"),
                            log,
                        });
                    }
                    log.push(v);
                }
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Ok(Some(_)) = child.try_wait() {
                    // Drain what it printed before exiting.
                    while let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
                        lines.push(line);
                    }
                    return Started::Exited(lines.join("\n"));
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = child.wait();
                return Started::Exited(lines.join("\n"));
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("toolexec did not start within 60 s:\n{}", lines.join("\n"));
}

/// [`start`], which must serve.
pub fn serve(cmd: Command) -> Served {
    match start(cmd) {
        Started::Serving(s) => s,
        Started::Exited(log) => panic!("toolexec exited instead of serving:\n{log}"),
    }
}
