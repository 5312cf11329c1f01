//! Codex's apply-patch scenarios (`shared/conformance/codex-apply-patch/`, see its `SOURCE.md`),
//! run through our `apply_patch` in a fresh workspace holding each scenario's `input/`, with
//! every input file read by the session first (read-before-write is part of the setup).
//!
//! One deliberate difference: our patches are all-or-nothing, so scenario 015 (Codex keeps the
//! file added before a later operation failed) must leave the workspace exactly as it was.
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

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use common::{Session, tree, tree_difference};
use serde_json::json;

/// Where our behaviour differs from Codex's on purpose: the scenario's expected tree is replaced
/// by its input tree.
const ALL_OR_NOTHING: &str = "015_failure_after_partial_success_leaves_changes";

fn conformance_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/conformance/codex-apply-patch")
}

#[tokio::test]
async fn codex_apply_patch_scenarios_pass() {
    let root = conformance_dir();
    let mut scenarios: Vec<PathBuf> = fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("conformance data missing at {}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("patch.txt").is_file())
        .collect();
    scenarios.sort();
    assert!(scenarios.len() >= 23, "found {} scenarios", scenarios.len());

    let mut failures = Vec::new();
    for dir in &scenarios {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let input = dir.join("input");
        let session = Session::seeded_from(&input);
        let patch = fs::read_to_string(dir.join("patch.txt")).unwrap();
        let out = session.call("apply_patch", json!({ "patch": patch })).await;
        let expected = if name == ALL_OR_NOTHING {
            assert!(out.status.is_error(), "{name}: {}", out.content);
            tree(&input)
        } else if dir.join("expected").is_dir() {
            tree(&dir.join("expected"))
        } else {
            BTreeMap::new()
        };
        let difference = tree_difference(&tree(&session.root), &expected);
        if !difference.is_empty() {
            failures.push(format!("{name}:\n{difference}output: {}", out.content));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed:\n\n{}",
        failures.len(),
        scenarios.len(),
        failures.join("\n\n")
    );
}
