//! What a page, a list or a stream shows of a record too large to show whole: the beginning of
//! its JSON text, made a JSON document of its own, and where to read it whole.
//!
//! The store cuts a large value's text after a number of characters (Postgres `left()`, SQLite
//! `substr()`), so the service never holds the value whole to show a page of them;
//! [`close_prefix`] turns that beginning into valid JSON: what was cut is dropped or closed, a
//! string cut short ends with `…`.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Characters of a large value's JSON text a page, a list or a stream shows.
pub const EXCERPT_CHARS: u32 = 4096;

/// Most bytes an excerpt of [`EXCERPT_CHARS`] characters takes once closed: four bytes a
/// character at most, one closing bracket per opening one, the marker.
pub const EXCERPT_MAX_BYTES: u64 = 5 * EXCERPT_CHARS as u64 + 16;

/// Set on an event (or a session) shown truncated: its `data` (its `env` and `metadata`) is
/// the beginning of the value, cut where it went over the bound of the page or stream that
/// shows it. `full` serves it whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Truncated {
    /// Bytes of the JSON text of what was cut short (an event's `data`; a session's `tools`,
    /// `policy`, `env` and `metadata` together), as the store holds it.
    pub bytes: u64,
    /// The path that serves it whole (`GET`, with the same credentials): an event
    /// (`/v1/sessions/{id}/events/{seq}`) or a session (`/v1/sessions/{id}`).
    pub full: String,
}

/// Marks a string cut short.
pub const CUT: &str = "…";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Expecting a key or `}` (object), a value or `]` (array).
    Open,
    /// A key was read; expecting `:`.
    Colon,
    /// Expecting a value (after `:` or `,` in an array).
    Value,
    /// Expecting a key (after `,` in an object).
    Key,
    /// A value ended; expecting `,` or the closing bracket.
    Next,
}

struct Frame {
    object: bool,
    phase: Phase,
    /// Length of the output at the last point where this container was whole but for its
    /// closing bracket: right after it opened, or after its last complete member.
    whole: usize,
}

/// Where the text stopped in the middle of a token.
enum Partial {
    None,
    /// In a string that is a value; `escape` is the output length before an escape begun.
    ValueString {
        escape: Option<usize>,
    },
    /// In a key, a number or a literal: dropped with its member.
    Dropped,
}

/// The beginning of a JSON text (`text`, cut anywhere — at a character boundary — or whole) as
/// a JSON document: every value that ended within `text` as it was (whitespace dropped), the
/// member or element that was cut dropped, except a string value, which keeps what it had and
/// ends with [`CUT`]; open arrays and objects closed. `null` when nothing of a value is left.
/// Text that is not JSON ends the document where it begins.
pub fn close_prefix(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut stack: Vec<Frame> = Vec::new();
    // Whether the top-level value ended.
    let mut done = false;
    let mut partial = Partial::None;
    let mut chars = text.char_indices().peekable();
    'scan: while let Some((i, c)) = chars.next() {
        if c.is_ascii_whitespace() {
            continue;
        }
        if done {
            break;
        }
        let phase = stack.last().map(|f| f.phase);
        match (c, phase) {
            ('}', Some(Phase::Open | Phase::Next)) if stack.last().is_some_and(|f| f.object) => {
                out.push('}');
                stack.pop();
                value_ended(&mut stack, &out, &mut done);
            }
            (']', Some(Phase::Open | Phase::Next)) if stack.last().is_some_and(|f| !f.object) => {
                out.push(']');
                stack.pop();
                value_ended(&mut stack, &out, &mut done);
            }
            (',', Some(Phase::Next)) => {
                out.push(',');
                if let Some(f) = stack.last_mut() {
                    f.phase = if f.object { Phase::Key } else { Phase::Value };
                }
            }
            (':', Some(Phase::Colon)) => {
                out.push(':');
                if let Some(f) = stack.last_mut() {
                    f.phase = Phase::Value;
                }
            }
            ('"', Some(Phase::Open | Phase::Key)) if stack.last().is_some_and(|f| f.object) => {
                // A key: copied whole, or dropped with its member when the text ends in it.
                out.push('"');
                if !copy_string(&mut chars, &mut out, &mut None) {
                    partial = Partial::Dropped;
                    break 'scan;
                }
                if let Some(f) = stack.last_mut() {
                    f.phase = Phase::Colon;
                }
            }
            (_, Some(Phase::Open | Phase::Value) | None)
                if phase != Some(Phase::Open) || stack.last().is_some_and(|f| !f.object) =>
            {
                match c {
                    '{' | '[' => {
                        out.push(c);
                        stack.push(Frame {
                            object: c == '{',
                            phase: Phase::Open,
                            whole: out.len(),
                        });
                    }
                    '"' => {
                        out.push('"');
                        let mut escape = None;
                        if !copy_string(&mut chars, &mut out, &mut escape) {
                            partial = Partial::ValueString { escape };
                            break 'scan;
                        }
                        value_ended(&mut stack, &out, &mut done);
                    }
                    '-' | '0'..='9' | 't' | 'f' | 'n' => {
                        let start = i;
                        let mut end = i + c.len_utf8();
                        while let Some(&(j, d)) = chars.peek() {
                            if d.is_ascii_alphanumeric() || matches!(d, '.' | '+' | '-') {
                                end = j + d.len_utf8();
                                chars.next();
                            } else {
                                break;
                            }
                        }
                        let token = &text[start..end];
                        // Cut at the end of the text: it may have gone on (`12` of `123`).
                        if chars.peek().is_none() || !is_scalar(token) {
                            partial = Partial::Dropped;
                            break 'scan;
                        }
                        out.push_str(token);
                        value_ended(&mut stack, &out, &mut done);
                    }
                    _ => break 'scan,
                }
            }
            _ => break 'scan,
        }
    }
    if let Partial::ValueString { escape } = partial {
        if let Some(at) = escape {
            out.truncate(at);
        }
        out.push_str(CUT);
        out.push('"');
        value_ended(&mut stack, &out, &mut done);
    }
    if stack.is_empty() && !done {
        return "null".to_owned();
    }
    // Close what is open, innermost first, dropping a member that did not end.
    while let Some(f) = stack.pop() {
        if f.phase != Phase::Next {
            out.truncate(f.whole);
        }
        out.push(if f.object { '}' } else { ']' });
        if let Some(parent) = stack.last_mut() {
            parent.phase = Phase::Next;
            parent.whole = out.len();
        }
    }
    out
}

/// A value ended at the end of `out`: its container now expects `,` or its end.
fn value_ended(stack: &mut [Frame], out: &str, done: &mut bool) {
    match stack.last_mut() {
        Some(f) => {
            f.phase = Phase::Next;
            f.whole = out.len();
        }
        None => *done = true,
    }
}

/// Copies the rest of a string (its opening quote already copied) with its closing quote;
/// false when the text ends first. `escape` is set to where an escape began while it is being
/// read (an escape cut short is dropped).
fn copy_string(
    chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>,
    out: &mut String,
    escape: &mut Option<usize>,
) -> bool {
    while let Some((_, c)) = chars.next() {
        match c {
            '"' => {
                out.push('"');
                return true;
            }
            '\\' => {
                // A high surrogate's escape stays open until its low one has been read: one
                // alone is not JSON.
                escape.get_or_insert(out.len());
                out.push('\\');
                let Some((_, e)) = chars.next() else {
                    return false;
                };
                out.push(e);
                let mut high = false;
                if e == 'u' {
                    let mut hex = String::with_capacity(4);
                    for _ in 0..4 {
                        let Some((_, h)) = chars.next() else {
                            return false;
                        };
                        out.push(h);
                        hex.push(h);
                    }
                    high =
                        u16::from_str_radix(&hex, 16).is_ok_and(|u| (0xD800..0xDC00).contains(&u));
                }
                if !high {
                    *escape = None;
                }
            }
            _ => out.push(c),
        }
    }
    false
}

fn is_scalar(token: &str) -> bool {
    matches!(token, "true" | "false" | "null")
        || serde_json::from_str::<serde_json::Number>(token).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn parse(s: &str) -> Value {
        serde_json::from_str(s).unwrap_or_else(|e| panic!("{s:?} is not JSON: {e}"))
    }

    #[test]
    fn a_whole_text_is_kept_and_a_cut_one_closed() {
        let v = json!({"a": [1, "two", {"b": null}], "c": "long text", "d": true});
        let text = v.to_string();
        assert_eq!(parse(&close_prefix(&text)), v);
        assert_eq!(
            close_prefix(r#"{"a": [1, "two", {"b": nu"#),
            r#"{"a":[1,"two",{}]}"#
        );
        assert_eq!(
            close_prefix(r#"{"a":[1],"c":"long t"#),
            r#"{"a":[1],"c":"long t…"}"#
        );
        assert_eq!(close_prefix(r#"{"a":[1],"c"#), r#"{"a":[1]}"#);
        assert_eq!(close_prefix(r#"{"a":[1],"c":"#), r#"{"a":[1]}"#);
        assert_eq!(close_prefix(r#"{"a":[1],"#), r#"{"a":[1]}"#);
        assert_eq!(close_prefix(r#"[12"#), "[]");
        assert_eq!(close_prefix(r#"[12,"#), "[12]");
        assert_eq!(close_prefix(r#""abc\u00"#), "\"abc…\"");
        assert_eq!(close_prefix(r#""abc\"#), "\"abc…\"");
        assert_eq!(close_prefix(r#""a\ud83d\ude00b"#), "\"a\\ud83d\\ude00b…\"");
        assert_eq!(close_prefix(r#""a\ud83d\ude"#), "\"a…\"");
        assert_eq!(close_prefix(""), "null");
        assert_eq!(close_prefix("12"), "null");
        assert_eq!(close_prefix("12 "), "12");
        assert_eq!(close_prefix("{"), "{}");
        assert_eq!(close_prefix(r#"{"a":x}"#), "{}");
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            "[a-z\"\\\\é\u{1F600}\n ]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-z\"é]{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Any beginning of any JSON text (compact, or spaced as Postgres prints jsonb) closes
        /// to valid JSON no longer than it plus its closers, and the whole text to the value.
        #[test]
        fn every_prefix_closes_to_json(v in json_value(), cut in 0.0f64..=1.0, spaced in any::<bool>()) {
            let text = if spaced { serde_json::to_string_pretty(&v).unwrap() } else { v.to_string() };
            let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
            let at = bounds[((bounds.len() - 1) as f64 * cut) as usize];
            let closed = close_prefix(&text[..at]);
            let parsed: Value = serde_json::from_str(&closed).map_err(|e| TestCaseError::fail(format!("{closed:?} of {:?}: {e}", &text[..at])))?;
            prop_assert!(closed.len() <= 2 * at + 8, "{} bytes of {}", closed.len(), at);
            // A number or literal at the very end may have gone on: only containers and
            // strings end where they say.
            if at == text.len() && (v.is_array() || v.is_object() || v.is_string()) {
                prop_assert_eq!(parsed, v);
            }
        }
    }
}
