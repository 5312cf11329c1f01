//! web_fetch against real HTTP servers on loopback, reached only through an explicit test
//! allow-list (and names answered by a `StaticResolver`, on the production code path). The
//! default policy is checked in the same run to keep refusing the same servers.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
mod common;

use std::io::Write as _;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::Session;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use toolexec_core::{CallStatus, NetworkPolicy};
use toolexec_net::{NetPolicy, StaticResolver};
use toolexec_tools::web::{Summarizer, WebAccess};

/// What the test server answers to a path.
#[derive(Clone)]
enum Reply {
    Page {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Vec<u8>,
    },
    /// `text/plain` without a length, forever.
    Endless,
    /// Waits, then answers.
    Slow(Duration),
}

fn page(content_type: &str, body: impl Into<Vec<u8>>) -> Reply {
    Reply::Page {
        status: 200,
        headers: vec![("Content-Type", content_type.to_owned())],
        body: body.into(),
    }
}

fn redirect(to: &str) -> Reply {
    Reply::Page {
        status: 302,
        headers: vec![("Location", to.to_owned())],
        body: Vec::new(),
    }
}

/// A loopback HTTP/1.1 server: one request per connection; counts the requests it got.
struct Server {
    port: u16,
    hits: Arc<AtomicUsize>,
    /// Request heads and bodies as received (for the fake summarizer).
    requests: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Server {
    async fn start(routes: impl Fn(&str, u16) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let routes = Arc::new(routes);
        let (h, r) = (hits.clone(), requests.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (routes, hits, requests) = (routes.clone(), h.clone(), r.clone());
                tokio::spawn(async move {
                    hits.fetch_add(1, Ordering::SeqCst);
                    let _ = serve_one(stream, routes.as_ref(), port, &requests).await;
                });
            }
        });
        Self {
            port,
            hits,
            requests,
        }
    }

    /// `http://web.test:PORT{path}` (a name the test resolver answers with 127.0.0.1).
    fn url(&self, path: &str) -> String {
        format!("http://web.test:{}{path}", self.port)
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

async fn serve_one(
    mut stream: TcpStream,
    routes: &(dyn Fn(&str, u16) -> Reply + Send + Sync),
    port: u16,
    requests: &std::sync::Mutex<Vec<String>>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    requests
        .lock()
        .unwrap()
        .push(String::from_utf8_lossy(&buf).to_string());
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let mut reply = routes(&path, port);
    if let Reply::Slow(delay) = reply {
        tokio::time::sleep(delay).await;
        reply = page("text/plain", "late");
    }
    match reply {
        Reply::Page {
            status,
            headers,
            body,
        } => {
            let mut out = format!("HTTP/1.1 {status} X\r\nConnection: close\r\n");
            for (k, v) in headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
            stream.write_all(out.as_bytes()).await?;
            stream.write_all(&body).await?;
        }
        Reply::Endless => {
            stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/plain\r\n\r\n",
                )
                .await?;
            let block = vec![b'a'; 64 * 1024];
            loop {
                stream.write_all(&block).await?;
            }
        }
        Reply::Slow(_) => {}
    }
    stream.shutdown().await
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The test's web access: loopback allow-listed, `web.test` answered with 127.0.0.1.
fn test_access() -> WebAccess {
    WebAccess {
        policy: NetPolicy::new(&["127.0.0.1/32"]).unwrap(),
        resolver: Arc::new(
            StaticResolver::new()
                .with("web.test", [ip("127.0.0.1")])
                .with("internal.test", [ip("10.0.0.5")])
                .with("mixed.test", [ip("93.184.216.34"), ip("127.0.0.1")])
                .with("mixed-private.test", [ip("127.0.0.1"), ip("10.0.0.9")]),
        ),
        ..WebAccess::default()
    }
}

/// A session with network access and `web`.
fn session(web: WebAccess) -> Session {
    let mut s = Session::new();
    s.ctx.policy.network = NetworkPolicy::Allow;
    s.ctx.web = Arc::new(web);
    s
}

async fn fetch(s: &Session, args: Value) -> toolexec_tools::ToolOutput {
    s.call("web_fetch", args).await
}

#[tokio::test]
async fn an_html_page_comes_back_as_markdown_without_scripts_styles_or_navigation() {
    let server = Server::start(|_, _| {
        page(
            "text/html; charset=utf-8",
            "<!doctype html><html><head><title>T</title><style>body{color:red}</style>\
             <script>alert('hi')</script></head><body>\
             <header>Site header</header><nav><a href=\"/home\">Menu item</a></nav>\
             <main><h1>Release notes</h1><p>Version <strong>2.0</strong> adds \
             <a href=\"https://example.com/docs\">docs</a>.</p><ul><li>one</li><li>two</li></ul>\
             <pre><code>cargo build</code></pre></main>\
             <aside>Related links</aside><footer>Copyright</footer>\
             <script>document.write('x')</script></body></html>",
        )
    })
    .await;
    let s = session(test_access());
    let out = fetch(&s, json!({"url": server.url("/")})).await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    let text = &out.content;
    assert!(text.contains("# Release notes"), "{text}");
    assert!(text.contains("**2.0**"), "{text}");
    assert!(text.contains("[docs](https://example.com/docs)"), "{text}");
    assert!(text.contains("cargo build"), "{text}");
    assert!(text.contains("one") && text.contains("two"), "{text}");
    assert!(text.contains("HTML converted to Markdown"), "{text}");
    for dropped in [
        "alert",
        "color:red",
        "Site header",
        "Menu item",
        "Related links",
        "Copyright",
        "document.write",
        "<p>",
    ] {
        assert!(!text.contains(dropped), "{dropped} in {text}");
    }
}

#[tokio::test]
async fn a_long_page_is_read_in_parts_with_start_index() {
    let body: String = (0..300)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let served = body.clone();
    let server = Server::start(move |_, _| page("text/plain", served.clone())).await;
    let s = session(test_access());
    let first = fetch(&s, json!({"url": server.url("/"), "max_length": 200})).await;
    assert_eq!(first.status, CallStatus::Ok, "{}", first.content);
    assert!(
        first.content.contains(
            "Showing characters 0–200 of 300. To read on, call web_fetch again with the same url and start_index: 200."
        ),
        "{}",
        first.content
    );
    let second = fetch(
        &s,
        json!({"url": server.url("/"), "start_index": 200, "max_length": 200}),
    )
    .await;
    assert!(
        second
            .content
            .contains("Showing characters 200–300 of 300 (the end of the page)."),
        "{}",
        second.content
    );
    let part = |out: &toolexec_tools::ToolOutput| {
        out.content
            .split_once("\n\n")
            .map(|(_, t)| t.to_owned())
            .unwrap()
    };
    assert_eq!(part(&first) + &part(&second), body);
    let past = fetch(&s, json!({"url": server.url("/"), "start_index": 300})).await;
    assert_eq!(past.status, CallStatus::Error);
    assert!(past.content.contains("past the end"), "{}", past.content);
}

#[tokio::test]
async fn json_passes_through_as_it_is_and_an_error_status_is_an_error() {
    let json_body = r#"{"name": "toolexec", "tags": ["a", "b"], "n": 3}"#;
    let server = Server::start(move |path, _| match path {
        "/api" => page("application/json", json_body),
        _ => Reply::Page {
            status: 404,
            headers: vec![("Content-Type", "application/problem+json".to_owned())],
            body: br#"{"title": "not found"}"#.to_vec(),
        },
    })
    .await;
    let s = session(test_access());
    let out = fetch(&s, json!({"url": server.url("/api")})).await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert!(out.content.ends_with(json_body), "{}", out.content);
    assert!(out.content.contains("Content: JSON"), "{}", out.content);
    // An error status is shown with its body, as an error.
    let missing = fetch(&s, json!({"url": server.url("/gone")})).await;
    assert_eq!(missing.status, CallStatus::Error, "{}", missing.content);
    assert!(
        missing.content.contains("Status: 404"),
        "{}",
        missing.content
    );
    assert!(
        missing.content.ends_with(r#"{"title": "not found"}"#),
        "{}",
        missing.content
    );
}

#[tokio::test]
async fn an_image_is_described_by_type_and_size() {
    let server = Server::start(|_, _| page("image/png", vec![0x89u8; 2048])).await;
    let s = session(test_access());
    let out = fetch(&s, json!({"url": server.url("/logo.png")})).await;
    assert_eq!(out.status, CallStatus::Error, "{}", out.content);
    assert!(
        out.content
            .contains("The response is image/png, 2 KiB: not text"),
        "{}",
        out.content
    );
}

#[tokio::test]
async fn the_charset_of_the_header_or_of_a_meta_tag_is_honoured() {
    let (cyrillic, _, _) = encoding_rs::WINDOWS_1251.encode("Привет, мир");
    let cyrillic = cyrillic.into_owned();
    let (latin, _, _) = encoding_rs::WINDOWS_1252.encode("Café déjà vu");
    let mut latin_page = b"<html><head><meta charset=\"iso-8859-1\"></head><body><p>".to_vec();
    latin_page.extend_from_slice(&latin);
    latin_page.extend_from_slice(b"</p></body></html>");
    let server = Server::start(move |path, _| match path {
        "/ru" => page("text/plain; charset=windows-1251", cyrillic.clone()),
        _ => page("text/html", latin_page.clone()),
    })
    .await;
    let s = session(test_access());
    let ru = fetch(&s, json!({"url": server.url("/ru")})).await;
    assert!(ru.content.ends_with("Привет, мир"), "{}", ru.content);
    let fr = fetch(&s, json!({"url": server.url("/fr")})).await;
    assert!(fr.content.ends_with("Café déjà vu"), "{}", fr.content);
}

#[tokio::test]
async fn a_redirect_chain_is_followed_to_the_page() {
    let server = Server::start(|path, port| match path {
        "/a" => redirect("/b"),
        "/b" => redirect(&format!("http://127.0.0.1:{port}/c")),
        "/c" => redirect(
            "http://web.test:PORT/final"
                .replace("PORT", &port.to_string())
                .as_str(),
        ),
        _ => page("text/plain", "arrived"),
    })
    .await;
    let s = session(test_access());
    let out = fetch(&s, json!({"url": server.url("/a")})).await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert!(out.content.ends_with("arrived"), "{}", out.content);
    assert!(
        out.content.contains(&format!(
            "URL: http://web.test:{}/final (after 3 redirects)",
            server.port
        )),
        "{}",
        out.content
    );
    assert_eq!(server.hits(), 4);
}

#[tokio::test]
async fn a_redirect_to_a_refused_address_is_refused_without_naming_it() {
    let server = Server::start(|path, _| match path {
        "/metadata" => redirect("http://169.254.169.254/latest/meta-data/"),
        "/private" => redirect("http://10.0.0.7:8080/admin"),
        "/decimal" => redirect("http://2130706434/"),
        "/name" => redirect("http://internal.test/"),
        "/file" => redirect("file:///etc/passwd"),
        _ => page("text/plain", "never"),
    })
    .await;
    let s = session(test_access());
    for (path, hidden) in [
        ("/metadata", "169.254"),
        ("/private", "10.0.0.7"),
        ("/decimal", "127.0.0.2"),
        ("/name", "10.0.0.5"),
    ] {
        let out = fetch(&s, json!({"url": server.url(path)})).await;
        assert_eq!(out.status, CallStatus::Denied, "{path}: {}", out.content);
        assert!(
            out.content.contains("not reachable from here"),
            "{path}: {}",
            out.content
        );
        assert!(!out.content.contains(hidden), "{path}: {}", out.content);
    }
    let out = fetch(&s, json!({"url": server.url("/file")})).await;
    assert_eq!(out.status, CallStatus::Denied, "{}", out.content);
    assert!(
        out.content.contains("only http and https"),
        "{}",
        out.content
    );
    // Only the redirecting pages were requested.
    assert_eq!(server.hits(), 5);
}

#[tokio::test]
async fn a_redirect_loop_stops_after_five_redirects() {
    let server = Server::start(|path, _| match path {
        "/loop" => redirect("/loop"),
        _ => {
            let n: usize = path.trim_start_matches("/n").parse().unwrap_or(0);
            redirect(&format!("/n{}", n + 1))
        }
    })
    .await;
    let s = session(test_access());
    let out = fetch(&s, json!({"url": server.url("/loop")})).await;
    assert_eq!(out.status, CallStatus::Error, "{}", out.content);
    assert!(
        out.content.contains("redirected more than 5 times"),
        "{}",
        out.content
    );
    assert_eq!(server.hits(), 6, "the first request and five redirects");
    let out = fetch(&s, json!({"url": server.url("/n0")})).await;
    assert!(out.content.contains("more than 5 times"), "{}", out.content);
}

#[tokio::test]
async fn an_endless_body_is_read_up_to_the_cap() {
    let server = Server::start(|_, _| Reply::Endless).await;
    let s = session(test_access());
    let out = fetch(&s, json!({"url": server.url("/"), "max_length": 10})).await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert!(
        out.content.contains(
            "text, 5242880 characters (the body was longer than 5 MiB; only that much was read)"
        ),
        "{}",
        out.content
    );
    assert!(out.content.ends_with("\n\naaaaaaaaaa"), "{}", out.content);
}

#[tokio::test]
async fn a_gzip_bomb_is_decoded_only_up_to_the_cap() {
    // 64 MiB of text compressed to about 64 KiB.
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let block = vec![b'z'; 1024 * 1024];
    for _ in 0..64 {
        encoder.write_all(&block).unwrap();
    }
    let bomb = encoder.finish().unwrap();
    assert!(bomb.len() < 1024 * 1024);
    let server = Server::start(move |_, _| Reply::Page {
        status: 200,
        headers: vec![
            ("Content-Type", "text/plain".to_owned()),
            ("Content-Encoding", "gzip".to_owned()),
        ],
        body: bomb.clone(),
    })
    .await;
    let s = session(test_access());
    let out = fetch(&s, json!({"url": server.url("/"), "max_length": 5})).await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert!(
        out.content
            .contains("5242880 characters (the body was longer than 5 MiB"),
        "{}",
        out.content
    );
    assert!(out.content.ends_with("\n\nzzzzz"), "{}", out.content);
}

#[tokio::test]
async fn a_slow_server_hits_timeout_ms() {
    let server = Server::start(|_, _| Reply::Slow(Duration::from_secs(20))).await;
    let s = session(test_access());
    let started = Instant::now();
    let out = fetch(&s, json!({"url": server.url("/"), "timeout_ms": 300})).await;
    assert_eq!(out.status, CallStatus::TimedOut, "{}", out.content);
    assert!(
        out.content.contains("did not finish within"),
        "{}",
        out.content
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_name_answering_with_a_refused_address_among_others_is_refused_whole() {
    let server = Server::start(|_, _| page("text/plain", "never")).await;
    // Public and loopback, under the default policy.
    let default = session(WebAccess {
        policy: NetPolicy::public_only(),
        ..test_access()
    });
    let out = fetch(
        &default,
        json!({"url": format!("http://mixed.test:{}/", server.port)}),
    )
    .await;
    assert_eq!(out.status, CallStatus::Denied, "{}", out.content);
    assert!(!out.content.contains("127.0.0.1"), "{}", out.content);
    // The allow-listed loopback address and a private one: the private one refuses the lot.
    let allowed = session(test_access());
    let out = fetch(
        &allowed,
        json!({"url": format!("http://mixed-private.test:{}/", server.port)}),
    )
    .await;
    assert_eq!(out.status, CallStatus::Denied, "{}", out.content);
    assert!(!out.content.contains("10.0.0.9"), "{}", out.content);
    assert_eq!(server.hits(), 0, "nothing was dialled");
}

#[tokio::test]
async fn the_default_policy_refuses_the_loopback_server() {
    let server = Server::start(|_, _| page("text/plain", "secret")).await;
    let s = session(WebAccess::default());
    for url in [
        format!("http://127.0.0.1:{}/", server.port),
        format!("http://localhost:{}/", server.port),
        format!("http://2130706433:{}/", server.port),
        format!("http://[::ffff:127.0.0.1]:{}/", server.port),
    ] {
        let out = fetch(&s, json!({"url": url})).await;
        assert_eq!(out.status, CallStatus::Denied, "{url}: {}", out.content);
        assert!(!out.content.contains("secret"));
    }
    // The same server is reachable through the test's allow-list.
    let allowed = session(test_access());
    let out = fetch(
        &allowed,
        json!({"url": format!("http://127.0.0.1:{}/", server.port)}),
    )
    .await;
    assert!(out.content.ends_with("secret"), "{}", out.content);
    assert_eq!(server.hits(), 1, "only the allow-listed fetch connected");
}

#[tokio::test]
async fn without_network_access_the_fetch_is_refused_unless_the_operator_allows_it() {
    let server = Server::start(|_, _| page("text/plain", "hello")).await;
    let mut s = session(test_access());
    s.ctx.policy.network = NetworkPolicy::None;
    let out = fetch(&s, json!({"url": server.url("/")})).await;
    assert_eq!(out.status, CallStatus::Denied, "{}", out.content);
    assert!(out.content.contains("was not granted"), "{}", out.content);
    assert_eq!(server.hits(), 0);
    s.ctx.web = Arc::new(WebAccess {
        public_when_network_none: true,
        ..test_access()
    });
    let out = fetch(&s, json!({"url": server.url("/")})).await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
}

#[tokio::test]
async fn a_prompt_needs_a_configured_summarizer() {
    let server = Server::start(|_, _| page("text/plain", "hello")).await;
    let s = session(test_access());
    let out = fetch(&s, json!({"url": server.url("/"), "prompt": "What is it?"})).await;
    assert_eq!(out.status, CallStatus::Error, "{}", out.content);
    assert!(
        out.content.contains("no summarizer model configured"),
        "{}",
        out.content
    );
    assert_eq!(server.hits(), 0, "nothing was fetched");
}

#[tokio::test]
async fn a_prompt_is_answered_by_the_summarizer_from_the_page() {
    let site = Server::start(|_, _| {
        page(
            "text/html",
            "<h1>Pricing</h1><p>The plan costs 7 euros a month.</p>",
        )
    })
    .await;
    let llm = Server::start(|path, _| {
        assert_eq!(path, "/v1/chat/completions");
        page(
            "application/json",
            json!({"choices": [{"message": {"role": "assistant", "content": "It costs 7 euros a month."}}]})
                .to_string(),
        )
    })
    .await;
    let s = session(WebAccess {
        // The summarizer is on loopback and not allow-listed: operator endpoints are not
        // subject to the network policy.
        policy: NetPolicy::new(&["127.0.0.1/32"]).unwrap(),
        summarizer: Some(Summarizer {
            base_url: format!("http://127.0.0.1:{}/v1", llm.port),
            model: "test-model".to_owned(),
            api_key: Some("sk-test-key".to_owned()),
        }),
        ..test_access()
    });
    let out = fetch(
        &s,
        json!({"url": site.url("/pricing"), "prompt": "How much is it?"}),
    )
    .await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert!(
        out.content.ends_with("It costs 7 euros a month."),
        "{}",
        out.content
    );
    assert!(!out.content.contains("sk-test-key"));
    let requests = llm.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert!(
        request.contains("authorization: Bearer sk-test-key")
            || request.contains("Authorization: Bearer sk-test-key"),
        "{request}"
    );
    let body: Value = serde_json::from_str(request.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(body["model"], "test-model");
    let user = body["messages"][1]["content"].as_str().unwrap();
    assert!(user.contains("The plan costs 7 euros a month."), "{user}");
    assert!(user.contains("Question: How much is it?"), "{user}");
}

#[tokio::test]
async fn a_failing_summarizer_is_reported_without_its_key() {
    let site = Server::start(|_, _| page("text/plain", "text")).await;
    let llm = Server::start(|_, _| Reply::Page {
        status: 401,
        headers: vec![("Content-Type", "application/json".to_owned())],
        body: json!({"error": {"message": "bad key"}})
            .to_string()
            .into_bytes(),
    })
    .await;
    let s = session(WebAccess {
        summarizer: Some(Summarizer {
            base_url: format!("http://127.0.0.1:{}/v1", llm.port),
            model: "m".to_owned(),
            api_key: Some("sk-secret".to_owned()),
        }),
        ..test_access()
    });
    let out = fetch(&s, json!({"url": site.url("/"), "prompt": "?"})).await;
    assert_eq!(out.status, CallStatus::Error, "{}", out.content);
    assert!(
        out.content
            .contains("HTTP 401 (the operator's key was refused)"),
        "{}",
        out.content
    );
    assert!(
        !out.content.contains("bad key"),
        "the provider's own text stays out: {}",
        out.content
    );
    assert!(!out.content.contains("sk-secret"));
}

#[tokio::test]
async fn https_goes_through_tls_and_a_failed_handshake_is_an_error_not_a_crash() {
    // A server that answers a TLS ClientHello in plain HTTP: the handshake fails, and says so.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hello = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut first = [0u8; 1];
        stream.read_exact(&mut first).await.unwrap();
        stream
            .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 5\r\n\r\nplain")
            .await
            .unwrap();
        // 0x16: a TLS handshake record.
        first[0]
    });
    let s = session(test_access());
    let out = fetch(
        &s,
        json!({"url": format!("https://web.test:{port}/"), "timeout_ms": 5000}),
    )
    .await;
    assert_eq!(out.status, CallStatus::Error, "{}", out.content);
    assert!(out.content.contains("Cannot fetch"), "{}", out.content);
    assert!(!out.content.contains("plain"), "{}", out.content);
    assert_eq!(hello.await.unwrap(), 0x16, "the client spoke TLS");
    // What went wrong, not only where.
    assert!(
        out.content
            .contains("could not connect to the server (received corrupt message"),
        "{}",
        out.content
    );
}

#[tokio::test]
async fn a_closed_port_is_an_error_that_says_the_connection_was_refused() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().port()
    };
    let s = session(test_access());
    let out = fetch(&s, json!({"url": format!("http://web.test:{port}/")})).await;
    assert_eq!(out.status, CallStatus::Error, "{}", out.content);
    assert!(
        out.content.contains("Connection refused"),
        "{}",
        out.content
    );
}

/// Destinations that must stay refused with only 127.0.0.1 allow-listed, each given directly and
/// as a redirect target.
const HOSTILE: &[&str] = &[
    "http://127.0.0.2/",
    "http://2130706434/",
    "http://0x7f000002/",
    "http://0x7f.2/",
    "http://017700000002/",
    "http://127.2/",
    "http://127.0.0.2./",
    "http://%31%32%37%2e%30%2e%30%2e%32/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.2]/",
    "http://[::ffff:7f00:2]/",
    "http://[64:ff9b::7f00:1]/",
    "http://[2002:7f00:1::]/",
    "http://[::127.0.0.1]/",
    "http://0.0.0.0/",
    "http://0/",
    "http://[::]/",
    "http://localhost/",
    "http://api.localhost/",
    "http://LOCALHOST./",
    "http://10.0.0.1/",
    "http://172.16.0.1/",
    "http://192.168.1.1/",
    "http://100.64.0.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://169.254.170.2/v2/credentials",
    "http://[fd00:ec2::254]/",
    "http://100.100.100.200/",
    "http://[fe80::1]/",
    "http://[fc00::1]/",
    "http://224.0.0.1/",
    "http://255.255.255.255/",
    "http://192.0.2.1/",
    "http://198.18.0.1/",
    "http://internal.test/",
    // (mixed.test, public plus the allow-listed 127.0.0.1, is permitted here: the default
    // policy's refusal of it is its own test.)
    "http://mixed-private.test/",
    "http://user:pw@example.com/",
    "file:///etc/passwd",
    "gopher://example.com/",
    "ftp://example.com/",
    "http://example.com:0/",
];

#[tokio::test]
async fn the_ssrf_catalogue_is_refused_directly_and_through_redirects() {
    let server = Server::start(|path, _| {
        let n: usize = path.trim_start_matches("/to/").parse().unwrap();
        redirect(HOSTILE[n])
    })
    .await;
    let s = session(test_access());
    for (n, url) in HOSTILE.iter().enumerate() {
        let direct = fetch(&s, json!({"url": url})).await;
        assert_eq!(
            direct.status,
            CallStatus::Denied,
            "{url}: {}",
            direct.content
        );
        let via = fetch(&s, json!({"url": server.url(&format!("/to/{n}"))})).await;
        assert_eq!(
            via.status,
            CallStatus::Denied,
            "via redirect to {url}: {}",
            via.content
        );
    }
    assert_eq!(
        server.hits(),
        HOSTILE.len(),
        "only the redirecting pages were reached"
    );
}

/// Pages shaped to break a converter — nested far deeper than its recursion can go, or a run
/// of sibling elements it would take minutes over — come back at once as plain text, and the
/// service is still there to answer the next call.
#[tokio::test]
async fn hostile_page_shapes_come_back_as_plain_text_at_once() {
    let deep = format!(
        "<html><head><script>var x = 1;</script></head><body>{}deep text{}</body></html>",
        "<div>".repeat(50_000),
        "</div>".repeat(50_000)
    );
    let wide = format!("<html><body>{}</body></html>", "<b>a</b> ".repeat(300_000));
    let server = Server::start(move |path, _| match path {
        "/deep" => page("text/html", deep.clone()),
        "/wide" => page("text/html", wide.clone()),
        _ => page("text/html", "<p>fine &amp; <em>well</em></p>"),
    })
    .await;
    let s = session(test_access());
    for path in ["/deep", "/wide"] {
        let out = fetch(&s, json!({"url": server.url(path), "max_length": 2000})).await;
        assert_eq!(out.status, CallStatus::Ok, "{path}: {}", out.content);
        assert!(
            out.content
                .contains("HTML shown as plain text (too large or too deeply nested"),
            "{path}: {}",
            out.content
        );
        assert!(
            !out.content.contains("<div>") && !out.content.contains("<b>"),
            "{path}"
        );
        assert!(!out.content.contains("var x"), "{path}: {}", out.content);
    }
    let out = fetch(&s, json!({"url": server.url("/deep")})).await;
    assert!(out.content.contains("deep text"), "{}", out.content);
    let out = fetch(&s, json!({"url": server.url("/ok")})).await;
    assert!(
        out.content.contains("HTML converted to Markdown"),
        "{}",
        out.content
    );
    assert!(
        out.content.contains("fine & *well*") || out.content.contains("fine & _well_"),
        "{}",
        out.content
    );
}

/// The `Recorded` a replay of `out`'s call is served from: its `web.exchange` events and the
/// bodies they carry, as the store gives them back.
fn record_of(out: &toolexec_tools::ToolOutput) -> toolexec_tools::observe::Recorded {
    let blobs = out
        .events
        .iter()
        .filter_map(|e| e.blob.clone())
        .map(|b| (toolexec_core::sha256_hex(&b), b))
        .collect();
    toolexec_tools::observe::Recorded::new(
        uuid::Uuid::from_u128(42),
        out.events
            .iter()
            .filter(|e| e.kind == toolexec_core::EventKind::WebExchange)
            .map(|e| e.data.clone()),
        &blobs,
    )
}

/// Runs `args` live and then as a replay served from its record: both results, and the
/// server's requests during the replay (which must be none).
async fn live_then_replayed(
    s: &mut Session,
    server: &Server,
    args: Value,
) -> (toolexec_tools::ToolOutput, toolexec_tools::ToolOutput) {
    s.ctx.observed = toolexec_tools::observe::Observed::Live;
    let live = fetch(s, args.clone()).await;
    let before = server.hits();
    s.ctx.observed = toolexec_tools::observe::Observed::Replay(Arc::new(record_of(&live)));
    let replayed = fetch(s, args).await;
    assert_eq!(server.hits(), before, "the replay made a request");
    (live, replayed)
}

#[tokio::test]
async fn every_outcome_of_a_fetch_is_recorded_and_replayed_from_the_record_alone() {
    let server = Server::start(|path, port| match path {
        "/page" => page(
            "text/html; charset=iso-8859-1",
            b"<h1>Caf\xe9</h1><p>Open daily.</p>".to_vec(),
        ),
        "/moved" => redirect("/page"),
        "/missing" => Reply::Page {
            status: 404,
            headers: vec![("Content-Type", "text/plain".to_owned())],
            body: b"no such page".to_vec(),
        },
        "/to-internal" => redirect(&format!("http://internal.test:{port}/")),
        "/loop" => redirect("/loop"),
        "/slow" => Reply::Slow(Duration::from_secs(5)),
        "/endless" => Reply::Endless,
        "/long" => page("text/plain", "0123456789".repeat(30)),
        "/image" => page("image/png", vec![0u8; 300]),
        _ => page("text/plain", "other"),
    })
    .await;
    let mut s = session(test_access());
    let cases = [
        (json!({"url": server.url("/page")}), CallStatus::Ok, "Café"),
        (
            json!({"url": server.url("/moved")}),
            CallStatus::Ok,
            "(after 1 redirect)",
        ),
        (
            json!({"url": server.url("/missing")}),
            CallStatus::Error,
            "no such page",
        ),
        (
            json!({"url": server.url("/to-internal")}),
            CallStatus::Denied,
            "not reachable from here",
        ),
        (
            json!({"url": server.url("/loop")}),
            CallStatus::Error,
            "more than 5 times",
        ),
        (
            json!({"url": server.url("/slow"), "timeout_ms": 300}),
            CallStatus::TimedOut,
            "did not finish within",
        ),
        (
            json!({"url": server.url("/endless"), "max_length": 50}),
            CallStatus::Ok,
            "only that much was read",
        ),
        (
            json!({"url": server.url("/long"), "start_index": 100, "max_length": 50}),
            CallStatus::Ok,
            "start_index: 150",
        ),
        (
            json!({"url": server.url("/image")}),
            CallStatus::Error,
            "image/png, 300 bytes",
        ),
        (
            json!({"url": "http://web.test:1/closed"}),
            CallStatus::Error,
            "Connection refused",
        ),
        (
            json!({"url": "http://nowhere.test/"}),
            CallStatus::Error,
            "could not be resolved",
        ),
    ];
    for (args, status, says) in cases {
        let (live, replayed) = live_then_replayed(&mut s, &server, args.clone()).await;
        assert_eq!(live.status, status, "{args}: {}", live.content);
        assert!(live.content.contains(says), "{args}: {}", live.content);
        assert!(
            live.events
                .iter()
                .any(|e| e.kind == toolexec_core::EventKind::WebExchange),
            "{args}: nothing recorded"
        );
        assert_eq!(replayed.status, live.status, "{args}");
        assert_eq!(replayed.content, live.content, "{args}");
        // The replay records what it was served, each exchange naming its source.
        assert_eq!(replayed.events.len(), live.events.len(), "{args}");
        for (r, l) in replayed.events.iter().zip(&live.events) {
            assert_eq!(
                r.data["served_from"],
                json!(uuid::Uuid::from_u128(42)),
                "{args}"
            );
            assert_eq!(r.data["status"], l.data["status"], "{args}");
            assert_eq!(r.data["body_sha256"], l.data["body_sha256"], "{args}");
            assert_eq!(r.data["error"], l.data["error"], "{args}");
        }
    }
    // The redirect into a private range: the redirect is an exchange, the refusal another,
    // which does not name the address.
    s.ctx.observed = toolexec_tools::observe::Observed::Live;
    let live = fetch(&s, json!({"url": server.url("/to-internal")})).await;
    let data: Vec<&Value> = live.events.iter().map(|e| &e.data).collect();
    assert_eq!(data.len(), 2, "{data:?}");
    assert_eq!(data[0]["status"], 302);
    assert_eq!(data[1]["error"]["kind"], "refused");
    assert!(
        !data[1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("10.0.0.5")
    );
}

#[tokio::test]
async fn a_replay_never_goes_to_the_network_for_a_call_it_has_no_record_of() {
    let server = Server::start(|_, _| page("text/plain", "live text")).await;
    let mut s = session(test_access());
    s.ctx.observed = toolexec_tools::observe::Observed::Replay(Arc::new(
        toolexec_tools::observe::Recorded::default(),
    ));
    let out = fetch(&s, json!({"url": server.url("/")})).await;
    assert_eq!(out.status, CallStatus::Error, "{}", out.content);
    assert!(
        out.content.contains("never goes to the network"),
        "{}",
        out.content
    );
    assert_eq!(server.hits(), 0);
    // The URL layer still answers first, as it did live.
    let out = fetch(&s, json!({"url": "http://169.254.169.254/latest"})).await;
    assert_eq!(out.status, CallStatus::Denied, "{}", out.content);
}

#[tokio::test]
async fn a_summary_is_replayed_from_the_record_even_without_a_summarizer() {
    let site = Server::start(|_, _| page("text/html", "<p>Closed on Mondays.</p>")).await;
    let llm = Server::start(|_, _| {
        page(
            "application/json",
            json!({"choices": [{"message": {"content": "Mondays."}}]}).to_string(),
        )
    })
    .await;
    let mut s = session(WebAccess {
        summarizer: Some(Summarizer {
            base_url: format!("http://127.0.0.1:{}/v1", llm.port),
            model: "m".to_owned(),
            api_key: Some("sk-secret".to_owned()),
        }),
        ..test_access()
    });
    let args = json!({"url": site.url("/"), "prompt": "When is it closed?"});
    let live = fetch(&s, args.clone()).await;
    assert_eq!(live.status, CallStatus::Ok, "{}", live.content);
    assert!(live.content.ends_with("Mondays."), "{}", live.content);
    // The summarizer is gone: the replay still has its answer, and asks nobody.
    s.ctx.web = Arc::new(test_access());
    s.ctx.observed = toolexec_tools::observe::Observed::Replay(Arc::new(record_of(&live)));
    let replayed = fetch(&s, args).await;
    assert_eq!(replayed.content, live.content);
    assert_eq!(llm.hits(), 1);
    assert_eq!(site.hits(), 1);
    // No record holds the key or the operator's endpoint.
    for e in &live.events {
        let text = e.data.to_string();
        assert!(
            !text.contains("sk-secret") && !text.contains(&llm.port.to_string()),
            "{text}"
        );
    }
}
