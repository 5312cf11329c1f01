//! What reading the record costs the service (issue 23, §4: pages, streams, replays), measured
//! on the compiled binary as an operator runs it, on both stores: the size of each answer, and
//! the growth of the server's resident memory (`VmHWM` of its `/proc/<pid>/status`, its peak
//! reset through `/proc/<pid>/clear_refs` just before what is measured). Every case writes its
//! large events, then restarts the binary so that the measure starts from a fresh process.
//!
//! The events are refused calls (an unknown tool): the service records them with their
//! arguments, as large as a request body may be.
use std::io::Write;
use std::time::Duration;

use serde_json::{Value, json};
use toolexec_tests::app::Backend;
use toolexec_tests::binary::{Served, serve, toolexec};
use toolexec_tests::db::TestPgDatabase;

toolexec_tests::on_both_stores!(
    pages_of_large_events_are_bounded_in_bytes_and_reach_every_event,
    streams_whose_clients_never_read_hold_a_bounded_buffer,
    a_verify_replay_of_a_large_log_pages_through_it,
);

const MIB: usize = 1024 * 1024;

/// A service's data (its directory, and its Postgres database when it runs on one) that
/// outlives restarts of the binary.
struct Node {
    data: tempfile::TempDir,
    db: Option<TestPgDatabase>,
}

impl Node {
    async fn new(backend: Backend) -> Self {
        let data = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            data.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        let db = match backend {
            Backend::Postgres => Some(TestPgDatabase::create().await),
            Backend::Sqlite => None,
        };
        Self { data, db }
    }

    /// `toolexec serve` on this data, with `env` set too.
    fn serve(&self, env: &[(&str, &str)]) -> Served {
        let mut cmd = toolexec(self.data.path());
        cmd.arg("serve")
            .env("TOOLEXEC_BIND", "127.0.0.1:0")
            .env("TOOLEXEC_DATA_DIR", self.data.path())
            .env("TOOLEXEC_LOG_FORMAT", "json")
            .env("TOOLEXEC_NODE", "memory-node")
            .envs(env.iter().copied());
        if let Some(db) = &self.db {
            cmd.env("TOOLEXEC_DATABASE_URL", db.url());
        }
        serve(cmd)
    }
}

/// A line of the server's `/proc/<pid>/status`, in bytes.
fn status_bytes(served: &Served, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", served.child.id())).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("{key} not in the server's status"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kb * 1024
}

/// Resets the server's peak RSS to its RSS now; returns it.
fn reset_peak(served: &Served) -> u64 {
    std::fs::write(format!("/proc/{}/clear_refs", served.child.id()), "5").unwrap();
    status_bytes(served, "VmRSS:")
}

/// How far the server's peak RSS rose above `base`.
fn peak_growth(served: &Served, base: u64) -> u64 {
    status_bytes(served, "VmHWM:").saturating_sub(base)
}

fn http() -> reqwest::Client {
    toolexec_tools::web::install_tls_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

async fn new_session(http: &reqwest::Client, base: &str) -> String {
    let resp = http
        .post(format!("{base}/v1/sessions"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A call of a tool that does not exist, with `bytes` of arguments: refused, and recorded
/// with its arguments (one event: nothing ran, so its `invocation.finished` carries its start).
async fn refused_call(http: &reqwest::Client, base: &str, sid: &str, id: &str, bytes: usize) {
    let body = json!({"calls": [{"id": id, "name": "no_such_tool", "arguments": {"blob": "a".repeat(bytes)}}]});
    let resp = http
        .post(format!("{base}/v1/sessions/{sid}/calls"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let results: Value = resp.json().await.unwrap();
    assert_eq!(results["results"][0]["status"], "unknown_tool");
}

async fn last_seq(http: &reqwest::Client, base: &str, sid: &str) -> i64 {
    http.get(format!("{base}/v1/sessions/{sid}"))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["last_seq"]
        .as_i64()
        .unwrap()
}

/// 40 refused calls with 512 KiB of arguments and 2 with 15 MiB (a request body's limit is
/// 16 MiB): ~50 MB of log. Pages are bounded to 2 MiB (`limits.page_bytes`, from the
/// environment): each answer stays under it, the pages together hold every event once, the
/// two events over the bound come truncated with a pointer that serves each whole — and
/// paging through it all raises the server's peak RSS by far less than one answer of the
/// whole log did (~50 MB of JSON, and a multiple of it in memory).
async fn pages_of_large_events_are_bounded_in_bytes_and_reach_every_event(backend: Backend) {
    const PAGE: usize = 2 * MIB;
    let page = PAGE.to_string();
    let env = [("TOOLEXEC_LIMITS__PAGE_BYTES", page.as_str())];
    let node = Node::new(backend).await;
    let http = http();
    let sid = {
        let served = node.serve(&env);
        let sid = new_session(&http, &served.base).await;
        for i in 0..42 {
            let bytes = if i % 20 == 7 { 15 * MIB } else { MIB / 2 };
            refused_call(&http, &served.base, &sid, &format!("c{i}"), bytes).await;
        }
        sid
    };
    let served = node.serve(&env);
    let base = &served.base;
    let last = last_seq(&http, base, &sid).await;
    let rss = reset_peak(&served);

    let (mut after, mut seqs, mut truncated, mut whole, mut largest) =
        (0, Vec::new(), Vec::new(), Vec::new(), 0);
    loop {
        let resp = http
            .get(format!(
                "{base}/v1/sessions/{sid}/events?after={after}&limit=1000"
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.bytes().await.unwrap();
        largest = largest.max(body.len());
        let page: Value = serde_json::from_slice(&body).unwrap();
        for e in page["events"].as_array().unwrap() {
            seqs.push(e["seq"].as_i64().unwrap());
            if !e["truncated"].is_null() {
                truncated.push(e.clone());
            } else if toolexec_tests::starts_call(e) {
                whole.push(e["data"]["arguments"]["blob"].as_str().unwrap().len());
            }
        }
        match page["next_after"].as_i64() {
            Some(n) => after = n,
            None => break,
        }
    }
    let paged = peak_growth(&served, rss);
    println!(
        "{backend:?}: {} events in {} bytes at most per page; peak RSS +{} KiB over {} KiB",
        seqs.len(),
        largest,
        paged / 1024,
        rss / 1024
    );
    assert!(
        largest <= PAGE,
        "a page of {largest} bytes, over the bound of {PAGE}"
    );
    assert_eq!(
        seqs,
        (1..=last).collect::<Vec<_>>(),
        "every event once, in order"
    );
    assert_eq!(truncated.len(), 2, "the two 15 MiB events, truncated");
    assert_eq!(
        whole,
        vec![MIB / 2; 40],
        "the events under the bound come whole"
    );
    assert!(
        paged < 48 * MIB as u64,
        "paging through ~50 MB of events raised the server's peak RSS by {} MiB",
        paged / MIB as u64
    );

    // The pointer of a truncated event serves it whole.
    for e in &truncated {
        let seq = e["seq"].as_i64().unwrap();
        let t = &e["truncated"];
        let full = t["full"].as_str().unwrap();
        assert_eq!(full, format!("/v1/sessions/{sid}/events/{seq}"));
        assert!(t["bytes"].as_u64().unwrap() > 15 * MIB as u64, "{t}");
        assert!(
            e.to_string().len() < 64 * 1024,
            "a truncated event is small: {}",
            e.to_string().len()
        );
        let whole: Value = http
            .get(format!("{base}{full}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(whole["seq"], seq);
        assert_eq!(whole["kind"], "invocation.finished");
        assert!(whole["truncated"].is_null(), "served whole");
        assert_eq!(whole["data"]["name"], "no_such_tool");
        assert_eq!(
            whole["data"]["arguments"]["blob"].as_str().unwrap().len(),
            15 * MIB
        );
    }
}

/// A raw HTTP/1.1 client of the event stream that never reads what it is sent.
fn stalled_stream(base: &str, sid: &str) -> std::net::TcpStream {
    let addr = base.trim_start_matches("http://");
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    write!(
        sock,
        "GET /v1/sessions/{sid}/events/stream HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    sock
}

/// SSE events (`id`, `event`, `data`) of a response until `until` says stop or `within`
/// passed.
async fn read_events(
    resp: &mut reqwest::Response,
    within: Duration,
    mut until: impl FnMut(&(Option<i64>, String, String)) -> bool,
) -> Vec<(Option<i64>, String, String)> {
    let deadline = tokio::time::Instant::now() + within;
    let mut raw = String::new();
    let mut out = Vec::new();
    loop {
        let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(deadline, resp.chunk()).await else {
            return out;
        };
        raw.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = raw.find("\n\n") {
            let block: String = raw.drain(..end + 2).collect();
            let (mut id, mut kind, mut data) = (None, None, String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("event: ") {
                    kind = Some(v.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            if let Some(kind) = kind {
                let item = (id, kind, data);
                let stop = until(&item);
                out.push(item);
                if stop {
                    return out;
                }
            }
        }
    }
}

/// Five clients that never read follow a session whose log holds 30 events of 400 KiB (each
/// sent whole: under the stream's 512 KiB buffer, `limits.stream_buffer_bytes`) and one of
/// 15 MiB (sent truncated): 27 MB each, far more than the sockets between take, so the server
/// holds back what they do not read. Its peak RSS grows by a few MiB per stream (each holds at
/// most its buffer), not by copies of the log per client — nor when 10 more events of 256 KiB
/// are recorded while they are connected. A client that does read then gets every event in
/// order, the large one truncated with its pointer.
async fn streams_whose_clients_never_read_hold_a_bounded_buffer(backend: Backend) {
    let node = Node::new(backend).await;
    let http = http();
    let env = [];
    let sid = {
        let served = node.serve(&env);
        let sid = new_session(&http, &served.base).await;
        for i in 0..31 {
            let bytes = if i == 15 { 15 * MIB } else { 400 * 1024 };
            refused_call(&http, &served.base, &sid, &format!("c{i}"), bytes).await;
        }
        sid
    };
    let served = node.serve(&env);
    let base = served.base.clone();
    let rss = reset_peak(&served);
    let stalled: Vec<_> = (0..5).map(|_| stalled_stream(&base, &sid)).collect();
    // Time for the server to send what the sockets take and hold back the rest.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let connected = peak_growth(&served, rss);
    for i in 31..41 {
        refused_call(&http, &base, &sid, &format!("c{i}"), 256 * 1024).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = peak_growth(&served, rss);
    println!(
        "{backend:?}: 5 stalled streams, peak RSS +{} KiB, +{} KiB with 10 live events, over {} KiB",
        connected / 1024,
        grown / 1024,
        rss / 1024
    );
    assert!(
        connected < 48 * MIB as u64,
        "5 streams that never read a 27 MB log raised the server's peak RSS by {} MiB",
        connected / MIB as u64
    );
    assert!(
        grown < 96 * MIB as u64,
        "with 10 events recorded meanwhile, the peak RSS rose by {} MiB",
        grown / MIB as u64
    );

    // A reader gets it all, in order, the large event truncated with its pointer.
    let last = last_seq(&http, &base, &sid).await;
    let mut reader = http
        .get(format!("{base}/v1/sessions/{sid}/events/stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(reader.status(), 200);
    let events = read_events(&mut reader, Duration::from_secs(60), |(id, _, _)| {
        *id == Some(last)
    })
    .await;
    let ids: Vec<i64> = events.iter().filter_map(|(id, _, _)| *id).collect();
    assert_eq!(ids, (1..=last).collect::<Vec<_>>());
    let (mut whole, mut cut) = (0, 0);
    for (id, kind, data) in &events {
        let e: Value = serde_json::from_str(data).unwrap();
        assert_eq!(e["seq"].as_i64(), *id);
        assert_eq!(e["kind"].as_str(), Some(kind.as_str()));
        // Each refused call is one event, its finish carrying its arguments.
        if kind != "invocation.finished" {
            continue;
        }
        match e["truncated"]["full"].as_str() {
            Some(full) => {
                assert_eq!(full, format!("/v1/sessions/{sid}/events/{}", id.unwrap()));
                assert!(
                    data.len() < 64 * 1024,
                    "sent truncated: {} bytes",
                    data.len()
                );
                cut += 1;
            }
            None => {
                let blob = e["data"]["arguments"]["blob"].as_str().unwrap().len();
                assert!(blob == 400 * 1024 || blob == 256 * 1024, "{blob}");
                whole += 1;
            }
        }
    }
    assert_eq!((whole, cut), (40, 1));
    drop(stalled);
}

/// A verify replay of a 32 MB log (64 refused calls with 512 KiB of arguments each) re-runs
/// every call and matches each, while the server's peak RSS grows by a small part of the log
/// (it reads the source's calls one at a time, not the log whole).
async fn a_verify_replay_of_a_large_log_pages_through_it(backend: Backend) {
    let node = Node::new(backend).await;
    let http = http();
    let env = [];
    let sid = {
        let served = node.serve(&env);
        let sid = new_session(&http, &served.base).await;
        for i in 0..64 {
            refused_call(&http, &served.base, &sid, &format!("c{i}"), MIB / 2).await;
        }
        sid
    };
    let served = node.serve(&env);
    let base = &served.base;
    let rss = reset_peak(&served);
    let resp = http
        .post(format!("{base}/v1/sessions/{sid}/replay"))
        .json(&json!({"mode": "verify"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let report: Value = resp.json().await.unwrap();
    let grown = peak_growth(&served, rss);
    println!(
        "{backend:?}: replay of 32 MiB, peak RSS +{} KiB over {} KiB",
        grown / 1024,
        rss / 1024
    );
    assert_eq!(report["status"], "finished", "{report}");
    assert_eq!(report["calls_total"], 64);
    assert_eq!(report["calls_replayed"], 64);
    assert_eq!(report["calls_diverged"], 0, "{report}");
    assert!(
        grown < 56 * MIB as u64,
        "a verify replay of a 32 MB log raised the server's peak RSS by {} MiB",
        grown / MIB as u64
    );
}
