//! `web_fetch` through the service over HTTP, on both stores: validated, run against a page
//! served on loopback (reached through the operator allow-list the test configures), recorded
//! with its capability; and the default configuration refusing the same server.
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::response::Html;
use serde_json::json;
use toolexec_tests::app::Backend;

toolexec_tests::on_both_stores!(
    web_fetch_is_validated_run_and_recorded_like_any_tool,
    the_default_configuration_refuses_a_loopback_page,
);

/// A page on 127.0.0.1 and the number of requests it got.
async fn page_server() -> (u16, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app = axum::Router::new()
        .route(
            "/doc",
            axum::routing::get(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async {
                    Html(
                        "<html><head><script>track()</script></head><body><nav>Home | Blog</nav>\
                         <h2>Install</h2><p>Run <code>make install</code>.</p></body></html>",
                    )
                }
            }),
        )
        .route(
            "/old",
            axum::routing::get(|| async { axum::response::Redirect::temporary("/doc") }),
        );
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
        1,
        "the invalid call fetched nothing"
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
    assert_eq!(hits.load(Ordering::SeqCst), 1);
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
