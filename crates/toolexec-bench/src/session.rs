//! `toolexec-bench session`: what a session's length costs — the service's memory and the latency
//! of a call as one session grows to a million calls, next to a fresh session measured at the
//! same moments (the baseline), and what a restart costs such a session.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use crate::{BenchDb, Server, tempdir};

/// Calls per request while filling the session (the API's default batch limit).
const FILL_BATCH: u64 = 64;

pub async fn run(
    admin_url: &str,
    checkpoints: &[u64],
    probes: usize,
    fill_clients: usize,
) -> anyhow::Result<()> {
    let db = BenchDb::create(admin_url).await?;
    let result = run_on(&db.url, checkpoints, probes, fill_clients).await;
    db.drop().await?;
    result
}

/// The process's resident and peak resident memory (kB), from `/proc/self/status`. The service
/// runs in this process, next to the load generator, whose memory does not grow with the session.
fn memory_kb() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    async fn session(&self) -> anyhow::Result<String> {
        let session: Value = self
            .http
            .post(format!("{}/v1/sessions", self.base))
            .json(&json!({"files": {"src/main.rs": "fn main() {\n    println!(\"hello\");\n}\n".repeat(20)}}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(session["id"].as_str().context("session id")?.to_owned())
    }

    /// Sends `ids` as one batch of `read_file` calls; checks every result is `ok`.
    async fn reads(&self, session: &str, ids: &[String]) -> anyhow::Result<()> {
        let calls: Vec<Value> = ids
            .iter()
            .map(|id| json!({"id": id, "name": "read_file", "arguments": {"file_path": "src/main.rs", "limit": 5}}))
            .collect();
        let resp = self
            .http
            .post(format!("{}/v1/sessions/{session}/calls", self.base))
            .json(&json!({ "calls": calls }))
            .send()
            .await?;
        anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
        let body: Value = resp.json().await?;
        let results = body["results"].as_array().context("results")?;
        anyhow::ensure!(results.len() == ids.len(), "{body}");
        anyhow::ensure!(
            results.iter().all(|r| r["status"] == "ok"),
            "a call failed: {body}"
        );
        Ok(())
    }

    /// One call, timed (µs).
    async fn timed(&self, session: &str, id: String) -> anyhow::Result<u64> {
        let t = Instant::now();
        self.reads(session, &[id]).await?;
        Ok(t.elapsed().as_micros() as u64)
    }

    async fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await?
            .text()
            .await?;
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0))
    }
}

fn fill_id(n: u64) -> String {
    format!("fill_{n:07}")
}

/// Adds calls `from..to` to the session, `fill_clients` requests of [`FILL_BATCH`] at a time.
async fn fill(
    client: &Arc<Client>,
    session: &str,
    from: u64,
    to: u64,
    fill_clients: usize,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let next = Arc::new(AtomicU64::new(from));
    let mut tasks = Vec::new();
    for _ in 0..fill_clients.max(1) {
        let (client, next, session) = (client.clone(), next.clone(), session.to_owned());
        tasks.push(tokio::spawn(async move {
            loop {
                let start = next.fetch_add(FILL_BATCH, Ordering::Relaxed);
                if start >= to {
                    return anyhow::Ok(());
                }
                let ids: Vec<String> = (start..(start + FILL_BATCH).min(to)).map(fill_id).collect();
                client.reads(&session, &ids).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(t.elapsed())
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx] as f64 / 1000.0
}

/// p50 and p99 (ms) of latencies in µs.
fn summary(mut lat: Vec<u64>) -> (f64, f64) {
    lat.sort_unstable();
    (pct(&lat, 0.5), pct(&lat, 0.99))
}

/// A small deterministic generator (xorshift): which old calls are retried.
struct Picks(u64);

impl Picks {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

async fn run_on(
    db_url: &str,
    checkpoints: &[u64],
    probes: usize,
    fill_clients: usize,
) -> anyhow::Result<()> {
    let data = tempdir()?;
    let config = toolexec_server::Config {
        bind: "127.0.0.1:0".into(),
        database_url: Some(db_url.to_owned()),
        data_dir: data.clone(),
        log_format: "text".into(),
        max_db_connections: 16,
        rate_limit_per_second: 0.0,
        ..Default::default()
    };
    let server = Server::start(config.clone()).await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let client = Arc::new(Client {
        http,
        base: server.base.clone(),
    });
    let long = client.session().await?;
    let (rss_start, _) = memory_kb();
    println!(
        "toolexec-bench session: one session grown to {} read_file calls (batches of {FILL_BATCH}, {fill_clients} clients), Postgres store",
        checkpoints.last().copied().unwrap_or(0)
    );
    println!(
        "at each point, {probes} single-call requests of each kind, one at a time, interleaved: a new call in the long session, a new call in a fresh session (baseline), a retry of a random earlier call of the long session"
    );
    println!(
        "service + load generator in one process: RSS at start {} MB",
        rss_start / 1024
    );
    println!(
        "{:>9} | {:>8} {:>9} {:>8} | {:>16} | {:>16} | {:>16} | {:>9}",
        "calls",
        "RSS MB",
        "+MB",
        "peak MB",
        "long p50/p99 ms",
        "fresh p50/p99 ms",
        "retry p50/p99 ms",
        "fill/s"
    );
    let mut made = 0u64;
    let mut picks = Picks(0x9E37_79B9_7F4A_7C15);
    let mut probe_n = 0u64;
    for &target in checkpoints {
        let took = fill(&client, &long, made, target, fill_clients).await?;
        let fill_rate = (target - made) as f64 / took.as_secs_f64();
        made = target;
        let fresh = client.session().await?;
        let (mut l, mut f, mut r) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..probes {
            probe_n += 1;
            l.push(client.timed(&long, format!("probe_{probe_n}")).await?);
            f.push(client.timed(&fresh, format!("probe_{probe_n}")).await?);
            r.push(client.timed(&long, fill_id(picks.below(made))).await?);
        }
        let (rss, hwm) = memory_kb();
        let ((lp50, lp99), (fp50, fp99), (rp50, rp99)) = (summary(l), summary(f), summary(r));
        println!(
            "{:>9} | {:>8.1} {:>+9.1} {:>8.1} | {:>7.2} / {:>6.2} | {:>7.2} / {:>6.2} | {:>7.2} / {:>6.2} | {:>9.0}",
            made,
            rss as f64 / 1024.0,
            (rss as f64 - rss_start as f64) / 1024.0,
            hwm as f64 / 1024.0,
            lp50,
            lp99,
            fp50,
            fp99,
            rp50,
            rp99,
            fill_rate
        );
    }
    for answer in ["new", "recorded", "not_recorded"] {
        let n = client
            .metric(&format!(
                "toolexec_call_index_answers_total{{answer=\"{answer}\"}}"
            ))
            .await?;
        println!("call index answers, {answer}: {n:.0}");
    }
    crate::print_recorder_stats(&client.http, &client.base).await?;
    server.stop().await?;

    // A restart: the new runtime reads the long session's call ids back (a page before its
    // first call, the rest in the background; every id asks the store meanwhile).
    let server = Server::start(config).await?;
    let client = Arc::new(Client {
        http: client.http.clone(),
        base: server.base.clone(),
    });
    let (rss_before, _) = memory_kb();
    let first = client.timed(&long, "after_restart_0".into()).await?;
    let t = Instant::now();
    let mut lat = Vec::new();
    for i in 1..=probes {
        lat.push(client.timed(&long, format!("after_restart_{i}")).await?);
    }
    let spent = t.elapsed();
    let (p50, p99) = summary(lat);
    let asked = client
        .metric("toolexec_call_index_answers_total{answer=\"not_recorded\"}")
        .await?;
    let (rss, _) = memory_kb();
    println!(
        "after a restart: first call {:.2} ms; next {probes} calls p50 {p50:.2} ms, p99 {p99:.2} ms ({:.1} s), {asked:.0} of them asked the store (index still loading); RSS {:+.1} MB",
        first as f64 / 1000.0,
        spent.as_secs_f64(),
        (rss as f64 - rss_before as f64) / 1024.0
    );
    server.stop().await?;
    let _ = std::fs::remove_dir_all(&data);
    Ok(())
}
