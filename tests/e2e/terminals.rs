//! Living terminals over HTTP (issue 24): the persistent `bash` — state that carries over,
//! `restart`, time limits, the hostile cases (a fake end marker, `exec 1>&-`, `kill -9 $$`) —
//! and nothing left on the host once the session is closed.
use serde_json::{Value, json};
use toolexec_tests::app::{TestApp, spawn_app, spawn_app_with, spawn_sqlite_app_with};
use toolexec_tests::procs::{assert_no_host_process, sleep_arg, wait_for_sleep};

fn content(r: &Value) -> &str {
    r["content"].as_str().unwrap_or_default()
}

async fn session(app: &TestApp, body: Value) -> String {
    let s = app.session(body).await;
    s["id"].as_str().unwrap().to_owned()
}

async fn bash(app: &TestApp, sid: &str, id: &str, args: Value) -> Value {
    app.call(sid, id, "bash", args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bash_keeps_cwd_exports_and_functions_between_calls_and_restart_drops_them() {
    let app = spawn_app().await;
    let sid = session(&app, json!({"files": {"sub/a.txt": "x"}})).await;
    let r = bash(
        &app,
        &sid,
        "b1",
        json!({"command": "cd sub && export FOO=bar && greet() { echo \"hi $1\"; } && X=local"}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    let r = bash(
        &app,
        &sid,
        "b2",
        json!({"command": "pwd; echo \"$FOO\"; greet you; echo \"[$X]\"; id -u; echo err >&2"}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(
        content(&r),
        "/workspace/sub\nbar\nhi you\n[local]\n65534\nerr\n",
        "{r}"
    );
    let inv = app.invocation_of(&r).await;
    assert_eq!(
        inv["capabilities"],
        json!(["process", "fs.read", "fs.write"]),
        "{inv}"
    );
    // An exit code that is not 0 is said, and the shell stays.
    let r = bash(&app, &sid, "b3", json!({"command": "false"})).await;
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(content(&r), "[exit code 1]\n", "{r}");
    // A syntax error is the command's, not a shell left waiting for the rest of a quote.
    let r = bash(&app, &sid, "b4", json!({"command": "echo \"unterminated"})).await;
    assert_eq!(r["status"], "error", "{r}");
    assert!(content(&r).contains("[exit code 2]"), "{r}");
    let r = bash(&app, &sid, "b5", json!({"command": "echo 'it'\\''s'; pwd"})).await;
    assert_eq!(content(&r), "it's\n/workspace/sub\n", "{r}");
    // Files the shell writes are recorded against the call.
    let r = bash(&app, &sid, "b6", json!({"command": "echo made > made.txt"})).await;
    assert_eq!(r["status"], "ok", "{r}");
    let events = app.events(&sid).await;
    assert!(
        events
            .iter()
            .any(|e| e["invocation_id"] == r["invocation_id"]
                && e["kind"] == "file.created"
                && e["data"]["path"] == "sub/made.txt"),
        "{events:?}"
    );
    // restart: a fresh shell, nothing kept.
    let r = bash(&app, &sid, "b7", json!({"restart": true})).await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(content(&r).contains("restarted"), "{r}");
    let r = bash(
        &app,
        &sid,
        "b8",
        json!({"command": "pwd; echo \"[$FOO]\"; type greet 2>&1 | head -1"}),
    )
    .await;
    assert!(
        content(&r).starts_with("/workspace\n[]\n")
            && content(&r).ends_with("type: greet: not found\n"),
        "{r}"
    );
    // Neither argument: refused, nothing run.
    let r = bash(&app, &sid, "b9", json!({})).await;
    assert_eq!(r["status"], "invalid_arguments", "{r}");
    let r = bash(&app, &sid, "b10", json!({"command": "true", "timeout": 3})).await;
    assert_eq!(r["status"], "invalid_arguments", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_cannot_fake_its_end_nor_close_the_shells_output() {
    let app = spawn_app().await;
    let sid = session(&app, json!({})).await;
    // Printed markers, on stdout and stderr, with the shape of the real one: just output.
    let fake = "printf '\\036TXB00000000000000000000000000000000 0\\n'; \
                printf '\\036TXB%s 0\\n' deadbeef >&2; echo '$ '; sleep 0.3; echo after";
    let r = bash(&app, &sid, "f1", json!({"command": fake})).await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(content(&r).ends_with("$ \nafter\n"), "{r}");
    // Writing at the descriptors bash keeps aside reaches only the output, never the end.
    let r = bash(
        &app,
        &sid,
        "f2",
        json!({"command": "for fd in 3 4 5 6 7 8 9 10 11 12; do echo \"fake $fd\" >&$fd; done 2>/dev/null; sleep 0.3; echo done"}),
    )
    .await;
    assert!(content(&r).contains("done\n"), "{r}");
    // Closing stdout and stderr for the rest of the command: the next call still has them.
    let r = bash(
        &app,
        &sid,
        "f3",
        json!({"command": "exec 1>&- 2>&-; echo lost; export KEPT=yes"}),
    )
    .await;
    assert_eq!(content(&r), "(no output)\n", "{r}");
    let r = bash(&app, &sid, "f4", json!({"command": "echo \"back $KEPT\""})).await;
    assert_eq!(content(&r), "back yes\n", "{r}");
    // set -x traces on the shell's own stderr: shown, and the call still ends.
    let r = bash(&app, &sid, "f5", json!({"command": "set -x; true"})).await;
    assert_eq!(r["status"], "ok", "{r}");
    let r = bash(&app, &sid, "f6", json!({"command": "set +x; echo clean"})).await;
    assert!(content(&r).contains("clean\n"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_killed_from_inside_or_exited_is_replaced_and_the_result_says_so() {
    let app = spawn_app().await;
    let sid = session(&app, json!({})).await;
    bash(&app, &sid, "k0", json!({"command": "export A=1"})).await;
    let r = bash(
        &app,
        &sid,
        "k1",
        json!({"command": "echo before; kill -9 $$"}),
    )
    .await;
    assert_eq!(r["status"], "error", "{r}");
    assert!(content(&r).starts_with("before\n"), "{r}");
    assert!(content(&r).contains("killed by signal 9"), "{r}");
    assert!(
        content(&r).contains("the shell was restarted, state was lost"),
        "{r}"
    );
    let r = bash(&app, &sid, "k2", json!({"command": "echo \"[$A]\"; pwd"})).await;
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(content(&r), "[]\n/workspace\n", "{r}");
    let r = bash(&app, &sid, "k3", json!({"command": "exit 7"})).await;
    assert!(
        content(&r).contains("the shell exited with status 7"),
        "{r}"
    );
    let r = bash(&app, &sid, "k4", json!({"command": "echo again"})).await;
    assert_eq!(content(&r), "again\n", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_past_its_time_is_interrupted_and_the_shell_kept_or_restarted() {
    let app = spawn_app().await;
    let sid = session(&app, json!({"policy": {"default_timeout_ms": 1500}})).await;
    bash(
        &app,
        &sid,
        "t0",
        json!({"command": "cd /tmp && export K=kept"}),
    )
    .await;
    let t0 = std::time::Instant::now();
    let r = bash(
        &app,
        &sid,
        "t1",
        json!({"command": "echo start; sleep 30; echo after"}),
    )
    .await;
    assert_eq!(r["status"], "timed_out", "{r}");
    assert!(content(&r).starts_with("start\n"), "{r}");
    assert!(content(&r).contains("timed out after 1500 ms"), "{r}");
    assert!(
        content(&r).contains("the shell and its state are kept"),
        "{r}"
    );
    assert!(t0.elapsed().as_secs() < 10, "{:?}", t0.elapsed());
    let r = bash(&app, &sid, "t2", json!({"command": "echo $K; pwd"})).await;
    assert_eq!(content(&r), "kept\n/tmp\n", "{r}");
    // A loop of builtins cannot be interrupted without the shell: it is restarted.
    let r = bash(&app, &sid, "t3", json!({"command": "while :; do :; done"})).await;
    assert_eq!(r["status"], "timed_out", "{r}");
    assert!(
        content(&r).contains("the shell was restarted, state was lost"),
        "{r}"
    );
    let r = bash(&app, &sid, "t4", json!({"command": "echo \"[$K]\"; pwd"})).await;
    assert_eq!(content(&r), "[]\n/workspace\n", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shell_and_its_jobs_die_with_their_session() {
    let app = spawn_app().await;
    let sid = session(&app, json!({})).await;
    let arg = sleep_arg(300);
    let r = bash(
        &app,
        &sid,
        "j1",
        json!({"command": format!("sleep {arg} & echo started")}),
    )
    .await;
    assert_eq!(content(&r), "started\n", "{r}");
    assert!(wait_for_sleep(&arg).await.is_some(), "the job never ran");
    // The job survives between calls (it is the shell's).
    let r = bash(&app, &sid, "j2", json!({"command": "jobs | wc -l"})).await;
    assert_eq!(content(&r), "1\n", "{r}");
    let closed = app.delete(&format!("/v1/sessions/{sid}")).await;
    assert!(closed.status().is_success(), "{}", closed.status());
    assert_no_host_process(&format!("sleep {arg}"), "after the session closed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_output_is_capped_and_the_shell_survives() {
    let app = spawn_app().await;
    let sid = session(&app, json!({})).await;
    bash(&app, &sid, "o0", json!({"command": "export S=still"})).await;
    let t0 = std::time::Instant::now();
    let r = bash(
        &app,
        &sid,
        "o1",
        json!({"command": "head -c 1000000000 /dev/zero | tr '\\0' x"}),
    )
    .await;
    assert!(t0.elapsed().as_secs() < 20, "{:?}", t0.elapsed());
    assert!(
        content(&r).contains("the output cap"),
        "{}",
        &content(&r)[content(&r).len().saturating_sub(400)..]
    );
    assert!(content(&r).len() <= 60_000, "{}", content(&r).len());
    let r = bash(&app, &sid, "o2", json!({"command": "echo $S"})).await;
    assert_eq!(content(&r), "still\n", "{r}");
}

// ---------------------------------------------------------------- exec_command / write_stdin

/// The lines of Codex's block: (header lines, output).
fn block(r: &Value) -> (Vec<String>, String) {
    let text = content(r);
    let (head, output) = text
        .split_once("\nOutput:\n")
        .unwrap_or_else(|| panic!("no Output: line in {r}"));
    (head.lines().map(str::to_owned).collect(), output.to_owned())
}

/// The session ID of a running terminal's result.
fn running_id(r: &Value) -> u32 {
    let (head, _) = block(r);
    head.iter()
        .find_map(|l| l.strip_prefix("Process running with session ID "))
        .unwrap_or_else(|| panic!("not running: {r}"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_command_answers_with_codexs_block_and_write_stdin_polls_it() {
    let app = spawn_app().await;
    let sid = session(&app, json!({})).await;
    let r = app
        .call(
            &sid,
            "e1",
            "exec_command",
            json!({"cmd": "echo hi; echo \"$TERM $NO_COLOR $PAGER\"; test -t 0 || echo notty; exit 3"}),
        )
        .await;
    let (head, output) = block(&r);
    assert_eq!(head.len(), 4, "{r}");
    let chunk = head[0].strip_prefix("Chunk ID: ").unwrap();
    assert!(
        chunk.len() == 6 && chunk.bytes().all(|b| b.is_ascii_hexdigit()),
        "{r}"
    );
    assert!(
        head[1].starts_with("Wall time: ") && head[1].ends_with(" seconds"),
        "{r}"
    );
    assert_eq!(head[2], "Process exited with code 3", "{r}");
    assert_eq!(head[3], "Original token count: 5", "{r}");
    assert_eq!(output, "hi\ndumb 1 cat\nnotty\n", "{r}");
    // A program still running gets an id; an empty poll waits for its output.
    let r = app
        .call(
            &sid,
            "e2",
            "exec_command",
            json!({"cmd": "sleep 1; echo done", "yield_time_ms": 250}),
        )
        .await;
    let id = running_id(&r);
    assert!((1000..=99_999).contains(&id), "{id}");
    let r = app
        .call(&sid, "e3", "write_stdin", json!({"session_id": id}))
        .await;
    assert!(content(&r).contains("done"), "{r}");
    // Not exited yet when the output came: one more poll sees the exit.
    let r = if content(&r).contains("Process exited with code 0") {
        r
    } else {
        app.call(
            &sid,
            "e4",
            "write_stdin",
            json!({"session_id": id, "yield_time_ms": 5000}),
        )
        .await
    };
    assert!(content(&r).contains("Process exited with code 0"), "{r}");
    let r = app
        .call(
            &sid,
            "e5",
            "write_stdin",
            json!({"session_id": id, "chars": "x"}),
        )
        .await;
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(
        content(&r),
        format!("write_stdin failed: Unknown process id {id}"),
        "{r}"
    );
    // Input to a program without a terminal: Codex's words.
    let r = app
        .call(
            &sid,
            "e6",
            "exec_command",
            json!({"cmd": "sleep 5", "yield_time_ms": 250}),
        )
        .await;
    let id = running_id(&r);
    let r = app
        .call(
            &sid,
            "e7",
            "write_stdin",
            json!({"session_id": id, "chars": "hello\n"}),
        )
        .await;
    assert_eq!(
        content(&r),
        "stdin is closed for this session; rerun exec_command with tty=true to keep stdin open",
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repl_in_a_terminal_is_driven_with_write_stdin_and_recorded() {
    let app = spawn_app().await;
    let sid = session(&app, json!({})).await;
    let r = app
        .call(
            &sid,
            "p1",
            "exec_command",
            json!({"cmd": "python3 -q -i", "tty": true, "yield_time_ms": 1500}),
        )
        .await;
    let id = running_id(&r);
    assert!(block(&r).1.ends_with(">>> "), "{r}");
    let r = app
        .call(
            &sid,
            "p2",
            "write_stdin",
            json!({"session_id": id, "chars": "import os, sys; print(6*7, os.isatty(0), os.get_terminal_size())\n", "yield_time_ms": 1500}),
        )
        .await;
    assert!(
        block(&r)
            .1
            .contains("42 True os.terminal_size(columns=80, lines=24)"),
        "{r}"
    );
    // Ctrl-C reaches the program through its terminal.
    let r = app
        .call(
            &sid,
            "p3",
            "write_stdin",
            json!({"session_id": id, "chars": "import time; time.sleep(30)\n", "yield_time_ms": 500}),
        )
        .await;
    assert!(content(&r).contains("Process running"), "{r}");
    let r = app
        .call(
            &sid,
            "p4",
            "write_stdin",
            json!({"session_id": id, "chars": "\u{3}", "yield_time_ms": 1500}),
        )
        .await;
    assert!(block(&r).1.contains("KeyboardInterrupt"), "{r}");
    let r = app
        .call(
            &sid,
            "p5",
            "write_stdin",
            json!({"session_id": id, "chars": "exit()\n", "yield_time_ms": 3000}),
        )
        .await;
    assert!(content(&r).contains("Process exited with code 0"), "{r}");
    // The log has what the model typed (the calls' chars) and what it saw, raw.
    let events = app.events(&sid).await;
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert!(kinds.contains(&"terminal.opened"), "{kinds:?}");
    assert!(kinds.contains(&"terminal.exited"), "{kinds:?}");
    assert!(
        events.iter().any(|e| e["kind"] == "terminal.output"
            && e["data"]["raw"]
                .as_str()
                .unwrap_or_default()
                .contains("42 True")),
        "{events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colour_codes_and_a_progress_bar_do_not_flood_the_model() {
    let app = spawn_app().await;
    let sid = session(&app, json!({})).await;
    let r = app
        .call(
            &sid,
            "a1",
            "exec_command",
            json!({"cmd": "for i in $(seq 1 2000); do printf '\\r\\033[32m[%-20s]\\033[0m %4d%%' \"$(printf '#%.0s' $(seq 1 $((i/100+1))))\" $((i/20)); done; printf '\\n\\033[1;31mred\\033[0m \\033]0;title\\007done\\n'", "tty": true, "yield_time_ms": 20000}),
        )
        .await;
    let (head, output) = block(&r);
    assert!(
        head.contains(&"Process exited with code 0".to_owned()),
        "{r}"
    );
    assert!(!output.contains('\u{1b}'), "{output:?}");
    assert!(output.ends_with("red done\n"), "{output:?}");
    assert!(output.len() < 200, "{} bytes: {output:?}", output.len());
    // The record keeps the raw bytes.
    let events = app.events(&sid).await;
    let raw = events
        .iter()
        .find(|e| e["kind"] == "terminal.output")
        .map(|e| e["data"]["raw_bytes"].as_u64().unwrap())
        .unwrap();
    assert!(raw > 50_000, "{raw}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminals_are_bounded_and_die_with_their_session() {
    let app = toolexec_tests::app::spawn_app_with(|c| c.limits.max_terminals_per_session = 3).await;
    let sid = session(&app, json!({})).await;
    let arg = sleep_arg(400);
    for i in 0..3 {
        let r = app
            .call(
                &sid,
                &format!("t{i}"),
                "exec_command",
                json!({"cmd": format!("sleep {arg}"), "tty": i % 2 == 0, "yield_time_ms": 250}),
            )
            .await;
        running_id(&r);
    }
    let r = app
        .call(&sid, "t3", "exec_command", json!({"cmd": "true"}))
        .await;
    assert_eq!(r["status"], "error", "{r}");
    assert!(
        content(&r).contains("limits.max_terminals_per_session = 3"),
        "{r}"
    );
    assert!(wait_for_sleep(&arg).await.is_some());
    let closed = app.delete(&format!("/v1/sessions/{sid}")).await;
    assert!(closed.status().is_success());
    assert_no_host_process(&format!("sleep {arg}"), "after the session closed").await;
    let events = app.events(&sid).await;
    let closed = events
        .iter()
        .find(|e| e["kind"] == "session.closed")
        .unwrap();
    let terminals = closed["data"]["terminals"].as_array().unwrap();
    assert_eq!(terminals.len(), 3, "{closed}");
    assert!(
        terminals
            .iter()
            .all(|t| t["killed_by"] == "the session was closed"),
        "{closed}"
    );
}

/// A terminal no call touches for `limits.terminal_idle_timeout_ms` is killed (its program and
/// what it started gone from the host), and the next look at it records why it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_terminal_is_killed_and_its_end_recorded() {
    let app =
        toolexec_tests::app::spawn_app_with(|c| c.limits.terminal_idle_timeout_ms = 1500).await;
    let sid = session(&app, json!({})).await;
    let arg = sleep_arg(410);
    let r = app
        .call(
            &sid,
            "idle-1",
            "exec_command",
            json!({"cmd": format!("sleep {arg}"), "yield_time_ms": 250}),
        )
        .await;
    let id = running_id(&r);
    assert!(
        wait_for_sleep(&arg).await.is_some(),
        "the program never ran"
    );
    let left = toolexec_tests::procs::wait_gone(
        &format!("sleep {arg}"),
        std::time::Duration::from_secs(15),
    )
    .await;
    assert!(left.is_empty(), "an idle terminal was not killed: {left:?}");
    let r = app
        .call(
            &sid,
            "idle-2",
            "write_stdin",
            json!({"session_id": id, "chars": "", "yield_time_ms": 250}),
        )
        .await;
    assert!(content(&r).contains("Process exited"), "{r}");
    let events = app.events(&sid).await;
    let exited = events
        .iter()
        .find(|e| e["kind"] == "terminal.exited" && e["data"]["terminal_id"] == id)
        .unwrap_or_else(|| panic!("no terminal.exited for {id}: {events:?}"));
    let why = exited["data"]["killed_by"].as_str().unwrap_or_default();
    assert!(
        why.contains("idle") && why.contains("limits.terminal_idle_timeout_ms"),
        "{exited}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deterministic_repl_and_shell_session_replays_with_no_divergence() {
    let app = spawn_app().await;
    let sid = session(&app, json!({})).await;
    bash(
        &app,
        &sid,
        "r1",
        json!({"command": "mkdir -p w && cd w && export N=7"}),
    )
    .await;
    let r = app
        .call(
            &sid,
            "r2",
            "exec_command",
            json!({"cmd": "cat", "tty": true, "yield_time_ms": 500}),
        )
        .await;
    let id = running_id(&r);
    for (i, chars) in ["one\n", "two\n", "\u{4}"].iter().enumerate() {
        app.call(
            &sid,
            &format!("r3{i}"),
            "write_stdin",
            json!({"session_id": id, "chars": chars, "yield_time_ms": 1000}),
        )
        .await;
    }
    let r = bash(&app, &sid, "r4", json!({"command": "echo $N > n.txt; pwd"})).await;
    assert_eq!(content(&r), "/workspace/w\n", "{r}");
    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/replay"),
            &json!({"mode": "verify"}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let replay: Value = resp.json().await.unwrap();
    assert_eq!(replay["status"], "finished", "{replay}");
    assert_eq!(replay["calls_replayed"], 6, "{replay:#}");
    assert_eq!(replay["calls_diverged"], 0, "{replay:#}");
    // A terminal call whose output differs is a divergence like any other.
    let sid2 = session(&app, json!({})).await;
    app.call(
        &sid2,
        "x1",
        "exec_command",
        json!({"cmd": "head -c 8 /dev/urandom | od -An -tx1"}),
    )
    .await;
    let resp = app
        .post(
            &format!("/v1/sessions/{sid2}/replay"),
            &json!({"mode": "verify"}),
        )
        .await;
    let replay: Value = resp.json().await.unwrap();
    assert_eq!(replay["calls_diverged"], 1, "{replay:#}");
}

// ---------------------------------------------------------------- hostile cases (part 8)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiocsti_is_refused_and_raw_mode_without_echo_leaves_the_terminal_usable() {
    let app = spawn_app().await;
    let sid = session(&app, json!({})).await;
    let r = app
        .call(
            &sid,
            "h1",
            "exec_command",
            json!({"cmd": "python3 -c \"import fcntl, termios\ntry:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x')\n    print('INJECTED')\nexcept OSError as e:\n    print('refused', e.errno)\"", "tty": true, "yield_time_ms": 5000}),
        )
        .await;
    let (_, output) = block(&r);
    assert!(output.contains("refused"), "{r}");
    assert!(!output.contains("INJECTED"), "{r}");
    // A shell that turns echo off and the terminal raw: input still reaches it, output comes
    // back, and it ends cleanly.
    let r = app
        .call(
            &sid,
            "h2",
            "exec_command",
            json!({"cmd": "stty -echo raw; printf 'ready\\n'; read -r -n 5 line; printf 'got[%s]\\n' \"$line\"; stty sane", "tty": true, "yield_time_ms": 1000}),
        )
        .await;
    let id = running_id(&r);
    assert!(block(&r).1.contains("ready"), "{r}");
    let r = app
        .call(
            &sid,
            "h3",
            "write_stdin",
            json!({"session_id": id, "chars": "hello", "yield_time_ms": 2000}),
        )
        .await;
    let (head, output) = block(&r);
    assert!(output.contains("got[hello]"), "{r}");
    assert!(!output.contains("hellogot"), "echoed in raw mode: {r}");
    assert!(
        head.contains(&"Process exited with code 0".to_owned()),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_of_terminal_output_keeps_its_head_and_tail_and_counts_the_rest() {
    let app = spawn_app().await;
    let sid = session(&app, json!({})).await;
    let t0 = std::time::Instant::now();
    let r = app
        .call(
            &sid,
            "g1",
            "exec_command",
            json!({"cmd": "echo FIRST; head -c 1000000000 /dev/zero | tr '\\0' x; echo; echo LAST", "yield_time_ms": 30000}),
        )
        .await;
    let mut r = r;
    let mut polls = 0;
    while content(&r).contains("Process running") && polls < 6 {
        let id = running_id(&r);
        r = app
            .call(
                &sid,
                &format!("g2{polls}"),
                "write_stdin",
                json!({"session_id": id, "yield_time_ms": 30000}),
            )
            .await;
        polls += 1;
    }
    let text = content(&r);
    assert!(
        text.contains("Process exited with code 0"),
        "{}",
        &text[..300.min(text.len())]
    );
    assert!(
        text.contains("bytes of output were dropped"),
        "{}",
        &text[..300]
    );
    assert!(
        text.trim_end().ends_with("LAST"),
        "{}",
        &text[text.len() - 200..]
    );
    assert!(text.len() < 60_000, "{}", text.len());
    eprintln!("1 GB through a terminal: {:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_in_a_terminal_stays_in_its_session() {
    let app = spawn_app().await;
    let sid = session(&app, json!({})).await;
    let r = app
        .call(
            &sid,
            "b1",
            "exec_command",
            json!({"cmd": "bomb() { bomb | bomb & }; bomb; sleep 3; echo survived", "tty": true, "yield_time_ms": 2000}),
        )
        .await;
    assert!(r["status"] == "ok" || r["status"] == "error", "{r}");
    // Another session is not starved of processes.
    let other = session(&app, json!({})).await;
    let r = bash(&app, &other, "o1", json!({"command": "echo fine"})).await;
    assert_eq!(content(&r), "fine\n", "{r}");
    let t0 = std::time::Instant::now();
    let closed = app.delete(&format!("/v1/sessions/{sid}")).await;
    assert!(closed.status().is_success());
    assert!(t0.elapsed().as_secs() < 15, "{:?}", t0.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_ends_the_terminals_and_the_shell_and_says_so() {
    let app = spawn_app().await;
    let sid = session(&app, json!({})).await;
    bash(
        &app,
        &sid,
        "w1",
        json!({"command": "export R=1; echo x > x.txt"}),
    )
    .await;
    let r = app
        .call(
            &sid,
            "w2",
            "exec_command",
            json!({"cmd": "cat", "tty": true, "yield_time_ms": 250}),
        )
        .await;
    let id = running_id(&r);
    let resp = app
        .post(&format!("/v1/sessions/{sid}/rewind"), &json!({"to_seq": 2}))
        .await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let events = app.events(&sid).await;
    assert!(
        events.iter().any(|e| e["kind"] == "terminal.exited"
            && e["data"]["terminal_id"] == id
            && e["data"]["killed_by"] == "the workspace was rewound"),
        "{events:?}"
    );
    let r = app
        .call(
            &sid,
            "w3",
            "write_stdin",
            json!({"session_id": id, "chars": "x"}),
        )
        .await;
    assert_eq!(
        content(&r),
        format!("write_stdin failed: Unknown process id {id}")
    );
    let r = bash(&app, &sid, "w4", json!({"command": "echo \"[$R]\"; ls"})).await;
    assert!(
        content(&r)
            .starts_with("[the shell was restarted, state was lost: the workspace was rewound."),
        "{r}"
    );
    assert!(content(&r).ends_with("[]\n"), "{r}");
}

/// Host PTYs in use (the kernel's count, every devpts instance of the host's included).
fn host_ptys() -> (u64, usize) {
    let nr = std::fs::read_to_string("/proc/sys/kernel/pty/nr")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(u64::MAX);
    let listed = std::fs::read_dir("/dev/pts")
        .map(|d| d.count())
        .unwrap_or(0);
    (nr, listed)
}

/// A `tty: true` terminal's PTY is made inside the sandbox, from a devpts instance of its own:
/// `tty` names it, `/dev/pts` lists only the session's terminals, the host's `/dev/pts` does
/// not change while they are open, and pushing input into it is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminals_pty_comes_from_the_sandboxs_own_devpts() {
    let app = spawn_app().await;
    let sid = session(&app, json!({})).await;
    let (_, host_listed_before) = host_ptys();
    let r = app
        .call(
            &sid,
            "p1",
            "exec_command",
            json!({"cmd": "cat", "tty": true, "yield_time_ms": 250}),
        )
        .await;
    let first = running_id(&r);
    let r = app
        .call(
            &sid,
            "p2",
            "exec_command",
            json!({"cmd": "tty; ls /dev/pts | sort | tr '\\n' ' '; echo; ls -l /dev/ptmx; stat -c '%t:%T' /dev/pts/ptmx; echo x > /dev/tty && echo tty-ok", "tty": true, "yield_time_ms": 5000}),
        )
        .await;
    let (head, output) = block(&r);
    assert!(
        head.contains(&"Process exited with code 0".to_owned()),
        "{r}"
    );
    let lines: Vec<&str> = output.lines().map(str::trim_end).collect();
    // The second terminal of the sandbox: /dev/pts/1, its instance's numbering.
    assert_eq!(lines[0], "/dev/pts/1", "{r}");
    // Only this session's two terminals and the instance's ptmx.
    assert_eq!(lines[1].trim(), "0 1 ptmx", "{r}");
    assert!(lines[2].ends_with("/dev/ptmx -> pts/ptmx"), "{r}");
    assert_eq!(lines[3], "5:2", "{r}");
    assert!(output.contains("tty-ok"), "{r}");
    // The host's devpts: untouched while terminals are open.
    let (_, host_listed_open) = host_ptys();
    assert_eq!(
        host_listed_open, host_listed_before,
        "host /dev/pts changed"
    );
    // A second session's sandbox has its own instance: its first terminal is /dev/pts/0 again.
    let other = session(&app, json!({})).await;
    let r = app
        .call(
            &other,
            "o1",
            "exec_command",
            json!({"cmd": "tty; ls /dev/pts | tr '\\n' ' '", "tty": true, "yield_time_ms": 5000}),
        )
        .await;
    let (_, output) = block(&r);
    assert!(output.starts_with("/dev/pts/0\n"), "{r}");
    assert_eq!(output.lines().nth(1).map(str::trim), Some("0 ptmx"), "{r}");
    // Without a terminal, /dev/tty is no way to one.
    let r = app
        .call(
            &other,
            "o2",
            "exec_command",
            json!({"cmd": "echo x > /dev/tty || echo no-tty", "yield_time_ms": 5000}),
        )
        .await;
    assert!(block(&r).1.contains("no-tty"), "{r}");
    // TIOCSTI into the sandbox's own terminal: refused.
    let r = app
        .call(
            &sid,
            "p3",
            "exec_command",
            json!({"cmd": "python3 -c \"import fcntl, termios\ntry:\n    fcntl.ioctl(0, termios.TIOCSTI, b'x')\n    print('INJECTED')\nexcept OSError as e:\n    print('refused', e.errno)\"", "tty": true, "yield_time_ms": 5000}),
        )
        .await;
    let (_, output) = block(&r);
    assert!(
        output.contains("refused") && !output.contains("INJECTED"),
        "{r}"
    );
    // The first terminal still echoes what it is sent.
    let r = app
        .call(
            &sid,
            "p4",
            "write_stdin",
            json!({"session_id": first, "chars": "ping\n", "yield_time_ms": 1000}),
        )
        .await;
    assert!(block(&r).1.contains("ping"), "{r}");
    let closed = app.delete(&format!("/v1/sessions/{sid}")).await;
    assert!(closed.status().is_success());
}

/// Uses a new session so that the (single) cached runtime of another one is dropped.
async fn evict_other(app: &TestApp, n: usize) {
    let before = app.metric("toolexec_session_runtimes_evicted_total").await;
    let other = session(app, json!({})).await;
    let r = app
        .call(
            &other,
            &format!("o{n}"),
            "write_file",
            json!({"file_path": "o.txt", "content": "o\n"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(
        app.metric("toolexec_session_runtimes_evicted_total").await > before,
        "the session's runtime was not dropped"
    );
}

/// The persistent shell lives in the session's runtime on one node: when that runtime is
/// dropped (evicted from memory here; a restart and a take-over rebuild it the same way), the
/// next `bash` call runs in a fresh shell and says that the state was lost — but not the
/// session's first call, nor one after `restart: true`, nor in a session that never ran bash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_lost_with_its_runtime_is_said_by_the_next_call() {
    // One cached runtime: using another session drops the first one's.
    shell_lost_with_its_runtime(spawn_app_with(|c| c.limits.max_cached_sessions = 1).await).await;
}

/// The same on the embedded SQLite store (its own query of the session's last `bash` call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_lost_with_its_runtime_is_said_by_the_next_call_on_sqlite() {
    shell_lost_with_its_runtime(spawn_sqlite_app_with(|c| c.limits.max_cached_sessions = 1).await)
        .await;
}

async fn shell_lost_with_its_runtime(app: TestApp) {
    let sid = session(&app, json!({"files": {"sub/a.txt": "x"}})).await;
    // The session's first call: no notice.
    let r = bash(
        &app,
        &sid,
        "s1",
        json!({"command": "cd sub && export KEEP=1 && pwd"}),
    )
    .await;
    assert_eq!(content(&r), "/workspace/sub\n", "{r}");
    evict_other(&app, 1).await;
    let r = bash(
        &app,
        &sid,
        "s2",
        json!({"command": "pwd; echo \"[$KEEP]\""}),
    )
    .await;
    let text = content(&r);
    assert!(
        text.starts_with(
            "[the shell was restarted, state was lost: the session's runtime was rebuilt"
        ),
        "{r}"
    );
    assert!(
        text.contains("exports, functions and aliases are back to their defaults"),
        "{r}"
    );
    assert!(text.ends_with("/workspace\n[]\n"), "{r}");
    // Said once: the next call in the same shell is plain.
    let r = bash(
        &app,
        &sid,
        "s3",
        json!({"command": "export KEEP=2; echo same"}),
    )
    .await;
    assert_eq!(content(&r), "same\n", "{r}");
    // An explicit restart after the loss: no notice (the model asked for a fresh shell).
    evict_other(&app, 2).await;
    let r = bash(
        &app,
        &sid,
        "s4",
        json!({"command": "echo \"[$KEEP]\"", "restart": true}),
    )
    .await;
    assert_eq!(content(&r), "[]\n", "{r}");
    // A session whose runtime is rebuilt before it ever ran bash: its first call is plain.
    let fresh = session(&app, json!({})).await;
    evict_other(&app, 3).await;
    let r = bash(&app, &fresh, "f1", json!({"command": "echo first"})).await;
    assert_eq!(content(&r), "first\n", "{r}");
    // A session whose only `bash` call was refused before it ran (its arguments invalid, its
    // command given) never had a shell: after its runtime is rebuilt, its next call is plain.
    let refused = session(&app, json!({})).await;
    let r = bash(
        &app,
        &refused,
        "r1",
        json!({"command": "export KEEP=3", "restart": "yes"}),
    )
    .await;
    assert_eq!(r["status"], "invalid_arguments", "{r}");
    evict_other(&app, 4).await;
    let r = bash(&app, &refused, "r2", json!({"command": "echo plain"})).await;
    assert_eq!(content(&r), "plain\n", "{r}");
    // A restart of the service: the same notice.
    let app = app.restart().await;
    let r = bash(&app, &sid, "s5", json!({"command": "echo after-restart"})).await;
    assert!(
        content(&r).starts_with(
            "[the shell was restarted, state was lost: the session's runtime was rebuilt"
        ),
        "{r}"
    );
    assert!(content(&r).ends_with("after-restart\n"), "{r}");
}
