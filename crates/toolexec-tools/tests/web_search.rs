//! web_search against fake search-provider APIs (Brave's, Tavily's and SearXNG's JSON) served
//! from loopback: what each receives (its key in a header or the body, never the URL), the
//! numbered results the model gets, and the errors when there is no provider, no network, or
//! a provider refuses.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
mod common;

use std::sync::{Arc, Mutex};

use common::Session;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use toolexec_core::{CallStatus, NetworkPolicy};
use toolexec_tools::web::{WebAccess, WebConfig};

/// A loopback server answering every request with `status` and `body`; the requests it got.
async fn provider(status: u16, body: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let log = log.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Head, then a body of the declared length.
                loop {
                    let n = s.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                log.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf).to_string());
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    (base, seen)
}

fn session_with(config: &WebConfig, network: NetworkPolicy) -> Session {
    let mut s = Session::new();
    s.ctx.policy.network = network;
    s.ctx.web = Arc::new(WebAccess::from_config(config, &[]).unwrap());
    s
}

#[tokio::test]
async fn each_provider_is_asked_as_it_documents_and_its_results_are_numbered() {
    let (brave, brave_seen) = provider(
        200,
        r#"{"web":{"results":[{"title":"Tokio <strong>broadcast</strong>","url":"https://docs.rs/tokio/","description":"A multi-producer channel"},{"title":"Second","url":"https://two.example/","description":"two"}]}}"#,
    )
    .await;
    let config = WebConfig {
        search_provider: Some("brave".into()),
        search_url: Some(format!("{brave}/res/v1/web/search")),
        search_api_key: Some("bsk-secret".into()),
        ..WebConfig::default()
    };
    let s = session_with(&config, NetworkPolicy::Allow);
    let out = s
        .call(
            "web_search",
            json!({"query": "tokio broadcast", "max_results": 1}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert!(
        out.content
            .starts_with("1 results for \"tokio broadcast\":"),
        "{}",
        out.content
    );
    assert!(
        out.content
            .contains("1. Tokio broadcast\n   https://docs.rs/tokio/\n   A multi-producer channel"),
        "{}",
        out.content
    );
    assert!(!out.content.contains("Second"), "{}", out.content);
    let got = brave_seen.lock().unwrap().join("\n");
    assert!(
        got.starts_with("GET /res/v1/web/search?q=tokio+broadcast&count=1 "),
        "{got}"
    );
    assert!(
        got.to_ascii_lowercase()
            .contains("x-subscription-token: bsk-secret"),
        "{got}"
    );

    let (tavily, tavily_seen) = provider(
        200,
        r#"{"results":[{"title":"T","url":"https://t.example/","content":"from tavily"}]}"#,
    )
    .await;
    let config = WebConfig {
        search_provider: Some("tavily".into()),
        search_url: Some(format!("{tavily}/search")),
        search_api_key: Some("tvly-secret".into()),
        ..WebConfig::default()
    };
    let out = session_with(&config, NetworkPolicy::Allow)
        .call("web_search", json!({"query": "q"}))
        .await;
    assert!(
        out.content
            .contains("1. T\n   https://t.example/\n   from tavily"),
        "{}",
        out.content
    );
    let got = tavily_seen.lock().unwrap().join("\n");
    assert!(got.starts_with("POST /search "), "{got}");
    assert!(
        got.to_ascii_lowercase()
            .contains("authorization: bearer tvly-secret"),
        "{got}"
    );
    assert!(
        got.contains(r#""max_results":5"#) && got.contains(r#""query":"q""#),
        "{got}"
    );

    let (searx, searx_seen) = provider(
        200,
        r#"{"results":[{"title":"S","url":"https://s.example/","content":"from searxng"}]}"#,
    )
    .await;
    let config = WebConfig {
        search_provider: Some("searxng".into()),
        search_url: Some(format!("{searx}/")),
        ..WebConfig::default()
    };
    let out = session_with(&config, NetworkPolicy::Allow)
        .call("web_search", json!({"query": "a b"}))
        .await;
    assert!(out.content.contains("from searxng"), "{}", out.content);
    let got = searx_seen.lock().unwrap().join("\n");
    assert!(got.starts_with("GET /search?q=a+b&format=json "), "{got}");
}

#[tokio::test]
async fn without_a_provider_network_or_a_working_answer_the_model_is_told_why() {
    let none = Session::new();
    let out = none.call("web_search", json!({"query": "x"})).await;
    assert_eq!(out.status, CallStatus::Error);
    assert!(
        out.content.contains("not available on this service"),
        "{}",
        out.content
    );

    let (base, seen) = provider(401, r#"{"error":"bad key"}"#).await;
    let config = WebConfig {
        search_provider: Some("searxng".into()),
        search_url: Some(base),
        ..WebConfig::default()
    };
    let out = session_with(&config, NetworkPolicy::None)
        .call("web_search", json!({"query": "x"}))
        .await;
    assert_eq!(out.status, CallStatus::Denied, "{}", out.content);
    assert!(
        seen.lock().unwrap().is_empty(),
        "nothing is asked without network"
    );
    let out = session_with(&config, NetworkPolicy::Allow)
        .call("web_search", json!({"query": "x"}))
        .await;
    assert_eq!(out.status, CallStatus::Error);
    assert!(
        out.content.contains("HTTP 401") && out.content.contains("key"),
        "{}",
        out.content
    );

    for (provider, url, key, why) in [
        ("bing", None, None, "not a provider"),
        ("brave", None, None, "needs web.search_api_key"),
        ("searxng", None, None, "needs web.search_url"),
        ("searxng", Some("not a url"), None, "web.search_url"),
    ] {
        let config = WebConfig {
            search_provider: Some(provider.into()),
            search_url: url.map(str::to_owned),
            search_api_key: key,
            ..WebConfig::default()
        };
        let err = WebAccess::from_config(&config, &[]).unwrap_err();
        assert!(err.contains(why), "{provider}: {err}");
    }
}

#[tokio::test]
async fn a_search_is_recorded_and_replayed_from_the_record_without_the_provider() {
    let (base, seen) = provider(
        200,
        r#"{"results":[{"title":"One","url":"https://one.example/","content":"first"}]}"#,
    )
    .await;
    let config = WebConfig {
        search_provider: Some("searxng".into()),
        search_url: Some(base.clone()),
        ..WebConfig::default()
    };
    let mut s = session_with(&config, NetworkPolicy::Allow);
    let live = s.call("web_search", json!({"query": "one thing"})).await;
    assert_eq!(live.status, CallStatus::Ok, "{}", live.content);
    assert_eq!(live.events.len(), 1);
    let exchange = &live.events[0];
    assert_eq!(exchange.data["role"], "search");
    assert_eq!(exchange.data["service"], "searxng");
    assert_eq!(exchange.data["status"], 200);
    // The operator's endpoint is not recorded (it may hold credentials or an internal host).
    assert!(exchange.data.get("url").is_none(), "{}", exchange.data);
    let blobs = live
        .events
        .iter()
        .filter_map(|e| e.blob.clone())
        .map(|b| (toolexec_core::sha256_hex(&b), b))
        .collect();
    let record = toolexec_tools::observe::Recorded::new(
        uuid::Uuid::from_u128(1),
        live.events.iter().map(|e| e.data.clone()),
        &blobs,
    );
    // No provider configured any more: the replay has the answer it needs in the record.
    s.ctx.web = Arc::new(WebAccess::default());
    s.ctx.observed = toolexec_tools::observe::Observed::Replay(Arc::new(record));
    let replayed = s.call("web_search", json!({"query": "one thing"})).await;
    assert_eq!(replayed.status, live.status);
    assert_eq!(replayed.content, live.content);
    assert_eq!(seen.lock().unwrap().len(), 1, "the replay asked nobody");
}

#[tokio::test]
async fn a_refusal_of_the_provider_is_recorded_by_status_without_its_body() {
    let (base, _) = provider(401, r#"{"error":"Invalid key sk-live-123"}"#).await;
    let config = WebConfig {
        search_provider: Some("searxng".into()),
        search_url: Some(base),
        ..WebConfig::default()
    };
    let s = session_with(&config, NetworkPolicy::Allow);
    let out = s.call("web_search", json!({"query": "x"})).await;
    assert_eq!(out.status, CallStatus::Error);
    assert_eq!(out.events[0].data["status"], 401);
    assert_eq!(out.events[0].data.get("body_sha256"), None);
    assert!(
        out.events[0].blob.is_none(),
        "a refusal's body may quote a key"
    );
    let record = toolexec_tools::observe::Recorded::new(
        uuid::Uuid::from_u128(1),
        out.events.iter().map(|e| e.data.clone()),
        &Default::default(),
    );
    let mut again = session_with(&config, NetworkPolicy::Allow);
    again.ctx.observed = toolexec_tools::observe::Observed::Replay(Arc::new(record));
    let replayed = again.call("web_search", json!({"query": "x"})).await;
    assert_eq!(replayed.content, out.content);
}

#[tokio::test]
async fn a_tenant_gets_only_its_share_of_paid_searches_per_minute() {
    let (base, seen) = provider(200, r#"{"results":[]}"#).await;
    let config = WebConfig {
        search_provider: Some("searxng".into()),
        search_url: Some(base),
        paid_calls_per_minute: 2,
        ..WebConfig::default()
    };
    let mut s = session_with(&config, NetworkPolicy::Allow);
    for i in 0..2 {
        let out = s
            .call("web_search", json!({"query": format!("q{i}")}))
            .await;
        assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    }
    let out = s.call("web_search", json!({"query": "q3"})).await;
    assert_eq!(out.status, CallStatus::Error);
    assert!(
        out.content
            .contains("2 searches and summaries for this minute")
            && out.content.contains("Try again in"),
        "{}",
        out.content
    );
    assert_eq!(seen.lock().unwrap().len(), 2);
    // The refusal is in the record (nothing was sent), and a replay answers as the call did.
    assert_eq!(out.events.len(), 1);
    assert_eq!(out.events[0].data["error"]["kind"], "quota");
    assert!(out.events[0].data.get("status").is_none());
    let record = toolexec_tools::observe::Recorded::new(
        uuid::Uuid::from_u128(3),
        out.events.iter().map(|e| e.data.clone()),
        &Default::default(),
    );
    let mut replay = session_with(&config, NetworkPolicy::Allow);
    replay.ctx.observed = toolexec_tools::observe::Observed::Replay(Arc::new(record));
    let again = replay.call("web_search", json!({"query": "q3"})).await;
    assert_eq!(again.status, out.status);
    assert_eq!(again.content, out.content);
    assert_eq!(seen.lock().unwrap().len(), 2);
    // Another tenant of the same service still has its own.
    s.ctx.tenant_id = uuid::Uuid::from_u128(7);
    let out = s.call("web_search", json!({"query": "q4"})).await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
}
