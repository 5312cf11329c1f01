//! Bash sessions: `create_session`, `run_in_session`, `close_session`, `close`.
//!
//! Each named bash session is one terminal of the toolexec session (`exec_command` with a
//! pseudo-terminal, running `bash --noediting`), driven with `write_stdin` and its `until`
//! patterns (see [`super::frame`] for what is typed and how the answer is read). The names are
//! kept by this node ([`super::names`]).
use axum::extract::{Request, State};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

use super::frame::{self, Ended, PS1};
use super::names::{self, MAX_NAME_CHARS, MAX_SHELLS, Refused, Shell, forget, shell};
use super::{Ctx, Failure, Outcome, class, handle, json_body, py_repr, timeout_ms};
use crate::SharedState;

fn default_session() -> String {
    "default".to_owned()
}

fn default_check() -> String {
    "raise".to_owned()
}

fn default_startup_timeout() -> f64 {
    1.0
}

fn default_interrupt_timeout() -> f64 {
    0.2
}

fn default_retries() -> i64 {
    3
}

#[derive(Debug, Deserialize)]
struct CreateBashSession {
    #[serde(default)]
    startup_source: Vec<String>,
    #[serde(default = "default_session")]
    session: String,
    #[serde(default)]
    session_type: Option<String>,
    #[serde(default = "default_startup_timeout")]
    startup_timeout: f64,
}

#[derive(Debug, Deserialize)]
struct BashAction {
    command: String,
    #[serde(default = "default_session")]
    session: String,
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    is_interactive_command: bool,
    #[serde(default)]
    is_interactive_quit: bool,
    #[serde(default = "default_check")]
    check: String,
    #[serde(default)]
    error_msg: String,
    #[serde(default)]
    expect: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct BashInterruptAction {
    #[serde(default = "default_session")]
    session: String,
    #[serde(default = "default_interrupt_timeout")]
    timeout: f64,
    #[serde(default = "default_retries")]
    n_retry: i64,
    #[serde(default)]
    expect: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct CloseBashSession {
    #[serde(default = "default_session")]
    session: String,
    #[serde(default)]
    session_type: Option<String>,
}

fn bash_only(session_type: Option<&str>) -> Result<(), Failure> {
    match session_type {
        None | Some("bash") => Ok(()),
        Some(other) => Err(Failure::http(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            format!("body/session_type: only 'bash' sessions exist, not {other:?}"),
        )),
    }
}

/// A write_stdin's answer: which `until` pattern matched, the text, and whether the terminal
/// is gone (ended, or unknown).
struct Read {
    matched: Option<usize>,
    text: String,
    gone: Option<String>,
}

fn read_of(out: &Outcome) -> Read {
    if let Some(rest) = out.text.strip_prefix("write_stdin failed: ") {
        return Read {
            matched: None,
            text: String::new(),
            gone: Some(rest.trim().to_owned()),
        };
    }
    let (matched, text) = frame::block_output(&out.text);
    let gone = out
        .text
        .lines()
        .find(|l| l.starts_with("Process exited with code "))
        .map(|l| format!("the shell ended ({})", l.trim()));
    Read {
        matched,
        text: text.to_owned(),
        gone,
    }
}

async fn write(
    ctx: &mut Ctx,
    terminal: u64,
    chars: &str,
    until: &[String],
    wait_ms: u64,
) -> Result<Read, Failure> {
    let mut args = json!({
        "session_id": terminal,
        "chars": chars,
        "yield_time_ms": wait_ms.clamp(250, 300_000),
        "max_output_tokens": 1_000_000,
    });
    if !until.is_empty() {
        args["until"] = json!(until);
    }
    let out = ctx.call("write_stdin", args).await?;
    Ok(read_of(&out))
}

/// The terminal of a named session: the live one, or (a request sent again) the one its
/// record names; else `SessionDoesNotExistError`.
async fn terminal_of(ctx: &mut Ctx, name: &str) -> Result<u64, Failure> {
    if let Some(s) = shell(ctx.session.id, name) {
        return Ok(s.terminal);
    }
    if ctx.replaying().await?
        && let Some(id) = ctx
            .recorded_arguments(0)
            .and_then(|a| a["session_id"].as_u64())
    {
        return Ok(id);
    }
    Err(missing(name))
}

fn missing(name: &str) -> Failure {
    Failure::exception(
        class::SESSION_MISSING,
        format!("session {} does not exist", py_repr(name)),
    )
}

/// A terminal that is gone: its name goes with it.
fn gone(ctx: &Ctx, name: &str, why: &str) -> Failure {
    forget(ctx.session.id, name);
    if why.starts_with("Unknown process id") {
        return missing(name);
    }
    Failure::exception(
        class::RUNTIME,
        format!("bash session {} is gone: {why}", py_repr(name)),
    )
}

pub(crate) async fn create_session(State(state): State<SharedState>, req: Request) -> Response {
    handle(state.clone(), req, |mut ctx, body| async move {
        let req: CreateBashSession = json_body(&state, body).await?;
        bash_only(req.session_type.as_deref())?;
        if req.session.chars().count() > MAX_NAME_CHARS {
            return Err(Failure::http(
                axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                format!("a bash session's name may have at most {MAX_NAME_CHARS} characters"),
            ));
        }
        if let Some(s) = shell(ctx.session.id, &req.session)
            && s.created_by != ctx.key
        {
            return Err(Failure::exception(
                class::SESSION_EXISTS,
                format!("session {} already exists", req.session),
            ));
        }
        if names::all(ctx.session.id).len() >= MAX_SHELLS {
            return Err(Failure::http(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                format!("a session may have {MAX_SHELLS} bash sessions; close one first"),
            ));
        }
        let opened = ctx
            .call(
                "exec_command",
                json!({
                    "cmd": "exec bash --noprofile --norc --noediting",
                    "tty": true,
                    "login": false,
                    "cols": 250,
                    "yield_time_ms": 250,
                    "max_output_tokens": 1_000_000,
                }),
            )
            .await?;
        let terminal = opened
            .text
            .lines()
            .find_map(|l| l.strip_prefix("Process running with session ID "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                Failure::exception(
                    class::RUNTIME,
                    format!("the bash session could not start: {}", opened.text.trim()),
                )
            })?;
        let taken = names::insert(
            ctx.tenant.id,
            ctx.session.id,
            req.session.clone(),
            Shell {
                terminal,
                created_by: ctx.key.clone(),
            },
        );
        if let Err(refused) = taken {
            // Another request took the name (or the last place) while this one started its
            // shell: that shell ends here, and this request is refused as the check above.
            end(&mut ctx, terminal).await?;
            return Err(match refused {
                Refused::Exists => Failure::exception(
                    class::SESSION_EXISTS,
                    format!("session {} already exists", req.session),
                ),
                Refused::Full => Failure::http(
                    axum::http::StatusCode::TOO_MANY_REQUESTS,
                    format!("a session may have {MAX_SHELLS} bash sessions; close one first"),
                ),
            });
        }
        let nonce = ctx.nonce();
        let wait = timeout_ms(Some(req.startup_timeout.max(1.0)));
        let setup = frame::setup(&nonce, &req.startup_source);
        let read = write(
            &mut ctx,
            terminal,
            &setup,
            &[frame::end_pattern(&nonce)],
            wait,
        )
        .await?;
        if let Some(why) = read.gone {
            return Err(gone(&ctx, &req.session, &why));
        }
        match frame::ended(&nonce, &read.text) {
            Some(Ended::Ran { output, .. }) => {
                Ok(json!({"output": output, "session_type": "bash"}))
            }
            _ => Err(Failure::exception(
                class::TIMEOUT,
                format!(
                    "timeout after {} seconds while starting bash session {}",
                    req.startup_timeout.max(1.0),
                    py_repr(&req.session)
                ),
            )),
        }
    })
    .await
}

pub(crate) async fn run_in_session(State(state): State<SharedState>, req: Request) -> Response {
    handle(state.clone(), req, |mut ctx, body| async move {
        let action: Value = json_body(&state, body).await?;
        let kind = action["action_type"].as_str().unwrap_or("bash").to_owned();
        fn parse<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, Failure> {
            serde_json::from_value(v).map_err(|e| {
                Failure::http(
                    axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                    format!("body: {e}"),
                )
            })
        }
        match kind.as_str() {
            "bash" => run(&mut ctx, parse(action)?).await,
            "bash_interrupt" => interrupt(&mut ctx, parse(action)?).await,
            other => Err(Failure::http(
                axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                format!("body/action_type: 'bash' or 'bash_interrupt', not {other:?}"),
            )),
        }
    })
    .await
}

fn observation(output: &str, exit_code: Option<i32>, expect_string: &str) -> Value {
    json!({
        "output": output,
        "exit_code": exit_code,
        "failure_reason": "",
        "expect_string": expect_string,
        "session_type": "bash",
    })
}

/// The text before the last match of `pattern` (the expect string that ended the read).
///
/// The pattern is the client's: it is searched for on the blocking pool, never on the async
/// workers that serve other sessions, and only in the text's last [`MATCH_WINDOW`] bytes —
/// the read ended at the match's end, and the terminal finds a match no further back.
async fn before_match(text: &str, pattern: &str) -> String {
    let mut from = text.len().saturating_sub(MATCH_WINDOW);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    let tail = text[from..].to_owned();
    let pattern = pattern.to_owned();
    let at = tokio::task::spawn_blocking(move || {
        let re = regex::RegexBuilder::new(&pattern)
            .size_limit(1 << 20)
            .build()
            .ok()?;
        re.find_iter(&tail).last().map(|m| m.start())
    })
    .await
    .ok()
    .flatten();
    match at {
        Some(at) => text[..from + at].to_owned(),
        None => text.to_owned(),
    }
}

/// How far back from the end of a read [`before_match`] looks: the terminal's window for a
/// match that spans reads (`toolexec_sandbox::UNTIL_WINDOW`), doubled for the read it ended.
const MATCH_WINDOW: usize = 128 * 1024;

/// Most `expect` strings one action may give: `write_stdin`'s 16 `until` patterns, less the
/// one this module adds (the prompt, or the command's end marker).
const MAX_EXPECT: usize = 15;

fn check_expect(expect: &[String]) -> Result<(), Failure> {
    if expect.len() > MAX_EXPECT {
        return Err(Failure::http(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "body/expect: at most {MAX_EXPECT} strings (got {}); match a common prefix or an alternation instead",
                expect.len()
            ),
        ));
    }
    Ok(())
}

async fn run(ctx: &mut Ctx, action: BashAction) -> Result<Value, Failure> {
    check_expect(&action.expect)?;
    let terminal = terminal_of(ctx, &action.session).await?;
    if !["raise", "silent", "ignore"].contains(&action.check.as_str()) {
        return Err(Failure::http(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "body/check: 'raise', 'silent' or 'ignore'",
        ));
    }
    let wait = timeout_ms(action.timeout);
    let timed_out = || {
        Failure::exception(
            class::TIMEOUT,
            format!(
                "timeout after {} seconds while running command {}",
                action
                    .timeout
                    .map_or_else(|| "None".to_owned(), |t| t.to_string()),
                py_repr(&action.command)
            ),
        )
    };
    if action.is_interactive_command || action.is_interactive_quit {
        // Typed as it is, to whatever program reads the terminal; read up to an expected
        // string or the shell's prompt.
        let mut until = action.expect.clone();
        until.push(regex::escape(PS1));
        let read = write(
            ctx,
            terminal,
            &format!("{}\n", action.command),
            &until,
            wait,
        )
        .await?;
        if let Some(why) = read.gone {
            return Err(gone(ctx, &action.session, &why));
        }
        let Some(i) = read.matched else {
            return Err(timed_out());
        };
        let expect_string = action.expect.get(i).map_or(PS1, String::as_str).to_owned();
        let mut output = before_match(&read.text, &until[i]).await;
        if action.is_interactive_quit {
            // Back at the prompt: echo off again (the program may have turned it on).
            let nonce = format!("{}q", ctx.nonce());
            write(
                ctx,
                terminal,
                &frame::run(&nonce, "stty -echo 2>/dev/null; true"),
                &[frame::end_pattern(&nonce)],
                5_000,
            )
            .await?;
        } else {
            output = output
                .trim_start()
                .strip_prefix(action.command.as_str())
                .unwrap_or(output.trim_start())
                .trim()
                .to_owned();
        }
        return Ok(observation(&output, Some(0), &expect_string));
    }
    let nonce = ctx.nonce();
    let mut until = vec![frame::end_pattern(&nonce)];
    until.extend(action.expect.iter().cloned());
    let read = write(
        ctx,
        terminal,
        &frame::run(&nonce, &action.command),
        &until,
        wait,
    )
    .await?;
    if let Some(why) = read.gone {
        return Err(gone(ctx, &action.session, &why));
    }
    match read.matched {
        None => Err(timed_out()),
        Some(0) => match frame::ended(&nonce, &read.text) {
            Some(Ended::Syntax { message, exit_code }) => Err(Failure::Exception {
                class_path: class::SYNTAX,
                message: format!(
                    "Error (exit code {exit_code}) while checking bash command \n{}\n---- Stderr ----\n{message}\n---- Stdout ----\n",
                    py_repr(&action.command)
                ),
                extra_info: json!({"bash_stdout": "", "bash_stderr": message}),
            }),
            Some(Ended::Ran { output, exit_code }) => {
                if action.check == "ignore" {
                    return Ok(observation(&output, None, PS1));
                }
                if action.check == "raise" && exit_code != 0 {
                    let mut msg = format!(
                        "Command {} failed with exit code {exit_code}. Here is the output:\n{}",
                        py_repr(&action.command),
                        py_repr(&output)
                    );
                    if !action.error_msg.is_empty() {
                        msg = format!("{}: {msg}", action.error_msg);
                    }
                    return Err(Failure::exception(class::NON_ZERO_EXIT, msg));
                }
                Ok(observation(&output, Some(exit_code), PS1))
            }
            None => Err(Failure::exception(
                class::NO_EXIT_CODE,
                format!(
                    "the end of command {} was seen but could not be read",
                    py_repr(&action.command)
                ),
            )),
        },
        Some(i) => {
            // An expected string before the command's end: its exit status is not known.
            let expect_string = action.expect[i - 1].clone();
            let text = before_match(&read.text, &until[i]).await;
            let start = format!("TX{nonce}R\n");
            let output = text
                .find(&start)
                .map_or(text.as_str(), |s| &text[s + start.len()..]);
            if action.check == "raise" {
                return Err(Failure::exception(
                    class::NO_EXIT_CODE,
                    format!(
                        "the output of {} matched {} before the command ended: its exit code is not known (use check='silent' or 'ignore', or is_interactive_command)",
                        py_repr(&action.command),
                        py_repr(&expect_string)
                    ),
                ));
            }
            Ok(observation(output, None, &expect_string))
        }
    }
}

async fn interrupt(ctx: &mut Ctx, action: BashInterruptAction) -> Result<Value, Failure> {
    check_expect(&action.expect)?;
    let terminal = terminal_of(ctx, &action.session).await?;
    let mut until = action.expect.clone();
    until.push(regex::escape(PS1));
    let wait = timeout_ms(Some(action.timeout));
    let mut output = String::new();
    for _ in 0..action.n_retry.clamp(0, 8) {
        let read = write(ctx, terminal, "\x03", &until, wait).await?;
        if let Some(why) = read.gone {
            return Err(gone(ctx, &action.session, &why));
        }
        if let Some(obs) = matched(&read, &until, &action.expect, &mut output).await {
            return Ok(obs);
        }
    }
    // As swerex-remote: the job to the background, then killed there.
    let read = write(ctx, terminal, "\x1a", &until, wait).await?;
    if let Some(why) = read.gone {
        return Err(gone(ctx, &action.session, &why));
    }
    output.push_str(&read.text);
    let read = write(ctx, terminal, "kill -9 %1\n", &until, wait).await?;
    if let Some(why) = read.gone {
        return Err(gone(ctx, &action.session, &why));
    }
    if let Some(obs) = matched(&read, &until, &action.expect, &mut output).await {
        return Ok(obs);
    }
    Err(Failure::exception(
        "pexpect.exceptions.TIMEOUT",
        "Failed to interrupt session",
    ))
}

/// An interrupt's read that reached an expected string or the prompt: its observation, the
/// output gathered so far with the text before the match.
async fn matched(
    read: &Read,
    until: &[String],
    expect: &[String],
    output: &mut String,
) -> Option<Value> {
    let i = read.matched?;
    output.push_str(&before_match(&read.text, &until[i]).await);
    let expect_string = expect.get(i).map_or(PS1, String::as_str);
    Some(observation(output.trim(), Some(0), expect_string))
}

/// Ends a bash session's terminal: an interrupt, `exit`, then end-of-input twice (a program
/// still reading, then the shell).
async fn end(ctx: &mut Ctx, terminal: u64) -> Result<(), Failure> {
    write(ctx, terminal, "\x03\nexit\n\x04\x04", &[], 2_000).await?;
    Ok(())
}

pub(crate) async fn close_session(State(state): State<SharedState>, req: Request) -> Response {
    handle(state.clone(), req, |mut ctx, body| async move {
        let req: CloseBashSession = json_body(&state, body).await?;
        bash_only(req.session_type.as_deref())?;
        let terminal = terminal_of(&mut ctx, &req.session).await?;
        forget(ctx.session.id, &req.session);
        end(&mut ctx, terminal).await?;
        Ok(json!({"session_type": "bash"}))
    })
    .await
}

/// `close`: every bash session ends; the toolexec session stays open (closing it is
/// `DELETE /v1/sessions/{id}`).
pub(crate) async fn close(State(state): State<SharedState>, req: Request) -> Response {
    handle(state, req, |mut ctx, _body| async move {
        let mut all: Vec<(String, u64)> = names::all(ctx.session.id)
            .into_iter()
            .filter_map(|n| shell(ctx.session.id, &n).map(|s| (n, s.terminal)))
            .collect();
        all.sort();
        for (name, terminal) in all {
            forget(ctx.session.id, &name);
            end(&mut ctx, terminal).await?;
        }
        Ok(json!({}))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn before_match_is_the_text_before_the_last_match_near_the_end() {
        assert_eq!(before_match("a>>> b>>> ", ">>> ").await, "a>>> b");
        assert_eq!(before_match("no prompt", ">>> ").await, "no prompt");
        assert_eq!(before_match("bad pattern", "(").await, "bad pattern");
        // A long text: only its end is searched, from a character boundary.
        let long = format!("{}é>>> {}>>> ", "é".repeat(MATCH_WINDOW), "x".repeat(10));
        let got = before_match(&long, ">>> ").await;
        assert_eq!(got.len(), long.len() - 4);
        // A match only further back than the window is not the read's: the text stays whole.
        let far = format!(">>> {}", "y".repeat(MATCH_WINDOW + 1));
        assert_eq!(before_match(&far, ">>> ").await, far);
    }
}
