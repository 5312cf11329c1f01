//! `toolexec-bench shell`: sandboxed `shell` calls (`{"command": "true"}`) over HTTP through the
//! real service, recorded in a real Postgres log, next to a baseline measured in the same run: a
//! raw spawn of `/bin/bash -c true` from the bench process (stdout and stderr piped and read to
//! the end, exit awaited), at the same client counts. Then, at one client: the sandbox alone
//! (`ProcessTable::run`, no HTTP, no recording), the service's floor (a recorded mutating call
//! that does nothing: `update_plan` in a session that never ran a command, so no workspace
//! scan), and the first command of a new session (which starts the session's resident sandbox),
//! to say where the time goes. It ends with the goals of issue 12, met or not.
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

/// The product goals for one sandboxed command (issue 12): over a raw spawn of the same command
/// at one client, and the throughput at eight.
const GOAL_P50_OVERHEAD_MS: f64 = 3.0;
const GOAL_P99_OVERHEAD_MS: f64 = 10.0;
const GOAL_CALLS_PER_SECOND_AT_8: f64 = 700.0;
const GOAL_RATIO_AT_8: f64 = 0.6;

/// Issue 28's goals at eight clients: against SWE-ReX's `/execute` of the same command and
/// against raw spawning, both measured in the same run.
const GOAL_TIMES_SWEREX_AT_8: f64 = 2.5;
const GOAL_RAW_FRACTION_AT_8: f64 = 0.9;

pub async fn run(
    admin_url: &str,
    dur: Duration,
    client_counts: &[usize],
    swerex_venv: Option<&Path>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !client_counts.is_empty() && !client_counts.contains(&0),
        "--clients needs at least one count, each at least 1"
    );
    let swerex = swerex_venv
        .map(crate::swerex_remote::executable)
        .transpose()?;
    let db = BenchDb::create(admin_url).await?;
    let data = tempdir()?;
    let result = measure(&db.url, &data, dur, client_counts, swerex.as_deref()).await;
    let _ = std::fs::remove_dir_all(&data);
    db.drop().await?;
    result
}

/// Makes `dir` traversable by the sandbox user (uid 65534).
pub(crate) fn open_up(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("chmod 0755 {}", dir.display()))
}

async fn measure(
    db_url: &str,
    data: &Path,
    dur: Duration,
    client_counts: &[usize],
    swerex: Option<&Path>,
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
    let result = measure_with(
        &server.base,
        db_url,
        data,
        sandbox,
        dur,
        client_counts,
        swerex,
    )
    .await;
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
    swerex: Option<&Path>,
) -> anyhow::Result<()> {
    let db_name = db_url.rsplit('/').next().unwrap_or_default().to_owned();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let remote = match swerex {
        Some(exe) => Some(crate::swerex_remote::Remote::start(exe, &http).await?),
        None => None,
    };
    let mut remote_rows = Vec::new();

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
    // One table (session) per client slot, each with its own workspace, like the service's.
    let slots = client_counts.iter().copied().max().unwrap_or(1);
    let mut tables = Vec::with_capacity(slots);
    for slot in 0..slots {
        let ws = direct_ws.join(format!("s{slot}"));
        open_up(&ws)?;
        if let Some((uid, gid)) = direct.workspace_owner() {
            std::os::unix::fs::chown(&ws, Some(uid), Some(gid))?;
        }
        tables.push(Arc::new(ProcessTable::new(
            direct.clone(),
            format!("bench{slot}"),
            ws,
            1,
        )));
    }
    let tables = Arc::new(tables);
    // The service's floor: a session that never runs a command.
    let mut floor_urls = Vec::with_capacity(slots);
    for _ in 0..slots {
        floor_urls.push(new_session(&http, base).await?);
    }
    let floor_urls = Arc::new(floor_urls);

    // One session per client slot: agents working side by side.
    let mut urls = Vec::with_capacity(slots);
    for _ in 0..slots {
        urls.push(new_session(&http, base).await?);
    }
    let urls = Arc::new(urls);

    println!(
        "toolexec-bench shell: `true` per call, {}s per measurement, one session per client",
        dur.as_secs()
    );
    println!(
        "{:>7} | {:>11} {:>8} {:>8} | {:>11} {:>8} {:>8} | {:>6} {:>6} | {:>13} {:>13}",
        "clients",
        "raw bash/s",
        "p50 ms",
        "p99 ms",
        "sandboxed/s",
        "p50 ms",
        "p99 ms",
        "ratio",
        "p50 ×",
        "p50 overhead",
        "p99 overhead"
    );
    let mut rows = Vec::new();
    let mut breakdown = Vec::new();
    let mut cpu = Vec::new();
    for &clients in client_counts {
        // Baseline: the same command spawned directly, output read to the end, exit awaited.
        let cpu0 = busy_cpu_ms(&db_name);
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
        let raw_cpu = per_call(&db_name, cpu0, &raw);
        let cpu0 = busy_cpu_ms(&db_name);

        let http2 = http.clone();
        let urls2 = urls.clone();
        let run = uuid::Uuid::new_v4().simple().to_string();
        let run2 = run.clone();
        let pg0 = crate::cpu::postgres_backends(&db_name);
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
        let sandboxed_cpu = per_call(&db_name, cpu0, &sandboxed);
        // Postgres's part of it: its backends' CPU (the service's pool stays open, so none of
        // them ends during the phase).
        let sandboxed_pg = crate::cpu::postgres_backends(&db_name)
            .saturating_sub(pg0)
            .as_secs_f64()
            * 1e3
            / sandboxed.calls.max(1) as f64;
        // The sandbox alone: the session's resident agent, the command's cgroup, output
        // capture; no HTTP, no JSON, no workspace scan, no recording.
        let t = tables.clone();
        let lim = limits.clone();
        let cpu0 = busy_cpu_ms(&db_name);
        let alone = drive(clients, dur, move |c, _n| {
            let t = t[c % t.len()].clone();
            let limits = lim.clone();
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
        let alone_cpu = per_call(&db_name, cpu0, &alone);
        // The service's floor: recording a mutating call whose tool does nothing, with no
        // workspace to scan (HTTP, JSON, the durable start, the finish commit).
        let http3 = http.clone();
        let furls = floor_urls.clone();
        let cpu0 = busy_cpu_ms(&db_name);
        let floor = drive(clients, dur, move |c, n| {
            let http = http3.clone();
            let url = furls[c % furls.len()].clone();
            async move {
                let resp = http
                    .post(url.as_str())
                    .json(&json!({"calls": [{"id": format!("plan_{n}"), "name": "update_plan", "arguments": {"plan": [{"step": "measure", "status": "in_progress"}]}}]}))
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
            "{:>7} | {:>11.0} {:>8.2} {:>8.2} | {:>11.0} {:>8.2} {:>8.2} | {:>6.2} {:>6.1} | {:>10.2} ms {:>10.2} ms",
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
            sandboxed.pct(0.99) - raw.pct(0.99),
        );
        let floor_cpu = per_call(&db_name, cpu0, &floor);
        if let Some(remote) = &remote {
            let cpu0 = busy_cpu_ms(&db_name);
            let (remote_cpu0, stats) = (
                remote.cpu(),
                remote.execute_true(&http, clients, dur).await?,
            );
            let remote_cpu = remote.cpu().saturating_sub(remote_cpu0).as_secs_f64() * 1e3
                / stats.calls.max(1) as f64;
            let bench_cpu = per_call(&db_name, cpu0, &stats);
            remote_rows.push((clients, stats, remote_cpu + bench_cpu));
        }
        cpu.push((
            clients,
            raw_cpu,
            sandboxed_cpu,
            sandboxed_pg,
            alone_cpu,
            floor_cpu,
        ));
        breakdown.push((clients, alone, floor));
        rows.push((clients, raw, sandboxed, run));
    }
    println!(
        "ratio = sandboxed calls/s ÷ raw spawns/s; p50 × = sandboxed p50 ÷ raw p50; \
         p50 (p99) overhead = sandboxed p50 (p99) − raw p50 (p99) (same machine, same run)"
    );
    println!(
        "{:>7} | {:>13} {:>8} {:>8} | {:>13} {:>8} {:>8}",
        "clients", "sandbox alone", "p50 ms", "p99 ms", "floor calls/s", "p50 ms", "p99 ms"
    );
    for (clients, alone, floor) in &breakdown {
        println!(
            "{clients:>7} | {:>11.0}/s {:>8.2} {:>8.2} | {:>13.0} {:>8.2} {:>8.2}",
            alone.rate(),
            alone.pct(0.50),
            alone.pct(0.99),
            floor.rate(),
            floor.pct(0.50),
            floor.pct(0.99),
        );
    }
    println!(
        "{:>7} | CPU time per call (this process, its sandboxes, PostgreSQL): raw bash, sandboxed and recorded (of it PostgreSQL), sandbox alone, floor",
        "clients"
    );
    for (clients, raw, sandboxed, pg, alone, floor) in &cpu {
        println!(
            "{clients:>7} | {raw:.2} ms, {sandboxed:.2} ms ({pg:.2} ms), {alone:.2} ms, {floor:.2} ms"
        );
    }
    println!(
        "sandbox alone = ProcessTable::run of `true` (the resident sandbox, its cgroup, output capture; no HTTP, no recording); \
         floor = a recorded update_plan over HTTP in a session that never ran a command (HTTP, JSON, two commits; no sandbox, no scan)"
    );

    if let (Some((_, raw, sandboxed, _)), Some((_, alone, floor))) = (
        rows.iter().find(|(c, ..)| *c == 1),
        breakdown.iter().find(|(c, ..)| *c == 1),
    ) {
        println!(
            "p50 at 1 client: raw bash {:.2} ms; + sandbox {:.2} ms = {:.2} ms (sandbox alone); + service {:.2} ms = {:.2} ms, of which the service floor (HTTP, JSON, two commits) is {:.2} ms and the rest ({:.2} ms) the workspace scan, the shell tool and scheduling",
            raw.pct(0.50),
            alone.pct(0.50) - raw.pct(0.50),
            alone.pct(0.50),
            sandboxed.pct(0.50) - alone.pct(0.50),
            sandboxed.pct(0.50),
            floor.pct(0.50),
            sandboxed.pct(0.50) - alone.pct(0.50) - floor.pct(0.50),
        );
    }

    // The first command of a new session starts its resident sandbox: measured apart, one
    // session after the other (each closed afterwards, so that the agents do not pile up).
    let first = first_commands(&http, base, dur).await?;
    println!(
        "first command of a new session (starts its sandbox), 1 client: {} sessions, p50 {:.2} ms, p99 {:.2} ms",
        first.calls,
        first.pct(0.50),
        first.pct(0.99)
    );

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
    let per_call = |name: &str| {
        let sum = labelled(&metrics, &format!("{name}_sum"), "tool=\"shell\"");
        let count = labelled(&metrics, &format!("{name}_count"), "tool=\"shell\"");
        (count > 0.0).then(|| sum * 1000.0 / count)
    };
    if let Some(ms) = per_call("toolexec_call_duration_seconds") {
        println!(
            "shell calls: {ms:.2} ms on average from a call's start to its recorded result (the engine's own clock; the finish commit and HTTP come on top)"
        );
    }
    print_recorder_stats(&http, base).await?;
    if !remote_rows.is_empty() {
        println!(
            "swerex-remote (SWE-ReX 1.4 server, unsandboxed, unrecorded) POST /execute {{\"command\": \"true\", \"shell\": true}}, same client, same run:"
        );
        println!(
            "{:>7} | {:>10} {:>8} {:>8} | {:>14} | {:>18}",
            "clients", "swerex/s", "p50 ms", "p99 ms", "CPU per call", "sandboxed÷swerex"
        );
    }
    for (clients, stats, cpu_ms) in &remote_rows {
        let ours = rows
            .iter()
            .find(|(c, ..)| c == clients)
            .map_or(0.0, |(_, _, sandboxed, _)| sandboxed.rate());
        println!(
            "{clients:>7} | {:>10.0} {:>8.2} {:>8.2} | {cpu_ms:>11.2} ms | {:>17.2}x",
            stats.rate(),
            stats.pct(0.50),
            stats.pct(0.99),
            ours / stats.rate(),
        );
    }

    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    println!("goals (issue 12):");
    if let Some((_, raw, sandboxed, _)) = rows.iter().find(|(c, ..)| *c == 1) {
        let p50 = sandboxed.pct(0.50) - raw.pct(0.50);
        let p99 = sandboxed.pct(0.99) - raw.pct(0.99);
        println!(
            "  1 client: p50 overhead {p50:.2} ms (goal <= {GOAL_P50_OVERHEAD_MS} ms: {}); p99 overhead {p99:.2} ms (goal <= {GOAL_P99_OVERHEAD_MS} ms: {}; p99 latency {:.2} ms)",
            verdict(p50 <= GOAL_P50_OVERHEAD_MS),
            verdict(p99 <= GOAL_P99_OVERHEAD_MS),
            sandboxed.pct(0.99),
        );
    }
    if let Some((_, raw, sandboxed, _)) = rows.iter().find(|(c, ..)| *c == 8) {
        let ratio = sandboxed.rate() / raw.rate();
        println!(
            "  8 clients: {:.0} calls/s (goal >= {GOAL_CALLS_PER_SECOND_AT_8}: {}); ratio to raw spawning {ratio:.2} (goal >= {GOAL_RATIO_AT_8}: {})",
            sandboxed.rate(),
            verdict(sandboxed.rate() >= GOAL_CALLS_PER_SECOND_AT_8),
            verdict(ratio >= GOAL_RATIO_AT_8),
        );
        println!("goals (issue 28):");
        println!(
            "  8 clients: ratio to raw spawning {ratio:.2} (goal >= {GOAL_RAW_FRACTION_AT_8}: {})",
            verdict(ratio >= GOAL_RAW_FRACTION_AT_8),
        );
        match remote_rows.iter().find(|(c, ..)| *c == 8) {
            Some((_, stats, _)) => {
                let times = sandboxed.rate() / stats.rate();
                println!(
                    "  8 clients: {times:.2}x swerex-remote's /execute (goal >= {GOAL_TIMES_SWEREX_AT_8}: {})",
                    verdict(times >= GOAL_TIMES_SWEREX_AT_8),
                );
            }
            None => println!(
                "  8 clients against swerex-remote: not measured (pass --swerex-venv $(.ci/swerex))"
            ),
        }
    }
    Ok(())
}

/// CPU time this benchmark's whole stack has used so far, milliseconds: this process (the load
/// generator, the service, and the children it reaped: the raw `bash` baseline), every process
/// in this process's sandbox cgroups (the agents, whose children's time — the commands' — joins
/// theirs when they reap them), and the PostgreSQL backends connected to the bench's database
/// (not Postgres's shared WAL writer and checkpointer). Other load on the machine is left out,
/// though it still slows the stack down.
fn busy_cpu_ms(db_name: &str) -> f64 {
    // utime, stime, cutime, cstime: fields 14-17 of /proc/<pid>/stat (12-15 after the name).
    let ticks = |pid: &str, children: bool| -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let Some((_, after)) = stat.rsplit_once(')') else {
            return 0.0;
        };
        let f: Vec<f64> = after
            .split_whitespace()
            .skip(11)
            .take(4)
            .filter_map(|t| t.parse().ok())
            .collect();
        let own = f.first().unwrap_or(&0.0) + f.get(1).unwrap_or(&0.0);
        let reaped = f.get(2).unwrap_or(&0.0) + f.get(3).unwrap_or(&0.0);
        if children { own + reaped } else { own }
    };
    let me = std::process::id();
    let instance = format!("/toolexec-{me}-");
    // "postgres: [<cluster>: ]<user> <database> <client> <state>"
    let backend = format!(" postgres {db_name} ");
    let mut total = ticks("self", true);
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if pid == me.to_string() {
            continue;
        }
        let sandboxed = std::fs::read_to_string(e.path().join("cgroup")).is_ok_and(|c| {
            c.lines()
                .any(|l| l.starts_with("0::") && l.contains(&instance))
        });
        if sandboxed {
            total += ticks(pid, true);
        } else if std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&backend))
        {
            total += ticks(pid, false);
        }
    }
    // USER_HZ is 100 on Linux.
    total * 10.0
}

fn per_call(db_name: &str, cpu0: f64, stats: &crate::Stats) -> f64 {
    (busy_cpu_ms(db_name) - cpu0) / stats.calls.max(1) as f64
}

/// A Prometheus sample `name{…label…} value`.
fn labelled(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// A new session; the URL of its calls.
pub(crate) async fn new_session(http: &reqwest::Client, base: &str) -> anyhow::Result<String> {
    let session: serde_json::Value = http
        .post(format!("{base}/v1/sessions"))
        .json(&json!({}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let sid = session["id"].as_str().context("session id")?;
    Ok(format!("{base}/v1/sessions/{sid}/calls"))
}

/// The first `shell` call of new sessions, one after the other for about `dur` (at least 20,
/// at most 1,000 sessions); only the call is timed, each session is closed after it.
async fn first_commands(
    http: &reqwest::Client,
    base: &str,
    dur: Duration,
) -> anyhow::Result<crate::Stats> {
    let start = std::time::Instant::now();
    let mut latencies_us = Vec::new();
    while latencies_us.len() < 1000 && (latencies_us.len() < 20 || start.elapsed() < dur) {
        let url = new_session(http, base).await?;
        let t = std::time::Instant::now();
        let resp = http
            .post(url.as_str())
            .json(&json!({"calls": [{"id": "first", "name": "shell", "arguments": {"command": "true"}}]}))
            .send()
            .await?;
        anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
        let body: serde_json::Value = resp.json().await?;
        latencies_us.push(t.elapsed().as_micros() as u64);
        anyhow::ensure!(body["results"][0]["status"] == "ok", "call failed: {body}");
        let session = url.trim_end_matches("/calls");
        http.delete(session).send().await?.error_for_status()?;
    }
    Ok(crate::Stats::from_latencies(latencies_us, start.elapsed()))
}
