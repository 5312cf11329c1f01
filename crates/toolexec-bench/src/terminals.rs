//! `toolexec-bench terminals`: the living terminals of issue 24, next to baselines measured in
//! the same run.
//!
//! - `bash` calls of `true` over HTTP (one session per client, its persistent shell already
//!   started) against a raw spawn of `/bin/bash -c true` from the bench process, and against
//!   `shell` calls of `true` at the same client counts;
//! - the persistent shell alone (`ProcessTable::bash`, no HTTP, no recording);
//! - a `write_stdin` round trip to a running `cat` in a terminal: the time from writing a line
//!   to its echo coming back (`ProcessTable::terminal_input`, returning at the first output; the
//!   `write_stdin` tool itself then waits its `yield_time_ms`, Codex's contract);
//! - memory per idle terminal: the service's resident memory (this process holds the terminals'
//!   tables) and the programs' proportional set size, over 64 idle terminals.
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use toolexec_sandbox::{BashLimits, ProcessTable, Sandbox, SandboxConfig};

use crate::shell::{new_session, open_up};
use crate::{BenchDb, Server, drive, tempdir};

const GOAL_P50_OVERHEAD_MS: f64 = 2.0;
const GOAL_RATIO_TO_SHELL_AT_8: f64 = 1.5;
const GOAL_ROUND_TRIP_P50_MS: f64 = 2.0;
const GOAL_BYTES_PER_IDLE_TERMINAL: f64 = 200.0 * 1024.0;
const IDLE_TERMINALS: usize = 64;

pub async fn run(admin_url: &str, dur: Duration, client_counts: &[usize]) -> anyhow::Result<()> {
    anyhow::ensure!(
        !client_counts.is_empty() && !client_counts.contains(&0),
        "--clients needs at least one count, each at least 1"
    );
    let db = BenchDb::create(admin_url).await?;
    let data = tempdir()?;
    let result = measure(&db.url, &data, dur, client_counts).await;
    let _ = std::fs::remove_dir_all(&data);
    db.drop().await?;
    result
}

async fn measure(
    db_url: &str,
    data: &Path,
    dur: Duration,
    client_counts: &[usize],
) -> anyhow::Result<()> {
    let workspaces = data.join("workspaces");
    open_up(&workspaces)?;
    let sandbox = SandboxConfig::default();
    let config = toolexec_server::Config {
        bind: "127.0.0.1:0".into(),
        database_url: Some(db_url.to_owned()),
        data_dir: data.to_owned(),
        workspace_root: Some(workspaces),
        log_format: "text".into(),
        max_db_connections: 16,
        rate_limit_per_second: 0.0,
        sandbox: sandbox.clone(),
        ..Default::default()
    };
    let server = Server::start(config).await?;
    let result = measure_with(&server.base, data, sandbox, dur, client_counts).await;
    server.stop().await?;
    result
}

async fn call(http: &reqwest::Client, url: &str, body: serde_json::Value) -> anyhow::Result<()> {
    let resp = http.post(url).json(&body).send().await?;
    anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
    let body: serde_json::Value = resp.json().await?;
    anyhow::ensure!(body["results"][0]["status"] == "ok", "call failed: {body}");
    Ok(())
}

async fn measure_with(
    base: &str,
    data: &Path,
    sandbox_config: SandboxConfig,
    dur: Duration,
    client_counts: &[usize],
) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let ready: serde_json::Value = http
        .get(format!("{base}/readyz"))
        .send()
        .await?
        .json()
        .await?;
    let mode = ready["sandbox"]["mode"].as_str().unwrap_or("?").to_owned();
    anyhow::ensure!(
        mode == "enforced",
        "sandbox.mode is {mode:?}: refusing to report sandboxed numbers"
    );
    // The bench's own sandbox, for the direct measurements.
    let direct_root = data.join("direct");
    open_up(&direct_root)?;
    let direct = Sandbox::probe(sandbox_config, &direct_root).await;
    anyhow::ensure!(
        direct.status().mode == "enforced",
        "the bench's own sandbox is not enforced: {}",
        direct.status().detail
    );
    let table = |name: &str| -> anyhow::Result<Arc<ProcessTable>> {
        let ws = direct_root.join(name);
        open_up(&ws)?;
        if let Some((uid, gid)) = direct.workspace_owner() {
            std::os::unix::fs::chown(&ws, Some(uid), Some(gid))?;
        }
        Ok(Arc::new(ProcessTable::new(
            direct.clone(),
            name.to_owned(),
            ws,
            1,
        )))
    };

    let slots = client_counts.iter().copied().max().unwrap_or(1);
    let mut bash_urls = Vec::new();
    let mut shell_urls = Vec::new();
    for i in 0..slots {
        let url = new_session(&http, base).await?;
        // The shell is started by a session's first call: started here, outside the timing.
        call(
            &http,
            &url,
            json!({"calls": [{"id": format!("warm{i}"), "name": "bash", "arguments": {"command": "true"}}]}),
        )
        .await?;
        bash_urls.push(url);
        let url = new_session(&http, base).await?;
        call(
            &http,
            &url,
            json!({"calls": [{"id": format!("warm{i}"), "name": "shell", "arguments": {"command": "true"}}]}),
        )
        .await?;
        shell_urls.push(url);
    }
    let bash_urls = Arc::new(bash_urls);
    let shell_urls = Arc::new(shell_urls);
    println!(
        "toolexec-bench terminals: `true` per call, {}s per measurement, one session per client",
        dur.as_secs()
    );
    println!(
        "{:>7} | {:>10} {:>7} | {:>10} {:>7} {:>7} | {:>10} {:>7} {:>7} | {:>12} {:>13}",
        "clients",
        "raw bash/s",
        "p50 ms",
        "shell/s",
        "p50 ms",
        "p99 ms",
        "bash/s",
        "p50 ms",
        "p99 ms",
        "bash÷shell",
        "bash−raw p50"
    );
    let mut rows = Vec::new();
    for &clients in client_counts {
        let raw = drive(clients, dur, |_c, _n| async {
            let out = tokio::process::Command::new("/bin/bash")
                .args(["-c", "true"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .output()
                .await?;
            anyhow::ensure!(out.status.success(), "bash -c true: {}", out.status);
            Ok(())
        })
        .await?;
        let run = uuid::Uuid::new_v4().simple().to_string();
        let (h, u, r) = (http.clone(), shell_urls.clone(), run.clone());
        let shell = drive(clients, dur, move |c, n| {
            let (http, url) = (h.clone(), u[c % u.len()].clone());
            let id = format!("s_{r}_{n}");
            async move {
                call(&http, &url, json!({"calls": [{"id": id, "name": "shell", "arguments": {"command": "true"}}]})).await
            }
        })
        .await?;
        let (h, u, r) = (http.clone(), bash_urls.clone(), run.clone());
        let bash = drive(clients, dur, move |c, n| {
            let (http, url) = (h.clone(), u[c % u.len()].clone());
            let id = format!("b_{r}_{n}");
            async move {
                call(&http, &url, json!({"calls": [{"id": id, "name": "bash", "arguments": {"command": "true"}}]})).await
            }
        })
        .await?;
        println!(
            "{:>7} | {:>10.0} {:>7.2} | {:>10.0} {:>7.2} {:>7.2} | {:>10.0} {:>7.2} {:>7.2} | {:>12.2} {:>10.2} ms",
            clients,
            raw.rate(),
            raw.pct(0.5),
            shell.rate(),
            shell.pct(0.5),
            shell.pct(0.99),
            bash.rate(),
            bash.pct(0.5),
            bash.pct(0.99),
            bash.rate() / shell.rate(),
            bash.pct(0.5) - raw.pct(0.5),
        );
        rows.push((clients, raw, shell, bash));
    }

    // The persistent shell alone: no HTTP, no recording, no workspace scan.
    let t = table("alone")?;
    let limits = BashLimits {
        timeout: Duration::from_secs(10),
        max_output_bytes: direct.config().max_output_bytes,
        cancel: Default::default(),
    };
    let env = BTreeMap::new();
    t.bash(Some("true"), false, &env, false, &limits).await?;
    let (t2, l2) = (t.clone(), limits.clone());
    let alone = drive(1, dur, move |_c, _n| {
        let (t, limits) = (t2.clone(), l2.clone());
        async move {
            let run = t
                .bash(Some("true"), false, &BTreeMap::new(), false, &limits)
                .await?;
            anyhow::ensure!(run.exit_code == Some(0), "bash `true`: {run:?}");
            Ok(())
        }
    })
    .await?;
    println!(
        "persistent shell alone (ProcessTable::bash `true`, 1 client): {:.0}/s, p50 {:.3} ms, p99 {:.3} ms",
        alone.rate(),
        alone.pct(0.5),
        alone.pct(0.99)
    );

    // write_stdin round trip to `cat` in a terminal.
    let t = table("cat")?;
    let opened = t
        .exec_terminal(
            "",
            // No echo: what comes back is cat's own output, not the terminal's echo.
            "stty -echo; exec cat",
            "cat",
            Some((80, 24)),
            &env,
            false,
            16,
            Duration::from_secs(600),
            Duration::from_millis(250),
        )
        .await?
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let id = opened.id;
    let t2 = t.clone();
    let round = drive(1, dur, move |_c, n| {
        let t = t2.clone();
        async move {
            let line = format!("{n}\n");
            let mut seen = Vec::new();
            // Until cat printed the line back (`\r\n`: the terminal's output translation).
            while !seen.ends_with(b"\r\n") || seen.len() < line.len() {
                let chars = if seen.is_empty() {
                    line.as_bytes()
                } else {
                    b""
                };
                let r = t
                    .terminal_input(id, chars, Duration::from_secs(5), true)
                    .await
                    .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                anyhow::ensure!(!r.output.is_empty(), "no echo within 5 s");
                seen.extend_from_slice(&r.output);
            }
            Ok(())
        }
    })
    .await?;
    println!(
        "write_stdin round trip to cat in a PTY without echo (write a line, cat's line back), 1 client: {:.0}/s, p50 {:.3} ms, p99 {:.3} ms",
        round.rate(),
        round.pct(0.5),
        round.pct(0.99)
    );

    // Memory per idle terminal.
    let token = format!("{}.{}", 86_400, std::process::id());
    let rss0 = rss_bytes();
    let mut tables = Vec::new();
    for s in 0..IDLE_TERMINALS.div_ceil(16) {
        let t = table(&format!("idle{s}"))?;
        for i in 0..16.min(IDLE_TERMINALS - s * 16) {
            t.exec_terminal(
                "",
                &format!("exec sleep {token}"),
                "sleep",
                (i % 2 == 0).then_some((80, 24)),
                &env,
                false,
                16,
                Duration::from_secs(600),
                Duration::from_millis(250),
            )
            .await?
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        }
        tables.push(t);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss1 = rss_bytes();
    let pids = pids_matching(&format!("sleep {token}"));
    let pss: u64 = pids.iter().map(|p| pss_bytes(*p)).sum();
    let service = rss1.saturating_sub(rss0) as f64 / IDLE_TERMINALS as f64;
    let programs = pss as f64 / pids.len().max(1) as f64;
    println!(
        "{IDLE_TERMINALS} idle terminals (sleep, half with a PTY): service RSS +{:.0} KiB each; the program's PSS {:.0} KiB each ({} processes); total {:.0} KiB each",
        service / 1024.0,
        programs / 1024.0,
        pids.len(),
        (service + programs) / 1024.0
    );
    for t in &tables {
        t.shutdown().await;
    }

    println!("goals (issue 24):");
    if let Some((_, raw, _, bash)) = rows.iter().find(|(c, ..)| *c == 1) {
        let over = bash.pct(0.5) - raw.pct(0.5);
        println!(
            "  bash `true` p50 over raw bash -c true at 1 client ≤ {GOAL_P50_OVERHEAD_MS} ms: {over:.2} ms over HTTP and recorded ({}); the shell alone {:.2} ms vs raw {:.2} ms ({})",
            if over <= GOAL_P50_OVERHEAD_MS {
                "met"
            } else {
                "NOT met"
            },
            alone.pct(0.5),
            raw.pct(0.5),
            if alone.pct(0.5) - raw.pct(0.5) <= GOAL_P50_OVERHEAD_MS {
                "met"
            } else {
                "NOT met"
            },
        );
    }
    if let Some((_, _, shell, bash)) = rows.iter().find(|(c, ..)| *c == 8) {
        let ratio = bash.rate() / shell.rate();
        println!(
            "  bash calls/s at 8 clients ≥ {GOAL_RATIO_TO_SHELL_AT_8}× shell's: {ratio:.2}× ({})",
            if ratio >= GOAL_RATIO_TO_SHELL_AT_8 {
                "met"
            } else {
                "NOT met"
            }
        );
    }
    println!(
        "  write_stdin round trip p50 ≤ {GOAL_ROUND_TRIP_P50_MS} ms: {:.3} ms ({})",
        round.pct(0.5),
        if round.pct(0.5) <= GOAL_ROUND_TRIP_P50_MS {
            "met"
        } else {
            "NOT met"
        }
    );
    let total = service + programs;
    println!(
        "  memory per idle terminal ≤ 200 KiB: {:.0} KiB ({})",
        total / 1024.0,
        if total <= GOAL_BYTES_PER_IDLE_TERMINAL {
            "met"
        } else {
            "NOT met"
        }
    );
    Ok(())
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

fn pss_bytes(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

fn pids_matching(token: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(raw) = std::fs::read(e.path().join("cmdline"))
            && String::from_utf8_lossy(&raw)
                .trim_end_matches('\0')
                .replace('\0', " ")
                == token
        {
            pids.push(pid);
        }
    }
    pids
}
