//! Why a destination was refused: a category for the log, and a text for the model that does
//! not say what the address was (the model may be steered by whoever controls the page or the
//! DNS name, and the refusal must not become a way to map the network it runs in).
use std::net::IpAddr;

use crate::classify::AddressClass;

/// What the model (or a sandboxed command) is told when the destination is not public.
pub const UNREACHABLE: &str = "this destination is not reachable from here: it is non-public, and the service connects only to the public internet";

/// The longest URL the policy looks at, in bytes: longer ones are refused before parsing.
pub const MAX_URL_LEN: usize = 8 * 1024;

/// A destination the network policy refuses. `Display` is the text for the model: it never
/// names an address. [`Refusal::reason`] and [`Refusal::address`] are for the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// An address (a literal host, or one the name resolved to) that is not public and not on
    /// the operator's allow-list.
    #[error("{UNREACHABLE}")]
    Address { class: AddressClass, ip: IpAddr },
    /// `localhost` or a name under `.localhost` (RFC 6761: always the local host).
    #[error("{UNREACHABLE}")]
    LocalName,
    /// The name resolved to no address at all.
    #[error("the host name has no address")]
    NoAddress,
    #[error("not a valid URL: {0}")]
    InvalidUrl(url::ParseError),
    #[error("only http and https URLs can be fetched, not {0}:")]
    Scheme(String),
    #[error("URLs with a user name or password are not allowed")]
    Userinfo,
    #[error("the URL has no host")]
    NoHost,
    #[error("not a valid host name")]
    InvalidHost,
    #[error("port 0 is not a destination")]
    Port,
    #[error("the URL is longer than {MAX_URL_LEN} bytes")]
    TooLong,
}

impl Refusal {
    /// A stable category for logs and metrics: the address class (`loopback`, `private`,
    /// `metadata`, …) or what was wrong with the URL (`scheme`, `userinfo`, …).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Address { class, .. } => class.as_str(),
            Self::LocalName => "localhost",
            Self::NoAddress => "no-address",
            Self::InvalidUrl(_) => "invalid-url",
            Self::Scheme(_) => "scheme",
            Self::Userinfo => "userinfo",
            Self::NoHost => "no-host",
            Self::InvalidHost => "invalid-host",
            Self::Port => "port",
            Self::TooLong => "too-long",
        }
    }

    /// The refused address, for the log only.
    pub fn address(&self) -> Option<IpAddr> {
        match self {
            Self::Address { ip, .. } => Some(*ip),
            _ => None,
        }
    }

    /// Whether the destination was refused for where it is (as opposed to how it was written).
    pub fn is_non_public(&self) -> bool {
        matches!(self, Self::Address { .. } | Self::LocalName)
    }
}
