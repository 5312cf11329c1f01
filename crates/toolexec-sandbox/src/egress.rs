//! Network egress for sessions whose policy allows it: the sandbox keeps its empty network
//! namespace, and its only way out is an HTTP proxy the service runs for the session, reached
//! through a UNIX socket bound into the sandbox (pid 1 relays `127.0.0.1:3128` inside to it;
//! `HTTP_PROXY`/`HTTPS_PROXY` point there). The proxy resolves every destination itself and
//! refuses any address that is not public — loopback (the service's own Postgres), private,
//! link-local and cloud metadata, CGNAT, multicast, reserved, IPv4-mapped and NAT64 forms of them
//! — unless the operator allow-lists it (`sandbox.egress_allow_cidrs`).
//!
//! Supported: `CONNECT host:port` (HTTPS and any TLS) and absolute-form plain HTTP requests.
//! Programs that ignore the proxy variables get no network at all.
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};

/// Where the relay listens inside the sandbox, and where the proxy socket is bound there (the
/// init sets both up).
pub use toolexec_sandbox_init::{PROXY_PORT, SOCKET_IN_SANDBOX};

const MAX_HEAD: usize = 16 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections one session's proxy serves at once.
const MAX_CONNECTIONS: usize = 64;

/// A network in CIDR form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// `10.0.0.0/8`, `fd00::/8`, or a bare address (a /32 or /128).
    pub fn parse(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("'{s}' is not an IP address or CIDR"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("'{s}': prefix must be 0 to {max}"))?,
            None => max,
        };
        Ok(Self { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// IPv4-mapped and IPv4-compatible IPv6 addresses as the IPv4 address they carry.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Special-purpose ranges (IANA registries) no sandbox may reach unless allow-listed.
const DENIED: [&str; 30] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "::/96",
    "::ffff:0:0:0/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "2001::/23",
    "2001:db8::/32",
    "2002::/16",
    "3fff::/20",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
];

/// Who a session's commands may reach through the proxy.
#[derive(Debug, Clone, Default)]
pub struct EgressPolicy {
    allow: Vec<Cidr>,
    deny: Vec<Cidr>,
}

impl EgressPolicy {
    /// Public addresses, plus the operator's allow-list.
    pub fn new(allow: &[String]) -> Result<Self, String> {
        Ok(Self {
            allow: allow
                .iter()
                .map(|s| Cidr::parse(s))
                .collect::<Result<_, _>>()?,
            deny: DENIED.iter().filter_map(|s| Cidr::parse(s).ok()).collect(),
        })
    }

    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        if self.allow.iter().any(|c| c.contains(ip)) {
            return true;
        }
        !self.deny.iter().any(|c| c.contains(ip))
    }
}

/// Serves one session's proxy until the listener is dropped (its task aborted).
pub async fn serve(listener: UnixListener, policy: Arc<EgressPolicy>) {
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
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = handle(stream, &policy).await {
                tracing::debug!(error = %e, "egress connection ended");
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
/// lookup that could answer differently).
async fn dial(host: &str, port: u16, policy: &EgressPolicy) -> Result<TcpStream, (u16, String)> {
    if host.is_empty() || host.len() > 253 {
        return Err((400, "no valid host".into()));
    }
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| (502, format!("resolving {host} timed out")))?
            .map_err(|e| (502, format!("cannot resolve {host}: {e}")))?
            .collect(),
    };
    if addrs.is_empty() {
        return Err((502, format!("{host} has no address")));
    }
    if let Some(bad) = addrs.iter().find(|a| !policy.permits(a.ip())) {
        return Err((
            403,
            format!(
                "{host} resolves to {} — a loopback, private, link-local or otherwise non-public address that this service does not let sandboxes reach",
                bad.ip()
            ),
        ));
    }
    let mut last = String::new();
    for addr in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = format!("connecting to {addr}: {e}"),
            Err(_) => last = format!("connecting to {addr} timed out"),
        }
    }
    Err((502, last))
}

async fn handle(mut client: UnixStream, policy: &EgressPolicy) -> Result<(), String> {
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
    if method.eq_ignore_ascii_case("CONNECT") {
        let Some((host, port)) = split_host_port(target, 443) else {
            let _ = client
                .write_all(&reply(400, "CONNECT needs host:port"))
                .await;
            return Ok(());
        };
        let mut upstream = match dial(&host, port, policy).await {
            Ok(s) => s,
            Err((code, why)) => {
                let _ = client.write_all(&reply(code, &why)).await;
                return Ok(());
            }
        };
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        // Bytes the client sent after the head belong to the tunnel.
        upstream
            .write_all(&head[end..])
            .await
            .map_err(|e| e.to_string())?;
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
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
        let _ = client
            .write_all(&reply(400, "bad host in the request"))
            .await;
        return Ok(());
    };
    let mut upstream = match dial(&host, port, policy).await {
        Ok(s) => s,
        Err((code, why)) => {
            let _ = client.write_all(&reply(code, &why)).await;
            return Ok(());
        }
    };
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
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    Ok(())
}

/// Which addresses the host itself has are not known here; loopback is denied by range. Kept as
/// a helper for tests of the classifier.
pub fn is_denied_by_default(ip: IpAddr) -> bool {
    !EgressPolicy::default_public().permits(ip)
}

impl EgressPolicy {
    fn default_public() -> Self {
        Self {
            allow: Vec::new(),
            deny: DENIED.iter().filter_map(|s| Cidr::parse(s).ok()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn non_public_addresses_are_refused_and_public_ones_allowed() {
        for ip in [
            "127.0.0.1",
            "127.1.2.3",
            "0.0.0.0",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.100.200",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::7f00:1",
            "fd00:ec2::254",
            "fe80::1",
            "2002:7f00:1::",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(is_denied_by_default(ip), "{ip} must be refused");
        }
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "2606:4700:4700::1111",
            "::ffff:1.1.1.1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(!is_denied_by_default(ip), "{ip} is public");
        }
    }

    #[test]
    fn the_allow_list_opens_exactly_what_it_names() {
        let p = EgressPolicy::new(&["127.0.0.1/32".into(), "10.0.0.0/8".into()]).unwrap();
        assert!(p.permits(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert!(p.permits("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!p.permits("127.0.0.2".parse().unwrap()));
        assert!(p.permits("10.9.9.9".parse().unwrap()));
        assert!(!p.permits(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert!(EgressPolicy::new(&["nonsense".into()]).is_err());
        assert!(EgressPolicy::new(&["10.0.0.0/33".into()]).is_err());
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
