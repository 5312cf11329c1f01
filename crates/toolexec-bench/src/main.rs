//! `toolexec-bench`: measures toolexec next to a baseline measured in the same run.
//!
//! - `calls`: recorded calls over HTTP against the Postgres store, next to plain Postgres inserts
//!   of the rows a call records (one invocation, one event), one transaction per call.
//! - `shell`: sandboxed `shell` calls (`true`) over HTTP, recorded, next to a raw spawn of
//!   `/bin/bash -c true` from the bench process; plus the sandbox alone (no HTTP, no recording),
//!   the service's floor (a recorded call that does nothing) and the first command of a new
//!   session (which starts its resident sandbox), with the goals of issue 12.
//!
//! - `images`: the first command of a session in a cached OCI image next to a host-view
//!   session's (alternating, through the service), and the disk of 100 sessions on one image.
//!
//! - `history`: rebuilding a session at a seq (next to `cp -a` of its workspace), forks (latency
//!   and disk), and the log streamed to 100 subscribers (next to the events the calls wrote).
//! - `session`: one session grown to a million calls: the service's memory and a call's latency
//!   at each point, next to a fresh session measured at the same moments; then a restart.
//!
//! - `web`: `web_fetch` of a 1 MB page from a loopback server (next to a plain GET of it), and
//!   the process's memory while 16 fetches read endless bodies.
//!
//! - `cluster`: calls sent round robin over 1, 2 and 3 replicas of the release binary (the
//!   forwarding's cost next to one replica), and a take-over after a replica is killed.
//!
//! - `reads`: the first call after a take-over of a 10,000-call session, its read-state folded
//!   from the log, next to a session of as many calls that read nothing.
//!
//! - `load`: the release binary over its limits for minutes (several tenants, many sessions,
//!   mixed calls): served, shed and rate-limited with p50/p99, and its memory over the run.
//!
//! Run: `cargo run --profile dist -p toolexec-bench -- calls` (or `shell`, `history`, `session`, `web`, `cluster`, `reads`, `load`; Postgres on 127.0.0.1:5432,
//! trust auth; override with `--admin-url`). It creates and drops its own database.
#![forbid(unsafe_code)]

mod cluster;
mod cpu;
mod history;
mod images;
mod load;
mod reads;
mod session;
mod shell;
mod swerex_remote;
mod terminals;
mod web;

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
    /// The service's logs on stderr as the binary writes them (`json`, its default, or `text`:
    /// the same subscriber, so that the spans every request makes cost what they cost in the
    /// binary), or `none` (no subscriber: spans cost next to nothing).
    #[arg(long, global = true, default_value = "json", env = "TOOLEXEC_LOG_FORMAT", value_parser = ["json", "text", "none"])]
    log_format: String,
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
        /// The service's group-commit loops (default: the service's default).
        #[arg(long)]
        recorder_writers: Option<usize>,
        /// Also measure a real `swerex-remote` from this venv (`VENV=$(.ci/swerex)`) reading
        /// the same file at the same client counts, in the same run.
        #[arg(long, env = "TOOLEXEC_BENCH_SWEREX_VENV")]
        swerex_venv: Option<std::path::PathBuf>,
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
        /// Also measure a real `swerex-remote` from this venv (`VENV=$(.ci/swerex)`) running
        /// the same command through its `/execute`, in the same run.
        #[arg(long, env = "TOOLEXEC_BENCH_SWEREX_VENV")]
        swerex_venv: Option<std::path::PathBuf>,
    },
    /// Living terminals (issue 24): `bash` vs raw bash and `shell`, a write_stdin round trip
    /// to `cat`, memory per idle terminal.
    Terminals {
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
    /// Sessions in an OCI image (issue 26): the first command in a cached image next to a
    /// host-view session's, and the disk of many sessions on one image.
    Images {
        /// Seconds of alternating first commands (at least 30 of each).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Sessions created on the image for the disk measurement.
        #[arg(long, default_value_t = 100)]
        sessions: usize,
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
    /// web_fetch of a 1 MB page next to a plain GET; memory with 16 endless bodies.
    Web {
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
    },
    /// The release binary over its limits for minutes: served, shed, rate-limited; memory.
    Load {
        /// Postgres URL of a database the bench may create databases from.
        #[arg(
            long,
            env = "TOOLEXEC_TEST_DATABASE_URL",
            default_value = "postgres://postgres@127.0.0.1:5432/postgres"
        )]
        admin_url: String,
        /// Seconds of load.
        #[arg(long, default_value_t = 180)]
        seconds: u64,
        /// Tenants, each with an API key.
        #[arg(long, default_value_t = 4)]
        tenants: usize,
        /// Sessions (and clients) per tenant.
        #[arg(long, default_value_t = 10)]
        sessions: usize,
    },
    /// Replicas of the release binary: calls round robin over 1, 2, 3 of them; a take-over.
    Cluster {
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
        /// Concurrent clients (a session each).
        #[arg(long, default_value_t = 8)]
        clients: usize,
    },
    /// The first call after a take-over of a long session (its read-state from the log), next
    /// to a session of as many calls that read nothing.
    Reads {
        /// Postgres URL of a database the bench may create databases from.
        #[arg(
            long,
            env = "TOOLEXEC_TEST_DATABASE_URL",
            default_value = "postgres://postgres@127.0.0.1:5432/postgres"
        )]
        admin_url: String,
        /// Calls in each session.
        #[arg(long, default_value_t = 10_000)]
        calls: usize,
        /// Take-overs of both sessions (at most 100).
        #[arg(long, default_value_t = 40)]
        rounds: usize,
    },
    /// One session grown to many calls: memory and latency at each point, with a fresh session
    /// as the baseline.
    Session {
        /// Postgres URL of a database the bench may create databases from.
        #[arg(
            long,
            env = "TOOLEXEC_TEST_DATABASE_URL",
            default_value = "postgres://postgres@127.0.0.1:5432/postgres"
        )]
        admin_url: String,
        /// Session lengths (calls) at which to measure.
        #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
        calls: Vec<u64>,
        /// Timed single-call requests of each kind at each point.
        #[arg(long, default_value_t = 500)]
        probes: usize,
        /// Concurrent requests (of 64 calls each) while filling the session.
        #[arg(long, default_value_t = 4)]
        fill_clients: usize,
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
    let cli = Cli::parse();
    let _logs = match cli.log_format.as_str() {
        "none" => None,
        format => Some(toolexec_server::telemetry::init(
            format,
            &Default::default(),
            "toolexec-bench",
        )?),
    };
    match cli.command {
        Command::Calls {
            admin_url,
            seconds,
            clients,
            sessions,
            recorder_writers,
            swerex_venv,
        } => {
            calls(
                &admin_url,
                Duration::from_secs(seconds),
                &clients,
                sessions == SessionMode::Shared,
                recorder_writers,
                swerex_venv.as_deref(),
            )
            .await
        }
        Command::Shell {
            admin_url,
            seconds,
            clients,
            swerex_venv,
        } => {
            shell::run(
                &admin_url,
                Duration::from_secs(seconds),
                &clients,
                swerex_venv.as_deref(),
            )
            .await
        }
        Command::Terminals {
            admin_url,
            seconds,
            clients,
        } => terminals::run(&admin_url, Duration::from_secs(seconds), &clients).await,
        Command::Images { seconds, sessions } => {
            images::run(Duration::from_secs(seconds), sessions).await
        }
        Command::History { admin_url, seconds } => {
            history::run(&admin_url, Duration::from_secs(seconds)).await
        }
        Command::Web { admin_url, seconds } => {
            web::run(&admin_url, Duration::from_secs(seconds)).await
        }
        Command::Cluster {
            admin_url,
            seconds,
            clients,
        } => cluster::run(&admin_url, Duration::from_secs(seconds), clients).await,
        Command::Load {
            admin_url,
            seconds,
            tenants,
            sessions,
        } => load::run(&admin_url, Duration::from_secs(seconds), tenants, sessions).await,
        Command::Session {
            admin_url,
            calls,
            probes,
            fill_clients,
        } => session::run(&admin_url, &calls, probes, fill_clients).await,
        Command::Reads {
            admin_url,
            calls,
            rounds,
        } => reads::run(&admin_url, calls, rounds).await,
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

    pub(crate) fn rate(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }
    pub(crate) fn pct(&self, p: f64) -> f64 {
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
    recorder_writers: Option<usize>,
    swerex_venv: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let swerex = swerex_venv.map(swerex_remote::executable).transpose()?;
    let db = BenchDb::create(admin_url).await?;
    let result = run_all(
        &db.url,
        dur,
        client_counts,
        shared_session,
        recorder_writers,
        swerex.as_deref(),
    )
    .await;
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
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder
                .worker_threads(2)
                .thread_name(cpu::SERVICE_THREADS)
                // Blocking threads live through a run, so that their CPU time stays counted.
                .thread_keep_alive(Duration::from_secs(3600))
                .enable_all();
            let rt = builder.build()?;
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
    recorder_writers: Option<usize>,
    swerex: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let data = tempdir()?;
    let defaults = toolexec_server::Config::default();
    let config = toolexec_server::Config {
        bind: "127.0.0.1:0".into(),
        database_url: Some(db_url.to_owned()),
        data_dir: data.clone(),
        log_format: "text".into(),
        max_db_connections: 16,
        // The benchmark measures throughput, not admission control.
        rate_limit_per_second: 0.0,
        recorder_writers: recorder_writers.unwrap_or(defaults.recorder_writers),
        ..Default::default()
    };
    let writers = config.recorder_writers;
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
    let file = "fn main() {\n    println!(\"hello\");\n}\n".repeat(20);
    // SWE-ReX's server reads the same file from a directory of its own.
    let remote = match swerex {
        Some(exe) => {
            let path = data.join("swerex-main.rs");
            std::fs::write(&path, &file)?;
            Some((swerex_remote::Remote::start(exe, &http).await?, path))
        }
        None => None,
    };
    let mut remote_rows = Vec::new();
    for _ in 0..slots {
        let session: serde_json::Value = http
            .post(format!("{base}/v1/sessions"))
            .json(&json!({"files": {"src/main.rs": file}}))
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
        "toolexec-bench calls: read_file over HTTP, Postgres store, {}s per row, {}, {writers} recorder loop(s)",
        dur.as_secs(),
        if shared_session {
            "all clients in one session"
        } else {
            "one session per client"
        },
    );
    println!(
        "{:>7} | {:>12} {:>9} {:>9} | {:>14} {:>9} {:>9} | {:>8}",
        "clients", "toolexec/s", "p50 ms", "p99 ms", "pg inserts/s", "p50 ms", "p99 ms", "ratio"
    );
    let database = db_url.rsplit('/').next().unwrap_or_default().to_owned();
    let mut costs = Vec::new();
    let mut floors = Vec::new();
    for &clients in client_counts {
        // Baseline: the rows one call records, inserted plainly, one transaction per call.
        let cpu_before = cpu::Sample::now(&database);
        let seq = Arc::new(AtomicU64::new(0));
        let baseline_session = uuid::Uuid::now_v7();
        let p = pool.clone();
        let base_stats = drive(clients, dur, move |_c, _n| {
            let p = p.clone();
            let seq = seq.clone();
            async move {
                let s = seq.fetch_add(1, Ordering::Relaxed) as i64;
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
                .bind(s + 1)
                .execute(&mut *tx)
                .await?;
                // A read with no side effect is one event (its finish, carrying its start).
                sqlx::query(
                    "INSERT INTO bench_events (session_id, seq, kind, invocation_id, data, created_at)
                     VALUES ($1, $2, 'invocation.finished', $3, '{}', now())",
                )
                .bind(baseline_session)
                .bind(s + 1)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(())
            }
        })
        .await?;
        let cpu_base = cpu::Sample::now(&database).since(cpu_before);

        let cpu_before = cpu::Sample::now(&database);
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
        let cpu_svc = cpu::Sample::now(&database).since(cpu_before);
        // The floor of any call over HTTP here: `GET /healthz` goes through the same client
        // and the same layer stack as a call (request id, span, metrics, door, slots, body
        // guard, forwarding check), with no body, no handler work and no record.
        let cpu_before = cpu::Sample::now(&database);
        let http2 = http.clone();
        let healthz = Arc::new(format!("{base}/healthz"));
        let floor_stats = drive(clients, dur, move |_c, _n| {
            let http = http2.clone();
            let url = healthz.clone();
            async move {
                let resp = http.get(url.as_str()).send().await?;
                anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
                let body: serde_json::Value = resp.json().await?;
                anyhow::ensure!(body["status"] == "ok", "healthz: {body}");
                Ok(())
            }
        })
        .await?;
        let cpu_floor = cpu::Sample::now(&database)
            .since(cpu_before)
            .per_op(floor_stats.calls);
        floors.push((clients, floor_stats, cpu_floor));
        if let Some((remote, path)) = &remote {
            let (cpu_before, (_, client_before)) = (remote.cpu(), cpu::this_process());
            let stats = remote
                .read_file(&http, clients, dur, path, "fn main() {")
                .await?;
            let server = remote.cpu().saturating_sub(cpu_before);
            let client = cpu::this_process().1.saturating_sub(client_before);
            remote_rows.push((clients, svc_stats.rate(), stats, server, client));
        }
        costs.push((
            clients,
            cpu_svc.per_op(svc_stats.calls),
            cpu_base.per_op(base_stats.calls),
        ));
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
    println!(
        "CPU µs per call (toolexec: service threads + load generator + Postgres backends) and per transaction (baseline: client + backends):"
    );
    for (clients, (svc, client, pg), (_, base_client, base_pg)) in costs {
        println!(
            "{clients:>7} | toolexec {:>6.0} = service {svc:>5.0} + client {client:>5.0} + postgres {pg:>5.0} | baseline {:>6.0} = client {base_client:>5.0} + postgres {base_pg:>5.0}",
            svc + client + pg,
            base_client + base_pg,
        );
    }
    println!(
        "HTTP floor: GET /healthz, same client and layers, no body, no handler work, no record:"
    );
    for (clients, stats, (svc, client, pg)) in floors {
        println!(
            "{clients:>7} | {:>12.0}/s {:>7.2} {:>9.2} ms | CPU µs per request {:>6.0} = service {svc:>5.0} + client {client:>5.0} + postgres {pg:>5.0}",
            stats.rate(),
            stats.pct(0.50),
            stats.pct(0.99),
            svc + client + pg,
        );
    }
    print_recorder_stats(&http, &base).await?;
    if !remote_rows.is_empty() {
        println!(
            "swerex-remote (SWE-ReX 1.4 server, unrecorded, unsandboxed) POST /read_file of the same 60-line file, same client, same run:"
        );
        println!(
            "{:>7} | {:>12} {:>9} {:>9} | {:>26} | {:>16}",
            "clients",
            "swerex/s",
            "p50 ms",
            "p99 ms",
            "CPU µs/req: server + client",
            "toolexec÷swerex"
        );
        for (clients, ours, stats, server, client) in remote_rows {
            let per = |d: Duration| d.as_secs_f64() * 1e6 / stats.calls.max(1) as f64;
            println!(
                "{clients:>7} | {:>12.0} {:>9.2} {:>9.2} | {:>12.0} + {:>11.0} | {:>15.1}x",
                stats.rate(),
                stats.pct(0.50),
                stats.pct(0.99),
                per(server),
                per(client),
                ours / stats.rate(),
            );
        }
    }
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
