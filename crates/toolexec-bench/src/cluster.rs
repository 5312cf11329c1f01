//! `cluster`: replicas of the compiled binary on one Postgres database.
//!
//! - throughput: recorded `read_file` calls from 8 clients (a session each), sent round robin
//!   over 1, 2 and 3 replicas — as a gateway without session affinity does, so that with N
//!   replicas (N-1)/N of the calls reach a replica the session does not live on and are
//!   forwarded. One replica is the baseline, measured in the same run.
//! - take-over: a session of 500 files on one replica, which is then killed (SIGKILL); the time
//!   until the next call answers on another replica (the lease TTL, then the rebuild), and the
//!   rebuild alone (its `session.taken_over` event).
//!
//! The replicas are `toolexec` processes from the bench's own target directory (build it first:
//! `cargo build --profile dist -p toolexec-server`), each with its own data directory.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use crate::{BenchDb, drive};

/// Lease TTL of the replicas in the take-over measure (the default is 10 s).
const TTL_MS: u64 = 3_000;

struct Replica {
    child: Child,
    base: String,
    _data: Scratch,
}

/// A directory removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `toolexec` next to this benchmark's binary (`target/dist/`).
pub(crate) fn binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .map(|d| d.join("toolexec"))
        .context("no directory")?;
    anyhow::ensure!(
        bin.is_file(),
        "{} is missing: build it with `cargo build --profile dist -p toolexec-server`",
        bin.display()
    );
    Ok(bin)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn start(bin: &Path, db_url: &str, name: &str, ttl_ms: Option<u64>) -> anyhow::Result<Replica> {
    let data = crate::tempdir()?;
    let port = free_port()?;
    let log = data.join("log");
    let mut cmd = Command::new(bin);
    cmd.arg("serve")
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("TOOLEXEC_BIND", format!("127.0.0.1:{port}"))
        .env("TOOLEXEC_DATABASE_URL", db_url)
        .env("TOOLEXEC_DATA_DIR", &data)
        .env("TOOLEXEC_NODE", name)
        .env(
            "TOOLEXEC_CLUSTER__ADVERTISE_URL",
            format!("http://127.0.0.1:{port}"),
        )
        .env("TOOLEXEC_RATE_LIMIT_PER_SECOND", "0")
        .env("TOOLEXEC_LOG_FORMAT", "json")
        .env("RUST_LOG", "warn,toolexec_server=info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?);
    if let Some(ttl) = ttl_ms {
        cmd.env("TOOLEXEC_LIMITS__LEASE_TTL_MS", ttl.to_string());
    }
    let child = cmd.spawn()?;
    let replica = Replica {
        child,
        base: format!("http://127.0.0.1:{port}"),
        _data: Scratch(data),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{name} did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(replica)
}

pub async fn run(admin_url: &str, dur: Duration, clients: usize) -> anyhow::Result<()> {
    let bin = binary()?;
    println!(
        "toolexec-bench cluster: read_file calls from {clients} clients (a session each) sent round robin over the replicas, {}s per row; release binaries, one Postgres",
        dur.as_secs()
    );
    println!(
        "{:>8} | {:>9} {:>9} {:>9} | {:>10}",
        "replicas", "calls/s", "p50 ms", "p99 ms", "ratio to 1"
    );
    let mut one = None;
    for n in 1..=3 {
        let db = BenchDb::create(admin_url).await?;
        let result = throughput(&bin, &db.url, n, dur, clients).await;
        db.drop().await?;
        let stats = result?;
        let base = *one.get_or_insert(stats.rate());
        println!(
            "{:>8} | {:>9.0} {:>9.2} {:>9.2} | {:>10.2}",
            n,
            stats.rate(),
            stats.pct(0.50),
            stats.pct(0.99),
            stats.rate() / base
        );
    }
    println!(
        "with N replicas, (N-1)/N of the calls reach a replica their session does not live on and are forwarded; the machine's 2 cores are shared by every replica, Postgres and the load generator"
    );
    let db = BenchDb::create(admin_url).await?;
    let result = takeover(&bin, &db.url).await;
    db.drop().await?;
    result
}

async fn throughput(
    bin: &Path,
    db_url: &str,
    replicas: usize,
    dur: Duration,
    clients: usize,
) -> anyhow::Result<crate::Stats> {
    let nodes: Vec<Replica> = (0..replicas)
        .map(|i| start(bin, db_url, &format!("bench-{i}"), None))
        .collect::<anyhow::Result<_>>()?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let bases: Vec<String> = nodes.iter().map(|n| n.base.clone()).collect();
    let mut sessions = Vec::new();
    for c in 0..clients {
        // Sessions made on every replica, as a round-robin gateway would.
        let base = &bases[c % bases.len()];
        let s: Value = http
            .post(format!("{base}/v1/sessions"))
            .json(&json!({"files": {"src/main.rs": "fn main() {\n    println!(\"hello\");\n}\n"}}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        sessions.push(s["id"].as_str().context("id")?.to_owned());
    }
    let (sessions, bases) = (Arc::new(sessions), Arc::new(bases));
    let run = uuid::Uuid::new_v4().simple().to_string();
    drive(clients, dur, move |c, n| {
        let http = http.clone();
        let url = format!(
            "{}/v1/sessions/{}/calls",
            bases[n as usize % bases.len()],
            sessions[c]
        );
        let id = format!("b{run}{n}");
        async move {
            let resp = http
                .post(url)
                .json(&json!({"calls": [{"id": id, "name": "read_file", "arguments": {"file_path": "src/main.rs"}}]}))
                .send()
                .await?;
            anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
            let body: Value = resp.json().await?;
            anyhow::ensure!(body["results"][0]["status"] == "ok", "{body}");
            Ok(())
        }
    })
    .await
}

async fn takeover(bin: &Path, db_url: &str) -> anyhow::Result<()> {
    let mut a = start(bin, db_url, "owner", Some(TTL_MS))?;
    let b = start(bin, db_url, "heir", Some(TTL_MS))?;
    let http = reqwest::Client::new();
    let files: serde_json::Map<String, Value> = (0..500)
        .map(|i| {
            (
                format!("src/dir{}/file{i}.txt", i % 20),
                Value::String(format!("line {i}\n").repeat(10)),
            )
        })
        .collect();
    let s: Value = http
        .post(format!("{}/v1/sessions", a.base))
        .json(&json!({"files": files}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let sid = s["id"].as_str().context("id")?.to_owned();
    let call = |id: &str| json!({"calls": [{"id": id, "name": "shell", "arguments": {"command": "ls -R src | wc -l"}}]});
    let r: Value = http
        .post(format!("{}/v1/sessions/{sid}/calls", a.base))
        .json(&call("before"))
        .send()
        .await?
        .json()
        .await?;
    anyhow::ensure!(r["results"][0]["status"] == "ok", "{r}");
    let _ = a.child.kill();
    let _ = a.child.wait();
    let killed = Instant::now();
    let answered = loop {
        let resp = http
            .post(format!("{}/v1/sessions/{sid}/calls", b.base))
            .json(&call("after"))
            .send()
            .await?;
        if resp.status().is_success() {
            let r: Value = resp.json().await?;
            anyhow::ensure!(r["results"][0]["status"] == "ok", "{r}");
            break killed.elapsed();
        }
        anyhow::ensure!(
            killed.elapsed() < Duration::from_secs(120),
            "no take-over: HTTP {}",
            resp.status()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let events: Value = http
        .get(format!(
            "{}/v1/sessions/{sid}/events?after=0&limit=1000",
            b.base
        ))
        .send()
        .await?
        .json()
        .await?;
    let taken = events["events"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["kind"] == "session.taken_over"))
        .context("no session.taken_over")?;
    println!(
        "take-over of a session of 500 files after its replica was killed (lease TTL {} ms): the next call answered {:.2} s after the kill; the rebuild took {:.1} ms ({} entries restored)",
        TTL_MS,
        answered.as_secs_f64(),
        taken["data"]["duration_ms"].as_f64().unwrap_or_default(),
        taken["data"]["entries_restored"]
    );
    drop(b);
    Ok(())
}
