//! What the operator's tools share: the API secret (kept out of logs, errors and the record,
//! scrubbed from what an API echoes), the endpoint checked against the network policy, and the
//! tools' names.
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use toolexec_net::{NetPolicy, Resolver, resolve_checked};
use url::Url;

/// How long the start-up check of `base_url`'s host name may take.
pub(crate) const RESOLVE_AT_LOAD: Duration = Duration::from_secs(10);

/// A secret that never shows: `Debug` prints `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// The bearer token of an entry: from the file or the named variable (read now), checked to
/// be a header value. The errors never quote the token.
pub(crate) fn bearer_token(
    token: Option<&str>,
    env: Option<&str>,
    at: &str,
) -> Result<Option<Secret>, String> {
    let token = match (token, env) {
        (Some(_), Some(_)) => {
            return Err(format!(
                "{at}: set bearer_token or bearer_token_env, not both"
            ));
        }
        (Some(t), None) => t.to_owned(),
        (None, Some(var)) => std::env::var(var).map_err(|_| {
            format!("{at}: bearer_token_env names {var}, which is not set (or not UTF-8) in the service's environment")
        })?,
        (None, None) => return Ok(None),
    };
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(format!(
            "{at}: the bearer token is empty or holds characters a header cannot carry"
        ));
    }
    Ok(Some(Secret(token)))
}

/// `text` with every occurrence of `secret` replaced by `***` (an API that echoes the request's
/// headers must not put the token into the result or the record).
pub(crate) fn scrubbed(body: Bytes, secret: Option<&Secret>) -> Bytes {
    let Some(secret) = secret.map(|s| s.0.as_bytes()).filter(|s| !s.is_empty()) else {
        return body;
    };
    if !body.windows(secret.len()).any(|w| w == secret) {
        return body;
    }
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        if body[i..].starts_with(secret) {
            out.extend_from_slice(b"***");
            i += secret.len();
        } else {
            out.push(body[i]);
            i += 1;
        }
    }
    out.into()
}

/// `body` with `secret` masked, as it is and as JSON escapes it (a token with a `"` or a `\`
/// echoed in a JSON body), and cut at `limit` bytes of the original: a token that begins
/// before the cut is masked whole (`body` should hold [`scrub_overlap`] bytes past `limit`,
/// read for that), so no prefix of it shows at the end of a cut body. Also says whether
/// anything of `body` was cut.
pub(crate) fn scrubbed_within(body: Bytes, secret: Option<&Secret>, limit: usize) -> (Bytes, bool) {
    let needles = secret.map(secret_forms).unwrap_or_default();
    if needles.is_empty() {
        let cut = body.len() > limit;
        return (body.slice(..body.len().min(limit)), cut);
    }
    let mut out = Vec::with_capacity(body.len().min(limit));
    let mut i = 0;
    'bytes: while i < body.len() && i < limit {
        for needle in &needles {
            if body[i..].starts_with(needle) {
                out.extend_from_slice(b"***");
                i += needle.len();
                continue 'bytes;
            }
        }
        out.push(body[i]);
        i += 1;
    }
    (out.into(), i < body.len())
}

/// The forms a token takes in a body: as it is, and JSON-escaped when that differs.
pub(crate) fn secret_forms(secret: &Secret) -> Vec<Vec<u8>> {
    let raw = secret.0.as_bytes().to_vec();
    if raw.is_empty() {
        return Vec::new();
    }
    let quoted = serde_json::to_string(&secret.0).unwrap_or_default();
    let escaped = quoted.as_bytes()[1..quoted.len() - 1].to_vec();
    if escaped == raw {
        vec![raw]
    } else {
        // The longer first: an escaped form may begin like the raw one.
        vec![escaped, raw]
    }
}

/// Bytes to read past a cap so that [`scrubbed_within`] sees whole any token the cap splits.
pub(crate) fn scrub_overlap(secret: Option<&Secret>) -> usize {
    secret
        .map(secret_forms)
        .unwrap_or_default()
        .iter()
        .map(|n| n.len().saturating_sub(1))
        .max()
        .unwrap_or(0)
}

/// What the loaders need of the network: the operator's allow-list and the resolver the
/// service dials with (a static one in tests).
#[derive(Clone)]
pub struct LoadNet {
    /// `sandbox.egress_allow_cidrs`.
    pub egress_allow: Vec<String>,
    pub resolver: Arc<dyn Resolver>,
}

/// The policy of an operator's endpoint: the public internet, `sandbox.egress_allow_cidrs` and
/// the entry's own `allow_cidrs`; this host's own addresses refused unless named.
pub(crate) fn endpoint_policy(
    net: &LoadNet,
    own: &[String],
    at: &str,
) -> Result<NetPolicy, String> {
    let all: Vec<&str> = net
        .egress_allow
        .iter()
        .chain(own)
        .map(String::as_str)
        .collect();
    Ok(NetPolicy::new(&all)
        .map_err(|e| format!("{at}: allow_cidrs: {e}"))?
        .refusing_this_host())
}

/// Checks at start-up that `url` may be reached under `policy`: the URL layer, and for a name
/// what it resolves to now. A name that does not resolve now is let through (the check is made
/// again at every call); a refusal stops the start.
pub(crate) async fn check_endpoint(
    policy: &NetPolicy,
    resolver: &dyn Resolver,
    url: &str,
    at: &str,
) -> Result<Url, String> {
    let refused = |r: toolexec_net::Refusal| {
        format!(
            "{at}: {url:?} is not allowed by the network policy ({}: {r}); add its network to this entry's allow_cidrs (or sandbox.egress_allow_cidrs) if it is meant to be reached",
            r.reason()
        )
    };
    let checked = policy.check_url(url).map_err(refused)?;
    if let toolexec_net::Host::Domain(name) = checked.host() {
        match resolve_checked(policy, resolver, name, checked.port(), RESOLVE_AT_LOAD).await {
            Ok(_) => {}
            Err(toolexec_net::ConnectError::Refused(r)) => return Err(refused(r)),
            Err(e) => {
                tracing::warn!(entry = at, error = %e, "an operator endpoint's host does not resolve now; its calls will fail until it does");
            }
        }
    }
    Ok(checked.into_url())
}

/// The tool name `<prefix>__<name>` with every character outside `[a-zA-Z0-9_-]` made `_`;
/// refused when longer than 64 characters (the providers' limit).
pub(crate) fn tool_name(prefix: &str, name: &str) -> Result<String, String> {
    let joined: String = format!("{prefix}__{name}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if joined.len() > 64 {
        return Err(format!(
            "the tool name {joined:?} is longer than 64 characters (the providers' limit): use a shorter name for the entry"
        ));
    }
    Ok(joined)
}

/// Checks an entry's `name` (the prefix of its tools' names).
pub(crate) fn check_prefix(name: &str, at: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{at}: the name must be 1 to 32 letters, digits, '_' or '-' (it prefixes the tools' names)"
        ))
    }
}
