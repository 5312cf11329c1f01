//! `glob`: files by name pattern, newest first. Listing names is not reading: glob results do
//! not count as read for read-before-write.
use std::time::SystemTime;

use async_trait::async_trait;
use globset::GlobBuilder;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};

use super::{MAX_PATTERN_CHARS, blocking, compile_glob, jail_failure};
use crate::text::{plural, relative_to, shown_name};
use crate::walk::{self, Bounds, Flow, Stop};
use crate::{Tool, ToolContext, ToolOutput, parse_args};
use toolexec_workspace::jail::{VIRTUAL_ROOT, Workspace};

/// Paths listed: about 20,000 characters (the tool's output limit) at typical path lengths.
pub const MAX_PATHS: usize = 500;

const DESCRIPTION: &str = "\
Finds files in the workspace whose path matches a glob pattern, and lists them one per line, \
most recently modified first.

Use it to find files by name or extension (`**/*.rs`, `src/**/test_*.py`, `**/Cargo.toml`), or to \
see which files changed last. To search inside files use grep; to see a directory's layout use \
list_dir.

The pattern is matched against each file's path relative to `path` (default: the workspace root): \
`*` and `?` stay within one directory level, `**` spans any number of levels, `{a,b}` is either, \
`[abc]` a character class. So `*.rs` finds .rs files directly in `path` only; `**/*.rs` finds them \
at any depth. Paths in the output are relative to /workspace.

.gitignore rules are respected, symlinks are not followed, and dependency, build and VCS \
directories (.git, node_modules, target, .venv, __pycache__, dist, build) are skipped unless `path` \
is inside one. Listing a file does not count as reading it: read_file it before changing it.

Example: {\"pattern\": \"**/*.{ts,tsx}\", \"path\": \"web/src\"} lists the TypeScript files under \
web/src, newest first.

Limits: at most 500 paths are listed; a note gives the total when there are more. The search \
stops at the call's time limit or after reading the service's limit of directory entries, and \
then says its list is partial: narrow it with `path`.";

pub struct Glob {
    spec: ToolSpec,
}

impl Default for Glob {
    fn default() -> Self {
        Self::new()
    }
}

impl Glob {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "glob".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: true,
                capabilities: vec![Capability::FsRead],
                output_limit: OutputLimit::new(20_000, TruncationMode::Tail),
            },
        }
    }
}

/// `glob`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The glob to match against paths relative to `path`, like **/*.rs or src/**/*.test.ts.
    #[schemars(length(min = 1, max = MAX_PATTERN_CHARS))]
    pattern: String,
    /// The directory to search: relative to /workspace or absolute under it. Default: the workspace root.
    #[schemars(length(min = 1))]
    path: Option<String>,
}

#[async_trait]
impl Tool for Glob {
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
        blocking(move || glob(&workspace, &args, &bounds))
            .await
            .unwrap_or_else(|output| output)
    }
}

fn glob(workspace: &Workspace, args: &Args, bounds: &Bounds) -> ToolOutput {
    // A pattern written as an absolute /workspace path is matched from the workspace root.
    let absolute = format!("{VIRTUAL_ROOT}/");
    let (pattern, path) = match args.pattern.strip_prefix(&absolute) {
        Some(rest) => (rest, "."),
        None => (args.pattern.as_str(), args.path.as_deref().unwrap_or(".")),
    };
    let matcher = match compile_glob(
        pattern,
        GlobBuilder::new(pattern).literal_separator(true),
        "glob pattern",
        "pattern",
        "**/*.rs, src/*.{ts,tsx} or docs/**/README.md",
    ) {
        Ok(matcher) => matcher,
        Err(refusal) => return refusal,
    };
    let dir = match workspace.open_dir(path) {
        Ok(dir) => dir,
        Err(e) => return jail_failure(&e),
    };
    let start = dir.path().to_owned();
    let mut found: Vec<(Option<SystemTime>, String)> = Vec::new();
    let report = walk::walk_files(workspace, dir, bounds, &mut |dir, entry, path| {
        if matcher.is_match(relative_to(&start, path)) {
            found.push((dir.modified(entry), walk::shown_path(dir, entry)));
        }
        Flow::Continue
    });
    // Newest first; files whose time cannot be read go last; ties in path order.
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));

    let where_ = if start == "." {
        "the workspace".to_owned()
    } else {
        shown_name(&start).into_owned()
    };
    if found.is_empty() {
        let mut out = format!(
            "No files match {pattern:?} in {where_} ({} looked at).",
            plural(report.files, "file", "files")
        );
        if !pattern.contains('/') {
            out.push_str(&format!(
                " `*` does not cross directories: to match at any depth use \"**/{pattern}\"."
            ));
        }
        for note in walk::notes(&report) {
            out.push('\n');
            out.push_str(&note);
        }
        if let Some(note) = stop_note(&report, bounds) {
            out.push('\n');
            out.push_str(&note);
        }
        return finished(out, report.stopped);
    }
    let total = found.len();
    let mut out: String = found
        .iter()
        .take(MAX_PATHS)
        .map(|(_, path)| format!("{path}\n"))
        .collect();
    if total > MAX_PATHS {
        out.push_str(&format!(
            "\nShowing the {MAX_PATHS} most recently modified of {total} matching files. Use a \
             narrower pattern or path to see the rest.\n"
        ));
    }
    if let Some(note) = stop_note(&report, bounds) {
        out.push('\n');
        out.push_str(&note);
        out.push('\n');
    }
    finished(out, report.stopped)
}

/// Where the walk stopped early and how to narrow the search, if it did.
fn stop_note(report: &walk::WalkReport, bounds: &Bounds) -> Option<String> {
    let stop = report.stopped?;
    Some(format!(
        "{} Give a narrower `path`: the directory to look in (for example \"src\" with the \
         pattern \"**/*.rs\").",
        stop.sentence("search", bounds, report)
    ))
}

/// `timed_out` when the walk stopped at the deadline (the list is what it found so far).
fn finished(out: String, stopped: Option<Stop>) -> ToolOutput {
    match stopped {
        Some(Stop::Time) => ToolOutput::timed_out(out),
        _ => ToolOutput::ok(out),
    }
}
