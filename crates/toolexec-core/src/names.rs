//! File names: as the kernel has them (bytes, not necessarily UTF-8) in records that are JSON
//! text, and as a model is shown them ([`shown_name`]).
//!
//! A lossy decoding would let two names share one record (`bad\xff` and `bad\xfe` both become
//! `bad\u{FFFD}`), so a recorded name is a display form that is exact for every UTF-8 name, plus,
//! only for a name that is not UTF-8, its raw bytes in standard base64. The display form writes
//! each byte that is not part of valid UTF-8 as `\xHH`; it can collide with a UTF-8 name that
//! holds those characters literally, which is why the base64 form is there: a record without it
//! is the UTF-8 name itself, a record with it is exactly those bytes.
use std::borrow::Cow;
use std::fmt::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// A name as recorded: the display form, and the base64 of the raw bytes when they are not
/// UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedName {
    pub display: String,
    pub base64: Option<String>,
}

impl RecordedName {
    pub fn new(raw: &[u8]) -> Self {
        match std::str::from_utf8(raw) {
            Ok(name) => Self {
                display: name.to_owned(),
                base64: None,
            },
            Err(_) => Self {
                display: display_bytes(raw),
                base64: Some(STANDARD.encode(raw)),
            },
        }
    }
}

/// The display form of a name: valid UTF-8 as it is, each other byte as `\xHH` (lowercase hex).
pub fn display_bytes(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for chunk in raw.utf8_chunks() {
        out.push_str(chunk.valid());
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out
}

/// The raw bytes of a recorded name: the base64 form when there is one, else the display form
/// (then the name was UTF-8). `None` when the base64 form is not valid base64.
pub fn raw_bytes(display: &str, base64: Option<&str>) -> Option<Vec<u8>> {
    match base64 {
        Some(b64) => STANDARD.decode(b64).ok(),
        None => Some(display.as_bytes().to_vec()),
    }
}

/// A file name, path or symlink target as every tool prints it: characters that could make one
/// name look like several, or like something else, are escaped, so that a file named
/// `"a\n  forged.txt"` stays one entry (`a\n  forged.txt`) and a name cannot send terminal
/// escape sequences or reorder the text around it.
///
/// Escaped: C0 controls as `\t`, `\n`, `\r` or `\xHH` (ESC is `\x1b`), DEL as `\x7f`; C1 controls
/// (U+0080–U+009F), the line and paragraph separators (U+2028, U+2029) and the bidirectional
/// formatting characters (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069: the "Trojan
/// Source" characters) as `\u{XXXX}`. Everything else is printed as it is, backslashes
/// included: ordinary names, non-ASCII letters and emoji look the same as in `ls`. A name that
/// itself contains text like `\n` therefore prints like one with a newline; the log records
/// every name exactly.
///
/// Idempotent (what it prints needs no further escaping), so it composes with a path that is
/// already a display form with `\xHH` for bytes that are not UTF-8 ([`shown_name_bytes`]).
pub fn shown_name(name: &str) -> Cow<'_, str> {
    escape(name, true)
}

/// [`shown_name`] of a name as the kernel has it: bytes that are not valid UTF-8 are written
/// `\xHH` (so `bad\xff` and `bad\xfe` stay two names, where lossy decoding would show both as
/// `bad\u{FFFD}`).
pub fn shown_name_bytes(name: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(name) {
        Ok(text) => shown_name(text),
        Err(_) => {
            let mut out = String::with_capacity(name.len() + 8);
            for chunk in name.utf8_chunks() {
                out.push_str(&shown_name(chunk.valid()));
                for byte in chunk.invalid() {
                    let _ = write!(out, "\\x{byte:02x}");
                }
            }
            Cow::Owned(out)
        }
    }
}

/// A line of file content inside a listing of lines (grep's `path:line:content`): escaped like
/// [`shown_name`] except for tabs, which are ordinary indentation. Content is not a name, but a
/// carriage return, an escape sequence or a bidi override in it could still forge or hide
/// result lines; read_file shows the same line unescaped.
pub fn shown_line(line: &str) -> Cow<'_, str> {
    escape(line, false)
}

/// Whether `c` is printed escaped (see [`shown_name`]); tabs only when `tabs` is true.
fn needs_escape(c: char, tabs: bool) -> bool {
    match c {
        '\t' => tabs,
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' => true,
        '\u{2028}' | '\u{2029}' => true,
        '\u{061c}'
        | '\u{200e}'
        | '\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}' => true,
        _ => false,
    }
}

fn escape(text: &str, tabs: bool) -> Cow<'_, str> {
    if !text.chars().any(|c| needs_escape(c, tabs)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !needs_escape(c, tabs) {
            out.push(c);
            continue;
        }
        let _ = match c {
            '\t' => write!(out, "\\t"),
            '\n' => write!(out, "\\n"),
            '\r' => write!(out, "\\r"),
            // One byte in UTF-8: the same `\xHH` as a byte that is not UTF-8.
            '\u{0}'..='\u{7f}' => write!(out, "\\x{:02x}", u32::from(c)),
            _ => write!(out, "\\u{{{:04x}}}", u32::from(c)),
        };
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_names_are_recorded_as_they_are_without_base64() {
        let name = RecordedName::new("café/naïve \\xff.txt".as_bytes());
        assert_eq!(name.display, "café/naïve \\xff.txt");
        assert_eq!(name.base64, None);
    }

    #[test]
    fn names_that_differ_in_invalid_bytes_stay_distinct() {
        let ff = RecordedName::new(b"bad\xff");
        let fe = RecordedName::new(b"bad\xfe");
        assert_eq!(ff.display, "bad\\xff");
        assert_eq!(fe.display, "bad\\xfe");
        assert_eq!(ff.base64.as_deref(), Some("YmFk/w=="));
        assert_ne!(ff.base64, fe.base64);
        // A UTF-8 name spelled like the display form is told apart by the missing base64.
        let literal = RecordedName::new(b"bad\\xff");
        assert_eq!(literal.display, ff.display);
        assert_eq!(literal.base64, None);
    }

    #[test]
    fn invalid_bytes_inside_and_around_valid_sequences_round_trip() {
        // A truncated two-byte sequence, a lone continuation byte, an overlong encoding of '/',
        // and valid multi-byte characters between them.
        let raw: &[u8] = b"\xc3x\x80\xc0\xaf\xe2\x82\xac\xf0\x9f\x98";
        let name = RecordedName::new(raw);
        assert_eq!(name.display, "\\xc3x\\x80\\xc0\\xaf€\\xf0\\x9f\\x98");
        assert_eq!(
            raw_bytes(&name.display, name.base64.as_deref()).as_deref(),
            Some(raw)
        );
        assert_eq!(raw_bytes("plain", None).as_deref(), Some(&b"plain"[..]));
    }
}
