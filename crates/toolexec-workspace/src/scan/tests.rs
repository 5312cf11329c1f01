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

/// A budget of `content` bytes of contents (files up to 1 KiB) and `hash` bytes hashed.
fn budget(content: u64, hash: u64) -> ScanBudget {
    ScanBudget {
        content_bytes: content,
        hash_bytes: hash,
        ..ScanBudget::unlimited(1024)
    }
}

fn unstored(report: &ScanReport, path: &str) -> Option<UnstoredReason> {
    change(report, path).change.after_unstored
}

#[test]
fn past_the_content_budget_files_are_hashed_only_and_the_smallest_are_kept() {
    let f = Fixture::new();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    // Found in byte order of their names (the events of one directory): larger files
    // first, then smaller ones that take their place.
    f.write("a-900", &[1u8; 900]);
    f.write("b-800", &[2u8; 800]);
    f.write("c-2000", &[3u8; 2000]);
    f.write("d-300", &[4u8; 300]);
    f.write("e-300", &[5u8; 300]);
    f.write("f-0", b"");
    f.write("g-1000", &[6u8; 1000]);
    let report = snapshot
        .rescan_within(&f.ws, &budget(1500, u64::MAX))
        .unwrap();
    // 900 + 800 do not fit: the 800 takes the place of the 900; the 300s and the empty file
    // fit beside it; the 1000 does not, and nothing kept is larger. Over 1 KiB: too large.
    let kept: Vec<&str> = report
        .changes
        .iter()
        .filter(|c| c.after.is_some())
        .map(|c| c.change.path.as_str())
        .collect();
    assert_eq!(kept, ["b-800", "d-300", "e-300", "f-0"]);
    assert_eq!(report.kept_bytes, 1400);
    assert_eq!(
        unstored(&report, "a-900"),
        Some(UnstoredReason::ContentBudget)
    );
    assert_eq!(
        unstored(&report, "g-1000"),
        Some(UnstoredReason::ContentBudget)
    );
    assert_eq!(unstored(&report, "c-2000"), Some(UnstoredReason::TooLarge));
    for c in &report.changes {
        // Every file is hashed all the same, and says whether its contents are stored.
        assert!(c.change.after_sha256.is_some(), "{}", c.change.path);
        assert_eq!(c.change.after_stored, c.after.is_some());
        assert_eq!(c.change.after_unstored.is_none(), c.after.is_some());
    }
    let a = change(&report, "a-900");
    assert_eq!(
        a.change.after_sha256.as_deref(),
        Some(sha256_hex(&[1u8; 900]).as_str())
    );
    assert_eq!(a.change.after_size, Some(900));
    let json = serde_json::to_value(&a.change).unwrap();
    assert_eq!(json["after_unstored"], "content_budget");
    assert_eq!(json["after_stored"], false);

    // A budget per scan: the next one keeps contents again.
    f.write("a-900", &[7u8; 900]);
    let report = snapshot
        .rescan_within(&f.ws, &budget(1500, u64::MAX))
        .unwrap();
    assert_eq!(kinds(&report), [(Modified, "a-900")]);
    assert_eq!(
        report.changes[0].after.as_deref(),
        Some(&[7u8; 900][..]),
        "{:?}",
        report.changes[0].change
    );
}

#[test]
fn past_the_hash_budget_files_are_recorded_by_metadata_and_later_changes_still_found() {
    let f = Fixture::new();
    f.write("old", b"old contents");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    f.write("a", &[1u8; 6000]);
    f.write("b", &[2u8; 6000]);
    f.write("c", &[3u8; 3000]);
    f.write("old", &[4u8; 5000]);
    let report = snapshot
        .rescan_within(&f.ws, &budget(u64::MAX, 10_000))
        .unwrap();
    assert!(report.hashed_bytes <= 10_000, "{}", report.hashed_bytes);
    assert_eq!(report.hashed_bytes, 9000);
    assert_eq!(
        kinds(&report),
        [
            (Created, "a"),
            (Created, "b"),
            (Created, "c"),
            (Modified, "old")
        ]
    );
    // a and c fit; b and old did not.
    for (path, hashed) in [("a", true), ("b", false), ("c", true), ("old", false)] {
        let c = change(&report, path);
        assert_eq!(c.change.after_sha256.is_some(), hashed, "{path}");
        assert_eq!(c.after, None, "over 1 KiB: {path}");
        let why = if hashed {
            UnstoredReason::TooLarge
        } else {
            UnstoredReason::HashBudget
        };
        assert_eq!(c.change.after_unstored, Some(why), "{path}");
    }
    let old = change(&report, "old");
    assert_eq!(
        old.change.before_sha256.as_deref(),
        Some(sha256_hex(b"old contents").as_str())
    );
    assert_eq!(old.change.after_size, Some(5000));

    // Not read again while their metadata stays the same, even racily clean: the budget
    // is not spent on them at every scan, and nothing is reported. (The racily clean files
    // that were hashed are hashed again, and found unchanged.)
    let report = f.rescan(&mut snapshot);
    assert!(report.changes.is_empty(), "{:?}", kinds(&report));
    assert_eq!(report.hashed_bytes, 9000);
    // A later change is found by the metadata, and read when the budget allows.
    settle();
    f.write("b", &[9u8; 6001]);
    let report = f.rescan(&mut snapshot);
    assert_eq!(kinds(&report), [(Modified, "b")]);
    let b = change(&report, "b");
    assert_eq!(b.change.before_sha256, None);
    assert_eq!(b.change.before_size, Some(6000));
    assert_eq!(
        b.change.after_sha256.as_deref(),
        Some(sha256_hex(&[9u8; 6001]).as_str())
    );
    // A full walk agrees (the records are kept as they were).
    let mut walking = snapshot.clone();
    assert!(f.rescan(&mut walking).changes.is_empty());

    // The capture has the same budget: a file beyond it is recorded by metadata only.
    let budgeted = budget(0, 5000);
    let mut captured = Snapshot::capture_within(&f.ws, None, &budgeted).unwrap();
    assert_eq!(captured.len(), 4);
    f.write("old", b"changed");
    let report = f.rescan(&mut captured);
    assert_eq!(kinds(&report), [(Modified, "old")]);
}

#[test]
fn racily_clean_files_are_read_again_after_the_changed_ones() {
    let f = Fixture::new();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    f.write("a-big", &[1u8; 8000]);
    let report = snapshot
        .rescan_within(&f.ws, &budget(u64::MAX, 8000))
        .unwrap();
    assert_eq!(kinds(&report), [(Created, "a-big")]);
    // Written just before that scan: its metadata is not trusted yet. Read again first, it
    // would take the whole budget and leave the new file without a hash.
    f.write("z-small", b"small");
    let report = snapshot
        .rescan_within(&f.ws, &budget(u64::MAX, 8004))
        .unwrap();
    assert_eq!(kinds(&report), [(Created, "z-small")]);
    assert_eq!(
        change(&report, "z-small").change.after_sha256.as_deref(),
        Some(sha256_hex(b"small").as_str())
    );
    assert_eq!(report.hashed_bytes, 5);
    // Not read again within the budget: followed by its metadata from now on.
    settle();
    f.write("a-big", &[2u8; 8000]);
    let report = f.rescan(&mut snapshot);
    assert_eq!(kinds(&report), [(Modified, "a-big")]);
    let big = change(&report, "a-big");
    assert_eq!(big.change.before_sha256, None);
    assert_eq!(
        big.change.after_sha256.as_deref(),
        Some(sha256_hex(&[2u8; 8000]).as_str())
    );
    // With the budget for it, the racily clean file is read again at the end of the scan.
    let report = f.rescan(&mut snapshot);
    assert!(report.changes.is_empty());
    assert_eq!(report.hashed_bytes, 8000);
}

#[test]
fn hashing_stops_at_the_deadline_and_the_rest_is_recorded_by_metadata() {
    let f = Fixture::new();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    f.write("small", b"small");
    // Sparse: a second of hashing at least, on any machine this runs on.
    let sparse = fs::File::create(f.path("sparse")).unwrap();
    sparse.set_len(2 << 30).unwrap();
    drop(sparse);
    symlink("small", f.path("link")).unwrap();
    let started = Instant::now();
    let report = snapshot
        .rescan_within(
            &f.ws,
            &ScanBudget {
                time: Duration::from_millis(100),
                ..ScanBudget::unlimited(1024)
            },
        )
        .unwrap();
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(1), "{elapsed:?}");
    assert_eq!(
        kinds(&report),
        [(Created, "link"), (Created, "small"), (Created, "sparse")]
    );
    let sparse = change(&report, "sparse");
    assert_eq!(sparse.change.after_sha256, None);
    assert_eq!(sparse.change.after_size, Some(2 << 30));
    assert_eq!(
        sparse.change.after_unstored,
        Some(UnstoredReason::TimeBudget)
    );

    // Out of time from the start: files are recorded by metadata, symlinks still read.
    f.write("small", b"small, changed");
    f.write("new", b"new");
    let report = snapshot
        .rescan_within(
            &f.ws,
            &ScanBudget {
                time: Duration::ZERO,
                ..ScanBudget::unlimited(1024)
            },
        )
        .unwrap();
    assert_eq!(kinds(&report), [(Created, "new"), (Modified, "small")]);
    for c in &report.changes {
        assert_eq!(c.change.after_unstored, Some(UnstoredReason::TimeBudget));
        assert_eq!(c.change.after_sha256, None);
    }
    assert_eq!(report.hashed_bytes, 0);
}

#[test]
fn a_no_change_rescan_of_ten_thousand_files_hashes_nothing() {
    let f = Fixture::new();
    for dir in 0..100 {
        for file in 0..100 {
            f.write(
                &format!("d{dir:03}/f{file:03}.txt"),
                format!("{dir}/{file}\n").as_bytes(),
            );
        }
    }
    settle();
    let started = Instant::now();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    eprintln!("capture of 10,000 files: {:?}", started.elapsed());
    assert_eq!(snapshot.len(), 10_000);
    assert!(snapshot.is_watching());
    // The same records without inotify: its rescans walk (what they cost without events).
    let mut walking = snapshot.clone();
    let mut best = Duration::MAX;
    let mut best_walk = Duration::MAX;
    for _ in 0..5 {
        let started = Instant::now();
        let report = snapshot.rescan(&f.ws, 1024).unwrap();
        let elapsed = started.elapsed();
        best = best.min(elapsed);
        eprintln!("no-change rescan of 10,000 files (inotify): {elapsed:?}");
        assert!(report.changes.is_empty());
        assert_eq!(report.hashed, 0);
        assert_eq!(report.files, 10_000);
        assert_eq!(report.full_walk, None, "the tree was not walked");

        let started = Instant::now();
        let report = walking.rescan(&f.ws, 1024).unwrap();
        let elapsed = started.elapsed();
        best_walk = best_walk.min(elapsed);
        eprintln!("no-change rescan of 10,000 files (full walk): {elapsed:?}");
        assert!(report.changes.is_empty());
        assert_eq!(report.hashed, 0);
        assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
    }
    eprintln!(
        "best no-change rescan of 10,000 files: {best:?} (inotify), {best_walk:?} (full walk)"
    );

    f.write("d050/f050.txt", b"changed\n");
    let report = snapshot.rescan(&f.ws, 1024).unwrap();
    assert_eq!(kinds(&report), [(Modified, "d050/f050.txt")]);
    assert_eq!(report.hashed, 1);
    assert_eq!(report.full_walk, None);
    let report = walking.rescan(&f.ws, 1024).unwrap();
    assert_eq!(kinds(&report), [(Modified, "d050/f050.txt")]);
}

#[test]
fn a_tree_changing_during_the_scan_never_fails_it_or_leads_outside() {
    let f = Fixture::new();
    fs::create_dir_all(f.outside.join("dir")).unwrap();
    fs::write(f.outside.join("dir/secret"), SECRET).unwrap();
    f.write(".real/inner", b"inner");
    symlink(f.outside.join("dir"), f.path(".link")).unwrap();
    f.write("file", b"regular");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        f.path(".fifo").as_path(),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let root = f.root.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let at = |name: &str| root.join(name);
            while !stop.load(Ordering::Relaxed) {
                // `x` is a real directory, then a symlink to a directory outside; `file`
                // is a regular file, then a FIFO, then a directory.
                let _ = fs::rename(at(".real"), at("x"));
                let _ = fs::rename(at("file"), at(".file"));
                let _ = fs::rename(at(".fifo"), at("file"));
                let _ = fs::rename(at("x"), at(".real"));
                let _ = fs::rename(at(".link"), at("x"));
                let _ = fs::rename(at("file"), at(".fifo"));
                let _ = fs::rename(at(".real"), at("file"));
                let _ = fs::rename(at("x"), at(".link"));
                let _ = fs::rename(at("file"), at(".real"));
                let _ = fs::rename(at(".file"), at("file"));
            }
        })
    };
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut scans = 0;
    while Instant::now() < deadline && scans < 500 {
        let report = snapshot.rescan(&f.ws, 1 << 20).unwrap();
        for c in &report.changes {
            assert!(!c.change.path.contains("secret"), "{:?}", c.change);
            assert_ne!(c.after.as_deref(), Some(SECRET));
        }
        scans += 1;
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(scans > 0);
    // Once the tree holds still, a rescan agrees with a fresh capture.
    let _ = snapshot.rescan(&f.ws, 0).unwrap();
    let fresh = Snapshot::capture(&f.ws).unwrap();
    settle();
    let report = snapshot.rescan(&f.ws, 0).unwrap();
    assert!(report.changes.is_empty(), "{:?}", kinds(&report));
    assert_eq!(
        snapshot.entries.keys().collect::<Vec<_>>(),
        fresh.entries.keys().collect::<Vec<_>>()
    );
}

#[test]
fn an_unusable_root_is_an_error() {
    let f = Fixture::new();
    f.write("a", b"a");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    fs::remove_dir_all(&f.root).unwrap();
    assert!(matches!(
        snapshot.rescan(&f.ws, 0),
        Err(JailError::NotFound { .. })
    ));
    assert_eq!(snapshot.len(), 1, "a failed rescan changes nothing");
}

// ---- inotify ----

fn watcher(snapshot: &Snapshot) -> &Watcher {
    snapshot.watcher.as_ref().expect("the snapshot watches")
}

/// The snapshot's inotify instance (kept by the pool between scans).
fn inotify_fd(snapshot: &Snapshot) -> Arc<OwnedFd> {
    watcher(snapshot)
        .lease
        .attach()
        .expect("the instance is open")
}

fn sh(dir: &std::path::Path, script: &str) {
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(status.success(), "{script}");
}

/// The rescan looked only where the events led.
#[track_caller]
fn incremental(report: &ScanReport) {
    assert_eq!(report.full_walk, None, "walked: {:?}", kinds(report));
}

#[test]
fn a_change_deep_down_is_found_from_its_directory_s_events() {
    let f = Fixture::new();
    f.write("a/b/c/d/e/f/g/h/deep.txt", b"deep");
    f.write("a/b/c/d/e/f/g/h/same.txt", b"same");
    f.write("a/top.txt", b"top");
    settle();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    assert_eq!(watcher(&snapshot).dirs.len(), 9);
    f.write("a/b/c/d/e/f/g/h/deep.txt", b"changed");
    f.write("a/b/c/d/e/f/g/h/new.txt", b"new");
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(
        kinds(&report),
        [
            (Modified, "a/b/c/d/e/f/g/h/deep.txt"),
            (Created, "a/b/c/d/e/f/g/h/new.txt")
        ]
    );
    assert_eq!(report.hashed, 2);
    assert_eq!(report.files, 4);
    settle();
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert!(report.changes.is_empty());
}

#[test]
fn a_directory_made_by_a_process_after_the_capture_is_walked_and_watched() {
    let f = Fixture::new();
    f.write("keep.txt", b"keep");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    sh(
        &f.root,
        "mkdir -p new/sub/deeper && echo one > new/one && echo two > new/sub/two \
         && echo three > new/sub/deeper/three",
    );
    let report = f.rescan(&mut snapshot);
    // Not watched while it was filled: the whole workspace is walked once.
    assert_eq!(report.full_walk, Some(FullWalkReason::NewDirectory));
    assert_eq!(
        kinds(&report),
        [
            (Created, "new/one"),
            (Created, "new/sub/deeper/three"),
            (Created, "new/sub/two")
        ]
    );
    assert!(watcher(&snapshot).wds.contains_key(&b"new/sub/deeper"[..]));
    // Its directories are watched now: what happens in them is found from their own events.
    sh(
        &f.root,
        "echo changed > new/sub/deeper/three && echo four > new/sub/four && rm new/one",
    );
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(
        kinds(&report),
        [
            (Deleted, "new/one"),
            (Modified, "new/sub/deeper/three"),
            (Created, "new/sub/four")
        ]
    );
}

#[test]
fn files_made_in_new_directories_while_they_are_walked_are_all_found() {
    let f = Fixture::new();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    let root = f.root.clone();
    let writer = std::thread::spawn(move || {
        for i in 0..60 {
            let dir = root.join(format!("d{i}"));
            fs::create_dir_all(dir.join("sub")).unwrap();
            for j in 0..20 {
                fs::write(dir.join(format!("f{j}")), format!("{i}/{j}")).unwrap();
                fs::write(dir.join("sub").join(format!("g{j}")), b"g").unwrap();
            }
            if i % 7 == 3 {
                fs::rename(&dir, root.join(format!("moved{i}"))).unwrap();
            }
        }
    });
    let mut scans = 0;
    while !writer.is_finished() {
        let _ = f.rescan(&mut snapshot);
        scans += 1;
    }
    writer.join().unwrap();
    let _ = f.rescan(&mut snapshot);
    let fresh = Snapshot::capture(&f.ws).unwrap();
    assert_eq!(fresh.len(), 60 * 40);
    assert_eq!(
        snapshot.entries.keys().collect::<Vec<_>>(),
        fresh.entries.keys().collect::<Vec<_>>(),
        "after {scans} scans"
    );
    settle();
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert!(report.changes.is_empty(), "{:?}", kinds(&report));
}

#[test]
fn a_deleted_directory_tree_is_reported_deleted_and_its_watches_removed() {
    let f = Fixture::new();
    f.write("tree/a/b/c/1", b"1");
    f.write("tree/a/b/2", b"2");
    f.write("tree/a/3", b"3");
    f.write("tree/x/4", b"4");
    f.write("other/5", b"5");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    assert_eq!(watcher(&snapshot).dirs.len(), 7);
    fs::remove_dir_all(f.path("tree")).unwrap();
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(
        kinds(&report),
        [
            (Deleted, "tree/a/3"),
            (Deleted, "tree/a/b/2"),
            (Deleted, "tree/a/b/c/1"),
            (Deleted, "tree/x/4"),
        ]
    );
    let w = watcher(&snapshot);
    assert_eq!(
        w.wds.keys().map(|k| &k[..]).collect::<Vec<_>>(),
        [&b""[..], b"other"]
    );
    assert_eq!(w.dirs.len(), 2);
    // A directory of the same name again: new, watched anew.
    f.write("tree/a/3", b"3 again");
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::NewDirectory));
    assert_eq!(kinds(&report), [(Created, "tree/a/3")]);
    f.write("tree/a/3", b"3 changed");
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(kinds(&report), [(Modified, "tree/a/3")]);
}

#[test]
fn a_renamed_directory_is_deletions_and_creations_and_stays_watched_at_its_new_path() {
    let f = Fixture::new();
    f.write("dir1/x", b"x");
    f.write("dir1/sub/y", b"y");
    f.write("p/q", b"q");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    fs::rename(f.path("dir1"), f.path("dir2")).unwrap();
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(
        kinds(&report),
        [
            (Deleted, "dir1/sub/y"),
            (Deleted, "dir1/x"),
            (Created, "dir2/sub/y"),
            (Created, "dir2/x"),
        ]
    );
    // The watches moved with it: an event from inside it names the new path.
    f.write("dir2/sub/y", b"y changed");
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(kinds(&report), [(Modified, "dir2/sub/y")]);

    // Two directories swapped, and one moved back where it was (the same file at the same
    // path: no change).
    fs::rename(f.path("dir2"), f.path("tmp")).unwrap();
    fs::rename(f.path("p"), f.path("dir2")).unwrap();
    fs::rename(f.path("tmp"), f.path("p")).unwrap();
    fs::rename(f.path("p/sub"), f.path("dir2/sub")).unwrap();
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(
        kinds(&report),
        [
            (Created, "dir2/q"),
            (Deleted, "dir2/x"),
            (Deleted, "p/q"),
            (Created, "p/x"),
        ]
    );
    f.write("dir2/sub/y", b"y changed again");
    f.write("p/x", b"x changed");
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(
        kinds(&report),
        [(Modified, "dir2/sub/y"), (Modified, "p/x")]
    );

    // Out of the workspace: deleted, and what happens to it there is not reported.
    fs::rename(f.path("dir2"), f.outside.join("moved")).unwrap();
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(
        kinds(&report),
        [(Deleted, "dir2/q"), (Deleted, "dir2/sub/y")]
    );
    assert_eq!(watcher(&snapshot).dirs.len(), 2, "root and p");
    fs::write(f.outside.join("moved/sub/y"), b"outside").unwrap();
    fs::write(f.outside.join("moved/new"), b"outside").unwrap();
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert!(report.changes.is_empty(), "{:?}", kinds(&report));
    // And back in: not watched while it was away.
    fs::rename(f.outside.join("moved"), f.path("p/back")).unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::NewDirectory));
    assert_eq!(
        kinds(&report),
        [
            (Created, "p/back/new"),
            (Created, "p/back/q"),
            (Created, "p/back/sub/y")
        ]
    );
    let fresh = Snapshot::capture(&f.ws).unwrap();
    assert_eq!(
        snapshot.entries.keys().collect::<Vec<_>>(),
        fresh.entries.keys().collect::<Vec<_>>()
    );
}

#[test]
fn a_file_written_through_a_hard_link_in_another_directory_is_found() {
    let f = Fixture::new();
    f.write("a/file", b"one");
    f.write("b/other", b"other");
    fs::hard_link(f.path("a/file"), f.path("b/link")).unwrap();
    settle();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    settle();
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert!(report.changes.is_empty());
    // Written in place through b/link: only b's watch hears of it.
    let mut file = fs::File::options()
        .write(true)
        .truncate(true)
        .open(f.path("b/link"))
        .unwrap();
    std::io::Write::write_all(&mut file, b"two, longer").unwrap();
    drop(file);
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(kinds(&report), [(Modified, "a/file"), (Modified, "b/link")]);
    assert_eq!(
        change(&report, "a/file").change.after_size,
        Some("two, longer".len() as u64)
    );
}

#[test]
fn a_hard_link_made_after_the_capture_walks_once_to_find_the_file_s_other_names() {
    let f = Fixture::new();
    f.write("a/file", b"one");
    f.write("b/other", b"other");
    settle();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    fs::hard_link(f.path("a/file"), f.path("b/link")).unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::HardLink));
    // a/file: its link count changed, nothing told a's watch.
    assert_eq!(kinds(&report), [(Modified, "a/file"), (Created, "b/link")]);
    assert_eq!(change(&report, "a/file").change.after_sha256, None);
    settle();
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert!(report.changes.is_empty());
    fs::write(f.path("b/link"), b"two, longer").unwrap();
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(kinds(&report), [(Modified, "a/file"), (Modified, "b/link")]);
    // Down to one link again: read again, found from a's own events... and from the list of
    // multi-linked files.
    fs::remove_file(f.path("b/link")).unwrap();
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(kinds(&report), [(Modified, "a/file"), (Deleted, "b/link")]);
    assert_eq!(
        change(&report, "a/file").after.as_deref(),
        Some(&b"two, longer"[..])
    );
}

#[test]
fn a_file_written_through_a_hard_link_made_and_removed_since_the_last_scan_is_found() {
    let f = Fixture::new();
    f.write("a/file", b"one");
    f.write("b/other", b"other");
    f.write("c", b"c");
    settle();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    // Nothing tells a's watch: the link's directory hears of a new name, a write, and the
    // name removed.
    sh(&f.root, "ln a/file b/x && printf two > b/x && rm b/x");
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::TransientFile));
    assert_eq!(kinds(&report), [(Modified, "a/file")]);
    assert_eq!(
        change(&report, "a/file").after.as_deref(),
        Some(&b"two"[..])
    );

    // The link replaced by another file rather than removed.
    sh(&f.root, "ln a/file b/x && printf three > b/x && mv c b/x");
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::TransientFile));
    assert_eq!(
        kinds(&report),
        [(Modified, "a/file"), (Created, "b/x"), (Deleted, "c")]
    );

    // Moved first, then removed.
    sh(
        &f.root,
        "ln a/file b/y && mv b/y b/z && printf four > b/z && rm b/z",
    );
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::TransientFile));
    assert_eq!(kinds(&report), [(Modified, "a/file")]);

    // In a directory made for it (not watched yet), removed with it.
    sh(
        &f.root,
        "mkdir n && ln a/file n/x && printf five > n/x && rm -r n",
    );
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::NewDirectory));
    assert_eq!(kinds(&report), [(Modified, "a/file")]);

    // Made before a rescan, removed after it: found by the next.
    settle();
    sh(&f.root, "ln a/file b/w");
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::HardLink));
    sh(&f.root, "printf six > b/w && rm b/w");
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(kinds(&report), [(Modified, "a/file"), (Deleted, "b/w")]);
}

#[test]
fn files_replaced_through_a_temporary_name_do_not_make_a_full_walk() {
    let f = Fixture::new();
    f.write("src/main.rs", b"fn main() {}\n");
    f.write("README", b"readme");
    settle();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    // What editors, `sed -i`, Python's bytecode cache and git's index do: write a temporary
    // file, rename it over the file or to its final name.
    sh(
        &f.root,
        "printf 'fn main() { run() }' > src/.main.rs.tmp && mv src/.main.rs.tmp src/main.rs \
         && printf new > .new.tmp && mv .new.tmp new && sed -i s/readme/README/ README",
    );
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(
        kinds(&report),
        [
            (Modified, "README"),
            (Created, "new"),
            (Modified, "src/main.rs")
        ]
    );
    // A temporary file removed, though, could have been a hard link.
    sh(&f.root, "printf tmp > src/scratch && rm src/scratch");
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::TransientFile));
    assert!(report.changes.is_empty());
    // One made before the last scan is not.
    f.write("src/scratch", b"tmp");
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    fs::remove_file(f.path("src/scratch")).unwrap();
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(kinds(&report), [(Deleted, "src/scratch")]);
}

#[test]
fn changes_made_through_a_bind_mount_in_another_mount_namespace_are_seen() {
    let f = Fixture::new();
    f.write("deep/dir/file", b"before");
    f.write("gone", b"gone");
    settle();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    let mnt = f._tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    // As the sandbox sees the workspace: a bind mount, in a mount namespace of its own.
    let script = format!(
        "mount --bind '{root}' '{mnt}' && printf after > '{mnt}/deep/dir/file' \
         && printf new > '{mnt}/deep/new' && rm '{mnt}/gone'",
        root = f.root.display(),
        mnt = mnt.display()
    );
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output();
    match out {
        Ok(out) if out.status.success() => {}
        other => {
            eprintln!("skipped: no bind mount in a new mount namespace here: {other:?}");
            return;
        }
    }
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(
        kinds(&report),
        [
            (Modified, "deep/dir/file"),
            (Created, "deep/new"),
            (Deleted, "gone")
        ]
    );
    assert_eq!(
        change(&report, "deep/dir/file").after.as_deref(),
        Some(&b"after"[..])
    );
}

#[test]
fn without_inotify_every_rescan_walks_and_finds_the_same() {
    let f = Fixture::new();
    f.write("a/b", b"b");
    f.write("c", b"c");
    let mut without = Snapshot::capture_within(&f.ws, None, &ScanBudget::unlimited(0)).unwrap();
    assert!(!without.is_watching());
    let mut default = Snapshot::default();
    let report = f.rescan(&mut default);
    assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
    assert_eq!(kinds(&report), [(Created, "a/b"), (Created, "c")]);
    fs::remove_dir_all(f.path("a")).unwrap();
    f.write("d/e", b"e");
    for snapshot in [&mut without, &mut default] {
        let report = f.rescan(snapshot);
        assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
        assert_eq!(kinds(&report), [(Deleted, "a/b"), (Created, "d/e")]);
    }
}

#[test]
fn when_a_watch_cannot_be_added_the_snapshot_stops_watching_and_walks() {
    let limited = |f: &Fixture, watches| {
        let pool = InotifyPool::new(usize::MAX, watches);
        let snapshot =
            Snapshot::capture_within(&f.ws, Some(&pool), &ScanBudget::unlimited(0)).unwrap();
        (pool, snapshot)
    };
    // At the capture: five directories, three watches.
    let f = Fixture::new();
    for dir in ["a", "b", "c", "d"] {
        f.write(&format!("{dir}/f"), b"f");
    }
    let (pool, mut snapshot) = limited(&f, 3);
    assert!(!snapshot.is_watching());
    // The instance is closed, with its watches.
    assert_eq!((pool.instances(), pool.watches()), (0, 0));
    assert_eq!(snapshot.len(), 4);
    f.write("d/f", b"changed");
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
    assert_eq!(kinds(&report), [(Modified, "d/f")]);

    // At a rescan: the new directories are walked all the same, the next rescan walks.
    // Exactly as many watches as directories: a full walk watching them again needs none.
    let (pool, mut snapshot) = limited(&f, 5);
    assert!(snapshot.is_watching());
    assert_eq!((pool.instances(), pool.watches()), (1, 5));
    watcher_mut(&mut snapshot).walk_next = Some(FullWalkReason::Periodic);
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::Periodic));
    assert!(snapshot.is_watching());
    assert_eq!(pool.watches(), 5);
    f.write("e/g/h", b"h");
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::NewDirectory));
    assert_eq!(kinds(&report), [(Created, "e/g/h")]);
    assert!(!snapshot.is_watching());
    assert_eq!((pool.instances(), pool.watches()), (0, 0));
    f.write("e/g/h", b"h changed");
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
    assert_eq!(kinds(&report), [(Modified, "e/g/h")]);
}

#[test]
fn an_event_queue_overflow_makes_a_full_walk() {
    let max_queued: usize = fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(usize::MAX);
    if max_queued > 100_000 {
        eprintln!("skipped: the inotify queue holds {max_queued} events here");
        return;
    }
    let f = Fixture::new();
    f.write("dir/existing", b"x");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    // One IN_CREATE at least per file (distinct names are never merged).
    let files = max_queued + 10;
    for i in 0..files {
        fs::write(f.path(&format!("dir/{i}")), b"").unwrap();
    }
    let report = snapshot.rescan(&f.ws, 0).unwrap();
    assert_eq!(report.full_walk, Some(FullWalkReason::EventsLost));
    assert_eq!(report.changes.len(), files);
    assert_eq!(report.files, files + 1);
    // Watching again from there.
    fs::write(f.path("dir/existing"), b"changed").unwrap();
    let report = snapshot.rescan(&f.ws, 0).unwrap();
    incremental(&report);
    assert_eq!(kinds(&report), [(Modified, "dir/existing")]);
}

#[test]
fn a_watch_that_goes_away_is_made_again() {
    let f = Fixture::new();
    f.write("a/b/f", b"f");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    let a = watcher(&snapshot).wds[&b"a"[..]];
    // As if "a" were on a filesystem unmounted: IN_IGNORED with the directory still there,
    // unwatched for a while. Everything is walked (and "a" watched again).
    inotify::remove_watch(&*inotify_fd(&snapshot), a).unwrap();
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::Unwatched));
    assert!(report.changes.is_empty());
    assert!(watcher(&snapshot).wds.contains_key(&b"a"[..]));
    f.write("a/new", b"new");
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(kinds(&report), [(Created, "a/new")]);

    // The root's: the next rescan walks.
    let root = watcher(&snapshot).wds[&b""[..]];
    inotify::remove_watch(&*inotify_fd(&snapshot), root).unwrap();
    f.write("a/b/f", b"changed");
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::Unwatched));
    assert_eq!(kinds(&report), [(Modified, "a/b/f")]);
    f.write("root", b"root");
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(kinds(&report), [(Created, "root")]);
}

#[test]
fn a_rescan_long_after_the_last_full_walk_walks() {
    let f = Fixture::new();
    f.write("a", b"a");
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    incremental(&f.rescan(&mut snapshot));
    if let Some(w) = snapshot.watcher.as_mut() {
        w.last_full_walk = Instant::now()
            .checked_sub(FULL_WALK_INTERVAL)
            .unwrap_or(w.last_full_walk);
    }
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::Periodic));
    incremental(&f.rescan(&mut snapshot));
    // Asked for by the previous scan (a directory it could not walk):
    watcher_mut(&mut snapshot).walk_next = Some(FullWalkReason::Unwatched);
    let report = f.rescan(&mut snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::Unwatched));
    incremental(&f.rescan(&mut snapshot));
}

#[test]
fn past_the_pool_s_cap_snapshots_walk_and_watch_again_when_an_instance_is_free() {
    let pool = InotifyPool::new(2, usize::MAX);
    let fixtures: Vec<Fixture> = (0..3).map(|_| Fixture::new()).collect();
    let mut snapshots: Vec<Snapshot> = fixtures
        .iter()
        .map(|f| {
            f.write("a/f", b"f");
            Snapshot::capture_within(&f.ws, Some(&pool), &ScanBudget::unlimited(0)).unwrap()
        })
        .collect();
    let watching = |snapshots: &[Snapshot]| -> Vec<bool> {
        snapshots.iter().map(Snapshot::is_watching).collect()
    };
    assert_eq!(watching(&snapshots), [true, true, false]);
    assert_eq!((pool.instances(), pool.watches()), (2, 4));
    // Every change is found all the same; the third walks.
    for round in 0..2 {
        for (f, snapshot) in fixtures.iter().zip(snapshots.iter_mut()) {
            f.write("a/f", format!("round {round}").as_bytes());
            let report = f.rescan(snapshot);
            assert_eq!(kinds(&report), [(Modified, "a/f")]);
            let walked = !snapshot.is_watching();
            assert_eq!(
                report.full_walk,
                walked.then_some(FullWalkReason::NoInotify)
            );
        }
    }
    // An instance freed (a session gone): the snapshot without one takes it at its next
    // rescan, walking once more, then goes by the events.
    drop(snapshots.remove(0));
    let (f, snapshot) = (&fixtures[2], &mut snapshots[1]);
    assert_eq!((pool.instances(), pool.watches()), (1, 2));
    f.write("a/g", b"g");
    let report = f.rescan(snapshot);
    assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
    assert_eq!(kinds(&report), [(Created, "a/g")]);
    assert!(snapshot.is_watching());
    assert_eq!((pool.instances(), pool.watches()), (2, 4));
    f.write("a/g", b"changed");
    let report = f.rescan(snapshot);
    incremental(&report);
    assert_eq!(kinds(&report), [(Modified, "a/g")]);
    drop(snapshots);
    assert_eq!((pool.instances(), pool.watches()), (0, 0));
}

#[test]
fn an_idle_watcher_is_closed_for_another_snapshot_and_its_next_rescan_walks() {
    let idle = Duration::from_millis(100);
    let pool = InotifyPool::reclaiming_after(1, idle);
    let (f1, f2) = (Fixture::new(), Fixture::new());
    f1.write("d/one", b"1");
    f2.write("d/two", b"2");
    let budget = ScanBudget::unlimited(1024);
    let mut s1 = Snapshot::capture_within(&f1.ws, Some(&pool), &budget).unwrap();
    // The first was used a moment ago: the second does without.
    let mut s2 = Snapshot::capture_within(&f2.ws, Some(&pool), &budget).unwrap();
    assert!(s1.is_watching() && !s2.is_watching());
    std::thread::sleep(idle + Duration::from_millis(20));
    // Idle long enough: its instance goes to the second.
    f2.write("d/two", b"2 changed");
    let report = f2.rescan(&mut s2);
    assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
    assert_eq!(kinds(&report), [(Modified, "d/two")]);
    assert!(s2.is_watching());
    assert_eq!(pool.instances(), 1);
    // The first's events are gone with its instance: it walks, and finds every change.
    f1.write("d/one", b"1 changed");
    f1.write("d/new", b"new");
    let report = f1.rescan(&mut s1);
    assert_eq!(report.full_walk, Some(FullWalkReason::InotifyReclaimed));
    assert_eq!(kinds(&report), [(Created, "d/new"), (Modified, "d/one")]);
    // The second was used just now: the first stays without, and walks.
    assert!(!s1.is_watching());
    f1.write("d/one", b"1 changed again");
    let report = f1.rescan(&mut s1);
    assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
    assert_eq!(kinds(&report), [(Modified, "d/one")]);
    // A watcher in use by a scan is never taken (its descriptor is held).
    let held = inotify_fd(&s2);
    std::thread::sleep(idle + Duration::from_millis(20));
    f1.write("d/one", b"once more");
    let report = f1.rescan(&mut s1);
    assert_eq!(report.full_walk, Some(FullWalkReason::NoInotify));
    assert!(!s1.is_watching());
    drop(held);
    let report = f1.rescan(&mut s1);
    assert!(s1.is_watching());
    assert!(report.changes.is_empty());
    assert_eq!(pool.instances(), 1);
    let report = f2.rescan(&mut s2);
    assert_eq!(report.full_walk, Some(FullWalkReason::InotifyReclaimed));
}

fn watcher_mut(snapshot: &mut Snapshot) -> &mut Watcher {
    snapshot.watcher.as_mut().expect("the snapshot watches")
}

#[test]
fn the_snapshot_can_be_moved_to_another_thread() {
    fn send<T: Send + 'static>(_: &T) {}
    let f = Fixture::new();
    let snapshot = Snapshot::capture(&f.ws).unwrap();
    send(&snapshot);
}

/// Operations on a small tree, between rescans.
#[derive(Debug, Clone)]
enum Op {
    Write(usize, u8),
    Append(usize),
    Remove(usize),
    Mkdir(usize),
    Rename(usize, usize),
    Symlink(usize, usize),
    HardLink(usize, usize),
    Chmod(usize),
    Scan,
}

const NAMES: [&str; 9] = [
    "a", "b", "a/a", "a/b", "b/a", "a/a/a", "a/a/b", "b/a/a", "c",
];

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    let name = 0..NAMES.len();
    prop_oneof![
        (name.clone(), 0u8..3).prop_map(|(p, c)| Op::Write(p, c)),
        name.clone().prop_map(Op::Append),
        name.clone().prop_map(Op::Remove),
        name.clone().prop_map(Op::Mkdir),
        (name.clone(), name.clone()).prop_map(|(a, b)| Op::Rename(a, b)),
        (name.clone(), name.clone()).prop_map(|(a, b)| Op::Symlink(a, b)),
        (name.clone(), name.clone()).prop_map(|(a, b)| Op::HardLink(a, b)),
        name.prop_map(Op::Chmod),
        Just(Op::Scan),
    ]
}

fn apply(root: &std::path::Path, op: &Op) {
    use std::os::unix::fs::PermissionsExt;
    let at = |i: usize| root.join(NAMES[i]);
    let parent = |i: usize| {
        let _ = fs::create_dir_all(at(i).parent().unwrap());
    };
    match *op {
        Op::Write(p, c) => {
            parent(p);
            let _ = fs::write(at(p), [b'x', c].repeat(usize::from(c) + 1));
        }
        Op::Append(p) => {
            if let Ok(mut file) = fs::File::options().append(true).open(at(p)) {
                let _ = std::io::Write::write_all(&mut file, b"+");
            }
        }
        Op::Remove(p) => {
            if fs::remove_file(at(p)).is_err() {
                let _ = fs::remove_dir_all(at(p));
            }
        }
        Op::Mkdir(p) => {
            let _ = fs::create_dir_all(at(p));
        }
        Op::Rename(a, b) => {
            parent(b);
            let _ = fs::rename(at(a), at(b));
        }
        Op::Symlink(a, b) => {
            parent(a);
            let _ = symlink(NAMES[b], at(a));
        }
        Op::HardLink(a, b) => {
            parent(b);
            let _ = fs::hard_link(at(a), at(b));
        }
        Op::Chmod(p) => {
            let _ = fs::set_permissions(at(p), fs::Permissions::from_mode(0o600));
        }
        Op::Scan => {}
    }
}

fn summary(report: &ScanReport) -> Vec<(FileChangeKind, String, Option<String>, Option<u64>)> {
    report
        .changes
        .iter()
        .map(|c| {
            (
                c.change.kind,
                c.change.path.clone(),
                c.change.after_sha256.clone(),
                c.change.after_size,
            )
        })
        .collect()
}

/// Applies `ops` to a tree made by `setup`, rescanning with a watching snapshot and a walking
/// one at each [`Op::Scan`] and at the end: both must report the same and keep the same
/// records. Returns how many rescans there were and how many went by the events alone.
fn rescans_agree(
    setup: &[Op],
    ops: &[Op],
) -> Result<(usize, usize), proptest::test_runner::TestCaseError> {
    use proptest::{prop_assert, prop_assert_eq};
    let f = Fixture::new();
    // The directories exist mostly (a directory made means a full walk).
    fs::create_dir_all(f.path("a/a")).unwrap();
    fs::create_dir_all(f.path("b/a")).unwrap();
    for op in setup {
        apply(&f.root, op);
    }
    let mut watching = Snapshot::capture(&f.ws).unwrap();
    let mut walking = watching.clone();
    // Everything here is racily clean (written a moment ago), so every rescan would look at
    // every file again. The watching snapshot is made to trust metadata and to recheck only
    // multi-linked files: it finds changes from the events alone. (No operation rewrites a
    // file with other contents of the same size.)
    let events_only = |snapshot: &mut Snapshot| {
        snapshot.started_ns = now_ns() + 3_600_000_000_000;
        let entries = &snapshot.entries;
        if let Some(w) = snapshot.watcher.as_mut() {
            w.recheck
                .retain(|key| entries.get(key).is_some_and(|r| r.meta.nlink > 1));
        }
    };
    let records = |snapshot: &Snapshot| {
        snapshot
            .entries
            .iter()
            .map(|(key, r)| (key.clone(), r.meta, r.content.clone()))
            .collect::<Vec<_>>()
    };
    events_only(&mut watching);
    let (mut scans, mut by_events) = (0, 0);
    for op in ops.iter().chain([&Op::Scan]) {
        apply(&f.root, op);
        if !matches!(op, Op::Scan) {
            continue;
        }
        let a = watching.rescan(&f.ws, 64).unwrap();
        let b = walking.rescan(&f.ws, 64).unwrap();
        events_only(&mut watching);
        prop_assert!(
            matches!(
                a.full_walk,
                None | Some(
                    FullWalkReason::HardLink
                        | FullWalkReason::NewDirectory
                        | FullWalkReason::TransientFile
                )
            ),
            "{:?}",
            a.full_walk
        );
        scans += 1;
        by_events += usize::from(a.full_walk.is_none());
        prop_assert_eq!(summary(&a), summary(&b), "after {:?}", ops);
        prop_assert_eq!(records(&watching), records(&walking), "after {:?}", ops);
    }
    let fresh = Snapshot::capture(&f.ws).unwrap();
    prop_assert_eq!(records(&watching), records(&fresh));
    Ok((scans, by_events))
}

/// Whatever happens to the tree, the rescans from events report what full walks report.
#[test]
fn rescans_from_events_agree_with_full_walks() {
    use proptest::strategy::Strategy;
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128);
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    });
    let totals = std::sync::Mutex::new((0, 0));
    let strategy = (
        proptest::collection::vec(op(), 0..12),
        proptest::collection::vec(op(), 1..40),
    );
    let result = runner.run(&strategy.boxed(), |(setup, ops)| {
        let (scans, by_events) = rescans_agree(&setup, &ops)?;
        let mut totals = totals.lock().unwrap();
        totals.0 += scans;
        totals.1 += by_events;
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (scans, by_events) = *totals.lock().unwrap();
    eprintln!("{scans} rescans, {by_events} from the events alone");
    assert!(
        by_events * 4 > scans,
        "most rescans walked: {by_events}/{scans}"
    );
}
