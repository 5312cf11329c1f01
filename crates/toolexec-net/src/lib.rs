//! The one network policy of toolexec: what the service connects to on behalf of a session,
//! whether for the shell's egress proxy or for the web tools. One classifier, one operator
//! allow-list, one set of tests.
//!
//! - [`classify()`]: which addresses are not the public internet, and why (our own tables, not
//!   `std`'s unstable `is_global`);
//! - [`NetPolicy`]: the public internet plus the operator's allow-list; an answer with one
//!   refused address is refused whole;
//! - [`NetPolicy::check_url`]: the URL layer (scheme, userinfo, host spelling, port), on the host
//!   as the WHATWG parser reads it;
//! - [`connect_checked`]: the dial layer: one resolution, every address checked, a connection to
//!   a checked address only.
//!
//! It decides and dials; it does not speak HTTP, follow redirects or read bodies. Refusals carry
//! a category for the log; their text for the model never names the address.
#![forbid(unsafe_code)]

mod cidr;
mod classify;
mod dial;
mod host;
mod policy;
mod refusal;

pub use cidr::{Cidr, CidrError, canonical};
pub use classify::{AddressClass, classify};
pub use dial::{
    ConnectError, Resolver, StaticResolver, SystemResolver, connect_checked, resolve_checked,
};
pub use host::{CheckedUrl, Host};
pub use policy::NetPolicy;
pub use refusal::{MAX_URL_LEN, Refusal, UNREACHABLE};
