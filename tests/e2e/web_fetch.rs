//! `web_fetch` and `web_search` through the service over HTTP, on both stores: validated, run
//! against pages served on loopback (reached through the operator allow-list the test
//! configures), recorded with their capability and every exchange as a `web.exchange` event; a
//! verify replay served from those records without a request to the servers; and the default
//! configuration refusing the same server.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::response::Html;
use serde_json::json;
use toolexec_tests::app::Backend;

toolexec_tests::on_both_stores!(
    web_fetch_is_validated_run_and_recorded_like_any_tool,
    the_default_configuration_refuses_a_loopback_page,
    web_observations_are_recorded_and_a_replay_serves_them_without_the_network,
    a_cancelled_fetch_still_records_the_request_it_sent,
    no_client_call_runs_in_a_replay_session_while_the_replay_runs,
    an_approved_web_call_a_replay_asks_again_for_is_served_from_its_record,
);

/// A page on 127.0.0.1 and the number of requests it got: `/doc` (HTML), `/old` (a redirect to
/// it), `/visit` (a page that says how many times it was asked for), `/search` (a SearXNG API)
/// and `/v1/chat/completions` (a summarizer). Every request counts.
async fn page_server() -> (u16, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let any = hits.clone();
    let visits = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .route(
            "/slow",
            axum::routing::get(|| async {
                tokio::time::sleep(std::time::Duration::from_secs(20)).await;
                "late"
            }),
        )
        .route(
            "/visit",
            axum::routing::get(move || {
                let n = visits.fetch_add(1, Ordering::SeqCst) + 1;
                async move { format!("visit number {n}") }
            }),
        )
        .route(
            "/search",
            axum::routing::get(|| async {
                axum::Json(json!({"results": [
                    {"title": "Install guide", "url": "https://example.org/install", "content": "Run make install."}
                ]}))
            }),
        )
        .route(
            "/v1/chat/completions",
            axum::routing::post(|body: axum::Json<serde_json::Value>| async move {
                let asked = body["messages"][1]["content"].as_str().unwrap_or_default().len();
                axum::Json(json!({"choices": [{"message": {"content": format!("It says: run make install ({asked} characters asked about).")}}]}))
            }),
        )
        .route(
            "/doc",
            axum::routing::get(|| async {
                Html(
                    "<html><head><script>track()</script></head><body><nav>Home | Blog</nav>\
                     <h2>Install</h2><p>Run <code>make install</code>.</p></body></html>",
                )
            }),
        )
        .route(
            "/old",
            axum::routing::get(|| async { axum::response::Redirect::temporary("/doc") }),
        )
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let any = any.clone();
                async move {
                    any.fetch_add(1, Ordering::SeqCst);
                    next.run(req).await
                }
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, hits)
}

async fn web_fetch_is_validated_run_and_recorded_like_any_tool(backend: Backend) {
    let (port, hits) = page_server().await;
    let app = backend
        .spawn_with(|c| c.sandbox.egress_allow_cidrs = vec!["127.0.0.1/32".to_owned()])
        .await;
    let session = app.session(json!({"policy": {"network": "allow"}})).await;
    let sid = session["id"].as_str().unwrap();

    let r = app
        .call(
            sid,
            "f1",
            "web_fetch",
            json!({"url": format!("http://127.0.0.1:{port}/old")}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let content = r["content"].as_str().unwrap();
    assert!(content.contains("## Install"), "{content}");
    assert!(content.contains("`make install`"), "{content}");
    assert!(content.contains("(after 1 redirect)"), "{content}");
    assert!(
        !content.contains("track()") && !content.contains("Blog"),
        "{content}"
    );
    let inv = app.invocation_of(&r).await;
    assert_eq!(inv["capabilities"], json!(["network"]));
    assert_eq!(inv["status"], "ok", "{inv}");
    assert_eq!(inv["call_id"], "f1", "{inv}");

    let r = app
        .call(
            sid,
            "f2",
            "web_fetch",
            json!({"url": format!("http://127.0.0.1:{port}/doc"), "timeout_ms": 120000}),
        )
        .await;
    assert_eq!(r["status"], "invalid_arguments", "{r}");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "the redirect and the page; the invalid call fetched nothing"
    );

    // A session without network access cannot fetch unless the operator allows it.
    let offline = app.session(json!({})).await;
    let r = app
        .call(
            offline["id"].as_str().unwrap(),
            "f3",
            "web_fetch",
            json!({"url": format!("http://127.0.0.1:{port}/doc")}),
        )
        .await;
    assert_eq!(r["status"], "denied", "{r}");
    assert!(
        r["content"].as_str().unwrap().contains("not granted"),
        "{r}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 2);
}

async fn the_default_configuration_refuses_a_loopback_page(backend: Backend) {
    let (port, hits) = page_server().await;
    let app = backend
        .spawn_with(|c| c.web.public_when_network_none = true)
        .await;
    let session = app.session(json!({})).await;
    let sid = session["id"].as_str().unwrap();
    for (id, url) in [
        ("d1", format!("http://127.0.0.1:{port}/doc")),
        ("d2", format!("http://localhost:{port}/doc")),
        ("d3", format!("http://0x7f.1:{port}/doc")),
    ] {
        let r = app.call(sid, id, "web_fetch", json!({"url": url})).await;
        assert_eq!(r["status"], "denied", "{url}: {r}");
        let content = r["content"].as_str().unwrap();
        assert!(content.contains("not reachable from here"), "{content}");
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0, "nothing reached the server");
}

async fn web_observations_are_recorded_and_a_replay_serves_them_without_the_network(
    backend: Backend,
) {
    let (port, hits) = page_server().await;
    let base = format!("http://127.0.0.1:{port}");
    let app = backend
        .spawn_with(|c| {
            c.sandbox.egress_allow_cidrs = vec!["127.0.0.1/32".to_owned()];
            c.web.search_provider = Some("searxng".to_owned());
            c.web.search_url = Some(base.clone());
            c.web.summarizer_url = Some(format!("{base}/v1"));
            c.web.summarizer_model = Some("fake-1".to_owned());
        })
        .await;
    let session = app.session(json!({"policy": {"network": "allow"}})).await;
    let sid = session["id"].as_str().unwrap().to_owned();
    // Read-only calls of one batch run at once: the two visits go in batches of their own, so
    // that which is first is known.
    let mut results = app
        .calls(
            &sid,
            json!([
                {"id": "f1", "name": "web_fetch", "arguments": {"url": format!("{base}/old")}},
                {"id": "f2", "name": "web_fetch", "arguments": {"url": format!("{base}/doc"), "prompt": "How do I install it?"}},
                {"id": "s1", "name": "web_search", "arguments": {"query": "install guide"}},
                {"id": "v1", "name": "web_fetch", "arguments": {"url": format!("{base}/visit")}}
            ]),
        )
        .await;
    for (id, url) in [
        ("v2", format!("{base}/visit")),
        ("x1", "http://127.0.0.1:1/closed".to_owned()),
    ] {
        results.push(app.call(&sid, id, "web_fetch", json!({"url": url})).await);
    }
    for r in &results[..5] {
        assert_eq!(r["status"], "ok", "{r}");
    }
    assert!(
        results[1]["content"]
            .as_str()
            .unwrap()
            .contains("It says: run make install")
    );
    assert!(
        results[2]["content"]
            .as_str()
            .unwrap()
            .contains("1. Install guide")
    );
    assert!(
        results[3]["content"]
            .as_str()
            .unwrap()
            .contains("visit number 1")
    );
    assert!(
        results[4]["content"]
            .as_str()
            .unwrap()
            .contains("visit number 2")
    );
    assert_eq!(results[5]["status"], "error", "{}", results[5]);
    let asked = hits.load(Ordering::SeqCst);
    assert_eq!(
        asked, 7,
        "two hops, a page and a summary, a search, two visits"
    );

    // The redirect and the page are two exchanges; the page's body is a blob named by its hash.
    let inv = app.invocation_of(&results[0]).await;
    let exchanges: Vec<&serde_json::Value> = inv["side_effects"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "web.exchange")
        .collect();
    assert_eq!(exchanges.len(), 2, "{inv:#}");
    let (hop0, hop1) = (&exchanges[0]["data"], &exchanges[1]["data"]);
    assert_eq!(hop0["role"], "page");
    assert_eq!(hop0["status"], 307);
    assert_eq!(hop0["headers"]["location"], "/doc");
    assert!(hop0.get("body_sha256").is_none(), "{hop0}");
    assert_eq!(hop1["hop"], 1);
    assert_eq!(hop1["url"], format!("{base}/doc"));
    assert_eq!(hop1["status"], 200);
    assert_eq!(hop1["body_stored"], true);
    assert!(
        hop1["headers"]["content-type"]
            .as_str()
            .unwrap()
            .starts_with("text/html")
    );
    let body_sha = hop1["body_sha256"].as_str().unwrap();
    let page = reqwest::get(format!("{base}/doc"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(body_sha, toolexec_core::sha256_hex(&page));
    // The summary and the search are exchanges too; the summarizer's endpoint is not recorded.
    let inv = app.invocation_of(&results[1]).await;
    let roles: Vec<&str> = inv["side_effects"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["data"]["role"].as_str())
        .collect();
    assert_eq!(roles, ["page", "summary"], "{inv:#}");
    let summary = inv["side_effects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["data"]["role"] == "summary")
        .unwrap();
    assert!(summary["data"].get("url").is_none(), "{summary}");
    assert_eq!(summary["data"]["service"], "fake-1");
    let inv = app.invocation_of(&results[5]).await;
    let failed = &inv["side_effects"][0]["data"];
    assert_eq!(failed["error"]["kind"], "failed", "{inv:#}");
    let before_replay = hits.load(Ordering::SeqCst);

    // The replay re-runs every call and serves each from its record: nothing reaches the
    // servers, the second visit gets the second page, and nothing diverges.
    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/replay"),
            &json!({"mode": "verify"}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let replay: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(replay["status"], "finished", "{replay:#}");
    assert_eq!(replay["calls_replayed"], 6, "{replay:#}");
    assert_eq!(replay["calls_diverged"], 0, "{replay:#}");
    for c in replay["calls"].as_array().unwrap() {
        assert_eq!(c["served_from_record"], true, "{c}");
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        before_replay,
        "the replay made no request"
    );
    // The replay's own log holds the observations it was served, naming their source.
    let rsid = replay["session_id"].as_str().unwrap();
    let served: Vec<serde_json::Value> = app
        .events(rsid)
        .await
        .into_iter()
        .filter(|e| e["kind"] == "web.exchange")
        .collect();
    assert_eq!(served.len(), 8, "{served:#?}");
    assert!(served.iter().all(|e| e["data"]["served_from"].is_string()));
    let visit2 = replay["calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["call_id"] == "v2")
        .unwrap();
    let rinv = app
        .get(&format!(
            "/v1/invocations/{}",
            visit2["replayed_invocation_id"].as_str().unwrap()
        ))
        .await
        .json::<serde_json::Value>()
        .await
        .unwrap();
    assert!(
        rinv["content"].as_str().unwrap().contains("visit number 2"),
        "{rinv}"
    );
    // After the replay the session is like any other: its calls go to the network.
    let r = app
        .call(
            rsid,
            "v3",
            "web_fetch",
            json!({"url": format!("{base}/visit")}),
        )
        .await;
    assert!(
        r["content"].as_str().unwrap().contains("visit number 3"),
        "{r}"
    );
}

async fn a_cancelled_fetch_still_records_the_request_it_sent(backend: Backend) {
    let (port, hits) = page_server().await;
    let app = backend
        .spawn_with(|c| c.sandbox.egress_allow_cidrs = vec!["127.0.0.1/32".to_owned()])
        .await;
    let session = app.session(json!({"policy": {"network": "allow"}})).await;
    let sid = session["id"].as_str().unwrap().to_owned();
    let url = format!("http://127.0.0.1:{port}/slow");
    let call = {
        let (app_url, sid, url) = (app.url(""), sid.clone(), url.clone());
        let http = app.http.clone();
        tokio::spawn(async move {
            http.post(format!("{app_url}/v1/sessions/{sid}/calls"))
                .json(&json!({"calls": [{"id": "slow1", "name": "web_fetch", "arguments": {"url": url, "timeout_ms": 60000}}]}))
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        })
    };
    // The request has reached the server; the call's start is in the log.
    let mut invocation = None;
    for _ in 0..200 {
        if hits.load(Ordering::SeqCst) == 1
            && let Some(e) = app
                .events(&sid)
                .await
                .into_iter()
                .find(|e| e["kind"] == "invocation.started")
        {
            invocation = e["invocation_id"].as_str().map(str::to_owned);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let inv = invocation.expect("the fetch started");
    let resp = app
        .post(&format!("/v1/invocations/{inv}/cancel"), &json!({}))
        .await;
    assert_eq!(resp.status(), 200);
    let result = call.await.unwrap();
    assert_eq!(result["results"][0]["status"], "cancelled", "{result}");
    let recorded = app
        .get(&format!("/v1/invocations/{inv}"))
        .await
        .json::<serde_json::Value>()
        .await
        .unwrap();
    let exchanges: Vec<&serde_json::Value> = recorded["side_effects"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "web.exchange")
        .collect();
    assert_eq!(exchanges.len(), 1, "{recorded:#}");
    assert_eq!(exchanges[0]["data"]["url"], url);
    assert_eq!(exchanges[0]["data"]["error"]["kind"], "failed");
    assert!(
        exchanges[0]["data"]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("stopped before this exchange ended"),
        "{recorded:#}"
    );
}

async fn no_client_call_runs_in_a_replay_session_while_the_replay_runs(backend: Backend) {
    let app = backend.spawn().await;
    let session = app
        .session(json!({"metadata": {"case": "replay-lock"}}))
        .await;
    let sid = session["id"].as_str().unwrap().to_owned();
    let r = app
        .call(
            &sid,
            "s1",
            "shell",
            json!({"command": "sleep 5; echo done", "timeout_ms": 20000}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let replay = {
        let (app_url, sid) = (app.url(""), sid.clone());
        let http = app.http.clone();
        tokio::spawn(async move {
            http.post(format!("{app_url}/v1/sessions/{sid}/replay"))
                .json(&json!({"mode": "verify"}))
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        })
    };
    // The replay's session, found by its metadata while the replay re-runs the sleep.
    let mut replay_sid = None;
    for _ in 0..100 {
        let list: serde_json::Value = app
            .get("/v1/sessions?limit=100")
            .await
            .json()
            .await
            .unwrap();
        if let Some(s) = list["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["metadata"]["replay_of"] == sid.as_str())
        {
            replay_sid = s["id"].as_str().map(str::to_owned);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let replay_sid = replay_sid.expect("the replay's session");
    let resp = app
        .post(
            &format!("/v1/sessions/{replay_sid}/calls"),
            &json!({"calls": [{"id": "s1", "name": "shell", "arguments": {"command": "echo sneaked in"}}]}),
        )
        .await;
    let status = resp.status();
    let problem: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(status, 409, "{problem}");
    assert_eq!(problem["code"], "replay_running", "{problem}");
    let report = replay.await.unwrap();
    assert_eq!(report["status"], "finished", "{report:#}");
    assert_eq!(report["calls_diverged"], 0, "{report:#}");
    // The replay over, the session takes calls like any other.
    let r = app
        .call(
            &replay_sid,
            "after",
            "shell",
            json!({"command": "echo later"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
}

/// A replay asks again before it re-runs a call its source's person approved (issue 23, §8);
/// approved again, a call that reaches the outside world is still served from its record like
/// any replayed call: the page server gets no request, and the call matches.
async fn an_approved_web_call_a_replay_asks_again_for_is_served_from_its_record(backend: Backend) {
    let (port, hits) = page_server().await;
    let app = backend
        .spawn_with(|c| c.sandbox.egress_allow_cidrs = vec!["127.0.0.1/32".to_owned()])
        .await;
    let session = app
        .session(json!({"policy": {"network": "allow", "approval": {"capabilities": ["network"]}}}))
        .await;
    let sid = session["id"].as_str().unwrap().to_owned();
    let url = format!("http://127.0.0.1:{port}/visit");
    let r = app.call(&sid, "v1", "web_fetch", json!({"url": url})).await;
    assert_eq!(r["status"], "pending_approval", "{r}");
    let inv = r["invocation_id"].as_str().unwrap().to_owned();
    let approve = |id: String| {
        let url = app.url(&format!("/v1/invocations/{id}/approve"));
        let http = app.http.clone();
        async move {
            let resp = http
                .post(url)
                .json(&json!({"by": "alice"}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
        }
    };
    approve(inv.clone()).await;
    let done: serde_json::Value = app
        .get(&format!("/v1/invocations/{inv}?wait=30"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(done["status"], "ok", "{done}");
    assert!(done["content"].as_str().unwrap().contains("visit number 1"));
    let before = hits.load(Ordering::SeqCst);

    let replay = {
        let url = app.url(&format!("/v1/sessions/{sid}/replay"));
        let http = app.http.clone();
        tokio::spawn(async move {
            let resp = http
                .post(url)
                .json(&json!({"mode": "verify"}))
                .send()
                .await
                .unwrap();
            (
                resp.status().as_u16(),
                resp.json::<serde_json::Value>().await.unwrap(),
            )
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let waiting = loop {
        let list: serde_json::Value = app.get("/v1/sessions").await.json().await.unwrap();
        let rsid = list["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["origin"]["kind"] == "replay")
            .map(|s| s["id"].as_str().unwrap().to_owned());
        if let Some(rsid) = rsid
            && let Some(e) = app
                .events(&rsid)
                .await
                .into_iter()
                .find(|e| e["kind"] == "approval.requested")
        {
            assert_eq!(e["data"]["replay_of"], inv.as_str(), "{e}");
            break e["invocation_id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "the replay never asked");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    approve(waiting).await;
    let (status, report) = tokio::time::timeout(Duration::from_secs(60), replay)
        .await
        .expect("the replay ends once approved")
        .unwrap();
    assert_eq!(status, 200, "{report:#}");
    assert_eq!(report["calls_diverged"], 0, "{report:#}");
    assert_eq!(report["calls"][0]["served_from_record"], true, "{report:#}");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        before,
        "the approved re-run made no request"
    );
}
