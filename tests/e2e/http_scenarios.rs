//! Issue 3's fixture-folder scenarios for `edit_file` and `apply_patch`
//! (`crates/toolexec-tools/tests/scenarios/`) and Codex's apply-patch conformance scenarios
//! (`shared/conformance/codex-apply-patch/`, beside the repository), end to end over HTTP: the
//! same folders the in-process tests run, read here by path, never copied.
//!
//! Each case gets its own session on one server: the session is seeded with `input/` (UTF-8
//! files through `POST /v1/sessions`, other files written into the workspace directory on disk),
//! every input file is read with `read_file` as a model would (read-before-write is part of the
//! setup), the call is sent, and then the workspace directory on disk is compared with
//! `expected/` byte for byte (or the result with `expected_error.txt`, the workspace unchanged).
//! The session's event log must agree: the call's `invocation.finished` has the result's status,
//! and its `file.*` events name exactly the files that changed, with the before and after hashes
//! of what is on disk; a failed call has none.
//!
//! One deliberate difference from Codex: our patches are all-or-nothing, so scenario 015 (Codex
//! keeps the file added before a later operation failed) must fail and change nothing.
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use toolexec_core::sha256_hex;
use toolexec_tests::app::{TestApp, spawn_app};

/// The Codex scenario where our all-or-nothing patches differ from Codex on purpose.
const ALL_OR_NOTHING: &str = "015_failure_after_partial_success_leaves_changes";

/// Fails the case with a message (the suite reports every failed case together).
macro_rules! ensure {
    ($cond:expr, $($why:tt)+) => {
        if !$cond {
            return Err(format!($($why)+));
        }
    };
}

fn scenarios_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/toolexec-tools/tests/scenarios")
}

/// `shared/` is beside the repository (as in CI).
fn conformance_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/conformance/codex-apply-patch")
}

/// One entry of a tree on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Dir,
    File(Vec<u8>),
}

/// Every file and directory under `root`, by `/`-separated relative path (empty if `root` does
/// not exist: a scenario without `input/` or `expected/`).
fn tree(root: &Path) -> BTreeMap<String, Node> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Node>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap();
            let rel: Vec<&str> = rel
                .components()
                .map(|c| c.as_os_str().to_str().unwrap())
                .collect();
            let rel = rel.join("/");
            let meta = fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                out.insert(rel, Node::Dir);
                walk(root, &path, out);
            } else {
                out.insert(rel, Node::File(fs::read(&path).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    if root.is_dir() {
        walk(root, root, &mut out);
    }
    out
}

/// Only the files of a tree.
fn files(tree: &BTreeMap<String, Node>) -> BTreeMap<String, Vec<u8>> {
    tree.iter()
        .filter_map(|(path, node)| match node {
            Node::File(bytes) => Some((path.clone(), bytes.clone())),
            Node::Dir => None,
        })
        .collect()
}

/// A readable account of how two trees differ, empty when they are equal.
fn tree_difference(actual: &BTreeMap<String, Node>, expected: &BTreeMap<String, Node>) -> String {
    let paths: BTreeSet<&String> = actual.keys().chain(expected.keys()).collect();
    let mut out = String::new();
    for path in paths {
        match (actual.get(path), expected.get(path)) {
            (Some(a), Some(e)) if a == e => {}
            (Some(Node::File(a)), Some(Node::File(e))) => out.push_str(&format!(
                "{path}: contents differ\n  got:      {:?}\n  expected: {:?}\n",
                String::from_utf8_lossy(a),
                String::from_utf8_lossy(e)
            )),
            (a, e) => out.push_str(&format!("{path}: got {a:?}, expected {e:?}\n")),
        }
    }
    out
}

/// What a case must end with.
#[derive(Debug)]
enum Expect {
    /// The call applies and the workspace becomes this tree.
    Applied(BTreeMap<String, Node>),
    /// The call fails, its result holds each of these lines, and the workspace is unchanged.
    Refused(Vec<String>),
}

#[derive(Debug)]
struct Case {
    name: String,
    tool: &'static str,
    args: Value,
    input: PathBuf,
    expect: Expect,
}

/// The fixture-folder scenarios of one tool, as `scenarios.rs` reads them.
fn fixture_cases(tool: &'static str) -> Vec<Case> {
    let root = scenarios_root().join(tool);
    let mut dirs: Vec<PathBuf> = fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs.into_iter()
        .map(|dir| {
            let args: Value =
                serde_json::from_slice(&fs::read(dir.join("call.json")).unwrap()).unwrap();
            let expected_error = dir.join("expected_error.txt");
            let expect = if expected_error.exists() {
                Expect::Refused(
                    fs::read_to_string(&expected_error)
                        .unwrap()
                        .lines()
                        .filter(|l| !l.trim().is_empty())
                        .map(str::to_owned)
                        .collect(),
                )
            } else {
                Expect::Applied(tree(&dir.join("expected")))
            };
            Case {
                name: format!("{tool}/{}", dir.file_name().unwrap().to_string_lossy()),
                tool,
                args,
                input: dir.join("input"),
                expect,
            }
        })
        .collect()
}

/// Codex's scenarios, as `conformance.rs` reads them. A scenario whose expected tree is its
/// input tree is one Codex rejects: it must fail here too.
fn conformance_cases() -> Vec<Case> {
    let root = conformance_root();
    let mut dirs: Vec<PathBuf> = fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("conformance data missing at {}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("patch.txt").is_file())
        .collect();
    dirs.sort();
    dirs.into_iter()
        .map(|dir| {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            let patch = fs::read_to_string(dir.join("patch.txt")).unwrap();
            let input = dir.join("input");
            let expected = tree(&dir.join("expected"));
            let expect = if name == ALL_OR_NOTHING || expected == tree(&input) {
                Expect::Refused(Vec::new())
            } else {
                Expect::Applied(expected)
            };
            Case {
                name,
                tool: "apply_patch",
                args: json!({ "patch": patch }),
                input,
                expect,
            }
        })
        .collect()
}

/// Runs one case in a session of its own; `Err` says how it failed.
async fn run_case(app: &TestApp, case: &Case) -> Result<(), String> {
    let input = tree(&case.input);
    let input_files = files(&input);
    let (text, other): (BTreeMap<_, _>, BTreeMap<_, _>) = input_files
        .iter()
        .partition(|(_, bytes)| std::str::from_utf8(bytes).is_ok());
    let text: BTreeMap<&String, &str> = text
        .into_iter()
        .map(|(path, bytes)| (path, std::str::from_utf8(bytes).unwrap()))
        .collect();

    // The session, seeded with input/: text through the API, the rest on disk.
    let session = app
        .session(json!({"metadata": {"scenario": case.name}, "files": text}))
        .await;
    let sid = session["id"].as_str().unwrap().to_owned();
    let ws = app.data.path().join("workspaces").join(&sid);
    for (path, bytes) in &other {
        let host = ws.join(path);
        fs::create_dir_all(host.parent().unwrap()).unwrap();
        fs::write(host, bytes).unwrap();
    }
    let difference = tree_difference(&tree(&ws), &input);
    ensure!(
        difference.is_empty(),
        "the seeded workspace is not input/:\n{difference}"
    );

    // Read every input file, as a model would before changing it.
    if !input_files.is_empty() {
        let reads: Vec<Value> = input_files
            .keys()
            .enumerate()
            .map(|(i, path)| {
                json!({"id": format!("read-{i}"), "name": "read_file", "arguments": {"file_path": path}})
            })
            .collect();
        let results = app.calls(&sid, Value::Array(reads)).await;
        for (path, result) in input_files.keys().zip(&results) {
            ensure!(
                result["status"] == "ok",
                "setup: read_file {path} failed: {result}"
            );
        }
    }

    let result = app
        .call(&sid, "scenario", case.tool, case.args.clone())
        .await;
    let content = result["content"].as_str().unwrap_or_default();
    let after = tree(&ws);
    let changed: bool = match &case.expect {
        Expect::Applied(expected) => {
            ensure!(
                result["status"] == "ok" && result["is_error"] == false,
                "failed with {}:\n{content}",
                result["status"]
            );
            let difference = tree_difference(&after, expected);
            ensure!(difference.is_empty(), "{difference}\noutput:\n{content}");
            true
        }
        Expect::Refused(lines) => {
            ensure!(
                result["status"] != "ok" && result["is_error"] == true,
                "expected an error, got {}:\n{content}",
                result["status"]
            );
            for wanted in lines {
                ensure!(
                    content.contains(wanted.as_str()),
                    "the error does not contain {wanted:?}:\n{content}"
                );
            }
            let difference = tree_difference(&after, &input);
            ensure!(
                difference.is_empty(),
                "a failed call changed the workspace:\n{difference}\noutput:\n{content}"
            );
            false
        }
    };
    check_the_log(
        app,
        &sid,
        &result,
        &text,
        &input_files,
        &files(&after),
        changed,
    )
    .await
}

/// The session's log: seeding, the reads with no side effects, and the call's finish and file
/// events, which must name exactly the files that changed on disk.
async fn check_the_log(
    app: &TestApp,
    sid: &str,
    result: &Value,
    seeded: &BTreeMap<&String, &str>,
    before: &BTreeMap<String, Vec<u8>>,
    after: &BTreeMap<String, Vec<u8>>,
    applied: bool,
) -> Result<(), String> {
    let events = app.events(sid).await;
    let kind = |e: &Value| e["kind"].as_str().unwrap_or_default().to_owned();
    let is_file_event = |e: &Value| kind(e).starts_with("file.");

    let seeding: BTreeSet<&str> = events
        .iter()
        .filter(|e| is_file_event(e) && e["invocation_id"].is_null())
        .map(|e| e["data"]["path"].as_str().unwrap_or_default())
        .collect();
    let seeded: BTreeSet<&str> = seeded.keys().map(|p| p.as_str()).collect();
    ensure!(
        seeding == seeded,
        "seeding recorded {seeding:?}, seeded {seeded:?}"
    );

    let invocation = result["invocation_id"].as_str().unwrap_or_default();
    let finished: Vec<&Value> = events
        .iter()
        .filter(|e| kind(e) == "invocation.finished" && e["invocation_id"] == invocation)
        .collect();
    ensure!(
        finished.len() == 1,
        "{} invocation.finished events for the call",
        finished.len()
    );
    let data = &finished[0]["data"];
    ensure!(
        data["status"] == result["status"] && data["is_error"] == result["is_error"],
        "invocation.finished says {data}, the result {result}"
    );
    ensure!(
        data["call_id"] == "scenario",
        "invocation.finished is for {}",
        data["call_id"]
    );
    let strays: Vec<&Value> = events
        .iter()
        .filter(|e| is_file_event(e) && !e["invocation_id"].is_null())
        .filter(|e| e["invocation_id"] != invocation)
        .collect();
    ensure!(
        strays.is_empty(),
        "file events of other invocations (the reads?): {strays:?}"
    );

    let recorded: Vec<&Value> = events
        .iter()
        .filter(|e| is_file_event(e) && e["invocation_id"] == invocation)
        .collect();
    if !applied {
        ensure!(
            recorded.is_empty(),
            "a failed call recorded changes: {recorded:?}"
        );
        return Ok(());
    }
    let changed: BTreeSet<&str> = before
        .keys()
        .chain(after.keys())
        .filter(|path| before.get(*path) != after.get(*path))
        .map(String::as_str)
        .collect();
    let named: BTreeSet<&str> = recorded
        .iter()
        .map(|e| e["data"]["path"].as_str().unwrap_or_default())
        .collect();
    ensure!(
        named == changed,
        "file events name {named:?}, the files that changed are {changed:?}"
    );
    // Per file: the first event starts from what was there, the last ends with what is there.
    let hash = |bytes: Option<&Vec<u8>>| bytes.map_or(Value::Null, |b| json!(sha256_hex(b)));
    for path in changed {
        let of_path: Vec<&&Value> = recorded
            .iter()
            .filter(|e| e["data"]["path"] == path)
            .collect();
        let (first, last) = (of_path[0], of_path[of_path.len() - 1]);
        ensure!(
            first["data"]["before_sha256"] == hash(before.get(path)),
            "{path}: first event {first} does not start from the input"
        );
        ensure!(
            last["data"]["after_sha256"] == hash(after.get(path)),
            "{path}: last event {last} does not end with what is on disk"
        );
        let (first_kind, last_kind) = (kind(first), kind(last));
        ensure!(
            before.contains_key(path) || first_kind == "file.created",
            "{path}: a new file, recorded as {first_kind}"
        );
        ensure!(
            after.contains_key(path) || last_kind == "file.deleted",
            "{path}: a removed file, recorded as {last_kind}"
        );
        ensure!(
            !(before.contains_key(path) && after.contains_key(path))
                || of_path.iter().all(|e| kind(e) == "file.modified"),
            "{path}: changed in place, recorded as {:?}",
            of_path.iter().map(|e| kind(e)).collect::<Vec<_>>()
        );
    }
    Ok(())
}

/// Runs every case on one server, one session each, and reports every failure together.
async fn run_all(suite: &str, cases: Vec<Case>) {
    let app = spawn_app().await;
    let mut failures = Vec::new();
    for case in &cases {
        if let Err(why) = run_case(&app, case).await {
            failures.push(format!("{}: {why}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} {suite} scenarios failed over HTTP:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

#[tokio::test]
async fn every_edit_file_scenario_leaves_the_expected_workspace_over_http() {
    let cases = fixture_cases("edit_file");
    assert!(
        cases.len() >= 10,
        "found {} edit_file scenarios",
        cases.len()
    );
    run_all("edit_file", cases).await;
}

#[tokio::test]
async fn every_apply_patch_scenario_leaves_the_expected_workspace_over_http() {
    let cases = fixture_cases("apply_patch");
    assert!(
        cases.len() >= 10,
        "found {} apply_patch scenarios",
        cases.len()
    );
    run_all("apply_patch", cases).await;
}

#[tokio::test]
async fn codex_apply_patch_scenarios_pass_over_http() {
    let cases = conformance_cases();
    assert!(cases.len() >= 23, "found {} scenarios", cases.len());
    let all_or_nothing = cases.iter().find(|c| c.name == ALL_OR_NOTHING);
    assert!(
        matches!(
            all_or_nothing,
            Some(Case {
                expect: Expect::Refused(_),
                ..
            })
        ),
        "{ALL_OR_NOTHING} must be expected to fail and change nothing"
    );
    run_all("Codex apply_patch", cases).await;
}
