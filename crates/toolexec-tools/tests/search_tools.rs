//! grep and glob as a caller uses them: exclusions, .gitignore, caps, read-recording, symlinks.
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

use std::time::{Duration, SystemTime};

use common::Session;
use serde_json::json;
use toolexec_core::{CallStatus, sha256_hex};
use toolexec_tools::reads::WriteCheck;

fn lines(content: &str) -> Vec<&str> {
    content.lines().take_while(|l| !l.is_empty()).collect()
}

#[tokio::test]
async fn grep_returns_path_line_content_sorted_by_path_then_line() {
    let s = Session::new();
    s.file("src/b.rs", "fn b() {}\n// call a()\nfn helper() {}\n");
    s.file("src/a.rs", "fn a() {}\n");
    s.file("README.md", "no functions here\n");
    let out = s.call("grep", json!({"pattern": r"fn \w+\(\)"})).await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert_eq!(
        lines(&out.content),
        [
            "src/a.rs:1:fn a() {}",
            "src/b.rs:1:fn b() {}",
            "src/b.rs:3:fn helper() {}"
        ]
    );
}

#[tokio::test]
async fn grep_skips_dependency_directories_unless_asked_by_path() {
    let s = Session::new();
    s.file("src/main.js", "require('left-pad')\n");
    s.file(
        "node_modules/left-pad/index.js",
        "module.exports = 'left-pad'\n",
    );
    s.file("target/debug/build.log", "left-pad\n");
    s.file(".git/config", "left-pad\n");
    let out = s.call("grep", json!({"pattern": "left-pad"})).await;
    assert_eq!(lines(&out.content), ["src/main.js:1:require('left-pad')"]);

    let inside = s
        .call(
            "grep",
            json!({"pattern": "left-pad", "path": "node_modules"}),
        )
        .await;
    assert_eq!(
        lines(&inside.content),
        ["node_modules/left-pad/index.js:1:module.exports = 'left-pad'"]
    );
}

#[tokio::test]
async fn grep_respects_gitignore_and_says_so_when_nothing_matched() {
    let s = Session::new();
    s.file(".gitignore", "generated/\n*.snap\n");
    s.file("generated/api.rs", "SECRET_NAME\n");
    s.file("tests/x.snap", "SECRET_NAME\n");
    s.file("src/lib.rs", "nothing\n");
    let out = s.call("grep", json!({"pattern": "SECRET_NAME"})).await;
    assert_eq!(out.status, CallStatus::Ok);
    assert!(
        out.content.starts_with("No matches for \"SECRET_NAME\""),
        "{}",
        out.content
    );
    assert!(
        out.content.contains("2 paths were ignored by .gitignore"),
        "{}",
        out.content
    );
}

#[tokio::test]
async fn grep_is_capped_at_max_results_with_a_note() {
    let s = Session::new();
    let text: String = (1..=30).map(|n| format!("match {n}\n")).collect();
    s.file("many.txt", &text);
    let out = s
        .call("grep", json!({"pattern": "match", "max_results": 5}))
        .await;
    assert_eq!(lines(&out.content).len(), 5);
    assert_eq!(lines(&out.content)[4], "many.txt:5:match 5");
    assert!(
        out.content
            .contains("Showing the first 5 matching lines; there are more"),
        "{}",
        out.content
    );
}

#[tokio::test]
async fn grep_filters_by_glob_and_ignores_case_when_asked() {
    let s = Session::new();
    s.file("a.rs", "Hello\n");
    s.file("b.py", "hello\n");
    s.file("sub/c.rs", "HELLO\n");
    let out = s
        .call(
            "grep",
            json!({"pattern": "hello", "case_insensitive": true, "glob_filter": "*.rs"}),
        )
        .await;
    assert_eq!(lines(&out.content), ["a.rs:1:Hello", "sub/c.rs:1:HELLO"]);
    let by_path = s
        .call(
            "grep",
            json!({"pattern": "(?i)hello", "glob_filter": "sub/*.rs"}),
        )
        .await;
    assert_eq!(lines(&by_path.content), ["sub/c.rs:1:HELLO"]);
}

#[tokio::test]
async fn files_grep_showed_count_as_read_and_can_be_edited() {
    let s = Session::new();
    s.file("hit.txt", "needle\nhay\n");
    s.file("miss.txt", "hay\n");
    s.call("grep", json!({"pattern": "needle"})).await;
    assert_eq!(
        s.ctx.reads.check("hit.txt", &sha256_hex(b"needle\nhay\n")),
        WriteCheck::Allowed
    );
    assert_eq!(
        s.ctx.reads.check("miss.txt", &sha256_hex(b"hay\n")),
        WriteCheck::NeverRead
    );
    let edit = s
        .call(
            "edit_file",
            json!({"file_path": "hit.txt", "old_string": "needle", "new_string": "pin"}),
        )
        .await;
    assert_eq!(edit.status, CallStatus::Ok, "{}", edit.content);
}

#[tokio::test]
async fn grep_skips_binary_files_and_does_not_follow_symlinks() {
    let s = Session::new();
    s.file("blob.bin", b"needle\0\x01\x02");
    s.file("real/f.txt", "needle\n");
    std::os::unix::fs::symlink("real", s.root.join("alias")).unwrap();
    std::os::unix::fs::symlink("real/f.txt", s.root.join("f-link.txt")).unwrap();
    let outside = s.root.parent().unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "needle outside\n").unwrap();
    std::os::unix::fs::symlink(&outside, s.root.join("escape")).unwrap();
    let out = s.call("grep", json!({"pattern": "needle"})).await;
    assert_eq!(lines(&out.content), ["real/f.txt:1:needle"]);
    assert!(!out.content.contains("outside"), "{}", out.content);
}

#[tokio::test]
async fn grep_searches_one_file_given_as_path() {
    let s = Session::new();
    s.file("target/out.log", "error: one\nok\nerror: two\n");
    let out = s
        .call(
            "grep",
            json!({"pattern": "^error", "path": "target/out.log"}),
        )
        .await;
    assert_eq!(
        lines(&out.content),
        ["target/out.log:1:error: one", "target/out.log:3:error: two"]
    );
}

#[tokio::test]
async fn an_invalid_regex_is_explained() {
    let s = Session::new();
    let out = s.call("grep", json!({"pattern": "fn main("})).await;
    assert_eq!(out.status, CallStatus::InvalidArguments);
    assert!(
        out.content.starts_with("Invalid regex \"fn main(\""),
        "{}",
        out.content
    );
    assert!(
        out.content.contains("Escape special characters"),
        "{}",
        out.content
    );
}

#[tokio::test]
async fn grep_outside_the_workspace_is_denied() {
    let s = Session::new();
    let out = s
        .call("grep", json!({"pattern": "root", "path": "/etc"}))
        .await;
    assert_eq!(out.status, CallStatus::Denied);
}

fn touch(s: &Session, rel: &str, age: Duration) {
    s.file(rel, "x");
    let file = std::fs::File::options()
        .write(true)
        .open(s.root.join(rel))
        .unwrap();
    file.set_modified(SystemTime::now() - age).unwrap();
}

#[tokio::test]
async fn glob_lists_matches_newest_first() {
    let s = Session::new();
    touch(&s, "src/old.rs", Duration::from_secs(3000));
    touch(&s, "src/new.rs", Duration::from_secs(10));
    touch(&s, "src/deep/mid.rs", Duration::from_secs(500));
    touch(&s, "src/notes.md", Duration::from_secs(1));
    let out = s.call("glob", json!({"pattern": "**/*.rs"})).await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert_eq!(
        lines(&out.content),
        ["src/new.rs", "src/deep/mid.rs", "src/old.rs"]
    );
}

#[tokio::test]
async fn glob_patterns_are_relative_to_path_and_star_stays_in_one_level() {
    let s = Session::new();
    s.file("src/a.rs", "");
    s.file("src/sub/b.rs", "");
    let out = s
        .call("glob", json!({"pattern": "*.rs", "path": "src"}))
        .await;
    assert_eq!(lines(&out.content), ["src/a.rs"]);
    let none = s.call("glob", json!({"pattern": "*.rs"})).await;
    assert!(none.content.contains("\"**/*.rs\""), "{}", none.content);
}

#[tokio::test]
async fn glob_applies_the_same_exclusions_and_does_not_follow_symlinks() {
    let s = Session::new();
    s.file(".gitignore", "*.gen.ts\n");
    s.file("web/app.ts", "");
    s.file("web/api.gen.ts", "");
    s.file("node_modules/lib/index.ts", "");
    std::os::unix::fs::symlink("web", s.root.join("web-link")).unwrap();
    let out = s.call("glob", json!({"pattern": "**/*.ts"})).await;
    assert_eq!(lines(&out.content), ["web/app.ts"]);
}

#[tokio::test]
async fn glob_results_do_not_count_as_read() {
    let s = Session::new();
    s.file("a.txt", "contents");
    s.call("glob", json!({"pattern": "*.txt"})).await;
    assert_eq!(
        s.ctx.reads.check("a.txt", &sha256_hex(b"contents")),
        WriteCheck::NeverRead
    );
}

#[tokio::test]
async fn glob_is_capped_with_a_note_giving_the_total() {
    let s = Session::new();
    for n in 0..510 {
        s.file(&format!("f/{n:04}.txt"), "");
    }
    let out = s.call("glob", json!({"pattern": "f/*.txt"})).await;
    assert_eq!(lines(&out.content).len(), 500);
    assert!(
        out.content
            .contains("Showing the 500 most recently modified of 510 matching files"),
        "{}",
        &out.content[out.content.len() - 200..]
    );
}
