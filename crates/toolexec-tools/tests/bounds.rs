//! What bounds one call (issue 9): patterns too costly to compile are refused, walks stop at
//! their entry limit and at the deadline with a partial result that says how to narrow it,
//! mutating tools change nothing once the deadline has passed, and a tool that cannot stop is
//! abandoned — unless its change is under way, which is waited for.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build hostile layouts and check results on the host, outside the jail"
)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail the test loudly"
)]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::Session;
use serde_json::{Value, json};
use toolexec_core::{CallStatus, OutputLimit, ToolSpec, TruncationMode, sha256_hex};
use toolexec_tools::{Deadline, Tool, ToolContext, ToolOutput, run_within_deadline};

/// A deadline that has already passed.
fn past() -> Deadline {
    Deadline::after(Duration::ZERO)
}

/// Runs a tool without the schema check (as a model could only do through a bug), to reach
/// the tool's own limits.
async fn run_raw(s: &Session, name: &str, args: Value) -> ToolOutput {
    s.registry.get(name).unwrap().run(&s.ctx, args).await
}

#[tokio::test]
async fn a_pathological_regex_is_refused_fast_as_invalid_arguments() {
    let s = Session::new();
    s.file("big.txt", "a".repeat(1024 * 1024));
    let t0 = Instant::now();
    let out = s.call("grep", json!({"pattern": "a{1000}{1000}"})).await;
    let took = t0.elapsed();
    assert_eq!(out.status, CallStatus::InvalidArguments, "{}", out.content);
    assert!(out.content.contains("too complex"), "{}", out.content);
    assert!(
        out.content.contains("Simplify the pattern"),
        "{}",
        out.content
    );
    // Refused at compile time: milliseconds on a quiet machine; the bound leaves room for a
    // loaded one (a search that ran would take the tool's time limit, a minute).
    assert!(took < Duration::from_secs(5), "refused in {took:?}");
}

#[tokio::test]
async fn a_pattern_longer_than_the_limit_is_refused_by_the_schema_with_a_short_message() {
    let s = Session::new();
    for (tool, field) in [
        ("grep", "pattern"),
        ("grep", "glob_filter"),
        ("glob", "pattern"),
    ] {
        let mut args = json!({"pattern": "x"});
        args[field] = json!("a".repeat(100_000));
        let err = s.registry.validate(tool, &args).unwrap().unwrap_err();
        assert_eq!(err.rule, "maxLength", "{tool} {field}");
        assert_eq!(err.pointer, format!("/{field}"));
        let text = err.to_model_text(tool);
        assert!(text.len() < 1000, "{tool} {field}: {} bytes", text.len());
        assert!(text.contains("is longer than 4096 characters"), "{text}");
    }
}

#[tokio::test]
async fn a_glob_too_big_to_compile_is_refused_instead_of_panicking() {
    let s = Session::new();
    s.file("a.rs", "fn a() {}\n");
    // Within the body limit, past what the schema allows, and compiled over the regex size
    // limit: `compile_matcher` panics on it.
    let huge = "{a,b}".repeat(200_000);
    let out = run_raw(&s, "glob", json!({"pattern": huge})).await;
    assert_eq!(
        out.status,
        CallStatus::InvalidArguments,
        "{:.300}",
        out.content
    );
    assert!(out.content.contains("too complex"), "{:.300}", out.content);
    let out = run_raw(&s, "grep", json!({"pattern": "fn", "glob_filter": huge})).await;
    assert_eq!(
        out.status,
        CallStatus::InvalidArguments,
        "{:.300}",
        out.content
    );
}

/// `dirs` directories of `per_dir` files each, every file holding `needle`.
fn wide_tree(s: &Session, dirs: usize, per_dir: usize) {
    for d in 0..dirs {
        for f in 0..per_dir {
            s.file(&format!("d{d:02}/f{f:04}.txt"), "needle\n");
        }
    }
}

#[tokio::test]
async fn walks_stop_at_the_entry_limit_and_say_the_result_is_partial() {
    let mut s = Session::new();
    wide_tree(&s, 4, 200);
    s.ctx.max_walk_entries = 300;

    let grep = s
        .call("grep", json!({"pattern": "needle", "max_results": 1000}))
        .await;
    assert_eq!(grep.status, CallStatus::Ok, "{}", grep.content);
    assert!(
        grep.content
            .contains("stopped after reading 300 directory entries")
            && grep.content.contains("results are partial")
            && grep.content.contains("`glob_filter`"),
        "{}",
        grep.content
    );
    let shown = grep.content.lines().filter(|l| l.contains(":1:")).count();
    assert!((290..300).contains(&shown), "{shown} lines shown");

    let glob = s.call("glob", json!({"pattern": "**/*.txt"})).await;
    assert_eq!(glob.status, CallStatus::Ok);
    assert!(
        glob.content
            .contains("stopped after reading 300 directory entries")
            && glob.content.contains("narrower `path`"),
        "{}",
        glob.content
    );

    let list = s.call("list_dir", json!({"path": ".", "depth": 2})).await;
    assert_eq!(list.status, CallStatus::Ok);
    assert!(
        list.content.contains("listing stopped after reading")
            && list.content.contains("List a subdirectory"),
        "{}",
        list.content
    );
}

#[tokio::test]
async fn a_directory_of_many_entries_is_read_only_as_far_as_the_limit() {
    let mut s = Session::new();
    wide_tree(&s, 1, 2000);
    s.ctx.max_walk_entries = 50;
    let glob = s.call("glob", json!({"pattern": "**/*"})).await;
    let listed = glob
        .content
        .lines()
        .filter(|l| l.starts_with("d00/"))
        .count();
    assert_eq!(listed, 49, "{}", glob.content);
    assert!(
        glob.content.contains("stopped after reading 50"),
        "{}",
        glob.content
    );
}

#[tokio::test]
async fn list_dir_looks_only_two_entries_into_directories_it_does_not_expand() {
    let mut s = Session::new();
    wide_tree(&s, 3, 500);
    // 3 entries at the top and at most 2 under each: within 10, so nothing is cut.
    s.ctx.max_walk_entries = 10;
    let list = s.call("list_dir", json!({"path": "."})).await;
    assert_eq!(list.status, CallStatus::Ok);
    assert!(
        list.content.starts_with("./\n  d00/\n  d01/\n  d02/\n"),
        "{}",
        list.content
    );
    assert!(!list.content.contains("stopped"), "{}", list.content);
    assert!(
        list.content.contains("deeper than depth 1"),
        "{}",
        list.content
    );
}

#[tokio::test]
async fn walks_at_their_deadline_are_timed_out_with_what_they_found() {
    let mut s = Session::new();
    wide_tree(&s, 2, 50);
    s.ctx.deadline = past();
    for (tool, args) in [
        ("grep", json!({"pattern": "needle"})),
        ("glob", json!({"pattern": "**/*.txt"})),
        ("list_dir", json!({"path": ".", "depth": 3})),
    ] {
        let out = s.call(tool, args).await;
        assert_eq!(out.status, CallStatus::TimedOut, "{tool}: {}", out.content);
        assert!(
            out.content.contains("stopped at the time limit") && out.content.contains("partial"),
            "{tool}: {}",
            out.content
        );
    }
}

#[tokio::test]
async fn a_search_inside_one_big_file_stops_at_the_deadline_and_keeps_its_matches() {
    let mut s = Session::new();
    // A match on the first line, then 8 MiB of text with non-ASCII letters, where a Unicode
    // word boundary sends the regex engine to its slow path (6.4 s in a debug build).
    let mut text = String::from("abcdefghijklmnopqrst is a long word\n");
    while text.len() < 8 * 1024 * 1024 {
        text.push_str("thé quick brown fox jumps över the lazy dog, again and again\n");
    }
    s.file("big.txt", &text);
    // Room to compile the pattern and search the first chunks, even on a busy machine.
    s.ctx.deadline = Deadline::after(Duration::from_secs(1));
    let t0 = Instant::now();
    let out = s
        .call("grep", json!({"pattern": r"\b\w{20}\b", "path": "big.txt"}))
        .await;
    let took = t0.elapsed();
    assert_eq!(out.status, CallStatus::TimedOut, "{}", out.content);
    assert!(
        out.content.starts_with("big.txt:1:abcdefghijklmnopqrst"),
        "{}",
        out.content
    );
    assert!(
        out.content.contains("results are partial"),
        "{}",
        out.content
    );
    assert!(took < Duration::from_secs(3), "stopped after {took:?}");
}

#[tokio::test]
async fn read_many_files_at_its_deadline_says_which_files_were_not_read() {
    let mut s = Session::new();
    s.file("a.txt", "alpha\n");
    s.file("b.txt", "beta\n");
    s.ctx.deadline = past();
    let out = s
        .call("read_many_files", json!({"paths": ["a.txt", "b.txt"]}))
        .await;
    assert_eq!(out.status, CallStatus::TimedOut, "{}", out.content);
    assert!(
        out.content.contains("2 files not read: a.txt, b.txt"),
        "{}",
        out.content
    );
    assert!(!out.content.contains("alpha"), "{}", out.content);
}

#[tokio::test]
async fn no_mutating_tool_changes_anything_once_the_deadline_has_passed() {
    let mut s = Session::new();
    s.file("a.txt", "one\n");
    s.ctx.reads.record("a.txt", &sha256_hex(b"one\n"));
    s.ctx.deadline = past();
    let cases = [
        (
            "write_file",
            json!({"file_path": "a.txt", "content": "two\n"}),
        ),
        (
            "write_file",
            json!({"file_path": "new.txt", "content": "two\n"}),
        ),
        (
            "edit_file",
            json!({"file_path": "a.txt", "old_string": "one", "new_string": "two"}),
        ),
        (
            "apply_patch",
            json!({"patch": "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+two\n*** End Patch"}),
        ),
        ("file_copy", json!({"source": "a.txt", "dest": "copy.txt"})),
        ("file_delete", json!({"path": "a.txt"})),
    ];
    for (tool, args) in cases {
        let out = s.call(tool, args).await;
        assert_eq!(out.status, CallStatus::TimedOut, "{tool}: {}", out.content);
        assert!(
            out.content.contains("nothing was changed"),
            "{tool}: {}",
            out.content
        );
        assert!(out.changes.is_empty(), "{tool}");
        assert_eq!(s.read("a.txt"), b"one\n", "{tool}");
        assert!(!s.root.join("new.txt").exists(), "{tool}");
        assert!(!s.root.join("copy.txt").exists(), "{tool}");
    }
}

#[tokio::test]
async fn a_patch_whose_hunk_search_outlasts_the_deadline_is_timed_out_and_changes_nothing() {
    let mut s = Session::new();
    let file = "a\n".repeat(40_000);
    s.file("a.txt", &file);
    s.ctx.reads.record("a.txt", &sha256_hex(file.as_bytes()));
    // 20,000 context lines that match everywhere but at their end: (file × hunk) comparisons.
    let mut patch = String::from("*** Begin Patch\n*** Update File: a.txt\n@@\n");
    patch.push_str(&" a\n".repeat(20_000));
    patch.push_str("-b\n+c\n*** End Patch");
    s.ctx.deadline = Deadline::after(Duration::from_millis(200));
    let t0 = Instant::now();
    let out = s.call("apply_patch", json!({"patch": patch})).await;
    let took = t0.elapsed();
    assert_eq!(out.status, CallStatus::TimedOut, "{:.500}", out.content);
    assert!(
        out.content.contains("nothing was changed"),
        "{}",
        out.content
    );
    assert_eq!(s.read("a.txt"), file.as_bytes());
    assert!(took < Duration::from_secs(2), "stopped after {took:?}");
}

#[tokio::test]
async fn edit_files_near_match_hint_is_bounded_in_time() {
    let s = Session::new();
    let file = "a\n".repeat(60_000);
    s.file("a.txt", &file);
    s.ctx.reads.record("a.txt", &sha256_hex(file.as_bytes()));
    let old = format!("{}b", "a\n".repeat(30_000));
    let t0 = Instant::now();
    let out = s
        .call(
            "edit_file",
            json!({"file_path": "a.txt", "old_string": old, "new_string": "c"}),
        )
        .await;
    let took = t0.elapsed();
    assert_eq!(out.status, CallStatus::Error, "{:.300}", out.content);
    assert!(out.content.contains("not found"), "{:.300}", out.content);
    assert!(took < Duration::from_secs(3), "answered after {took:?}");
}

#[tokio::test]
async fn only_the_first_thousand_rules_of_a_gitignore_apply_and_the_model_is_told() {
    let s = Session::new();
    let mut rules: String = (0..1000).map(|i| format!("build{i}/**/*.o\n")).collect();
    rules.push_str("secret.txt\n");
    s.file(".gitignore", &rules);
    s.file("secret.txt", "token\n");
    let t0 = Instant::now();
    let out = s.call("grep", json!({"pattern": "nomatch"})).await;
    assert!(
        out.content
            .contains("Only the first 1000 rules of .gitignore were applied"),
        "{}",
        out.content
    );
    let found = s.call("grep", json!({"pattern": "token"})).await;
    assert!(
        found.content.starts_with("secret.txt:1:token"),
        "{}",
        found.content
    );
    assert!(t0.elapsed() < Duration::from_secs(30));
}

/// A tool that blocks a thread for `sleep` without looking at the clock, optionally after
/// committing its change.
struct Stuck {
    spec: ToolSpec,
    sleep: Duration,
    commits: bool,
}

impl Stuck {
    fn new(sleep: Duration, commits: bool) -> Self {
        Self {
            spec: ToolSpec {
                name: "stuck".into(),
                description: String::new(),
                input_schema: json!({"type": "object"}),
                read_only: !commits,
                capabilities: Vec::new(),
                output_limit: OutputLimit::new(1000, TruncationMode::Tail),
            },
            sleep,
            commits,
        }
    }
}

#[async_trait]
impl Tool for Stuck {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, _args: Value) -> ToolOutput {
        if self.commits && !ctx.deadline.commit_change() {
            return ToolOutput::timed_out("too late");
        }
        let sleep = self.sleep;
        tokio::task::spawn_blocking(move || std::thread::sleep(sleep))
            .await
            .unwrap();
        ToolOutput::ok("done")
    }
}

#[tokio::test]
async fn a_tool_that_cannot_stop_is_abandoned_a_grace_period_after_its_deadline() {
    let mut s = Session::new();
    s.ctx.deadline = Deadline::after(Duration::from_millis(100));
    let tool = Arc::new(Stuck::new(Duration::from_secs(3), false));
    let t0 = Instant::now();
    let out = run_within_deadline(tool.as_ref(), &s.ctx, json!({})).await;
    let took = t0.elapsed();
    assert_eq!(out.status, CallStatus::TimedOut, "{}", out.content);
    assert!(
        out.content
            .contains("stuck did not finish within its time limit of 100 ms"),
        "{}",
        out.content
    );
    assert!(
        took >= Duration::from_millis(1100) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_change_under_way_at_the_deadline_is_waited_for() {
    let mut s = Session::new();
    s.ctx.deadline = Deadline::after(Duration::from_millis(50));
    let tool = Arc::new(Stuck::new(Duration::from_millis(1500), true));
    let out = run_within_deadline(tool.as_ref(), &s.ctx, json!({})).await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert_eq!(out.content, "done");
}

#[tokio::test]
async fn a_cancelled_tool_that_changed_nothing_yet_is_abandoned_at_once() {
    let mut s = Session::new();
    s.ctx.deadline = Deadline::after(Duration::from_secs(60));
    let tool = Arc::new(Stuck::new(Duration::from_secs(3), false));
    let cancel = s.ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    });
    let t0 = Instant::now();
    let out = run_within_deadline(tool.as_ref(), &s.ctx, json!({})).await;
    assert_eq!(out.status, CallStatus::Cancelled, "{}", out.content);
    assert!(
        out.content.contains("stuck was cancelled"),
        "{}",
        out.content
    );
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    // The tool, when it wakes, must not change anything.
    assert!(!s.ctx.deadline.commit_change());
}

#[tokio::test]
async fn a_cancelled_tool_whose_change_is_under_way_keeps_its_real_result() {
    let mut s = Session::new();
    s.ctx.deadline = Deadline::after(Duration::from_secs(60));
    let tool = Arc::new(Stuck::new(Duration::from_millis(800), true));
    let cancel = s.ctx.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    });
    let t0 = Instant::now();
    let out = run_within_deadline(tool.as_ref(), &s.ctx, json!({})).await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert_eq!(out.content, "done");
    assert!(
        t0.elapsed() >= Duration::from_millis(800),
        "{:?}",
        t0.elapsed()
    );
}
