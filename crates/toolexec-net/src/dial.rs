//! The dial layer: a name is resolved once, every address of the answer is checked, and the
//! connection goes to a checked address. There is no second lookup that could answer
//! differently (DNS rebinding gets nothing), and a name whose answer holds one refused address
//! is refused whole.
//!
//! Tests use [`StaticResolver`] in place of [`SystemResolver`]: the rest of the path is the one
//! production takes.
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use async_trait::async_trait;
use tokio::net::TcpStream;

use crate::host::Host;
use crate::policy::NetPolicy;
use crate::refusal::Refusal;

/// Turns a host name into addresses. Only names reach a resolver: address literals are checked
/// and dialled as they are.
#[async_trait]
pub trait Resolver: Send + Sync {
    async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>>;
}

/// The system's resolver: the nameservers and search domains of `/etc/resolv.conf` and the names
/// of `/etc/hosts`, asked asynchronously (hickory-resolver). A lookup is cancelled when its caller
/// stops waiting: names whose nameserver never answers cost a timer and a socket for the caller's
/// timeout, not a thread of the blocking pool every session shares (as `getaddrinfo` would, which
/// cannot be cancelled).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

/// Lookups in flight at once in the whole process (each holds a socket while it waits): more
/// wait for one to end, within their caller's timeout.
pub const MAX_SYSTEM_LOOKUPS: usize = 1024;

static LOOKUPS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_SYSTEM_LOOKUPS);

/// The process's resolver, made from the system's configuration on first use; the reason when
/// that configuration cannot be read (every lookup then fails with it).
fn system_resolver() -> Result<&'static hickory_resolver::TokioResolver, &'static str> {
    static RESOLVER: std::sync::OnceLock<Result<hickory_resolver::TokioResolver, String>> =
        std::sync::OnceLock::new();
    RESOLVER
        .get_or_init(|| {
            let mut builder = hickory_resolver::TokioResolver::builder_tokio()
                .map_err(|e| format!("the system's resolver configuration cannot be read: {e}"))?;
            let options = builder.options_mut();
            // Both families, as getaddrinfo gives them: the policy checks the whole answer.
            options.ip_strategy = hickory_resolver::config::LookupIpStrategy::Ipv4AndIpv6;
            options.use_hosts_file = hickory_resolver::config::ResolveHosts::Always;
            builder
                .build()
                .map_err(|e| format!("the system's resolver cannot be started: {e}"))
        })
        .as_ref()
        .map_err(String::as_str)
}

#[async_trait]
impl Resolver for SystemResolver {
    async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        let resolver = system_resolver().map_err(io::Error::other)?;
        let _permit = LOOKUPS
            .acquire()
            .await
            .map_err(|_| io::Error::other("name resolution is shut down"))?;
        let answer = resolver
            .lookup_ip(host)
            .await
            .map_err(|e| io::Error::new(io::ErrorKind::NotFound, e.to_string()))?;
        Ok(answer.iter().map(|ip| SocketAddr::new(ip, port)).collect())
    }
}

/// A fixed table of names and their answers, for tests: a name can answer with any addresses
/// (a public and a private one, say) without a DNS server.
#[derive(Debug, Clone, Default)]
pub struct StaticResolver {
    names: HashMap<String, Vec<IpAddr>>,
}

impl StaticResolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Answers `host` (matched as a URL host is: case and trailing dots ignored) with `addrs`.
    pub fn with(mut self, host: &str, addrs: impl IntoIterator<Item = IpAddr>) -> Self {
        self.names
            .insert(normalize(host), addrs.into_iter().collect());
        self
    }
}

fn normalize(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

#[async_trait]
impl Resolver for StaticResolver {
    async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        self.names
            .get(&normalize(host))
            .map(|ips| ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such host"))
    }
}

/// Why a checked dial did not give a connection. `Display` never names an address.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The policy refused the destination (before anything was connected).
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("resolving the host timed out")]
    ResolveTimeout,
    #[error("the host could not be resolved: {0}")]
    Resolve(io::Error),
    #[error("connecting timed out")]
    ConnectTimeout,
    #[error("connecting failed: {0}")]
    Connect(io::Error),
}

/// Parses `host` as a URL host, resolves it once (a literal is not resolved), and checks the
/// whole answer against `policy`. The addresses returned, all with `port`, are the only ones the
/// caller may connect to. `timeout` bounds the resolution.
pub async fn resolve_checked(
    policy: &NetPolicy,
    resolver: &dyn Resolver,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<Vec<SocketAddr>, ConnectError> {
    if port == 0 {
        return Err(Refusal::Port.into());
    }
    let ips: Vec<IpAddr> = match Host::parse(host)? {
        Host::Ip(ip) => vec![ip],
        Host::Domain(name) => tokio::time::timeout(timeout, resolver.resolve(&name, port))
            .await
            .map_err(|_| ConnectError::ResolveTimeout)?
            .map_err(ConnectError::Resolve)?
            .into_iter()
            .map(|a| a.ip())
            .collect(),
    };
    policy.check_all(&ips)?;
    // The resolver chose the addresses, not the port.
    Ok(ips
        .into_iter()
        .map(|ip| SocketAddr::new(ip, port))
        .collect())
}

/// A TCP connection to `host:port` if the policy permits every address `host` resolves to:
/// [`resolve_checked`], then the checked addresses tried in the resolver's order. `timeout`
/// bounds the resolution and each connection attempt.
pub async fn connect_checked(
    policy: &NetPolicy,
    resolver: &dyn Resolver,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<TcpStream, ConnectError> {
    let addrs = resolve_checked(policy, resolver, host, port, timeout).await?;
    let mut last = ConnectError::Refused(Refusal::NoAddress);
    for addr in addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(e)) => last = ConnectError::Connect(e),
            Err(_) => last = ConnectError::ConnectTimeout,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::AddressClass;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    const T: Duration = Duration::from_secs(5);

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    async fn listener() -> (TcpListener, u16) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        (l, port)
    }

    /// Nothing connected to the listener (a refused dial must not even try).
    async fn assert_no_connection(l: &TcpListener) {
        let accepted = tokio::time::timeout(Duration::from_millis(200), l.accept()).await;
        assert!(accepted.is_err(), "something connected: {accepted:?}");
    }

    fn refusal(r: Result<TcpStream, ConnectError>) -> Refusal {
        match r {
            Err(ConnectError::Refused(refusal)) => refusal,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_system_resolver_answers_from_the_hosts_file_and_is_cancelled_with_its_caller() {
        let addrs = SystemResolver.resolve("localhost", 80).await.unwrap();
        assert!(
            addrs.iter().any(|a| a.ip().is_loopback() && a.port() == 80),
            "{addrs:?}"
        );
        // Every slot held: a lookup waits, and giving up on it takes nothing with it.
        let held = LOOKUPS
            .acquire_many(MAX_SYSTEM_LOOKUPS as u32)
            .await
            .unwrap();
        let waited = tokio::time::timeout(
            Duration::from_millis(100),
            SystemResolver.resolve("localhost", 80),
        )
        .await;
        assert!(waited.is_err(), "a lookup ran past the bound: {waited:?}");
        drop(held);
        assert_eq!(LOOKUPS.available_permits(), MAX_SYSTEM_LOOKUPS);
        // A lookup stopped by its caller's timeout gives its slot back at once (a blocking
        // getaddrinfo would hold it, and its thread, until the nameserver answered).
        let _ = tokio::time::timeout(
            Duration::from_millis(1),
            SystemResolver.resolve("a-name-that-needs-a-nameserver.invalid", 80),
        )
        .await;
        assert_eq!(LOOKUPS.available_permits(), MAX_SYSTEM_LOOKUPS);
    }

    /// Counts lookups, to show there is exactly one per dial.
    struct Counting {
        inner: StaticResolver,
        calls: AtomicUsize,
    }

    #[async_trait]
    impl Resolver for Counting {
        async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.inner.resolve(host, port).await
        }
    }

    #[tokio::test]
    async fn the_default_policy_refuses_a_loopback_listener() {
        let (l, port) = listener().await;
        let p = NetPolicy::public_only();
        for host in ["127.0.0.1", "0x7f.1", "2130706433", "[::ffff:127.0.0.1]"] {
            let r = refusal(connect_checked(&p, &SystemResolver, host, port, T).await);
            assert_eq!(r.reason(), "loopback", "{host}");
        }
        let r = refusal(connect_checked(&p, &SystemResolver, "localhost", port, T).await);
        assert_eq!(r, Refusal::LocalName);
        assert_no_connection(&l).await;
    }

    #[tokio::test]
    async fn an_allow_listed_loopback_listener_is_reached() {
        let (l, port) = listener().await;
        let p = NetPolicy::new(&["127.0.0.1/32"]).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            s.write_all(b"hello").await.unwrap();
        });
        let mut stream = connect_checked(&p, &SystemResolver, "127.0.0.1", port, T)
            .await
            .unwrap();
        let mut got = String::new();
        stream.read_to_string(&mut got).await.unwrap();
        assert_eq!(got, "hello");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_name_is_resolved_once_and_dialled_at_the_checked_address() {
        let (l, port) = listener().await;
        let p = NetPolicy::new(&["127.0.0.1/32"]).unwrap();
        let resolver = Counting {
            inner: StaticResolver::new().with("Web.Test.", [ip("127.0.0.1")]),
            calls: AtomicUsize::new(0),
        };
        let stream = connect_checked(&p, &resolver, "web.test", port, T)
            .await
            .unwrap();
        assert_eq!(
            stream.peer_addr().unwrap(),
            SocketAddr::new(ip("127.0.0.1"), port)
        );
        l.accept().await.unwrap();
        assert_eq!(resolver.calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answer_mixing_public_and_loopback_is_refused_whole_and_nothing_is_dialled() {
        let (l, port) = listener().await;
        let resolver = StaticResolver::new()
            .with("mixed.test", [ip("8.8.8.8"), ip("127.0.0.1")])
            .with("mixed-first.test", [ip("127.0.0.1"), ip("8.8.8.8")]);
        let p = NetPolicy::public_only();
        for host in ["mixed.test", "mixed-first.test"] {
            let r = refusal(connect_checked(&p, &resolver, host, port, T).await);
            assert_eq!(
                r,
                Refusal::Address {
                    class: AddressClass::Loopback,
                    ip: ip("127.0.0.1")
                },
                "{host}"
            );
        }
        assert_no_connection(&l).await;
    }

    #[tokio::test]
    async fn a_rebinding_name_gets_only_the_first_answer_checked_and_used() {
        /// Public on the first lookup, loopback on every later one.
        struct Rebinding(AtomicUsize);
        #[async_trait]
        impl Resolver for Rebinding {
            async fn resolve(&self, _: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
                let ip = if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
                    "192.0.2.1"
                } else {
                    "127.0.0.1"
                };
                Ok(vec![SocketAddr::new(ip.parse().unwrap(), port)])
            }
        }
        let (l, port) = listener().await;
        // 192.0.2.0/24 allow-listed stands in for "public": nothing listens there, so a dial
        // that stuck to the checked answer fails; one that looked the name up again would
        // connect to the listener.
        let p = NetPolicy::new(&["192.0.2.0/24"]).unwrap();
        let resolver = Rebinding(AtomicUsize::new(0));
        let r = connect_checked(
            &p,
            &resolver,
            "rebind.test",
            port,
            Duration::from_millis(300),
        )
        .await;
        assert!(
            matches!(
                r,
                Err(ConnectError::Connect(_) | ConnectError::ConnectTimeout)
            ),
            "{r:?}"
        );
        assert_eq!(resolver.0.load(Ordering::SeqCst), 1);
        assert_no_connection(&l).await;
    }

    #[tokio::test]
    async fn the_resolver_does_not_choose_the_port() {
        struct OtherPort;
        #[async_trait]
        impl Resolver for OtherPort {
            async fn resolve(&self, _: &str, _: u16) -> io::Result<Vec<SocketAddr>> {
                Ok(vec!["127.0.0.1:1".parse().unwrap()])
            }
        }
        let p = NetPolicy::new(&["127.0.0.1/32"]).unwrap();
        let addrs = resolve_checked(&p, &OtherPort, "x.test", 8080, T)
            .await
            .unwrap();
        assert_eq!(addrs, vec!["127.0.0.1:8080".parse().unwrap()]);
    }

    #[tokio::test]
    async fn unknown_names_empty_answers_and_port_zero_are_errors() {
        let p = NetPolicy::public_only();
        let resolver = StaticResolver::new().with("empty.test", []);
        let r = connect_checked(&p, &resolver, "unknown.test", 80, T).await;
        assert!(matches!(r, Err(ConnectError::Resolve(_))), "{r:?}");
        assert_eq!(
            refusal(connect_checked(&p, &resolver, "empty.test", 80, T).await),
            Refusal::NoAddress
        );
        assert_eq!(
            refusal(connect_checked(&p, &resolver, "8.8.8.8", 0, T).await),
            Refusal::Port
        );
        assert_eq!(
            refusal(connect_checked(&p, &resolver, "exa mple", 80, T).await),
            Refusal::InvalidHost
        );
    }

    #[tokio::test]
    async fn a_slow_resolver_times_out() {
        struct Slow;
        #[async_trait]
        impl Resolver for Slow {
            async fn resolve(&self, _: &str, _: u16) -> io::Result<Vec<SocketAddr>> {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(Vec::new())
            }
        }
        let r = connect_checked(
            &NetPolicy::public_only(),
            &Slow,
            "slow.test",
            80,
            Duration::from_millis(50),
        )
        .await;
        assert!(matches!(r, Err(ConnectError::ResolveTimeout)), "{r:?}");
    }
}
