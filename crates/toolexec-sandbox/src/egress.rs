//! Network egress for sessions whose policy allows it: the sandbox keeps its empty network
//! namespace, and its only way out is an HTTP proxy the service runs for the session, reached
//! through a UNIX socket bound into the sandbox (pid 1 relays `127.0.0.1:3128` inside to it;
//! `HTTP_PROXY`/`HTTPS_PROXY` point there). The proxy resolves every destination itself and
//! refuses any address that is not public — loopback (the service's own Postgres), private,
//! link-local and cloud metadata, CGNAT, multicast, reserved, IPv4-mapped and NAT64 forms of them
//! — unless the operator allow-lists it (`sandbox.egress_allow_cidrs`). What is public, and the
//! checked dial, are `toolexec-net`'s: this module only speaks the proxy protocol.
//!
//! Supported: `CONNECT host:port` (HTTPS and any TLS) and absolute-form plain HTTP requests.
//! Programs that ignore the proxy variables get no network at all.
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
pub use toolexec_net::{Cidr, NetPolicy};
use toolexec_net::{ConnectError, Refusal, SystemResolver, connect_checked};

/// Where the relay listens inside the sandbox, and where the proxy socket is bound there (the
/// init sets both up).
pub use toolexec_sandbox_init::{PROXY_PORT, SOCKET_IN_SANDBOX};

const MAX_HEAD: usize = 16 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections one session's proxy serves at once.
const MAX_CONNECTIONS: usize = 64;

/// The proxy's policy is the service's one network policy (shared with the web tools).
pub type EgressPolicy = NetPolicy;

/// Records of connections kept for the session's next `shell` call to record.
const MAX_RECORDS: usize = 1000;

/// Longest host name kept in a record.
const MAX_HOST_CHARS: usize = 255;

/// One connection a command made through the proxy, as the log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRecord {
    /// `CONNECT`, or the method of a plain HTTP request (as sent, cut to 16 characters).
    pub method: String,
    /// The host asked for, as the command spelled it (control characters replaced).
    pub host: String,
    pub port: u16,
    /// Whether the proxy connected it.
    pub allowed: bool,
    /// Why not, in the words the command was told (never the address or its class):
    /// `not_reachable` (refused by the network policy), `bad_request`, `unresolvable`,
    /// `connect_failed`.
    pub refused: Option<&'static str>,
    /// Bytes relayed from the command to the destination, and back.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub duration_ms: u64,
}

/// The connections of one session's proxy that ended and are not recorded yet: at most
/// `MAX_RECORDS`, then counted only.
#[derive(Debug, Default)]
pub struct EgressLog {
    inner: std::sync::Mutex<(std::collections::VecDeque<EgressRecord>, u64)>,
}

impl EgressLog {
    fn push(&self, record: EgressRecord) {
        if let Ok(mut inner) = self.inner.lock() {
            if inner.0.len() < MAX_RECORDS {
                inner.0.push_back(record);
            } else {
                inner.1 += 1;
            }
        }
    }

    /// The records kept so far, and how many more connections ended beyond the cap.
    pub fn drain(&self) -> (Vec<EgressRecord>, u64) {
        match self.inner.lock() {
            Ok(mut inner) => {
                let records = inner.0.drain(..).collect();
                (records, std::mem::take(&mut inner.1))
            }
            Err(_) => (Vec::new(), 0),
        }
    }
}

/// A name from a request, fit for the log: anything but printable ASCII (a NUL, a
/// right-to-left override, a zero-width space) replaced, cut short. Host names on the wire are
/// ASCII (IDNs travel as punycode), so nothing legitimate is lost.
fn shown(text: &str, max: usize) -> String {
    text.chars()
        .take(max)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect()
}

/// Serves one session's proxy until the listener is dropped (its task aborted).
pub async fn serve(listener: UnixListener, policy: Arc<EgressPolicy>, log: Arc<EgressLog>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            let mut stream = stream;
            let _ = stream
                .write_all(&reply(503, "too many connections from this session"))
                .await;
            continue;
        };
        let policy = policy.clone();
        let log = log.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let started = std::time::Instant::now();
            let mut record = None;
            if let Err(e) = handle(stream, &policy, &mut record).await {
                tracing::debug!(error = %e, "egress connection ended");
            }
            if let Some(mut r) = record {
                r.duration_ms = started.elapsed().as_millis() as u64;
                log.push(r);
            }
        });
    }
}

fn reply(code: u16, reason: &str) -> Vec<u8> {
    let status = match code {
        403 => "Forbidden",
        400 => "Bad Request",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let body = format!("toolexec egress proxy: {reason}\n");
    format!(
        "HTTP/1.1 {code} {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

async fn read_head(stream: &mut UnixStream) -> Result<(Vec<u8>, usize), String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok((buf, end + 4));
        }
        if buf.len() > MAX_HEAD {
            return Err("request head too large".into());
        }
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading the request: {e}"))?;
        if n == 0 {
            return Err("connection closed before a request".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// `host:port` → the host (brackets removed) and the port.
fn split_host_port(authority: &str, default_port: u16) -> Option<(String, u16)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        return Some((host.to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Some((h.to_owned(), p.parse().ok()?)),
        Some(_) => None,
        None => Some((authority.to_owned(), default_port)),
    }
}

/// Resolves and checks every address; the connection goes to a checked one (never a second
/// lookup that could answer differently). The client is told why in words that never name the
/// address; the log gets the category and the address.
async fn dial(host: &str, port: u16, policy: &NetPolicy) -> Result<TcpStream, (u16, String)> {
    match connect_checked(policy, &SystemResolver, host, port, CONNECT_TIMEOUT).await {
        Ok(stream) => Ok(stream),
        Err(ConnectError::Refused(refusal)) => {
            tracing::info!(
                host,
                port,
                reason = refusal.reason(),
                address = ?refusal.address(),
                "egress refused"
            );
            let code = match refusal {
                Refusal::InvalidHost | Refusal::NoHost | Refusal::Port => 400,
                Refusal::NoAddress => 502,
                _ => 403,
            };
            Err((code, format!("{host}: {refusal}")))
        }
        Err(e) => Err((502, format!("{host}: {e}"))),
    }
}

/// The record's word for a refusal the client was told with `code`.
fn refused_as(code: u16, why: &str) -> &'static str {
    match code {
        403 => "not_reachable",
        400 => "bad_request",
        _ if why.contains("resolve") || why.contains("no address") => "unresolvable",
        _ => "connect_failed",
    }
}

/// Serves one connection; `record` says what it was once a request arrived (a connection that
/// never sends one is not recorded).
async fn handle(
    mut client: UnixStream,
    policy: &EgressPolicy,
    record: &mut Option<EgressRecord>,
) -> Result<(), String> {
    let (head, end) = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut client))
        .await
        .map_err(|_| "no request within 30 s".to_owned())??;
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let first = text.lines().next().unwrap_or_default().to_owned();
    let mut parts = first.split_whitespace();
    let (method, target, version) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("HTTP/1.1"),
    );
    let rec = record.insert(EgressRecord {
        method: shown(method, 16),
        host: String::new(),
        port: 0,
        allowed: false,
        refused: Some("bad_request"),
        bytes_sent: 0,
        bytes_received: 0,
        duration_ms: 0,
    });
    if method.eq_ignore_ascii_case("CONNECT") {
        let Some((host, port)) = split_host_port(target, 443) else {
            rec.host = shown(target, MAX_HOST_CHARS);
            let _ = client
                .write_all(&reply(400, "CONNECT needs host:port"))
                .await;
            return Ok(());
        };
        (rec.host, rec.port) = (shown(&host, MAX_HOST_CHARS), port);
        let mut upstream = match dial(&host, port, policy).await {
            Ok(s) => s,
            Err((code, why)) => {
                rec.refused = Some(refused_as(code, &why));
                let _ = client.write_all(&reply(code, &why)).await;
                return Ok(());
            }
        };
        (rec.allowed, rec.refused) = (true, None);
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        // Bytes the client sent after the head belong to the tunnel.
        upstream
            .write_all(&head[end..])
            .await
            .map_err(|e| e.to_string())?;
        rec.bytes_sent = (head.len() - end) as u64;
        relay(&mut client, &mut upstream, rec).await;
        return Ok(());
    }
    // Plain HTTP in absolute form: http://host[:port]/path
    let Some(rest) = target
        .strip_prefix("http://")
        .or_else(|| target.strip_prefix("HTTP://"))
    else {
        let _ = client
            .write_all(&reply(
                400,
                "only CONNECT and absolute http:// requests are proxied (use https:// through CONNECT)",
            ))
            .await;
        return Ok(());
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let Some((host, port)) = split_host_port(authority, 80) else {
        rec.host = shown(authority, MAX_HOST_CHARS);
        let _ = client
            .write_all(&reply(400, "bad host in the request"))
            .await;
        return Ok(());
    };
    (rec.host, rec.port) = (shown(&host, MAX_HOST_CHARS), port);
    let mut upstream = match dial(&host, port, policy).await {
        Ok(s) => s,
        Err((code, why)) => {
            rec.refused = Some(refused_as(code, &why));
            let _ = client.write_all(&reply(code, &why)).await;
            return Ok(());
        }
    };
    (rec.allowed, rec.refused) = (true, None);
    let mut out = format!("{method} {path} {version}\r\n").into_bytes();
    for line in text.lines().skip(1) {
        let lower = line.to_ascii_lowercase();
        if line.is_empty() || lower.starts_with("proxy-") {
            continue;
        }
        out.extend_from_slice(line.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&head[end..]);
    upstream.write_all(&out).await.map_err(|e| e.to_string())?;
    rec.bytes_sent = out.len() as u64;
    relay(&mut client, &mut upstream, rec).await;
    Ok(())
}

/// Relays both ways until both sides are done or one fails, counting into `rec` every byte
/// that got through — also when the relay ends with an error (a reset, a broken pipe), which
/// `copy_bidirectional` would have reported without its counts.
async fn relay(client: &mut UnixStream, upstream: &mut TcpStream, rec: &mut EgressRecord) {
    let (mut from_client, mut to_client) = client.split();
    let (mut from_upstream, mut to_upstream) = upstream.split();
    let (mut sent, mut received) = (0u64, 0u64);
    let _ = tokio::try_join!(
        pump(&mut from_client, &mut to_upstream, &mut sent),
        pump(&mut from_upstream, &mut to_client, &mut received),
    );
    rec.bytes_sent += sent;
    rec.bytes_received += received;
}

/// Copies `from` to `to` until `from` ends (then shuts `to` down for writing), adding to
/// `count` each chunk once it is written.
async fn pump(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    to: &mut (impl tokio::io::AsyncWrite + Unpin),
    count: &mut u64,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
        *count += n as u64;
    }
}

/// Whether the default policy (no allow-list) refuses `ip`.
pub fn is_denied_by_default(ip: IpAddr) -> bool {
    !NetPolicy::public_only().permits(ip)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};
    use tokio::net::TcpListener;

    // The classifier and its range-by-range tests live in toolexec-net; these check that the
    // proxy's names are that policy and that its dial answers the client as documented.

    #[test]
    fn the_proxy_policy_is_the_shared_network_policy() {
        for ip in [
            "127.0.0.1",
            "169.254.169.254",
            "::ffff:127.0.0.1",
            "64:ff9b::7f00:1",
        ] {
            assert!(is_denied_by_default(ip.parse().unwrap()), "{ip}");
        }
        assert!(!is_denied_by_default("1.1.1.1".parse().unwrap()));
        let p = EgressPolicy::new(&[String::from("127.0.0.1/32")]).unwrap();
        assert!(p.permits(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert!(!p.permits(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert!(EgressPolicy::new(&[String::from("10.0.0.0/33")]).is_err());
        assert_eq!(Cidr::parse("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
    }

    #[tokio::test]
    async fn a_refused_destination_is_a_403_that_does_not_name_the_address() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let policy = NetPolicy::public_only();
        for host in [
            "127.0.0.1",
            "0x7f000001",
            "::ffff:127.0.0.1",
            "localhost",
            "169.254.169.254",
        ] {
            let (code, why) = dial(host, port, &policy).await.unwrap_err();
            assert_eq!(code, 403, "{host}: {why}");
            assert!(
                !why.contains("127.0.0.1") || host.contains("127.0.0.1"),
                "{why}"
            );
            assert!(
                !why.contains("loopback") && !why.contains("metadata"),
                "{why}"
            );
        }
        let (code, _) = dial("", port, &policy).await.unwrap_err();
        assert_eq!(code, 400);
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        assert!(accepted.is_err(), "a refused dial connected");
    }

    #[tokio::test]
    async fn a_relay_cut_by_a_reset_still_counts_what_got_through() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = [0u8; 5];
            s.read_exact(&mut got).await.unwrap();
            s.write_all(&[b'x'; 3000]).await.unwrap();
            s.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            // A reset, not a close: the relay ends with an error.
            s.set_zero_linger().unwrap();
            drop(s);
        });
        let mut upstream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let (mut client, mut command) = UnixStream::pair().unwrap();
        command.write_all(b"hello").await.unwrap();
        let reader = tokio::spawn(async move {
            let mut all = Vec::new();
            let _ = command.read_to_end(&mut all).await;
            all.len()
        });
        let mut rec = EgressRecord {
            method: "CONNECT".into(),
            host: "127.0.0.1".into(),
            port,
            allowed: true,
            refused: None,
            bytes_sent: 0,
            bytes_received: 0,
            duration_ms: 0,
        };
        relay(&mut client, &mut upstream, &mut rec).await;
        drop(client);
        server.await.unwrap();
        assert_eq!(rec.bytes_sent, 5);
        assert_eq!(rec.bytes_received, 3000);
        assert_eq!(reader.await.unwrap(), 3000);
    }

    #[tokio::test]
    async fn an_allow_listed_destination_is_dialled() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let policy = NetPolicy::new(&["127.0.0.1/32"]).unwrap();
        let stream = dial("127.0.0.1", port, &policy).await.unwrap();
        assert_eq!(stream.peer_addr().unwrap().port(), port);
        listener.accept().await.unwrap();
    }

    #[test]
    fn the_log_keeps_a_bounded_number_of_records_and_counts_the_rest() {
        let log = EgressLog::default();
        let record = |n: u16| EgressRecord {
            method: "CONNECT".into(),
            host: shown("exa\0mple\u{202e}.com", MAX_HOST_CHARS),
            port: n,
            allowed: true,
            refused: None,
            bytes_sent: 1,
            bytes_received: 2,
            duration_ms: 3,
        };
        for n in 0..(MAX_RECORDS as u16 + 5) {
            log.push(record(n));
        }
        let (records, more) = log.drain();
        assert_eq!((records.len(), more), (MAX_RECORDS, 5));
        assert_eq!(records[0].host, "exa?mple?.com");
        assert_eq!(records.last().unwrap().port, MAX_RECORDS as u16 - 1);
        assert_eq!(log.drain(), (Vec::new(), 0));
        assert_eq!(
            shown(&"h".repeat(300), MAX_HOST_CHARS).len(),
            MAX_HOST_CHARS
        );
    }

    #[test]
    fn authorities_split_into_host_and_port() {
        assert_eq!(
            split_host_port("example.com:8080", 80),
            Some(("example.com".into(), 8080))
        );
        assert_eq!(
            split_host_port("example.com", 80),
            Some(("example.com".into(), 80))
        );
        assert_eq!(split_host_port("[::1]:443", 80), Some(("::1".into(), 443)));
        assert_eq!(split_host_port("[::1]", 80), Some(("::1".into(), 80)));
        assert_eq!(split_host_port("::1:443", 80), None);
    }
}
