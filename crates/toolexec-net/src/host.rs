//! The URL layer: what a URL or an authority names, parsed as the WHATWG URL standard (and so
//! reqwest) parses it, then checked before any resolution.
//!
//! Checking the *parsed* host matters: `http://2130706433/`, `http://0x7f.1/`,
//! `http://017700000001/`, `http://127.1/`, `http://%31%32%37.0.0.1/` and `http://①②⑦.⓪.⓪.①/` are
//! all `127.0.0.1` once parsed, and an HTTP client connects to the parsed host, not the string.
//! IP-literal hosts are classified here, since clients connect to them without resolving.
//! Names are checked again, address by address, when they are dialled ([`crate::dial`]).
use std::fmt;
use std::net::IpAddr;

use url::Url;

use crate::policy::NetPolicy;
use crate::refusal::{MAX_URL_LEN, Refusal};

/// The longest DNS name, in bytes (RFC 1035, without the trailing dot).
const MAX_NAME_LEN: usize = 253;

/// A destination host after WHATWG host parsing: lowercased and IDNA-mapped names without a
/// trailing dot, or an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Domain(String),
    Ip(IpAddr),
}

impl Host {
    /// Parses the host part of an authority as a URL's host is parsed (numeric IPv4 spellings
    /// become addresses, names are lowercased and IDNA-mapped, trailing dots dropped). IPv6
    /// may come with or without brackets. `localhost` names are refused here.
    pub fn parse(s: &str) -> Result<Self, Refusal> {
        let host = if s.contains(':') && !s.starts_with('[') {
            url::Host::parse(&format!("[{s}]"))
        } else {
            url::Host::parse(s)
        }
        .map_err(|_| Refusal::InvalidHost)?;
        Self::from_url_host(host)
    }

    fn from_url_host<S: AsRef<str>>(host: url::Host<S>) -> Result<Self, Refusal> {
        match host {
            url::Host::Ipv4(v4) => Ok(Self::Ip(IpAddr::V4(v4))),
            url::Host::Ipv6(v6) => Ok(Self::Ip(IpAddr::V6(v6))),
            url::Host::Domain(name) => {
                let name = name.as_ref().trim_end_matches('.').to_ascii_lowercase();
                if name.is_empty() {
                    return Err(Refusal::NoHost);
                }
                if name.len() > MAX_NAME_LEN {
                    return Err(Refusal::InvalidHost);
                }
                if name == "localhost" || name.ends_with(".localhost") {
                    return Err(Refusal::LocalName);
                }
                Ok(Self::Domain(name))
            }
        }
    }

    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            Self::Ip(ip) => Some(*ip),
            Self::Domain(_) => None,
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Domain(name) => f.write_str(name),
            Self::Ip(IpAddr::V4(v4)) => write!(f, "{v4}"),
            Self::Ip(IpAddr::V6(v6)) => write!(f, "[{v6}]"),
        }
    }
}

/// A URL that passed the URL layer: http or https, no userinfo, a host that is a permitted
/// address or a name still to be checked at dial time, and its port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedUrl {
    url: Url,
    host: Host,
    port: u16,
}

impl CheckedUrl {
    /// The URL to request: the parsed one, with a name's trailing dots removed, so that the
    /// host requested is the host checked.
    pub fn url(&self) -> &Url {
        &self.url
    }

    pub fn into_url(self) -> Url {
        self.url
    }

    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The port, explicit or the scheme's default.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl NetPolicy {
    /// The URL layer for a URL as given (by the model, say): parses it with the WHATWG rules and
    /// checks it with [`NetPolicy::check_parsed_url`].
    pub fn check_url(&self, input: &str) -> Result<CheckedUrl, Refusal> {
        if input.len() > MAX_URL_LEN {
            return Err(Refusal::TooLong);
        }
        let url = Url::parse(input).map_err(Refusal::InvalidUrl)?;
        self.check_parsed_url(url)
    }

    /// The URL layer for a URL already parsed (a redirect's target): only http and https, no
    /// user name or password, a host, a port other than 0; an IP-literal host must be
    /// permitted, a name must not be `localhost`. Names are resolved and checked when dialled.
    pub fn check_parsed_url(&self, mut url: Url) -> Result<CheckedUrl, Refusal> {
        if url.as_str().len() > MAX_URL_LEN {
            return Err(Refusal::TooLong);
        }
        match url.scheme() {
            "http" | "https" => {}
            other => return Err(Refusal::Scheme(other.to_owned())),
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(Refusal::Userinfo);
        }
        let host = Host::from_url_host(url.host().ok_or(Refusal::NoHost)?)?;
        let port = url.port_or_known_default().ok_or(Refusal::Port)?;
        if port == 0 {
            return Err(Refusal::Port);
        }
        match &host {
            Host::Ip(ip) => self.check(*ip)?,
            Host::Domain(name) => {
                if url.host_str() != Some(name.as_str()) {
                    url.set_host(Some(name)).map_err(|_| Refusal::InvalidHost)?;
                }
            }
        }
        Ok(CheckedUrl { url, host, port })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::AddressClass;

    fn policy() -> NetPolicy {
        NetPolicy::public_only()
    }

    /// URLs that must never get past the URL layer under the default policy, each with the
    /// category it must be refused for.
    const HOSTILE: &[(&str, &str)] = &[
        // Numeric spellings of loopback.
        ("http://127.0.0.1/", "loopback"),
        ("http://127.0.0.1:5432/", "loopback"),
        ("http://2130706433/", "loopback"),
        ("http://0x7f000001/", "loopback"),
        ("http://0x7f.1/", "loopback"),
        ("http://0x7f.0.0.1/", "loopback"),
        ("http://017700000001/", "loopback"),
        ("http://0177.0.0.1/", "loopback"),
        ("http://127.1/", "loopback"),
        ("http://127.0.1/", "loopback"),
        ("http://127.000.000.001/", "loopback"),
        ("http://127.0.0.1./", "loopback"),
        ("http://%31%32%37%2e%30%2e%30%2e%31/", "loopback"),
        ("http://①②⑦.⓪.⓪.①/", "loopback"),
        ("http://１２７.0.0.1/", "loopback"),
        ("http://127。0。0。1/", "loopback"),
        ("HTTP://127.0.0.1/", "loopback"),
        ("  http://127.0.0.1/  ", "loopback"),
        ("http://127.0.0.1\t/", "loopback"),
        ("http:/\\127.0.0.1/", "loopback"),
        ("http:127.0.0.1/", "loopback"),
        ("http:///127.0.0.1/", "loopback"),
        ("http://127.0.0.1#@example.com/", "loopback"),
        ("http://127.0.0.1\\@example.com/", "loopback"),
        ("http://127.0.0.1:80@example.com/", "userinfo"),
        ("https://127.0.0.1:443/", "loopback"),
        // IPv6 literals and IPv4 inside IPv6.
        ("http://[::1]/", "loopback"),
        ("http://[0:0:0:0:0:0:0:1]/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://[::ffff:7f00:1]/", "loopback"),
        ("http://[::127.0.0.1]/", "ipv4-compatible"),
        ("http://[::ffff:0:127.0.0.1]/", "ipv4-translated"),
        ("http://[64:ff9b::127.0.0.1]/", "nat64"),
        ("http://[2002:7f00:1::]/", "6to4"),
        ("http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", "teredo"),
        ("http://[::]/", "unspecified"),
        ("http://[fe80::1]/", "link-local"),
        ("http://[fd00::1]/", "unique-local"),
        ("http://[ff02::1]/", "multicast"),
        // Unspecified, private, metadata and the rest.
        ("http://0/", "unspecified"),
        ("http://0.0.0.0:8080/", "unspecified"),
        ("http://10.0.0.1/", "private"),
        ("http://172.16.5.4/", "private"),
        ("http://192.168.1.1/", "private"),
        ("http://0xc0a80101/", "private"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://0xa9fea9fe/", "metadata"),
        ("http://2852039166/", "metadata"),
        ("http://[::ffff:169.254.169.254]/", "metadata"),
        ("http://[fd00:ec2::254]/", "metadata"),
        ("http://100.100.100.200/", "metadata"),
        ("http://100.64.0.1/", "cgnat"),
        ("http://224.0.0.1/", "multicast"),
        ("http://255.255.255.255/", "broadcast"),
        ("http://192.0.2.1/", "documentation"),
        ("http://198.18.0.1/", "benchmarking"),
        // Names that are the local host by definition.
        ("http://localhost/", "localhost"),
        ("http://LOCALHOST./", "localhost"),
        ("http://localhost../", "localhost"),
        ("http://localhost:5432/", "localhost"),
        ("http://api.localhost/", "localhost"),
        ("http://ⓛⓞⓒⓐⓛⓗⓞⓢⓣ/", "localhost"),
        ("http://LocalHost.Localhost./", "localhost"),
        // Userinfo tricks.
        ("http://user@example.com/", "userinfo"),
        ("http://user:pass@example.com/", "userinfo"),
        ("http://:pass@example.com/", "userinfo"),
        ("http://example.com@127.0.0.1/", "userinfo"),
        ("http://a@127.0.0.1@evil.example/", "userinfo"),
        ("http://evil.example%40127.0.0.1@example.com/", "userinfo"),
        // Schemes other than http(s).
        ("file:///etc/passwd", "scheme"),
        ("gopher://127.0.0.1:6379/_INFO", "scheme"),
        ("ftp://example.com/", "scheme"),
        ("dict://127.0.0.1:11211/", "scheme"),
        ("javascript:alert(1)", "scheme"),
        ("data:text/html,hi", "scheme"),
        ("ws://example.com/", "scheme"),
        // Not URLs, or no usable host or port.
        ("example.com", "invalid-url"),
        ("http://", "invalid-url"),
        ("http://[fe80::1%25eth0]/", "invalid-url"),
        ("http://1.2.3.4.5/", "invalid-url"),
        ("http://256.0.0.1/", "invalid-url"),
        ("http://example.com:65536/", "invalid-url"),
        ("http://exa mple.com/", "invalid-url"),
        ("http://example.com:0/", "port"),
    ];

    #[test]
    fn hostile_urls_are_refused_for_the_right_reason() {
        assert!(HOSTILE.len() >= 40, "{}", HOSTILE.len());
        let p = policy();
        let mut wrong = Vec::new();
        for (url, reason) in HOSTILE {
            match p.check_url(url) {
                Ok(checked) => wrong.push(format!("{url:?} passed as {}", checked.url())),
                Err(r) if r.reason() != *reason => {
                    wrong.push(format!("{url:?} refused as {}, not {reason}", r.reason()));
                }
                Err(_) => {}
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn legitimate_urls_pass_with_their_host_and_port() {
        let p = policy();
        for (url, host, port) in [
            ("http://example.com/", "example.com", 80),
            ("https://example.com/a?b=c#d", "example.com", 443),
            ("https://EXAMPLE.com./path", "example.com", 443),
            ("http://example.com:8080/", "example.com", 8080),
            ("https://example.com:65535/", "example.com", 65535),
            ("http://localhost.example.com/", "localhost.example.com", 80),
            ("http://mylocalhost/", "mylocalhost", 80),
            ("https://bücher.example/", "xn--bcher-kva.example", 443),
            ("http://1.1.1.1/", "1.1.1.1", 80),
            ("http://8.8.8.8:53/", "8.8.8.8", 53),
            ("http://11.0.0.1/", "11.0.0.1", 80),
            ("http://172.32.0.1/", "172.32.0.1", 80),
            ("http://100.128.0.1/", "100.128.0.1", 80),
            ("http://192.169.0.1/", "192.169.0.1", 80),
            (
                "http://[2606:4700:4700::1111]/",
                "[2606:4700:4700::1111]",
                80,
            ),
            ("http://[::ffff:8.8.8.8]/", "[::ffff:8.8.8.8]", 80),
            ("http://134744072/", "8.8.8.8", 80),
            ("http://@example.com/", "example.com", 80),
        ] {
            let checked = p
                .check_url(url)
                .unwrap_or_else(|e| panic!("{url}: {e} ({})", e.reason()));
            assert_eq!(checked.host().to_string(), host, "{url}");
            assert_eq!(checked.port(), port, "{url}");
            if let Host::Domain(name) = checked.host() {
                assert_eq!(checked.url().host_str(), Some(name.as_str()), "{url}");
            }
        }
    }

    #[test]
    fn a_trailing_dot_is_removed_from_the_url_that_is_requested() {
        let checked = policy()
            .check_url("https://example.com.:8443/x?y#z")
            .unwrap();
        assert_eq!(checked.url().as_str(), "https://example.com:8443/x?y#z");
        assert_eq!(checked.host(), &Host::Domain("example.com".into()));
    }

    #[test]
    fn an_allow_listed_literal_passes_and_localhost_names_stay_refused() {
        let p = NetPolicy::new(&["127.0.0.1/32"]).unwrap();
        let checked = p.check_url("http://127.0.0.1:8080/page").unwrap();
        assert_eq!(checked.host().ip(), Some("127.0.0.1".parse().unwrap()));
        assert!(p.check_url("http://0x7f.1:8080/").is_ok());
        assert!(p.check_url("http://127.0.0.2/").is_err());
        assert!(p.check_url("http://[::1]/").is_err());
        assert_eq!(p.check_url("http://localhost/"), Err(Refusal::LocalName));
    }

    #[test]
    fn an_address_refusal_names_its_class_for_the_log_only() {
        let refusal = policy().check_url("http://0xa9fea9fe/").unwrap_err();
        assert_eq!(
            refusal,
            Refusal::Address {
                class: AddressClass::Metadata,
                ip: "169.254.169.254".parse().unwrap()
            }
        );
        let text = refusal.to_string();
        assert!(
            !text.contains("169.254") && !text.contains("metadata"),
            "{text}"
        );
    }

    #[test]
    fn an_overlong_url_is_refused_before_parsing() {
        let url = format!("http://example.com/{}", "a".repeat(MAX_URL_LEN));
        assert_eq!(policy().check_url(&url), Err(Refusal::TooLong));
    }

    #[test]
    fn hosts_of_authorities_parse_as_url_hosts_do() {
        for (input, expected) in [
            ("example.com", Host::Domain("example.com".into())),
            ("Example.COM.", Host::Domain("example.com".into())),
            ("0x7f000001", Host::Ip("127.0.0.1".parse().unwrap())),
            ("127.1", Host::Ip("127.0.0.1".parse().unwrap())),
            ("%31%32%37.0.0.1", Host::Ip("127.0.0.1".parse().unwrap())),
            ("::1", Host::Ip("::1".parse().unwrap())),
            ("[::1]", Host::Ip("::1".parse().unwrap())),
            (
                "::ffff:127.0.0.1",
                Host::Ip("::ffff:127.0.0.1".parse().unwrap()),
            ),
        ] {
            assert_eq!(Host::parse(input), Ok(expected), "{input}");
        }
        assert_eq!(Host::parse("localhost"), Err(Refusal::LocalName));
        assert_eq!(Host::parse("a.localhost."), Err(Refusal::LocalName));
        for bad in ["", "exa mple", "1.2.3.4.5", "fe80::1%eth0", "[::1", "a/b"] {
            assert!(Host::parse(bad).is_err(), "{bad:?}");
        }
        let long = format!("{}.com", "a.".repeat(130));
        assert_eq!(Host::parse(&long), Err(Refusal::InvalidHost));
    }
}
