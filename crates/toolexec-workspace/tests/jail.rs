//! Adversarial tests of the workspace jail, on the real filesystem.
//!
//! Every test builds a sandbox directory holding the workspace (`ws/`) and a directory outside it
//! (`outside/`, with a secret file), attacks the jail, and checks both the refusal and that
//! nothing outside was read into a result, created or changed.
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
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use toolexec_workspace::jail::{Before, JailError, UnreadReason, Workspace};

const SECRET: &[u8] = b"TOP SECRET: outside the workspace\n";

/// How long a race test keeps trying to see both states (the real file and the swapped-in
/// symlink) before it gives up as inconclusive.
const RACE_DEADLINE: Duration = Duration::from_secs(10);

struct Setup {
    _tmp: tempfile::TempDir,
    ws_root: PathBuf,
    outside: PathBuf,
    ws: Arc<Workspace>,
}

impl Setup {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let ws_root = tmp.path().join("ws");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(outside.join("sub")).unwrap();
        fs::write(outside.join("secret"), SECRET).unwrap();
        fs::write(outside.join("sub/deeper"), SECRET).unwrap();
        let ws = Arc::new(Workspace::create(&ws_root).unwrap());
        Self {
            _tmp: tmp,
            ws_root,
            outside,
            ws,
        }
    }

    fn in_ws(&self, rel: &str) -> PathBuf {
        self.ws_root.join(rel)
    }

    fn outside_str(&self, rel: &str) -> String {
        self.outside.join(rel).to_str().unwrap().to_owned()
    }

    /// Everything under `outside/`: path → (kind, contents, inode).
    fn outside_snapshot(&self) -> BTreeMap<PathBuf, (String, Vec<u8>, u64)> {
        snapshot(&self.outside)
    }
}

fn snapshot(root: &Path) -> BTreeMap<PathBuf, (String, Vec<u8>, u64)> {
    let mut seen = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let meta = fs::symlink_metadata(entry.path()).unwrap();
            let contents = if meta.is_file() {
                fs::read(entry.path()).unwrap()
            } else {
                Vec::new()
            };
            if meta.is_dir() {
                stack.push(entry.path());
            }
            let kind = format!("{:?}", meta.file_type());
            seen.insert(entry.path(), (kind, contents, meta.ino()));
        }
    }
    seen
}

fn symlink(target: impl AsRef<Path>, link: impl AsRef<Path>) {
    std::os::unix::fs::symlink(target, link).unwrap();
}

fn assert_outside(result: Result<impl std::fmt::Debug, JailError>) {
    match result {
        Err(JailError::OutsideWorkspace { .. }) => {}
        other => panic!("expected OutsideWorkspace, got {other:?}"),
    }
}

/// Runs `f` on another thread and fails the test if it has not returned within `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("did not return within {limit:?}"))
}

/// Atomically exchanges two names (`renameat2(RENAME_EXCHANGE)`) until told to stop, so the
/// first name is alternately a real file or directory and a symlink leading outside.
fn swapper(stop: Arc<AtomicBool>, a: PathBuf, b: PathBuf) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            rustix::fs::renameat_with(
                rustix::fs::CWD,
                &a,
                rustix::fs::CWD,
                &b,
                rustix::fs::RenameFlags::EXCHANGE,
            )
            .unwrap();
        }
    })
}

#[test]
fn dot_dot_escapes_are_refused() {
    let s = Setup::new();
    let before = s.outside_snapshot();
    fs::create_dir(s.in_ws("a")).unwrap();
    for path in [
        "../outside/secret",
        "./../outside/secret",
        "a/../../outside/secret",
        "..",
        "../../../../../../etc/passwd",
    ] {
        assert_outside(s.ws.read(path));
        assert_outside(s.ws.open_dir(path));
    }
    assert_outside(s.ws.write("../outside/new.txt", b"x"));
    assert_outside(s.ws.write("../outside/sub/new.txt", b"x"));
    assert_outside(s.ws.write("../outside/secret", b"overwritten"));
    assert_eq!(s.outside_snapshot(), before);
}

#[test]
fn a_refused_escape_does_not_reveal_whether_the_outside_path_exists() {
    let s = Setup::new();
    for path in [
        "../outside/secret",
        "../outside/no-such-file",
        "../no-such-dir/x",
    ] {
        assert_outside(s.ws.read(path));
    }
    // A missing directory inside stops the walk before any `..` is considered.
    assert!(matches!(
        s.ws.read("missing/../../outside/secret"),
        Err(JailError::NotFound { .. })
    ));
}

#[test]
fn a_dot_dot_that_stays_inside_is_fine() {
    let s = Setup::new();
    fs::create_dir(s.in_ws("a")).unwrap();
    fs::write(s.in_ws("b.txt"), "inside").unwrap();
    let read = s.ws.read("a/../b.txt").unwrap();
    assert_eq!(read.bytes, b"inside");
    assert_eq!(read.path, "b.txt");
}

#[test]
fn absolute_paths_outside_the_virtual_root_are_refused() {
    let s = Setup::new();
    let before = s.outside_snapshot();
    let host_ws = s.ws_root.join("inside.txt").to_str().unwrap().to_owned();
    fs::write(s.in_ws("inside.txt"), "x").unwrap();
    for path in [
        "/etc/passwd",
        &s.outside_str("secret"),
        // Even the workspace's own host path: the model only ever sees /workspace.
        &host_ws,
        "/",
        "/workspacefoo/x",
    ] {
        assert_outside(s.ws.read(path));
        assert_outside(s.ws.write(path, b"x"));
        assert_outside(s.ws.open_dir(path));
    }
    assert_eq!(s.outside_snapshot(), before);
    assert_eq!(fs::read(s.in_ws("inside.txt")).unwrap(), b"x");
}

#[test]
fn workspace_dot_dot_etc_passwd_is_refused() {
    let s = Setup::new();
    assert_outside(s.ws.read("/workspace/../etc/passwd"));
    assert_outside(s.ws.read("/workspace/../../etc/passwd"));
    assert_outside(s.ws.write("/workspace/../etc/toolexec-test", b"x"));
    assert!(!Path::new("/etc/toolexec-test").exists());
}

#[test]
fn a_symlink_to_a_file_outside_is_refused() {
    let s = Setup::new();
    let before = s.outside_snapshot();
    symlink(s.outside.join("secret"), s.in_ws("abs-link"));
    symlink("../outside/secret", s.in_ws("rel-link"));
    for link in ["abs-link", "rel-link"] {
        assert_outside(s.ws.read(link));
        // Writing never follows a symlink at the target, wherever it points.
        assert!(matches!(
            s.ws.write(link, b"overwritten"),
            Err(JailError::NotARegularFile { .. })
        ));
    }
    assert_eq!(s.outside_snapshot(), before);
}

#[test]
fn a_symlink_to_a_directory_outside_is_refused_at_any_depth() {
    let s = Setup::new();
    let before = s.outside_snapshot();
    fs::create_dir_all(s.in_ws("a/b/c")).unwrap();
    symlink(&s.outside, s.in_ws("a/b/c/escape"));
    symlink("../../../../outside", s.in_ws("a/b/c/rel-escape"));
    for dir in ["a/b/c/escape", "a/b/c/rel-escape"] {
        assert_outside(s.ws.read(&format!("{dir}/secret")));
        assert_outside(s.ws.read(&format!("{dir}/sub/deeper")));
        assert_outside(s.ws.open_dir(dir));
        assert_outside(s.ws.write(&format!("{dir}/new.txt"), b"x"));
        assert_outside(s.ws.write(&format!("{dir}/sub/new.txt"), b"x"));
        assert_outside(s.ws.write(&format!("{dir}/fresh/dirs/new.txt"), b"x"));
    }
    // A walk from the root lists the links without entering them.
    let root = s.ws.open_dir(".").unwrap();
    let a = root.entries().unwrap();
    let b = root.open_child(&a[0]).unwrap();
    let c = b.open_child(&b.entries().unwrap()[0]).unwrap();
    let c = c.open_child(&c.entries().unwrap()[0]).unwrap();
    for entry in c.entries().unwrap() {
        assert!(c.open_child(&entry).is_err(), "{entry:?} was entered");
    }
    assert_eq!(s.outside_snapshot(), before);
}

#[test]
fn a_symlink_loop_is_reported_not_followed() {
    let s = Setup::new();
    symlink("loop-b", s.in_ws("loop-a"));
    symlink("loop-a", s.in_ws("loop-b"));
    symlink("self", s.in_ws("self"));
    for path in ["loop-a", "self", "self/x"] {
        let result = within(Duration::from_secs(5), {
            let ws = s.ws.clone();
            move || ws.read(path)
        });
        assert!(
            matches!(result, Err(JailError::SymlinkLoop { .. })),
            "{path}: {result:?}"
        );
    }
    assert!(matches!(
        s.ws.write("loop-a/x.txt", b"x"),
        Err(JailError::SymlinkLoop { .. })
    ));
}

#[test]
fn proc_self_root_and_cwd_are_refused() {
    let s = Setup::new();
    for path in [
        "/proc/self/root/etc/passwd",
        "/proc/self/cwd",
        "/proc/self/cwd/Cargo.toml",
    ] {
        assert_outside(s.ws.read(path));
        assert_outside(s.ws.open_dir(path));
    }
    // The same places reached through symlinks planted in the workspace.
    symlink("/proc/self/root/etc/passwd", s.in_ws("root-link"));
    symlink("/proc/self/cwd", s.in_ws("cwd-link"));
    symlink(
        "../../../../../../../../proc/self/root/etc",
        s.in_ws("rel-proc"),
    );
    assert_outside(s.ws.read("root-link"));
    assert_outside(s.ws.read("cwd-link/Cargo.toml"));
    assert_outside(s.ws.open_dir("cwd-link"));
    assert_outside(s.ws.read("rel-proc/passwd"));
    assert_outside(s.ws.write("cwd-link/toolexec-test.txt", b"x"));
    assert!(
        !std::env::current_dir()
            .unwrap()
            .join("toolexec-test.txt")
            .exists()
    );
}

#[test]
fn nul_bytes_and_over_long_names_are_invalid_and_create_nothing() {
    let s = Setup::new();
    let long_name = "n".repeat(256);
    let long_path = format!("{}/x", "d/".repeat(2048));
    for path in ["a\0b", "\0", &long_name, &long_path, ""] {
        assert!(
            matches!(s.ws.read(path), Err(JailError::InvalidPath { .. })),
            "{path:?}"
        );
        assert!(
            matches!(s.ws.write(path, b"x"), Err(JailError::InvalidPath { .. })),
            "{path:?}"
        );
    }
    assert_eq!(fs::read_dir(&s.ws_root).unwrap().count(), 0);
}

#[test]
fn a_fifo_is_refused_without_hanging() {
    let s = Setup::new();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        s.in_ws("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    symlink("pipe", s.in_ws("pipe-link"));
    for path in ["pipe", "pipe-link"] {
        let ws = s.ws.clone();
        let result = within(Duration::from_secs(5), move || ws.read(path));
        assert!(
            matches!(result, Err(JailError::NotARegularFile { .. })),
            "{path}: {result:?}"
        );
    }
    for path in ["pipe", "pipe-link"] {
        let ws = s.ws.clone();
        let result = within(Duration::from_secs(5), move || {
            ws.read_if_small(path, 1 << 16)
        });
        assert!(
            matches!(result, Err(JailError::NotARegularFile { .. })),
            "read_if_small {path}: {result:?}"
        );
    }
    let ws = s.ws;
    let result = within(Duration::from_secs(5), move || ws.write("pipe", b"x"));
    assert!(matches!(result, Err(JailError::NotARegularFile { .. })));
}

#[test]
fn a_unix_socket_is_refused() {
    let s = Setup::new();
    let _listener = std::os::unix::net::UnixListener::bind(s.in_ws("sock")).unwrap();
    let ws = s.ws.clone();
    let result = within(Duration::from_secs(5), move || ws.read("sock"));
    assert!(
        matches!(result, Err(JailError::NotARegularFile { kind, .. }) if kind.contains("socket"))
    );
    assert!(matches!(
        s.ws.write("sock", b"x"),
        Err(JailError::NotARegularFile { .. })
    ));
}

#[test]
fn a_hard_link_to_an_outside_file_is_not_read_and_a_write_replaces_the_link() {
    let s = Setup::new();
    fs::hard_link(s.outside.join("secret"), s.in_ws("planted")).unwrap();
    let before = s.outside_snapshot();

    let read = s.ws.read("planted");
    assert!(matches!(read, Err(JailError::HardLink { .. })), "{read:?}");

    let written = s.ws.write("planted", b"replacement").unwrap();
    assert!(matches!(
        written.before,
        Before::Unread {
            reason: UnreadReason::HardLink,
            ..
        }
    ));
    assert_eq!(
        written.before.sha256(),
        None,
        "the outside bytes were not read"
    );
    assert_eq!(
        s.outside_snapshot(),
        before,
        "the outside file is unchanged"
    );
    assert_eq!(fs::read(s.in_ws("planted")).unwrap(), b"replacement");
    assert_eq!(fs::metadata(s.in_ws("planted")).unwrap().nlink(), 1);
    assert_eq!(fs::metadata(s.outside.join("secret")).unwrap().nlink(), 1);
}

#[test]
fn a_workspace_named_s1_cannot_reach_its_sibling_s10() {
    let tmp = tempfile::tempdir().unwrap();
    let s1 = tmp.path().join("s1");
    let s10 = tmp.path().join("s10");
    fs::create_dir_all(&s10).unwrap();
    fs::write(s10.join("x"), SECRET).unwrap();
    let ws = Workspace::create(&s1).unwrap();
    let before = snapshot(&s10);
    assert_outside(ws.read("../s10/x"));
    assert_outside(ws.open_dir("../s10"));
    assert_outside(ws.write("../s10/x", b"overwritten"));
    assert_outside(ws.write("../s10/y", b"created"));
    assert_outside(ws.read(s10.join("x").to_str().unwrap()));
    assert_eq!(snapshot(&s10), before);
}

#[test]
fn writing_through_a_symlinked_parent_directory_that_points_outside_is_refused() {
    let s = Setup::new();
    let before = s.outside_snapshot();
    symlink(&s.outside, s.in_ws("out"));
    fs::create_dir(s.in_ws("inner")).unwrap();
    symlink("../out", s.in_ws("inner/via"));
    for path in [
        "out/new.txt",
        "out/secret",
        "out/sub/new.txt",
        "out/made/up/dirs/new.txt",
        "inner/via/new.txt",
        "/workspace/out/secret",
    ] {
        assert_outside(s.ws.write(path, b"x"));
    }
    assert_eq!(s.outside_snapshot(), before);
}

#[test]
fn writing_to_a_symlink_is_refused_even_when_it_points_inside() {
    let s = Setup::new();
    fs::write(s.in_ws("real.txt"), "original").unwrap();
    symlink("real.txt", s.in_ws("link.txt"));
    symlink("missing.txt", s.in_ws("dangling.txt"));
    for path in ["link.txt", "dangling.txt"] {
        assert!(
            matches!(
                s.ws.write(path, b"x"),
                Err(JailError::NotARegularFile { kind, .. }) if kind.contains("symbolic link")
            ),
            "{path}"
        );
    }
    assert_eq!(fs::read(s.in_ws("real.txt")).unwrap(), b"original");
    assert!(!s.in_ws("missing.txt").exists());
}

#[test]
fn symlinks_that_stay_inside_are_followed_for_reads() {
    let s = Setup::new();
    fs::create_dir(s.in_ws("sub")).unwrap();
    fs::write(s.in_ws("sub/file.txt"), "inside").unwrap();
    symlink("sub/file.txt", s.in_ws("link"));
    symlink("sub", s.in_ws("dir-link"));
    let read = s.ws.read("link").unwrap();
    assert_eq!(read.bytes, b"inside");
    assert_eq!(read.path, "sub/file.txt");
    assert_eq!(s.ws.read("dir-link/file.txt").unwrap().bytes, b"inside");
}

#[test]
fn an_absolute_symlink_is_refused_even_when_it_points_inside() {
    // RESOLVE_BENEATH refuses any absolute symlink: the kernel does not check where it lands.
    let s = Setup::new();
    fs::write(s.in_ws("real.txt"), "inside").unwrap();
    symlink(s.in_ws("real.txt"), s.in_ws("abs-inside"));
    assert_outside(s.ws.read("abs-inside"));
}

#[test]
fn a_huge_sparse_file_is_refused_quickly() {
    let s = Setup::new();
    let file = fs::File::create(s.in_ws("huge.bin")).unwrap();
    file.set_len(100 * 1024 * 1024 * 1024).unwrap();
    drop(file);
    let started = Instant::now();
    let result = s.ws.read("huge.bin");
    assert!(
        matches!(result, Err(JailError::TooLarge { size, .. }) if size == 100 << 30),
        "{result:?}"
    );
    // Overwriting it does not read it either.
    let written = s.ws.write("huge.bin", b"small now").unwrap();
    assert!(matches!(
        written.before,
        Before::Unread {
            reason: UnreadReason::TooLarge,
            ..
        }
    ));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_file_swapped_for_an_outside_symlink_during_reads_never_leaks() {
    let s = Setup::new();
    fs::write(s.in_ws("flip"), "harmless").unwrap();
    symlink(s.outside.join("secret"), s.in_ws("flip.alt"));
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = swapper(stop.clone(), s.in_ws("flip"), s.in_ws("flip.alt"));
    let (mut reads, mut refused) = (0, 0);
    // At least 3000 tries, and on until both states were seen: under a loaded test run the
    // swapper thread can be starved for a while.
    let deadline = Instant::now() + RACE_DEADLINE;
    let mut tries = 0;
    while tries < 3000 || ((reads == 0 || refused == 0) && Instant::now() < deadline) {
        tries += 1;
        match s.ws.read("flip") {
            Ok(file) => {
                assert_eq!(file.bytes, b"harmless");
                reads += 1;
            }
            Err(JailError::OutsideWorkspace { .. }) => refused += 1,
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    assert!(
        reads > 0 && refused > 0,
        "the race did not hit both states ({reads} reads, {refused} refusals); it proved nothing"
    );
}

#[test]
fn a_directory_swapped_for_an_outside_symlink_during_writes_never_escapes() {
    let s = Setup::new();
    let before = s.outside_snapshot();
    fs::create_dir(s.in_ws("d")).unwrap();
    symlink(&s.outside, s.in_ws("d.alt"));
    let stop = Arc::new(AtomicBool::new(false));
    let flipper = swapper(stop.clone(), s.in_ws("d"), s.in_ws("d.alt"));
    let (mut written, mut refused) = (0, 0);
    let deadline = Instant::now() + RACE_DEADLINE;
    let mut n = 0;
    while n < 2000 || ((written == 0 || refused == 0) && Instant::now() < deadline) {
        n += 1;
        match s.ws.write(&format!("d/new-{n}.txt"), b"x") {
            Ok(_) => written += 1,
            Err(JailError::OutsideWorkspace { .. }) => refused += 1,
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    assert_eq!(
        s.outside_snapshot(),
        before,
        "something was written outside"
    );
    assert!(
        written > 0 && refused > 0,
        "the race did not hit both states ({written} writes, {refused} refusals); it proved nothing"
    );
}

#[test]
fn deleting_outside_through_dot_dot_or_symlinked_directories_is_refused() {
    let s = Setup::new();
    let before = s.outside_snapshot();
    symlink(&s.outside, s.in_ws("out"));
    symlink("../outside", s.in_ws("rel-out"));
    for path in [
        "../outside/secret",
        "/workspace/../outside/secret",
        "out/secret",
        "rel-out/sub/deeper",
        &s.outside_str("secret"),
    ] {
        assert_outside(s.ws.remove_file(path));
    }
    assert_eq!(s.outside_snapshot(), before);
}

#[test]
fn deleting_a_symlink_to_an_outside_file_removes_nothing_outside() {
    let s = Setup::new();
    let before = s.outside_snapshot();
    symlink(s.outside.join("secret"), s.in_ws("link"));
    let result = s.ws.remove_file("link");
    assert!(
        matches!(result, Err(JailError::NotARegularFile { kind, .. }) if kind.contains("symbolic link")),
        "{result:?}"
    );
    assert!(
        fs::symlink_metadata(s.in_ws("link")).is_ok(),
        "the link stays"
    );
    assert_eq!(s.outside_snapshot(), before);
}

#[test]
fn deleting_a_directory_a_fifo_or_the_root_is_refused() {
    let s = Setup::new();
    fs::create_dir_all(s.in_ws("dir/inner")).unwrap();
    fs::write(s.in_ws("dir/inner/f"), "x").unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        s.in_ws("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    for path in ["dir", "dir/inner", ".", "/workspace", "dir/.."] {
        assert!(
            matches!(s.ws.remove_file(path), Err(JailError::IsADirectory { .. })),
            "{path}"
        );
    }
    let ws = s.ws.clone();
    let result = within(Duration::from_secs(5), move || ws.remove_file("pipe"));
    assert!(matches!(result, Err(JailError::NotARegularFile { .. })));
    assert!(s.in_ws("dir/inner/f").exists());
    assert!(s.in_ws("pipe").exists());
}

#[test]
fn deleting_a_hard_link_to_an_outside_file_leaves_the_outside_file() {
    let s = Setup::new();
    fs::hard_link(s.outside.join("secret"), s.in_ws("planted")).unwrap();
    let removed = s.ws.remove_file("planted").unwrap();
    assert!(matches!(
        removed.before,
        Before::Unread {
            reason: UnreadReason::HardLink,
            ..
        }
    ));
    assert!(!s.in_ws("planted").exists());
    assert_eq!(fs::read(s.outside.join("secret")).unwrap(), SECRET);
}

#[test]
fn copying_from_or_to_outside_is_refused() {
    let s = Setup::new();
    let before = s.outside_snapshot();
    fs::write(s.in_ws("inside.txt"), "inside").unwrap();
    symlink(&s.outside, s.in_ws("out"));
    let keep = 1024;
    let allow = |_: &str, _: &Before| Ok::<(), ()>(());
    for source in ["../outside/secret", "out/secret", &s.outside_str("secret")] {
        assert_outside(s.ws.copy_file_if(source, "copied.txt", keep, allow));
    }
    for dest in [
        "../outside/new",
        "out/new",
        "out/secret",
        &s.outside_str("x"),
    ] {
        assert_outside(s.ws.copy_file_if("inside.txt", dest, keep, allow));
    }
    assert!(!s.in_ws("copied.txt").exists());
    assert_eq!(s.outside_snapshot(), before);
}

#[test]
fn copying_a_hard_link_to_an_outside_file_is_refused() {
    let s = Setup::new();
    fs::hard_link(s.outside.join("secret"), s.in_ws("planted")).unwrap();
    let result =
        s.ws.copy_file_if("planted", "copy", 1024, |_, _| Ok::<(), ()>(()));
    assert!(
        matches!(result, Err(JailError::HardLink { .. })),
        "{result:?}"
    );
    assert!(!s.in_ws("copy").exists());
}
