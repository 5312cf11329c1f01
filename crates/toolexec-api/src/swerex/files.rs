//! `execute` (a command as `subprocess.run` runs it) and `read_file` as `shell` calls;
//! `write_file` as a `write_file` call.
//!
//! The `shell` tool answers with the exit status and then stdout and stderr as two sections;
//! each stream is ended by a marker with the request's nonce (`TX<N>O`), so that where one ends
//! is never a guess, whatever it holds, and whether it ended with a newline is kept.
use axum::extract::{Request, State};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};
use toolexec_core::CallStatus;

use super::frame::ansi_c_quote;
use super::{
    Ctx, Failure, WORKSPACE, class, handle, json_body, py_repr, timeout_ms, workspace_path,
};
use crate::SharedState;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum CommandLine {
    Line(String),
    Argv(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct Command {
    command: CommandLine,
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    shell: bool,
    #[serde(default)]
    check: bool,
    #[serde(default)]
    error_msg: String,
    #[serde(default)]
    env: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    merge_output_streams: bool,
}

#[derive(Debug, Deserialize)]
struct ReadFileRequest {
    path: String,
    #[serde(default)]
    encoding: Option<String>,
    #[serde(default)]
    errors: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WriteFileRequest {
    content: String,
    path: String,
}

/// The two streams of a `shell` answer whose command ended each with `TX<N>O\n`.
fn streams(text: &str, nonce: &str) -> Option<(String, String, Option<i32>)> {
    let marker = format!("TX{nonce}O\n");
    let code = text
        .lines()
        .find_map(|l| l.strip_prefix("[exit code "))
        .and_then(|l| l.split(' ').next())
        .and_then(|c| c.parse().ok());
    let out_at = text.find("--- stdout ---\n")? + "--- stdout ---\n".len();
    let out_end = out_at + text[out_at..].find(&marker)?;
    let stdout = text[out_at..out_end].to_owned();
    let rest = &text[out_end + marker.len()..];
    let err_at = rest.find("--- stderr ---\n")? + "--- stderr ---\n".len();
    let err_end = err_at + rest[err_at..].find(&marker)?;
    Some((stdout, rest[err_at..err_end].to_owned(), code))
}

/// A word for the shell.
fn word(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

pub(crate) async fn execute(State(state): State<SharedState>, req: Request) -> Response {
    handle(state.clone(), req, |mut ctx, body| async move {
        let cmd: Command = json_body(&state, body).await?;
        run_command(&mut ctx, cmd).await
    })
    .await
}

async fn run_command(ctx: &mut Ctx, cmd: Command) -> Result<Value, Failure> {
    // As subprocess.run: a list is argv (with shell=True, its first item is the script and
    // the rest its arguments), a string without shell=True the program's name.
    let argv: Vec<String> = match (&cmd.command, cmd.shell) {
        (CommandLine::Line(s), true) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
        (CommandLine::Argv(v), true) => {
            let mut a = vec!["/bin/sh".to_owned(), "-c".to_owned()];
            a.extend(v.iter().cloned());
            a
        }
        (CommandLine::Line(s), false) => vec![s.clone()],
        (CommandLine::Argv(v), false) => v.clone(),
    };
    if argv.is_empty() || argv.iter().any(|a| a.contains('\0')) {
        return Err(Failure::exception(
            class::VALUE,
            "the command is empty or holds a NUL character",
        ));
    }
    let workdir = match &cmd.cwd {
        Some(cwd) => Some(workspace_path(cwd)?),
        None => None,
    };
    let nonce = ctx.nonce();
    let env = match &cmd.env {
        // Replaces the environment, as subprocess.run's `env` does.
        Some(env) => {
            let mut s = "env -i".to_owned();
            for (k, v) in env {
                if k.is_empty() || k.contains('=') {
                    return Err(Failure::exception(
                        class::VALUE,
                        format!("illegal environment variable name {}", py_repr(k)),
                    ));
                }
                s.push(' ');
                s.push_str(&ansi_c_quote(&format!("{k}={v}")));
            }
            s.push(' ');
            s
        }
        None => String::new(),
    };
    let program: Vec<String> = argv.iter().map(|a| ansi_c_quote(a)).collect();
    let merge = if cmd.merge_output_streams {
        " 2>&1"
    } else {
        ""
    };
    let line = format!(
        "{{ {env}{} ; }} </dev/null{merge}; __c=$?; printf 'TX%sO\\n' {nonce}; printf 'TX%sO\\n' {nonce} >&2; exit $__c",
        program.join(" ")
    );
    let mut args = json!({
        "command": line,
        "timeout_ms": timeout_ms(cmd.timeout),
        "description": "SWE-ReX execute",
    });
    if let Some(w) = &workdir
        && !w.is_empty()
    {
        args["workdir"] = json!(w);
    }
    let out = ctx.call("shell", args).await?;
    if out.status == CallStatus::TimedOut {
        return Err(Failure::exception(
            class::TIMEOUT,
            format!(
                "Timeout ({}s) exceeded while running command",
                cmd.timeout
                    .map_or_else(|| "None".to_owned(), |t| t.to_string())
            ),
        ));
    }
    let Some((stdout, stderr, Some(exit_code))) = streams(&out.text, &nonce) else {
        // No streams: the tool refused the call (a working directory that is not there).
        let text = out.text.trim().to_owned();
        let class = if text.contains("does not exist") || text.contains("No such") {
            class::NOT_FOUND
        } else {
            class::OS_ERROR
        };
        return Err(Failure::exception(class, text));
    };
    if exit_code == 127 && !cmd.shell {
        return Err(Failure::exception(
            class::NOT_FOUND,
            format!("[Errno 2] No such file or directory: {}", py_repr(&argv[0])),
        ));
    }
    if cmd.check && exit_code != 0 {
        let shown = match &cmd.command {
            CommandLine::Line(s) => py_repr(s),
            CommandLine::Argv(v) => format!(
                "[{}]",
                v.iter().map(|a| py_repr(a)).collect::<Vec<_>>().join(", ")
            ),
        };
        let mut msg = format!(
            "Command {shown} failed with exit code {exit_code}. Stdout:\n{}\nStderr:\n{}",
            py_repr(&stdout),
            py_repr(&stderr)
        );
        if !cmd.error_msg.is_empty() {
            msg = format!("{}: {msg}", cmd.error_msg);
        }
        return Err(Failure::exception(class::NON_ZERO_EXIT, msg));
    }
    Ok(json!({"stdout": stdout, "stderr": stderr, "exit_code": exit_code}))
}

pub(crate) async fn read_file(State(state): State<SharedState>, req: Request) -> Response {
    handle(state.clone(), req, |mut ctx, body| async move {
        let req: ReadFileRequest = json_body(&state, body).await?;
        let rel = workspace_path(&req.path)?;
        let nonce = ctx.nonce();
        let path = if rel.is_empty() {
            WORKSPACE.to_owned()
        } else {
            format!("{WORKSPACE}/{rel}")
        };
        // Resolved (links followed) and held to the workspace, as the jail holds read_file.
        let decode = match req.encoding.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None | Some("utf-8" | "utf8" | "ascii") => "cat -- \"$p\"".to_owned(),
            Some(enc) => format!(
                "iconv -f {} -t UTF-8{} -- \"$p\"",
                word(enc),
                if req.errors.as_deref().is_some_and(|e| e != "strict") {
                    " -c"
                } else {
                    ""
                }
            ),
        };
        let line = format!(
            "p=$(realpath -e -- {}) || {{ printf 'TX%sN\\n' {nonce}; exit 2; }}; case \"$p\" in {WORKSPACE}|{WORKSPACE}/*) ;; *) printf 'TX%sP\\n' {nonce}; exit 3;; esac; if [ -d \"$p\" ]; then printf 'TX%sD\\n' {nonce}; exit 4; fi; {decode}; __c=$?; printf 'TX%sO\\n' {nonce}; printf 'TX%sO\\n' {nonce} >&2; exit $__c",
            word(&path)
        );
        let out = ctx
            .call(
                "shell",
                json!({"command": line, "timeout_ms": 60_000, "description": "SWE-ReX read_file"}),
            )
            .await?;
        let has = |m: &str| out.text.contains(&format!("TX{nonce}{m}\n"));
        if has("N") {
            return Err(Failure::exception(
                class::NOT_FOUND,
                format!("[Errno 2] No such file or directory: {}", py_repr(&req.path)),
            ));
        }
        if has("P") {
            return Err(Failure::exception(
                class::PERMISSION,
                format!(
                    "[Errno 13] Permission denied: {}: it leads out of {WORKSPACE}, the only root this runtime maps",
                    py_repr(&req.path)
                ),
            ));
        }
        if has("D") {
            return Err(Failure::exception(
                class::IS_A_DIRECTORY,
                format!("[Errno 21] Is a directory: {}", py_repr(&req.path)),
            ));
        }
        match streams(&out.text, &nonce) {
            Some((content, _, Some(0))) => Ok(json!({"content": content})),
            Some((_, stderr, _)) => Err(Failure::exception(class::OS_ERROR, stderr.trim().to_owned())),
            None => Err(Failure::exception(
                class::OS_ERROR,
                format!(
                    "{} could not be read whole (over the output cap of one command?)",
                    py_repr(&req.path)
                ),
            )),
        }
    })
    .await
}

pub(crate) async fn write_file(State(state): State<SharedState>, req: Request) -> Response {
    handle(state.clone(), req, |mut ctx, body| async move {
        let req: WriteFileRequest = json_body(&state, body).await?;
        let rel = workspace_path(&req.path)?;
        if rel.is_empty() {
            return Err(Failure::exception(
                class::IS_A_DIRECTORY,
                format!("[Errno 21] Is a directory: {}", py_repr(&req.path)),
            ));
        }
        let args = json!({"file_path": rel, "content": req.content});
        let mut out = ctx.call("write_file", args.clone()).await?;
        // swerex-remote overwrites whatever is there; the tool wants a file read first (or
        // read again after a change): it is, then written.
        if out.status != CallStatus::Ok
            && (out.text.contains("has not been read")
                || out.text.contains("since it was read")
                || out.text.contains("changed since"))
        {
            ctx.call("read_file", json!({"file_path": rel, "limit": 1}))
                .await?;
            out = ctx.call("write_file", args).await?;
        }
        if out.status != CallStatus::Ok {
            let class = if out.text.contains("directory") {
                class::IS_A_DIRECTORY
            } else if out.text.contains("outside") {
                class::PERMISSION
            } else {
                class::OS_ERROR
            };
            return Err(Failure::exception(class, out.text.trim().to_owned()));
        }
        Ok(json!({}))
    })
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_streams_are_read_by_their_markers() {
        let text = "[exit code 1 after 0.01 s]\n--- stdout ---\nhi--- stderr ---\nTXnO\n\n--- stderr ---\noops\nTXnO\n";
        let (out, err, code) = streams(text, "n").unwrap();
        assert_eq!(out, "hi--- stderr ---\n");
        assert_eq!(err, "oops\n");
        assert_eq!(code, Some(1));
    }
}
