//! The scan's budgets: contents kept, bytes hashed, time; what is recorded past each.
use super::*;

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
