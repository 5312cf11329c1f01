//! `history`: reading the record back, next to baselines measured in the same run.
//!
//! - rebuild: `GET /v1/sessions/{id}/tree?at=SEQ` at random seqs of a session of ~1,000 events
//!   over 500 files, next to `cp -a` of its live workspace;
//! - fork: `POST /v1/sessions/{id}/fork` a hundred times at one seq (latency, and the disk the
//!   forks use next to one workspace), next to `cp -a` again;
//! - stream: events/s delivered to 100 concurrent `events/stream` subscribers while 4 clients
//!   run calls, next to the events/s the calls wrote.
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use crate::{BenchDb, Server};

/// The goals of issue 10.
const REBUILD_GOAL_MS: f64 = 50.0;
const FORK_GOAL_MS: f64 = 20.0;
const DISK_GOAL_RATIO: f64 = 2.0;

pub async fn run(admin_url: &str, dur: Duration) -> anyhow::Result<()> {
    let db = BenchDb::create(admin_url).await?;
    let data = tempfile_dir()?;
    let result = measure(&db.url, &data, dur).await;
    let _ = std::fs::remove_dir_all(&data);
    db.drop().await?;
    result
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir =
        std::env::temp_dir().join(format!("toolexec-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(dir.join("workspaces"))?;
    for d in [dir.clone(), dir.join("workspaces")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(dir)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Disk used by everything under `dir` (allocated blocks, like `du`), each inode once.
fn disk_bytes(dir: &Path, seen: &mut std::collections::HashSet<(u64, u64)>) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut total = 0;
    for e in entries.flatten() {
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if seen.insert((m.dev(), m.ino())) {
            total += m.blocks() * 512;
        }
        if m.is_dir() {
            total += disk_bytes(&e.path(), seen);
        }
    }
    total
}

async fn measure(db_url: &str, data: &Path, dur: Duration) -> anyhow::Result<()> {
    let workspaces = data.join("workspaces");
    let config = toolexec_server::Config {
        bind: "127.0.0.1:0".into(),
        database_url: Some(db_url.to_owned()),
        data_dir: data.to_owned(),
        workspace_root: Some(workspaces.clone()),
        log_format: "text".into(),
        max_db_connections: 16,
        rate_limit_per_second: 0.0,
        ..Default::default()
    };
    let server = Server::start(config).await?;
    let result = measure_with(&server.base, &workspaces, dur).await;
    server.stop().await?;
    result
}

async fn post(http: &reqwest::Client, url: String, body: Value) -> anyhow::Result<Value> {
    let resp = http.post(&url).json(&body).send().await?;
    let status = resp.status();
    let body: Value = resp.json().await?;
    anyhow::ensure!(status.is_success(), "{url}: {status} {body}");
    Ok(body)
}

async fn measure_with(base: &str, workspaces: &Path, dur: Duration) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;

    // A session of 500 files and ~1,000 events: seeded, then 50 commands changing 8 files each.
    let mut files = serde_json::Map::new();
    for i in 0..500 {
        files.insert(
            format!("src/mod{}/file{i}.txt", i % 20),
            json!(format!("{i}\n").repeat(100)),
        );
    }
    let session = post(
        &http,
        format!("{base}/v1/sessions"),
        json!({"files": files}),
    )
    .await?;
    let sid = session["id"].as_str().context("id")?.to_owned();
    for c in 0..50 {
        let cmd = (0..8)
            .map(|k| {
                format!(
                    "echo {c} >> src/mod{}/file{}.txt",
                    (c * 8 + k) % 20,
                    (c * 8 + k * 61) % 500
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let r = post(
            &http,
            format!("{base}/v1/sessions/{sid}/calls"),
            json!({"calls": [{"id": format!("c{c}"), "name": "shell", "arguments": {"command": cmd}}]}),
        )
        .await?;
        anyhow::ensure!(r["results"][0]["status"] == "ok", "{r}");
    }
    let last: Value = http
        .get(format!("{base}/v1/sessions/{sid}"))
        .send()
        .await?
        .json()
        .await?;
    let last_seq = last["last_seq"].as_i64().context("last_seq")?;
    let live = workspaces.join(&sid);
    let live_bytes = disk_bytes(&live, &mut Default::default());
    println!(
        "session: {last_seq} events, 500 files, workspace {:.1} MiB on disk",
        live_bytes as f64 / 1048576.0
    );

    // Baseline: copying the live workspace.
    let mut copies = Vec::new();
    for n in 0..20 {
        let to = workspaces.join(format!("copy-{n}"));
        let t = Instant::now();
        let st = tokio::process::Command::new("cp")
            .arg("-a")
            .arg(&live)
            .arg(&to)
            .status()
            .await?;
        copies.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(st.success(), "cp -a failed");
        let _ = std::fs::remove_dir_all(&to);
    }
    let copies = sorted(copies);
    let cp_p50 = pct(&copies, 0.5);
    println!(
        "baseline cp -a of the workspace: p50 {cp_p50:.2} ms, p99 {:.2} ms",
        pct(&copies, 0.99)
    );

    // Rebuild at random seqs (the whole tree of each, one page).
    let mut rebuilds = Vec::new();
    let deadline = Instant::now() + dur;
    let mut n = 0u64;
    while Instant::now() < deadline || rebuilds.len() < 50 {
        n += 1;
        // Past event 1 (session.created), so that every tree has files.
        let at = 2 + (n * 7919) as i64 % (last_seq - 1);
        let t = Instant::now();
        let resp = http
            .get(format!("{base}/v1/sessions/{sid}/tree?at={at}&limit=10000"))
            .send()
            .await?;
        anyhow::ensure!(resp.status().is_success(), "tree: {}", resp.status());
        let tree: Value = resp.json().await?;
        rebuilds.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(tree["entries"].as_array().is_some_and(|e| !e.is_empty()));
    }
    let rebuilds = sorted(rebuilds);
    let rb_p50 = pct(&rebuilds, 0.5);
    println!(
        "rebuild (GET tree?at=SEQ, {} requests): p50 {rb_p50:.2} ms, p99 {:.2} ms; {:.2}x cp -a; goal <= {REBUILD_GOAL_MS} ms: {}",
        rebuilds.len(),
        pct(&rebuilds, 0.99),
        rb_p50 / cp_p50,
        if rb_p50 <= REBUILD_GOAL_MS {
            "met"
        } else {
            "NOT met"
        }
    );

    // A hundred forks at one seq.
    let at = last_seq / 2;
    let mut forks = Vec::new();
    let mut ids = Vec::new();
    let mut shares = false;
    for i in 0..100 {
        let t = Instant::now();
        let f = post(
            &http,
            format!("{base}/v1/sessions/{sid}/fork"),
            json!({"at_seq": at, "metadata": {"variant": i}}),
        )
        .await?;
        forks.push(t.elapsed().as_secs_f64() * 1000.0);
        shares = f["shares_contents"].as_bool().unwrap_or(false);
        ids.push(f["id"].as_str().context("fork id")?.to_owned());
    }
    let first = forks[0];
    let forks = sorted(forks);
    let fk_p50 = pct(&forks, 0.5);
    // Disk, next to one workspace: with layers, the base and every fork's own layer (a fork's
    // workspace is a mount of them, a view that takes no space of its own); with copies, every
    // fork's workspace.
    let mut seen = Default::default();
    let fork_bytes = if shares {
        disk_bytes(&workspaces.join(".layers"), &mut seen)
    } else {
        ids.iter()
            .map(|id| disk_bytes(&workspaces.join(id), &mut seen))
            .sum()
    };
    let ratio = fork_bytes as f64 / live_bytes as f64;
    println!(
        "fork (100 at seq {at}, shares contents: {shares}): first {first:.2} ms (makes the base), p50 {fk_p50:.2} ms, p99 {:.2} ms; {:.2}x cp -a; goal <= {FORK_GOAL_MS} ms: {}",
        pct(&forks, 0.99),
        fk_p50 / cp_p50,
        if fk_p50 <= FORK_GOAL_MS {
            "met"
        } else {
            "NOT met"
        }
    );
    println!(
        "disk used by 100 forks: {:.1} MiB = {ratio:.2}x one workspace; goal <= {DISK_GOAL_RATIO}x: {}",
        fork_bytes as f64 / 1048576.0,
        if ratio <= DISK_GOAL_RATIO {
            "met"
        } else {
            "NOT met"
        }
    );
    for id in &ids {
        let _ = http
            .delete(format!("{base}/v1/sessions/{id}"))
            .send()
            .await?;
    }

    // 100 subscribers while 4 clients write.
    let s = post(&http, format!("{base}/v1/sessions"), json!({})).await?;
    let ssid = s["id"].as_str().context("id")?.to_owned();
    let delivered = Arc::new(AtomicU64::new(0));
    let mut subs = Vec::new();
    for _ in 0..100 {
        let resp = http
            .get(format!("{base}/v1/sessions/{ssid}/events/stream"))
            .send()
            .await?;
        let delivered = delivered.clone();
        subs.push(tokio::spawn(async move {
            let mut resp = resp;
            let mut got = 0u64;
            while let Ok(Some(chunk)) = resp.chunk().await {
                let n = chunk.windows(4).filter(|w| w == b"id: ").count() as u64;
                got += n;
                delivered.fetch_add(n, Ordering::Relaxed);
            }
            got
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = delivered.load(Ordering::Relaxed);
    let t0 = Instant::now();
    let mut writers = Vec::new();
    for w in 0..4 {
        let (http, base, ssid) = (http.clone(), base.to_owned(), ssid.clone());
        writers.push(tokio::spawn(async move {
            let mut k = 0;
            while t0.elapsed() < dur {
                let r = post(
                    &http,
                    format!("{base}/v1/sessions/{ssid}/calls"),
                    json!({"calls": [{"id": format!("w{w}-{k}"), "name": "write_file", "arguments": {"file_path": format!("w{w}/{k}.txt"), "content": "x"}}]}),
                )
                .await?;
                anyhow::ensure!(r["results"][0]["status"] == "ok");
                k += 1;
            }
            anyhow::Ok(())
        }));
    }
    for w in writers {
        w.await??;
    }
    let written_secs = t0.elapsed().as_secs_f64();
    let info: Value = http
        .get(format!("{base}/v1/sessions/{ssid}"))
        .send()
        .await?
        .json()
        .await?;
    let events = info["last_seq"].as_u64().unwrap_or(0).saturating_sub(1);
    // Let the streams drain, then end them.
    let drain = Instant::now();
    while delivered.load(Ordering::Relaxed) - before < events * 100
        && drain.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lag = drain.elapsed().as_secs_f64();
    let _ = http
        .delete(format!("{base}/v1/sessions/{ssid}"))
        .send()
        .await?;
    let mut complete = 0;
    for s in subs {
        if s.await? > events {
            complete += 1;
        }
    }
    let got = delivered.load(Ordering::Relaxed) - before;
    println!(
        "stream: calls wrote {events} events in {written_secs:.1} s ({:.0}/s); 100 subscribers got {got} ({:.0}/s, {:.3}x of 100 x written), all of them: {complete}/100; last delivered {lag:.2} s after the last write",
        events as f64 / written_secs,
        got as f64 / (written_secs + lag),
        got as f64 / (events as f64 * 100.0),
    );
    Ok(())
}
