//! Cutting a tool's output to its limit for the model, with a marker that says how much was cut
//! and how to read the rest. The full output is always kept elsewhere.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::tool::{OutputLimit, TruncationMode};

/// What was cut from an output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Truncation {
    /// Length of the full output, in characters.
    pub total_chars: usize,
    /// Characters of the full output that `content` omits.
    pub omitted_chars: usize,
    pub mode: TruncationMode,
}

/// Cuts `full` to `limit`. Returns the text for the model and, when something was cut, what.
/// `read_hint` is appended to the marker (for example how to call `read_output`).
pub fn truncate(full: &str, limit: OutputLimit, read_hint: &str) -> (String, Option<Truncation>) {
    let total = full.chars().count();
    if total <= limit.max_chars {
        return (full.to_owned(), None);
    }
    let keep = limit.max_chars;
    let omitted = total - keep;
    let marker = |what: &str| format!("[… {omitted} characters {what} — {read_hint} …]");
    let text = match limit.mode {
        TruncationMode::Head => {
            let head: String = full.chars().take(keep).collect();
            format!("{head}\n{}", marker("more after this point"))
        }
        TruncationMode::Tail => {
            let tail: String = full.chars().skip(total - keep).collect();
            format!("{}\n{tail}", marker("cut before this point"))
        }
        TruncationMode::HeadTail => {
            let head_n = keep / 2;
            let tail_n = keep - head_n;
            let head: String = full.chars().take(head_n).collect();
            let tail: String = full.chars().skip(total - tail_n).collect();
            format!("{head}\n{}\n{tail}", marker("cut here"))
        }
    };
    (
        text,
        Some(Truncation {
            total_chars: total,
            omitted_chars: omitted,
            mode: limit.mode,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_left_alone() {
        let (t, cut) = truncate("abc", OutputLimit::new(3, TruncationMode::Head), "x");
        assert_eq!(t, "abc");
        assert!(cut.is_none());
    }

    #[test]
    fn head_tail_keeps_both_ends_and_says_how_much_was_cut() {
        let full = "0123456789";
        let (t, cut) = truncate(
            full,
            OutputLimit::new(4, TruncationMode::HeadTail),
            "use read_output",
        );
        assert!(t.starts_with("01\n"));
        assert!(t.ends_with("\n89"));
        assert!(t.contains("6 characters cut here — use read_output"));
        assert_eq!(cut.map(|c| c.omitted_chars), Some(6));
    }

    #[test]
    fn tail_keeps_the_end_and_counts_characters_not_bytes() {
        let (t, cut) = truncate("ééééé", OutputLimit::new(2, TruncationMode::Tail), "h");
        assert!(t.ends_with("\néé"));
        assert_eq!(cut.map(|c| c.total_chars), Some(5));
    }
}
