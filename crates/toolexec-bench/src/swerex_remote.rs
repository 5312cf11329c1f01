//! A real `swerex-remote` (SWE-ReX's own server, from the venv `.ci/swerex` makes) started by the
//! bench and driven with the same HTTP client and the same number of clients as toolexec, in the
//! same run: issue 28's goals are ratios to it (`read_file` for `calls`, `/execute` of `true` for
//! `shell`). It records nothing and sandboxes nothing: it reads the file, or runs the command in
//! a subprocess, and answers.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use crate::{Stats, drive};

/// `--swerex-venv`: where to find `swerex-remote` (`$VENV/bin/swerex-remote`).
pub fn executable(venv: &Path) -> anyhow::Result<PathBuf> {
    let exe = venv.join("bin").join("swerex-remote");
    anyhow::ensure!(
        exe.is_file(),
        "{} is not there; make the venv with `VENV=$(.ci/swerex)` and pass --swerex-venv $VENV",
        exe.display()
    );
    Ok(exe)
}

/// A running `swerex-remote`, stopped when dropped.
pub struct Remote {
    child: Child,
    pub base: String,
    token: String,
}

impl Remote {
    pub async fn start(exe: &Path, http: &reqwest::Client) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let token = uuid::Uuid::new_v4().simple().to_string();
        let child = Command::new(exe)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--auth-token", &token])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let remote = Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            token,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let up = http
                .get(format!("{}/is_alive", remote.base))
                .header("X-API-Key", &remote.token)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if up {
                return Ok(remote);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "swerex-remote did not answer within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// CPU time of the server so far (one Python process) and of the commands it ran and
    /// reaped.
    pub fn cpu(&self) -> Duration {
        crate::cpu::process_and_children(self.child.id())
    }

    /// `clients` clients calling `POST /read_file {path}` for `dur`; each answer is checked to
    /// hold the file's first line.
    pub async fn read_file(
        &self,
        http: &reqwest::Client,
        clients: usize,
        dur: Duration,
        path: &Path,
        first_line: &str,
    ) -> anyhow::Result<Stats> {
        let body = json!({"path": path}).to_string();
        let expect = first_line.replace(' ', "");
        self.drive(http, clients, dur, "read_file", body, expect)
            .await
    }

    /// `clients` clients calling `POST /execute {"command": "true", "shell": true}` for `dur`;
    /// each answer is checked to say exit code 0.
    pub async fn execute_true(
        &self,
        http: &reqwest::Client,
        clients: usize,
        dur: Duration,
    ) -> anyhow::Result<Stats> {
        let body = json!({"command": "true", "shell": true}).to_string();
        self.drive(
            http,
            clients,
            dur,
            "execute",
            body,
            "\"exit_code\":0".to_owned(),
        )
        .await
    }

    async fn drive(
        &self,
        http: &reqwest::Client,
        clients: usize,
        dur: Duration,
        route: &str,
        body: String,
        expect: String,
    ) -> anyhow::Result<Stats> {
        let url = format!("{}/{route}", self.base);
        let http = http.clone();
        let token = self.token.clone();
        drive(clients, dur, move |_, _| {
            let req = http
                .post(url.as_str())
                .header("X-API-Key", token.as_str())
                .header("content-type", "application/json")
                .body(body.clone());
            let expect = expect.clone();
            async move {
                let resp = req.send().await?;
                anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
                let text = resp.text().await?.replace(' ', "");
                anyhow::ensure!(text.contains(&expect), "swerex-remote answered {text}");
                Ok(())
            }
        })
        .await
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
