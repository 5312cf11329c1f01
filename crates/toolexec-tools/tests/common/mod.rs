//! Helpers for the fixture-folder tests: a session over a fresh workspace seeded from an
//! `input/` tree, and exact tree comparison.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build hostile layouts and check results on the host, outside the jail"
)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    dead_code,
    reason = "test helpers fail the test loudly; each test binary uses a subset"
)]
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use toolexec_core::sha256_hex;
use toolexec_tools::{Registry, ToolContext, ToolOutput, Workspace};

pub struct Session {
    _tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub registry: Registry,
    pub ctx: ToolContext,
}

impl Session {
    pub fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        let workspace = Arc::new(Workspace::create(&root).unwrap());
        Self {
            _tmp: tmp,
            root,
            registry: Registry::builtin().unwrap(),
            ctx: ToolContext::new(uuid::Uuid::now_v7(), workspace),
        }
    }

    /// A session whose workspace holds a copy of `input` (if it exists), every file of it marked
    /// as read by this session.
    pub fn seeded_from(input: &Path) -> Self {
        let session = Self::new();
        if input.is_dir() {
            copy_tree(input, &session.root);
            for (path, entry) in tree(&session.root) {
                if let Node::File(bytes) = entry {
                    session.ctx.reads.record(&path, &sha256_hex(&bytes));
                }
            }
        }
        session
    }

    pub fn file(&self, rel: &str, contents: impl AsRef<[u8]>) {
        let path = self.root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }

    pub fn read(&self, rel: &str) -> Vec<u8> {
        fs::read(self.root.join(rel)).unwrap()
    }

    /// Validates like the engine does, then runs.
    pub async fn call(&self, name: &str, args: Value) -> ToolOutput {
        if let Err(e) = self.registry.validate(name, &args).expect("known tool") {
            panic!("{}", e.to_model_text(name));
        }
        self.registry.get(name).unwrap().run(&self.ctx, args).await
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir,
    File(Vec<u8>),
}

/// Every file and directory under `root`, by `/`-separated relative path.
pub fn tree(root: &Path) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    if root.is_dir() {
        walk(root, root, &mut out);
    }
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Node>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        if path.is_dir() {
            out.insert(rel, Node::Dir);
            walk(root, &path, out);
        } else {
            out.insert(rel, Node::File(fs::read(&path).unwrap()));
        }
    }
}

pub fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let dest = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_tree(&path, &dest);
        } else {
            fs::copy(&path, &dest).unwrap();
        }
    }
}

/// A readable account of how two trees differ, empty when they are equal.
pub fn tree_difference(
    actual: &BTreeMap<String, Node>,
    expected: &BTreeMap<String, Node>,
) -> String {
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
