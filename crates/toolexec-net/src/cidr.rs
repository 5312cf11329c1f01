//! Networks in CIDR form, as the operator writes them in an allow-list.
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A network in CIDR form (`10.0.0.0/8`, `fd00::/8`, or a bare address as a /32 or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// An allow-list entry that is not a network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error("'{0}' is not an IP address or CIDR")]
    NotAnAddress(String),
    #[error("'{entry}': prefix must be 0 to {max}")]
    Prefix { entry: String, max: u8 },
}

impl Cidr {
    pub(crate) const fn v4(a: u8, b: u8, c: u8, d: u8, prefix: u8) -> Self {
        Self {
            addr: IpAddr::V4(Ipv4Addr::new(a, b, c, d)),
            prefix,
        }
    }

    pub(crate) const fn v6(segments: [u16; 8], prefix: u8) -> Self {
        let [a, b, c, d, e, f, g, h] = segments;
        Self {
            addr: IpAddr::V6(Ipv6Addr::new(a, b, c, d, e, f, g, h)),
            prefix,
        }
    }

    /// `10.0.0.0/8`, `fd00::/8`, or a bare address (a /32 or /128). An IPv4-mapped IPv6 network
    /// (`::ffff:10.0.0.0/104`) is stored as the IPv4 network it maps, since addresses are
    /// compared in that form too.
    pub fn parse(s: &str) -> Result<Self, CidrError> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| CidrError::NotAnAddress(s.to_owned()))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| CidrError::Prefix {
                    entry: s.to_owned(),
                    max,
                })?,
            None => max,
        };
        if let IpAddr::V6(v6) = addr
            && let Some(v4) = v6.to_ipv4_mapped()
            && prefix >= 96
        {
            return Ok(Self {
                addr: IpAddr::V4(v4),
                prefix: prefix - 96,
            });
        }
        Ok(Self { addr, prefix })
    }

    /// Whether `ip` lies in this network; an IPv4-mapped IPv6 address counts as the IPv4 address
    /// it carries (`::ffff:127.0.0.1` is in `127.0.0.0/8`).
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.contains_exact(canonical(ip))
    }

    /// Whether `ip`, taken as written (no unwrapping), lies in this network.
    pub(crate) fn contains_exact(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
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

    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) as the IPv4 address it carries; any other
/// address unchanged. Only the mapped form: the IPv4-compatible `::a.b.c.d` is deprecated and
/// refused as such by the classifier.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_bare_address_is_a_single_host_network() {
        let c = Cidr::parse("127.0.0.1").unwrap();
        assert_eq!(c.to_string(), "127.0.0.1/32");
        assert!(c.contains(ip("127.0.0.1")));
        assert!(!c.contains(ip("127.0.0.2")));
        let c = Cidr::parse("::1").unwrap();
        assert_eq!(c.to_string(), "::1/128");
        assert!(c.contains(ip("::1")));
        assert!(!c.contains(ip("::2")));
    }

    #[test]
    fn a_network_contains_exactly_its_range() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains(ip("10.0.0.0")));
        assert!(c.contains(ip("10.255.255.255")));
        assert!(!c.contains(ip("11.0.0.0")));
        assert!(!c.contains(ip("9.255.255.255")));
        let c = Cidr::parse("fd00::/8").unwrap();
        assert!(c.contains(ip("fd12::1")));
        assert!(!c.contains(ip("fc00::1")));
        // Host bits in the entry are ignored, as in routing tables.
        assert!(Cidr::parse("10.1.2.3/8").unwrap().contains(ip("10.9.9.9")));
        // /0 is everything of its family, and nothing of the other.
        let all4 = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all4.contains(ip("203.0.113.9")));
        assert!(!all4.contains(ip("2001:db8::1")));
    }

    #[test]
    fn mapped_addresses_match_their_ipv4_network_and_mapped_entries_become_ipv4() {
        let c = Cidr::parse("127.0.0.0/8").unwrap();
        assert!(c.contains(ip("::ffff:127.0.0.1")));
        let mapped = Cidr::parse("::ffff:10.0.0.0/104").unwrap();
        assert_eq!(mapped.to_string(), "10.0.0.0/8");
        assert!(mapped.contains(ip("10.1.1.1")));
        assert!(mapped.contains(ip("::ffff:10.1.1.1")));
        assert!(!mapped.contains(ip("11.0.0.0")));
    }

    #[test]
    fn entries_that_are_not_networks_are_errors() {
        for bad in [
            "nonsense",
            "",
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/-1",
            "10.0.0.0/x",
            "10.0.0/8",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad:?} must not parse");
        }
        assert_eq!(
            Cidr::parse("10.0.0.0/33").unwrap_err().to_string(),
            "'10.0.0.0/33': prefix must be 0 to 32"
        );
    }
}
