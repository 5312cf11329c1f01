//! Failed authentication, limited per source: an API key the service has not seen costs a store
//! lookup (about 1,600 a second from one client, measured before this limit), and guessing keys
//! must not be that cheap.
//!
//! Each source (a client address; an IPv6 client's /64, which one host usually holds whole) has
//! a token bucket of lookups that may fail. A key that is not in the cache of verified keys is
//! looked up only while its source's bucket holds a token, and takes one if it turns out
//! unknown; valid keys take none, so a burst of clients with new keys (after a restart, behind
//! one gateway) is never refused for its own sake. An empty bucket answers 429
//! `too_many_auth_failures` with `Retry-After`, without a lookup. Guesses sent all at once pass
//! the check together, and each takes its token afterwards: the bucket goes into debt (down to
//! an hour's worth), and the source waits until it is paid, so lookups stay at the rate on
//! average.
//!
//! One gateway's address is every client's source unless the operator names the gateway in
//! `trusted_proxies`: then the client is the right-most `X-Forwarded-For` address that is not a
//! trusted proxy (what the gateway appended, not what the client wrote). Without it, one tenant
//! sending bad keys through the gateway empties the bucket they all share. What stays open to
//! the others then is every key this node has verified before (`Auth` keeps them): those are
//! checked against the store again when their cache entry is old, without a token. Only keys
//! this node has never seen wait — a new key's first use, for up to `Retry-After` seconds while
//! the flood lasts.
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::ConnectInfo;
use axum::http::request::Parts;
use toolexec_core::ProblemCode;
use toolexec_net::{Cidr, canonical};

use crate::problem::ApiError;

/// Most sources tracked at once. When full, the buckets that are full again (sources that
/// stopped failing) are dropped first; bounded memory whatever the number of addresses.
const MAX_SOURCES: usize = 100_000;

/// The longest a source's debt lasts: guesses sent all at once cost their source up to this
/// long without lookups of new keys.
const MAX_DEBT_SECONDS: f64 = 3600.0;

/// Where failed authentications are counted: a client address (IPv6 by its /64), or `None`
/// when the request came without one (an in-process caller).
type Source = Option<IpAddr>;

/// The limit: `per_second` lookups that may fail, refilled continuously, up to `burst` at once.
/// `per_second = 0` turns it off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FailureLimit {
    pub per_second: f64,
    pub burst: f64,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Debug)]
pub struct AuthFailures {
    limit: FailureLimit,
    trusted_proxies: Vec<Cidr>,
    buckets: Mutex<HashMap<Source, Bucket>>,
}

impl Default for AuthFailures {
    /// No limit.
    fn default() -> Self {
        Self {
            limit: FailureLimit {
                per_second: 0.0,
                burst: 0.0,
            },
            trusted_proxies: Vec::new(),
            buckets: Mutex::new(HashMap::new()),
        }
    }
}

impl AuthFailures {
    /// `trusted_proxies`: addresses or networks (`10.0.0.0/8`) of the gateways whose
    /// `X-Forwarded-For` names the client. An entry that is neither is an error naming it.
    pub fn new(limit: FailureLimit, trusted_proxies: &[String]) -> Result<Self, String> {
        let trusted_proxies = trusted_proxies
            .iter()
            .map(|entry| {
                Cidr::parse(entry.trim()).map_err(|e| {
                    format!("trusted_proxies: {entry:?} is not an address or network: {e}")
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            limit,
            trusted_proxies,
            buckets: Mutex::new(HashMap::new()),
        })
    }

    /// The client a request comes from: its peer, or, when the peer is a trusted proxy, the
    /// right-most `X-Forwarded-For` address that is not one.
    pub(crate) fn source(&self, parts: &Parts) -> Source {
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| canonical(c.0.ip()))?;
        let trusted = |ip: IpAddr| self.trusted_proxies.iter().any(|c| c.contains(ip));
        let mut client = peer;
        if trusted(peer) {
            let hops = parts
                .headers
                .get_all("x-forwarded-for")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(str::trim)
                .collect::<Vec<_>>();
            for hop in hops.iter().rev() {
                // What cannot be read is where the trusted chain ends: the last trusted hop
                // stands for it.
                let Ok(ip) = hop.parse::<IpAddr>().map(canonical) else {
                    break;
                };
                client = ip;
                if !trusted(ip) {
                    break;
                }
            }
        }
        Some(group(client))
    }

    /// Whether a key from `source` may be looked up now, or when to come back.
    pub(crate) fn check(&self, source: Source) -> Result<(), ApiError> {
        let FailureLimit { per_second, burst } = self.limit;
        if per_second <= 0.0 {
            return Ok(());
        }
        let tokens = match self.buckets.lock() {
            Ok(mut buckets) => match buckets.get_mut(&source) {
                Some(b) => refill(b, self.limit),
                None => return Ok(()),
            },
            Err(_) => return Ok(()),
        };
        if tokens >= 1.0 {
            return Ok(());
        }
        let wait = ((1.0 - tokens) / per_second).ceil().max(1.0) as u32;
        let from = match source {
            Some(ip) => format!("from {ip}"),
            None => "from this client".to_owned(),
        };
        Err(ApiError {
            retry_after: Some(wait),
            ..ApiError::new(
                ProblemCode::TooManyAuthFailures,
                format!(
                    "too many API keys that are not valid came {from}: {burst} at once and \
                     {per_second} a second are looked up (auth_failure_burst, \
                     auth_failure_rate_per_second); retry after {wait} s with a valid key. Keys \
                     this service has verified before are not affected"
                ),
            )
        })
    }

    /// A key from `source` was looked up and is unknown: it takes a token (into debt, down to
    /// an hour's worth, when guesses were sent all at once).
    pub(crate) fn failed(&self, source: Source) {
        let limit = self.limit;
        if limit.per_second <= 0.0 {
            return;
        }
        let Ok(mut buckets) = self.buckets.lock() else {
            return;
        };
        if buckets.len() >= MAX_SOURCES && !buckets.contains_key(&source) {
            // Sources whose bucket is full again stopped failing: forget them first.
            buckets.retain(|_, b| refill(b, limit) < limit.burst);
            if buckets.len() >= MAX_SOURCES {
                buckets.clear();
            }
        }
        let b = buckets.entry(source).or_insert(Bucket {
            tokens: limit.burst,
            at: Instant::now(),
        });
        let tokens = refill(b, limit);
        b.tokens = (tokens - 1.0).max(-limit.per_second * MAX_DEBT_SECONDS);
    }
}

/// The tokens of `b` now (refilled since it was last looked at, up to the burst).
fn refill(b: &mut Bucket, limit: FailureLimit) -> f64 {
    let now = Instant::now();
    b.tokens =
        (b.tokens + now.duration_since(b.at).as_secs_f64() * limit.per_second).min(limit.burst);
    b.at = now;
    b.tokens
}

/// An address as the source it counts for: IPv4 whole, IPv6 by its /64.
fn group(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(peer: &str, forwarded: &[&str]) -> Parts {
        let mut req = axum::http::Request::builder().uri("/v1/sessions");
        for f in forwarded {
            req = req.header("x-forwarded-for", *f);
        }
        let (mut parts, ()) = req.body(()).unwrap_or_default().into_parts();
        if let Ok(addr) = peer.parse::<SocketAddr>() {
            parts.extensions.insert(ConnectInfo(addr));
        }
        parts
    }

    fn limiter(per_second: f64, burst: f64, trusted: &[&str]) -> AuthFailures {
        let trusted: Vec<String> = trusted.iter().map(|c| (*c).to_owned()).collect();
        AuthFailures::new(FailureLimit { per_second, burst }, &trusted).unwrap()
    }

    #[test]
    fn a_trusted_proxy_that_is_no_address_is_refused_at_start_up() {
        let limit = FailureLimit {
            per_second: 1.0,
            burst: 1.0,
        };
        let err = AuthFailures::new(limit, &["gateway.internal".to_owned()]).err();
        assert!(err.is_some_and(|e| e.contains("gateway.internal")));
        assert!(AuthFailures::new(limit, &["10.0.0.0/8".to_owned(), "::1".to_owned()]).is_ok());
    }

    fn ip(s: &str) -> Source {
        s.parse().ok()
    }

    #[test]
    fn the_source_is_the_peer_unless_it_is_a_trusted_proxy() {
        let none = limiter(1.0, 1.0, &[]);
        assert_eq!(
            none.source(&parts("10.0.0.5:1", &["203.0.113.7"])),
            ip("10.0.0.5")
        );
        let gw = limiter(1.0, 1.0, &["10.0.0.0/24"]);
        assert_eq!(
            gw.source(&parts("10.0.0.5:1", &["203.0.113.7"])),
            ip("203.0.113.7")
        );
        // The client writes what it likes on the left; the gateway appends the truth.
        assert_eq!(
            gw.source(&parts("10.0.0.5:1", &["1.2.3.4, 203.0.113.7, 10.0.0.9"])),
            ip("203.0.113.7")
        );
        assert_eq!(
            gw.source(&parts("10.0.0.5:1", &["1.2.3.4", "203.0.113.7"])),
            ip("203.0.113.7")
        );
        assert_eq!(
            gw.source(&parts("10.0.0.5:1", &["garbage"])),
            ip("10.0.0.5")
        );
        assert_eq!(gw.source(&parts("10.0.0.5:1", &[])), ip("10.0.0.5"));
        // Not from the gateway: the header is the client's own text.
        assert_eq!(
            gw.source(&parts("192.0.2.1:1", &["203.0.113.7"])),
            ip("192.0.2.1")
        );
        // IPv6 by /64; IPv4-mapped as IPv4.
        assert_eq!(
            none.source(&parts("[2001:db8::1:2]:1", &[])),
            ip("2001:db8::")
        );
        assert_eq!(
            none.source(&parts("[::ffff:10.0.0.5]:1", &[])),
            ip("10.0.0.5")
        );
        assert_eq!(none.source(&parts("not an address", &[])), None);
    }

    #[test]
    fn a_source_over_its_burst_waits_and_only_failures_count() {
        let l = limiter(1.0, 2.0, &[]);
        let a = ip("192.0.2.1");
        // Valid keys (no failure recorded) never use the budget.
        for _ in 0..100 {
            assert!(l.check(a).is_ok());
        }
        l.failed(a);
        assert!(l.check(a).is_ok());
        l.failed(a);
        let e = l.check(a).err();
        assert_eq!(
            e.as_ref().map(|e| e.code),
            Some(ProblemCode::TooManyAuthFailures)
        );
        assert_eq!(e.and_then(|e| e.retry_after), Some(1));
        assert!(l.check(ip("192.0.2.2")).is_ok(), "another source");
    }

    #[test]
    fn guesses_sent_at_once_put_their_source_in_debt() {
        let a = ip("192.0.2.1");
        // Ten passed the check together, then all failed: eight tokens owed, one to take.
        let l = limiter(1.0, 2.0, &[]);
        for _ in 0..10 {
            l.failed(a);
        }
        assert_eq!(l.check(a).err().and_then(|e| e.retry_after), Some(9));
        let l = limiter(1.0, 2.0, &[]);
        for _ in 0..10_000 {
            l.failed(a);
        }
        let wait = l.check(a).err().and_then(|e| e.retry_after);
        assert_eq!(wait, Some(3601), "an hour at most");
    }

    #[test]
    fn tokens_come_back_at_the_rate() {
        let l = limiter(5.0, 1.0, &[]);
        let a = ip("192.0.2.1");
        l.failed(a);
        assert!(l.check(a).is_err());
        std::thread::sleep(std::time::Duration::from_millis(250));
        assert!(l.check(a).is_ok(), "one token in 200 ms");
    }

    #[test]
    fn a_zero_rate_means_no_limit() {
        let l = limiter(0.0, 0.0, &[]);
        for _ in 0..1000 {
            l.failed(ip("192.0.2.1"));
        }
        assert!(l.check(ip("192.0.2.1")).is_ok());
    }
}
