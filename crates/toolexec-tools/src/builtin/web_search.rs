//! `web_search`: a web search through the provider the operator configured (Brave, Tavily or
//! SearXNG), its results numbered with title, URL and snippet. The providers' requests and
//! answers are `crate::search`'s; the HTTP call is `crate::web::search`.
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::json;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};

use toolexec_core::{ExchangeErrorKind, ExchangeRole};

use crate::observe::{Journal, Observed};
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
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "query": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": MAX_QUERY_CHARS,
                            "description": "What to search for."
                        },
                        "max_results": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_RESULTS,
                            "description": "Most results to return. Default 5."
                        }
                    },
                    "required": ["query"],
                    "additionalProperties": false
                }),
                read_only: true,
                capabilities: vec![Capability::Network],
                output_limit: OutputLimit::new(30_000, TruncationMode::Head),
            },
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    query: String,
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
        if let (Observed::Live, None) = (&ctx.observed, &web.search) {
            return not_available();
        }
        if let Some(denied) = web.denied_without_network("web_search", &ctx.policy) {
            return denied;
        }
        let count = args.max_results.unwrap_or(DEFAULT_RESULTS);
        let mut timeout = TIMEOUT;
        if let Some(left) = ctx.deadline.remaining() {
            timeout = timeout.min(left);
        }
        let mut journal = Journal::default();
        // A replay serves the recorded answer whether or not a provider is configured now.
        let asked = match (&ctx.observed, &web.search) {
            (Observed::Replay(record), _) => {
                let answer = record.answer(ExchangeRole::Search, &mut journal);
                let name = record
                    .exchanges
                    .iter()
                    .rev()
                    .find(|x| x.record.role == ExchangeRole::Search)
                    .and_then(|x| x.record.service.clone())
                    .unwrap_or_default();
                Ok(answer.map(|a| (name, a)))
            }
            (Observed::Live, Some(provider)) => {
                if let Err(wait) = web.paid.take(ctx.tenant_id) {
                    return ToolOutput::error(web.paid.refusal("web_search", wait));
                }
                tokio::time::timeout(
                    timeout,
                    crate::web::ask_search_provider(provider, &args.query, count, &mut journal),
                )
                .await
                .map(|answer| answer.map(|a| (provider.name().to_owned(), a)))
            }
            (Observed::Live, None) => return not_available(),
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
        out.events.extend(journal.into_events());
        out
    }
}

fn not_available() -> ToolOutput {
    ToolOutput::error(
        "web_search is not available on this service: the operator has not configured a search \
         provider (web.search_provider). Do without it, or use web_fetch on a page you know the \
         URL of.",
    )
}
