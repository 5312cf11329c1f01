//! `str_replace_based_edit_tool`: Anthropic's text editor (`text_editor_20250728`), with its
//! command names, arguments and the meaning of its reference implementation's messages, so that
//! a model trained on it needs no other manual.
//!
//! It is a front for the file tools, not a second implementation: `view` reads like read_file
//! (and counts as a read) or lists like list_dir, `create` writes like write_file (but never
//! over an existing file), `str_replace` matches like edit_file and `insert` adds lines; every
//! change goes through the same jail, read-before-write check and write path
//! (`write_edit` in `builtin`), and is recorded the same way. 20250728 has no `undo_edit`, and
//! neither does this tool: the session's log and rewind are the undo.
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};

use super::edit_file::{find, near_match_help};
use super::{Action, blocking, check_read, jail_failure, too_late, write_edit, written_change};
use crate::text::{
    BINARY_SNIFF_BYTES, decode_for_edit, line_of, numbered, shown_name, to_crlf, uses_crlf,
    view_lines,
};
use crate::walk::Bounds;
use crate::{CallReads, Deadline, Tool, ToolContext, ToolOutput, parse_args};
use toolexec_workspace::jail::{FileContents, JailError, Workspace, human_bytes};

/// Lines of unchanged context around an edit in the snippet shown after it (the reference
/// implementation's `SNIPPET_LINES`).
const SNIPPET_LINES: usize = 4;

/// Line numbers listed when old_str matches in several places.
const MAX_LISTED_LINES: usize = 20;

/// Directory levels a `view` of a directory shows (the reference's `find -maxdepth 2`).
const DIRECTORY_DEPTH: usize = 2;

const DESCRIPTION: &str = "\
Anthropic's text editor (text_editor_20250728): view, create and edit files in the workspace. \
Every call has a `command` and a `path` (absolute under /workspace, like /workspace/src/main.rs, \
or relative to it).

Commands:
- view: show a file with line numbers like `cat -n`, or, for a directory, its files and \
directories two levels deep. `view_range: [start, end]` (1-based, inclusive; end -1 means to the \
end of the file) shows part of a file. `max_characters` cuts the shown text after that many \
characters.
- create: write a new file with `file_text` (missing parent directories are created). An \
existing file is never overwritten: edit it with str_replace or insert.
- str_replace: replace `old_str`, which must appear exactly once in the file (every space, tab \
and line break), with `new_str` (empty or left out: delete it). If it appears zero times or \
more than once nothing is changed and the error says how often and on which lines: add \
surrounding lines to make it unique.
- insert: insert `new_str` as whole lines after line `insert_line` (0 inserts at the top of the \
file; the number of lines of the file appends at the end).

Read-before-write: str_replace and insert change a file only if this session has viewed it (or \
read it with read_file, read_many_files, or seen it in a grep hit) and it has not changed since; \
otherwise the call is refused and nothing is written. After an edit the session counts as \
having read the new contents. Only UTF-8 text files are edited; a file with CRLF line endings \
keeps them.

Example: {\"command\": \"str_replace\", \"path\": \"/workspace/app.py\", \"old_str\": \
\"print('helo')\", \"new_str\": \"print('hello')\"}

There is no undo_edit: to go back, edit again (or rewind the session). Limits: files up to \
10 MiB; a view returns at most 1 MiB of text (the operator may set another budget) and lines \
longer than 2000 characters are cut.";

pub struct TextEditor {
    spec: ToolSpec,
}

impl Default for TextEditor {
    fn default() -> Self {
        Self::new()
    }
}

impl TextEditor {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "str_replace_based_edit_tool".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: false,
                capabilities: vec![Capability::FsRead, Capability::FsWrite],
                output_limit: OutputLimit::new(50_000, TruncationMode::HeadTail),
            },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Command {
    View,
    Create,
    StrReplace,
    Insert,
}

/// `str_replace_based_edit_tool`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// What to do: view, create, str_replace or insert.
    command: Command,
    /// The file or directory: absolute under /workspace (/workspace/src/main.rs) or relative to it.
    #[schemars(length(min = 1))]
    path: String,
    /// create: the new file's contents.
    file_text: Option<String>,
    /// view: the lines to show, [start, end], 1-based and inclusive; end -1 means to the end of the file.
    #[schemars(length(min = 2, max = 2))]
    view_range: Option<Vec<i64>>,
    /// view: show at most this many characters of the file.
    #[schemars(range(min = 1))]
    max_characters: Option<u64>,
    /// str_replace: the exact text to replace; it must occur exactly once.
    old_str: Option<String>,
    /// str_replace: the replacement (default empty: delete old_str). insert: the text to insert.
    new_str: Option<String>,
    /// insert: the line after which new_str goes; 0 inserts at the top of the file.
    insert_line: Option<i64>,
}

#[async_trait]
impl Tool for TextEditor {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(output) => return output,
        };
        let ctx = ctx.clone();
        blocking(move || match args.command {
            Command::View => view(&ctx, &args),
            Command::Create => create(&ctx, &args),
            Command::StrReplace => str_replace(&ctx, &args),
            Command::Insert => insert(&ctx, &args),
        })
        .await
        .unwrap_or_else(|output| output)
    }
}

/// The path as the model gave it, safe to print (the reference's messages name it so).
fn given(args: &Args) -> std::borrow::Cow<'_, str> {
    shown_name(&args.path)
}

/// A parameter a command needs and the call left out, in the reference's words.
fn required(parameter: &str, command: &str) -> ToolOutput {
    ToolOutput {
        status: toolexec_core::CallStatus::InvalidArguments,
        content: format!("Parameter `{parameter}` is required for command: {command}"),
        changes: Vec::new(),
        events: Vec::new(),
        structured: None,
    }
}

/// Reads the file a command works on; the reference's messages for a path that is missing or a
/// directory, the jail's for everything else.
fn read(workspace: &Workspace, args: &Args) -> Result<FileContents, ToolOutput> {
    workspace
        .read(&args.path)
        .map_err(|e| read_failure(&e, args))
}

fn read_failure(e: &JailError, args: &Args) -> ToolOutput {
    match e {
        JailError::NotFound { .. } => ToolOutput::error(format!(
            "The path {} does not exist. Please provide a valid path.",
            given(args)
        )),
        JailError::IsADirectory { .. } => ToolOutput::error(format!(
            "The path {} is a directory and only the `view` command can be used on directories",
            given(args)
        )),
        other => jail_failure(other),
    }
}

fn view(ctx: &ToolContext, args: &Args) -> ToolOutput {
    let file = match ctx.workspace.read(&args.path) {
        Ok(file) => file,
        Err(JailError::IsADirectory { .. }) => return view_directory(ctx, args),
        Err(e) => return read_failure(&e, args),
    };
    let bytes = &file.bytes;
    if bytes[..bytes.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
        return ToolOutput::error(format!(
            "Cannot view {}: it looks like a binary file ({} bytes, with NUL bytes near the \
             start). The text editor shows text only; inspect it with the shell instead.",
            given(args),
            bytes.len()
        ));
    }
    let text = String::from_utf8_lossy(bytes);
    let lines = view_lines(&text);
    let total = lines.len();
    let (first, last) = match &args.view_range {
        None => (1, total),
        Some(range) => match check_range(range, total) {
            Ok(window) => window,
            Err(message) => return ToolOutput::error(message),
        },
    };
    let shown = &lines[(first - 1).min(total)..last.min(total)];
    // Whole numbered lines while they fit the call's read budget and its max_characters, so
    // that even a 10 MiB file of one-character lines costs no more than the budget; a note
    // says where to go on from.
    let budget = ctx.max_read_bytes;
    let max_chars = args
        .max_characters
        .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    let (mut body, mut chars_used) = (String::new(), 0usize);
    let mut notes = Vec::new();
    for (i, line) in shown.iter().enumerate() {
        let numbered_line = numbered(&[line], first + i);
        let chars = numbered_line.chars().count();
        let limit = if chars_used + chars > max_chars {
            format!("max_characters ({max_chars})")
        } else if body.len() + numbered_line.len() > budget {
            format!("this call's read budget ({})", human_bytes(budget as u64))
        } else {
            body.push_str(&numbered_line);
            chars_used += chars;
            continue;
        };
        let next = first + i;
        notes.push(format!(
            "… stopped before line {next}: {limit} reached. View from there with view_range \
             [{next}, -1]."
        ));
        break;
    }
    if std::str::from_utf8(bytes).is_err() {
        notes.push("(The file is not valid UTF-8; invalid bytes are shown as \u{FFFD}.)".into());
    }
    // Recorded as the result is delivered, like read_file: a view counts as a read.
    ctx.reads.record(&file.path, &file.sha256);
    let mut out = format!(
        "Here's the result of running `cat -n` on {}:\n{body}",
        given(args)
    );
    if total == 0 {
        out.push_str("(the file is empty)\n");
    }
    for note in notes {
        out.push_str(&note);
        out.push('\n');
    }
    ToolOutput::ok(out)
}

/// `view_range` checked against a file of `total` lines, as the reference checks it; the
/// 1-based first and last line to show.
fn check_range(range: &[i64], total: usize) -> Result<(usize, usize), String> {
    let shown = format!(
        "[{}]",
        range
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let [start, end] = range else {
        return Err("Invalid `view_range`. It should be a list of two integers.".to_owned());
    };
    let (start, end) = (*start, *end);
    let n = total as i64;
    if start < 1 || start > n.max(1) {
        return Err(format!(
            "Invalid `view_range`: {shown}. Its first element `{start}` should be within the \
             range of lines of the file: [1, {n}]"
        ));
    }
    if end > n {
        return Err(format!(
            "Invalid `view_range`: {shown}. Its second element `{end}` should be smaller than \
             the number of lines in the file: `{n}`"
        ));
    }
    if end != -1 && end < start {
        return Err(format!(
            "Invalid `view_range`: {shown}. Its second element `{end}` should be larger or \
             equal than its first `{start}`"
        ));
    }
    let last = if end == -1 { total } else { end as usize };
    Ok((start as usize, last))
}

fn view_directory(ctx: &ToolContext, args: &Args) -> ToolOutput {
    if args.view_range.is_some() {
        return ToolOutput::error(
            "The `view_range` parameter is not allowed when `path` points to a directory.",
        );
    }
    match super::list_dir::list_within(&ctx.workspace, &args.path, DIRECTORY_DEPTH, Bounds::of(ctx))
    {
        Err(jail) => jail_failure(&jail),
        Ok((listing, stopped)) => {
            let text = format!(
                "Here's the files and directories up to {DIRECTORY_DEPTH} levels deep in {}:\n\
                 {listing}",
                given(args)
            );
            if stopped == Some(crate::walk::Stop::Time) {
                ToolOutput::timed_out(text)
            } else {
                ToolOutput::ok(text)
            }
        }
    }
}

fn create(ctx: &ToolContext, args: &Args) -> ToolOutput {
    let Some(file_text) = &args.file_text else {
        return required("file_text", "create");
    };
    let deadline: &Deadline = &ctx.deadline;
    if !deadline.commit_change() {
        return too_late(deadline, &format!("creating {}", given(args)));
    }
    let refused = || {
        format!(
            "File already exists at: {}. Cannot overwrite files using command `create`.",
            given(args)
        )
    };
    let written = match ctx
        .workspace
        .write_if(&args.path, file_text.as_bytes(), |_, before| {
            if before.exists() {
                Err(refused())
            } else {
                Ok(())
            }
        }) {
        Err(JailError::IsADirectory { .. }) => return ToolOutput::error(refused()),
        Err(jail) => return jail_failure(&jail),
        Ok(Err(refusal)) => return ToolOutput::error(refusal),
        Ok(Ok(written)) => written,
    };
    ctx.reads.record(&written.path, &written.sha256);
    let (change, _) = written_change(
        &written,
        Capability::FsWrite,
        Some(file_text.clone().into_bytes()),
    );
    ToolOutput::ok(format!("File created successfully at: {}", given(args))).with_change(change)
}

/// The file to edit, read, checked against read-before-write and decoded.
fn editable(
    workspace: &Workspace,
    reads: &CallReads,
    args: &Args,
) -> Result<FileContents, ToolOutput> {
    let file = read(workspace, args)?;
    check_read(reads, &file.path, &file.sha256, Action::EditorEdit).map_err(ToolOutput::denied)?;
    decode_for_edit(&file.path, &file.bytes, "str_replace_based_edit_tool")
        .map_err(ToolOutput::error)?;
    Ok(file)
}

fn str_replace(ctx: &ToolContext, args: &Args) -> ToolOutput {
    let Some(old_str) = args.old_str.as_deref() else {
        return required("old_str", "str_replace");
    };
    if old_str.is_empty() {
        return ToolOutput::error(
            "No replacement was performed: old_str is empty. Give the exact text to replace.",
        );
    }
    let new_str = args.new_str.as_deref().unwrap_or("");
    let file = match editable(&ctx.workspace, &ctx.reads, args) {
        Ok(file) => file,
        Err(output) => return output,
    };
    // Decoded in `editable`.
    let text = String::from_utf8_lossy(&file.bytes);
    let Some((old, new, starts)) = find(&text, old_str, new_str) else {
        let mut out = format!(
            "No replacement was performed, old_str `{old_str}` did not appear verbatim in {}.",
            given(args)
        );
        out.push_str(&near_match_help(
            &text,
            old_str,
            new_str,
            "old_str",
            ("view", "str_replace"),
        ));
        return ToolOutput::error(out);
    };
    if starts.len() > 1 {
        let mut lines: Vec<usize> = starts.iter().map(|&at| line_of(&text, at)).collect();
        lines.dedup();
        let more = lines.len().saturating_sub(MAX_LISTED_LINES);
        let listed: Vec<String> = lines
            .iter()
            .take(MAX_LISTED_LINES)
            .map(usize::to_string)
            .collect();
        return ToolOutput::error(format!(
            "No replacement was performed. Multiple occurrences of old_str `{old_str}` in lines \
             [{}]{} ({} occurrences). Please ensure it is unique: add surrounding lines to \
             old_str.",
            listed.join(", "),
            if more > 0 {
                format!(" and {more} more lines")
            } else {
                String::new()
            },
            starts.len()
        ));
    }
    let at = starts[0];
    let mut edited = String::with_capacity(text.len() + new.len());
    edited.push_str(&text[..at]);
    edited.push_str(&new);
    edited.push_str(&text[at + old.len()..]);
    let line = line_of(&text, at);
    let snippet = snippet(&edited, line, line + new.matches('\n').count());
    let path = file.path.clone();
    let change = match write_edit(
        &ctx.workspace,
        &ctx.reads,
        &ctx.deadline,
        &file,
        edited,
        Action::EditorEdit,
    ) {
        Ok((_, change)) => change,
        Err(output) => return output,
    };
    let out = ToolOutput::ok(format!(
        "The file {} has been edited. Here's the result of running `cat -n` on a snippet of \
         {}:\n{snippet}Review the changes and make sure they are as expected. Edit the file \
         again if necessary.",
        given(args),
        shown_name(&path)
    ));
    match change {
        Some(change) => out.with_change(change),
        None => out,
    }
}

fn insert(ctx: &ToolContext, args: &Args) -> ToolOutput {
    let Some(insert_line) = args.insert_line else {
        return required("insert_line", "insert");
    };
    let Some(new_str) = args.new_str.as_deref() else {
        return required("new_str", "insert");
    };
    let file = match editable(&ctx.workspace, &ctx.reads, args) {
        Ok(file) => file,
        Err(output) => return output,
    };
    let text = String::from_utf8_lossy(&file.bytes);
    let total = view_lines(&text).len();
    let Some(after) = usize::try_from(insert_line).ok().filter(|n| *n <= total) else {
        return ToolOutput::error(format!(
            "Invalid `insert_line` parameter: {insert_line}. It should be within the range of \
             lines of the file: [0, {total}]"
        ));
    };
    // Whole lines, in the file's line endings: the text goes in after the line break that ends
    // line `after` (one is added to a last line that has none).
    let crlf = uses_crlf(&text);
    let mut lines = if crlf {
        to_crlf(new_str).into_owned()
    } else {
        new_str.to_owned()
    };
    let eol = if crlf { "\r\n" } else { "\n" };
    if !lines.ends_with('\n') {
        lines.push_str(eol);
    }
    let at = if after == 0 {
        0
    } else {
        text.match_indices('\n')
            .nth(after - 1)
            .map_or(text.len(), |(i, _)| i + 1)
    };
    let mut edited = String::with_capacity(text.len() + lines.len() + 2);
    edited.push_str(&text[..at]);
    if at == text.len() && !text.is_empty() && !text.ends_with('\n') {
        edited.push_str(eol);
    }
    edited.push_str(&lines);
    edited.push_str(&text[at..]);
    let inserted = view_lines(&lines).len().max(1);
    let snippet = snippet(&edited, after + 1, after + inserted);
    let change = match write_edit(
        &ctx.workspace,
        &ctx.reads,
        &ctx.deadline,
        &file,
        edited,
        Action::EditorEdit,
    ) {
        Ok((_, change)) => change,
        Err(output) => return output,
    };
    let out = ToolOutput::ok(format!(
        "The file {} has been edited. Here's the result of running `cat -n` on a snippet of the \
         edited file:\n{snippet}Review the changes and make sure they are as expected (correct \
         indentation, no duplicate lines, etc). Edit the file again if necessary.",
        given(args)
    ));
    match change {
        Some(change) => out.with_change(change),
        None => out,
    }
}

/// Lines `first..=last` (1-based) of the edited text with [`SNIPPET_LINES`] around them,
/// numbered.
fn snippet(edited: &str, first: usize, last: usize) -> String {
    let lines = view_lines(edited);
    let from = first.saturating_sub(SNIPPET_LINES + 1);
    let to = (last + SNIPPET_LINES).min(lines.len());
    if from >= to {
        return "(the file is now empty)\n".to_owned();
    }
    numbered(&lines[from..to], from + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_range_is_checked_like_the_reference_checks_it() {
        assert_eq!(check_range(&[2, -1], 5), Ok((2, 5)));
        assert_eq!(check_range(&[1, 5], 5), Ok((1, 5)));
        let past = check_range(&[1, 9], 5).unwrap_err();
        assert!(past.contains("Its second element `9`"), "{past}");
        let zero = check_range(&[0, 2], 5).unwrap_err();
        assert!(zero.starts_with("Invalid `view_range`: [0, 2]."), "{zero}");
        let backwards = check_range(&[4, 2], 5).unwrap_err();
        assert!(backwards.contains("larger or equal"), "{backwards}");
    }

    #[test]
    fn a_snippet_shows_the_edit_with_four_lines_around_it() {
        let text: String = (1..=20).map(|n| format!("{n}\n")).collect();
        let s = snippet(&text, 10, 10);
        assert!(s.starts_with("     6\t6\n"), "{s}");
        assert!(s.ends_with("    14\t14\n"), "{s}");
    }
}
