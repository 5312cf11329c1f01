//! Property tests of the path resolver: random paths built from a small alphabet of components
//! (`..`, `.`, empty, real names, symlinks that stay inside or lead out, a symlink loop, a hard
//! link to a file outside) and prefixes (relative, `/workspace`, look-alikes of it, host paths,
//! `/proc/self/root`), run through every [`Workspace`] operation against a fresh sandbox per case.
//!
//! The invariant: an operation either stays inside the workspace — the path it reports is
//! workspace-relative, symlink-free, and is the file or directory it actually touched — or it is
//! refused; and nothing outside the workspace (a sibling directory whose name the workspace's
//! name is a prefix of, holding a sentinel and a file hard-linked into the workspace) is ever
//! read, created, modified or deleted.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build hostile layouts and check results on the host, outside the jail"
)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers fail the test loudly"
)]
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};
use toolexec_workspace::jail::{JailError, Workspace};

/// What the sentinel outside the workspace holds; no file inside ever may.
const SENTINEL: &[u8] = b"SENTINEL: outside the workspace, never to be read or changed\n";

/// What the outside file hard-linked into the workspace (as `hard`) holds.
const LINKED: &[u8] = b"LINKED: outside the workspace, hard-linked in\n";

/// What the property writes.
const WRITTEN: &[u8] = b"written by the property test\n";

/// Path components and how often each is drawn: real names (so that many paths resolve to
/// something), `.`/`..`/empty, and the symlinks and the hard link of the sandbox.
const COMPONENTS: [(usize, &str); 18] = [
    (4, "a"),
    (3, "b"),
    (3, "f"),
    (3, ".."),
    (1, "."),
    (1, ""),
    (1, "new"),
    (1, "sentinel"),
    (2, "in_dir"),
    (1, "in_file"),
    (1, "out_dir"),
    (1, "out_abs"),
    (1, "out_file"),
    (2, "up"),
    (1, "loop"),
    (1, "hard"),
    (1, "s1"),
    (1, "s10"),
];

/// Paths worth starting from: ones that lead to something inside, through symlinks or not, and
/// ones that lead to the sentinel outside. A generated path is one of these with a few random
/// components inserted, or random components alone.
const KNOWN: [&str; 24] = [
    "f",
    "a/f",
    "a/b/f",
    "a",
    "a/b",
    "new/x",
    "in_file",
    "in_dir/f",
    "in_dir/../f",
    "in_dir/../../f",
    "a/up/f",
    "a/up/a/b/f",
    "a/b/../f",
    "hard",
    "loop",
    "out_file",
    "out_dir/sentinel",
    "out_dir/new",
    "out_abs/sentinel",
    "up/s10/sentinel",
    "up/s1/f",
    "a/b/esc/s10/sentinel",
    "../s10/sentinel",
    "in_dir/../../../s10/sentinel",
];

/// [`KNOWN`] paths that go through no symlink.
const KNOWN_PLAIN: [&str; 6] = ["f", "a/f", "a/b/f", "a", "a/b", "a/b/../f"];

/// Components that are never symlinks: resolving them in the kernel and folding them lexically
/// agree, so `display_path` can be checked against what the jail accepted.
const PLAIN_COMPONENTS: [(usize, &str); 6] =
    [(3, "a"), (2, "b"), (2, "f"), (2, ".."), (1, "."), (1, "")];

/// Cases of the jail property: each builds a sandbox of a dozen entries and runs up to four
/// operations, so this keeps the property to a few seconds while drawing every component and
/// prefix many times over.
const JAIL_CASES: u32 = 768;

/// Cases of the display-path property, whose alphabet is small.
const DISPLAY_CASES: u32 = 256;

/// Where a generated path starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prefix {
    Relative,
    Dot,
    Workspace,
    /// `/workspace` glued to the first component: `/workspacea` is not under it.
    WorkspaceGlued,
    /// `/workspaces/`: a string prefix of the virtual root, not under it.
    Workspaces,
    DoubleSlash,
    /// The workspace's own host path: the model only ever sees `/workspace`.
    HostRoot,
    /// The host path of the directory outside.
    HostOutside,
    /// `/proc/self/root` + the host path outside: a magic link.
    ProcRoot,
    /// `/etc/`: only with operations that cannot change anything.
    Etc,
}

impl Prefix {
    /// Every prefix but [`Prefix::Etc`], with how often each is drawn: mostly ones that can
    /// lead inside.
    const SAFE_TO_WRITE: [(usize, Prefix); 9] = [
        (6, Prefix::Relative),
        (2, Prefix::Dot),
        (4, Prefix::Workspace),
        (1, Prefix::WorkspaceGlued),
        (1, Prefix::Workspaces),
        (1, Prefix::DoubleSlash),
        (1, Prefix::HostRoot),
        (1, Prefix::HostOutside),
        (1, Prefix::ProcRoot),
    ];

    fn render(self, sandbox: &Sandbox) -> String {
        match self {
            Prefix::Relative => String::new(),
            Prefix::Dot => "./".into(),
            Prefix::Workspace => "/workspace/".into(),
            Prefix::WorkspaceGlued => "/workspace".into(),
            Prefix::Workspaces => "/workspaces/".into(),
            Prefix::DoubleSlash => "//workspace/".into(),
            Prefix::HostRoot => format!("{}/", sandbox.root.display()),
            Prefix::HostOutside => format!("{}/", sandbox.outside.display()),
            Prefix::ProcRoot => format!("/proc/self/root{}/", sandbox.outside.display()),
            Prefix::Etc => "/etc/".into(),
        }
    }
}

/// A path as generated: a prefix and components joined with `/`.
#[derive(Debug, Clone)]
struct GenPath {
    prefix: Prefix,
    components: Vec<&'static str>,
}

impl GenPath {
    fn render(&self, sandbox: &Sandbox) -> String {
        format!(
            "{}{}",
            self.prefix.render(sandbox),
            self.components.join("/")
        )
    }
}

#[derive(Debug, Clone)]
enum Op {
    Read(GenPath),
    OpenDir(GenPath),
    Write(GenPath),
    Remove(GenPath),
    Copy(GenPath, GenPath),
}

fn path_from(
    prefixes: &[(usize, Prefix)],
    known: &'static [&'static str],
    components: &[(usize, &'static str)],
) -> impl Strategy<Value = GenPath> + use<> {
    let component = prop::sample::select(weighted(components));
    let random = prop::collection::vec(component.clone(), 0..5);
    let mutated = (
        prop::sample::select(known),
        prop::collection::vec((any::<prop::sample::Index>(), component), 0..2),
    )
        .prop_map(|(known, inserts)| {
            let mut components: Vec<&'static str> = known.split('/').collect();
            for (at, component) in inserts {
                components.insert(at.index(components.len() + 1), component);
            }
            components
        });
    (
        prop::sample::select(weighted(prefixes)),
        prop_oneof![1 => random, 4 => mutated],
    )
        .prop_map(|(prefix, components)| GenPath { prefix, components })
}

/// Each item repeated as often as its weight, for a uniform pick.
fn weighted<T: Copy>(items: &[(usize, T)]) -> Vec<T> {
    items
        .iter()
        .flat_map(|&(weight, item)| std::iter::repeat_n(item, weight))
        .collect()
}

fn any_path() -> impl Strategy<Value = GenPath> {
    let mut all = Prefix::SAFE_TO_WRITE.to_vec();
    all.push((1, Prefix::Etc));
    path_from(&all, &KNOWN, &COMPONENTS)
}

fn writable_path() -> impl Strategy<Value = GenPath> {
    path_from(&Prefix::SAFE_TO_WRITE, &KNOWN, &COMPONENTS)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        any_path().prop_map(Op::Read),
        any_path().prop_map(Op::OpenDir),
        writable_path().prop_map(Op::Write),
        writable_path().prop_map(Op::Remove),
        (any_path(), writable_path()).prop_map(|(s, d)| Op::Copy(s, d)),
    ]
    .prop_filter(
        "a copy from /etc could write inside only, but keep /etc read-only",
        |op| !matches!(op, Op::Copy(source, _) if source.prefix == Prefix::Etc),
    )
}

/// A temp directory holding the workspace `s1/` and, beside it, `s10/` (outside; `s1` is a
/// string prefix of `s10`, the classic bug of a `starts_with` check).
///
/// ```text
/// s1/f  s1/a/f  s1/a/b/f         regular files
/// s1/in_dir   -> a/b             symlink, inside (and deeper than itself)
/// s1/in_file  -> a/f             symlink, inside
/// s1/a/up     -> ..              symlink, inside (the root)
/// s1/out_dir  -> ../s10          symlink, leads out
/// s1/out_abs  -> <host>/s10      absolute symlink, leads out
/// s1/out_file -> ../s10/sentinel symlink, leads out
/// s1/up       -> ..              symlink, leads out
/// s1/a/b/esc  -> ../../..        symlink, leads out
/// s1/loop     -> loop            symlink loop
/// s1/hard                        hard link to s10/linked
/// s10/sentinel  s10/linked  s10/sub/
/// ```
struct Sandbox {
    tmp: tempfile::TempDir,
    root: PathBuf,
    canonical_root: PathBuf,
    outside: PathBuf,
    ws: Workspace,
}

impl Sandbox {
    fn new() -> Self {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("s1");
        let outside = tmp.path().join("s10");
        fs::create_dir_all(outside.join("sub")).unwrap();
        fs::write(outside.join("sentinel"), SENTINEL).unwrap();
        fs::write(outside.join("linked"), LINKED).unwrap();

        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::write(root.join("f"), "root f\n").unwrap();
        fs::write(root.join("a/f"), "a/f\n").unwrap();
        fs::write(root.join("a/b/f"), "a/b/f\n").unwrap();
        symlink("a/b", root.join("in_dir")).unwrap();
        symlink("a/f", root.join("in_file")).unwrap();
        symlink("..", root.join("a/up")).unwrap();
        symlink("../s10", root.join("out_dir")).unwrap();
        symlink(&outside, root.join("out_abs")).unwrap();
        symlink("../s10/sentinel", root.join("out_file")).unwrap();
        symlink("..", root.join("up")).unwrap();
        symlink("../../..", root.join("a/b/esc")).unwrap();
        symlink("loop", root.join("loop")).unwrap();
        fs::hard_link(outside.join("linked"), root.join("hard")).unwrap();

        let ws = Workspace::open(&root).unwrap();
        let canonical_root = root.canonicalize().unwrap();
        Self {
            tmp,
            root,
            canonical_root,
            outside,
            ws,
        }
    }

    /// Everything in the temp directory except the workspace: path → what it is and holds.
    fn outside_snapshot(&self) -> BTreeMap<PathBuf, Node> {
        let mut seen = BTreeMap::new();
        let mut stack = vec![self.tmp.path().to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path == self.root {
                    continue;
                }
                let node = Node::of(&path);
                if node == Node::Dir {
                    stack.push(path.clone());
                }
                seen.insert(path, node);
            }
        }
        seen
    }

    /// Checks `reported` (a path an operation said it touched) is workspace-relative, inside,
    /// and the real (symlink-free) name of what is there.
    fn assert_inside(&self, reported: &str, what: &str) {
        assert!(
            !reported.starts_with('/') && !reported.starts_with(".."),
            "{what}: reported {reported:?}"
        );
        assert!(
            reported == "." || reported.split('/').all(|c| !matches!(c, "" | "." | "..")),
            "{what}: reported {reported:?} is not normalised"
        );
        let host = self.root.join(reported);
        // The parent must be a real directory inside (the name itself may be gone: a removal).
        let parent = host.parent().unwrap().canonicalize().unwrap();
        let expected_parent = self.canonical_root.join(reported);
        assert_eq!(
            Some(parent.as_path()),
            if reported == "." {
                self.canonical_root.parent()
            } else {
                expected_parent.parent()
            },
            "{what}: {reported:?} goes through a symlink or leaves the workspace"
        );
        if let Ok(meta) = fs::symlink_metadata(&host) {
            assert!(
                !meta.file_type().is_symlink(),
                "{what}: reported {reported:?} is a symlink, not what it resolves to"
            );
        }
    }

    /// No file in the workspace holds what only the outside files hold (the hard link aside,
    /// which is the outside file's inode itself).
    fn assert_no_outside_contents_inside(&self, what: &str) {
        use std::os::unix::fs::MetadataExt;
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                let meta = fs::symlink_metadata(&path).unwrap();
                if meta.is_dir() {
                    stack.push(path);
                } else if meta.is_file() && meta.nlink() == 1 {
                    let bytes = fs::read(&path).unwrap();
                    assert!(
                        bytes != SENTINEL && bytes != LINKED,
                        "{what}: {} holds outside contents",
                        path.display()
                    );
                }
            }
        }
    }
}

/// One entry as seen without following symlinks.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File(Vec<u8>),
    Dir,
    Symlink(PathBuf),
    Other,
}

impl Node {
    fn of(path: &Path) -> Node {
        let meta = fs::symlink_metadata(path).unwrap();
        if meta.is_file() {
            Node::File(fs::read(path).unwrap())
        } else if meta.is_dir() {
            Node::Dir
        } else if meta.file_type().is_symlink() {
            Node::Symlink(fs::read_link(path).unwrap())
        } else {
            Node::Other
        }
    }
}

/// Whether the jail must refuse `path` as outside before touching anything: absolute and not
/// `/workspace` or under it.
fn absolute_elsewhere(path: &str) -> bool {
    match path.strip_prefix('/') {
        None => false,
        Some(rest) => match rest.strip_prefix("workspace") {
            Some(under) => !(under.is_empty() || under.starts_with('/')),
            None => true,
        },
    }
}

fn assert_refused_as_outside<T: std::fmt::Debug>(result: &Result<T, JailError>, what: &str) {
    assert!(
        matches!(result, Err(JailError::OutsideWorkspace { .. })),
        "{what}: expected OutsideWorkspace, got {result:?}"
    );
}

/// Runs one operation and checks what it reports against the filesystem.
fn run(sandbox: &Sandbox, op: &Op) {
    let what = format!("{op:?}");
    let ws = &sandbox.ws;
    match op {
        Op::Read(path) => {
            let path = path.render(sandbox);
            let result = ws.read(&path);
            if absolute_elsewhere(&path) {
                assert_refused_as_outside(&result, &what);
            }
            if let Ok(file) = result {
                sandbox.assert_inside(&file.path, &what);
                assert_eq!(
                    fs::read(sandbox.root.join(&file.path)).unwrap(),
                    file.bytes,
                    "{what}"
                );
                assert!(file.bytes != SENTINEL && file.bytes != LINKED, "{what}");
            }
        }
        Op::OpenDir(path) => {
            let path = path.render(sandbox);
            let result = ws.open_dir(&path);
            if absolute_elsewhere(&path) {
                assert_refused_as_outside(&result, &what);
            }
            if let Ok(dir) = result {
                sandbox.assert_inside(dir.path(), &what);
                let listed: Vec<String> =
                    dir.entries().unwrap().into_iter().map(|e| e.name).collect();
                let mut actual: Vec<String> = fs::read_dir(sandbox.root.join(dir.path()))
                    .unwrap()
                    .map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect();
                actual.sort();
                assert_eq!(listed, actual, "{what}: lists another directory");
            }
        }
        Op::Write(path) => {
            let path = path.render(sandbox);
            let result = ws.write(&path, WRITTEN);
            if absolute_elsewhere(&path) {
                assert_refused_as_outside(&result, &what);
            }
            if let Ok(written) = result {
                sandbox.assert_inside(&written.path, &what);
                let host = sandbox.root.join(&written.path);
                assert_eq!(Node::of(&host), Node::File(WRITTEN.to_vec()), "{what}");
            }
        }
        Op::Remove(path) => {
            let path = path.render(sandbox);
            let result = ws.remove_file(&path);
            if absolute_elsewhere(&path) {
                assert_refused_as_outside(&result, &what);
            }
            if let Ok(removed) = result {
                sandbox.assert_inside(&removed.path, &what);
                let host = sandbox.root.join(&removed.path);
                assert!(fs::symlink_metadata(&host).is_err(), "{what}: still there");
            }
        }
        Op::Copy(source, dest) => {
            let (source, dest) = (source.render(sandbox), dest.render(sandbox));
            let result = ws.copy_file_if(&source, &dest, u64::MAX, |_, _| Ok::<(), ()>(()));
            // The source is resolved first, so a bad dest is only reached past a good source.
            if absolute_elsewhere(&source) {
                assert_refused_as_outside(&result, &what);
            } else if absolute_elsewhere(&dest) {
                assert!(result.is_err(), "{what}: got {result:?}");
            }
            if let Ok(Ok(copied)) = result {
                sandbox.assert_inside(&copied.source, &what);
                sandbox.assert_inside(&copied.written.path, &what);
                let bytes = fs::read(sandbox.root.join(&copied.written.path)).unwrap();
                assert_eq!(Some(&bytes), copied.kept.as_ref(), "{what}");
                assert_eq!(
                    fs::read(sandbox.root.join(&copied.source)).unwrap(),
                    bytes,
                    "{what}: copied from somewhere else"
                );
            }
        }
    }
}

fn config(cases: u32) -> Config {
    Config {
        cases,
        // Beside this file (an integration test has no lib.rs for proptest to find).
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config(JAIL_CASES))]

    #[test]
    fn every_operation_stays_inside_the_workspace_or_is_refused_and_nothing_outside_changes(
        ops in prop::collection::vec(op(), 1..5)
    ) {
        let sandbox = Sandbox::new();
        let outside = sandbox.outside_snapshot();
        for op in &ops {
            run(&sandbox, op);
            prop_assert_eq!(&sandbox.outside_snapshot(), &outside, "after {:?}", op);
            sandbox.assert_no_outside_contents_inside(&format!("{op:?}"));
        }
    }
}

proptest! {
    #![proptest_config(config(DISPLAY_CASES))]

    #[test]
    fn the_display_path_of_a_path_the_jail_accepts_never_starts_with_dot_dot_or_a_slash(
        path in path_from(&Prefix::SAFE_TO_WRITE, &KNOWN_PLAIN, &PLAIN_COMPONENTS)
    ) {
        let sandbox = Sandbox::new();
        let path = path.render(&sandbox);
        let accepted = sandbox.ws.read(&path).is_ok() || sandbox.ws.open_dir(&path).is_ok();
        if accepted {
            let display = Workspace::display_path(&path).unwrap();
            prop_assert!(
                !display.starts_with("..") && !display.starts_with('/'),
                "{:?} was accepted but displays as {:?}", path, display
            );
        }
    }
}
