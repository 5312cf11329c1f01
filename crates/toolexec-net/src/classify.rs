//! The address classifier: which addresses are not the public internet, and why.
//!
//! Ours and explicit, because `std`'s `is_global` is unstable and its stable predicates miss
//! `0.0.0.0/8`, CGNAT, `192.0.0.0/24`, NAT64, 6to4 and Teredo. The tables follow the IANA IPv4 and
//! IPv6 special-purpose address registries, plus the cloud metadata addresses. The first entry
//! that contains an address decides its class, so narrower entries come before wider ones.
//!
//! This module decides what an address *is*; whether it may be reached is [`crate::NetPolicy`]'s
//! call (the operator's allow-list comes first).
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::cidr::Cidr;

/// Why an address is not treated as the public internet. Shown in logs, never to the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AddressClass {
    /// A cloud provider's instance metadata or credentials service.
    Metadata,
    /// `0.0.0.0/8` ("this network": `0.0.0.0` reaches the local host on Linux) and `::`.
    Unspecified,
    Loopback,
    /// RFC 1918: `10/8`, `172.16/12`, `192.168/16`.
    Private,
    /// `169.254/16`, `fe80::/10`.
    LinkLocal,
    /// Carrier-grade NAT shared space, `100.64/10` (often a provider's internal network).
    Cgnat,
    /// `fc00::/7`.
    UniqueLocal,
    /// `fec0::/10`, deprecated but still routed inside some networks.
    SiteLocal,
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// `192.0.2/24`, `198.51.100/24`, `203.0.113/24`, `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// `198.18/15`.
    Benchmarking,
    /// IETF protocol assignments: `192.0.0/24`, `2001::/23` (outside Teredo).
    IetfProtocol,
    /// The deprecated 6to4 relay anycast `192.88.99/24`.
    Relay6to4,
    /// The discard-only prefix `100::/64`.
    Discard,
    /// `::a.b.c.d` (deprecated IPv4-compatible).
    Ipv4Compatible,
    /// `::ffff:0:a.b.c.d` (SIIT IPv4-translated).
    Ipv4Translated,
    /// `64:ff9b::/96`, `64:ff9b:1::/48`: a translator would reach the embedded IPv4 address.
    Nat64,
    /// `2002::/16`: a relay would reach the embedded IPv4 address.
    SixToFour,
    /// `2001::/32`.
    Teredo,
    /// `240/4`, and IPv6 outside the global unicast `2000::/3` that no entry above names: space no
    /// registry has handed out, so no public host lives there.
    Reserved,
    /// An address of one of this host's own interfaces (a public address the service itself
    /// may listen on): not in any table, found with `getifaddrs`.
    ThisHost,
}

impl AddressClass {
    /// A stable name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Metadata => "metadata",
            Self::Unspecified => "unspecified",
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::LinkLocal => "link-local",
            Self::Cgnat => "cgnat",
            Self::UniqueLocal => "unique-local",
            Self::SiteLocal => "site-local",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::Documentation => "documentation",
            Self::Benchmarking => "benchmarking",
            Self::IetfProtocol => "ietf-protocol",
            Self::Relay6to4 => "6to4-relay",
            Self::Discard => "discard",
            Self::ThisHost => "this-host",
            Self::Ipv4Compatible => "ipv4-compatible",
            Self::Ipv4Translated => "ipv4-translated",
            Self::Nat64 => "nat64",
            Self::SixToFour => "6to4",
            Self::Teredo => "teredo",
            Self::Reserved => "reserved",
        }
    }
}

impl fmt::Display for AddressClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

use AddressClass as C;

const V4: &[(Cidr, AddressClass)] = &[
    // AWS, GCP, Azure, OpenStack, Firecracker MMDS (inside link-local, named for the log).
    (Cidr::v4(169, 254, 169, 254, 32), C::Metadata),
    // AWS ECS task metadata and credentials.
    (Cidr::v4(169, 254, 170, 2, 32), C::Metadata),
    // Alibaba Cloud (inside CGNAT).
    (Cidr::v4(100, 100, 100, 200, 32), C::Metadata),
    (Cidr::v4(0, 0, 0, 0, 8), C::Unspecified),
    (Cidr::v4(10, 0, 0, 0, 8), C::Private),
    (Cidr::v4(100, 64, 0, 0, 10), C::Cgnat),
    (Cidr::v4(127, 0, 0, 0, 8), C::Loopback),
    (Cidr::v4(169, 254, 0, 0, 16), C::LinkLocal),
    (Cidr::v4(172, 16, 0, 0, 12), C::Private),
    (Cidr::v4(192, 0, 0, 0, 24), C::IetfProtocol),
    (Cidr::v4(192, 0, 2, 0, 24), C::Documentation),
    (Cidr::v4(192, 88, 99, 0, 24), C::Relay6to4),
    (Cidr::v4(192, 168, 0, 0, 16), C::Private),
    (Cidr::v4(198, 18, 0, 0, 15), C::Benchmarking),
    (Cidr::v4(198, 51, 100, 0, 24), C::Documentation),
    (Cidr::v4(203, 0, 113, 0, 24), C::Documentation),
    (Cidr::v4(224, 0, 0, 0, 4), C::Multicast),
    (Cidr::v4(255, 255, 255, 255, 32), C::Broadcast),
    (Cidr::v4(240, 0, 0, 0, 4), C::Reserved),
];

const V6: &[(Cidr, AddressClass)] = &[
    // AWS instance metadata over IPv6 (inside unique-local).
    (
        Cidr::v6([0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254], 128),
        C::Metadata,
    ),
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 0], 128), C::Unspecified),
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 1], 128), C::Loopback),
    (Cidr::v6([0, 0, 0, 0, 0, 0, 0, 0], 96), C::Ipv4Compatible),
    // (`::ffff:0:0/96`, IPv4-mapped, is unwrapped before this table.)
    (
        Cidr::v6([0, 0, 0, 0, 0xffff, 0, 0, 0], 96),
        C::Ipv4Translated,
    ),
    (Cidr::v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96), C::Nat64),
    (Cidr::v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48), C::Nat64),
    (Cidr::v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64), C::Discard),
    (Cidr::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32), C::Teredo),
    (Cidr::v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23), C::IetfProtocol),
    (
        Cidr::v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32),
        C::Documentation,
    ),
    (Cidr::v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16), C::SixToFour),
    (
        Cidr::v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20),
        C::Documentation,
    ),
    (Cidr::v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7), C::UniqueLocal),
    (Cidr::v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10), C::LinkLocal),
    (Cidr::v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10), C::SiteLocal),
    (Cidr::v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8), C::Multicast),
];

/// IPv6 global unicast; anything outside it (and not named above) is reserved space.
const GLOBAL_UNICAST_V6: Cidr = Cidr::v6([0x2000, 0, 0, 0, 0, 0, 0, 0], 3);

/// What kind of non-public address `ip` is, or `None` for the public internet.
///
/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is classified as the IPv4 address it carries,
/// since a dual-stack socket connecting to it reaches that address.
pub fn classify(ip: IpAddr) -> Option<AddressClass> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<AddressClass> {
    lookup(V4, IpAddr::V4(ip))
}

fn classify_v6(ip: Ipv6Addr) -> Option<AddressClass> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return classify_v4(v4);
    }
    let ip = IpAddr::V6(ip);
    lookup(V6, ip).or_else(|| (!GLOBAL_UNICAST_V6.contains_exact(ip)).then_some(C::Reserved))
}

fn lookup(table: &[(Cidr, AddressClass)], ip: IpAddr) -> Option<AddressClass> {
    table
        .iter()
        .find(|(net, _)| net.contains_exact(ip))
        .map(|(_, class)| *class)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn class(s: &str) -> Option<AddressClass> {
        classify(s.parse().unwrap())
    }

    /// Every address in `refused` has `expected`; every address in `allowed` is public.
    fn range(expected: AddressClass, refused: &[&str], allowed: &[&str]) {
        for ip in refused {
            assert_eq!(class(ip), Some(expected), "{ip} must be {expected}");
        }
        for ip in allowed {
            assert_eq!(
                class(ip),
                None,
                "{ip} is public (next to the {expected} range)"
            );
        }
    }

    #[test]
    fn the_tables_hold_networks_without_host_bits() {
        for (net, _) in V4.iter().chain(V6) {
            let again = Cidr::parse(&net.to_string()).unwrap();
            assert!(net.contains_exact(net.addr()), "{net}");
            // The entry's address is its network address: masking changes nothing.
            let (bits, max) = match net.addr() {
                IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
                IpAddr::V6(a) => (u128::from(a), 128),
            };
            let host_bits = if net.prefix() == max {
                0
            } else {
                bits & (u128::MAX >> (128 - u32::from(max) + u32::from(net.prefix())))
            };
            assert_eq!(host_bits, 0, "{net} has host bits set");
            assert_eq!(again, *net);
        }
    }

    #[test]
    fn this_network_and_unspecified_are_refused() {
        range(
            C::Unspecified,
            &["0.0.0.0", "0.0.0.1", "0.255.255.255", "::"],
            &["1.0.0.0", "1.0.0.1"],
        );
    }

    #[test]
    fn loopback_is_refused() {
        range(
            C::Loopback,
            &[
                "127.0.0.1",
                "127.0.0.0",
                "127.1.2.3",
                "127.255.255.255",
                "::1",
            ],
            &["126.255.255.255", "128.0.0.1", "128.0.0.0"],
        );
    }

    #[test]
    fn rfc1918_private_ranges_are_refused_and_their_neighbours_are_not() {
        range(
            C::Private,
            &[
                "10.0.0.0",
                "10.0.0.1",
                "10.255.255.255",
                "172.16.0.0",
                "172.16.0.1",
                "172.31.255.255",
                "192.168.0.0",
                "192.168.1.1",
                "192.168.255.255",
            ],
            &[
                "9.255.255.255",
                "11.0.0.1",
                "11.0.0.0",
                "172.15.255.255",
                "172.32.0.1",
                "172.32.0.0",
                "192.167.255.255",
                "192.169.0.1",
                "192.169.0.0",
            ],
        );
    }

    #[test]
    fn link_local_is_refused() {
        range(
            C::LinkLocal,
            &[
                "169.254.0.0",
                "169.254.0.1",
                "169.254.255.255",
                "169.254.169.253",
                "fe80::",
                "fe80::1",
                "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            ],
            &["169.253.255.255", "169.255.0.0"],
        );
    }

    #[test]
    fn cgnat_shared_space_is_refused() {
        range(
            C::Cgnat,
            &["100.64.0.0", "100.64.0.1", "100.127.255.255", "100.100.1.1"],
            &["100.63.255.255", "100.128.0.1", "100.128.0.0"],
        );
    }

    #[test]
    fn cloud_metadata_addresses_are_refused_as_metadata() {
        range(
            C::Metadata,
            &[
                "169.254.169.254",
                "169.254.170.2",
                "100.100.100.200",
                "fd00:ec2::254",
                "::ffff:169.254.169.254",
                "::ffff:a9fe:a9fe",
            ],
            &[],
        );
        // Their neighbours are still refused, by their range.
        assert_eq!(class("169.254.169.255"), Some(C::LinkLocal));
        assert_eq!(class("100.100.100.201"), Some(C::Cgnat));
        assert_eq!(class("fd00:ec2::253"), Some(C::UniqueLocal));
    }

    #[test]
    fn unique_local_and_site_local_are_refused() {
        range(
            C::UniqueLocal,
            &[
                "fc00::",
                "fc00::1",
                "fd12:3456::1",
                "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            ],
            &[],
        );
        range(
            C::SiteLocal,
            &[
                "fec0::",
                "fec0::1",
                "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            ],
            &[],
        );
        // Between the two, and just before unique-local, lies reserved space.
        assert_eq!(class("fe00::1"), Some(C::Reserved));
        assert_eq!(class("fbff:ffff::1"), Some(C::Reserved));
    }

    #[test]
    fn multicast_broadcast_and_reserved_ipv4_are_refused() {
        range(
            C::Multicast,
            &[
                "224.0.0.0",
                "224.0.0.1",
                "239.255.255.255",
                "233.252.0.1",
                "ff02::1",
                "ff00::",
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            ],
            &["223.255.255.255"],
        );
        range(C::Broadcast, &["255.255.255.255"], &[]);
        range(
            C::Reserved,
            &["240.0.0.0", "240.0.0.1", "255.255.255.254", "250.1.2.3"],
            &[],
        );
    }

    #[test]
    fn documentation_ranges_are_refused() {
        range(
            C::Documentation,
            &[
                "192.0.2.0",
                "192.0.2.1",
                "192.0.2.255",
                "198.51.100.0",
                "198.51.100.255",
                "203.0.113.0",
                "203.0.113.255",
                "2001:db8::",
                "2001:db8::1",
                "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
                "3fff::",
                "3fff:fff:ffff::1",
            ],
            &[
                "192.0.3.0",
                "198.51.99.255",
                "198.51.101.0",
                "203.0.112.255",
                "203.0.114.0",
                "2001:db7::1",
                "2001:db9::1",
                "3fff:1000::1",
                "3ffe:ffff::1",
            ],
        );
    }

    #[test]
    fn benchmarking_and_ietf_protocol_ranges_are_refused() {
        range(
            C::Benchmarking,
            &["198.18.0.0", "198.18.0.1", "198.19.255.255"],
            &["198.17.255.255", "198.20.0.0"],
        );
        range(
            C::IetfProtocol,
            &[
                "192.0.0.0",
                "192.0.0.8",
                "192.0.0.255",
                "2001:1::1",
                "2001:2::1",
                "2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff",
            ],
            &["192.0.1.0", "191.255.255.255", "2001:200::1"],
        );
        range(
            C::Relay6to4,
            &["192.88.99.0", "192.88.99.1", "192.88.99.255"],
            &["192.88.98.255", "192.88.100.0"],
        );
    }

    #[test]
    fn discard_only_ipv6_is_refused() {
        range(
            C::Discard,
            &["100::", "100::1", "100::ffff:ffff:ffff:ffff"],
            &[],
        );
        // Just past the /64 is unallocated space outside 2000::/3.
        assert_eq!(class("100:0:0:1::"), Some(C::Reserved));
    }

    #[test]
    fn ipv4_mapped_addresses_are_classified_as_the_ipv4_they_carry() {
        assert_eq!(class("::ffff:127.0.0.1"), Some(C::Loopback));
        assert_eq!(class("::ffff:7f00:1"), Some(C::Loopback));
        assert_eq!(class("::ffff:10.0.0.1"), Some(C::Private));
        assert_eq!(class("::ffff:0.0.0.0"), Some(C::Unspecified));
        assert_eq!(class("::ffff:100.64.0.1"), Some(C::Cgnat));
        assert_eq!(class("::ffff:8.8.8.8"), None);
        assert_eq!(class("::ffff:1.1.1.1"), None);
    }

    #[test]
    fn addresses_embedding_ipv4_through_a_translator_are_refused_whole() {
        // Whatever they carry: a public IPv4 inside is refused too, since the translator, not
        // this service, decides where it ends up.
        range(
            C::Ipv4Compatible,
            &["::7f00:1", "::127.0.0.1", "::8.8.8.8", "::2", "::ffff"],
            &[],
        );
        range(
            C::Ipv4Translated,
            &["::ffff:0:7f00:1", "::ffff:0:808:808"],
            &[],
        );
        range(
            C::Nat64,
            &[
                "64:ff9b::7f00:1",
                "64:ff9b::808:808",
                "64:ff9b::a9fe:a9fe",
                "64:ff9b:1::1",
                "64:ff9b:1:ffff:ffff:ffff:ffff:ffff",
            ],
            &[],
        );
        range(
            C::SixToFour,
            &[
                "2002::",
                "2002:7f00:1::",
                "2002:a9fe:a9fe::1",
                "2002:ffff::1",
            ],
            &["2003::1"],
        );
        range(
            C::Teredo,
            &["2001::", "2001::1", "2001:0:4136:e378:8000:63bf:3fff:fdd2"],
            &[],
        );
        // Neighbours of NAT64 outside 2000::/3 are reserved, not public.
        assert_eq!(class("64:ff9b:2::1"), Some(C::Reserved));
    }

    #[test]
    fn ipv6_outside_global_unicast_is_reserved() {
        for ip in ["4000::1", "8000::1", "1::1", "1fff:ffff::1", "e000::1"] {
            assert_eq!(class(ip), Some(C::Reserved), "{ip}");
        }
    }

    #[test]
    fn public_addresses_stay_allowed() {
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "9.9.9.9",
            "11.0.0.1",
            "93.184.215.14",
            "172.32.0.1",
            "172.15.255.255",
            "100.128.0.1",
            "100.63.255.255",
            "192.169.0.1",
            "223.255.255.254",
            "::ffff:8.8.8.8",
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "2a00:1450:4001:82a::200e",
            "2000::1",
            "3ffe::1",
            "2620:fe::fe",
        ] {
            assert_eq!(class(ip), None, "{ip} is public");
        }
    }

    proptest! {
        #[test]
        fn a_mapped_address_is_classified_like_the_ipv4_it_carries(bits: u32) {
            let v4 = Ipv4Addr::from(bits);
            prop_assert_eq!(classify(IpAddr::V6(v4.to_ipv6_mapped())), classify(IpAddr::V4(v4)));
        }

        #[test]
        fn the_nat64_6to4_and_teredo_forms_of_any_ipv4_are_refused(bits: u32) {
            let v4 = Ipv4Addr::from(bits).octets();
            let hi = u16::from_be_bytes([v4[0], v4[1]]);
            let lo = u16::from_be_bytes([v4[2], v4[3]]);
            for v6 in [
                Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo),
                Ipv6Addr::new(0x2002, hi, lo, 0, 0, 0, 0, 1),
                Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, !hi, !lo),
            ] {
                prop_assert!(classify(IpAddr::V6(v6)).is_some(), "{} passed", v6);
            }
        }
    }
}
