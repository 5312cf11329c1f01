//! `grep`: regex search over the workspace's files with ripgrep's matcher and searcher.
//!
//! The walk is `crate::walk` (jailed, symlinks never followed, `.gitignore` and the default
//! exclusions applied). Files with shown matches count as read for read-before-write: the hash
//! recorded is that of the whole file as searched.
use std::io::Read;

use async_trait::async_trait;
use globset::{GlobBuilder, GlobSet};
use grep_matcher::LineTerminator;
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkMatch};
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};

use super::{MAX_PATTERN_CHARS, blocking, compile_glob, jail_failure};
use crate::deadline::Deadline;
use crate::text::{BINARY_SNIFF_BYTES, plural, relative_to, shown_line, shown_name};
use crate::walk::{self, Bounds, Flow, Stop, WalkReport};
use crate::{Tool, ToolContext, ToolOutput, parse_args};
use toolexec_workspace::jail::{FileContents, JailError, MAX_READ_BYTES, Workspace, human_bytes};

/// Matching lines shown when the call gives no `max_results`: enough to see the shape of the
/// answer, few enough that the model narrows the search instead of paging through it.
pub const DEFAULT_MAX_RESULTS: u64 = 100;

/// The most matching lines one call may ask for; about the 30,000-character output limit at
/// typical line lengths.
pub const MAX_RESULTS: u64 = 1000;

/// Files over the size limit named in the note about them; the rest are counted.
const MAX_NAMED_TOO_LARGE: usize = 20;

/// Characters of a matching line shown before it is cut: a match in a minified file should not
/// fill the output.
pub const MAX_LINE_CHARS: usize = 500;

/// Largest compiled form (NFA) of a pattern, in bytes: the regex crate's own default (ripgrep
/// raises it to 100 MiB for a user at a terminal). `a{1000}{1000}`, a million states, is
/// refused in milliseconds instead of being built and searched for minutes; `\w{100}` with
/// Unicode classes still fits.
pub const REGEX_SIZE_LIMIT: usize = 10 * 1024 * 1024;

/// Cache of the lazy DFA of one search, in bytes (grep-regex defaults to 1000 MiB, per search
/// thread). Past it the cache is cleared and refilled: slower, never wrong. Much smaller and
/// Unicode-class patterns thrash (`\w{100}` over 10 MiB of text: 9.6 s with 2 MiB, 0.4 s with
/// 10 MiB, debug build).
pub const REGEX_DFA_SIZE_LIMIT: usize = 10 * 1024 * 1024;

/// Bytes the searcher is handed per read of a file: how much text is searched between two
/// looks at the call's deadline.
const SEARCH_CHUNK: usize = 64 * 1024;

const DESCRIPTION: &str = "\
Searches file contents in the workspace for a regular expression and returns matching lines as \
`path:line:content`, sorted by path and line.

Use it to find where something is defined or used, to find which files mention a name, or to look \
into files too big to read whole. To find files by name use glob; to read a whole file use \
read_file.

The pattern is a Rust/ripgrep regex: `fn\\s+main`, `TODO|FIXME`, `log.*Error`; escape special \
characters to match them literally (`\\(`, `\\.`, `\\[`). A match never spans lines. \
`case_insensitive` (default false) ignores case. `path` is a directory to search (default: the \
whole workspace) or a single file. `glob_filter` limits the files searched: a pattern without `/` \
matches file names anywhere (`*.rs`, `*.{ts,tsx}`); with `/` it matches the path relative to \
`path` (`src/**/*.rs`).

.gitignore rules are respected, symlinks are not followed, binary files are skipped, and \
dependency, build and VCS directories (.git, node_modules, target, .venv, __pycache__, dist, build) \
are skipped unless `path` is inside one. Files with matches shown count as read for \
read-before-write, so you can edit them with edit_file right away.

Example: {\"pattern\": \"fn\\\\s+parse_\\\\w+\", \"path\": \"src\", \"glob_filter\": \"*.rs\"} \
finds the parse_ functions under src/.

Limits: `max_results` matching lines (default 100, at most 1000); a note says when there were \
more. Lines are cut at 500 characters. Files over 10 MiB are not searched (a note says which). \
A pattern too complex to compile (like `a{1000}{1000}`) is refused: simplify it. A search \
stops at the call's time limit or after reading the service's limit of directory entries, \
and then says its results are partial: narrow it with `path` or `glob_filter`.";

pub struct Grep {
    spec: ToolSpec,
}

impl Default for Grep {
    fn default() -> Self {
        Self::new()
    }
}

impl Grep {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "grep".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: true,
                capabilities: vec![Capability::FsRead],
                output_limit: OutputLimit::new(30_000, TruncationMode::Tail),
            },
        }
    }
}

/// `grep`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The regular expression to search for (Rust/ripgrep syntax).
    #[schemars(length(min = 1, max = MAX_PATTERN_CHARS))]
    pattern: String,
    /// The directory (or one file) to search: relative to /workspace or absolute under it. Default: the whole workspace.
    #[schemars(length(min = 1))]
    path: Option<String>,
    /// Only search files matching this glob: `*.rs` matches names anywhere; a pattern with `/` matches paths relative to `path`.
    #[schemars(length(min = 1, max = MAX_PATTERN_CHARS))]
    glob_filter: Option<String>,
    /// Ignore case. Default false.
    case_insensitive: Option<bool>,
    /// The most matching lines to return. Default 100, at most 1000.
    #[schemars(range(min = 1, max = MAX_RESULTS))]
    max_results: Option<u64>,
}

#[async_trait]
impl Tool for Grep {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(output) => return output,
        };
        let workspace = ctx.workspace.clone();
        let bounds = Bounds::of(ctx);
        let (out, seen) = match blocking(move || grep(&workspace, &args, &bounds)).await {
            Ok(done) => done,
            Err(output) => return output,
        };
        // Recorded as the result is delivered: a call the engine stopped waiting for never
        // gets here, so files whose lines nobody saw do not count as read.
        for (path, sha256) in &seen {
            ctx.reads.record(path, sha256);
        }
        out
    }
}

/// One matching line.
#[derive(Debug)]
struct Hit {
    line: u64,
    text: String,
}

/// The search state across files.
struct Search {
    matcher: RegexMatcher,
    searcher: Searcher,
    filter: Option<Filter>,
    deadline: Deadline,
    /// A file's search was cut at the deadline.
    timed_out: bool,
    limit: usize,
    shown: usize,
    more: bool,
    out: String,
    /// (path, sha256) of the files whose matches were shown.
    seen: Vec<(String, String)>,
    /// Files actually searched (after `glob_filter`).
    searched: usize,
    binary: usize,
    too_large: Vec<String>,
    unreadable: usize,
}

/// `glob_filter`, compiled.
struct Filter {
    matcher: GlobSet,
    /// A pattern without `/` matches file names; one with `/` matches paths below the start.
    by_name: bool,
}

/// The output, and the (path, sha256) of the files whose matches it shows.
type Searched = (ToolOutput, Vec<(String, String)>);

fn grep(workspace: &Workspace, args: &Args, bounds: &Bounds) -> Searched {
    let matcher = match compile_regex(&args.pattern, args.case_insensitive.unwrap_or(false)) {
        Ok(matcher) => matcher,
        Err(refusal) => return (refusal, Vec::new()),
    };
    let filter = match args.glob_filter.as_deref().map(compile_filter).transpose() {
        Ok(filter) => filter,
        Err(refusal) => return (refusal, Vec::new()),
    };
    let limit = args
        .max_results
        .unwrap_or(DEFAULT_MAX_RESULTS)
        .clamp(1, MAX_RESULTS) as usize;
    let mut search = Search {
        matcher,
        searcher: SearcherBuilder::new()
            .line_number(true)
            .line_terminator(LineTerminator::crlf())
            .binary_detection(BinaryDetection::quit(b'\x00'))
            .build(),
        filter,
        deadline: bounds.deadline.clone(),
        timed_out: false,
        limit,
        shown: 0,
        more: false,
        out: String::new(),
        seen: Vec::new(),
        searched: 0,
        binary: 0,
        too_large: Vec::new(),
        unreadable: 0,
    };

    let path = args.path.as_deref().unwrap_or(".");
    let (scope, report) = match workspace.open_dir(path) {
        Ok(dir) => {
            let start = dir.path().to_owned();
            let report = walk::walk_files(workspace, dir, bounds, &mut |dir, entry, path| {
                let relative = relative_to(&start, path);
                if !search.wanted(&entry.name, relative) {
                    return Flow::Continue;
                }
                search.file(&walk::shown_path(dir, entry), dir.read_child(entry))
            });
            (start, report)
        }
        // One file: searched whatever its name, its place or the ignore rules say.
        Err(JailError::NotADirectory { .. }) => match workspace.read(path) {
            Ok(file) => {
                let scope = file.path.clone();
                search.file(&shown_name(&scope), Ok(file));
                (scope, WalkReport::default())
            }
            Err(JailError::TooLarge { path, size, .. }) => {
                return (
                    ToolOutput::error(format!(
                        "'{path}' is {}, over the {} limit for searching a file. Use the shell \
                     (rg or grep) to search it.",
                        human_bytes(size),
                        human_bytes(MAX_READ_BYTES)
                    )),
                    Vec::new(),
                );
            }
            Err(e) => return (jail_failure(&e), Vec::new()),
        },
        Err(e) => return (jail_failure(&e), Vec::new()),
    };

    let stopped = report.stopped.or(search.timed_out.then_some(Stop::Time));
    let seen = std::mem::take(&mut search.seen);
    let content = search.finish(&args.pattern, &scope, &report, stopped, bounds);
    let out = match stopped {
        Some(Stop::Time) => ToolOutput::timed_out(content),
        _ => ToolOutput::ok(content),
    };
    (out, seen)
}

/// The pattern compiled within the size limits, or the refusal for the model
/// (`invalid_arguments`: the pattern is the argument at fault).
fn compile_regex(pattern: &str, case_insensitive: bool) -> Result<RegexMatcher, ToolOutput> {
    let refuse = |content: String| ToolOutput {
        status: toolexec_core::CallStatus::InvalidArguments,
        content,
        changes: Vec::new(),
        events: Vec::new(),
        structured: None,
    };
    RegexMatcherBuilder::new()
        .case_insensitive(case_insensitive)
        .crlf(true)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_DFA_SIZE_LIMIT)
        .build(pattern)
        .map_err(|e| {
            let e = e.to_string();
            if e.contains("exceeds size limit") {
                refuse(format!(
                    "Invalid regex {pattern:?} (arguments/pattern): it is too complex to search \
                     with: compiled, it exceeds the limit of {} MiB. Large counted repetitions \
                     make it big (a{{1000}}, \\w{{200}}, and nested ones above all, like \
                     (ab){{100}}{{100}}). Simplify the pattern: use smaller counts, or + and * \
                     instead of exact counts and check the lines found.",
                    REGEX_SIZE_LIMIT / (1024 * 1024)
                ))
            } else {
                refuse(format!(
                    "Invalid regex {pattern:?} (arguments/pattern): {e}\nThe pattern uses Rust \
                     regex syntax (like ripgrep). Escape special characters to match them \
                     literally (\\( \\) \\[ \\. \\* \\+ \\? \\{{ \\|), and note that a match \
                     cannot span lines."
                ))
            }
        })
}

fn compile_filter(glob: &str) -> Result<Filter, ToolOutput> {
    let matcher = compile_glob(
        glob,
        GlobBuilder::new(glob).literal_separator(true),
        "glob_filter",
        "glob_filter",
        "*.rs, *.{ts,tsx} or src/**/*.py",
    )?;
    Ok(Filter {
        matcher,
        by_name: !glob.contains('/'),
    })
}

impl Search {
    fn wanted(&self, name: &str, relative: &str) -> bool {
        match &self.filter {
            None => true,
            Some(filter) if filter.by_name => filter.matcher.is_match(name),
            Some(filter) => filter.matcher.is_match(relative),
        }
    }

    /// Searches one file; `shown` is its path as printed (escaped, see `shown_name`).
    fn file(&mut self, shown: &str, read: Result<FileContents, JailError>) -> Flow {
        self.searched += 1;
        let file = match read {
            Ok(file) => file,
            Err(JailError::TooLarge { .. }) => {
                self.too_large.push(shown.to_owned());
                return Flow::Continue;
            }
            // Hard links, special files swapped in, permission problems: not searched.
            Err(_) => {
                self.unreadable += 1;
                return Flow::Continue;
            }
        };
        if file.bytes[..file.bytes.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
            self.binary += 1;
            return Flow::Continue;
        }
        let mut sink = Collect {
            hits: Vec::new(),
            // One more than can be shown, to know whether there are more.
            room: self.limit - self.shown + 1,
            binary: false,
        };
        // Read through the deadline: a search that takes long inside one big file (a costly
        // pattern) stops within a chunk of the deadline, keeping the lines it found.
        let reader = UntilDeadline {
            rest: &file.bytes,
            deadline: &self.deadline,
        };
        if self
            .searcher
            .search_reader(&self.matcher, reader, &mut sink)
            .is_err()
        {
            if !self.deadline.expired() {
                self.unreadable += 1;
                return Flow::Continue;
            }
            self.timed_out = true;
        }
        if sink.binary {
            self.binary += 1;
            return Flow::Continue;
        }
        if sink.hits.is_empty() {
            return Flow::Continue;
        }
        let room = self.limit - self.shown;
        if sink.hits.len() > room {
            self.more = true;
            sink.hits.truncate(room);
        }
        if !sink.hits.is_empty() {
            self.seen.push((file.path.clone(), file.sha256.clone()));
        }
        for hit in &sink.hits {
            self.out
                .push_str(&format!("{shown}:{}:{}\n", hit.line, hit.text));
        }
        self.shown += sink.hits.len();
        if self.more || self.timed_out {
            Flow::Stop
        } else {
            Flow::Continue
        }
    }

    fn finish(
        mut self,
        pattern: &str,
        scope: &str,
        report: &WalkReport,
        stopped: Option<Stop>,
        bounds: &Bounds,
    ) -> String {
        let mut notes = Vec::new();
        if let Some(stop) = stopped {
            notes.push(format!(
                "{} Narrow the search with `path` (a subdirectory or one file) or `glob_filter` \
                 (for example \"*.rs\").",
                stop.sentence("search", bounds, report)
            ));
        }
        if self.shown == 0 {
            self.out = format!(
                "No matches for {pattern:?} in {} ({} searched).\n",
                if scope == "." {
                    "the workspace".into()
                } else {
                    shown_name(scope)
                },
                plural(self.searched, "file", "files")
            );
            notes.extend(walk::notes(report));
        } else if self.more {
            notes.push(format!(
                "Showing the first {}; there are more. Narrow the search with `path` or \
                 `glob_filter`, or raise `max_results` (at most {MAX_RESULTS}).",
                plural(self.shown, "matching line", "matching lines")
            ));
        }
        if !self.too_large.is_empty() {
            // Named up to a few: a walk can meet up to 100,000 (sparse) files over the limit,
            // and the note must not grow with them.
            let named = &self.too_large[..self.too_large.len().min(MAX_NAMED_TOO_LARGE)];
            let more = self.too_large.len() - named.len();
            notes.push(format!(
                "Not searched, over {}: {}{} (use the shell: rg PATTERN FILE).",
                human_bytes(MAX_READ_BYTES),
                named.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ));
        }
        if self.unreadable > 0 {
            notes.push(format!(
                "{} could not be read (hard-linked or changing) and {} not searched.",
                plural(self.unreadable, "file", "files"),
                if self.unreadable == 1 { "was" } else { "were" }
            ));
        }
        if self.shown == 0 && self.binary > 0 {
            notes.push(format!(
                "{} skipped.",
                plural(self.binary, "binary file was", "binary files were")
            ));
        }
        if !notes.is_empty() {
            self.out.push('\n');
            self.out.push_str(&notes.join("\n"));
            self.out.push('\n');
        }
        self.out
    }
}

/// A file's bytes handed to the searcher a chunk at a time, refusing to go on once the call's
/// deadline has passed (the search then ends with an error, and the lines found are kept).
struct UntilDeadline<'a> {
    rest: &'a [u8],
    deadline: &'a Deadline,
}

impl Read for UntilDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.deadline.expired() {
            return Err(std::io::Error::from(std::io::ErrorKind::TimedOut));
        }
        let n = buf.len().min(self.rest.len()).min(SEARCH_CHUNK);
        buf[..n].copy_from_slice(&self.rest[..n]);
        self.rest = &self.rest[n..];
        Ok(n)
    }
}

/// Collects matching lines until there is no more room.
struct Collect {
    hits: Vec<Hit>,
    room: usize,
    binary: bool,
}

impl Sink for Collect {
    type Error = std::io::Error;

    fn matched(&mut self, _: &Searcher, found: &SinkMatch<'_>) -> Result<bool, Self::Error> {
        let raw = String::from_utf8_lossy(found.bytes());
        // The line is file content, printed after a `path:line:` prefix: escaped like names
        // except for tabs (see `shown_line`), so that it cannot forge result lines.
        let line = raw.trim_end_matches(['\n', '\r']);
        let text = match line.char_indices().nth(MAX_LINE_CHARS) {
            None => shown_line(line).into_owned(),
            Some((cut, _)) => format!(
                "{}… [line cut: {} more characters]",
                shown_line(&line[..cut]),
                line[cut..].chars().count()
            ),
        };
        self.hits.push(Hit {
            line: found.line_number().unwrap_or(0),
            text,
        });
        Ok(self.hits.len() < self.room)
    }

    fn binary_data(&mut self, _: &Searcher, _: u64) -> Result<bool, Self::Error> {
        self.binary = true;
        Ok(false)
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests build their fixtures on the host"
)]
mod tests {
    use serde_json::json;
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn names_and_matched_lines_cannot_forge_result_lines() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a\nfake.rs:1:"),
            "needle one\n\tneedle\rsrc/forged.rs:9:needle \u{1b}[8m hidden\n",
        )
        .unwrap();
        let ctx = ToolContext::new(
            uuid::Uuid::now_v7(),
            Arc::new(Workspace::open(dir.path()).unwrap()),
        );
        let out = Grep::new().run(&ctx, json!({"pattern": "needle"})).await;
        assert_eq!(
            out.content,
            "a\\nfake.rs:1::1:needle one\n\
             a\\nfake.rs:1::2:\tneedle\\rsrc/forged.rs:9:needle \\x1b[8m hidden\n"
        );
        let glob = super::super::glob::Glob::new()
            .run(&ctx, json!({"pattern": "*"}))
            .await;
        assert_eq!(glob.content, "a\\nfake.rs:1:\n");
    }

    #[tokio::test]
    async fn the_note_about_files_too_large_to_search_names_a_few_and_counts_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        for n in 0..25 {
            let f = std::fs::File::create(dir.path().join(format!("big{n:02}.bin"))).unwrap();
            f.set_len(MAX_READ_BYTES + 1).unwrap();
        }
        let ctx = ToolContext::new(
            uuid::Uuid::now_v7(),
            Arc::new(Workspace::open(dir.path()).unwrap()),
        );
        let out = Grep::new().run(&ctx, json!({"pattern": "x"})).await;
        assert!(
            out.content.contains("big00.bin, big01.bin,")
                && out.content.contains("big19.bin and 5 more (use the shell"),
            "{}",
            out.content
        );
        assert!(!out.content.contains("big20.bin"), "{}", out.content);
    }
}
