//! `web_search`: a web search through the provider the operator configured (Brave, Tavily or
//! SearXNG), its results numbered with title, URL and snippet. The providers' requests and
//! answers are `crate::search`'s; the HTTP call is `crate::web::search`.
use std::time::Duration;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};

use toolexec_core::{ExchangeErrorKind, ExchangeRole};

use crate::observe::{Observed, Unserved};
use crate::search::{DEFAULT_RESULTS, MAX_RESULTS};
use crate::{Tool, ToolContext, ToolOutput, parse_args};

/// How long one search may take.
const TIMEOUT: Duration = Duration::from_secs(20);

/// Longest query, in characters.
const MAX_QUERY_CHARS: u64 = 500;

const DESCRIPTION: &str = "\
Searches the web and returns numbered results, each with its title, URL and a snippet. Use it to \
find documentation, an error message's cause or a project's page; then read a result with \
web_fetch.

Only available where the operator configured a search provider (Brave, Tavily or SearXNG); \
otherwise the call fails and says so. The session needs network access \
(`policy.network: \"allow\"`) unless the operator lets web tools reach the internet without it.

Example: {\"query\": \"tokio broadcast channel lagged\", \"max_results\": 5}";

pub struct WebSearch {
    spec: ToolSpec,
}

impl Default for WebSearch {
    fn default() -> Self {
        Self::new()
    }
}

impl WebSearch {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "web_search".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: true,
                capabilities: vec![Capability::Network],
                output_limit: OutputLimit::new(30_000, TruncationMode::Head),
            },
        }
    }
}

/// `web_search`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// What to search for.
    #[schemars(length(min = 1, max = MAX_QUERY_CHARS))]
    query: String,
    /// Most results to return. Default 5.
    #[schemars(range(min = 1, max = MAX_RESULTS))]
    max_results: Option<usize>,
}

#[async_trait]
impl Tool for WebSearch {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn unavailable(&self, web: &crate::web::WebAccess) -> Option<String> {
        web.search.is_none().then(|| {
            "the operator has not configured a search provider (web.search_provider)".to_owned()
        })
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(output) => return output,
        };
        let web = ctx.web.as_ref();
        // A replay serves the recorded answer whether or not a provider is configured now; one
        // whose record has none answers as the live call would have, without asking anyone.
        let source = match (&ctx.observed, &web.search) {
            (Observed::Replay(record), provider)
                if provider.is_some() || record.has(ExchangeRole::Search) =>
            {
                Source::Record(record)
            }
            (Observed::Live, Some(provider)) => Source::Provider(provider),
            (_, _) => return not_available(),
        };
        if let Some(denied) = web.denied_without_network("web_search", &ctx.policy) {
            return denied;
        }
        let count = args.max_results.unwrap_or(DEFAULT_RESULTS);
        let mut timeout = TIMEOUT;
        if let Some(left) = ctx.deadline.remaining() {
            timeout = timeout.min(left);
        }
        let journal = ctx.journal.as_ref();
        let asked = match source {
            Source::Record(record) => {
                let name = record
                    .exchanges
                    .iter()
                    .rev()
                    .find(|x| x.record.role == ExchangeRole::Search)
                    .and_then(|x| x.record.service.clone())
                    .unwrap_or_default();
                Ok(record
                    .answer(ExchangeRole::Search, journal)
                    .map(|a| (name, a)))
            }
            Source::Provider(provider) => match web.paid.take(ctx.tenant_id) {
                Err(wait) => {
                    let message = web.paid.refusal("web_search", wait);
                    journal.not_sent(ExchangeRole::Search, message.clone());
                    Ok(Err(Unserved {
                        kind: ExchangeErrorKind::Quota,
                        message,
                    }))
                }
                Ok(()) => tokio::time::timeout(
                    timeout,
                    crate::web::ask_search_provider(provider, &args.query, count, journal),
                )
                .await
                .map(|answer| answer.map(|a| (provider.name().to_owned(), a))),
            },
        };
        let timed_out = || {
            ToolOutput::timed_out(format!(
                "The search did not finish within {}; try again, or with other words.",
                crate::deadline::human_duration(timeout)
            ))
        };
        let mut out = match asked {
            Ok(Ok((name, answer))) => match crate::web::search_hits(&name, &answer, count) {
                Ok(hits) => ToolOutput::ok(crate::search::render(&args.query, &hits)),
                Err(why) => ToolOutput::error(format!("The search failed: {why}.")),
            },
            Ok(Err(e)) if e.kind == ExchangeErrorKind::TimedOut => timed_out(),
            Ok(Err(e)) if e.kind == ExchangeErrorKind::Quota => ToolOutput::error(e.message),
            Ok(Err(e)) => ToolOutput::error(format!("The search failed: {}.", e.message)),
            Err(_) => {
                journal.fail_last(
                    ExchangeRole::Search,
                    ExchangeErrorKind::TimedOut,
                    "timed out".to_owned(),
                );
                timed_out()
            }
        };
        out.events.extend(journal.drain_events());
        out
    }
}

/// Where the answer comes from.
enum Source<'a> {
    /// The operator's provider (live).
    Provider(&'a crate::search::Provider),
    /// The record of the call a replay re-runs.
    Record(&'a crate::observe::Recorded),
}

fn not_available() -> ToolOutput {
    ToolOutput::error(
        "web_search is not available on this service: the operator has not configured a search \
         provider (web.search_provider). Do without it, or use web_fetch on a page you know the \
         URL of.",
    )
}
