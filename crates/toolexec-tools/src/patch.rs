//! The apply_patch format (Codex's): parsing a patch, and applying one file's hunks to its text.
//! No file I/O here; the `apply_patch` tool reads and writes through the jail.
//!
//! ```text
//! *** Begin Patch
//! *** Add File: path        followed by the file's lines, each prefixed with `+`
//! *** Delete File: path
//! *** Update File: path
//! *** Move to: new/path     (optional, right after Update File)
//! @@ optional context line  one hunk: lines prefixed ` ` (context), `-` (removed), `+` (added)
//! *** End of File           (optional: the hunk ends at the end of the file)
//! *** End Patch
//! ```
//!
//! Parsing is as lenient as Codex's: markers may carry surrounding whitespace, the whole patch
//! may be wrapped in a `<<'EOF'` heredoc, the first hunk of an update may omit its `@@` line, and
//! an empty line inside a hunk is an empty context line. Matching a hunk's lines is exact first,
//! then ignoring trailing whitespace, then ignoring leading and trailing whitespace. That is
//! tolerance in *finding* the lines, never in what is written: the new lines are written exactly
//! as the patch gives them.

use crate::deadline::Deadline;

const BEGIN_PATCH: &str = "*** Begin Patch";
const END_PATCH: &str = "*** End Patch";
const ADD_FILE: &str = "*** Add File: ";
const DELETE_FILE: &str = "*** Delete File: ";
const UPDATE_FILE: &str = "*** Update File: ";
const MOVE_TO: &str = "*** Move to: ";
const END_OF_FILE: &str = "*** End of File";
const HUNK_MARKER: &str = "@@";

/// A parsed patch: its operations in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    pub ops: Vec<Op>,
}

/// One file operation. `line` is the 1-based patch line of its header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Add {
        path: String,
        contents: String,
        line: usize,
    },
    Delete {
        path: String,
        line: usize,
    },
    Update {
        path: String,
        move_to: Option<String>,
        hunks: Vec<Hunk>,
        line: usize,
    },
}

impl Op {
    pub fn path(&self) -> &str {
        match self {
            Op::Add { path, .. } | Op::Delete { path, .. } | Op::Update { path, .. } => path,
        }
    }

    pub fn line(&self) -> usize {
        match self {
            Op::Add { line, .. } | Op::Delete { line, .. } | Op::Update { line, .. } => *line,
        }
    }
}

/// One `@@` hunk of an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    /// The text after `@@ `: a line to find first; the hunk's lines are matched after it.
    pub context: Option<String>,
    /// Context and removed lines: what the file must contain.
    pub old: Vec<String>,
    /// Context and added lines: what replaces it.
    pub new: Vec<String>,
    /// For each line of `new`, the index in `old` of the same context line (`None` for added
    /// lines). A context line found with whitespace tolerance keeps the file's version of it.
    pub context_of: Vec<Option<usize>>,
    /// `*** End of File`: the old lines must be the last lines of the file.
    pub end_of_file: bool,
    /// 1-based patch line where the hunk starts.
    pub line: usize,
}

impl Hunk {
    fn push_context(&mut self, line: String) {
        self.context_of.push(Some(self.old.len()));
        self.old.push(line.clone());
        self.new.push(line);
    }
}

/// Why a patch could not be parsed, at which 1-based patch line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "patch line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

/// Parses a whole patch, envelope included.
pub fn parse(patch: &str) -> Result<Patch, ParseError> {
    let trimmed = patch.trim();
    // Line numbers stay those of the text the model sent.
    let offset = patch[..patch.len() - patch.trim_start().len()]
        .matches('\n')
        .count();
    let mut lines: Vec<&str> = trimmed.lines().collect();
    let mut first_line = offset + 1;
    if is_heredoc(&lines) {
        lines = lines[1..lines.len() - 1].to_vec();
        first_line += 1;
    }
    let err = |line: usize, message: String| ParseError {
        line: line + first_line - 1,
        message,
    };
    match lines.first() {
        Some(first) if first.trim() == BEGIN_PATCH => {}
        _ => {
            return Err(err(
                1,
                format!("the first line of the patch must be '{BEGIN_PATCH}'"),
            ));
        }
    }
    match lines.last() {
        Some(last) if lines.len() >= 2 && last.trim() == END_PATCH => {}
        _ => {
            return Err(err(
                lines.len().max(1),
                format!("the last line of the patch must be '{END_PATCH}'"),
            ));
        }
    }
    let body = &lines[1..lines.len() - 1];
    let mut parser = Parser {
        lines: body,
        at: 0,
        first_line: first_line + 1,
    };
    let mut ops = Vec::new();
    while parser.at < body.len() {
        if body[parser.at].trim().is_empty() {
            parser.at += 1;
            continue;
        }
        ops.push(parser.op()?);
    }
    Ok(Patch { ops })
}

fn is_heredoc(lines: &[&str]) -> bool {
    let (Some(first), Some(last)) = (lines.first(), lines.last()) else {
        return false;
    };
    lines.len() >= 4
        && matches!(first.trim(), "<<EOF" | "<<'EOF'" | "<<\"EOF\"")
        && last.trim().ends_with("EOF")
}

struct Parser<'a> {
    lines: &'a [&'a str],
    at: usize,
    /// Patch line number of `lines[0]`.
    first_line: usize,
}

impl Parser<'_> {
    fn line_no(&self, index: usize) -> usize {
        self.first_line + index
    }

    fn error(&self, index: usize, message: String) -> ParseError {
        ParseError {
            line: self.line_no(index),
            message,
        }
    }

    fn op(&mut self) -> Result<Op, ParseError> {
        let header_at = self.at;
        let header = self.lines[header_at].trim();
        let line = self.line_no(header_at);
        self.at += 1;
        if let Some(path) = header.strip_prefix(ADD_FILE) {
            let path = self.path(path, header_at)?;
            let mut contents = String::new();
            while let Some(added) = self.lines.get(self.at).and_then(|l| l.strip_prefix('+')) {
                contents.push_str(added);
                contents.push('\n');
                self.at += 1;
            }
            return Ok(Op::Add {
                path,
                contents,
                line,
            });
        }
        if let Some(path) = header.strip_prefix(DELETE_FILE) {
            let path = self.path(path, header_at)?;
            return Ok(Op::Delete { path, line });
        }
        if let Some(path) = header.strip_prefix(UPDATE_FILE) {
            let path = self.path(path, header_at)?;
            let mut move_to = None;
            if let Some(dest) = self
                .lines
                .get(self.at)
                .and_then(|l| l.trim().strip_prefix(MOVE_TO))
            {
                move_to = Some(self.path(dest, self.at)?);
                self.at += 1;
            }
            let mut hunks = Vec::new();
            while let Some(next) = self.lines.get(self.at) {
                if next.trim().is_empty() {
                    self.at += 1;
                    continue;
                }
                if next.trim_start().starts_with("***") {
                    break;
                }
                hunks.push(self.hunk(hunks.is_empty())?);
            }
            if hunks.is_empty() {
                return Err(self.error(
                    header_at,
                    format!(
                        "'*** Update File: {}' has no hunks; give at least one @@ hunk with \
                         the lines to change",
                        crate::text::shown_name(&path)
                    ),
                ));
            }
            return Ok(Op::Update {
                path,
                move_to,
                hunks,
                line,
            });
        }
        Err(self.error(
            header_at,
            format!(
                "'{header}' is not a valid operation header. Valid headers are '*** Add File: \
                 <path>', '*** Delete File: <path>' and '*** Update File: <path>' (optionally \
                 followed by '*** Move to: <path>')"
            ),
        ))
    }

    fn path(&self, raw: &str, index: usize) -> Result<String, ParseError> {
        let path = raw.trim();
        if path.is_empty() {
            return Err(self.error(index, "the operation names no path".to_owned()));
        }
        Ok(path.to_owned())
    }

    fn hunk(&mut self, first: bool) -> Result<Hunk, ParseError> {
        let start = self.at;
        let header = self.lines[start];
        let context = if header.trim_end() == HUNK_MARKER {
            self.at += 1;
            None
        } else if let Some(text) = header.strip_prefix("@@ ") {
            self.at += 1;
            Some(text.to_owned())
        } else if first {
            None
        } else {
            return Err(self.error(
                start,
                format!(
                    "expected a hunk to start with an '@@' line, got '{header}'. Separate hunks \
                     with '@@' (or '@@ <a line to find first>')"
                ),
            ));
        };
        let mut hunk = Hunk {
            context,
            old: Vec::new(),
            new: Vec::new(),
            context_of: Vec::new(),
            end_of_file: false,
            line: self.line_no(start),
        };
        let mut parsed = 0;
        while let Some(line) = self.lines.get(self.at) {
            if line.trim() == END_OF_FILE {
                if parsed == 0 {
                    break;
                }
                hunk.end_of_file = true;
                self.at += 1;
                break;
            }
            match line.chars().next() {
                None => hunk.push_context(String::new()),
                Some(' ') => hunk.push_context(line[1..].to_owned()),
                Some('+') => {
                    hunk.new.push(line[1..].to_owned());
                    hunk.context_of.push(None);
                }
                Some('-') => hunk.old.push(line[1..].to_owned()),
                Some(_) if parsed == 0 => {
                    return Err(self.error(
                        self.at,
                        format!(
                            "unexpected line in a hunk: '{line}'. Every hunk line starts with \
                             ' ' (context), '+' (added) or '-' (removed)"
                        ),
                    ));
                }
                Some(_) => break,
            }
            parsed += 1;
            self.at += 1;
        }
        if parsed == 0 {
            return Err(self.error(start, "the hunk has no lines".to_owned()));
        }
        Ok(hunk)
    }
}

/// One line of a file being patched: its text without the line break, and whether that break
/// was `\r\n` (kept as it was for untouched lines).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    text: String,
    crlf: bool,
}

/// Why a hunk did not apply. `hunk` is 1-based within its file's update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HunkFailure {
    pub hunk: usize,
    pub kind: Mismatch,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// The `@@ context` line is not in the file at or after 0-based line `from`.
    Context { header: String, from: usize },
    /// The hunk's old lines are not in the file at or after 0-based line `from`. `partial` is
    /// the place where the most leading lines matched: (0-based file line, lines matched).
    Lines {
        from: usize,
        partial: Option<(usize, usize)>,
    },
    /// The old lines are in the file (at the 0-based line given) but not at its end, as
    /// `*** End of File` requires.
    NotAtEnd { found: usize },
}

/// The file's lines as the patcher matches them: line breaks removed, `\r` remembered.
pub fn file_lines(text: &str) -> Vec<String> {
    split_lines(text).into_iter().map(|l| l.text).collect()
}

fn split_lines(text: &str) -> Vec<Line> {
    let mut lines: Vec<Line> = text
        .split('\n')
        .map(|l| match l.strip_suffix('\r') {
            Some(stripped) => Line {
                text: stripped.to_owned(),
                crlf: true,
            },
            None => Line {
                text: l.to_owned(),
                crlf: false,
            },
        })
        .collect();
    // The empty piece after a final newline is not a line.
    if lines.last().is_some_and(|l| l.text.is_empty() && !l.crlf) {
        lines.pop();
    }
    lines
}

/// (file line, old lines replaced, new lines, which old line each new line repeats)
type Replacement<'a> = (usize, usize, &'a [String], &'a [Option<usize>]);

/// Applies one update's hunks to a file's text. The result always ends with a line break (as
/// Codex's does); untouched lines keep their `\n` or `\r\n`, and new lines get the file's
/// dominant line ending.
pub fn apply_hunks(text: &str, hunks: &[Hunk]) -> Result<String, HunkFailure> {
    apply_hunks_within(text, hunks, &Deadline::none())
}

/// [`apply_hunks`], giving up once `deadline` has passed: finding a hunk's lines costs up to
/// (file lines × hunk lines) comparisons, hours for a hostile 10 MiB file and patch. A hunk
/// that could not be placed in time is reported as not found; the caller, seeing the deadline
/// passed, says the patch ran out of time instead.
pub fn apply_hunks_within(
    text: &str,
    hunks: &[Hunk],
    deadline: &Deadline,
) -> Result<String, HunkFailure> {
    let lines = split_lines(text);
    let crlf_lines = lines.iter().filter(|l| l.crlf).count();
    let crlf = crlf_lines > 0 && crlf_lines * 2 >= lines.len();
    let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();

    let mut replacements: Vec<Replacement<'_>> = Vec::new();
    let mut from = 0;
    for (i, hunk) in hunks.iter().enumerate() {
        let fail = |kind| HunkFailure { hunk: i + 1, kind };
        if let Some(header) = &hunk.context {
            match seek(&texts, std::slice::from_ref(header), from, false, deadline) {
                Some(at) => from = at + 1,
                None => {
                    return Err(fail(Mismatch::Context {
                        header: header.clone(),
                        from,
                    }));
                }
            }
        }
        if hunk.old.is_empty() {
            // Pure addition: at the end of the file, before a final blank line if there is one.
            let at = if texts.last().is_some_and(|l| l.is_empty()) {
                texts.len() - 1
            } else {
                texts.len()
            };
            replacements.push((at, 0, &hunk.new, &hunk.context_of));
            continue;
        }
        let mut old: &[String] = &hunk.old;
        let mut new: &[String] = &hunk.new;
        let mut context_of: &[Option<usize>] = &hunk.context_of;
        let mut found = seek(&texts, old, from, hunk.end_of_file, deadline);
        // A hunk that ends with an empty context line may have been written against a file
        // without a final blank line; retry without it.
        if found.is_none() && old.last().is_some_and(String::is_empty) {
            old = &old[..old.len() - 1];
            if new.last().is_some_and(String::is_empty) {
                new = &new[..new.len() - 1];
                context_of = &context_of[..context_of.len() - 1];
            }
            found = seek(&texts, old, from, hunk.end_of_file, deadline);
        }
        match found {
            Some(at) => {
                replacements.push((at, old.len(), new, context_of));
                from = at + old.len();
            }
            None if hunk.end_of_file => {
                return Err(fail(match seek(&texts, &hunk.old, from, false, deadline) {
                    Some(found) => Mismatch::NotAtEnd { found },
                    None => Mismatch::Lines {
                        from,
                        partial: longest_prefix(&texts, &hunk.old, from, deadline),
                    },
                }));
            }
            None => {
                return Err(fail(Mismatch::Lines {
                    from,
                    partial: longest_prefix(&texts, &hunk.old, from, deadline),
                }));
            }
        }
    }

    replacements.sort_by_key(|r| r.0);
    let mut result = lines.clone();
    for (at, len, new, context_of) in replacements.into_iter().rev() {
        let end = (at + len).min(result.len());
        let replacement: Vec<Line> = new
            .iter()
            .zip(context_of)
            .map(|(text, same)| match same {
                // A context line stays exactly as the file has it, whatever whitespace the
                // patch gave it: matching is tolerant, writing is not.
                Some(j) if *j < len => lines[at + j].clone(),
                _ => Line {
                    text: text.clone(),
                    crlf,
                },
            })
            .collect();
        result.splice(at..end, replacement);
    }
    let mut out = String::with_capacity(text.len() + 64);
    for line in &result {
        out.push_str(&line.text);
        out.push_str(if line.crlf { "\r\n" } else { "\n" });
    }
    Ok(out)
}

/// Where `pattern` occurs in `lines` at or after `from` (at the very end if `eof`): exact
/// first, then ignoring trailing whitespace, then ignoring surrounding whitespace.
fn seek(
    lines: &[&str],
    pattern: &[String],
    from: usize,
    eof: bool,
    deadline: &Deadline,
) -> Option<usize> {
    if pattern.is_empty() {
        return Some(from);
    }
    if pattern.len() > lines.len() {
        return None;
    }
    let last_start = lines.len() - pattern.len();
    let first_start = if eof { last_start } else { from };
    if first_start > last_start {
        return None;
    }
    let passes: [fn(&str, &str) -> bool; 3] = [
        |a, b| a == b,
        |a, b| a.trim_end() == b.trim_end(),
        |a, b| a.trim() == b.trim(),
    ];
    passes.into_iter().find_map(|same| {
        (first_start..=last_start)
            .take_while(|_| !deadline.expired())
            .find(|&start| {
                pattern
                    .iter()
                    .enumerate()
                    .all(|(i, p)| same(lines[start + i], p))
            })
    })
}

/// The place at or after `from` where the most leading lines of `pattern` match (loosest
/// comparison), if at least one does: (0-based start, lines matched).
fn longest_prefix(
    lines: &[&str],
    pattern: &[String],
    from: usize,
    deadline: &Deadline,
) -> Option<(usize, usize)> {
    let mut best: Option<(usize, usize)> = None;
    for start in from..lines.len() {
        if deadline.expired() {
            break;
        }
        let matched = pattern
            .iter()
            .zip(&lines[start..])
            .take_while(|(p, l)| p.trim() == l.trim())
            .count();
        if matched > 0 && best.is_none_or(|(_, m)| matched > m) {
            best = Some((start, matched));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(patch: &str) -> Vec<Hunk> {
        match parse(patch).unwrap().ops.remove(0) {
            Op::Update { hunks, .. } => hunks,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn all_three_operations_parse_with_their_lines() {
        let patch = parse(
            "*** Begin Patch\n*** Add File: a.txt\n+one\n+two\n*** Delete File: b.txt\n\
             *** Update File: c.txt\n*** Move to: d/c.txt\n@@ fn main\n ctx\n-old\n+new\n\
             *** End of File\n*** End Patch\n",
        )
        .unwrap();
        assert_eq!(
            patch.ops,
            [
                Op::Add {
                    path: "a.txt".into(),
                    contents: "one\ntwo\n".into(),
                    line: 2
                },
                Op::Delete {
                    path: "b.txt".into(),
                    line: 5
                },
                Op::Update {
                    path: "c.txt".into(),
                    move_to: Some("d/c.txt".into()),
                    hunks: vec![Hunk {
                        context: Some("fn main".into()),
                        old: vec!["ctx".into(), "old".into()],
                        new: vec!["ctx".into(), "new".into()],
                        context_of: vec![Some(0), None],
                        end_of_file: true,
                        line: 8,
                    }],
                    line: 6
                },
            ]
        );
    }

    #[test]
    fn a_heredoc_wrapper_is_accepted() {
        let patch = parse("<<'EOF'\n*** Begin Patch\n*** Delete File: a\n*** End Patch\nEOF\n");
        assert_eq!(patch.unwrap().ops.len(), 1);
    }

    #[test]
    fn a_missing_envelope_is_reported() {
        let e = parse("*** Update File: a\n@@\n-x\n+y\n").unwrap_err();
        assert!(e.message.contains("*** Begin Patch"), "{e}");
        let e = parse("*** Begin Patch\n*** Delete File: a\n").unwrap_err();
        assert!(e.message.contains("*** End Patch"), "{e}");
    }

    #[test]
    fn a_second_hunk_without_an_at_at_line_is_refused_with_its_line() {
        let e = parse("*** Begin Patch\n*** Update File: a\n@@\n-x\n+y\nbad\n*** End Patch")
            .unwrap_err();
        assert_eq!(e.line, 6);
        assert!(e.message.contains("'@@'"), "{e}");
    }

    #[test]
    fn hunks_apply_in_order_and_keep_crlf_endings() {
        let hunks = update(
            "*** Begin Patch\n*** Update File: a\n@@\n-b\n+B\n@@\n-d\n+D\n+E\n*** End Patch",
        );
        let out = apply_hunks("a\r\nb\r\nc\r\nd\r\n", &hunks).unwrap();
        assert_eq!(out, "a\r\nB\r\nc\r\nD\r\nE\r\n");
    }

    #[test]
    fn whitespace_differences_are_tolerated_when_finding_lines_but_new_lines_are_kept_exactly() {
        let hunks =
            update("*** Begin Patch\n*** Update File: a\n@@\n-  x = 1  \n+\tx = 2\n*** End Patch");
        assert_eq!(apply_hunks("\tx = 1\n", &hunks).unwrap(), "\tx = 2\n");
    }

    #[test]
    fn context_lines_matched_loosely_keep_the_files_whitespace() {
        let hunks =
            update("*** Begin Patch\n*** Update File: a\n@@\n keep\n-old\n+new\n*** End Patch");
        assert_eq!(
            apply_hunks("keep   \nold\n", &hunks).unwrap(),
            "keep   \nnew\n"
        );
    }

    #[test]
    fn a_context_header_moves_the_search_past_it() {
        let hunks = update("*** Begin Patch\n*** Update File: a\n@@ fn two\n-x\n+y\n*** End Patch");
        let out = apply_hunks("fn one\nx\nfn two\nx\n", &hunks).unwrap();
        assert_eq!(out, "fn one\nx\nfn two\ny\n");
    }

    #[test]
    fn a_mismatch_reports_the_hunk_and_how_far_it_matched() {
        let hunks = update(
            "*** Begin Patch\n*** Update File: a\n@@\n-a\n+A\n@@\n b\n-c\n+C\n*** End Patch",
        );
        let failure = apply_hunks("a\nb\nX\n", &hunks).unwrap_err();
        assert_eq!(
            failure,
            HunkFailure {
                hunk: 2,
                kind: Mismatch::Lines {
                    from: 1,
                    partial: Some((1, 1))
                }
            }
        );
    }

    #[test]
    fn end_of_file_hunks_must_match_at_the_end() {
        let hunks = update(
            "*** Begin Patch\n*** Update File: a\n@@\n-x\n+y\n*** End of File\n*** End Patch",
        );
        assert_eq!(apply_hunks("a\nx\n", &hunks).unwrap(), "a\ny\n");
        let failure = apply_hunks("x\na\n", &hunks).unwrap_err();
        assert_eq!(failure.kind, Mismatch::NotAtEnd { found: 0 });
    }

    #[test]
    fn a_final_blank_line_is_kept() {
        let hunks = update("*** Begin Patch\n*** Update File: a\n@@\n-a\n+b\n*** End Patch");
        assert_eq!(apply_hunks("a\n\n", &hunks).unwrap(), "b\n\n");
    }
}
