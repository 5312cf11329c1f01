//! `toolexec-bench`: measures toolexec next to a baseline measured in the same run.
//!
//! - `calls`: recorded calls over HTTP against the Postgres store, next to plain Postgres inserts
//!   of the rows a call records (one invocation, two events), one transaction per call.
//! - `shell`: sandboxed `shell` calls (`true`) over HTTP, recorded, next to a raw spawn of
//!   `/bin/bash -c true` from the bench process; plus the sandbox alone (no HTTP, no recording),
//!   the service's floor (a recorded call that does nothing) and the first command of a new
//!   session (which starts its resident sandbox), with the goals of issue 12.
//!
//! - `history`: rebuilding a session at a seq (next to `cp -a` of its workspace), forks (latency
//!   and disk), and the log streamed to 100 subscribers (next to the events the calls wrote).
//!
//! Run: `cargo run --release -p toolexec-bench -- calls` (or `shell`, `history`; Postgres on 127.0.0.1:5432,
//! trust auth; override with `--admin-url`). It creates and drops its own database.
#![forbid(unsafe_code)]

mod history;
mod shell;

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use serde_json::json;
use sqlx::Connection;
use sqlx::postgres::PgPoolOptions;

#[derive(Parser)]
#[command(name = "toolexec-bench")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// read_file calls over HTTP at several client counts, with the insert baseline.
    Calls {
        /// Postgres URL of a database the bench may create databases from.
        #[arg(
            long,
            env = "TOOLEXEC_TEST_DATABASE_URL",
            default_value = "postgres://postgres@127.0.0.1:5432/postgres"
        )]
        admin_url: String,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Client counts to measure.
        #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
        clients: Vec<usize>,
        /// `per-client`: each client works in its own session (agents side by side);
        /// `shared`: all clients call one session.
        #[arg(long, default_value = "per-client")]
        sessions: SessionMode,
    },
    /// Sandboxed `shell` calls (`true`) over HTTP, with a raw bash spawn as the baseline.
    Shell {
        /// Postgres URL of a database the bench may create databases from.
        #[arg(
            long,
            env = "TOOLEXEC_TEST_DATABASE_URL",
            default_value = "postgres://postgres@127.0.0.1:5432/postgres"
        )]
        admin_url: String,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Client counts to measure (concurrent loops, each with its own session).
        #[arg(long, value_delimiter = ',', default_value = "1,8")]
        clients: Vec<usize>,
    },
    /// Time travel: rebuild at a seq, forks, the live log to 100 subscribers.
    History {
        /// Postgres URL of a database the bench may create databases from.
        #[arg(
            long,
            env = "TOOLEXEC_TEST_DATABASE_URL",
            default_value = "postgres://postgres@127.0.0.1:5432/postgres"
        )]
        admin_url: String,
        /// Seconds of rebuilds, and of writes while streaming.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum SessionMode {
    PerClient,
    Shared,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // reqwest clients need a rustls provider since web_fetch unified `rustls-no-provider` in.
    toolexec_tools::web::install_tls_provider();
    match Cli::parse().command {
        Command::Calls {
            admin_url,
            seconds,
            clients,
            sessions,
        } => {
            calls(
                &admin_url,
                Duration::from_secs(seconds),
                &clients,
                sessions == SessionMode::Shared,
            )
            .await
        }
        Command::Shell {
            admin_url,
            seconds,
            clients,
        } => shell::run(&admin_url, Duration::from_secs(seconds), &clients).await,
        Command::History { admin_url, seconds } => {
            history::run(&admin_url, Duration::from_secs(seconds)).await
        }
    }
}

pub(crate) struct Stats {
    calls: u64,
    elapsed: Duration,
    latencies_us: Vec<u64>,
}

impl Stats {
    /// Stats of latencies measured one by one over `elapsed`.
    pub(crate) fn from_latencies(mut latencies_us: Vec<u64>, elapsed: Duration) -> Self {
        latencies_us.sort_unstable();
        Stats {
            calls: latencies_us.len() as u64,
            elapsed,
            latencies_us,
        }
    }

    fn rate(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }
    fn pct(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        let idx = ((self.latencies_us.len() as f64 - 1.0) * p).round() as usize;
        self.latencies_us[idx] as f64 / 1000.0
    }
}

/// Runs `clients` loops of `op` for `dur` and collects per-op latencies.
pub(crate) async fn drive<F, Fut>(clients: usize, dur: Duration, op: F) -> anyhow::Result<Stats>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let counter = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + dur;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let op = op.clone();
        let counter = counter.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let n = counter.fetch_add(1, Ordering::Relaxed);
                let t = Instant::now();
                op(c, n).await?;
                lat.push(t.elapsed().as_micros() as u64);
            }
            anyhow::Ok(lat)
        }));
    }
    let mut latencies_us = Vec::new();
    for t in tasks {
        latencies_us.extend(t.await??);
    }
    let elapsed = start.elapsed();
    latencies_us.sort_unstable();
    Ok(Stats {
        calls: latencies_us.len() as u64,
        elapsed,
        latencies_us,
    })
}

async fn calls(
    admin_url: &str,
    dur: Duration,
    client_counts: &[usize],
    shared_session: bool,
) -> anyhow::Result<()> {
    let db = BenchDb::create(admin_url).await?;
    let result = run_all(&db.url, dur, client_counts, shared_session).await;
    db.drop().await?;
    result
}

/// A database of its own for one bench run, created from the admin URL and dropped at the end.
pub(crate) struct BenchDb {
    admin: sqlx::PgConnection,
    name: String,
    pub url: String,
}

impl BenchDb {
    pub async fn create(admin_url: &str) -> anyhow::Result<Self> {
        let name = format!("toolexec_bench_{}", uuid::Uuid::new_v4().simple());
        let mut admin = sqlx::PgConnection::connect(admin_url)
            .await
            .with_context(|| format!("connecting to {admin_url}"))?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await?;
        let url = match admin_url.rsplit_once('/') {
            Some((base, _)) => format!("{base}/{name}"),
            None => anyhow::bail!("admin url has no database part"),
        };
        Ok(Self { admin, name, url })
    }

    pub async fn drop(mut self) -> anyhow::Result<()> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE {} WITH (FORCE)",
            self.name
        )))
        .execute(&mut self.admin)
        .await?;
        Ok(())
    }
}

/// The real service on port 0, on a runtime of its own (2 worker threads, as it would have in
/// its own process on this machine), so that the load generator's tasks do not queue in front of
/// the service's.
pub(crate) struct Server {
    pub base: String,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<anyhow::Result<()>>,
}

impl Server {
    pub async fn start(config: toolexec_server::Config) -> anyhow::Result<Self> {
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || -> anyhow::Result<()> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let state = toolexec_server::build_state(&config).await?;
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                let _ = addr_tx.send(listener.local_addr()?);
                toolexec_server::serve(state, listener, async {
                    let _ = stop_rx.await;
                })
                .await
            })
        });
        match addr_rx.await {
            Ok(addr) => Ok(Self {
                base: format!("http://{addr}"),
                stop: stop_tx,
                thread,
            }),
            Err(_) => {
                let why = match thread.join() {
                    Ok(Err(e)) => format!("{e:#}"),
                    Ok(Ok(())) => "it stopped".into(),
                    Err(_) => "it panicked".into(),
                };
                anyhow::bail!("the service did not start: {why}")
            }
        }
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join())
            .await?
            .map_err(|_| anyhow::anyhow!("service thread panicked"))?
    }
}

async fn run_all(
    db_url: &str,
    dur: Duration,
    client_counts: &[usize],
    shared_session: bool,
) -> anyhow::Result<()> {
    let data = tempdir()?;
    let config = toolexec_server::Config {
        bind: "127.0.0.1:0".into(),
        database_url: Some(db_url.to_owned()),
        data_dir: data.clone(),
        log_format: "text".into(),
        max_db_connections: 16,
        // The benchmark measures throughput, not admission control.
        rate_limit_per_second: 0.0,
        ..Default::default()
    };
    let server = Server::start(config).await?;
    let base = server.base.clone();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    // One session per client slot (agents working side by side), or one session all clients
    // share (one agent's parallel calls): `--sessions per-client|shared`.
    let slots = if shared_session {
        1
    } else {
        client_counts.iter().copied().max().unwrap_or(1)
    };
    let mut urls = Vec::with_capacity(slots);
    for _ in 0..slots {
        let session: serde_json::Value = http
            .post(format!("{base}/v1/sessions"))
            .json(&json!({"files": {"src/main.rs": "fn main() {\n    println!(\"hello\");\n}\n".repeat(20)}}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let sid = session["id"].as_str().context("session id")?.to_owned();
        urls.push(format!("{base}/v1/sessions/{sid}/calls"));
    }
    let calls_urls = Arc::new(urls);

    // The same connection settings as the service's store: plain TCP on loopback.
    let options = sqlx::postgres::PgConnectOptions::from_str(db_url)?
        .ssl_mode(sqlx::postgres::PgSslMode::Disable);
    let pool = PgPoolOptions::new()
        .max_connections(40)
        .connect_with(options)
        .await?;
    // Same columns and indexes as the real tables, without the append-only triggers.
    for ddl in [
        "CREATE TABLE bench_invocations (LIKE invocations INCLUDING ALL)",
        "CREATE TABLE bench_events (LIKE events INCLUDING ALL)",
    ] {
        sqlx::query(ddl).execute(&pool).await?;
    }

    println!(
        "toolexec-bench calls: read_file over HTTP, Postgres store, {}s per row, {}",
        dur.as_secs(),
        if shared_session {
            "all clients in one session"
        } else {
            "one session per client"
        }
    );
    println!(
        "{:>7} | {:>12} {:>9} {:>9} | {:>14} {:>9} {:>9} | {:>8}",
        "clients", "toolexec/s", "p50 ms", "p99 ms", "pg inserts/s", "p50 ms", "p99 ms", "ratio"
    );
    for &clients in client_counts {
        // Baseline: the rows one call records, inserted plainly, one transaction per call.
        let seq = Arc::new(AtomicU64::new(0));
        let baseline_session = uuid::Uuid::now_v7();
        let p = pool.clone();
        let base_stats = drive(clients, dur, move |_c, _n| {
            let p = p.clone();
            let seq = seq.clone();
            async move {
                let s = seq.fetch_add(2, Ordering::Relaxed) as i64;
                let id = uuid::Uuid::now_v7();
                let mut tx = p.begin().await?;
                sqlx::query(
                    "INSERT INTO bench_invocations (id, session_id, call_id, name, arguments, arguments_sha256, read_only, capabilities, node, status, is_error, content, output_chars, started_at, finished_at, duration_ms, started_seq, finished_seq)
                     VALUES ($1, $2, $3, 'read_file', '{\"file_path\":\"src/main.rs\"}', 'x', true, '[\"fs.read\"]', 'bench', 'ok', false, $4, 10, now(), now(), 0.1, $5, $6)",
                )
                .bind(id)
                .bind(baseline_session)
                .bind(id.to_string())
                .bind("     1\tfn main() {")
                .bind(s + 1)
                .bind(s + 2)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO bench_events (session_id, seq, kind, invocation_id, data, created_at)
                     VALUES ($1, $2, 'invocation.started', $3, '{}', now()), ($1, $4, 'invocation.finished', $3, '{}', now())",
                )
                .bind(baseline_session)
                .bind(s + 1)
                .bind(id)
                .bind(s + 2)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(())
            }
        })
        .await?;

        let http2 = http.clone();
        let urls = calls_urls.clone();
        let run = uuid::Uuid::new_v4().simple().to_string();
        let svc_stats = drive(clients, dur, move |c, n| {
            let http = http2.clone();
            let url = urls[c % urls.len()].clone();
            let id = format!("bench_{run}_{n}");
            async move {
                let resp = http
                    .post(url.as_str())
                    .json(&json!({"calls": [{"id": id, "name": "read_file", "arguments": {"file_path": "src/main.rs", "limit": 5}}]}))
                    .send()
                    .await?;
                anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
                let body: serde_json::Value = resp.json().await?;
                anyhow::ensure!(body["results"][0]["status"] == "ok", "call failed: {body}");
                Ok(())
            }
        })
        .await?;
        println!(
            "{:>7} | {:>12.0} {:>9.2} {:>9.2} | {:>14.0} {:>9.2} {:>9.2} | {:>8.2}",
            clients,
            svc_stats.rate(),
            svc_stats.pct(0.50),
            svc_stats.pct(0.99),
            base_stats.rate(),
            base_stats.pct(0.50),
            base_stats.pct(0.99),
            svc_stats.rate() / base_stats.rate(),
        );
    }
    println!(
        "ratio = toolexec recorded calls/s ÷ plain-insert transactions/s (same rows, same database, same run)"
    );
    print_recorder_stats(&http, &base).await?;
    server.stop().await?;
    pool.close().await;
    let _ = std::fs::remove_dir_all(&data);
    Ok(())
}

/// The recorder's group-commit statistics from the service's `/metrics` (whole run).
pub(crate) async fn print_recorder_stats(http: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .unwrap_or(0.0)
    };
    let commits = value("toolexec_store_commit_duration_seconds_count ");
    if commits > 0.0 {
        println!(
            "recorder: {:.0} group commits, {:.2} ms per commit, {:.1} writes per commit (whole run)",
            commits,
            value("toolexec_store_commit_duration_seconds_sum ") * 1000.0 / commits,
            value("toolexec_store_commit_batch_size_sum ") / commits,
        );
    }
    Ok(())
}

pub(crate) fn tempdir() -> anyhow::Result<std::path::PathBuf> {
    let dir =
        std::env::temp_dir().join(format!("toolexec-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
