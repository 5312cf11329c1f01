//! `read_file`: a text file's lines, numbered, a window at a time.
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};

use super::{blocking, jail_failure};
use crate::text::{BINARY_SNIFF_BYTES, cut_line, plural, shown_name};
use crate::{Tool, ToolContext, ToolOutput, parse_args};
use toolexec_workspace::jail::{FileContents, Workspace, human_bytes};

/// Lines shown when the call gives no `limit`: most source files fit whole, and 2000 numbered
/// lines stay within the model-facing output limit for typical line lengths.
pub const DEFAULT_LINE_LIMIT: usize = 2000;

const DESCRIPTION: &str = "\
Reads a text file from the workspace and returns its lines numbered like `cat -n` (right-aligned \
line number, a tab, the line).

Use it to look at a file before changing it, or to inspect code, configuration or logs. Reading a \
file also satisfies the read-before-write rule: write_file (and the other tools that change files) \
refuse to overwrite an existing file this session has not read, or one that changed since it was \
read.

Do not use it to find which file contains something (use grep), to list files (list_dir or glob), \
or for binary files (they are refused; use the shell).

Paths are relative to /workspace (src/main.rs) or absolute under it (/workspace/src/main.rs); \
anything outside the workspace is refused.

By default the first 2000 lines are returned. For longer files, page with `offset` (the 1-based \
line to start at) and `limit` (how many lines); when lines remain, the output ends with a note \
giving the offset to continue from.

Example: {\"file_path\": \"src/main.rs\", \"offset\": 120, \"limit\": 40} returns lines 120 to 159.

Limits: files over 10 MiB are refused (use grep, or the shell to print a range); lines longer than \
2000 characters are cut with a marker; one call returns at most 1 MiB of text (the operator may \
set another budget), and a note gives the offset to continue from when it stops early; a file with \
a NUL byte in its first 8 KiB is treated as binary and refused; bytes that are not valid UTF-8 are \
shown as U+FFFD.";

pub struct ReadFile {
    spec: ToolSpec,
}

impl Default for ReadFile {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadFile {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "read_file".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: true,
                capabilities: vec![Capability::FsRead],
                output_limit: OutputLimit::new(50_000, TruncationMode::HeadTail),
            },
        }
    }
}

/// Files up to this size are read on the async worker that runs the call (a few system calls
/// and at most this many bytes to render); larger ones on the blocking pool.
const INLINE_READ_BYTES: u64 = 64 * 1024;

/// `read_file`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The file to read: relative to /workspace (src/main.rs) or absolute under it (/workspace/src/main.rs).
    #[schemars(length(min = 1))]
    file_path: String,
    /// 1-based line number to start reading at. Default 1.
    #[schemars(range(min = 1))]
    offset: Option<usize>,
    /// Maximum number of lines to return. Default 2000.
    #[schemars(range(min = 1))]
    limit: Option<usize>,
}

#[async_trait]
impl Tool for ReadFile {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(output) => return output,
        };
        let workspace = ctx.workspace.clone();
        let window = Window {
            offset: args.offset.unwrap_or(1).max(1),
            limit: args.limit.unwrap_or(DEFAULT_LINE_LIMIT).max(1),
        };
        let path = args.file_path;
        let budget = ReadBudget::new(ctx.max_read_bytes);
        // A small file is read and rendered right here: handing it to the blocking pool (a
        // futex wake-up and two context switches each way) costs more than the read.
        let read = match workspace.read_if_small(&path, INLINE_READ_BYTES) {
            Ok(Some(file)) => Ok(render_read(file, window, &budget)),
            Ok(None) => blocking(move || read_and_render(&workspace, &path, window, &budget)).await,
            Err(jail) => Ok(Err(jail_failure(&jail))),
        };
        match read {
            Ok(Ok(shown)) => {
                // Recorded here, as the result is delivered: a call the engine stopped waiting
                // for never gets here, so an unseen file does not count as read.
                ctx.reads.record(&shown.path, &shown.sha256);
                ToolOutput::ok(shown.text)
            }
            Ok(Err(failure)) => failure,
            Err(output) => output,
        }
    }
}

/// Which lines of a file to show.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    /// 1-based first line.
    pub offset: usize,
    pub limit: usize,
}

impl Window {
    /// From the first line, [`DEFAULT_LINE_LIMIT`] lines.
    pub(crate) fn default_lines() -> Self {
        Self {
            offset: 1,
            limit: DEFAULT_LINE_LIMIT,
        }
    }
}

/// A file as read_file shows it.
#[derive(Debug)]
pub(crate) struct Shown {
    /// Where the file really is (workspace-relative, symlinks resolved).
    pub path: String,
    pub text: String,
    /// Of the whole file as read: what the caller records as read for read-before-write.
    pub sha256: String,
}

/// The bytes of file text one call may still return (`ToolContext::max_read_bytes`): without it
/// one call could hold and record without bound, e.g. read_many_files naming one 4 MB file 50
/// times (200 million characters) or read_file of 10 MiB of one-character lines with a huge
/// `limit` (45 MB once numbered).
#[derive(Debug)]
pub(crate) struct ReadBudget {
    pub total: usize,
    left: std::cell::Cell<usize>,
}

impl ReadBudget {
    pub(crate) fn new(total: usize) -> Self {
        Self {
            total,
            left: std::cell::Cell::new(total),
        }
    }

    pub(crate) fn used_up(&self) -> bool {
        self.left.get() == 0
    }

    /// Takes `bytes` if they fit in what is left.
    fn take(&self, bytes: usize) -> bool {
        match self.left.get().checked_sub(bytes) {
            Some(left) => {
                self.left.set(left);
                true
            }
            None => {
                // Nothing more fits: the next file must not squeeze in a line after a cut.
                self.left.set(0);
                false
            }
        }
    }
}

/// Reads a file through the jail and renders a window of it the way read_file does. The caller
/// records the read for read-before-write when it delivers the result (`Shown::sha256`). The
/// failure is the tool output the model gets instead (a jail refusal or a file that cannot be
/// shown). Shared by read_file and read_many_files so the two can never disagree about what a
/// file looks like.
pub(crate) fn read_and_render(
    workspace: &Workspace,
    path: &str,
    window: Window,
    budget: &ReadBudget,
) -> Result<Shown, ToolOutput> {
    let file = workspace.read(path).map_err(|jail| jail_failure(&jail))?;
    render_read(file, window, budget)
}

/// [`read_and_render`] of a file already read through the jail.
pub(crate) fn render_read(
    file: FileContents,
    window: Window,
    budget: &ReadBudget,
) -> Result<Shown, ToolOutput> {
    let text = render(&file.path, &file.bytes, window, budget).map_err(ToolOutput::error)?;
    Ok(Shown {
        path: file.path,
        text,
        sha256: file.sha256,
    })
}

/// The model-facing text for a file's bytes, or the error text when nothing can be shown. Lines
/// are taken from `budget` as they are added; when it runs out the text ends with the offset to
/// continue from.
fn render(path: &str, bytes: &[u8], window: Window, budget: &ReadBudget) -> Result<String, String> {
    let path = &*shown_name(path);
    if bytes.is_empty() {
        return Ok(format!("(File '{path}' is empty: 0 bytes.)"));
    }
    if bytes[..bytes.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
        return Err(format!(
            "Cannot show '{path}': it looks like a binary file ({} bytes, with NUL bytes near \
             the start). read_file shows text only; inspect it with the shell instead \
             (file '{path}', or xxd '{path}' | head).",
            bytes.len()
        ));
    }
    let (text, lossy) = match std::str::from_utf8(bytes) {
        Ok(text) => (std::borrow::Cow::Borrowed(text), false),
        Err(_) => (String::from_utf8_lossy(bytes), true),
    };
    let body = text.strip_suffix('\n').unwrap_or(&text);
    let lines: Vec<&str> = body.split('\n').collect();
    let total = lines.len();
    if window.offset > total {
        return Err(format!(
            "'{path}' has {}; offset {} is past the end. Use an offset from 1 to {total}.",
            plural(total, "line", "lines"),
            window.offset
        ));
    }
    let start = window.offset - 1;
    let mut end = start.saturating_add(window.limit).min(total);
    let mut out = String::new();
    let mut crlf = false;
    let mut stopped = false;
    for (index, line) in lines[start..end].iter().enumerate() {
        let line = match line.strip_suffix('\r') {
            Some(stripped) => {
                crlf = true;
                stripped
            }
            None => line,
        };
        let number = start + index + 1;
        let numbered = format!("{number:>6}\t{}\n", cut_line(line));
        if !budget.take(numbered.len()) {
            stopped = true;
            end = start + index;
            break;
        }
        out.push_str(&numbered);
    }
    let mut notes = Vec::new();
    if stopped {
        notes.push(format!(
            "… stopped before line {}: this call's read budget ({} of text) is used up; {} not \
             shown. Call read_file with offset={} (and a limit) to continue.",
            end + 1,
            human_bytes(budget.total as u64),
            plural(total - end, "more line", "more lines"),
            end + 1
        ));
    } else if end < total {
        notes.push(format!(
            "… {} more {}; call read_file with offset={} to continue.",
            total - end,
            if total - end == 1 { "line" } else { "lines" },
            end + 1
        ));
    }
    if lossy {
        notes
            .push("(The file is not valid UTF-8; invalid bytes are shown as \u{FFFD}.)".to_owned());
    }
    if crlf {
        notes.push("(The file has CRLF line endings; the \\r is not shown.)".to_owned());
    }
    if !notes.is_empty() {
        out.push('\n');
        out.push_str(&notes.join("\n"));
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::MAX_LINE_CHARS;

    fn unlimited() -> ReadBudget {
        ReadBudget::new(usize::MAX)
    }

    fn all_lines() -> Window {
        Window {
            offset: 1,
            limit: DEFAULT_LINE_LIMIT,
        }
    }

    #[test]
    fn lines_are_numbered_like_cat_n() {
        let text = render("a.rs", b"fn main() {\n}\n", all_lines(), &unlimited()).unwrap();
        assert_eq!(text, "     1\tfn main() {\n     2\t}\n");
    }

    #[test]
    fn a_last_line_without_a_newline_is_shown() {
        let text = render("a", b"x\ny", all_lines(), &unlimited()).unwrap();
        assert_eq!(text, "     1\tx\n     2\ty\n");
    }

    #[test]
    fn a_window_ends_with_the_offset_to_continue_from() {
        let file: String = (1..=10).map(|n| format!("line {n}\n")).collect();
        let text = render(
            "a",
            file.as_bytes(),
            Window {
                offset: 3,
                limit: 4,
            },
            &unlimited(),
        )
        .unwrap();
        assert!(text.starts_with("     3\tline 3\n"));
        assert!(text.contains("     6\tline 6\n"));
        assert!(!text.contains("line 7"));
        assert!(text.ends_with("… 4 more lines; call read_file with offset=7 to continue.\n"));
    }

    #[test]
    fn an_offset_past_the_end_says_how_long_the_file_is() {
        let error = render(
            "a",
            b"1\n2\n",
            Window {
                offset: 5,
                limit: 1,
            },
            &unlimited(),
        )
        .unwrap_err();
        assert!(error.contains("has 2 lines"), "{error}");
        assert!(error.contains("from 1 to 2"), "{error}");
    }

    #[test]
    fn binary_files_are_refused() {
        let error = render(
            "img.png",
            b"\x89PNG\r\n\x1a\n\0\0\0",
            all_lines(),
            &unlimited(),
        )
        .unwrap_err();
        assert!(error.contains("binary"), "{error}");
    }

    #[test]
    fn an_empty_file_says_so() {
        assert_eq!(
            render("e", b"", all_lines(), &unlimited()).unwrap(),
            "(File 'e' is empty: 0 bytes.)"
        );
    }

    #[test]
    fn invalid_utf8_is_shown_lossily_with_a_note() {
        let text = render("l", b"caf\xe9\n", all_lines(), &unlimited()).unwrap();
        assert!(text.starts_with("     1\tcaf\u{FFFD}\n"));
        assert!(text.contains("not valid UTF-8"));
    }

    #[test]
    fn long_lines_are_cut_with_a_marker() {
        let line = "é".repeat(MAX_LINE_CHARS + 5);
        let text = render("m", line.as_bytes(), all_lines(), &unlimited()).unwrap();
        assert!(text.contains("… [line cut: 5 more characters]"));
        assert_eq!(text.matches('é').count(), MAX_LINE_CHARS);
    }

    #[test]
    fn a_spent_budget_stops_at_a_whole_line_and_gives_the_offset_to_continue() {
        let file: String = (1..=100).map(|n| format!("line {n:03}\n")).collect();
        // Each numbered line is 6 + 1 + 8 + 1 = 16 bytes: 10 fit in 170.
        let budget = ReadBudget::new(170);
        let text = render("big", file.as_bytes(), all_lines(), &budget).unwrap();
        assert!(text.contains("    10\tline 010\n"), "{text}");
        assert!(!text.contains("line 011"), "{text}");
        assert!(text.contains("stopped before line 11"), "{text}");
        assert!(text.contains("read budget (170 bytes of text)"), "{text}");
        assert!(text.contains("90 more lines not shown"), "{text}");
        assert!(text.contains("offset=11"), "{text}");
        assert!(budget.used_up());
        // Whatever comes next gets nothing, not even a line that would fit the remainder.
        let next = render("next", b"x\n", all_lines(), &budget).unwrap();
        assert!(next.contains("stopped before line 1:"), "{next}");
    }

    #[test]
    fn names_in_messages_are_escaped() {
        let text = render("a\n  forged.txt", b"", all_lines(), &unlimited()).unwrap();
        assert_eq!(text, "(File 'a\\n  forged.txt' is empty: 0 bytes.)");
    }

    #[test]
    fn crlf_endings_are_not_shown_but_mentioned() {
        let text = render("w", b"a\r\nb\r\n", all_lines(), &unlimited()).unwrap();
        assert!(text.starts_with("     1\ta\n     2\tb\n"));
        assert!(text.contains("CRLF"));
    }
}
