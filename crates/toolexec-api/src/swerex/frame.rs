//! What a bash session is sent and how its answer is read.
//!
//! A bash session is an interactive `bash --noediting` on a pseudo-terminal (an `exec_command`
//! terminal): no readline, the terminal in canonical mode with echo off, its prompt `PS1` the
//! fixed `SHELLPS1PREFIX` (swerex-remote's), `PS2` and `PS0` empty. A command runs as one line
//! typed at its prompt, a *frame*:
//!
//! ```text
//! printf 'TX%sB\n' N; if eval $'__txsyn() { CMD\n:\n}'; then unset -f __txsyn;
//!   printf 'TX%sR\n' N; eval $'CMD'; printf '\nTX%sE %d\n' N "$?";
//! else printf '\nTX%sS %d\n' N "$?"; fi; PS1='SHELLPS1PREFIX'
//! ```
//!
//! - `N` is the request's nonce; the markers (`TX<N>B`, `R`, `E`, `S`) are assembled by
//!   `printf`, so the typed line (were it echoed) never holds them.
//! - The syntax check is bash's own parser: the command is first defined as the body of a
//!   function, which parses it without running it (swerex-remote runs `bash -n` on it); a
//!   syntax error is `S` with bash's message before it, and the command does not run.
//! - The command runs with `eval` in the shell itself (not a function, not a subshell): its
//!   `cd`, exports, functions and variables stay. Its stdin is the terminal: a program it
//!   starts can be talked to later (`is_interactive_command`).
//! - The command is quoted as one `$'…'` word (control characters escaped, so the terminal's
//!   line discipline sees none: no ^C, ^D or ^U by accident), cut into physical lines of at
//!   most [`CHUNK`] bytes joined by backslash-newline (the terminal holds 4095 bytes a line).
//! - The end is `TX<N>E <status>` (or `S`) followed by the prompt (the `PS1` the frame sets at
//!   its end, so a command that changed it — a virtualenv's `activate` — does not hide it).
use std::fmt::Write as _;

/// The prompt: swerex-remote's.
pub const PS1: &str = "SHELLPS1PREFIX";

/// Longest physical line of a quoted command, in bytes.
const CHUNK: usize = 512;

/// `bytes` as `$'…'` words joined by backslash-newline, none longer than [`CHUNK`].
pub fn ansi_c_quote(text: &str) -> String {
    let mut out = String::from("$'");
    let mut line = 0usize;
    for c in text.chars() {
        let piece = match c {
            '\\' => "\\\\".to_owned(),
            '\'' => "\\'".to_owned(),
            '\n' => "\\n".to_owned(),
            '\t' => "\\t".to_owned(),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => format!("\\x{:02x}", c as u32),
            c => c.to_string(),
        };
        if line + piece.len() > CHUNK {
            out.push_str("'\\\n$'");
            line = 0;
        }
        line += piece.len();
        out.push_str(&piece);
    }
    out.push('\'');
    out
}

/// The line that sets a fresh shell up: no echo, no history, swerex's prompts, the startup
/// files sourced; then the frame's end, so its answer is read like a command's.
pub fn setup(nonce: &str, startup_source: &[String]) -> String {
    let mut line = format!(
        "stty -echo 2>/dev/null; set +o history 2>/dev/null; unset PROMPT_COMMAND; printf 'TX%sR\\n' {nonce}; true; "
    );
    for file in startup_source {
        let _ = write!(line, "source {} ; ", ansi_c_quote(file));
    }
    let _ = writeln!(
        line,
        "printf '\\nTX%sE %d\\n' {nonce} \"$?\"; export PS1='{PS1}' PS2='' PS0=''"
    );
    line
}

/// The frame that runs `command` (see the module's documentation).
pub fn run(nonce: &str, command: &str) -> String {
    let body = ansi_c_quote(&format!("__txsyn() {{ {command}\n:\n}}"));
    let cmd = ansi_c_quote(command);
    format!(
        "printf 'TX%sB\\n' {nonce}; if eval {body} ; then unset -f __txsyn; printf 'TX%sR\\n' {nonce}; eval {cmd} ; printf '\\nTX%sE %d\\n' {nonce} \"$?\"; else printf '\\nTX%sS %d\\n' {nonce} \"$?\"; fi; PS1='{PS1}'\n"
    )
}

/// The pattern (a regex) that ends a frame: its end marker, then the prompt.
pub fn end_pattern(nonce: &str) -> String {
    format!("TX{nonce}[ES] [0-9]+\\r?\\n(?s:.*?){PS1}")
}

/// How a frame ended, read from the plain text of its output.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// It ran: its output and exit status.
    Ran { output: String, exit_code: i32 },
    /// Its syntax check failed: bash's message and status.
    Syntax { message: String, exit_code: i32 },
}

/// The plain text after a write_stdin block's `Output:` line, and its `Matched:` line.
pub fn block_output(block: &str) -> (Option<usize>, &str) {
    let matched = block
        .lines()
        .find_map(|l| l.strip_prefix("Matched: "))
        .and_then(|m| m.trim().parse().ok());
    let output = match block.find("\nOutput:\n") {
        Some(i) => &block[i + "\nOutput:\n".len()..],
        None => block.strip_prefix("Output:\n").unwrap_or(""),
    };
    (matched, output)
}

/// A frame's end, from the text its write_stdin returned.
pub fn ended(nonce: &str, text: &str) -> Option<Ended> {
    let start = format!("TX{nonce}R\n");
    let end = format!("\nTX{nonce}E ");
    let syntax = format!("\nTX{nonce}S ");
    let code = |after: &str| -> Option<i32> {
        after
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|d| d.parse().ok())
    };
    if let Some(s) = text.find(&syntax) {
        let begin = format!("TX{nonce}B\n");
        let from = text.find(&begin).map_or(0, |b| b + begin.len());
        let message = text.get(from..s).unwrap_or("").to_owned();
        return Some(Ended::Syntax {
            message,
            exit_code: code(&text[s + syntax.len()..])?,
        });
    }
    let r = text.find(&start)? + start.len();
    let e = r + text[r..].find(&end)?;
    Some(Ended::Ran {
        output: text[r..e].to_owned(),
        exit_code: code(&text[e + end.len()..])?,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// What bash makes of a quoted word.
    fn bash_word(word: &str) -> String {
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("printf %s {word}"))
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn quoting_gives_bash_the_text_back_whatever_it_holds() {
        let long = "x'y\\z\n".repeat(300);
        for text in [
            "echo 'hi' \"there\" $HOME `id` \\",
            "a\tb\x03c\x04d\x7fé😀",
            long.as_str(),
            "",
        ] {
            let q = ansi_c_quote(text);
            assert!(q.lines().all(|l| l.len() <= CHUNK + 8), "{q}");
            assert!(!q.bytes().any(|b| b < 0x20 && b != b'\n'), "{q}");
            assert_eq!(bash_word(&q), text);
        }
    }

    #[test]
    fn a_frame_is_read_back() {
        let n = "abc";
        let text = "TXabcB\nTXabcR\nhello\n\nTXabcE 3\nSHELLPS1PREFIX";
        assert_eq!(
            ended(n, text),
            Some(Ended::Ran {
                output: "hello\n".into(),
                exit_code: 3
            })
        );
        let text = "TXabcB\nbash: syntax error near `fi'\n\nTXabcS 2\n";
        assert!(matches!(
            ended(n, text),
            Some(Ended::Syntax { exit_code: 2, .. })
        ));
        assert_eq!(ended(n, "TXabcB\nTXabcR\nrunning"), None);
        let re = regex::Regex::new(&end_pattern(n)).unwrap();
        assert!(re.is_match("TXabcE 0\r\n[1]+ Done\r\nSHELLPS1PREFIX"));
        assert!(!re.is_match("TXabdE 0\r\nSHELLPS1PREFIX"));
    }

    /// The frame, typed into a real interactive bash: the command's state stays, a syntax
    /// error does not run it.
    #[test]
    fn frames_run_in_a_real_shell() {
        let script = [
            run("n1", "cd /tmp && export A=1 && f() { echo fn; }"),
            run("n2", "echo $A; pwd; f; (exit 7)"),
            run("n3", "if then fi; echo ran"),
        ]
        .concat();
        let out = std::process::Command::new("bash")
            .args(["--noprofile", "--norc", "-s"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(script.as_bytes())?;
                c.wait_with_output()
            })
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let all = format!("{stdout}{stderr}");
        assert_eq!(
            ended("n2", &stdout),
            Some(Ended::Ran {
                output: "1\n/tmp\nfn\n".into(),
                exit_code: 7
            }),
            "{all}"
        );
        assert!(
            matches!(
                ended("n3", &stdout),
                Some(Ended::Syntax { exit_code: 2, .. })
            ),
            "{all}"
        );
        assert!(stderr.contains("syntax error"), "{all}");
        assert!(!stdout.contains("ran"), "{all}");
    }
}
