//! Fixture-folder scenarios for the editing tools.
//!
//! `tests/scenarios/<tool>/<scenario>/` holds `input/` (the workspace before; every file in it
//! counts as read by the session), `call.json` (the tool's arguments) and either `expected/`
//! (the whole workspace after, byte for byte) or `expected_error.txt` (lines that must each
//! appear in the error the model gets; the workspace must then be exactly `input/`).
//! `.gitattributes` there keeps git from touching line endings.
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

use std::fs;
use std::path::{Path, PathBuf};

use common::{Session, tree, tree_difference};

fn scenario_dirs(tool: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scenarios")
        .join(tool);
    let mut dirs: Vec<PathBuf> = fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// Runs one scenario; `Err` says how it failed.
async fn run_scenario(tool: &str, dir: &Path) -> Result<(), String> {
    let input = dir.join("input");
    let session = Session::seeded_from(&input);
    let args: serde_json::Value =
        serde_json::from_slice(&fs::read(dir.join("call.json")).unwrap()).unwrap();
    let out = session.call(tool, args).await;
    let after = tree(&session.root);
    let expected_error = dir.join("expected_error.txt");
    if expected_error.exists() {
        if !out.status.is_error() {
            return Err(format!(
                "expected an error, got {:?}:\n{}",
                out.status, out.content
            ));
        }
        for wanted in fs::read_to_string(&expected_error).unwrap().lines() {
            if !wanted.trim().is_empty() && !out.content.contains(wanted) {
                return Err(format!(
                    "the error does not contain {wanted:?}:\n{}",
                    out.content
                ));
            }
        }
        let difference = tree_difference(&after, &tree(&input));
        if !difference.is_empty() {
            return Err(format!(
                "a failed call changed the workspace:\n{difference}"
            ));
        }
        if !out.changes.is_empty() {
            return Err(format!("a failed call recorded changes: {:?}", out.changes));
        }
    } else {
        if out.status.is_error() {
            return Err(format!("failed with {:?}:\n{}", out.status, out.content));
        }
        let difference = tree_difference(&after, &tree(&dir.join("expected")));
        if !difference.is_empty() {
            return Err(format!("{difference}\noutput:\n{}", out.content));
        }
    }
    Ok(())
}

async fn run_all(tool: &str) {
    let mut failures = Vec::new();
    let dirs = scenario_dirs(tool);
    assert!(!dirs.is_empty(), "no {tool} scenarios found");
    for dir in &dirs {
        if let Err(why) = run_scenario(tool, dir).await {
            failures.push(format!(
                "{}: {why}",
                dir.file_name().unwrap().to_string_lossy()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} {tool} scenarios failed:\n\n{}",
        failures.len(),
        dirs.len(),
        failures.join("\n\n")
    );
}

#[tokio::test]
async fn every_edit_file_scenario_leaves_the_expected_workspace() {
    run_all("edit_file").await;
}

#[tokio::test]
async fn every_apply_patch_scenario_leaves_the_expected_workspace() {
    run_all("apply_patch").await;
}
