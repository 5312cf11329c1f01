//! `reads`: the first call after a take-over of a session of 10,000 calls, whose runtime is
//! built from the log — its read-state folded from 10,000 read records among them — next to a
//! session of as many calls that read nothing (the baseline: the same take-over, the same call,
//! no read records), in the same rounds.
//!
//! Two replicas of the release binary on one Postgres, a short lease TTL. Both sessions live on
//! one replica; each round kills it (SIGKILL), waits out the TTL, and times one `read_file` on
//! each session through the other replica (the order alternating by round): that call takes the
//! session over (interrupted calls, the workspace rebuilt from the log), builds its runtime (call
//! index, todos, read-state) and runs. Then an `edit_file` of a file read during the fill, which
//! only a rebuilt read-state allows, must succeed. The killed replica is started again (same name
//! and data directory) and the sessions move back in the next round.
//!
//! The read-state walk alone is read from the replicas' debug log line
//! ("read-state rebuilt from the log": its milliseconds and records).
use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use crate::{BenchDb, Stats, cluster::binary, tempdir};

/// Lease TTL of the replicas: the wait before each take-over.
const TTL_MS: u64 = 1_000;

/// Files the sessions hold (and the read session reads, round robin).
const FILES: usize = 100;

/// Calls per request while filling a session.
const FILL_BATCH: usize = 64;

pub async fn run(admin_url: &str, calls: usize, rounds: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        rounds <= FILES,
        "at most {FILES} rounds (each edits another file)"
    );
    let db = BenchDb::create(admin_url).await?;
    let result = run_on(&db.url, calls, rounds).await;
    db.drop().await?;
    result
}

/// One replica process; `data` and `log` outlive its restarts.
struct Replica {
    name: &'static str,
    data: PathBuf,
    log: PathBuf,
    port: u16,
    child: Option<Child>,
    /// How far its log has been read.
    read_to: u64,
}

impl Replica {
    fn new(name: &'static str, dir: &Path) -> anyhow::Result<Self> {
        let data = dir.join(name);
        std::fs::create_dir_all(&data)?;
        Ok(Self {
            name,
            log: dir.join(format!("{name}.log")),
            data,
            port: std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port(),
            child: None,
            read_to: 0,
        })
    }

    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn start(&mut self, bin: &Path, db_url: &str) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(bin)
            .arg("serve")
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("TOOLEXEC_BIND", format!("127.0.0.1:{}", self.port))
            .env("TOOLEXEC_DATABASE_URL", db_url)
            .env("TOOLEXEC_DATA_DIR", &self.data)
            .env("TOOLEXEC_NODE", self.name)
            .env("TOOLEXEC_CLUSTER__ADVERTISE_URL", self.base())
            .env("TOOLEXEC_LIMITS__LEASE_TTL_MS", TTL_MS.to_string())
            .env("TOOLEXEC_RATE_LIMIT_PER_SECOND", "0")
            .env("TOOLEXEC_LOG_FORMAT", "json")
            .env(
                "RUST_LOG",
                "warn,toolexec_server=info,toolexec_engine::reads=debug",
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} did not start: see {}",
                self.name,
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The read-state walks its log reports since the last look: (milliseconds, records) by
    /// session.
    fn walks(&mut self) -> anyhow::Result<Vec<(String, f64, u64)>> {
        let mut f = std::fs::File::open(&self.log)?;
        f.seek(std::io::SeekFrom::Start(self.read_to))?;
        let mut found = Vec::new();
        let mut reader = std::io::BufReader::new(f);
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader.read_line(&mut line)?;
            if n == 0 {
                break;
            }
            self.read_to += n as u64;
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if v["message"] == "read-state rebuilt from the log" {
                found.push((
                    v["session"].as_str().unwrap_or_default().to_owned(),
                    v["ms"].as_f64().unwrap_or_default(),
                    v["records"].as_u64().unwrap_or_default(),
                ));
            }
        }
        Ok(found)
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<Value> {
    let resp = http.post(url).json(body).send().await?;
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    anyhow::ensure!(status.is_success(), "HTTP {status}: {body}");
    Ok(body)
}

/// One call; its result, which must be `ok`.
async fn call(
    http: &reqwest::Client,
    base: &str,
    sid: &str,
    id: &str,
    name: &str,
    args: Value,
) -> anyhow::Result<Value> {
    let body = post(
        http,
        &format!("{base}/v1/sessions/{sid}/calls"),
        &json!({"calls": [{"id": id, "name": name, "arguments": args}]}),
    )
    .await?;
    let r = body["results"][0].clone();
    anyhow::ensure!(r["status"] == "ok", "{id}: {r}");
    Ok(r)
}

/// Grows a session to `calls` calls of `make(i)`, in batches.
async fn fill(
    http: &reqwest::Client,
    base: &str,
    sid: &str,
    calls: usize,
    make: impl Fn(usize) -> Value,
) -> anyhow::Result<()> {
    let mut i = 0;
    while i < calls {
        let batch: Vec<Value> = (i..(i + FILL_BATCH).min(calls)).map(&make).collect();
        i += batch.len();
        let body = post(
            http,
            &format!("{base}/v1/sessions/{sid}/calls"),
            &json!({ "calls": batch }),
        )
        .await?;
        let results = body["results"].as_array().context("results")?;
        anyhow::ensure!(
            results.iter().all(|r| r["status"] == "ok"),
            "a fill call failed: {body}"
        );
    }
    Ok(())
}

async fn run_on(db_url: &str, calls: usize, rounds: usize) -> anyhow::Result<()> {
    let bin = binary()?;
    let dir = tempdir()?;
    let result = measure(&bin, db_url, &dir, calls, rounds).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn measure(
    bin: &Path,
    db_url: &str,
    dir: &Path,
    calls: usize,
    rounds: usize,
) -> anyhow::Result<()> {
    let mut nodes = [Replica::new("bench-a", dir)?, Replica::new("bench-b", dir)?];
    for n in &mut nodes {
        n.start(bin, db_url)?;
    }
    let http = reqwest::Client::new();
    let files: serde_json::Map<String, Value> = (0..FILES)
        .map(|i| (format!("src/f{i}.py"), Value::String("v = 0\n".into())))
        .collect();
    let mut sessions = Vec::new();
    for _ in 0..2 {
        let s = post(
            &http,
            &format!("{}/v1/sessions", nodes[0].base()),
            &json!({ "files": files }),
        )
        .await?;
        sessions.push(s["id"].as_str().context("id")?.to_owned());
    }
    let (reads, plain) = (sessions[0].clone(), sessions[1].clone());
    let t0 = Instant::now();
    fill(&http, &nodes[0].base(), &reads, calls, |i| {
        json!({"id": format!("f{i}"), "name": "read_file", "arguments": {"file_path": format!("src/f{}.py", i % FILES)}})
    })
    .await?;
    fill(&http, &nodes[0].base(), &plain, calls, |i| {
        json!({"id": format!("f{i}"), "name": "glob", "arguments": {"pattern": format!("src/f{}.py", i % FILES)}})
    })
    .await?;
    println!(
        "toolexec-bench reads: two sessions of {calls} calls each ({FILES} files) filled in {:.1} s; {rounds} take-overs of both (release binaries, one Postgres, lease TTL {TTL_MS} ms)",
        t0.elapsed().as_secs_f64()
    );
    nodes[0].walks()?;
    let (mut first_reads, mut first_plain) = (Vec::new(), Vec::new());
    let (mut walk_reads, mut walk_plain) = (Vec::new(), Vec::new());
    let mut records = 0;
    let mut owner = 0;
    for round in 0..rounds {
        let heir = 1 - owner;
        nodes[owner].kill();
        // Past the TTL (heartbeat and lease): the first call takes over at once, not waiting
        // for the lease inside the timed call.
        tokio::time::sleep(Duration::from_millis(2 * TTL_MS + 200)).await;
        let base = nodes[heir].base();
        let order = if round % 2 == 0 {
            [(&reads, true), (&plain, false)]
        } else {
            [(&plain, false), (&reads, true)]
        };
        for (sid, is_reads) in order {
            let t = Instant::now();
            call(
                &http,
                &base,
                sid,
                &format!("first-{round}"),
                "read_file",
                json!({"file_path": "src/f0.py"}),
            )
            .await?;
            let us = t.elapsed().as_micros() as u64;
            if is_reads {
                first_reads.push(us);
            } else {
                first_plain.push(us);
            }
        }
        // Only a read-state rebuilt from the log allows this edit (read during the fill).
        call(
            &http,
            &base,
            &reads,
            &format!("edit-{round}"),
            "edit_file",
            json!({"file_path": format!("src/f{round}.py"), "old_string": "v = 0", "new_string": "v = 1"}),
        )
        .await
        .context("the edit of a file read before the take-over")?;
        for (sid, ms, n) in nodes[heir].walks()? {
            let us = (ms * 1000.0) as u64;
            if sid == reads {
                walk_reads.push(us);
                records = n;
            } else if sid == plain {
                walk_plain.push(us);
            }
        }
        nodes[owner].start(bin, db_url)?;
        owner = heir;
    }
    let elapsed = t0.elapsed();
    println!(
        "{:<44} | {:>14} {:>9} | {:>20} {:>9}",
        "session", "first call p50", "p99 ms", "read-state walk p50", "p99 ms"
    );
    for (name, first, walk) in [
        (
            format!("{calls} read_file calls ({records} read records)"),
            first_reads,
            walk_reads,
        ),
        (
            format!("{calls} glob calls (no reads; baseline)"),
            first_plain,
            walk_plain,
        ),
    ] {
        let first = Stats::from_latencies(first, elapsed);
        let walk = Stats::from_latencies(walk, elapsed);
        println!(
            "{name:<44} | {:>14.2} {:>9.2} | {:>20.2} {:>9.2}",
            first.pct(0.50),
            first.pct(0.99),
            walk.pct(0.50),
            walk.pct(0.99)
        );
    }
    println!(
        "the first call takes the session over (the lease, the calls left running, the workspace rebuilt from the log, session.taken_over), builds its runtime (call index, todos, read-state) and runs read_file; each round's edit of a file read before the take-over succeeded"
    );
    Ok(())
}
