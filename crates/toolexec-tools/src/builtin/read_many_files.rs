//! `read_many_files`: several files in one call, each shown exactly as read_file shows it.
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};

use std::collections::HashSet;

use super::read_file::{ReadBudget, Window, render_read};
use super::{blocking, jail_failure};
use crate::deadline::{Deadline, human_duration};
use crate::text::{plural, shown_name};
use crate::{Tool, ToolContext, ToolOutput, parse_args};
use toolexec_workspace::jail::{Workspace, human_bytes};

/// Files one call may name: enough for a module and its tests, few enough that the 50,000-
/// character output is not mostly truncation markers.
pub const MAX_PATHS: u64 = 50;

const DESCRIPTION: &str = "\
Reads several text files in one call. Each file is shown as read_file shows it (numbered lines, \
the first 2000 of each), after a header line `=== path ===`.

Use it when you already know you need several files: a module and its tests, a set of configs. \
For one file, or to page through a long one with offset and limit, use read_file; to find files \
use glob or grep.

Each file shown counts as read for read-before-write, exactly as with read_file. A file that \
cannot be shown (missing, binary, outside the workspace, too large) gets its error under its \
header and the others are still read; the call fails only if no file could be shown.

Example: {\"paths\": [\"src/lib.rs\", \"src/parser.rs\", \"tests/parser.rs\"]}

A path named twice is shown once. One call returns at most 1 MiB of file text in all (the \
operator may set another budget): the file it runs out in ends with the offset to continue from, \
and the files after it are not read; a note at the end lists them. Read those with read_file, or \
with another read_many_files call.

Limits: at most 50 paths; per file, the first 2000 lines, lines cut at 2000 characters, files over \
10 MiB refused; 1 MiB of text per call. You are shown at most 50,000 characters (the middle is cut; \
read_output pages through the rest).";

pub struct ReadManyFiles {
    spec: ToolSpec,
}

impl Default for ReadManyFiles {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadManyFiles {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "read_many_files".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: true,
                capabilities: vec![Capability::FsRead],
                output_limit: OutputLimit::new(50_000, TruncationMode::HeadTail),
            },
        }
    }
}

/// `read_many_files`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The files to read: each relative to /workspace or absolute under it.
    #[schemars(length(min = 1, max = MAX_PATHS), inner(length(min = 1)))]
    paths: Vec<String>,
}

#[async_trait]
impl Tool for ReadManyFiles {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(output) => return output,
        };
        let workspace = ctx.workspace.clone();
        let budget = ReadBudget::new(ctx.max_read_bytes);
        let deadline = ctx.deadline.clone();
        let outcome = blocking(move || read_all(&workspace, &args.paths, &budget, &deadline)).await;
        let all = match outcome {
            Ok(all) => all,
            Err(output) => return output,
        };
        // Recorded as the result is delivered: a call the engine stopped waiting for never
        // gets here, so unseen files do not count as read.
        for (path, sha256) in &all.seen {
            ctx.reads.record(path, sha256);
        }
        if all.timed_out {
            ToolOutput::timed_out(all.out)
        } else if all.seen.is_empty() {
            ToolOutput::error(all.out)
        } else {
            ToolOutput::ok(all.out)
        }
    }
}

/// What one call read.
struct ReadAll {
    out: String,
    /// (path, sha256) of the files shown.
    seen: Vec<(String, String)>,
    /// The deadline passed before every file was read.
    timed_out: bool,
}

/// Reads and renders every path in order, within `budget` and until `deadline`.
fn read_all(
    workspace: &Workspace,
    paths: &[String],
    budget: &ReadBudget,
    deadline: &Deadline,
) -> ReadAll {
    let mut out = String::new();
    let mut seen = Vec::new();
    let mut late: Vec<String> = Vec::new();
    // A path named again (as given, or the same file under another name) is shown once: every
    // copy would cost the budget and tell the model nothing new.
    let mut named: HashSet<&str> = HashSet::new();
    let mut resolved: HashSet<String> = HashSet::new();
    let mut not_read: Vec<String> = Vec::new();
    let mut ran_out_in: Option<String> = None;
    for path in paths {
        if !out.is_empty() {
            out.push('\n');
        }
        let body = if !named.insert(path.as_str()) {
            "(Named again: shown above, once.)\n".to_owned()
        } else if !late.is_empty() || deadline.expired() {
            late.push(shown_name(path).into_owned());
            "(Not read: the call's time limit ran out. Read it with read_file.)\n".to_owned()
        } else if budget.used_up() {
            not_read.push(shown_name(path).into_owned());
            format!(
                "(Not read: this call's read budget of {} of text is used up. Read it with \
                 read_file.)\n",
                human_bytes(budget.total as u64)
            )
        } else {
            match workspace.read(path) {
                Err(jail) => jail_failure(&jail).content,
                Ok(file) if resolved.contains(&file.path) => format!(
                    "(The same file as '{}' above: shown once.)\n",
                    shown_name(&file.path)
                ),
                Ok(file) => {
                    let real = file.path.clone();
                    match render_read(file, Window::default_lines(), budget) {
                        Ok(file) => {
                            seen.push((file.path.clone(), file.sha256.clone()));
                            if budget.used_up() && ran_out_in.is_none() {
                                ran_out_in = Some(shown_name(&file.path).into_owned());
                            }
                            resolved.insert(real);
                            out.push_str(&format!("=== {} ===\n", shown_name(&file.path)));
                            out.push_str(&file.text);
                            if !out.ends_with('\n') {
                                out.push('\n');
                            }
                            continue;
                        }
                        Err(failure) => failure.content,
                    }
                }
            }
        };
        out.push_str(&format!("=== {} ===\n{body}", shown_name(path)));
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    if !not_read.is_empty() {
        out.push_str(&format!(
            "\n[Read budget: one call returns at most {} of file text, and it ran out in '{}'. \
             {} not read: {}. Read them with read_file (offset and limit page through a long \
             file) or with another read_many_files call.]\n",
            human_bytes(budget.total as u64),
            ran_out_in.as_deref().unwrap_or("an earlier file"),
            plural(not_read.len(), "file was", "files were"),
            not_read.join(", ")
        ));
    }
    if !late.is_empty() {
        out.push_str(&format!(
            "\n[Time limit: this call stopped at its limit of {} with {} not read: {}. Read \
             them with read_file or another read_many_files call.]\n",
            deadline
                .budget()
                .map_or_else(|| "this call".to_owned(), human_duration),
            plural(late.len(), "file", "files"),
            late.join(", ")
        ));
    }
    ReadAll {
        out,
        timed_out: !late.is_empty(),
        seen,
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

    fn context(files: &[(&str, String)], budget: usize) -> (tempfile::TempDir, ToolContext) {
        let dir = tempfile::tempdir().unwrap();
        for (name, contents) in files {
            std::fs::write(dir.path().join(name), contents).unwrap();
        }
        let mut ctx = ToolContext::new(
            uuid::Uuid::now_v7(),
            Arc::new(Workspace::open(dir.path()).unwrap()),
        );
        ctx.max_read_bytes = budget;
        (dir, ctx)
    }

    async fn read(ctx: &ToolContext, paths: &[&str]) -> ToolOutput {
        ReadManyFiles::new()
            .run(ctx, json!({ "paths": paths }))
            .await
    }

    #[tokio::test]
    async fn one_file_named_fifty_times_is_read_once() {
        let big: String = (0..2000)
            .map(|_| format!("{}\n", "x".repeat(1999)))
            .collect();
        let (_dir, ctx) = context(&[("big.txt", big)], 1024 * 1024);
        let out = read(&ctx, &["big.txt"; 50]).await;
        assert_eq!(out.status, toolexec_core::CallStatus::Ok);
        assert_eq!(
            out.content
                .matches("(Named again: shown above, once.)")
                .count(),
            49
        );
        // The one copy shown stops at the budget, with the offset to continue from.
        assert!(
            out.content.len() < 1024 * 1024 + 10_000,
            "{}",
            out.content.len()
        );
        assert!(
            out.content
                .contains("this call's read budget (1 MiB of text) is used up")
        );
        assert!(out.content.contains("Call read_file with offset="));
    }

    #[tokio::test]
    async fn files_after_the_budget_runs_out_are_listed_not_read() {
        let files: Vec<(String, String)> = (0..5)
            .map(|n| (format!("f{n}.txt"), "0123456789\n".repeat(100)))
            .collect();
        let refs: Vec<(&str, String)> =
            files.iter().map(|(n, c)| (n.as_str(), c.clone())).collect();
        // 100 lines of 18 bytes each once numbered: 1800 bytes a file, so the budget runs out
        // in the second file.
        let (_dir, ctx) = context(&refs, 2500);
        let out = read(&ctx, &["f0.txt", "f1.txt", "f2.txt", "f3.txt", "f4.txt"]).await;
        assert!(
            out.content.contains("=== f0.txt ===\n     1\t0123456789\n"),
            "{}",
            out.content
        );
        assert!(
            out.content.contains("Call read_file with offset="),
            "{}",
            out.content
        );
        assert_eq!(
            out.content
                .matches("(Not read: this call's read budget")
                .count(),
            3
        );
        assert!(
            out.content
                .contains("it ran out in 'f1.txt'. 3 files were not read: f2.txt, f3.txt, f4.txt."),
            "{}",
            out.content
        );
        // What was not read does not count as read for read-before-write.
        assert_eq!(
            ctx.reads
                .check("f2.txt", &toolexec_core::sha256_hex(files[2].1.as_bytes())),
            crate::reads::WriteCheck::NeverRead
        );
    }

    #[tokio::test]
    async fn headers_escape_control_characters_in_names() {
        let (_dir, ctx) = context(&[("a\n=== forged ===", "hi\n".to_owned())], 1024);
        let out = read(&ctx, &["a\n=== forged ===", "missing\u{1b}[2J"]).await;
        assert!(
            out.content
                .starts_with("=== a\\n=== forged === ===\n     1\thi\n"),
            "{}",
            out.content
        );
        assert!(
            out.content.contains("=== missing\\x1b[2J ===\n"),
            "{}",
            out.content
        );
        assert!(!out.content.contains('\u{1b}'), "{}", out.content);
    }
}
