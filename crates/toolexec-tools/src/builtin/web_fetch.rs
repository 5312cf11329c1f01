//! `web_fetch`: one page of the web as text for the model. HTML becomes Markdown (scripts,
//! styles and navigation chrome dropped), JSON and plain text pass through, anything else is
//! described by type and size. The text is paged by characters (`start_index`, `max_length`);
//! with a `prompt`, the page goes to the operator's summarizer and its answer comes back.
//!
//! Reaching the page is [`crate::web::fetch`]'s job (the network policy on every hop); this file
//! decides whether this session may fetch at all, and what the model is shown.
use std::time::Duration;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};
use toolexec_workspace::jail::human_bytes;

use toolexec_core::{ExchangeErrorKind, ExchangeRole};

use crate::observe::{Observed, Recorded, Unserved};
use crate::web::{self, FetchError, Fetched, MAX_BODY_BYTES};
use crate::{Tool, ToolContext, ToolOutput, parse_args};

/// Default of `timeout_ms`: long enough for a slow server, short enough for an agent loop.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// Most `timeout_ms` may ask for (SPEC §4).
pub const MAX_TIMEOUT_MS: u64 = 60_000;
/// Default and most of `max_length`, in characters (SPEC §4: output ≤ 100 KB with paging).
pub const MAX_LENGTH: u64 = 100_000;

const DESCRIPTION: &str = "\
Fetches a web page (http or https) and returns its text: HTML converted to Markdown (scripts, \
styles, navigation, headers, footers and sidebars dropped), JSON and plain text as they are. \
Other content (images, PDFs, archives) is not shown; the result gives its type and size.

Use it to read documentation, an API's JSON, a changelog or a README from the web. Long pages come \
in parts: the result says how many characters the page has and which part is shown, and gives the \
`start_index` to ask for the next part. With `prompt`, the page is given to a summarizer model with \
your question and its answer is returned instead of the page (only if the service has one \
configured; otherwise the call fails and says so).

Only public internet addresses can be reached (plus networks the operator allow-listed); local, \
private and cloud-metadata addresses are refused, on every redirect too. Redirects are followed up \
to 5 times; `Refresh` headers and meta refreshes are not followed. The session needs network \
access (`policy.network: \"allow\"`) unless the operator lets web tools reach the internet without \
it. Bodies are read up to 5 MiB. An HTTP error status (4xx, 5xx) makes the call an error that \
still shows the page.

Example: {\"url\": \"https://docs.rs/serde/latest/serde/\", \"max_length\": 20000} returns the first \
20,000 characters of the page as Markdown; call it again with {\"url\": \"…\", \"start_index\": 20000} \
for the next part.";

pub struct WebFetch {
    spec: ToolSpec,
}

impl Default for WebFetch {
    fn default() -> Self {
        Self::new()
    }
}

impl WebFetch {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "web_fetch".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: true,
                capabilities: vec![Capability::Network],
                // Room for `max_length` characters and the lines that say what they are.
                output_limit: OutputLimit::new(101_000, TruncationMode::Head),
            },
        }
    }
}

/// `web_fetch`'s arguments.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The http or https URL to fetch.
    #[schemars(length(min = 1, max = toolexec_net::MAX_URL_LEN))]
    url: String,
    /// A question about the page for the service's summarizer model; its answer is returned instead of the page text.
    #[schemars(length(min = 1, max = 4000))]
    prompt: Option<String>,
    /// Time limit of the whole fetch (redirects, body and summary), milliseconds. Default 30000.
    #[schemars(range(min = 1, max = MAX_TIMEOUT_MS))]
    timeout_ms: Option<u64>,
    /// The character of the page text to start at (from a previous result's next start_index). Default 0.
    #[schemars(range(min = 0))]
    start_index: Option<u64>,
    /// Most characters of page text to return. Default and maximum 100000.
    #[schemars(range(min = 1, max = MAX_LENGTH))]
    max_length: Option<u64>,
}

#[async_trait]
impl Tool for WebFetch {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(output) => return output,
        };
        let web = ctx.web.as_ref();
        if let Some(denied) = web.denied_without_network("web_fetch", &ctx.policy) {
            return denied;
        }
        // Where the answer to `prompt` comes from. A replay serves the recorded answer whether or
        // or not a summarizer is configured now; a replay whose record has none answers as the
        // live call would have, without asking anyone.
        let summarize = match (&args.prompt, &ctx.observed, &web.summarizer) {
            (None, _, _) => None,
            (Some(prompt), Observed::Replay(record), summarizer)
                if summarizer.is_some() || record.has(ExchangeRole::Summary) =>
            {
                Some((prompt.as_str(), Summarize::Record(record)))
            }
            (Some(prompt), Observed::Live, Some(summarizer)) => {
                Some((prompt.as_str(), Summarize::Service(summarizer)))
            }
            (Some(_), _, _) => {
                return ToolOutput::error(
                    "web_fetch was given a `prompt`, but this service has no summarizer model \
                     configured to answer it (the operator's web.summarizer_url and \
                     web.summarizer_model). Call web_fetch again without `prompt` to get the \
                     page text.",
                );
            }
        };
        let mut timeout = Duration::from_millis(args.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS));
        if let Some(left) = ctx.deadline.remaining() {
            timeout = timeout.min(left);
        }
        let journal = ctx.journal.as_ref();
        let work = async {
            let fetched = match &ctx.observed {
                Observed::Live => web::fetch(web, &args.url, journal).await?,
                Observed::Replay(record) => web::replayed_fetch(web, &args.url, record, journal)?,
            };
            // Decoding and converting a page is CPU work that cannot look at the clock: off the
            // async workers, a few at a time for the whole service.
            let _turn = CONVERSIONS.acquire().await;
            let paging = args.clone();
            let (fetched, shown) = tokio::task::spawn_blocking(move || {
                let page = render(&fetched);
                let shown = page_window(&fetched, &page, &paging);
                (fetched, shown)
            })
            .await
            .map_err(|e| FetchError::Http(format!("the page could not be converted ({e})")))?;
            Ok::<_, FetchError>(match (summarize, shown) {
                (Some((prompt, from)), Ok(window)) => {
                    let answer = match from {
                        Summarize::Record(record) => record.answer(ExchangeRole::Summary, journal),
                        Summarize::Service(summarizer) => match web.paid.take(ctx.tenant_id) {
                            Err(wait) => {
                                let message = web.paid.refusal("the summarizer", wait);
                                journal.not_sent(ExchangeRole::Summary, message.clone());
                                Err(Unserved {
                                    kind: ExchangeErrorKind::Quota,
                                    message,
                                })
                            }
                            Ok(()) => {
                                web::ask_summarizer(
                                    summarizer,
                                    fetched.url.as_str(),
                                    &window.text,
                                    prompt,
                                    journal,
                                )
                                .await
                            }
                        },
                    };
                    match answer {
                        Err(e) if e.kind == ExchangeErrorKind::TimedOut => {
                            return Err(FetchError::Recorded {
                                kind: e.kind,
                                message: e.message,
                            });
                        }
                        Err(e) => ToolOutput::error(format!(
                            "The page was fetched, but {} Call web_fetch again without `prompt` \
                             to read the page yourself.",
                            sentence(&e.message)
                        )),
                        Ok(answer) => match web::summary_text(&answer) {
                            Ok(answer) => ToolOutput::ok(format!(
                                "{}\n\nAnswer to the prompt, from the page's characters {}–{} of {}:\n\n{answer}",
                                window.header, window.start, window.end, window.total
                            )),
                            Err(e) => ToolOutput::error(format!(
                                "The page was fetched, but {} Call web_fetch again without \
                                 `prompt` to read the page yourself.",
                                sentence(&e)
                            )),
                        },
                    }
                }
                // An error page is still shown (it often says what went wrong), as an error.
                (None, Ok(window)) if fetched.status >= 400 => ToolOutput::error(window.render()),
                (None, Ok(window)) => ToolOutput::ok(window.render()),
                (_, Err(output)) => output,
            })
        };
        let timed_out = || {
            ToolOutput::timed_out(format!(
                "web_fetch of {} did not finish within {}; nothing was returned. The server may be \
                 slow: try again with a larger timeout_ms (at most {MAX_TIMEOUT_MS}), or another \
                 source.",
                shown_url(&args.url),
                crate::deadline::human_duration(timeout)
            ))
        };
        let mut out = match tokio::time::timeout(timeout, work).await {
            Ok(Ok(output)) => output,
            Ok(Err(e)) if e.kind() == ExchangeErrorKind::TimedOut => timed_out(),
            Ok(Err(e)) if e.is_refusal() => {
                ToolOutput::denied(format!("Cannot fetch {}: {e}.", shown_url(&args.url)))
            }
            Ok(Err(e)) => ToolOutput::error(format!("Cannot fetch {}: {e}.", shown_url(&args.url))),
            Err(_) => {
                // Whatever was under way when the time ran out: the summarizer's answer if the
                // page had come, else the page.
                let role = if journal.has(ExchangeRole::Summary) {
                    ExchangeRole::Summary
                } else {
                    ExchangeRole::Page
                };
                journal.fail_last(role, ExchangeErrorKind::TimedOut, "timed out".to_owned());
                timed_out()
            }
        };
        out.events.extend(journal.drain_events());
        out
    }
}

/// Where the answer to a `prompt` comes from.
enum Summarize<'a> {
    /// The operator's summarizer (live).
    Service(&'a web::Summarizer),
    /// The record of the call a replay re-runs.
    Record(&'a Recorded),
}

/// `text` as a sentence: with a full stop at its end.
fn sentence(text: &str) -> String {
    if text.ends_with('.') {
        text.to_owned()
    } else {
        format!("{text}.")
    }
}

/// The URL as the model gave it, shortened for messages.
fn shown_url(url: &str) -> String {
    const MAX: usize = 200;
    if url.chars().count() <= MAX {
        format!("{url:?}")
    } else {
        format!("{:?}…", url.chars().take(MAX).collect::<String>())
    }
}

/// What a page is as text, or why it is not shown.
enum Page {
    Text { text: String, kind: &'static str },
    NotText { mime: String },
}

/// The page's text: HTML as Markdown, JSON and text as they are (in the charset the header or a
/// `<meta charset>` names); other types are not text.
fn render(fetched: &Fetched) -> Page {
    let header = fetched.content_type.as_deref().unwrap_or("");
    let mime = header
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let header_charset = charset_param(header);
    let is_html = mime == "text/html" || mime == "application/xhtml+xml";
    let is_text = mime.starts_with("text/")
        || mime == "application/json"
        || mime.ends_with("+json")
        || mime == "application/xml"
        || mime.ends_with("+xml")
        || mime == "application/javascript"
        || (mime.is_empty() && !fetched.body.contains(&0));
    if !is_html && !is_text {
        return Page::NotText { mime };
    }
    let charset = header_charset.or_else(|| {
        if is_html {
            meta_charset(&fetched.body)
        } else {
            None
        }
    });
    let encoding = charset
        .and_then(|c| encoding_rs::Encoding::for_label(c.as_bytes()))
        .unwrap_or(encoding_rs::UTF_8);
    // A BOM wins over the label, as in browsers.
    let (decoded, _, _) = encoding.decode(&fetched.body);
    if is_html {
        let (text, converted) = html_to_markdown(&decoded);
        Page::Text {
            text,
            kind: if converted {
                "HTML converted to Markdown"
            } else {
                "HTML shown as plain text (too large or too deeply nested to convert to Markdown)"
            },
        }
    } else {
        Page::Text {
            text: decoded.into_owned(),
            kind: if mime.contains("json") {
                "JSON"
            } else {
                "text"
            },
        }
    }
}

/// `charset=` of a Content-Type value.
fn charset_param(header: &str) -> Option<String> {
    header.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// The charset a page declares in its first 1024 bytes (`<meta charset="…">` or
/// `<meta http-equiv="Content-Type" content="…; charset=…">`), as the HTML standard's prescan
/// looks for it.
fn meta_charset(body: &[u8]) -> Option<String> {
    let head = String::from_utf8_lossy(&body[..body.len().min(1024)]).to_ascii_lowercase();
    let mut rest = head.as_str();
    while let Some(at) = rest.find("<meta") {
        rest = &rest[at + 5..];
        let tag = &rest[..rest.find('>').unwrap_or(rest.len())];
        if let Some(c) = tag.find("charset=") {
            let value = tag[c + 8..].trim_start_matches(['"', '\'']);
            let end = value
                .find(|ch: char| {
                    ch == '"' || ch == '\'' || ch == ';' || ch.is_whitespace() || ch == '/'
                })
                .unwrap_or(value.len());
            if end > 0 {
                return Some(value[..end].to_owned());
            }
        }
    }
    None
}

/// Tags whose content is not the page's text: code, styling and navigation chrome.
const DROPPED_TAGS: &[&str] = &[
    "script", "style", "noscript", "template", "nav", "header", "footer", "aside", "iframe", "svg",
    "canvas", "form", "button", "head",
];

/// Pages converted at once by the whole service (each on a blocking thread).
static CONVERSIONS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// What the Markdown converter is given at most: beyond any of these a page is shown as plain
/// text instead. The converter walks the document tree by recursion (a page of 50,000 nested
/// `<div>`s would overflow a thread's stack and abort the service) and does quadratic work on
/// long runs of sibling elements, so its input is bounded by shape, not only by size.
const MAX_CONVERTED_HTML_BYTES: usize = 2 * 1024 * 1024;
const MAX_CONVERTED_TAGS: usize = 100_000;
const MAX_CONVERTED_DEPTH: usize = 256;

/// Elements that never have content (they do not nest).
const VOID_TAGS: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
    "track", "wbr",
];

/// The page as Markdown, or as plain text (and `false`) when its size or shape is beyond what
/// the converter is given.
fn html_to_markdown(html: &str) -> (String, bool) {
    if html.len() > MAX_CONVERTED_HTML_BYTES || !tame_shape(html) {
        return (html_to_text(html), false);
    }
    let converter = htmd::HtmlToMarkdown::builder()
        .skip_tags(DROPPED_TAGS.to_vec())
        .build();
    match converter.convert(html) {
        Ok(markdown) => (markdown.trim().to_owned(), true),
        // html5ever parses anything; an error here is an I/O error of its in-memory sink.
        Err(_) => (html_to_text(html), false),
    }
}

/// Whether a page has at most [`MAX_CONVERTED_TAGS`] tags nested at most
/// [`MAX_CONVERTED_DEPTH`] deep, by a linear scan that errs on the side of "too deep" (an
/// element closed implicitly, like `<p>` or `<li>`, counts as still open).
fn tame_shape(html: &str) -> bool {
    let b = html.as_bytes();
    let (mut depth, mut tags, mut i) = (0usize, 0usize, 0usize);
    while let Some(at) = b[i..].iter().position(|&c| c == b'<') {
        i += at + 1;
        match b.get(i) {
            Some(b'/') => {
                depth = depth.saturating_sub(1);
                tags += 1;
            }
            Some(c) if c.is_ascii_alphabetic() => {
                let name_len = b[i..]
                    .iter()
                    .position(|c| !c.is_ascii_alphanumeric())
                    .unwrap_or(b.len() - i);
                let name = html[i..i + name_len].to_ascii_lowercase();
                tags += 1;
                if !VOID_TAGS.contains(&name.as_str()) {
                    depth += 1;
                }
            }
            _ => {}
        }
        if tags > MAX_CONVERTED_TAGS || depth > MAX_CONVERTED_DEPTH {
            return false;
        }
    }
    true
}

/// A page's text without its markup, in one pass: tags dropped, the contents of `script`,
/// `style` and `head` too, the common entities decoded, blank runs folded.
fn html_to_text(html: &str) -> String {
    let lower = html.to_ascii_lowercase();
    let mut out = String::with_capacity(html.len() / 2);
    let mut i = 0;
    while i < html.len() {
        let Some(at) = html[i..].find('<') else {
            out.push_str(&html[i..]);
            break;
        };
        out.push_str(&html[i..i + at]);
        i += at;
        let skipped = ["script", "style", "head"].iter().find_map(|tag| {
            let open = format!("<{tag}");
            let boundary = lower.as_bytes().get(i + open.len());
            (lower[i..].starts_with(&open) && !boundary.is_some_and(u8::is_ascii_alphanumeric))
                .then(|| lower[i..].find(&format!("</{tag}")).map(|end| i + end))
                .flatten()
        });
        let from = skipped.unwrap_or(i);
        match html[from..].find('>') {
            Some(end) => {
                i = from + end + 1;
                out.push(' ');
            }
            None => break,
        }
    }
    let decoded = out
        .replace("&nbsp;", " ")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&");
    let mut text = String::with_capacity(decoded.len());
    let mut blank = 0;
    for line in decoded.lines() {
        let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
        if line.is_empty() {
            blank += 1;
            continue;
        }
        if !text.is_empty() {
            text.push_str(if blank > 0 { "\n\n" } else { "\n" });
        }
        text.push_str(&line);
        blank = 0;
    }
    text
}

/// The part of the page text a call returns.
struct Window {
    header: String,
    text: String,
    start: usize,
    end: usize,
    total: usize,
}

impl Window {
    fn render(&self) -> String {
        format!("{}\n\n{}", self.header, self.text)
    }
}

/// The characters `[start_index, start_index + max_length)` of the page and the lines that say
/// what they are, or the tool's answer when there is no text to page through.
fn page_window(fetched: &Fetched, page: &Page, args: &Args) -> Result<Window, ToolOutput> {
    let mut header = format!("URL: {}", fetched.url);
    if fetched.redirects > 0 {
        header.push_str(&format!(
            " (after {} redirect{})",
            fetched.redirects,
            if fetched.redirects == 1 { "" } else { "s" }
        ));
    }
    header.push_str(&format!("\nStatus: {}", fetched.status));
    let (text, kind) = match page {
        Page::NotText { mime } => {
            let mime = if mime.is_empty() {
                "unknown (no Content-Type)"
            } else {
                mime
            };
            let size = if fetched.truncated {
                format!("more than {}", human_bytes(MAX_BODY_BYTES as u64))
            } else {
                human_bytes(fetched.body.len() as u64)
            };
            return Err(ToolOutput::error(format!(
                "{header}\n\nThe response is {mime}, {size}: not text that web_fetch can show. \
                 Look for an HTML or text version of it."
            )));
        }
        Page::Text { text, kind } => (text, *kind),
    };
    let total = text.chars().count();
    let start = usize::try_from(args.start_index.unwrap_or(0)).unwrap_or(usize::MAX);
    let max = usize::try_from(args.max_length.unwrap_or(MAX_LENGTH)).unwrap_or(usize::MAX);
    if start > 0 && start >= total {
        return Err(ToolOutput::error(format!(
            "{header}\n\nstart_index {start} is past the end of the page text, which has {total} \
             characters. Use a start_index below {total}."
        )));
    }
    let text: String = text.chars().skip(start).take(max).collect();
    let end = start + text.chars().count();
    header.push_str(&format!("\nContent: {kind}, {total} characters"));
    if fetched.truncated {
        header.push_str(&format!(
            " (the body was longer than {}; only that much was read)",
            human_bytes(MAX_BODY_BYTES as u64)
        ));
    }
    if end < total {
        header.push_str(&format!(
            "\nShowing characters {start}–{end} of {total}. To read on, call web_fetch again with \
             the same url and start_index: {end}."
        ));
    } else if start > 0 {
        header.push_str(&format!(
            "\nShowing characters {start}–{end} of {total} (the end of the page)."
        ));
    }
    Ok(Window {
        header,
        text,
        start,
        end,
        total,
    })
}
