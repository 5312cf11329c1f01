//! Text handling the tools share: names made safe to print ([`shown_name`]), counts and relative
//! paths as messages say them, long lines cut, refusing files the
//! editing tools could not edit without corrupting them, line endings, line-numbered snippets,
//! and finding the text closest to what a model asked for when it is not in the file.
//!
//! Nothing here touches the filesystem, and nothing here ever changes text on the model's
//! behalf: a near-match is only ever shown, never applied.
use std::borrow::Cow;
use std::time::{Duration, Instant};

use similar::{Algorithm, DiffOp, TextDiff};

pub(crate) use toolexec_core::names::{shown_line, shown_name, shown_name_bytes};

/// How much of the start of a file is scanned for a NUL byte to call it binary (the heuristic
/// git and grep use).
pub const BINARY_SNIFF_BYTES: usize = 8 * 1024;

/// Characters of one line shown before it is cut: minified bundles and data dumps have lines of
/// megabytes that would drown the rest of the window.
pub const MAX_LINE_CHARS: usize = 2000;

/// A line as the line-numbered tools show it: cut after [`MAX_LINE_CHARS`] with a note.
pub(crate) fn cut_line(line: &str) -> std::borrow::Cow<'_, str> {
    match line.char_indices().nth(MAX_LINE_CHARS) {
        None => line.into(),
        Some((cut, _)) => {
            let rest = line[cut..].chars().count();
            format!("{}… [line cut: {rest} more characters]", &line[..cut]).into()
        }
    }
}

/// `1 line`, `3 lines`.
pub(crate) fn plural(count: usize, one: &str, many: &str) -> String {
    if count == 1 {
        format!("{count} {one}")
    } else {
        format!("{count} {many}")
    }
}

/// `path` relative to the walk's start directory.
pub(crate) fn relative_to<'a>(start: &str, path: &'a str) -> &'a str {
    if start == "." {
        return path;
    }
    path.strip_prefix(start)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(path)
}

/// Time spent looking for the closest near-match in a big file before settling for the best
/// candidate so far: the model is waiting, and a good-enough hint beats a perfect one later.
const NEAR_MATCH_BUDGET: Duration = Duration::from_millis(250);

/// Candidate windows always scored in full, whatever the budget says.
const NEAR_MATCH_MIN_CANDIDATES: usize = 8;

/// Differing lines listed under a near-match; past this the model should re-read the file.
const MAX_DIFF_LINES: usize = 12;

/// The file's bytes as UTF-8 text, or the refusal for the model: binary files, UTF-16 and
/// anything else that is not valid UTF-8 are never edited, because writing them back through a
/// `String` would change bytes the model never meant to touch.
pub(crate) fn decode_for_edit<'a>(
    path: &str,
    bytes: &'a [u8],
    tool: &str,
) -> Result<&'a str, String> {
    let path = shown_name(path);
    if bytes.starts_with(&[0xFF, 0xFE]) || bytes.starts_with(&[0xFE, 0xFF]) {
        return Err(format!(
            "Cannot change '{path}': it is UTF-16 encoded, and {tool} only edits UTF-8 text (so \
             that the file's encoding is never changed behind your back). Use the shell to edit \
             it (for example with iconv to convert it, if converting is what you want)."
        ));
    }
    if bytes[..bytes.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
        return Err(format!(
            "Cannot change '{path}': it looks like a binary file (it has NUL bytes near the \
             start). {tool} only edits text; use the shell for binary files."
        ));
    }
    std::str::from_utf8(bytes).map_err(|e| {
        let valid = &bytes[..e.valid_up_to()];
        let line = valid.iter().filter(|b| **b == b'\n').count() + 1;
        format!(
            "Cannot change '{path}': it is not valid UTF-8 (the first invalid byte is on line \
             {line}, byte offset {}). {tool} only edits UTF-8 text, so that bytes in another \
             encoding are never rewritten or lost. Use the shell to edit it (sed, or a script \
             that works on bytes).",
            e.valid_up_to()
        )
    })
}

/// Whether the file's line breaks are mostly `\r\n`: new lines written into it get the same.
pub(crate) fn uses_crlf(text: &str) -> bool {
    let crlf = text.matches("\r\n").count();
    let lf = text.matches('\n').count();
    crlf > 0 && crlf >= lf - crlf
}

/// `s` with `\n` line breaks turned into `\r\n`, unless it already has a `\r` anywhere (then the
/// model wrote the endings it meant, and they are used as given).
pub(crate) fn to_crlf(s: &str) -> Cow<'_, str> {
    if s.contains('\r') || !s.contains('\n') {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(s.replace('\n', "\r\n"))
    }
}

/// The lines of `text` as the model sees them: split on `\n`, a trailing `\r` dropped from each,
/// and no empty last element for a final newline.
pub(crate) fn view_lines(text: &str) -> Vec<&str> {
    let body = text.strip_suffix('\n').unwrap_or(text);
    if body.is_empty() && !text.is_empty() {
        return vec![""];
    }
    if body.is_empty() {
        return Vec::new();
    }
    body.split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect()
}

/// 1-based line number of byte offset `at` in `text`.
pub(crate) fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// Lines numbered like read_file (`cat -n`): `first` is the number of `lines[0]`.
pub(crate) fn numbered(lines: &[&str], first: usize) -> String {
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        out.push_str(&format!("{:>6}\t{}\n", first + i, cut_line(line)));
    }
    out
}

/// `lines[from..to]` (0-based, clamped) numbered from their real line numbers.
pub(crate) fn numbered_range(lines: &[&str], from: usize, to: usize) -> String {
    let to = to.min(lines.len());
    let from = from.min(to);
    numbered(&lines[from..to], from + 1)
}

/// The window of file lines most like `wanted`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct NearMatch {
    /// 0-based index of the window's first line.
    pub start: usize,
    pub len: usize,
    /// `similar`'s character ratio, 0.0 to 1.0.
    pub ratio: f32,
}

/// Finds the run of `wanted.len()` consecutive file lines most similar to `wanted`.
///
/// Every window gets a cheap score first (how many of its lines equal the wanted line at the same
/// offset, ignoring surrounding whitespace); windows are then compared character by character with
/// `similar`, best-scored first, until [`NEAR_MATCH_BUDGET`] runs out. The winner is the highest
/// `similar` ratio seen.
pub(crate) fn closest_window(file_lines: &[&str], wanted: &[&str]) -> Option<NearMatch> {
    let len = wanted.len().min(file_lines.len());
    if len == 0 {
        return None;
    }
    let deadline = Instant::now() + NEAR_MATCH_BUDGET;
    let wanted_text = wanted.join("\n");
    let wanted_trimmed: Vec<&str> = wanted.iter().map(|l| l.trim()).collect();
    // Scoring every window costs (file lines × wanted lines) comparisons, which a big file and
    // a long old_string make minutes: the scoring shares the budget too.
    let mut candidates: Vec<(usize, usize)> = (0..=file_lines.len() - len)
        .take_while(|_| Instant::now() < deadline)
        .map(|start| {
            let score = file_lines[start..start + len]
                .iter()
                .zip(&wanted_trimmed)
                .filter(|(a, b)| a.trim() == **b)
                .count();
            (score, start)
        })
        .collect();
    candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut best: Option<NearMatch> = None;
    for (n, (_, start)) in candidates.into_iter().enumerate() {
        if n >= NEAR_MATCH_MIN_CANDIDATES && Instant::now() >= deadline {
            break;
        }
        let window = file_lines[start..start + len].join("\n");
        let ratio = TextDiff::configure()
            .algorithm(Algorithm::Myers)
            .deadline(deadline.max(Instant::now() + Duration::from_millis(5)))
            .diff_chars(window.as_str(), wanted_text.as_str())
            .ratio();
        if best.is_none_or(|b| ratio > b.ratio) {
            best = Some(NearMatch { start, len, ratio });
        }
    }
    best
}

/// The lines where `wanted` and the file window starting at line `first_line` (1-based) differ,
/// one per line with whitespace made visible (`"\tfoo  "`), for an error message.
pub(crate) fn describe_difference(wanted: &[&str], found: &[&str], first_line: usize) -> String {
    let mut out = Vec::new();
    let mut whitespace_only = true;
    // Bounded like the search for the window: a diff of two long, very different line lists
    // takes minutes without a deadline (with one, it is coarser, never wrong).
    let ops = similar::capture_diff_slices_deadline(
        Algorithm::Myers,
        wanted,
        found,
        Some(Instant::now() + NEAR_MATCH_BUDGET),
    );
    for op in ops {
        let (removed, added) = match op {
            DiffOp::Equal { .. } => continue,
            DiffOp::Delete {
                old_index, old_len, ..
            } => (old_index..old_index + old_len, 0..0),
            DiffOp::Insert {
                new_index, new_len, ..
            } => (0..0, new_index..new_index + new_len),
            DiffOp::Replace {
                old_index,
                old_len,
                new_index,
                new_len,
            } => (
                old_index..old_index + old_len,
                new_index..new_index + new_len,
            ),
        };
        if removed.len() != added.len()
            || removed
                .clone()
                .zip(added.clone())
                .any(|(a, b)| wanted[a].trim() != found[b].trim())
        {
            whitespace_only = false;
        }
        for i in added {
            out.push(format!("  file line {}: {:?}", first_line + i, found[i]));
        }
        for i in removed {
            out.push(format!("  your text has: {:?}", wanted[i]));
        }
    }
    let total = out.len();
    out.truncate(MAX_DIFF_LINES);
    if total > MAX_DIFF_LINES {
        out.push(format!(
            "  … {} more differing lines",
            total - MAX_DIFF_LINES
        ));
    }
    if whitespace_only && total > 0 {
        out.push(
            "  (The lines differ only in whitespace: indentation, tabs versus spaces, or \
             trailing spaces.)"
                .to_owned(),
        );
    }
    out.join("\n")
}

/// Whether every non-blank line starts like a read_file line-number prefix (`    12\t`): the
/// model copied the numbers along with the text.
pub(crate) fn has_line_number_prefixes(lines: &[&str]) -> bool {
    let mut any = false;
    for line in lines.iter().filter(|l| !l.trim().is_empty()) {
        let rest = line.trim_start_matches(' ');
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 || !rest[digits..].starts_with('\t') {
            return false;
        }
        any = true;
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newline_in_a_name_cannot_make_a_second_entry() {
        assert_eq!(shown_name("a\n  forged.txt"), "a\\n  forged.txt");
        assert_eq!(shown_name("a\n  forged.txt").lines().count(), 1);
        assert_eq!(shown_name("x\ry\tz"), "x\\ry\\tz");
    }

    #[test]
    fn terminal_escapes_and_other_controls_are_shown_as_hex() {
        assert_eq!(shown_name("\u{1b}[31mred\u{1b}[0m"), "\\x1b[31mred\\x1b[0m");
        assert_eq!(
            shown_name("nul\0del\u{7f}bell\u{7}"),
            "nul\\x00del\\x7fbell\\x07"
        );
        // C1: U+009B is the one-character CSI of 8-bit terminals.
        assert_eq!(shown_name("a\u{9b}31m"), "a\\u{009b}31m");
        assert_eq!(shown_name("line\u{2028}sep"), "line\\u{2028}sep");
    }

    #[test]
    fn bidi_overrides_are_escaped_so_a_name_cannot_read_backwards() {
        // "evil\u{202e}txt.exe" displays as "evilexe.txt" in a bidi-aware viewer.
        assert_eq!(shown_name("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        for c in [
            '\u{202a}', '\u{202d}', '\u{2066}', '\u{2069}', '\u{200f}', '\u{61c}',
        ] {
            assert!(shown_name(&format!("a{c}b")).is_ascii(), "{c:?}");
        }
    }

    #[test]
    fn ordinary_names_are_untouched_and_not_copied() {
        for name in [
            "src/main.rs",
            "docs/Überblick.md",
            "emoji 🦀.txt",
            "a\\b",
            "日本語/ファイル",
        ] {
            assert!(
                matches!(shown_name(name), Cow::Borrowed(n) if n == name),
                "{name}"
            );
        }
    }

    #[test]
    fn escaping_twice_changes_nothing() {
        let once = shown_name_bytes(b"x\n\x1b\xff\xc2\x9b\xe2\x80\xae");
        assert_eq!(shown_name(&once), once);
    }

    #[test]
    fn bytes_that_are_not_utf8_are_written_as_hex_and_stay_distinct() {
        assert_eq!(shown_name_bytes(b"bad\xff"), "bad\\xff");
        assert_ne!(shown_name_bytes(b"bad\xff"), shown_name_bytes(b"bad\xfe"));
        assert_eq!(shown_name_bytes(b"caf\xe9\n"), "caf\\xe9\\n");
        assert_eq!(shown_name_bytes("é".as_bytes()), "é");
    }

    #[test]
    fn content_lines_keep_their_tabs() {
        assert_eq!(shown_line("\tindent\r"), "\tindent\\r");
        assert_eq!(shown_line("\u{1b}]0;title\u{7}"), "\\x1b]0;title\\x07");
    }

    #[test]
    fn non_utf8_and_utf16_and_binary_files_are_refused_for_editing() {
        assert!(
            decode_for_edit("a", b"caf\xe9\n", "edit_file")
                .unwrap_err()
                .contains("not valid UTF-8 (the first invalid byte is on line 1")
        );
        assert!(
            decode_for_edit("a", b"\xff\xfea\0", "edit_file")
                .unwrap_err()
                .contains("UTF-16")
        );
        assert!(
            decode_for_edit("a", b"x\0y", "edit_file")
                .unwrap_err()
                .contains("binary")
        );
        assert_eq!(decode_for_edit("a", "é\n".as_bytes(), "t"), Ok("é\n"));
    }

    #[test]
    fn crlf_is_the_style_when_most_breaks_are_crlf() {
        assert!(uses_crlf("a\r\nb\r\n"));
        assert!(uses_crlf("a\r\nb\r\nc\n"));
        assert!(!uses_crlf("a\nb\nc\r\n"));
        assert!(!uses_crlf("abc"));
        assert_eq!(to_crlf("a\nb"), "a\r\nb");
        assert_eq!(to_crlf("a\r\nb\nc"), "a\r\nb\nc");
    }

    #[test]
    fn view_lines_hide_carriage_returns_and_the_final_newline() {
        assert_eq!(view_lines("a\r\nb\r\n"), ["a", "b"]);
        assert_eq!(view_lines("a\nb"), ["a", "b"]);
        assert_eq!(view_lines("\n"), [""]);
        assert!(view_lines("").is_empty());
    }

    #[test]
    fn the_closest_window_is_the_one_with_the_typo() {
        let file = [
            "fn main() {",
            "    println!(\"hello\");",
            "}",
            "fn other() {}",
        ];
        let wanted = ["    println!(\"helo\");", "}"];
        let near = closest_window(&file, &wanted).unwrap();
        assert_eq!((near.start, near.len), (1, 2));
        assert!(near.ratio > 0.9, "{near:?}");
    }

    #[test]
    fn differences_show_whitespace_and_say_when_it_is_all_that_differs() {
        let text = describe_difference(&["  foo();"], &["\tfoo();"], 7);
        assert!(text.contains("file line 7: \"\\tfoo();\""), "{text}");
        assert!(text.contains("your text has: \"  foo();\""), "{text}");
        assert!(text.contains("only in whitespace"), "{text}");
    }

    #[test]
    fn read_file_line_numbers_are_recognised() {
        assert!(has_line_number_prefixes(&["    12\tfoo", "    13\tbar"]));
        assert!(!has_line_number_prefixes(&["foo", "    13\tbar"]));
        assert!(!has_line_number_prefixes(&[""]));
    }
}
