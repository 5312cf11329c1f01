#![allow(
    clippy::disallowed_methods,
    reason = "tests build their fixtures on the host"
)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::*;

mod budgets;
mod watcher;

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    ws: Workspace,
}

impl Fixture {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("secret"), SECRET).unwrap();
        let ws = Workspace::create(&root).unwrap();
        Self {
            _tmp: tmp,
            root,
            outside,
            ws,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn write(&self, rel: &str, contents: &[u8]) {
        let path = self.path(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
    }

    fn rescan(&self, snapshot: &mut Snapshot) -> ScanReport {
        snapshot.rescan(&self.ws, 1024).unwrap()
    }
}

const SECRET: &[u8] = b"TOP SECRET: outside the workspace\n";

fn kinds(report: &ScanReport) -> Vec<(FileChangeKind, &str)> {
    report
        .changes
        .iter()
        .map(|c| (c.change.kind, c.change.path.as_str()))
        .collect()
}

fn change<'a>(report: &'a ScanReport, path: &str) -> &'a RecordedChange {
    report
        .changes
        .iter()
        .find(|c| c.change.path == path)
        .unwrap_or_else(|| panic!("no change at {path}: {:?}", kinds(report)))
}

/// Lets the racy window of everything written so far pass, so the next scan trusts it.
fn settle() {
    std::thread::sleep(RACY_MARGIN + Duration::from_millis(30));
}

use FileChangeKind::{Created, Deleted, Modified};

#[test]
fn a_capture_reports_nothing_and_a_rescan_reports_created_modified_and_deleted_files() {
    let f = Fixture::new();
    f.write("keep.txt", b"same");
    f.write("edit.txt", b"old contents");
    f.write("gone.txt", b"bye");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    assert_eq!(snapshot.len(), 3);

    f.write("new.txt", b"hello");
    f.write("edit.txt", b"new contents, longer");
    fs::remove_file(f.path("gone.txt")).unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(
        kinds(&report),
        [
            (Modified, "edit.txt"),
            (Deleted, "gone.txt"),
            (Created, "new.txt")
        ]
    );
    assert_eq!(report.files, 3);

    let edit = change(&report, "edit.txt");
    assert_eq!(
        edit.change.before_sha256.as_deref(),
        Some(sha256_hex(b"old contents").as_str())
    );
    assert_eq!(
        edit.change.after_sha256.as_deref(),
        Some(sha256_hex(b"new contents, longer").as_str())
    );
    assert_eq!(edit.change.before_size, Some(12));
    assert_eq!(edit.change.after_size, Some(20));
    assert!(edit.change.after_stored);
    assert_eq!(edit.after.as_deref(), Some(&b"new contents, longer"[..]));
    assert_eq!(edit.change.capability, Capability::Process);
    assert_eq!(edit.change.symlink_target, None);

    let gone = change(&report, "gone.txt");
    assert_eq!(
        gone.change.before_sha256.as_deref(),
        Some(sha256_hex(b"bye").as_str())
    );
    assert_eq!(gone.change.after_sha256, None);
    assert_eq!(gone.change.after_size, None);
    assert!(!gone.change.after_stored);
    assert_eq!(gone.after, None);

    let new = change(&report, "new.txt");
    assert_eq!(new.change.before_sha256, None);
    assert_eq!(new.after.as_deref(), Some(&b"hello"[..]));

    // Nothing changed since: nothing reported.
    assert!(f.rescan(&mut snapshot).changes.is_empty());
}

#[test]
fn an_empty_snapshot_reports_every_file_as_created() {
    let f = Fixture::new();
    f.write("a", b"1");
    f.write("d/b", b"2");
    let mut snapshot = Snapshot::default();
    let report = f.rescan(&mut snapshot);
    assert_eq!(kinds(&report), [(Created, "a"), (Created, "d/b")]);
}

#[test]
fn a_rename_is_a_deletion_and_a_creation_of_the_same_contents() {
    let f = Fixture::new();
    f.write("src/old.rs", b"fn main() {}\n");
    f.write("dir1/x", b"x");
    f.write("dir1/sub/y", b"y");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    fs::rename(f.path("src/old.rs"), f.path("src/new.rs")).unwrap();
    fs::rename(f.path("dir1"), f.path("dir2")).unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(
        kinds(&report),
        [
            (Deleted, "dir1/sub/y"),
            (Deleted, "dir1/x"),
            (Created, "dir2/sub/y"),
            (Created, "dir2/x"),
            (Created, "src/new.rs"),
            (Deleted, "src/old.rs"),
        ]
    );
    assert_eq!(
        change(&report, "src/old.rs").change.before_sha256,
        change(&report, "src/new.rs").change.after_sha256
    );
}

#[test]
fn nested_directories_are_walked_and_removing_one_deletes_its_files() {
    let f = Fixture::new();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    f.write("a/b/c/d/deep.txt", b"deep");
    f.write("a/b/mid.txt", b"mid");
    f.write(".git/objects/ab/cdef", b"object");
    f.write("node_modules/pkg/index.js", b"js");
    f.write("target/debug/app", b"\x7fELF");
    fs::create_dir_all(f.path("empty/dir")).unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(
        kinds(&report),
        [
            (Created, ".git/objects/ab/cdef"),
            (Created, "a/b/c/d/deep.txt"),
            (Created, "a/b/mid.txt"),
            (Created, "node_modules/pkg/index.js"),
            (Created, "target/debug/app"),
        ]
    );
    fs::remove_dir_all(f.path("a")).unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(
        kinds(&report),
        [(Deleted, "a/b/c/d/deep.txt"), (Deleted, "a/b/mid.txt")]
    );
}

#[test]
fn symlinks_are_recorded_by_their_target_text_and_never_followed() {
    let f = Fixture::new();
    f.write("sub/f", b"in sub");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    symlink("target.txt", f.path("dangling")).unwrap();
    symlink(&f.outside, f.path("out")).unwrap();
    symlink(f.outside.join("secret"), f.path("secret")).unwrap();
    symlink("sub", f.path("alias")).unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(
        kinds(&report),
        [
            (Created, "alias"),
            (Created, "dangling"),
            (Created, "out"),
            (Created, "secret"),
        ]
    );
    let dangling = change(&report, "dangling");
    assert_eq!(
        dangling.change.symlink_target.as_deref(),
        Some("target.txt")
    );
    assert_eq!(
        dangling.change.after_sha256.as_deref(),
        Some(sha256_hex(b"target.txt").as_str())
    );
    assert_eq!(dangling.change.after_size, Some(10));
    assert_eq!(dangling.after.as_deref(), Some(&b"target.txt"[..]));
    let secret = change(&report, "secret");
    let target = f.outside.join("secret");
    assert_eq!(secret.change.symlink_target.as_deref(), target.to_str());
    assert_ne!(secret.after.as_deref(), Some(SECRET));

    // Retargeted (a new symlink renamed over the old one), then removed.
    symlink("other.txt", f.path("tmp-link")).unwrap();
    fs::rename(f.path("tmp-link"), f.path("dangling")).unwrap();
    fs::remove_file(f.path("alias")).unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(kinds(&report), [(Deleted, "alias"), (Modified, "dangling")]);
    let retargeted = change(&report, "dangling");
    assert_eq!(
        retargeted.change.before_sha256.as_deref(),
        Some(sha256_hex(b"target.txt").as_str())
    );
    assert_eq!(
        retargeted.change.after_sha256.as_deref(),
        Some(sha256_hex(b"other.txt").as_str())
    );
    assert_eq!(
        retargeted.change.symlink_target.as_deref(),
        Some("other.txt")
    );
    let alias = change(&report, "alias");
    assert_eq!(alias.change.symlink_target, None);
    assert_eq!(
        alias.change.before_sha256.as_deref(),
        Some(sha256_hex(b"sub").as_str())
    );
}

#[test]
fn a_file_replaced_by_a_directory_and_back_and_by_a_symlink() {
    let f = Fixture::new();
    f.write("a", b"file a");
    f.write("b/y", b"y");
    f.write("b/z", b"z");
    f.write("c/f", b"f");
    f.write("d", b"file d");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    fs::remove_file(f.path("a")).unwrap();
    f.write("a/x", b"x");
    fs::remove_dir_all(f.path("b")).unwrap();
    f.write("b", b"file b");
    fs::remove_dir_all(f.path("c")).unwrap();
    symlink("elsewhere", f.path("c")).unwrap();
    fs::remove_file(f.path("d")).unwrap();
    symlink("a/x", f.path("d")).unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(
        kinds(&report),
        [
            (Deleted, "a"),
            (Created, "a/x"),
            (Created, "b"),
            (Deleted, "b/y"),
            (Deleted, "b/z"),
            (Created, "c"),
            (Deleted, "c/f"),
            (Modified, "d"),
        ]
    );
    let d = change(&report, "d");
    assert_eq!(
        d.change.before_sha256.as_deref(),
        Some(sha256_hex(b"file d").as_str())
    );
    assert_eq!(d.change.symlink_target.as_deref(), Some("a/x"));
    assert_eq!(
        change(&report, "c").change.symlink_target.as_deref(),
        Some("elsewhere")
    );

    // And a symlink replaced by a regular file.
    fs::remove_file(f.path("d")).unwrap();
    f.write("d", b"file d again");
    let report = f.rescan(&mut snapshot);
    assert_eq!(kinds(&report), [(Modified, "d")]);
    assert_eq!(change(&report, "d").change.symlink_target, None);
    assert_eq!(
        change(&report, "d").after.as_deref(),
        Some(&b"file d again"[..])
    );
}

#[test]
fn a_same_size_rewrite_right_after_a_scan_is_still_seen() {
    let f = Fixture::new();
    f.write("racy.txt", b"aaaa");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    // In place (same inode), same size, at once: the mtime and ctime may well be the ones
    // the capture saw, since the kernel stamps files from a coarse clock.
    fs::write(f.path("racy.txt"), b"bbbb").unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(kinds(&report), [(Modified, "racy.txt")]);
    assert_eq!(
        change(&report, "racy.txt").after.as_deref(),
        Some(&b"bbbb"[..])
    );
    fs::write(f.path("racy.txt"), b"cccc").unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(kinds(&report), [(Modified, "racy.txt")]);
    assert_eq!(
        change(&report, "racy.txt").change.after_sha256.as_deref(),
        Some(sha256_hex(b"cccc").as_str())
    );
}

#[test]
fn racily_clean_metadata_is_not_trusted_but_settled_metadata_is() {
    let f = Fixture::new();
    f.write("racy.txt", b"aaaa");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    fs::write(f.path("racy.txt"), b"bbbb").unwrap();
    // Pretend the rewrite kept every timestamp (a coarse clock that did not tick): the
    // recorded metadata now matches the file exactly.
    let now = f.ws.open_dir_exact(b"").unwrap();
    let entry = now
        .entries()
        .unwrap()
        .into_iter()
        .find(|e| e.name == "racy.txt")
        .unwrap();
    let current = Meta::from(&now.stat_child(&entry).unwrap());
    let record = snapshot.entries.get_mut(&b"racy.txt"[..]).unwrap();
    record.meta = current;
    let mut trusting = snapshot.clone();

    // The file was stamped within the margin of the capture's start: hashed again.
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.hashed, 1);
    assert_eq!(kinds(&report), [(Modified, "racy.txt")]);

    // Had the capture started well after the file's timestamps, the metadata would be
    // trusted: that is what the racy check guards against.
    trusting.started_ns = now_ns() + 3_600_000_000_000;
    let report = f.rescan(&mut trusting);
    assert_eq!(report.hashed, 0);
    assert!(report.changes.is_empty());
}

#[test]
fn a_touch_rehashes_but_reports_nothing_and_a_chmod_is_a_modification() {
    use std::os::unix::fs::PermissionsExt;
    let f = Fixture::new();
    f.write("a.txt", b"contents");
    settle();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    let file = fs::File::options()
        .write(true)
        .open(f.path("a.txt"))
        .unwrap();
    file.set_modified(SystemTime::now()).unwrap();
    drop(file);
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.hashed, 1);
    assert!(report.changes.is_empty());
    // The mode is part of what a rebuild restores: a chmod alone is recorded.
    fs::set_permissions(f.path("a.txt"), fs::Permissions::from_mode(0o755)).unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(kinds(&report), [(Modified, "a.txt")]);
    let c = &report.changes[0].change;
    assert_eq!(c.after_mode, Some(0o755));
    assert_eq!(c.before_sha256, c.after_sha256);
}

#[test]
fn hard_linked_files_are_recorded_without_being_read() {
    let f = Fixture::new();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    fs::hard_link(f.outside.join("secret"), f.path("planted")).unwrap();
    f.write("twin1", b"inside");
    fs::hard_link(f.path("twin1"), f.path("twin2")).unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(
        kinds(&report),
        [(Created, "planted"), (Created, "twin1"), (Created, "twin2")]
    );
    assert_eq!(report.hashed, 0);
    for c in &report.changes {
        assert_eq!(c.change.after_sha256, None, "{}", c.change.path);
        assert_eq!(c.after, None);
        assert!(!c.change.after_stored);
        assert_eq!(c.change.after_unstored, Some(UnstoredReason::HardLink));
    }
    assert_eq!(
        change(&report, "planted").change.after_size,
        Some(SECRET.len() as u64)
    );

    // The outside file changes: the link is reported modified, still unread.
    settle();
    let _ = f.rescan(&mut snapshot);
    fs::write(f.outside.join("secret"), b"changed outside").unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(kinds(&report), [(Modified, "planted")]);
    let planted = change(&report, "planted");
    assert_eq!(planted.change.before_sha256, None);
    assert_eq!(planted.change.after_sha256, None);
    assert_eq!(planted.after, None);

    // Down to one link: now it is read.
    fs::remove_file(f.path("twin2")).unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(kinds(&report), [(Modified, "twin1"), (Deleted, "twin2")]);
    assert_eq!(
        change(&report, "twin1").after.as_deref(),
        Some(&b"inside"[..])
    );
}

#[test]
fn fifos_and_sockets_are_ignored_and_never_opened() {
    let f = Fixture::new();
    f.write("was-a-file", b"x");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        f.path("pipe").as_path(),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(f.path("sock")).unwrap();
    fs::remove_file(f.path("was-a-file")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        f.path("was-a-file").as_path(),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    // Opening the FIFO for reading would block forever: the scan returning is the test.
    let report = f.rescan(&mut snapshot);
    assert_eq!(kinds(&report), [(Deleted, "was-a-file")]);
    assert_eq!(report.files, 0);
}

#[test]
fn contents_are_kept_up_to_the_limit_and_bigger_files_are_hashed_streaming() {
    let f = Fixture::new();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    let big: Vec<u8> = (0..3 * 256 * 1024 + 17).map(|i| (i % 251) as u8).collect();
    f.write("big.bin", &big);
    f.write("exact.bin", &[7u8; 1024]);
    f.write("over.bin", &[7u8; 1025]);
    f.write("empty", b"");
    let report = snapshot.rescan(&f.ws, 1024).unwrap();
    let big_change = change(&report, "big.bin");
    assert_eq!(
        big_change.change.after_sha256.as_deref(),
        Some(sha256_hex(&big).as_str())
    );
    assert_eq!(big_change.change.after_size, Some(big.len() as u64));
    assert!(!big_change.change.after_stored);
    assert_eq!(
        big_change.change.after_unstored,
        Some(UnstoredReason::TooLarge)
    );
    assert_eq!(big_change.after, None);
    assert_eq!(
        change(&report, "exact.bin").after.as_deref(),
        Some(&[7u8; 1024][..])
    );
    let over = change(&report, "over.bin");
    assert_eq!(over.after, None);
    assert_eq!(
        over.change.after_sha256.as_deref(),
        Some(sha256_hex(&[7u8; 1025]).as_str())
    );
    let empty = change(&report, "empty");
    assert_eq!(empty.after.as_deref(), Some(&b""[..]));
    assert!(empty.change.after_stored);
    assert_eq!(empty.change.after_unstored, None);
    assert_eq!(report.hashed, 4);
}

#[test]
fn names_that_are_not_utf8_are_recorded_exactly() {
    use std::os::unix::ffi::OsStrExt;
    let raw = |bytes: &[u8]| std::ffi::OsStr::from_bytes(bytes).to_owned();
    let f = Fixture::new();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    fs::write(f.root.join(raw(b"bad\xff")), b"ff").unwrap();
    fs::write(f.root.join(raw(b"bad\xfe")), b"fe").unwrap();
    // Spelled like the display form of the first, but UTF-8: a third, distinct name.
    fs::write(f.path("bad\\xff"), b"literal").unwrap();
    symlink(raw(b"caf\xe9"), f.root.join(raw(b"dir\x80link"))).unwrap();
    let report = f.rescan(&mut snapshot);
    let names: Vec<_> = report
        .changes
        .iter()
        .map(|c| {
            let c = &c.change;
            (c.path.as_str(), c.path_b64.as_deref())
        })
        .collect();
    // In byte order of the raw names.
    assert_eq!(
        names,
        [
            ("bad\\xff", None),
            ("bad\\xfe", Some("YmFk/g==")),
            ("bad\\xff", Some("YmFk/w==")),
            ("dir\\x80link", Some("ZGlygGxpbms=")),
        ]
    );
    assert_eq!(
        report.changes[1].after.as_deref(),
        Some(&b"fe"[..]),
        "each keeps its own contents"
    );
    let link = &report.changes[3];
    assert_eq!(link.change.symlink_target.as_deref(), Some("caf\\xe9"));
    assert_eq!(link.change.symlink_target_b64.as_deref(), Some("Y2Fm6Q=="));
    assert_eq!(link.after.as_deref(), Some(&b"caf\xe9"[..]));
    // Written as UTF-8: no base64 beside the names.
    fs::remove_file(f.root.join(raw(b"dir\x80link"))).unwrap();
    symlink("plain", f.path("link")).unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(
        kinds(&report),
        [(Deleted, "dir\\x80link"), (Created, "link")]
    );
    let json = serde_json::to_value(&report.changes[1].change).unwrap();
    assert_eq!(json["symlink_target"], "plain");
    assert!(json.get("path_b64").is_none() && json.get("symlink_target_b64").is_none());
    assert_eq!(
        serde_json::to_value(&report.changes[0].change).unwrap()["path_b64"],
        "ZGlygGxpbms="
    );
}
