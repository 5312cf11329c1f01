//! The policy: the public internet, plus what the operator's allow-list names.
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cidr::{Cidr, CidrError, canonical};
use crate::classify::{AddressClass, classify};
use crate::refusal::Refusal;

/// Which addresses may be reached: every public address, and the non-public networks the
/// operator allow-lists (`sandbox.egress_allow_cidrs`, e.g. an internal package mirror, or a test
/// server on loopback). The default is the public internet only. With
/// [`NetPolicy::refusing_this_host`], the addresses of this host's own interfaces are refused
/// too (a public address the service listens on is not the internet).
#[derive(Debug, Clone, Default)]
pub struct NetPolicy {
    allow: Vec<Cidr>,
    this_host: Option<Arc<ThisHost>>,
}

impl PartialEq for NetPolicy {
    fn eq(&self, other: &Self) -> bool {
        self.allow == other.allow && self.this_host.is_some() == other.this_host.is_some()
    }
}

impl Eq for NetPolicy {}

/// How long the host's interface addresses are trusted before they are read again.
const THIS_HOST_REFRESH: Duration = Duration::from_secs(30);

/// This host's interface addresses, read with `getifaddrs` and read again when older than
/// [`THIS_HOST_REFRESH`] (an interface may come up later: a new TAP, a DHCP lease).
#[derive(Debug)]
struct ThisHost {
    read: Mutex<(Option<Instant>, Arc<Vec<IpAddr>>)>,
    /// `interface_addresses`, or a stand-in in tests.
    reader: fn() -> Result<Vec<IpAddr>, nix::Error>,
}

impl ThisHost {
    /// The addresses, or `None` while they have never been read: then no address can be told
    /// apart from this host's, and the policy refuses every one it would have let through
    /// (fail closed).
    fn addresses(&self) -> Option<Arc<Vec<IpAddr>>> {
        let Ok(mut read) = self.read.lock() else {
            return None;
        };
        if read.0.is_none_or(|at| at.elapsed() >= THIS_HOST_REFRESH) {
            // A failed read keeps what was read last, and is tried again at the next check.
            match (self.reader)() {
                Ok(addrs) => *read = (Some(Instant::now()), Arc::new(addrs)),
                Err(e) if read.0.is_none() => {
                    // Once per process: every check would say it again.
                    static SAID: std::sync::atomic::AtomicBool =
                        std::sync::atomic::AtomicBool::new(false);
                    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        tracing::error!(error = %e, "this host's interface addresses cannot be read; every destination is refused until they can");
                    }
                }
                Err(_) => {}
            }
        }
        read.0.map(|_| read.1.clone())
    }
}

/// The addresses of this host's interfaces, as the classifier sees them.
fn interface_addresses() -> Result<Vec<IpAddr>, nix::Error> {
    let mut out: Vec<IpAddr> = nix::ifaddrs::getifaddrs()?
        .filter_map(|ifa| ifa.address)
        .filter_map(|a| {
            if let Some(v4) = a.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .map(canonical)
        .collect();
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

impl NetPolicy {
    /// The public internet plus the operator's allow-list (CIDRs or bare addresses).
    pub fn new<S: AsRef<str>>(allow: &[S]) -> Result<Self, CidrError> {
        Ok(Self {
            allow: allow
                .iter()
                .map(|s| Cidr::parse(s.as_ref()))
                .collect::<Result<_, _>>()?,
            this_host: None,
        })
    }

    /// The same policy, also refusing this host's own interface addresses (unless the
    /// allow-list names them). What the service uses; tests of the tables leave it out.
    pub fn refusing_this_host(mut self) -> Self {
        self.this_host = Some(Arc::new(ThisHost {
            read: Mutex::new((None, Arc::new(Vec::new()))),
            reader: interface_addresses,
        }));
        self
    }

    /// The public internet only.
    pub fn public_only() -> Self {
        Self::default()
    }

    /// The operator's allow-list.
    pub fn allowed(&self) -> &[Cidr] {
        &self.allow
    }

    /// Refuses `ip` unless it is public or allow-listed. The refusal names the address class
    /// (for the log).
    pub fn check(&self, ip: IpAddr) -> Result<(), Refusal> {
        let ip = canonical(ip);
        if self.allow.iter().any(|c| c.contains(ip)) {
            return Ok(());
        }
        match classify(ip) {
            None => {}
            Some(class) => return Err(Refusal::Address { class, ip }),
        }
        if let Some(this_host) = &self.this_host
            && this_host.addresses().is_none_or(|ours| ours.contains(&ip))
        {
            return Err(Refusal::Address {
                class: AddressClass::ThisHost,
                ip,
            });
        }
        Ok(())
    }

    pub fn permits(&self, ip: IpAddr) -> bool {
        self.check(ip).is_ok()
    }

    /// Checks a whole resolution answer: refused if any address in it is refused (a name that
    /// answers with a public and a private address is refused, whichever comes first), and if
    /// it is empty.
    pub fn check_all(&self, ips: &[IpAddr]) -> Result<(), Refusal> {
        if ips.is_empty() {
            return Err(Refusal::NoAddress);
        }
        ips.iter().try_for_each(|ip| self.check(*ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_default_policy_refuses_non_public_addresses_and_permits_public_ones() {
        let p = NetPolicy::public_only();
        for refused in [
            "127.0.0.1",
            "10.1.2.3",
            "169.254.169.254",
            "::1",
            "::ffff:127.0.0.1",
            "64:ff9b::7f00:1",
        ] {
            assert!(!p.permits(ip(refused)), "{refused}");
        }
        for public in ["1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8"] {
            assert!(p.permits(ip(public)), "{public}");
        }
        assert_eq!(
            p.check(ip("169.254.169.254")).unwrap_err().reason(),
            "metadata"
        );
    }

    #[test]
    fn this_hosts_own_addresses_are_refused_unless_allow_listed() {
        let addrs = interface_addresses().unwrap();
        assert!(addrs.contains(&ip("127.0.0.1")), "{addrs:?}");
        // Every address of this host is refused by the service's policy, whatever its class
        // (a public address on an interface included)...
        let p = NetPolicy::public_only().refusing_this_host();
        for a in &addrs {
            assert!(!p.permits(*a), "{a} is this host's");
        }
        // ...a public address elsewhere is not, and the allow-list still opens a host address.
        assert!(p.permits(ip("1.1.1.1")) || addrs.contains(&ip("1.1.1.1")));
        let allowed = NetPolicy::new(&["127.0.0.1/32"])
            .unwrap()
            .refusing_this_host();
        assert!(allowed.permits(ip("127.0.0.1")));
        // A public interface address is refused as this host's, not by any table (this test
        // machine has none, so one is given).
        let given = NetPolicy {
            allow: Vec::new(),
            this_host: Some(Arc::new(ThisHost {
                read: Mutex::new((Some(Instant::now()), Arc::new(vec![ip("203.0.114.7")]))),
                reader: interface_addresses,
            })),
        };
        assert_eq!(classify(ip("203.0.114.7")), None);
        assert_eq!(
            given.check(ip("203.0.114.7")).unwrap_err().reason(),
            "this-host"
        );
        assert!(given.permits(ip("203.0.114.8")));
    }

    #[test]
    fn while_this_hosts_addresses_cannot_be_read_only_the_allow_list_is_reachable() {
        fn failing() -> Result<Vec<IpAddr>, nix::Error> {
            Err(nix::Error::EMFILE)
        }
        let p = NetPolicy {
            allow: vec![Cidr::parse("127.0.0.1/32").unwrap()],
            this_host: Some(Arc::new(ThisHost {
                read: Mutex::new((None, Arc::new(Vec::new()))),
                reader: failing,
            })),
        };
        assert_eq!(p.check(ip("1.1.1.1")).unwrap_err().reason(), "this-host");
        assert!(p.permits(ip("127.0.0.1")));
        // Once read, the rest of the internet is open again; a later failure keeps that read.
        let p = NetPolicy {
            allow: Vec::new(),
            this_host: Some(Arc::new(ThisHost {
                read: Mutex::new((
                    Some(Instant::now() - THIS_HOST_REFRESH * 2),
                    Arc::new(vec![ip("203.0.114.7")]),
                )),
                reader: failing,
            })),
        };
        assert!(p.permits(ip("1.1.1.1")));
        assert!(!p.permits(ip("203.0.114.7")));
    }

    #[test]
    fn the_allow_list_opens_exactly_what_it_names() {
        let p = NetPolicy::new(&["127.0.0.1/32", "10.0.0.0/8"]).unwrap();
        assert!(p.permits(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert!(p.permits(ip("::ffff:127.0.0.1")));
        assert!(!p.permits(ip("127.0.0.2")));
        assert!(p.permits(ip("10.9.9.9")));
        assert!(!p.permits(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert!(!p.permits(ip("192.168.0.1")));
        // Public addresses stay reachable with an allow-list.
        assert!(p.permits(ip("1.1.1.1")));
        assert!(NetPolicy::new(&["nonsense"]).is_err());
        assert!(NetPolicy::new(&["10.0.0.0/33".to_owned()]).is_err());
    }

    #[test]
    fn an_answer_mixing_public_and_private_addresses_is_refused_whole() {
        let p = NetPolicy::public_only();
        assert_eq!(p.check_all(&[ip("8.8.8.8"), ip("1.1.1.1")]), Ok(()));
        for answer in [
            vec![ip("8.8.8.8"), ip("127.0.0.1")],
            vec![ip("127.0.0.1"), ip("8.8.8.8")],
            vec![ip("2606:4700:4700::1111"), ip("fd00:ec2::254")],
        ] {
            let refusal = p.check_all(&answer).unwrap_err();
            assert!(refusal.is_non_public(), "{answer:?}");
        }
        let refusal = p
            .check_all(&[ip("8.8.8.8"), ip("169.254.169.254")])
            .unwrap_err();
        assert_eq!(
            refusal,
            Refusal::Address {
                class: AddressClass::Metadata,
                ip: ip("169.254.169.254")
            }
        );
        assert_eq!(p.check_all(&[]), Err(Refusal::NoAddress));
    }

    #[test]
    fn the_text_for_the_model_never_names_the_address() {
        let p = NetPolicy::public_only();
        for refused in ["127.0.0.1", "169.254.169.254", "fd00:ec2::254", "10.0.0.7"] {
            let refusal = p.check(ip(refused)).unwrap_err();
            let text = refusal.to_string();
            assert!(!text.contains(refused), "{text}");
            assert!(!text.contains(refusal.reason()), "{text}");
            assert_eq!(refusal.address(), Some(ip(refused)));
        }
    }

    proptest! {
        #[test]
        fn an_answer_is_permitted_exactly_when_each_of_its_addresses_is(
            answer in proptest::collection::vec(any::<u32>().prop_map(|b| IpAddr::V4(Ipv4Addr::from(b))), 1..6)
        ) {
            let p = NetPolicy::new(&["10.0.0.0/8"]).unwrap();
            prop_assert_eq!(p.check_all(&answer).is_ok(), answer.iter().all(|a| p.permits(*a)));
        }
    }
}
