//! The search providers `web_search` speaks to — Brave Search, Tavily and SearXNG — as pure
//! request builders and response parsers, so that what is sent and what is understood is
//! tested without a network (and the tool runs them through one HTTP client).
//!
//! A provider is chosen and configured by the operator (its endpoint and key are trusted: they
//! are not subject to the sessions' network policy). Keys go in a header or the body of the
//! request, never in a URL that could be logged.
use serde::Deserialize;
use url::Url;

/// Most results one search returns (the schema's maximum), and the default.
pub const MAX_RESULTS: usize = 20;
pub const DEFAULT_RESULTS: usize = 5;

/// Longest title and snippet kept of a result, in characters.
const MAX_TITLE_CHARS: usize = 300;
const MAX_SNIPPET_CHARS: usize = 1_000;

/// Which provider, and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provider {
    /// `https://api.search.brave.com/res/v1/web/search` unless `endpoint` says otherwise; the
    /// key goes in `X-Subscription-Token`.
    Brave { endpoint: Url, api_key: String },
    /// `https://api.tavily.com/search`; the key goes in `Authorization: Bearer`.
    Tavily { endpoint: Url, api_key: String },
    /// A SearXNG instance's base URL (`…/search?format=json` is appended); JSON output must be
    /// enabled in its settings. No key.
    Searxng { base: Url },
}

impl Provider {
    pub fn name(&self) -> &'static str {
        match self {
            Provider::Brave { .. } => "brave",
            Provider::Tavily { .. } => "tavily",
            Provider::Searxng { .. } => "searxng",
        }
    }
}

/// One HTTP request to a provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchRequest {
    pub post: bool,
    pub url: Url,
    /// Headers to send (a key among them: never log these).
    pub headers: Vec<(&'static str, String)>,
    /// A JSON body, for a POST.
    pub body: Option<serde_json::Value>,
}

/// One result, as the model is shown it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub title: String,
    pub url: String,
    pub snippet: String,
}

/// The request that asks `provider` for `count` results for `query`.
pub fn request(provider: &Provider, query: &str, count: usize) -> SearchRequest {
    let count = count.clamp(1, MAX_RESULTS);
    match provider {
        Provider::Brave { endpoint, api_key } => {
            let mut url = endpoint.clone();
            url.query_pairs_mut()
                .append_pair("q", query)
                .append_pair("count", &count.to_string());
            SearchRequest {
                post: false,
                url,
                headers: vec![
                    ("accept", "application/json".into()),
                    ("x-subscription-token", api_key.clone()),
                ],
                body: None,
            }
        }
        Provider::Tavily { endpoint, api_key } => SearchRequest {
            post: true,
            url: endpoint.clone(),
            headers: vec![
                ("content-type", "application/json".into()),
                ("authorization", format!("Bearer {api_key}")),
            ],
            body: Some(serde_json::json!({"query": query, "max_results": count})),
        },
        Provider::Searxng { base } => {
            let mut url = base.clone();
            {
                let mut path = url.path().trim_end_matches('/').to_owned();
                path.push_str("/search");
                url.set_path(&path);
            }
            url.query_pairs_mut()
                .append_pair("q", query)
                .append_pair("format", "json");
            SearchRequest {
                post: false,
                url,
                headers: vec![("accept", "application/json".into())],
                body: None,
            }
        }
    }
}

/// Why a provider's answer could not be used; said to the model without the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SearchError {
    #[error("the {provider} search provider answered HTTP {status}{hint}")]
    Status {
        provider: &'static str,
        status: u16,
        hint: &'static str,
    },
    #[error("the {provider} search provider's answer is not the JSON it documents: {detail}")]
    Malformed {
        provider: &'static str,
        detail: String,
    },
}

/// The hits in the answer (status `status`, body `body`) of the provider of that
/// [`Provider::name`] (a replay knows its provider by the name its record gives), at most
/// `count`.
pub fn parse_named(
    provider: &str,
    status: u16,
    body: &[u8],
    count: usize,
) -> Result<Vec<Hit>, SearchError> {
    let (name, brave) = match provider {
        "brave" => ("brave", true),
        "tavily" => ("tavily", false),
        "searxng" => ("searxng", false),
        _ => {
            return Err(SearchError::Malformed {
                provider: "unknown",
                detail: format!("no provider is called {provider:?}"),
            });
        }
    };
    if !(200..300).contains(&status) {
        return Err(SearchError::Status {
            provider: name,
            status,
            hint: match status {
                401 | 403 => " (the operator's API key was refused)",
                429 => " (rate limited: try again later, or with fewer searches)",
                _ => "",
            },
        });
    }
    let malformed = |e: serde_json::Error| SearchError::Malformed {
        provider: name,
        detail: e.to_string(),
    };
    let raw: Vec<RawHit> = if brave {
        let r: BraveAnswer = serde_json::from_slice(body).map_err(malformed)?;
        r.web.map(|w| w.results).unwrap_or_default()
    } else {
        let r: ResultsAnswer = serde_json::from_slice(body).map_err(malformed)?;
        r.results
    };
    Ok(raw
        .into_iter()
        .filter(|h| !h.url.is_empty())
        .take(count.clamp(1, MAX_RESULTS))
        .map(|h| Hit {
            title: clean(&h.title, MAX_TITLE_CHARS),
            url: clean(&h.url, 2_000),
            snippet: clean(
                h.description
                    .as_deref()
                    .or(h.content.as_deref())
                    .unwrap_or_default(),
                MAX_SNIPPET_CHARS,
            ),
        })
        .collect())
}

/// The model's view: numbered results, or a line saying there were none.
pub fn render(query: &str, hits: &[Hit]) -> String {
    if hits.is_empty() {
        return format!(
            "No results for \"{query}\". Try fewer or other words, or a more general query."
        );
    }
    let mut out = format!("{} results for \"{query}\":\n", hits.len());
    for (i, h) in hits.iter().enumerate() {
        out.push_str(&format!("\n{}. {}\n   {}\n", i + 1, h.title, h.url));
        if !h.snippet.is_empty() {
            out.push_str(&format!("   {}\n", h.snippet));
        }
    }
    out.push_str("\nUse web_fetch with a result's URL to read the page.");
    out
}

#[derive(Deserialize)]
struct BraveAnswer {
    web: Option<BraveWeb>,
}

#[derive(Deserialize)]
struct BraveWeb {
    #[serde(default)]
    results: Vec<RawHit>,
}

#[derive(Deserialize)]
struct ResultsAnswer {
    #[serde(default)]
    results: Vec<RawHit>,
}

#[derive(Deserialize)]
struct RawHit {
    #[serde(default)]
    title: String,
    #[serde(default)]
    url: String,
    /// Brave's snippet.
    description: Option<String>,
    /// Tavily's and SearXNG's.
    content: Option<String>,
}

/// One line of plain text: markup Brave puts in snippets (`<strong>`) and control characters
/// taken out, whitespace folded, cut at `max` characters.
fn clean(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max * 4));
    let mut in_tag = false;
    let mut last_space = true;
    for c in text.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            _ if in_tag => {}
            c if c.is_whitespace() || c.is_control() => {
                if !last_space {
                    out.push(' ');
                    last_space = true;
                }
            }
            c => {
                out.push(c);
                last_space = false;
            }
        }
    }
    let out = out.trim_end();
    match out.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &out[..i]),
        None => out.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn each_provider_gets_its_documented_request_and_the_key_never_in_the_url() {
        let brave = Provider::Brave {
            endpoint: url("https://api.search.brave.com/res/v1/web/search"),
            api_key: "k-brave".into(),
        };
        let r = request(&brave, "rust & tokio?", 50);
        assert!(!r.post);
        assert_eq!(
            r.url.as_str(),
            "https://api.search.brave.com/res/v1/web/search?q=rust+%26+tokio%3F&count=20"
        );
        assert!(
            r.headers
                .contains(&("x-subscription-token", "k-brave".into()))
        );
        let tavily = Provider::Tavily {
            endpoint: url("https://api.tavily.com/search"),
            api_key: "k-tavily".into(),
        };
        let r = request(&tavily, "q", 3);
        assert!(r.post);
        assert_eq!(
            r.body,
            Some(serde_json::json!({"query": "q", "max_results": 3}))
        );
        assert!(
            r.headers
                .contains(&("authorization", "Bearer k-tavily".into()))
        );
        for base in ["http://127.0.0.1:8888", "http://127.0.0.1:8888/searx/"] {
            let r = request(&Provider::Searxng { base: url(base) }, "a b", 0);
            assert!(r.url.path().ends_with("/search"), "{}", r.url);
            assert!(!r.url.path().contains("//"), "{}", r.url);
            assert_eq!(r.url.query(), Some("q=a+b&format=json"));
        }
        for r in [request(&brave, "q", 1), request(&tavily, "q", 1)] {
            assert!(!r.url.as_str().contains("k-"), "{}", r.url);
        }
    }

    #[test]
    fn answers_become_numbered_clean_results() {
        let body = br#"{"type":"search","web":{"results":[
            {"title":"The <strong>Rust</strong> Book","url":"https://doc.rust-lang.org/book/","description":"Learn\n<strong>Rust</strong>\u0000 here"},
            {"title":"no url","url":""},
            {"title":"Tokio","url":"https://tokio.rs/","description":"async"}]}}"#;
        let hits = parse_named("brave", 200, body, 5).unwrap();
        assert_eq!(hits.len(), 2);
        assert_eq!(hits[0].title, "The Rust Book");
        assert_eq!(hits[0].snippet, "Learn Rust here");
        let text = render("rust", &hits);
        assert!(text.starts_with("2 results for \"rust\":"), "{text}");
        assert!(
            text.contains("\n1. The Rust Book\n   https://doc.rust-lang.org/book/\n"),
            "{text}"
        );
        assert!(text.contains("\n2. Tokio\n"), "{text}");
        // Brave without web results (a query it has nothing for).
        assert_eq!(
            parse_named("brave", 200, br#"{"type":"search"}"#, 5).unwrap(),
            vec![]
        );
        assert!(render("zz", &[]).contains("No results"));

        let body = br#"{"query":"q","results":[{"title":"A","url":"https://a.example/","content":"alpha","score":0.9},
            {"title":"B","url":"https://b.example/","content":"beta"},{"title":"C","url":"https://c.example/","content":"gamma"}]}"#;
        let hits = parse_named("tavily", 200, body, 2).unwrap();
        assert_eq!(
            hits.iter().map(|h| h.title.as_str()).collect::<Vec<_>>(),
            ["A", "B"]
        );
        let body = br#"{"query":"q","number_of_results":1,"results":[{"title":"S","url":"https://s.example/x","content":"sx","engine":"ddg"}]}"#;
        assert_eq!(
            parse_named("searxng", 200, body, 5).unwrap()[0].snippet,
            "sx"
        );
    }

    #[test]
    fn refusals_and_garbage_are_errors_that_say_what_to_do() {
        let e = parse_named("searxng", 403, b"forbidden", 5).unwrap_err();
        assert!(
            e.to_string().contains("HTTP 403") && e.to_string().contains("key"),
            "{e}"
        );
        let e = parse_named("searxng", 429, b"", 5).unwrap_err();
        assert!(e.to_string().contains("rate limited"), "{e}");
        let e = parse_named("searxng", 200, b"<html>json is disabled</html>", 5).unwrap_err();
        assert!(e.to_string().contains("not the JSON"), "{e}");
        let e = parse_named("bing", 200, b"{}", 5).unwrap_err();
        assert!(e.to_string().contains("no provider is called"), "{e}");
    }

    #[test]
    fn long_text_is_cut_on_a_character_boundary() {
        let long = "é".repeat(2_000);
        let cut = clean(&long, MAX_SNIPPET_CHARS);
        assert_eq!(cut.chars().count(), MAX_SNIPPET_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(clean("  a \t b  ", 10), "a b");
    }
}
