//! `load`: the release binary under more than it is configured to take, for minutes.
//!
//! Several tenants (each with its API key), many sessions each, every client sending a mix of
//! calls (`read_file`, `write_file`, `grep`, `shell`) as fast as it can — more requests per
//! second than each tenant's rate limit, and more at once than the service's
//! `max_concurrent_requests`. Reported: what was served, shed (503 `overloaded`) and
//! rate-limited (429), with p50/p99 of each, and the service's resident memory sampled over the
//! run (it must stay flat: what is refused costs nothing that stays).
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use crate::BenchDb;

/// The service's limits under test: low enough that the load goes over them on two cores.
const RATE_PER_TENANT: &str = "40";
const BURST: &str = "20";
const MAX_CONCURRENT: &str = "24";

/// What one request got.
#[derive(Default)]
struct Outcomes {
    by_class: BTreeMap<&'static str, Vec<f64>>,
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn key_for(bin: &Path, db_url: &str, data: &Path, tenant: &str) -> anyhow::Result<String> {
    let out = Command::new(bin)
        .args(["keys", "create", "--tenant", tenant])
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("TOOLEXEC_DATABASE_URL", db_url)
        .env("TOOLEXEC_DATA_DIR", data)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "keys create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)?
        .split_whitespace()
        .find(|w| w.starts_with("tx_"))
        .map(str::to_owned)
        .context("no key printed")
}

pub async fn run(
    admin_url: &str,
    dur: Duration,
    tenants: usize,
    sessions_per_tenant: usize,
) -> anyhow::Result<()> {
    let db = BenchDb::create(admin_url).await?;
    let result = measure(&db.url, dur, tenants, sessions_per_tenant).await;
    db.drop().await?;
    result
}

async fn measure(
    db_url: &str,
    dur: Duration,
    tenants: usize,
    sessions_per_tenant: usize,
) -> anyhow::Result<()> {
    let bin = crate::cluster::binary()?;
    let data = crate::tempdir()?;
    let keys: Vec<String> = (0..tenants)
        .map(|t| key_for(&bin, db_url, &data, &format!("tenant-{t}")))
        .collect::<anyhow::Result<_>>()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let log = data.join("log");
    let mut cmd = Command::new(&bin);
    cmd.arg("serve")
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("TOOLEXEC_BIND", format!("127.0.0.1:{port}"))
        .env("TOOLEXEC_DATABASE_URL", db_url)
        .env("TOOLEXEC_DATA_DIR", &data)
        .env("TOOLEXEC_RATE_LIMIT_PER_SECOND", RATE_PER_TENANT)
        .env("TOOLEXEC_RATE_LIMIT_BURST", BURST)
        .env("TOOLEXEC_MAX_CONCURRENT_REQUESTS", MAX_CONCURRENT)
        .env("TOOLEXEC_LOG_FORMAT", "json")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?);
    // glibc's allocator settings, passed through to compare how memory grows with them.
    for var in ["MALLOC_ARENA_MAX", "MALLOC_TRIM_THRESHOLD_"] {
        if let Ok(v) = std::env::var(var) {
            cmd.env(var, v);
        }
    }
    let mut child = cmd.spawn()?;
    let pid = child.id();
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        anyhow::ensure!(Instant::now() < deadline, "the service did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;
    // The sessions, each with a small project to read and search.
    let mut sessions = Vec::new();
    for key in &keys {
        for _ in 0..sessions_per_tenant {
            let s: Value = http
                .post(format!("{base}/v1/sessions"))
                .bearer_auth(key)
                .json(&json!({"files": {
                    "src/main.rs": "fn main() {\n    println!(\"hello\");\n}\n",
                    "src/lib.rs": "pub fn add(a: u32, b: u32) -> u32 {\n    a + b\n}\n".repeat(20),
                    "README.md": "# demo\n\nA small project.\n"
                }}))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            sessions.push((key.clone(), s["id"].as_str().context("id")?.to_owned()));
        }
    }
    println!(
        "toolexec-bench load: {} tenants x {} sessions, one client per session sending mixed calls (read_file, write_file, grep, shell) back to back for {} s; the service allows {RATE_PER_TENANT} requests/s per tenant (burst {BURST}) and {MAX_CONCURRENT} in flight",
        tenants,
        sessions_per_tenant,
        dur.as_secs()
    );
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let start = Instant::now();
    let end = start + dur;
    let mut tasks = Vec::new();
    for (i, (key, sid)) in sessions.into_iter().enumerate() {
        let (http, base, outcomes) = (http.clone(), base.clone(), outcomes.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < end {
                n += 1;
                let (name, args) = match n % 4 {
                    0 => ("read_file", json!({"file_path": "src/lib.rs", "limit": 20})),
                    1 => ("grep", json!({"pattern": "fn \\w+"})),
                    2 => ("write_file", json!({"file_path": format!("out/{}.txt", n % 50), "content": format!("n = {n}\n")})),
                    _ => ("shell", json!({"command": "true"})),
                };
                let t = Instant::now();
                let resp = http
                    .post(format!("{base}/v1/sessions/{sid}/calls"))
                    .bearer_auth(&key)
                    .json(&json!({"calls": [{"id": format!("c{i}-{n}"), "name": name, "arguments": args}]}))
                    .send()
                    .await;
                let ms = t.elapsed().as_secs_f64() * 1000.0;
                let class = match resp.as_ref().map(|r| r.status().as_u16()) {
                    Ok(200) => "served",
                    Ok(429) => "rate-limited (429)",
                    Ok(503) => "shed (503)",
                    Ok(_) => "other HTTP status",
                    Err(_) => "connection error",
                };
                if let Ok(mut o) = outcomes.lock() {
                    o.by_class.entry(class).or_default().push(ms);
                }
                if class != "served" {
                    // A client that honours Retry-After would wait; this one only yields, to
                    // stay over the limits.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }));
    }
    // Resident memory every 10 s.
    let mut samples = Vec::new();
    while Instant::now() < end {
        samples.push((start.elapsed().as_secs(), rss_kb(pid)));
        tokio::time::sleep(
            Duration::from_secs(10).min(end.saturating_duration_since(Instant::now())),
        )
        .await;
    }
    for t in tasks {
        t.await?;
    }
    samples.push((start.elapsed().as_secs(), rss_kb(pid)));
    let outcomes = outcomes.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let total: usize = outcomes.by_class.values().map(Vec::len).sum();
    println!(
        "{:>20} | {:>8} {:>7} | {:>9} {:>9}",
        "", "requests", "share", "p50 ms", "p99 ms"
    );
    for (class, times) in &outcomes.by_class {
        let mut t = times.clone();
        t.sort_by(f64::total_cmp);
        let pct = |p: f64| t[((t.len() as f64 - 1.0) * p).round() as usize];
        println!(
            "{:>20} | {:>8} {:>6.1}% | {:>9.2} {:>9.2}",
            class,
            t.len(),
            100.0 * t.len() as f64 / total.max(1) as f64,
            pct(0.5),
            pct(0.99)
        );
    }
    println!(
        "served {:.0} calls/s over the run",
        outcomes.by_class.get("served").map_or(0, Vec::len) as f64 / dur.as_secs_f64()
    );
    let line: Vec<String> = samples
        .iter()
        .map(|(s, kb)| format!("{s}s {:.0} MB", *kb as f64 / 1024.0))
        .collect();
    println!("service resident memory: {}", line.join(", "));
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&data);
    Ok(())
}
