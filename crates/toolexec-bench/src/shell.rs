//! `toolexec-bench shell`: sandboxed `shell` calls (`{"command": "true"}`) over HTTP through the
//! real service, recorded in a real Postgres log, next to a baseline measured in the same run: a
//! raw spawn of `/bin/bash -c true` from the bench process (stdout and stderr piped and read to
//! the end, exit awaited), at the same client counts. A last line measures the sandbox alone
//! (`ProcessTable::run`, no HTTP, no recording) at one client, to separate the sandbox's cost
//! from the service's.
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use sqlx::Connection;
use toolexec_sandbox::{ProcessTable, RunLimits, Sandbox, SandboxConfig};

use crate::{BenchDb, Server, drive, print_recorder_stats, tempdir};

/// The product goal for one sandboxed command, over a raw spawn of the same command.
const GOAL_P50_OVERHEAD_MS: f64 = 3.0;

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

/// Makes `dir` traversable by the sandbox user (uid 65534).
fn open_up(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("chmod 0755 {}", dir.display()))
}

async fn measure(
    db_url: &str,
    data: &Path,
    dur: Duration,
    client_counts: &[usize],
) -> anyhow::Result<()> {
    // Sandboxed commands run as an unprivileged user, who needs search permission on the
    // workspace root itself (not on the directories above it).
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
        // The benchmark measures commands, not admission control.
        rate_limit_per_second: 0.0,
        sandbox: sandbox.clone(),
        ..Default::default()
    };
    let server = Server::start(config).await?;
    let result = measure_with(&server.base, db_url, data, sandbox, dur, client_counts).await;
    server.stop().await?;
    result
}

async fn measure_with(
    base: &str,
    db_url: &str,
    data: &Path,
    sandbox_config: SandboxConfig,
    dur: Duration,
    client_counts: &[usize],
) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;

    // What the service says about its sandbox; sandboxed numbers only from an enforced one.
    let ready: serde_json::Value = http
        .get(format!("{base}/readyz"))
        .send()
        .await?
        .json()
        .await?;
    let status = &ready["sandbox"];
    let mode = status["mode"].as_str().unwrap_or("?");
    println!(
        "sandbox (GET /readyz): mode {mode}, ready {}: {}",
        status["ready"],
        status["detail"].as_str().unwrap_or("")
    );
    anyhow::ensure!(
        mode == "enforced",
        "sandbox.mode is {mode:?}, not \"enforced\": refusing to report sandboxed numbers ({status})"
    );

    // The sandbox alone, as the service builds it, for the breakdown line.
    let direct_root = data.join("direct");
    open_up(&direct_root)?;
    let direct = Sandbox::probe(sandbox_config, &direct_root).await;
    let direct_status = direct.status();
    anyhow::ensure!(
        direct_status.mode == "enforced",
        "the bench's own sandbox is {:?}, not \"enforced\": {}",
        direct_status.mode,
        direct_status.detail
    );
    let direct_ws = direct_root.join("workspace");
    open_up(&direct_ws)?;
    if let Some((uid, gid)) = direct.workspace_owner() {
        std::os::unix::fs::chown(&direct_ws, Some(uid), Some(gid))?;
    }
    let limits = RunLimits {
        timeout: Duration::from_secs(10),
        idle_timeout: None,
        max_output_bytes: direct.config().max_output_bytes,
        cancel: Default::default(),
    };
    let table = Arc::new(ProcessTable::new(direct, "bench", direct_ws, 1));

    // One session per client slot: agents working side by side.
    let slots = client_counts.iter().copied().max().unwrap_or(1);
    let mut urls = Vec::with_capacity(slots);
    for _ in 0..slots {
        let session: serde_json::Value = http
            .post(format!("{base}/v1/sessions"))
            .json(&json!({}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let sid = session["id"].as_str().context("session id")?.to_owned();
        urls.push(format!("{base}/v1/sessions/{sid}/calls"));
    }
    let urls = Arc::new(urls);

    println!(
        "toolexec-bench shell: `true` per call, {}s per measurement, one session per client",
        dur.as_secs()
    );
    println!(
        "{:>7} | {:>11} {:>8} {:>8} | {:>11} {:>8} {:>8} | {:>6} {:>6} | {:>13}",
        "clients",
        "raw bash/s",
        "p50 ms",
        "p99 ms",
        "sandboxed/s",
        "p50 ms",
        "p99 ms",
        "ratio",
        "p50 ×",
        "p50 overhead"
    );
    let mut rows = Vec::new();
    for &clients in client_counts {
        // Baseline: the same command spawned directly, output read to the end, exit awaited.
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

        let http2 = http.clone();
        let urls2 = urls.clone();
        let run = uuid::Uuid::new_v4().simple().to_string();
        let run2 = run.clone();
        let sandboxed = drive(clients, dur, move |c, n| {
            let http = http2.clone();
            let url = urls2[c % urls2.len()].clone();
            let id = format!("bench_{run2}_{n}");
            async move {
                let resp = http
                    .post(url.as_str())
                    .json(&json!({"calls": [{"id": id, "name": "shell", "arguments": {"command": "true"}}]}))
                    .send()
                    .await?;
                anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
                let body: serde_json::Value = resp.json().await?;
                anyhow::ensure!(body["results"][0]["status"] == "ok", "call failed: {body}");
                Ok(())
            }
        })
        .await?;
        let overhead = sandboxed.pct(0.50) - raw.pct(0.50);
        println!(
            "{:>7} | {:>11.0} {:>8.2} {:>8.2} | {:>11.0} {:>8.2} {:>8.2} | {:>6.2} {:>6.1} | {:>10.2} ms",
            clients,
            raw.rate(),
            raw.pct(0.50),
            raw.pct(0.99),
            sandboxed.rate(),
            sandboxed.pct(0.50),
            sandboxed.pct(0.99),
            sandboxed.rate() / raw.rate(),
            sandboxed.pct(0.50) / raw.pct(0.50),
            overhead,
        );
        rows.push((clients, raw, sandboxed, run));
    }
    println!(
        "ratio = sandboxed calls/s ÷ raw spawns/s; p50 × = sandboxed p50 ÷ raw p50; \
         p50 overhead = sandboxed p50 − raw p50 (same machine, same run)"
    );

    // The sandbox alone: bubblewrap, the init, cgroups, output capture; no HTTP, no JSON, no
    // workspace scan, no recording.
    let t = table.clone();
    let alone = drive(1, dur, move |_c, _n| {
        let t = t.clone();
        let limits = limits.clone();
        async move {
            let f = t.run("", "true", &BTreeMap::new(), false, &limits).await?;
            anyhow::ensure!(
                f.exit_code == Some(0),
                "sandboxed `true` exited with {:?}: {}",
                f.exit_code,
                String::from_utf8_lossy(&f.stderr)
            );
            Ok(())
        }
    })
    .await?;
    println!(
        "sandbox alone (ProcessTable::run, no HTTP, no recording), 1 client: {:.0}/s, p50 {:.2} ms, p99 {:.2} ms",
        alone.rate(),
        alone.pct(0.50),
        alone.pct(0.99)
    );
    if let Some((_, raw, sandboxed, _)) = rows.iter().find(|(c, ..)| *c == 1) {
        println!(
            "p50 at 1 client: raw bash {:.2} ms; + sandbox {:.2} ms = {:.2} ms; + service (HTTP, JSON, workspace scan, recording) {:.2} ms = {:.2} ms",
            raw.pct(0.50),
            alone.pct(0.50) - raw.pct(0.50),
            alone.pct(0.50),
            sandboxed.pct(0.50) - alone.pct(0.50),
            sandboxed.pct(0.50),
        );
    }

    // Every call was recorded: one invocation row per call in the real log. Its recorded
    // duration runs from the call's start (its durable `invocation.started` included) through
    // the command and the workspace scan, up to the finish record.
    let mut conn = sqlx::PgConnection::connect(db_url).await?;
    for (clients, _, sandboxed, run) in &rows {
        let (recorded, duration_p50): (i64, Option<f64>) = sqlx::query_as(
            "SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms)
             FROM invocations WHERE name = 'shell' AND status = 'ok' AND call_id LIKE $1",
        )
        .bind(format!("bench\\_{run}\\_%"))
        .fetch_one(&mut conn)
        .await?;
        println!(
            "{clients} client{}: {recorded} ok shell invocations recorded for {} calls answered; recorded duration (start record, command, workspace scan) p50 {:.2} ms",
            if *clients == 1 { "" } else { "s" },
            sandboxed.calls,
            duration_p50.unwrap_or(0.0),
        );
        anyhow::ensure!(
            recorded as u64 == sandboxed.calls,
            "{} calls answered but {recorded} recorded",
            sandboxed.calls
        );
    }
    conn.close().await?;
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let scans = value("toolexec_workspace_scan_duration_seconds_count ");
    if scans > 0.0 {
        println!(
            "workspace scans: {scans:.0}, {:.2} ms each on average (whole run)",
            value("toolexec_workspace_scan_duration_seconds_sum ") * 1000.0 / scans
        );
    }
    print_recorder_stats(&http, base).await?;

    println!("goal: p50 overhead <= {GOAL_P50_OVERHEAD_MS} ms");
    for (clients, raw, sandboxed, _) in &rows {
        let overhead = sandboxed.pct(0.50) - raw.pct(0.50);
        println!(
            "  {clients} client{}: {overhead:.2} ms ({})",
            if *clients == 1 { "" } else { "s" },
            if overhead <= GOAL_P50_OVERHEAD_MS {
                "met"
            } else {
                "not met"
            }
        );
    }
    Ok(())
}
