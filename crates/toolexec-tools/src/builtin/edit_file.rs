//! `edit_file`: replace exact text in a file the session has read.
//!
//! Matching is exact. When the text is not there, the error shows the closest near-match so the
//! model can correct itself; the tool never falls back to a fuzzy match, because a fuzzy match
//! changes text the model did not ask to change.
use std::borrow::Cow;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};

use super::{Action, blocking, check_read, jail_failure, write_edit};
use crate::text::plural;
use crate::text::{
    closest_window, decode_for_edit, describe_difference, has_line_number_prefixes, line_of,
    numbered_range, shown_name, to_crlf, uses_crlf, view_lines,
};
use crate::{CallReads, Deadline, Tool, ToolContext, ToolOutput, parse_args};
use toolexec_workspace::jail::{JailError, Workspace};

/// Lines of unchanged context shown around an edited region.
const SNIPPET_CONTEXT_LINES: usize = 3;

/// Edited regions shown in the output; with `replace_all` over many places the rest is counted.
const MAX_SNIPPETS: usize = 3;

/// Line numbers listed when old_string matches in several places.
const MAX_LISTED_MATCHES: usize = 20;

/// Below this similarity the closest text is not worth showing: the model has the wrong file or
/// an outdated idea of it, and should read it again.
const MIN_NEAR_MATCH_RATIO: f32 = 0.4;

const DESCRIPTION: &str = "\
Replaces exact text in an existing file: `old_string` must appear in the file exactly as written \
(every space, tab and line break) and is replaced by `new_string`.

Use it for targeted changes to a file you have read: a line, a block, a function. To make several \
changes across files in one step use apply_patch; to create a file or rewrite one completely use \
write_file.

Read-before-write: the file must have been read in this session (read_file, read_many_files or a \
grep hit) and must not have changed since; otherwise the call is refused and nothing is written. \
After an edit the session counts as having read the new contents, so further edits need no new read.

Matching is exact, never fuzzy. If old_string is not found, the error shows the most similar text \
in the file with its line numbers and how it differs, so you can copy the exact text and retry. If \
it is found more than once, the error gives the count and the line numbers: add surrounding lines \
to old_string to make it unique, or set `replace_all` to true to replace every occurrence. Do not \
include read_file's line-number prefixes in old_string.

The rest of the file is kept byte for byte: tabs, a missing final newline, the encoding. In a file \
with CRLF (Windows) line endings write old_string and new_string with plain \\n line breaks: they \
are matched as \\r\\n and new_string is written with \\r\\n. Only UTF-8 text files can be edited; \
binary, UTF-16 and other non-UTF-8 files are refused rather than re-encoded.

Example: {\"file_path\": \"src/main.rs\", \"old_string\": \"    println!(\\\"helo\\\");\", \
\"new_string\": \"    println!(\\\"hello\\\");\"} fixes the typo on that line.

Output: a one-line summary and the edited region with line numbers. Limits: files up to 10 MiB.";

pub struct EditFile {
    spec: ToolSpec,
}

impl Default for EditFile {
    fn default() -> Self {
        Self::new()
    }
}

impl EditFile {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "edit_file".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: false,
                capabilities: vec![Capability::FsRead, Capability::FsWrite],
                output_limit: OutputLimit::new(10_000, TruncationMode::Tail),
            },
        }
    }
}

/// `edit_file`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The file to edit: relative to /workspace (src/main.rs) or absolute under it (/workspace/src/main.rs).
    #[schemars(length(min = 1))]
    file_path: String,
    /// The exact text to replace, as it appears in the file (without read_file's line numbers).
    #[schemars(length(min = 1))]
    old_string: String,
    /// The text to put in its place (may be empty to delete old_string).
    new_string: String,
    /// Replace every occurrence of old_string. Default false: old_string must occur exactly once.
    replace_all: Option<bool>,
}

#[async_trait]
impl Tool for EditFile {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(output) => return output,
        };
        let workspace = ctx.workspace.clone();
        let reads = ctx.reads.clone();
        let deadline = ctx.deadline.clone();
        blocking(move || edit(&workspace, &reads, &args, &deadline))
            .await
            .unwrap_or_else(|output| output)
    }
}

fn edit(workspace: &Workspace, reads: &CallReads, args: &Args, deadline: &Deadline) -> ToolOutput {
    if args.old_string == args.new_string {
        return ToolOutput::error(
            "old_string and new_string are identical, so there is nothing to change. Put the \
             text to replace in old_string and its replacement in new_string.",
        );
    }
    let file = match workspace.read(&args.file_path) {
        Ok(file) => file,
        Err(JailError::NotFound { path }) => {
            let path = shown_name(&path);
            return ToolOutput::error(format!(
                "'{path}' does not exist. edit_file changes existing files: use write_file to \
                 create a new one, or find the right path with glob."
            ));
        }
        Err(jail) => return jail_failure(&jail),
    };
    let path = file.path.as_str();
    if let Err(refusal) = check_read(reads, path, &file.sha256, Action::Edit) {
        return ToolOutput::denied(refusal);
    }
    let text = match decode_for_edit(path, &file.bytes, "edit_file") {
        Ok(text) => text,
        Err(refusal) => return ToolOutput::error(refusal),
    };

    let Some((old, new, starts)) = find(text, &args.old_string, &args.new_string) else {
        return ToolOutput::error(not_found(path, text, args));
    };
    if starts.len() > 1 && !args.replace_all.unwrap_or(false) {
        return ToolOutput::error(several_matches(path, text, &starts));
    }

    // Splice, remembering where each replacement lands in the new text for the snippets.
    let mut edited = String::with_capacity(text.len() + starts.len() * new.len());
    let mut regions = Vec::with_capacity(starts.len());
    let mut copied_up_to = 0;
    for &start in &starts {
        edited.push_str(&text[copied_up_to..start]);
        let at = edited.len();
        edited.push_str(&new);
        regions.push((at, edited.len()));
        copied_up_to = start + old.len();
    }
    edited.push_str(&text[copied_up_to..]);

    let content = snippets(&edited, &regions);
    let (written, change) =
        match write_edit(workspace, reads, deadline, &file, edited, Action::Edit) {
            Ok(done) => done,
            Err(output) => return output,
        };
    let summary = summary(&written.path, text, &starts);
    let output = ToolOutput::ok(format!("{summary}\n{content}"));
    match change {
        Some(change) => output.with_change(change),
        None => output,
    }
}

/// Where old_string occurs, with the strings as they will be matched and written. In a CRLF
/// file, strings written with plain `\n` are matched and written as `\r\n` (the LF-normalised
/// view of the file, without converting the lines the edit does not touch); if that finds
/// nothing, the strings are tried exactly as given.
pub(crate) fn find<'a>(
    text: &str,
    old_string: &'a str,
    new_string: &'a str,
) -> Option<(Cow<'a, str>, Cow<'a, str>, Vec<usize>)> {
    let mut attempts = Vec::with_capacity(2);
    if uses_crlf(text) {
        attempts.push((to_crlf(old_string), to_crlf(new_string)));
    }
    attempts.push((Cow::Borrowed(old_string), Cow::Borrowed(new_string)));
    attempts.into_iter().find_map(|(old, new)| {
        let starts: Vec<usize> = text.match_indices(old.as_ref()).map(|(i, _)| i).collect();
        (!starts.is_empty()).then_some((old, new, starts))
    })
}

/// The error for an old_string that is not in the file: the closest text, and how it differs.
fn not_found(path: &str, text: &str, args: &Args) -> String {
    let mut out = format!(
        "old_string was not found in {}; nothing was changed.",
        shown_name(path)
    );
    out.push_str(&near_match_help(
        text,
        &args.old_string,
        &args.new_string,
        "old_string",
        ("read_file", "edit_file"),
    ));
    out
}

/// What follows "not found" in an exact-replace tool's error: the file's text most like
/// `old` (named `field` in the tool's arguments) with how it differs, or that nothing is close;
/// a note when `new` is already there. `tools` names the tool that shows the file and the one
/// to call again.
pub(crate) fn near_match_help(
    text: &str,
    old: &str,
    new: &str,
    field: &str,
    (reader, again): (&str, &str),
) -> String {
    let mut out = String::new();
    let wanted = view_lines(old);
    let file_lines = view_lines(text);
    if has_line_number_prefixes(&wanted) {
        out.push_str(&format!(
            "\n{field} seems to include {reader}'s line-number prefixes (`    12\\t`). \
             Leave them out: give only the file's text."
        ));
    }
    match closest_window(&file_lines, &wanted) {
        Some(near) if near.ratio >= MIN_NEAR_MATCH_RATIO => {
            let first = near.start + 1;
            let last = near.start + near.len;
            let lines = if first == last {
                format!("line {first}")
            } else {
                format!("lines {first}-{last}")
            };
            out.push_str(&format!(
                "\nThe most similar text is at {lines} ({:.0}% similar):\n{}",
                near.ratio * 100.0,
                numbered_range(&file_lines, near.start, near.start + near.len)
            ));
            let window = &file_lines[near.start..near.start + near.len];
            let difference = describe_difference(&wanted, window, first);
            if !difference.is_empty() {
                out.push_str(&format!("It differs from {field} here:\n{difference}\n"));
            }
            out.push_str(&format!(
                "Copy the exact text from the file into {field} ({reader} shows it) and call \
                 {again} again."
            ));
        }
        _ => out.push_str(&format!(
            "\nNothing in the file is close to it. Read the file again with {reader} (it may \
             not contain what you expect) and copy the exact text into {field}."
        )),
    }
    if let Some(at) = (!new.is_empty()).then(|| text.find(new)).flatten() {
        out.push_str(&format!(
            "\nNote: {} already appears in the file (at line {}); the change may \
             already have been made.",
            if field == "old_string" {
                "new_string"
            } else {
                "new_str"
            },
            line_of(text, at)
        ));
    }
    out
}

fn several_matches(path: &str, text: &str, starts: &[usize]) -> String {
    format!(
        "old_string occurs {} times in {} (at {}); nothing was changed. Add surrounding \
         lines to old_string so that it matches exactly one place, or set replace_all to true \
         to replace all {}.",
        starts.len(),
        shown_name(path),
        line_list(text, starts),
        starts.len()
    )
}

fn summary(path: &str, text: &str, starts: &[usize]) -> String {
    format!(
        "Edited {}: replaced {} at {}.",
        shown_name(path),
        plural(starts.len(), "occurrence", "occurrences"),
        line_list(text, starts)
    )
}

/// `line 4`, `lines 4, 9 (2 times), 12`, at most [`MAX_LISTED_MATCHES`] lines then `and N more`.
fn line_list(text: &str, starts: &[usize]) -> String {
    let mut lines: Vec<(usize, usize)> = Vec::new();
    for &at in starts {
        let line = line_of(text, at);
        match lines.last_mut() {
            Some((last, count)) if *last == line => *count += 1,
            _ => lines.push((line, 1)),
        }
    }
    let mut shown: Vec<String> = lines
        .iter()
        .take(MAX_LISTED_MATCHES)
        .map(|&(line, count)| {
            if count == 1 {
                line.to_string()
            } else {
                format!("{line} ({count} times)")
            }
        })
        .collect();
    if lines.len() > MAX_LISTED_MATCHES {
        shown.push(format!("and {} more", lines.len() - MAX_LISTED_MATCHES));
    }
    let label = if lines.len() == 1 { "line" } else { "lines" };
    format!("{label} {}", shown.join(", "))
}

/// The edited regions of the new text, numbered, with a little context, overlapping ones merged.
fn snippets(edited: &str, regions: &[(usize, usize)]) -> String {
    let lines = view_lines(edited);
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for &(start, end) in regions {
        let first = line_of(edited, start) - 1;
        // A replacement ending in a newline ends on the line before the next one starts.
        let end_line = line_of(edited, end.saturating_sub(1).max(start));
        let from = first.saturating_sub(SNIPPET_CONTEXT_LINES);
        let to = (end_line + SNIPPET_CONTEXT_LINES).min(lines.len());
        match ranges.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => ranges.push((from, to)),
        }
    }
    let shown = ranges.len().min(MAX_SNIPPETS);
    let mut out = String::new();
    for (i, &(from, to)) in ranges.iter().take(shown).enumerate() {
        if i > 0 {
            out.push_str("     …\n");
        }
        out.push_str(&numbered_range(&lines, from, to));
    }
    if ranges.len() > shown {
        out.push_str(&format!(
            "     … ({} more edited {} not shown)\n",
            ranges.len() - shown,
            if ranges.len() - shown == 1 {
                "region"
            } else {
                "regions"
            }
        ));
    }
    if lines.is_empty() {
        out.push_str("(The file is now empty.)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crlf_files_match_lf_strings_and_keep_their_endings() {
        let (old, new, starts) = find("a\r\nb\r\nc\r\n", "a\nb", "x\ny").unwrap();
        assert_eq!((old.as_ref(), new.as_ref()), ("a\r\nb", "x\r\ny"));
        assert_eq!(starts, [0]);
    }

    #[test]
    fn a_crlf_file_with_a_lone_lf_line_still_matches_it_as_given() {
        let (old, _, starts) = find("a\r\nb\nc\r\nd\r\n", "b\nc", "q").unwrap();
        assert_eq!(old.as_ref(), "b\nc");
        assert_eq!(starts, [3]);
    }

    #[test]
    fn snippets_show_the_edited_lines_with_context() {
        let edited = "1\n2\n3\n4\nNEW\n6\n7\n8\n9\n";
        let at = edited.find("NEW").unwrap();
        let text = snippets(edited, &[(at, at + 3)]);
        assert_eq!(
            text,
            "     2\t2\n     3\t3\n     4\t4\n     5\tNEW\n     6\t6\n     7\t7\n     8\t8\n"
        );
    }
}
