//! Where a request comes from, checked on every route before anything else (DNS rebinding).
//!
//! A web page the operator opens can point a DNS name of its own at the service's address
//! (127.0.0.1 in the default local mode, which needs no key) and then call the API as if it
//! were same-origin: its requests carry its own name as `Host`. So the service answers only
//! for the names and addresses it is reached by — the loopback names, the address it is bound
//! to, the address other replicas reach it at (`cluster.advertise_url`), and the names the
//! operator lists (`allowed_hosts`: the gateway's) — and a browser page (a request with an
//! `Origin`) only from its own origin or one the operator lists (`allowed_origins`).
//!
//! The probes (`/healthz`, `/readyz`, `/metrics`) are not checked: kubelets and scrapers name
//! the pod's IP as `Host`, and those routes take nothing and say nothing of any tenant.
//!
//! A request another replica forwarded is checked again where it lands: its `Host` is that
//! replica's advertised address, which it answers for. No header switches the check off.
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use toolexec_core::ProblemCode;

use crate::problem::ApiError;

/// Host names the service always answers for: a page cannot make a browser send them unless
/// it is served from the service itself.
pub const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Routes answered whatever the `Host` and `Origin`: probes and the scrape, which act on
/// nothing and show no tenant's data.
const UNCHECKED: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// Whether requests to `path` are answered without the door's checks.
pub(crate) fn unchecked(path: &str) -> bool {
    UNCHECKED.contains(&path)
}

/// One entry of the host allow-list: a name (lower case, IPv6 without brackets), and the only
/// port it is allowed with, if the entry named one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostRule {
    host: String,
    port: Option<u16>,
}

impl HostRule {
    fn parse(entry: &str) -> Option<Self> {
        let entry = entry.trim();
        if entry.is_empty() || entry.contains('/') || entry.contains('@') {
            return None;
        }
        // A bare IPv6 address (`::1`) is no authority: it names a host, every port.
        if let Ok(ip) = entry.parse::<std::net::Ipv6Addr>() {
            return Some(Self {
                host: ip.to_string(),
                port: None,
            });
        }
        let authority: axum::http::uri::Authority = entry.parse().ok()?;
        let host = normalize_host(authority.host());
        (!host.is_empty()).then_some(Self {
            host,
            port: authority.port_u16(),
        })
    }
}

/// The allow-lists in force.
#[derive(Debug, Clone)]
pub struct Door {
    /// `*` in `allowed_hosts`: the Host is not checked (the gateway does it).
    any_host: bool,
    hosts: Vec<HostRule>,
    /// Origins as the WHATWG URL spec serializes them (`https://app.example.com`).
    origins: Vec<String>,
}

impl Default for Door {
    /// The loopback names, no browser origin but the service's own.
    fn default() -> Self {
        Self::new(&[], &[], &[]).unwrap_or(Self {
            any_host: false,
            hosts: Vec::new(),
            origins: Vec::new(),
        })
    }
}

/// The serialized origin of `s`, or `None` for text that is no tuple origin (`null` is not
/// one: it is what sandboxed frames and `file:` pages send, and is never admitted).
fn serialized_origin(s: &str) -> Option<String> {
    let url = url::Url::parse(s.trim()).ok()?;
    let o = url.origin();
    o.is_tuple().then(|| o.ascii_serialization())
}

impl Door {
    /// The loopback names, `own` (the bound address, the advertised address: the service's own
    /// names) and the operator's `allowed_hosts` and `allowed_origins`. An entry that is no
    /// host name (or `host:port`), or no origin (`scheme://host[:port]`), is an error that names
    /// it.
    pub fn new(
        allowed_hosts: &[String],
        allowed_origins: &[String],
        own: &[String],
    ) -> Result<Self, String> {
        let mut any_host = false;
        let mut hosts = Vec::new();
        for entry in LOOPBACK_NAMES
            .iter()
            .copied()
            .chain(own.iter().map(String::as_str))
        {
            hosts.extend(HostRule::parse(entry));
        }
        for entry in allowed_hosts {
            if entry.trim() == "*" {
                any_host = true;
                continue;
            }
            hosts.push(HostRule::parse(entry).ok_or_else(|| {
                format!(
                    "allowed_hosts: {entry:?} is not a host name or host:port (e.g. \"tools.example.com\")"
                )
            })?);
        }
        let origins = allowed_origins
            .iter()
            .map(|entry| {
                serialized_origin(entry).ok_or_else(|| {
                    format!(
                        "allowed_origins: {entry:?} is not an origin (scheme://host[:port], e.g. \"https://app.example.com\")"
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            any_host,
            hosts,
            origins,
        })
    }

    /// Checks a request's `Host` (or its URI's authority), then its `Origin`. A request that
    /// names no host at all is no browser's and passes the first check.
    pub fn check(&self, headers: &HeaderMap, uri: &Uri) -> Result<(), ApiError> {
        let host = self.check_host(headers, uri)?;
        self.check_origin(headers, host.as_ref())
    }

    /// The `Host` must be one of the service's names; returns it (name, port) when checked.
    fn check_host(
        &self,
        headers: &HeaderMap,
        uri: &Uri,
    ) -> Result<Option<(String, Option<u16>)>, ApiError> {
        if self.any_host {
            return Ok(None);
        }
        let given = match headers.get(header::HOST) {
            Some(v) => String::from_utf8_lossy(v.as_bytes()).into_owned(),
            None => match uri.authority() {
                Some(a) => a.as_str().to_owned(),
                // No browser sends a request without a host (HTTP/1.0 tools and in-process
                // callers do): nothing to rebind.
                None => return Ok(None),
            },
        };
        let refused = || {
            forbidden(format!(
                "this service does not answer for the host {given:?}: a request must name one of its own addresses, a loopback name, or a name the operator lists in allowed_hosts (TOOLEXEC_ALLOWED_HOSTS). If clients reach the service by this name (a gateway's), add it there"
            ))
        };
        let authority: axum::http::uri::Authority = given.parse().map_err(|_| refused())?;
        let host = normalize_host(authority.host());
        let port = authority.port_u16();
        let ok = self
            .hosts
            .iter()
            .any(|r| r.host == host && r.port.is_none_or(|p| Some(p) == port));
        if ok {
            Ok(Some((host, port)))
        } else {
            Err(refused())
        }
    }

    /// An `Origin`, when present, must be the service's own (the same host and port as the
    /// checked `Host`: a page the service itself served, such as /docs) or one on the list.
    /// Agents and server-side clients send none.
    fn check_origin(
        &self,
        headers: &HeaderMap,
        host: Option<&(String, Option<u16>)>,
    ) -> Result<(), ApiError> {
        let Some(origin) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        let text = origin.to_str().unwrap_or_default().trim();
        let ok = url::Url::parse(text).ok().is_some_and(|url| {
            let serialized = url.origin();
            if !serialized.is_tuple() {
                return false;
            }
            if self.origins.contains(&serialized.ascii_serialization()) {
                return true;
            }
            // Its own page: the same host and port as the (admitted) Host.
            host.is_some_and(|(name, port)| {
                let (Some(o_host), Some(o_port)) = (url.host_str(), url.port_or_known_default())
                else {
                    return false;
                };
                normalize_host(o_host) == *name
                    && match port {
                        Some(p) => *p == o_port,
                        // No port in Host: the scheme's own (a gateway's `$host`).
                        None => url.port().is_none(),
                    }
            })
        });
        if ok {
            Ok(())
        } else {
            Err(forbidden(format!(
                "requests from the browser page at origin {text:?} are refused: only the service's own pages and the origins the operator lists in allowed_origins (TOOLEXEC_ALLOWED_ORIGINS) may call it. To let that page call the API, add its origin there"
            )))
        }
    }
}

fn forbidden(detail: String) -> ApiError {
    ApiError::new(ProblemCode::Forbidden, detail)
}

fn normalize_host(host: &str) -> String {
    let bare = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.');
    // One spelling per IPv6 address (`0:0:0:0:0:0:0:1` is `::1`).
    match bare.parse::<std::net::Ipv6Addr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => bare.to_ascii_lowercase(),
    }
}

/// The middleware: every route but the probes goes through the door first.
pub(crate) async fn check(
    State(state): State<crate::SharedState>,
    req: Request,
    next: Next,
) -> Response {
    if !unchecked(req.uri().path())
        && let Err(e) = state.config.door.check(req.headers(), req.uri())
    {
        return e.into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                *k,
                HeaderValue::from_str(v).unwrap_or(HeaderValue::from_static("")),
            );
        }
        h
    }

    fn uri() -> Uri {
        Uri::from_static("/v1/sessions")
    }

    fn door(hosts: &[&str], origins: &[&str], own: &[&str]) -> Door {
        let s = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        Door::new(&s(hosts), &s(origins), &s(own)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn refused(d: &Door, pairs: &[(&'static str, &str)]) -> bool {
        d.check(&headers(pairs), &uri())
            .is_err_and(|e| e.code == ProblemCode::Forbidden)
    }

    #[test]
    fn loopback_names_and_the_services_own_addresses_pass_and_other_names_are_refused() {
        let d = door(&[], &[], &["10.1.2.3", "toolexec-0.toolexec-headless:8080"]);
        for ok in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:1",
            "[::1]:9",
            "[0:0:0:0:0:0:0:1]:9",
            "10.1.2.3:8080",
            "toolexec-0.toolexec-headless:8080",
        ] {
            assert!(!refused(&d, &[("host", ok)]), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.2:8080",
            "localhost.evil.example",
            "toolexec-0.toolexec-headless:9090",
            "not a host",
        ] {
            assert!(refused(&d, &[("host", bad)]), "{bad}");
        }
        assert!(!refused(&d, &[]), "no Host: no browser's request");
        assert!(
            refused(&d, &[("origin", "https://evil.example")]),
            "no Host, a foreign Origin"
        );
    }

    #[test]
    fn a_host_entry_with_a_port_allows_that_port_only_and_a_star_allows_all() {
        let d = door(&["tools.example.com:443"], &[], &[]);
        assert!(!refused(&d, &[("host", "tools.example.com:443")]));
        assert!(refused(&d, &[("host", "tools.example.com:8443")]));
        assert!(!refused(&door(&["*"], &[], &[]), &[("host", "anything")]));
    }

    #[test]
    fn entries_that_are_no_host_or_no_origin_are_refused_at_start_up() {
        let s = |v: &str| vec![v.to_owned()];
        assert!(Door::new(&s("https://tools.example.com"), &[], &[]).is_err());
        assert!(Door::new(&s(""), &[], &[]).is_err());
        assert!(Door::new(&[], &s("app.example.com"), &[]).is_err());
        assert!(Door::new(&[], &s("null"), &[]).is_err());
        assert!(Door::new(&s("::1"), &s("http://localhost:3000"), &[]).is_ok());
    }

    #[test]
    fn only_listed_browser_origins_and_the_services_own_pass() {
        let d = door(
            &["tools.example.com"],
            &["https://app.example.com", "http://localhost:3000"],
            &[],
        );
        let at = |host: &'static str, origin: &'static str| [("host", host), ("origin", origin)];
        assert!(!refused(&d, &[("host", "localhost:8080")]), "no Origin");
        for (host, origin) in [
            ("localhost:8080", "https://app.example.com"),
            ("localhost:8080", "https://APP.example.com:443"),
            ("localhost:8080", "http://localhost:3000"),
            // Its own pages (/docs): the same host and port as the request names.
            ("127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("tools.example.com", "https://tools.example.com"),
        ] {
            assert!(!refused(&d, &at(host, origin)), "{host} {origin}");
        }
        for (host, origin) in [
            ("localhost:8080", "https://evil.example"),
            ("localhost:8080", "http://app.example.com"),
            ("localhost:8080", "https://app.example.com:8443"),
            ("localhost:8080", "http://localhost:3001"),
            ("localhost:8080", "http://localhost:9090"),
            ("tools.example.com", "https://tools.example.com:8443"),
            ("localhost:8080", "null"),
            ("localhost:8080", "not a url"),
        ] {
            assert!(refused(&d, &at(host, origin)), "{host} {origin}");
        }
        // With the Host check off, no origin is taken for the service's own.
        let open = door(&["*"], &[], &[]);
        assert!(refused(&open, &at("evil.example", "http://evil.example")));
    }
}
