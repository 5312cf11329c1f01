//! Issue 3's "done when": an agent loop that only speaks HTTP renames a function across a real
//! (small) Python repository checked into `tests/fixtures/refactor-repo` — grep, read, edit,
//! patch, copy, delete, glob — and the session's event log shows every step, every refusal and
//! every file it changed.
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::{Value, json};
use toolexec_core::sha256_hex;
use toolexec_tests::app::{TestApp, spawn_app};
use toolexec_tests::fixtures::text_files;

/// `calc/ops.py` after the one `edit_file` of the refactor.
const OPS_AFTER: &str = r#""""Arithmetic on two numbers."""


def plus(a, b):
    """Return the sum of a and b."""
    return a + b


def mul(a, b):
    """Return the product of a and b."""
    return a * b
"#;

const INIT_AFTER: &str = r#""""A tiny calculator package."""
from calc.ops import mul, plus

__all__ = ["mul", "plus"]
"#;

/// `calc/cli.py` after the patch, and so `calc/__main__.py`, its copy.
const MAIN_AFTER: &str = r#""""Command line: python -m calc 2 3 prints 5."""
import sys

from calc.ops import plus


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    a, b = (int(x) for x in args)
    print(plus(a, b))


if __name__ == "__main__":
    main()
"#;

const TEST_OPS_AFTER: &str = r#"from calc.ops import mul, plus


def test_plus():
    assert plus(2, 3) == 5


def test_mul():
    assert mul(2, 3) == 6
"#;

const README_AFTER: &str = "# calc

A tiny calculator.

    >>> from calc import plus
    >>> plus(2, 3)
    5

From the shell: `python -m calc 2 3`.
";

const CHANGELOG_AFTER: &str = "# Changelog

- `calc.ops.add` is now `calc.ops.plus`.
- `python -m calc` replaces `python -m calc.cli`.
";

/// A first attempt with a wrong idea of `calc/cli.py`: its first file would apply, its second
/// does not, so nothing at all may change.
const WRONG_PATCH: &str = r#"*** Begin Patch
*** Update File: calc/__init__.py
@@
-from calc.ops import add, mul
+from calc.ops import mul, plus
 
-__all__ = ["add", "mul"]
+__all__ = ["mul", "plus"]
*** Update File: calc/cli.py
@@ def main(argv=None):
-    print(add(x, y))
+    print(plus(x, y))
*** Add File: CHANGELOG.md
+# Changelog
*** End Patch"#;

/// The call sites in three files, the docs, and a new changelog, in one step.
const CALL_SITES_PATCH: &str = r#"*** Begin Patch
*** Update File: calc/__init__.py
@@
 """A tiny calculator package."""
-from calc.ops import add, mul
+from calc.ops import mul, plus
 
-__all__ = ["add", "mul"]
+__all__ = ["mul", "plus"]
*** Update File: calc/cli.py
@@
-"""Command line: python -m calc.cli 2 3 prints 5."""
+"""Command line: python -m calc 2 3 prints 5."""
 import sys
 
-from calc.ops import add
+from calc.ops import plus
@@ def main(argv=None):
     a, b = (int(x) for x in args)
-    print(add(a, b))
+    print(plus(a, b))
*** Update File: tests/test_ops.py
@@
-from calc.ops import add, mul
+from calc.ops import mul, plus
 
 
-def test_add():
-    assert add(2, 3) == 5
+def test_plus():
+    assert plus(2, 3) == 5
*** Update File: README.md
@@
-    >>> from calc import add
-    >>> add(2, 3)
+    >>> from calc import plus
+    >>> plus(2, 3)
     5
 
-From the shell: `python -m calc.cli 2 3`.
+From the shell: `python -m calc 2 3`.
*** Add File: CHANGELOG.md
+# Changelog
+
+- `calc.ops.add` is now `calc.ops.plus`.
+- `python -m calc` replaces `python -m calc.cli`.
*** End Patch"#;

fn fixture_root() -> PathBuf {
    toolexec_tests::fixtures::fixture_dir("refactor-repo")
}

/// The fixture repository as the session is seeded with it. Its `.gitignore` is checked in as
/// `gitignore`: under its real name it would make this repository's git ignore the fixture's
/// `build/` and `*.orig` files, which the test needs in the tree.
fn fixture_repo() -> BTreeMap<String, String> {
    let mut files = text_files(&fixture_root());
    let gitignore = files.remove("gitignore").expect("the fixture's gitignore");
    files.insert(".gitignore".to_owned(), gitignore);
    files
}

/// The file text behind read_file's `cat -n` view (every line shown, no notes expected).
fn unnumbered(result: &Value) -> String {
    assert_eq!(result["status"], "ok", "{result}");
    let shown = result["content"].as_str().unwrap();
    let mut text = String::new();
    for line in shown.lines() {
        let (number, rest) = line
            .split_once('\t')
            .unwrap_or_else(|| panic!("not a numbered line: {line:?} in {shown}"));
        assert!(number.trim().parse::<usize>().is_ok(), "{shown}");
        text.push_str(rest);
        text.push('\n');
    }
    text
}

/// The `path:line` of each grep hit.
fn grep_hits(result: &Value) -> Vec<String> {
    assert_eq!(result["status"], "ok", "{result}");
    result["content"]
        .as_str()
        .unwrap()
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (path, number) = (parts.next()?, parts.next()?);
            number.parse::<usize>().ok()?;
            Some(format!("{path}:{number}"))
        })
        .collect()
}

fn text(result: &Value) -> &str {
    result["content"].as_str().unwrap()
}

fn invocation_id(result: &Value) -> String {
    result["invocation_id"].as_str().unwrap().to_owned()
}

/// One call; also remembers its invocation, for the checks on the log.
async fn step(
    app: &TestApp,
    sid: &str,
    ran: &mut Vec<String>,
    id: &str,
    name: &str,
    args: Value,
) -> Value {
    let result = app.call(sid, id, name, args).await;
    assert_eq!(result["call_id"], id, "{result}");
    ran.push(invocation_id(&result));
    result
}

#[tokio::test]
async fn an_http_only_agent_renames_a_function_across_a_real_repository_and_the_log_shows_every_step()
 {
    let app = spawn_app().await;
    let fixture = fixture_repo();
    assert!(fixture.contains_key(".gitignore") && fixture.contains_key("build/lib/calc/ops.py"));
    let session = app
        .session(json!({"metadata": {"task": "rename add to plus"}, "files": fixture}))
        .await;
    let sid = session["id"].as_str().unwrap().to_owned();
    let sid = sid.as_str();
    let mut ran = Vec::new();

    // Find the definition: only the real one, not the build output nor the ignored merge
    // leftover, though both define it too.
    let r = step(
        &app,
        sid,
        &mut ran,
        "find-def",
        "grep",
        json!({"pattern": r"def add\("}),
    )
    .await;
    assert_eq!(grep_hits(&r), ["calc/ops.py:4"], "{r}");

    // Find the call sites.
    let r = step(
        &app,
        sid,
        &mut ran,
        "find-uses",
        "grep",
        json!({"pattern": r"\badd\b", "glob_filter": "*.py"}),
    )
    .await;
    assert_eq!(
        grep_hits(&r),
        [
            "calc/__init__.py:2",
            "calc/__init__.py:4",
            "calc/cli.py:4",
            "calc/cli.py:10",
            "calc/ops.py:4",
            "tests/test_ops.py:1",
            "tests/test_ops.py:5",
        ],
        "{r}"
    );
    assert!(
        text(&r).contains("calc/cli.py:10:    print(add(a, b))"),
        "{r}"
    );
    assert!(!text(&r).contains("build/"), "build output is skipped: {r}");

    // The README was not among the hits, so it has not been read: editing it is refused.
    let refused = step(
        &app,
        sid,
        &mut ran,
        "edit-readme-blind",
        "edit_file",
        json!({"file_path": "README.md", "old_string": ">>> add(2, 3)", "new_string": ">>> plus(2, 3)"}),
    )
    .await;
    assert_eq!(refused["status"], "denied", "{refused}");
    assert_eq!(refused["is_error"], true);
    assert!(text(&refused).contains("README.md"), "{refused}");
    assert!(
        text(&refused).contains("read_file"),
        "says to read first: {refused}"
    );

    // Read everything the refactor touches.
    let mut reads = Vec::new();
    for path in [
        "README.md",
        "calc/ops.py",
        "calc/__init__.py",
        "calc/cli.py",
        "tests/test_ops.py",
    ] {
        let r = step(
            &app,
            sid,
            &mut ran,
            &format!("read-{path}"),
            "read_file",
            json!({"file_path": path}),
        )
        .await;
        assert_eq!(unnumbered(&r), fixture[path], "{path} as seeded");
        reads.push(r);
    }
    assert!(
        text(&reads[1]).contains("     4\tdef add(a, b):"),
        "{}",
        reads[1]
    );

    // The definition: one exact edit.
    let r = step(
        &app,
        sid,
        &mut ran,
        "rename-def",
        "edit_file",
        json!({"file_path": "calc/ops.py", "old_string": "def add(a, b):", "new_string": "def plus(a, b):"}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(text(&r).contains("def plus(a, b):"), "shows the edit: {r}");

    // A patch written from a wrong memory of cli.py: refused whole, with where and why.
    let wrong = step(
        &app,
        sid,
        &mut ran,
        "patch-wrong",
        "apply_patch",
        json!({"patch": WRONG_PATCH}),
    )
    .await;
    assert_eq!(wrong["status"], "error", "{wrong}");
    let why = text(&wrong);
    assert!(why.contains("nothing was changed"), "{why}");
    assert!(why.contains("calc/cli.py"), "names the file: {why}");
    assert!(why.contains("hunk 1"), "names the hunk: {why}");
    assert!(
        why.contains("print(add(x, y))"),
        "the line that did not match: {why}"
    );
    assert!(why.contains("print(add(a, b))"), "what the file has: {why}");
    let r = step(
        &app,
        sid,
        &mut ran,
        "check-init-untouched",
        "read_file",
        json!({"file_path": "calc/__init__.py"}),
    )
    .await;
    assert_eq!(unnumbered(&r), fixture["calc/__init__.py"], "not patched");
    let r = step(
        &app,
        sid,
        &mut ran,
        "check-no-changelog",
        "read_file",
        json!({"file_path": "CHANGELOG.md"}),
    )
    .await;
    assert_eq!(r["status"], "error", "not created: {r}");
    assert!(text(&r).contains("does not exist"), "{r}");

    // The call sites, the docs and a changelog in one patch.
    let patched = step(
        &app,
        sid,
        &mut ran,
        "patch-call-sites",
        "apply_patch",
        json!({"patch": CALL_SITES_PATCH}),
    )
    .await;
    assert_eq!(patched["status"], "ok", "{patched}");
    assert!(text(&patched).contains("5 files changed"), "{patched}");
    assert!(text(&patched).contains("A CHANGELOG.md"), "{patched}");

    // `python -m calc`: move cli.py to __main__.py, by copy and delete.
    let r = step(
        &app,
        sid,
        &mut ran,
        "copy-cli",
        "file_copy",
        json!({"source": "calc/cli.py", "dest": "calc/__main__.py"}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    let r = step(
        &app,
        sid,
        &mut ran,
        "delete-cli",
        "file_delete",
        json!({"path": "calc/cli.py"}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");

    let r = step(
        &app,
        sid,
        &mut ran,
        "list-py",
        "glob",
        json!({"pattern": "**/*.py"}),
    )
    .await;
    assert_eq!(r["status"], "ok", "{r}");
    let listed: BTreeSet<&str> = text(&r).lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(
        listed,
        BTreeSet::from([
            "calc/__init__.py",
            "calc/__main__.py",
            "calc/ops.py",
            "tests/test_ops.py"
        ]),
        "{r}"
    );

    // Done: no Python file mentions the old name, and every file reads as intended.
    let r = step(
        &app,
        sid,
        &mut ran,
        "find-leftovers",
        "grep",
        json!({"pattern": r"\badd\b", "glob_filter": "*.py"}),
    )
    .await;
    assert!(grep_hits(&r).is_empty(), "{r}");
    assert!(text(&r).contains("No matches"), "{r}");
    let expected_end = BTreeMap::from([
        ("calc/ops.py", OPS_AFTER),
        ("calc/__init__.py", INIT_AFTER),
        ("calc/__main__.py", MAIN_AFTER),
        ("tests/test_ops.py", TEST_OPS_AFTER),
        ("README.md", README_AFTER),
        ("CHANGELOG.md", CHANGELOG_AFTER),
    ]);
    for (path, expected) in &expected_end {
        let r = step(
            &app,
            sid,
            &mut ran,
            &format!("final-{path}"),
            "read_file",
            json!({"file_path": path}),
        )
        .await;
        assert_eq!(unnumbered(&r), *expected, "{path}");
    }
    let r = step(
        &app,
        sid,
        &mut ran,
        "final-cli-gone",
        "read_file",
        json!({"file_path": "calc/cli.py"}),
    )
    .await;
    assert_eq!(r["status"], "error", "{r}");

    // What the agent saw is what is on disk, and nothing else changed: the build output, the
    // ignored leftover and .gitignore are as seeded, and no temp file is left behind.
    let mut expected_disk: BTreeMap<String, String> = fixture.clone();
    expected_disk.remove("calc/cli.py");
    for (path, contents) in &expected_end {
        expected_disk.insert((*path).to_owned(), (*contents).to_owned());
    }
    let on_disk = text_files(&app.data.path().join("workspaces").join(sid));
    assert_eq!(on_disk, expected_disk);

    check_the_log(&app, sid, &fixture, &ran, &refused, &wrong, &patched).await;
}

/// Everything above, as the session's event log tells it.
async fn check_the_log(
    app: &TestApp,
    sid: &str,
    fixture: &BTreeMap<String, String>,
    ran: &[String],
    refused: &Value,
    wrong: &Value,
    patched: &Value,
) {
    let events = app.events(sid).await;
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=events.len() as i64).collect::<Vec<_>>(),
        "gapless"
    );
    let kind = |e: &Value| e["kind"].as_str().unwrap().to_owned();

    // The session, then one file.created per seeded file, outside any invocation.
    assert_eq!(kind(&events[0]), "session.created");
    let seeded: BTreeSet<&str> = events[1..=fixture.len()]
        .iter()
        .map(|e| {
            assert_eq!(kind(e), "file.created", "{e}");
            assert!(e["invocation_id"].is_null(), "{e}");
            e["data"]["path"].as_str().unwrap()
        })
        .collect();
    assert_eq!(seeded, fixture.keys().map(String::as_str).collect());

    // Every call: started, its side effects, finished, in that order and nothing interleaved
    // (the calls ran one at a time); a read with no side effect is its finish alone, carrying
    // its start.
    let rest = &events[1 + fixture.len()..];
    let mut effects = Vec::new();
    let mut finished = BTreeMap::new();
    let mut at = 0;
    for id in ran {
        let start = &rest[at];
        assert!(toolexec_tests::starts_call(start), "{start}");
        assert_eq!(start["invocation_id"], id.as_str());
        if kind(start) == "invocation.finished" {
            assert_eq!(start["data"]["read_only"], true, "{start}");
            finished.insert(id.clone(), start["data"].clone());
            at += 1;
            continue;
        }
        at += 1;
        while kind(&rest[at]) != "invocation.finished" {
            assert_eq!(rest[at]["invocation_id"], id.as_str(), "{}", rest[at]);
            effects.push((id.clone(), rest[at].clone()));
            at += 1;
        }
        assert_eq!(rest[at]["invocation_id"], id.as_str());
        finished.insert(id.clone(), rest[at]["data"].clone());
        at += 1;
    }
    assert_eq!(at, rest.len(), "no events from anything else");

    // The refusal and the failed patch are there, with their statuses and no side effects.
    let refused_id = invocation_id(refused);
    assert_eq!(finished[&refused_id]["status"], "denied");
    assert_eq!(finished[&refused_id]["name"], "edit_file");
    assert_eq!(finished[&refused_id]["is_error"], true);
    let wrong_id = invocation_id(wrong);
    assert_eq!(finished[&wrong_id]["status"], "error");
    assert_eq!(finished[&wrong_id]["name"], "apply_patch");
    let others_ok = finished
        .iter()
        .filter(|(id, _)| **id != refused_id && **id != wrong_id)
        .filter(|(_, data)| data["call_id"] != "check-no-changelog")
        .filter(|(_, data)| data["call_id"] != "final-cli-gone")
        .all(|(_, data)| data["status"] == "ok");
    assert!(others_ok, "{finished:?}");
    assert!(
        effects
            .iter()
            .all(|(id, _)| *id != refused_id && *id != wrong_id)
    );

    // The side effects: which call, what, where, under which capability.
    let call_of = |id: &str| finished[id]["call_id"].as_str().unwrap().to_owned();
    let seen: Vec<(String, String, String, String)> = effects
        .iter()
        .map(|(id, e)| {
            (
                call_of(id),
                kind(e),
                e["data"]["path"].as_str().unwrap().to_owned(),
                e["data"]["capability"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String, String, String)> = [
        ("rename-def", "file.modified", "calc/ops.py", "fs.write"),
        (
            "patch-call-sites",
            "file.modified",
            "calc/__init__.py",
            "fs.write",
        ),
        (
            "patch-call-sites",
            "file.modified",
            "calc/cli.py",
            "fs.write",
        ),
        (
            "patch-call-sites",
            "file.modified",
            "tests/test_ops.py",
            "fs.write",
        ),
        ("patch-call-sites", "file.modified", "README.md", "fs.write"),
        (
            "patch-call-sites",
            "file.created",
            "CHANGELOG.md",
            "fs.write",
        ),
        (
            "copy-cli",
            "file.created",
            "calc/__main__.py",
            "content_from_source",
        ),
        ("delete-cli", "file.deleted", "calc/cli.py", "fs.write"),
    ]
    .iter()
    .map(|(c, k, p, cap)| (c.to_string(), k.to_string(), p.to_string(), cap.to_string()))
    .collect();
    assert_eq!(seen, expected);

    // Before and after, by hash.
    let data = |call: &str, path: &str| {
        effects
            .iter()
            .find(|(id, e)| call_of(id) == call && e["data"]["path"] == path)
            .map(|(_, e)| e["data"].clone())
            .unwrap()
    };
    let edit = data("rename-def", "calc/ops.py");
    assert_eq!(
        edit["before_sha256"],
        sha256_hex(fixture["calc/ops.py"].as_bytes())
    );
    assert_eq!(edit["after_sha256"], sha256_hex(OPS_AFTER.as_bytes()));
    let changelog = data("patch-call-sites", "CHANGELOG.md");
    assert!(changelog["before_sha256"].is_null());
    assert_eq!(
        changelog["after_sha256"],
        sha256_hex(CHANGELOG_AFTER.as_bytes())
    );
    let copy = data("copy-cli", "calc/__main__.py");
    assert!(copy["before_sha256"].is_null());
    assert_eq!(copy["after_sha256"], sha256_hex(MAIN_AFTER.as_bytes()));
    assert_eq!(copy["after_stored"], true, "small copies are kept as blobs");
    let deleted = data("delete-cli", "calc/cli.py");
    assert_eq!(deleted["before_sha256"], sha256_hex(MAIN_AFTER.as_bytes()));
    assert!(deleted["after_sha256"].is_null());

    // The patch's own record lists its side effects.
    let inv: Value = app
        .get(&format!("/v1/invocations/{}", invocation_id(patched)))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(inv["status"], "ok", "{inv}");
    assert_eq!(inv["name"], "apply_patch");
    assert_eq!(inv["capabilities"], json!(["fs.read", "fs.write"]));
    let listed: Vec<(&str, &str)> = inv["side_effects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["kind"].as_str().unwrap(),
                e["data"]["path"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("file.modified", "calc/__init__.py"),
            ("file.modified", "calc/cli.py"),
            ("file.modified", "tests/test_ops.py"),
            ("file.modified", "README.md"),
            ("file.created", "CHANGELOG.md"),
        ]
    );
    // And the refused edit's record has none.
    let inv: Value = app
        .get(&format!("/v1/invocations/{refused_id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(inv["status"], "denied");
    assert_eq!(inv["side_effects"], json!([]));
}
