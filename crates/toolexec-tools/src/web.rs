//! What the web tools reach and how: the operator's [`WebConfig`], the [`WebAccess`] a
//! [`crate::ToolContext`] carries (the network policy, the resolver, the summarizer), and
//! [`fetch`], the one HTTP GET of `web_fetch`.
//!
//! Every connection goes through toolexec-net: the URL layer on the URL and on every redirect
//! target ([`NetPolicy::check_parsed_url`]), the dial layer in reqwest's resolver
//! ([`resolve_checked`]: one resolution per connection, every address checked, an answer with
//! one refused address refused whole). reqwest follows no redirect (we do, at most
//! [`MAX_REDIRECTS`]), uses no proxy from the environment, and its decoded body is read up to
//! [`MAX_BODY_BYTES`]. It must not record anything or decide what the model is shown of a page:
//! that is the tool's (`builtin/web_fetch.rs`).
use std::error::Error as _;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use toolexec_core::{ExchangeErrorKind, ExchangeRole};
use toolexec_net::{ConnectError, NetPolicy, Refusal, Resolver, SystemResolver, resolve_checked};
use url::Url;

use crate::observe::{Answer, Journal, Recorded, Unserved, answer_of};
use crate::search::Hit;

/// Redirects followed before a fetch gives up: enough for http→https plus a canonical-host hop
/// and a login-free CDN hop, few enough that a loop ends at once.
pub const MAX_REDIRECTS: usize = 5;

/// Decoded bytes of one response body read before the rest is dropped: 5 MiB is far more text
/// than a page's 100,000 shown characters need, and bounds the memory of an endless or
/// decompression-bomb body (the cap counts bytes after gzip is undone).
pub const MAX_BODY_BYTES: usize = 5 * 1024 * 1024;

/// The operator's settings for the web tools (`[web]` in the config file). Which non-public
/// networks they may reach is `sandbox.egress_allow_cidrs`: one allow-list for the shell's
/// egress proxy and the web tools.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebConfig {
    /// Whether web tools may fetch from the public internet (and the allow-listed networks) in a
    /// session whose `policy.network` is `none`. Off: such a session's fetches are refused.
    pub public_when_network_none: bool,
    /// Base URL of an OpenAI-compatible API (`…/v1`) that answers `web_fetch`'s `prompt`
    /// (`POST {summarizer_url}/chat/completions`). Operator-chosen, so not subject to the
    /// network policy.
    pub summarizer_url: Option<String>,
    /// The model the summarizer is asked for.
    pub summarizer_model: Option<String>,
    /// Bearer token for the summarizer; never logged or shown.
    pub summarizer_api_key: Option<String>,
    /// The provider `web_search` asks: `brave`, `tavily` or `searxng`. Unset: `web_search`
    /// says it is not available here.
    pub search_provider: Option<String>,
    /// The provider's endpoint: Brave's and Tavily's public APIs by default; a SearXNG
    /// instance's base URL (required for `searxng`). Operator-chosen, so not subject to the
    /// network policy.
    pub search_url: Option<String>,
    /// The provider's API key (Brave, Tavily); never logged or shown.
    pub search_api_key: Option<String>,
    /// Requests one tenant may make to the operator's paid services — searches and summarizer
    /// prompts together — per minute, on this node. Beyond it a call fails and says when to try
    /// again. 0: no limit.
    pub paid_calls_per_minute: u32,
}

/// Default of [`WebConfig::paid_calls_per_minute`]: an agent searching and summarizing every
/// second for a minute, not a loop that spends the operator's quota as fast as it can.
pub const DEFAULT_PAID_CALLS_PER_MINUTE: u32 = 60;

impl Default for WebConfig {
    fn default() -> Self {
        Self {
            public_when_network_none: false,
            summarizer_url: None,
            summarizer_model: None,
            summarizer_api_key: None,
            search_provider: None,
            search_url: None,
            search_api_key: None,
            paid_calls_per_minute: DEFAULT_PAID_CALLS_PER_MINUTE,
        }
    }
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("public_when_network_none", &self.public_when_network_none)
            .field(
                "summarizer_url",
                &self.summarizer_url.as_deref().map(redacted_url),
            )
            .field("summarizer_model", &self.summarizer_model)
            .field(
                "summarizer_api_key",
                &self.summarizer_api_key.as_ref().map(|_| "***"),
            )
            .field("search_provider", &self.search_provider)
            .field("search_url", &self.search_url.as_deref().map(redacted_url))
            .field(
                "search_api_key",
                &self.search_api_key.as_ref().map(|_| "***"),
            )
            .field("paid_calls_per_minute", &self.paid_calls_per_minute)
            .finish()
    }
}

/// An OpenAI-compatible chat endpoint that answers a prompt about a page.
#[derive(Clone, PartialEq, Eq)]
pub struct Summarizer {
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
}

/// An operator's endpoint as logs may show it: its scheme, host and path, without user
/// information or query (where a key could hide).
pub fn redacted_url(url: &str) -> String {
    match Url::parse(url) {
        Ok(mut u) => {
            let had_secret = !u.username().is_empty() || u.password().is_some();
            let _ = u.set_username("");
            let _ = u.set_password(None);
            let had_query = u.query().is_some();
            u.set_query(None);
            u.set_fragment(None);
            let mut shown = u.to_string();
            if had_secret || had_query {
                shown.push_str(" (credentials or query not shown)");
            }
            shown
        }
        Err(_) => "(not a URL)".to_owned(),
    }
}

impl std::fmt::Debug for Summarizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Summarizer")
            .field("base_url", &redacted_url(&self.base_url))
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .finish()
    }
}

/// What the web tools of one service may reach and with what.
#[derive(Clone)]
pub struct WebAccess {
    /// The public internet plus the operator's allow-list.
    pub policy: NetPolicy,
    /// Names to addresses: [`SystemResolver`] in production, a `StaticResolver` in tests (on the
    /// same code path).
    pub resolver: Arc<dyn Resolver>,
    /// See [`WebConfig::public_when_network_none`].
    pub public_when_network_none: bool,
    pub summarizer: Option<Summarizer>,
    /// The provider of `web_search`, if the operator configured one.
    pub search: Option<crate::search::Provider>,
    /// Each tenant's use of the search provider and the summarizer.
    pub paid: Arc<PaidQuota>,
}

/// A per-tenant limit on requests to the operator's paid services (search provider,
/// summarizer) in each minute, on this node. Fixed one-minute windows; a tenant's window is
/// forgotten once it is over, so the table holds at most the tenants of the last minute.
#[derive(Debug)]
pub struct PaidQuota {
    per_minute: u32,
    windows: std::sync::Mutex<std::collections::HashMap<uuid::Uuid, (std::time::Instant, u32)>>,
}

impl PaidQuota {
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            windows: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Counts one request of `tenant`; `Err(seconds)` until its window ends when it has none
    /// left.
    pub fn take(&self, tenant: uuid::Uuid) -> Result<(), u64> {
        const WINDOW: Duration = Duration::from_secs(60);
        if self.per_minute == 0 {
            return Ok(());
        }
        let now = std::time::Instant::now();
        // A poisoned table refuses: the quota guards the operator's money.
        let Ok(mut windows) = self.windows.lock() else {
            return Err(60);
        };
        if windows.len() > 10_000 {
            windows.retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
        }
        let (start, used) = windows.entry(tenant).or_insert((now, 0));
        if now.duration_since(*start) >= WINDOW {
            *start = now;
            *used = 0;
        }
        if *used >= self.per_minute {
            let left = WINDOW.saturating_sub(now.duration_since(*start));
            return Err(left.as_secs().max(1));
        }
        *used += 1;
        Ok(())
    }

    /// The sentence for the model when [`PaidQuota::take`] refused.
    pub fn refusal(&self, what: &str, retry_after_s: u64) -> String {
        format!(
            "{what} is not available right now: this account used the service's {} searches and \
             summaries for this minute. Try again in {retry_after_s} s, or go on without it.",
            self.per_minute
        )
    }
}

impl Default for WebAccess {
    /// The public internet only, the system resolver, nothing for `network: none` sessions, no
    /// summarizer.
    fn default() -> Self {
        Self {
            policy: NetPolicy::public_only().refusing_this_host(),
            resolver: Arc::new(SystemResolver),
            public_when_network_none: false,
            summarizer: None,
            search: None,
            paid: Arc::new(PaidQuota::new(DEFAULT_PAID_CALLS_PER_MINUTE)),
        }
    }
}

impl std::fmt::Debug for WebAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebAccess")
            .field("policy", &self.policy)
            .field("public_when_network_none", &self.public_when_network_none)
            .field("summarizer", &self.summarizer)
            .field(
                "search",
                &self.search.as_ref().map(crate::search::Provider::name),
            )
            .finish_non_exhaustive()
    }
}

impl WebAccess {
    /// From the operator's settings: `allow` is `sandbox.egress_allow_cidrs`. A summarizer needs
    /// both its URL and its model.
    pub fn from_config(config: &WebConfig, allow: &[String]) -> Result<Self, String> {
        let policy = NetPolicy::new(allow)
            .map_err(|e| format!("sandbox.egress_allow_cidrs: {e}"))?
            .refusing_this_host();
        let summarizer = match (&config.summarizer_url, &config.summarizer_model) {
            (Some(url), Some(model)) => {
                Url::parse(url).map_err(|e| format!("web.summarizer_url: {e}"))?;
                Some(Summarizer {
                    base_url: url.trim_end_matches('/').to_owned(),
                    model: model.clone(),
                    api_key: config.summarizer_api_key.clone(),
                })
            }
            (None, None) => None,
            _ => {
                return Err(
                    "web.summarizer_url and web.summarizer_model go together: set both or neither"
                        .to_owned(),
                );
            }
        };
        Ok(Self {
            policy,
            resolver: Arc::new(SystemResolver),
            public_when_network_none: config.public_when_network_none,
            summarizer,
            search: search_provider(config)?,
            paid: Arc::new(PaidQuota::new(config.paid_calls_per_minute)),
        })
    }
}

impl WebAccess {
    /// The answer for `tool` in a session whose policy gives it no network, unless the operator
    /// lets web tools reach the internet without it.
    pub fn denied_without_network(
        &self,
        tool: &str,
        policy: &toolexec_core::Policy,
    ) -> Option<crate::ToolOutput> {
        (policy.network == toolexec_core::NetworkPolicy::None && !self.public_when_network_none)
            .then(|| {
                crate::ToolOutput::denied(format!(
                    "{tool} needs network access, and this session was not granted it (its \
                     policy.network is \"none\"). Do without it, or ask the user for a session \
                     with network access."
                ))
            })
    }
}

/// The search provider the operator configured (`web.search_*`), checked.
fn search_provider(config: &WebConfig) -> Result<Option<crate::search::Provider>, String> {
    use crate::search::Provider;
    let url = |default: &str| {
        let text = config.search_url.as_deref().unwrap_or(default);
        Url::parse(text).map_err(|e| format!("web.search_url: {e}"))
    };
    let key = |name: &str| {
        config
            .search_api_key
            .clone()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| format!("web.search_provider = \"{name}\" needs web.search_api_key"))
    };
    Ok(Some(match config.search_provider.as_deref() {
        None => return Ok(None),
        Some("brave") => Provider::Brave {
            endpoint: url("https://api.search.brave.com/res/v1/web/search")?,
            api_key: key("brave")?,
        },
        Some("tavily") => Provider::Tavily {
            endpoint: url("https://api.tavily.com/search")?,
            api_key: key("tavily")?,
        },
        Some("searxng") => Provider::Searxng {
            base: match &config.search_url {
                Some(_) => url("")?,
                None => {
                    return Err(
                        "web.search_provider = \"searxng\" needs web.search_url (the instance's base URL)".into(),
                    );
                }
            },
        },
        Some(other) => {
            return Err(format!(
                "web.search_provider: \"{other}\" is not a provider this service speaks to (brave, tavily or searxng)"
            ));
        }
    }))
}

/// Most bytes of a search provider's or summarizer's answer read: a few KB is usual; a gateway
/// that sends more is cut off, not buffered.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// Asks the configured provider for `count` results for `query`: its answer (status and body,
/// up to 1 MiB), recorded in `journal`. The request carries the key in a header or body only.
pub async fn ask_search_provider(
    provider: &crate::search::Provider,
    query: &str,
    count: usize,
    journal: &Journal,
) -> Result<Answer, Unserved> {
    let req = crate::search::request(provider, query, count);
    let name = provider.name();
    // The provider's endpoint is the operator's (it may hold credentials or an internal host):
    // the record names the provider, and the query is in the call's arguments.
    let at = journal.begin(
        ExchangeRole::Search,
        if req.post { "POST" } else { "GET" },
        None,
        Some(name.to_owned()),
    );
    let asked = async {
        let client = plain_client()
            .map_err(|e| format!("the {name} search provider could not be reached: {e}"))?;
        let mut builder = if req.post {
            client.post(req.url.clone())
        } else {
            client.get(req.url.clone())
        };
        for (header, value) in &req.headers {
            let mut value = reqwest::header::HeaderValue::from_str(value).map_err(|_| {
                format!("the {name} search provider's key is not a valid header value")
            })?;
            // Keys stay out of any log of the request.
            value.set_sensitive(true);
            builder = builder.header(*header, value);
        }
        if let Some(body) = &req.body {
            builder = builder.json(body);
        }
        let response = builder.send().await.map_err(|e| {
            format!(
                "the {name} search provider could not be reached ({})",
                without_url(&e)
            )
        })?;
        Ok::<_, String>(response)
    };
    answer(asked.await, at, journal, |e| {
        format!("the {name} search provider's answer broke off ({e})")
    })
    .await
}

/// Records a response of an operator's service (its head, then its body up to
/// [`MAX_ANSWER_BYTES`]) at `at`, or why there was none.
async fn answer(
    response: Result<reqwest::Response, String>,
    at: usize,
    journal: &Journal,
    broke_off: impl Fn(FetchError) -> String,
) -> Result<Answer, Unserved> {
    let failed = |journal: &Journal, role, message: String| {
        journal.fail_last(role, ExchangeErrorKind::Failed, message.clone());
        Unserved {
            kind: ExchangeErrorKind::Failed,
            message,
        }
    };
    let role = journal.role_of(at);
    let response = match response {
        Ok(response) => response,
        Err(message) => return Err(failed(journal, role, message)),
    };
    let status = response.status().as_u16();
    journal.respond(at, status, response.headers());
    match read_capped(response, MAX_ANSWER_BYTES).await {
        Ok((body, truncated)) => {
            if (200..300).contains(&status) {
                journal.body(at, &body, truncated).await;
            } else {
                journal.body_withheld(at, body.len(), truncated);
            }
            Ok(Answer {
                status,
                body,
                truncated,
            })
        }
        Err(e) => Err(failed(journal, role, broke_off(e))),
    }
}

/// The hits of a search provider's answer (`provider` as [`crate::search::Provider::name`]
/// gives it), or the sentence for the model.
pub fn search_hits(provider: &str, answer: &Answer, count: usize) -> Result<Vec<Hit>, String> {
    if answer.truncated && (200..300).contains(&answer.status) {
        return Err(format!(
            "the {provider} search provider's answer is larger than 1 MiB"
        ));
    }
    crate::search::parse_named(provider, answer.status, &answer.body, count)
        .map_err(|e| e.to_string())
}

/// A client for requests between the service's own replicas (an API request forwarded to the
/// node a session lives on): no proxy from the environment, no redirects, TLS as for fetches,
/// connections kept for reuse, a short connect timeout (a node that does not answer is treated
/// as gone by the caller). Not subject to the network policy: the addresses are the
/// operator's (`cluster.advertise_url`).
pub fn replica_client() -> Result<reqwest::Client, String> {
    let tls = tls_config().map_err(|e| e.to_string())?;
    reqwest::Client::builder()
        .no_proxy()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(2))
        .pool_idle_timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())
}

/// A client for the operator's own services (search provider, summarizer): no proxy from the
/// environment, no redirects, TLS as for fetches. Not subject to the network policy: the
/// operator chose these endpoints.
fn plain_client() -> Result<reqwest::Client, String> {
    let tls = tls_config().map_err(|e| e.to_string())?;
    reqwest::Client::builder()
        .no_proxy()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())
}

/// A fetch a verify replay serves from the record: the recorded hops go into `journal` and the
/// last one's outcome comes back as the live fetch gave it. The URL layer is checked first, as
/// live: a URL refused before anything was sent has no exchange in the record.
pub fn replayed_fetch(
    web: &WebAccess,
    url: &str,
    record: &Recorded,
    journal: &Journal,
) -> Result<Fetched, FetchError> {
    web.policy.check_url(url).map_err(refused)?;
    let unserved = |u: Unserved| FetchError::Recorded {
        kind: u.kind,
        message: u.message,
    };
    let last = record
        .serve(ExchangeRole::Page, journal)
        .map_err(unserved)?;
    let page = answer_of(last).map_err(unserved)?;
    let hops = record
        .exchanges
        .iter()
        .filter(|x| x.record.role == ExchangeRole::Page)
        .count();
    let url = last
        .record
        .url
        .as_deref()
        .and_then(|u| Url::parse(u).ok())
        .ok_or_else(|| FetchError::Recorded {
            kind: ExchangeErrorKind::Failed,
            message: "the record of this call names no URL for its page".to_owned(),
        })?;
    Ok(Fetched {
        url,
        status: page.status,
        content_type: last.record.headers.get("content-type").cloned(),
        redirects: hops.saturating_sub(1),
        body: page.body,
        truncated: page.truncated,
    })
}

/// A response as fetched: where it ended up, and at most [`MAX_BODY_BYTES`] of its decoded body.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The URL of the response (after redirects).
    pub url: Url,
    pub status: u16,
    pub content_type: Option<String>,
    /// Redirects followed to get here.
    pub redirects: usize,
    pub body: bytes::Bytes,
    /// The body went on past [`MAX_BODY_BYTES`] (the rest was not read).
    pub truncated: bool,
}

/// Why a fetch did not give a response. `Display` is the text for the model: it never names a
/// refused address.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The network policy refused the URL, a redirect target or an address.
    #[error("{0}")]
    Refused(Refusal),
    #[error("the page redirected more than {MAX_REDIRECTS} times (a redirect loop?); stopped")]
    TooManyRedirects,
    #[error("the page redirected to an invalid location")]
    BadRedirect,
    #[error("{0}")]
    Dial(String),
    #[error("the request failed: {0}")]
    Http(String),
    /// The outcome a replayed call's record holds (its words as the model was told them), or
    /// why the record cannot serve it.
    #[error("{message}")]
    Recorded {
        kind: ExchangeErrorKind,
        message: String,
    },
}

impl FetchError {
    /// A guardrail refusal (`denied`), as opposed to a failure of the fetch.
    pub fn is_refusal(&self) -> bool {
        self.kind() == ExchangeErrorKind::Refused
    }

    /// How the record names it.
    pub fn kind(&self) -> ExchangeErrorKind {
        match self {
            Self::Refused(_) => ExchangeErrorKind::Refused,
            Self::Recorded { kind, .. } => *kind,
            _ => ExchangeErrorKind::Failed,
        }
    }
}

/// How long one name may take to resolve, within the fetch's own timeout.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// reqwest's resolver: [`resolve_checked`], so that every connection reqwest opens to a name
/// goes to addresses the policy checked. (IP-literal hosts never reach a resolver: the URL
/// layer checked them.) Also the resolver of image pulls (toolexec-server's image store).
pub struct CheckedResolve {
    policy: NetPolicy,
    resolver: Arc<dyn Resolver>,
}

impl CheckedResolve {
    /// Names resolved with `resolver`, every answer checked against `policy`.
    pub fn new(policy: NetPolicy, resolver: Arc<dyn Resolver>) -> Self {
        Self { policy, resolver }
    }
}

/// The port given to [`resolve_checked`], which refuses port 0. The resolver does not know the
/// URL's port; the addresses go back with port 0, which hyper replaces with the URL's.
const ANY_PORT: u16 = 1;

impl reqwest::dns::Resolve for CheckedResolve {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.policy.clone();
        let resolver = self.resolver.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs =
                resolve_checked(&policy, resolver.as_ref(), &host, ANY_PORT, RESOLVE_TIMEOUT)
                    .await
                    .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)?;
            let addrs: reqwest::dns::Addrs = Box::new(
                addrs
                    .into_iter()
                    .map(|a| SocketAddr::new(a.ip(), 0))
                    .collect::<Vec<_>>()
                    .into_iter(),
            );
            Ok(addrs)
        })
    }
}

/// The TLS configuration of every fetch: rustls with the ring provider and the Mozilla roots
/// (webpki-roots), built once. Also the TLS of image pulls (toolexec-image).
pub fn tls_config() -> Result<rustls::ClientConfig, FetchError> {
    static CONFIG: OnceLock<Result<rustls::ClientConfig, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            };
            let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
            config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            Ok(config)
        })
        .clone()
        .map_err(|e| FetchError::Http(format!("TLS is not available: {e}")))
}

/// Makes ring the process's default rustls provider, for `reqwest::Client::new()` elsewhere in
/// the process (tests, benchmarks). Needed because web_fetch turns on reqwest's
/// `rustls-no-provider` for the whole workspace (features unify), and reqwest then panics on a
/// client built without a preconfigured TLS config unless a default provider is installed. The
/// web tools themselves do not rely on it. Calling it again does nothing.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The client of one fetch: our resolver, no proxy, no redirects, gzip decoded.
fn client(web: &WebAccess) -> Result<reqwest::Client, FetchError> {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(CheckedResolve {
            policy: web.policy.clone(),
            resolver: web.resolver.clone(),
        })
        .gzip(true)
        .tls_backend_preconfigured(tls_config()?)
        .user_agent(concat!(
            "toolexec/",
            env!("CARGO_PKG_VERSION"),
            " (web_fetch)"
        ))
        .build()
        .map_err(|e| FetchError::Http(e.to_string()))
}

/// A client for an operator's API (`[[tools.openapi]]`, `[[tools.mcp]]`): every connection to
/// a name goes to addresses `policy` checked at dial time (DNS rebinding cannot reach another
/// address), no proxy from the environment, no redirect followed, `timeout` on the whole
/// request.
pub(crate) fn checked_client(
    policy: &NetPolicy,
    resolver: Arc<dyn Resolver>,
    timeout: Duration,
    user_agent: &str,
) -> Result<reqwest::Client, FetchError> {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(CheckedResolve {
            policy: policy.clone(),
            resolver,
        })
        .gzip(true)
        .timeout(timeout)
        .tls_backend_preconfigured(tls_config()?)
        .user_agent(user_agent)
        .build()
        .map_err(|e| FetchError::Http(e.to_string()))
}

/// GETs `url` under `web`'s policy, following at most [`MAX_REDIRECTS`] redirects, each target
/// checked again (URL layer here, dial layer in the resolver). `Refresh` headers and meta
/// refreshes are not followed. The caller bounds the time.
///
/// Every request that reached the network is added to `journal` as it happens (a response's
/// head when it arrives, its body once read), and the error that ended the fetch goes on the
/// last one, so that what a call observed is in its record even when its time runs out halfway
/// ([`Journal::fail_last`]). A first URL the policy refuses before anything is sent is not an
/// exchange.
pub async fn fetch(web: &WebAccess, url: &str, journal: &Journal) -> Result<Fetched, FetchError> {
    let fetched = fetch_hops(web, url, journal).await;
    if let Err(e) = &fetched {
        journal.fail_last(ExchangeRole::Page, e.kind(), e.to_string());
    }
    fetched
}

async fn fetch_hops(web: &WebAccess, url: &str, journal: &Journal) -> Result<Fetched, FetchError> {
    let mut target = web.policy.check_url(url).map_err(refused)?;
    let client = client(web)?;
    let mut redirects = 0;
    loop {
        let at = journal.begin(
            ExchangeRole::Page,
            "GET",
            Some(target.url().to_string()),
            None,
        );
        let response = client
            .get(target.url().clone())
            .header(
                reqwest::header::ACCEPT,
                "text/html,application/xhtml+xml,text/plain;q=0.9,application/json;q=0.9,*/*;q=0.5",
            )
            .send()
            .await
            .map_err(request_failed)?;
        let status = response.status();
        journal.respond(at, status.as_u16(), response.headers());
        if status.is_redirection()
            && let Some(location) = response.headers().get(reqwest::header::LOCATION)
        {
            // A redirect's body is not read.
            journal.complete(at);
            if redirects == MAX_REDIRECTS {
                return Err(FetchError::TooManyRedirects);
            }
            let location = location.to_str().map_err(|_| FetchError::BadRedirect)?;
            let next = target
                .url()
                .join(location)
                .map_err(|_| FetchError::BadRedirect)?;
            target = web.policy.check_parsed_url(next).map_err(refused)?;
            redirects += 1;
            continue;
        }
        // As the record keeps it (a replay decodes with the recorded header, so live must too).
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .filter(|v| v.len() <= crate::observe::MAX_HEADER_BYTES)
            .map(str::to_owned);
        let url = response.url().clone();
        let (body, truncated) = read_capped(response, MAX_BODY_BYTES).await?;
        journal.body(at, &body, truncated).await;
        return Ok(Fetched {
            url,
            status: status.as_u16(),
            content_type,
            redirects,
            body,
            truncated,
        });
    }
}

/// The decoded body, up to `cap` bytes; `true` when there was more (not read).
pub(crate) async fn read_capped(
    mut response: reqwest::Response,
    cap: usize,
) -> Result<(bytes::Bytes, bool), FetchError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(request_failed)? {
        let room = cap - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body.into(), true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body.into(), false))
}

fn refused(refusal: Refusal) -> FetchError {
    if let Some(ip) = refusal.address() {
        tracing::info!(reason = refusal.reason(), %ip, "web_fetch destination refused");
    } else {
        tracing::info!(reason = refusal.reason(), "web_fetch URL refused");
    }
    FetchError::Refused(refusal)
}

/// A reqwest failure as the model sees it: the policy's refusal when the resolver refused, the
/// dial's error when the name could not be resolved, else reqwest's description (which names
/// the URL the model gave, never an address it resolved to).
pub(crate) fn request_failed(error: reqwest::Error) -> FetchError {
    let mut source = error.source();
    while let Some(cause) = source {
        if let Some(dial) = cause.downcast_ref::<ConnectError>() {
            return match dial {
                ConnectError::Refused(refusal) => refused(refusal.clone()),
                other => FetchError::Dial(other.to_string()),
            };
        }
        source = cause.source();
    }
    let what = if error.is_connect() {
        "could not connect to the server"
    } else if error.is_timeout() {
        "the server did not answer in time"
    } else if error.is_decode() || error.is_body() {
        "reading the response failed"
    } else {
        "the request failed"
    };
    // The innermost cause says what happened ("Connection refused", a TLS alert); the outer
    // layers only say where (hyper's "client error (Connect)").
    let mut detail = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        detail = cause.to_string();
        source = cause.source();
    }
    FetchError::Http(format!("{what} ({detail})"))
}

/// Asks `summarizer` `prompt` about `page` (from `url`): its answer, recorded in `journal`
/// (without the operator's endpoint). The API key goes in the `Authorization` header only.
pub async fn ask_summarizer(
    summarizer: &Summarizer,
    url: &str,
    page: &str,
    prompt: &str,
    journal: &Journal,
) -> Result<Answer, Unserved> {
    let body = serde_json::json!({
        "model": summarizer.model,
        "messages": [
            {
                "role": "system",
                "content": "You answer a question about a web page, using only the page's text given to you. Be concise and quote the page where it helps. If the page does not answer the question, say so."
            },
            {
                "role": "user",
                "content": format!("Web page {url}:\n\n{page}\n\n---\nQuestion: {prompt}")
            }
        ]
    });
    let at = journal.begin(
        ExchangeRole::Summary,
        "POST",
        None,
        Some(summarizer.model.clone()),
    );
    let asked = async {
        let mut request = plain_client()
            .map_err(|e| format!("the summarizer could not be reached: {e}"))?
            .post(format!("{}/chat/completions", summarizer.base_url))
            .json(&body);
        if let Some(key) = &summarizer.api_key {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| "the summarizer's key is not a valid header value".to_owned())?;
            value.set_sensitive(true);
            request = request.header(reqwest::header::AUTHORIZATION, value);
        }
        request
            .send()
            .await
            .map_err(|e| format!("the summarizer could not be reached ({})", without_url(&e)))
    };
    answer(asked.await, at, journal, |e| {
        format!("the summarizer's answer broke off ({e})")
    })
    .await
}

/// The text of a summarizer's answer, or the sentence for the model.
pub fn summary_text(answer: &Answer) -> Result<String, String> {
    if !(200..300).contains(&answer.status) {
        // Its message may quote the key ("Incorrect API key provided: sk-…"): not shown.
        tracing::debug!(status = answer.status, "the summarizer refused a prompt");
        return Err(format!(
            "the summarizer answered HTTP {}{}",
            answer.status,
            match answer.status {
                401 | 403 => " (the operator's key was refused)",
                429 => " (rate limited: try again later)",
                _ => "",
            }
        ));
    }
    if answer.truncated {
        return Err("the summarizer's answer is larger than 1 MiB".to_owned());
    }
    let json: serde_json::Value = serde_json::from_slice(&answer.body)
        .map_err(|e| format!("the summarizer's answer was not JSON ({e})"))?;
    json["choices"][0]["message"]["content"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| "the summarizer's answer had no choices[0].message.content".to_owned())
}

/// A reqwest error without its URL (the operator's endpoint is not the model's business).
fn without_url(error: &reqwest::Error) -> String {
    error
        .source()
        .map(|s| s.to_string())
        .unwrap_or_else(|| "no detail".to_owned())
}
