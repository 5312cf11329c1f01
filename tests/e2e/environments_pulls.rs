//! Pre-pulls (`POST /v1/environments`) and what bounds them, end to end: the compiled binary,
//! Debian's `docker-registry` on loopback behind a front the test controls (it holds blob
//! requests until the test lets them through), driven over HTTP.
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, Method, Response, Uri};
use serde_json::{Value, json};
use toolexec_tests::binary::{Served, serve};
use toolexec_tests::registry::{Registry, busybox_root};

use crate::environments::{image_dirs, post, private_dir, serve_command, serve_pulling_from};

/// A front of a registry: forwards every request to it, holding blob requests until opened.
struct Gate {
    /// `127.0.0.1:PORT`, the registry part of references pulled through it.
    host: String,
    open: tokio::sync::watch::Sender<bool>,
    /// Blob requests that arrived (held or not), and requests of any kind.
    blobs: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

impl Gate {
    async fn start(upstream: &str) -> Gate {
        toolexec_tools::web::install_tls_provider();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let (open, opened) = tokio::sync::watch::channel(false);
        let blobs = Arc::new(AtomicUsize::new(0));
        let upstream = format!("http://{upstream}");
        let client = reqwest::Client::new();
        let requests = Arc::new(AtomicUsize::new(0));
        let (seen, asked) = (blobs.clone(), requests.clone());
        let app =
            axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap| {
                let (client, upstream, seen, mut opened) = (
                    client.clone(),
                    upstream.clone(),
                    seen.clone(),
                    opened.clone(),
                );
                asked.fetch_add(1, Ordering::SeqCst);
                async move {
                    if uri.path().contains("/blobs/") {
                        seen.fetch_add(1, Ordering::SeqCst);
                        let _ = opened.wait_for(|o| *o).await;
                    }
                    let method = reqwest::Method::from_bytes(method.as_str().as_bytes()).unwrap();
                    let path = uri.path_and_query().map_or("/", |p| p.as_str());
                    let mut req = client.request(method, format!("{upstream}{path}"));
                    for name in ["accept", "authorization"] {
                        if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
                            req = req.header(name, v);
                        }
                    }
                    let resp = req.send().await.unwrap();
                    let mut out = Response::builder().status(resp.status().as_u16());
                    for name in ["content-type", "docker-content-digest", "www-authenticate"] {
                        if let Some(v) = resp.headers().get(name).and_then(|v| v.to_str().ok()) {
                            out = out.header(name, v);
                        }
                    }
                    out.body(Body::from(resp.bytes().await.unwrap())).unwrap()
                }
            });
        tokio::spawn(async move { axum::serve(listener, app).await });
        Gate {
            host,
            open,
            blobs,
            requests,
        }
    }

    /// Waits until a blob request has arrived (a pull is under way), at most 30 s.
    async fn until_held(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.blobs.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "no blob was asked for in 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The binary, pulling through `gate` (plain HTTP, on loopback) into `data`, with `extra`.
fn serve_through(gate: &Gate, data: &Path, extra: &[(&str, &str)]) -> Served {
    serve_pulling_from(&gate.host, data, extra)
}

/// `POST /v1/environments` (plain JSON): status, `Retry-After`, body.
async fn pull(served: &Served, image: &str) -> (u16, Option<String>, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/environments", served.base))
        .json(&json!({"image": image}))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (status, retry, resp.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_pulls_are_bounded_and_one_whose_client_left_counts_until_it_ends() {
    let registry = Registry::start();
    let roots = tempfile::tempdir().unwrap();
    busybox_root(roots.path());
    let one = registry.push(roots.path(), &["PATH=/bin", "N=1"], "bb:1");
    let two = registry.push(roots.path(), &["PATH=/bin", "N=2"], "bb:2");
    let gate = Gate::start(&registry.host).await;
    let data = private_dir();
    let served = serve_through(
        &gate,
        data.path(),
        &[("TOOLEXEC_LIMITS__MAX_PULLS_PER_TENANT", "1")],
    );
    let (first_ref, second_ref) = (format!("{}/bb:1", gate.host), format!("{}/bb:2", gate.host));

    // A streamed pull, held at its first blob: the tenant's one slot is taken.
    let first = reqwest::Client::new()
        .post(format!("{}/v1/environments", served.base))
        .header("accept", "text/event-stream")
        .json(&json!({"image": first_ref}))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    gate.until_held().await;
    let (status, retry, body) = pull(&served, &second_ref).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (429, Some("too_many_concurrent")),
        "{body}"
    );
    assert_eq!(retry.as_deref(), Some("5"), "{body}");
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("limits.max_pulls_per_tenant"), "{body}");
    // A streamed one is refused the same way, before its stream begins.
    let streamed = reqwest::Client::new()
        .post(format!("{}/v1/environments", served.base))
        .header("accept", "text/event-stream")
        .json(&json!({"image": second_ref}))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 429);
    let body: Value = streamed.json().await.unwrap();
    assert_eq!(body["code"], "too_many_concurrent", "{body}");

    // Its client goes away: the pull goes on, and still counts against the tenant.
    drop(first);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _, body) = pull(&served, &second_ref).await;
    assert_eq!(status, 429, "{body}");

    // Let the registry answer: the pull nobody waits for lands in the cache, then gives its
    // slot back.
    gate.open.send_replace(true);
    let hex = |d: &str| d.trim_start_matches("sha256:").to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    let second = loop {
        let (status, _, body) = pull(&served, &second_ref).await;
        if status != 429 {
            break (status, body);
        }
        assert!(
            Instant::now() < deadline,
            "the slot never came back: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(second.0, 200, "{}", second.1);
    assert_eq!(second.1["environment"]["digest"], two, "{}", second.1);
    let cached = image_dirs(data.path());
    assert!(cached.contains(&hex(&one)), "{cached:?}");
    assert!(cached.contains(&hex(&two)), "{cached:?}");
    // And the first is there whole: asking again finds it cached.
    let (status, _, again) = pull(&served, &first_ref).await;
    assert_eq!((status, &again["cached"]), (200, &json!(true)), "{again}");
    assert_eq!(again["environment"]["digest"], one, "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_localhost_registry_is_refused_whatever_allow_cidrs_says() {
    let registry = Registry::start();
    let roots = tempfile::tempdir().unwrap();
    busybox_root(roots.path());
    registry.push(roots.path(), &["PATH=/bin"], "bb:1");
    let gate = Gate::start(&registry.host).await;
    gate.open.send_replace(true);
    // The registry by a name that is always this host, allowed as a registry, its address
    // (both loopbacks) allowed too: a localhost name is still not dialled.
    let by_name = format!("localhost:{}", gate.host.rsplit_once(':').unwrap().1);
    let data = private_dir();
    let registries = format!("{by_name},{}", gate.host);
    let served = serve(serve_command(
        &registries,
        data.path(),
        Some("127.0.0.1,::1"),
    ));
    for path in ["/v1/environments", "/v1/sessions"] {
        let body = if path == "/v1/sessions" {
            json!({"environment": {"image": format!("{by_name}/bb:1")}})
        } else {
            json!({"image": format!("{by_name}/bb:1")})
        };
        let (status, body) = post(&served, path, body).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (422, Some("image_not_allowed")),
            "{path}: {body}"
        );
        let detail = body["detail"].as_str().unwrap_or_default();
        // What to do: the registry by its address, that address in allow_cidrs.
        assert!(detail.contains("by its address"), "{body}");
        assert!(detail.contains("environments.allow_cidrs"), "{body}");
    }
    assert_eq!(gate.requests.load(Ordering::SeqCst), 0);
    // The same registry by its address is pulled from.
    let (status, body) = post(
        &served,
        "/v1/environments",
        json!({"image": format!("{}/bb:1", gate.host)}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}
