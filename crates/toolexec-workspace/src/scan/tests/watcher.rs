//! The inotify watcher: changes found from directories' events, new and removed trees.
use super::*;

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

#[test]
fn a_quiet_workspace_is_told_at_once_and_anything_queued_is_left_to_a_rescan() {
    let f = Fixture::new();
    f.write("a/keep.txt", b"keep");
    settle();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    // Nothing happened since the capture, and reading queues no event.
    let _ = fs::read(f.path("a/keep.txt")).unwrap();
    let quiet = snapshot
        .rescan_if_quiet(&f.ws)
        .expect("nothing queued: quiet");
    assert!(quiet.changes.is_empty());
    assert_eq!((quiet.files, quiet.hashed, quiet.full_walk), (1, 0, None));

    // Anything queued — a write, a new file, a removal, a chmod — is a rescan's to look at,
    // and the rescan still finds it (the quiet answer consumed nothing).
    f.write("a/keep.txt", b"changed");
    assert!(snapshot.rescan_if_quiet(&f.ws).is_none());
    let report = f.rescan(&mut snapshot);
    incremental(&report);
    assert_eq!(kinds(&report), [(Modified, "a/keep.txt")]);
    // What a rescan just inspected is rechecked by the next one (its timestamps were too
    // fresh to trust): not quiet until that rescan ran.
    settle();
    assert!(snapshot.rescan_if_quiet(&f.ws).is_none());
    assert!(f.rescan(&mut snapshot).changes.is_empty());
    assert!(snapshot.rescan_if_quiet(&f.ws).is_some());
    for script in [
        "echo new > a/new.txt",
        "rm a/new.txt",
        "chmod 600 a/keep.txt",
    ] {
        sh(&f.root, script);
        assert!(snapshot.rescan_if_quiet(&f.ws).is_none(), "{script}");
        assert_eq!(f.rescan(&mut snapshot).changes.len(), 1, "{script}");
        settle();
        if snapshot.rescan_if_quiet(&f.ws).is_none() {
            assert!(f.rescan(&mut snapshot).changes.is_empty(), "{script}");
        }
        assert!(snapshot.rescan_if_quiet(&f.ws).is_some(), "after {script}");
    }

    // An entry left to recheck, a walk due, or no watches at all: never quiet.
    snapshot
        .watcher
        .as_mut()
        .unwrap()
        .recheck
        .insert(b"a/keep.txt"[..].into());
    assert!(snapshot.rescan_if_quiet(&f.ws).is_none());
    snapshot.watcher.as_mut().unwrap().recheck.clear();
    snapshot.watcher.as_mut().unwrap().walk_next = Some(FullWalkReason::EventsLost);
    assert!(snapshot.rescan_if_quiet(&f.ws).is_none());
    snapshot.watcher.as_mut().unwrap().walk_next = None;
    assert!(snapshot.rescan_if_quiet(&f.ws).is_some());
    assert!(Snapshot::default().rescan_if_quiet(&f.ws).is_none());

    // The pool held by another thread: not waited for (the rescan, on a blocking thread, may).
    let lease = &watcher(&snapshot).lease;
    assert!(lease.while_pool_busy(|| snapshot.rescan_if_quiet(&f.ws).is_none()));
    assert!(snapshot.rescan_if_quiet(&f.ws).is_some());
}

#[test]
fn a_root_removed_from_the_host_is_never_quiet() {
    let f = Fixture::new();
    let mut snapshot = Snapshot::capture(&f.ws).unwrap();
    assert!(snapshot.rescan_if_quiet(&f.ws).is_some());
    // Empty, it queues nothing on its own watch while the jail holds it open.
    fs::remove_dir(&f.root).unwrap();
    assert!(snapshot.rescan_if_quiet(&f.ws).is_none());
    assert!(snapshot.rescan(&f.ws, 1024).is_err());
}
