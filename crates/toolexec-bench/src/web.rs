//! `web`: `web_fetch` through the service, next to a plain HTTP GET of the same page in the same
//! run, and the service's memory while many fetches read endless bodies at once.
//!
//! - latency: one client fetches a 1 MB HTML page from a loopback server, as a recorded
//!   `web_fetch` call over HTTP (policy checks, the GET, HTML → Markdown, paging, the body
//!   recorded as a blob), and as a plain `reqwest` GET of the same page that reads the whole
//!   body; p50 and p99 of each.
//! - memory: 16 concurrent `web_fetch` calls of a page that never ends (each read up to the
//!   5 MiB body cap), sampling the process's resident memory (VmRSS, the service's runtime runs
//!   in this process) every 5 ms, next to what the caps allow.
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use crate::{BenchDb, Server, tempdir};

/// Concurrent fetches of the endless page (issue 11's measure).
const ENDLESS_FETCHES: usize = 16;

pub async fn run(admin_url: &str, dur: Duration) -> anyhow::Result<()> {
    let db = BenchDb::create(admin_url).await?;
    let data = tempdir()?;
    let result = measure(&db.url, &data, dur).await;
    let _ = std::fs::remove_dir_all(&data);
    db.drop().await?;
    result
}

/// A 1 MB HTML page of the kind documentation sites serve: navigation, headings, paragraphs
/// with links and inline code, lists, code blocks, a footer.
fn page() -> String {
    let mut html = String::from(
        "<!doctype html><html><head><title>Reference</title><style>body{font:14px sans-serif}</style>\
         <script>window.analytics=1</script></head><body><header>Docs</header>\
         <nav><a href=\"/\">Home</a> <a href=\"/guide\">Guide</a></nav><main>",
    );
    let mut i = 0;
    while html.len() < 1_000_000 {
        html.push_str(&format!(
            "<h2 id=\"s{i}\">Section {i}</h2><p>The <code>option_{i}</code> setting controls how \
             the <a href=\"/ref/{i}\">reference {i}</a> behaves when <em>several</em> clients \
             ask at once; see <strong>limits</strong> below.</p><ul><li>first point {i}</li>\
             <li>second point</li><li>third point</li></ul><pre><code>let x{i} = run({i})?;\n\
             println!(\"{{x{i}}}\");</code></pre>"
        ));
        i += 1;
    }
    html.push_str("</main><footer>Copyright</footer></body></html>");
    html
}

/// The site on loopback: `/page` (the 1 MB page), `/text` (the same bytes as text/plain),
/// `/endless` (a body that never ends).
async fn site() -> anyhow::Result<u16> {
    let page = Arc::new(page());
    let text = page.clone();
    let app = axum::Router::new()
        .route(
            "/text",
            axum::routing::get(move || {
                let text = text.clone();
                async move { ([("content-type", "text/plain")], text.as_str().to_owned()) }
            }),
        )
        .route(
            "/page",
            axum::routing::get(move || {
                let page = page.clone();
                async move { axum::response::Html(page.as_str().to_owned()) }
            }),
        )
        .route(
            "/endless",
            axum::routing::get(|| async {
                let block = bytes::Bytes::from(vec![b'a'; 64 * 1024]);
                let stream =
                    futures::stream::repeat_with(move || Ok::<_, std::io::Error>(block.clone()));
                (
                    [("content-type", "text/plain")],
                    axum::body::Body::from_stream(stream),
                )
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(port)
}

/// Resident memory of this process, bytes.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn measure(db_url: &str, data: &std::path::Path, dur: Duration) -> anyhow::Result<()> {
    let port = site().await?;
    let page_url = format!("http://127.0.0.1:{port}/page");
    let text_url = format!("http://127.0.0.1:{port}/text");
    let endless_url = format!("http://127.0.0.1:{port}/endless");
    let mut config = toolexec_server::Config {
        bind: "127.0.0.1:0".into(),
        database_url: Some(db_url.to_owned()),
        data_dir: data.to_path_buf(),
        log_format: "text".into(),
        rate_limit_per_second: 0.0,
        ..Default::default()
    };
    // The site is on loopback: allow-listed here, as the tests do. The default refuses it.
    config.sandbox.egress_allow_cidrs = vec!["127.0.0.1/32".to_owned()];
    let server = Server::start(config).await?;
    let base = server.base.clone();
    let http = reqwest::Client::new();
    let session: Value = http
        .post(format!("{base}/v1/sessions"))
        .json(&json!({"policy": {"network": "allow"}}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let calls_url = format!(
        "{base}/v1/sessions/{}/calls",
        session["id"].as_str().context("session id")?
    );

    // Plain GETs of the page, reading it whole.
    let mut plain: Vec<f64> = Vec::new();
    let mut page_bytes = 0;
    let until = Instant::now() + dur;
    while Instant::now() < until {
        let t = Instant::now();
        let body = http.get(&page_url).send().await?.bytes().await?;
        plain.push(t.elapsed().as_secs_f64() * 1000.0);
        page_bytes = body.len();
    }
    // The same page as recorded web_fetch calls; then variants that take one part away: the
    // same bytes as text/plain (no conversion), and the page with a short `max_length` (a small
    // answer to send back).
    let mut rows = Vec::new();
    let mut shown = 0;
    for (label, url, max_length) in [
        ("web_fetch (recorded, HTTP)", page_url.clone(), None),
        ("web_fetch, as text/plain", text_url.clone(), None),
        ("web_fetch, max_length 1000", page_url.clone(), Some(1000)),
    ] {
        let mut times = Vec::new();
        let until = Instant::now() + dur;
        let mut n = 0u64;
        while Instant::now() < until {
            n += 1;
            let mut args = json!({"url": url});
            if let Some(max) = max_length {
                args["max_length"] = json!(max);
            }
            let t = Instant::now();
            let body: Value = http
                .post(&calls_url)
                .json(&json!({"calls": [{"id": format!("{label}{n}"), "name": "web_fetch", "arguments": args}]}))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            let result = &body["results"][0];
            anyhow::ensure!(result["status"] == "ok", "web_fetch failed: {result}");
            if max_length.is_none() && url == page_url {
                shown = result["content"].as_str().map_or(0, str::len);
            }
        }
        times.sort_by(f64::total_cmp);
        rows.push((label, times));
    }
    plain.sort_by(f64::total_cmp);
    println!(
        "toolexec-bench web: a {:.2} MB HTML page from a loopback server, one client, {}s each",
        page_bytes as f64 / 1e6,
        dur.as_secs()
    );
    println!(
        "{:>28} | {:>7} {:>9} {:>9} | {:>8}",
        "", "calls", "p50 ms", "p99 ms", "p50 ratio"
    );
    let plain_p50 = pct(&plain, 0.5).max(1e-9);
    println!(
        "{:>28} | {:>7} {:>9.2} {:>9.2} | {:>8.1}",
        "plain GET (reqwest)",
        plain.len(),
        plain_p50,
        pct(&plain, 0.99),
        1.0
    );
    for (label, times) in &rows {
        println!(
            "{:>28} | {:>7} {:>9.2} {:>9.2} | {:>8.1}",
            label,
            times.len(),
            pct(times, 0.5),
            pct(times, 0.99),
            pct(times, 0.5) / plain_p50
        );
    }
    println!(
        "ratio = p50 ÷ the plain GET's p50 (same page, same run); the model was shown {shown} \
         characters per full call (Markdown, the first part of at most 100,000)"
    );

    // 16 fetches of an endless body at once, sampling resident memory meanwhile.
    let before = rss_bytes();
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(before));
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        tokio::spawn(async move {
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(rss_bytes(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let t = Instant::now();
    let calls: Vec<Value> = (0..ENDLESS_FETCHES)
        .map(|i| json!({"id": format!("endless{i}"), "name": "web_fetch", "arguments": {"url": endless_url, "max_length": 1000}}))
        .collect();
    let body: Value = http
        .post(&calls_url)
        .json(&json!({"calls": calls}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let took = t.elapsed();
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    sampler.await?;
    let results = body["results"].as_array().context("results")?;
    let capped = results
        .iter()
        .filter(|r| {
            r["content"]
                .as_str()
                .is_some_and(|c| c.contains("only that much was read"))
        })
        .count();
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    let cap = toolexec_tools::web::MAX_BODY_BYTES as u64;
    println!(
        "{ENDLESS_FETCHES} concurrent web_fetch of an endless body: {capped} stopped at the {} MiB cap in {:.2} s; \
         resident memory {:.0} MB before, peak {:.0} MB (+{:.0} MB; the body caps alone allow {} x {} MiB = {} MiB)",
        cap / (1024 * 1024),
        took.as_secs_f64(),
        before as f64 / 1e6,
        peak as f64 / 1e6,
        peak.saturating_sub(before) as f64 / 1e6,
        ENDLESS_FETCHES,
        cap / (1024 * 1024),
        ENDLESS_FETCHES as u64 * cap / (1024 * 1024),
    );
    server.stop().await?;
    Ok(())
}
