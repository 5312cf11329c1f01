#![allow(
    clippy::disallowed_methods,
    reason = "tests build their fixtures on the host"
)]

use super::*;

fn workspace() -> (tempfile::TempDir, Workspace) {
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::open(dir.path()).unwrap();
    (dir, ws)
}

#[test]
fn virtual_root_paths_are_stripped_to_workspace_relative_ones() {
    let cases = [
        ("/workspace/src/a.rs", "src/a.rs"),
        ("/workspace", "."),
        ("/workspace/", "."),
        ("src/./a.rs", "src/a.rs"),
        ("src//lib/../a.rs", "src/a.rs"),
        ("./", "."),
    ];
    for (input, expected) in cases {
        assert_eq!(Workspace::display_path(input).unwrap(), expected, "{input}");
    }
}

#[test]
fn other_absolute_paths_are_outside_the_workspace() {
    for input in [
        "/etc/passwd",
        "/workspaces/x",
        "/work",
        "//workspace/x",
        "/proc/self/root",
    ] {
        assert!(
            matches!(
                Workspace::display_path(input),
                Err(JailError::OutsideWorkspace { .. })
            ),
            "{input}"
        );
    }
}

#[test]
fn empty_nul_and_over_long_paths_are_invalid() {
    let long_component = "a".repeat(MAX_COMPONENT_BYTES + 1);
    let long_path = "a/".repeat(MAX_PATH_BYTES / 2 + 1);
    for input in ["", "a\0b", &long_component, &long_path] {
        assert!(
            matches!(
                Workspace::display_path(input),
                Err(JailError::InvalidPath { .. })
            ),
            "{input:?}"
        );
    }
}

#[test]
fn sparse_files_hash_like_the_zeros_their_holes_read_as() {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::FileExt;
    let (dir, ws) = workspace();
    const MIB: u64 = 1024 * 1024;
    let dense = vec![7u8; 1024 * 1024 + 1];
    // Holes at the start, between data and at the end; data at the end; all hole; none.
    /// A name, a size, and the bytes written at offsets (the rest is holes).
    type Layout<'a> = (&'a str, u64, &'a [(u64, &'a [u8])]);
    let layouts: [Layout; 5] = [
        (
            "islands",
            9 * MIB + 5,
            &[(3 * MIB + 1, b"island"), (7 * MIB, b"x")],
        ),
        ("data-at-end", 2 * MIB, &[(2 * MIB - 3, b"end")]),
        ("data-at-start", 3 * MIB, &[(0, b"start")]),
        ("all-hole", 5 * MIB + 7, &[]),
        ("dense", MIB + 1, &[(0, &dense)]),
    ];
    for (name, size, data) in layouts {
        let file = std::fs::File::create(dir.path().join(name)).unwrap();
        file.set_len(size).unwrap();
        for (offset, bytes) in data {
            file.write_at(bytes, *offset).unwrap();
        }
        file.sync_all().unwrap();
        let mut all = Vec::new();
        let mut file = std::fs::File::open(dir.path().join(name)).unwrap();
        file.seek(SeekFrom::Start(0)).unwrap();
        file.read_to_end(&mut all).unwrap();
        assert_eq!(all.len() as u64, size);

        let root = ws.open_dir_exact(b"").unwrap();
        let (entry, _) = root.child(name.as_bytes()).unwrap();
        let hashed = root.hash_child(&entry, 0, u64::MAX, None).unwrap();
        assert_eq!(hashed.sha256, sha256_hex(&all), "{name}");
        assert_eq!(hashed.size, size, "{name}");
        assert_eq!(hashed.kept, None);
        // Past the deadline: stopped, not a wrong hash.
        let past = Instant::now();
        let stopped = root.hash_child(&entry, 0, u64::MAX, Some(past));
        assert!(
            matches!(&stopped, Err(JailError::Io { source, .. }) if source.kind() == io::ErrorKind::TimedOut),
            "{name}: {stopped:?}"
        );
    }
}

#[test]
fn a_written_file_reads_back_with_its_hash() {
    let (_dir, ws) = workspace();
    let written = ws.write("/workspace/a/b/c.txt", b"hello\n").unwrap();
    assert_eq!(written.path, "a/b/c.txt");
    assert_eq!(written.before, Before::Absent);
    assert!(written.changed);
    let read = ws.read("a/b/c.txt").unwrap();
    assert_eq!(read.bytes, b"hello\n");
    assert_eq!(read.sha256, written.sha256);
    assert_eq!(read.path, "a/b/c.txt");
}

#[test]
fn a_small_file_is_read_whole_and_a_larger_one_is_left_for_a_full_read() {
    let (_dir, ws) = workspace();
    ws.write("small.txt", b"0123456789").unwrap();
    let small = ws
        .read_if_small("/workspace/small.txt", 10)
        .unwrap()
        .unwrap();
    assert_eq!(small, ws.read("small.txt").unwrap());
    assert_eq!(ws.read_if_small("small.txt", 9).unwrap(), None);
    // Errors are the full read's: missing files, paths outside, directories.
    assert!(matches!(
        ws.read_if_small("missing.txt", 10),
        Err(JailError::NotFound { .. })
    ));
    assert!(matches!(
        ws.read_if_small("../x", 10),
        Err(JailError::OutsideWorkspace { .. })
    ));
    ws.write("d/f", b"x").unwrap();
    assert!(matches!(
        ws.read_if_small("d", 10),
        Err(JailError::IsADirectory { .. })
    ));
}

#[test]
fn overwriting_reports_the_before_state_and_keeps_the_permission_bits() {
    use std::os::unix::fs::PermissionsExt;
    let (dir, ws) = workspace();
    std::fs::write(dir.path().join("run.sh"), "old").unwrap();
    std::fs::set_permissions(
        dir.path().join("run.sh"),
        std::fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    let written = ws.write("run.sh", b"new").unwrap();
    assert_eq!(written.before.sha256(), Some(sha256_hex(b"old").as_str()));
    assert_eq!(written.before.size(), Some(3));
    let mode = std::fs::metadata(dir.path().join("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o750);
    assert_eq!(std::fs::read(dir.path().join("run.sh")).unwrap(), b"new");
}

#[test]
fn writing_identical_contents_changes_nothing() {
    let (_dir, ws) = workspace();
    ws.write("a.txt", b"same").unwrap();
    let again = ws.write("a.txt", b"same").unwrap();
    assert!(!again.changed);
}

#[test]
fn a_refused_check_writes_nothing() {
    let (dir, ws) = workspace();
    std::fs::write(dir.path().join("a.txt"), "keep").unwrap();
    let outcome = ws
        .write_if("a.txt", b"clobber", |path, before| {
            assert_eq!(path, "a.txt");
            assert!(before.exists());
            Err("no")
        })
        .unwrap();
    assert_eq!(outcome, Err("no"));
    assert_eq!(std::fs::read(dir.path().join("a.txt")).unwrap(), b"keep");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "no temp file is left behind");
}

#[test]
fn a_path_through_a_symlinked_directory_reports_where_the_file_really_is() {
    let (dir, ws) = workspace();
    std::fs::create_dir(dir.path().join("real")).unwrap();
    std::os::unix::fs::symlink("real", dir.path().join("alias")).unwrap();
    let written = ws.write("alias/f.txt", b"x").unwrap();
    assert_eq!(written.path, "real/f.txt");
    assert_eq!(ws.read("alias/f.txt").unwrap().path, "real/f.txt");
}

#[test]
fn writing_a_directory_or_a_trailing_slash_is_refused() {
    let (dir, ws) = workspace();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    assert!(matches!(
        ws.write("d", b""),
        Err(JailError::IsADirectory { .. })
    ));
    assert!(matches!(
        ws.write(".", b""),
        Err(JailError::IsADirectory { .. })
    ));
    assert!(matches!(
        ws.write("e/", b""),
        Err(JailError::InvalidPath { .. })
    ));
}

#[test]
fn a_file_in_the_way_of_a_parent_directory_is_reported() {
    let (dir, ws) = workspace();
    std::fs::write(dir.path().join("f"), "x").unwrap();
    assert!(matches!(
        ws.write("f/g.txt", b""),
        Err(JailError::NotADirectory { .. })
    ));
}

#[test]
fn dot_dot_after_a_missing_directory_is_refused_before_anything_is_created() {
    let (dir, ws) = workspace();
    assert!(matches!(
        ws.write("new/../x.txt", b""),
        Err(JailError::InvalidPath { .. })
    ));
    assert!(!dir.path().join("new").exists());
}

#[test]
fn entries_are_sorted_and_typed_without_following_symlinks() {
    let (dir, ws) = workspace();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    std::fs::write(dir.path().join("a"), "").unwrap();
    std::os::unix::fs::symlink("b", dir.path().join("c")).unwrap();
    let root = ws.open_dir(".").unwrap();
    let entries = root.entries().unwrap();
    let seen: Vec<_> = entries.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    assert_eq!(
        seen,
        [
            ("a", EntryKind::File),
            ("b", EntryKind::Dir),
            ("c", EntryKind::Symlink)
        ]
    );
    assert_eq!(root.read_link(&entries[2]).as_deref(), Some("b"));
    assert!(matches!(
        root.open_child(&entries[2]),
        Err(JailError::SymlinkLoop { .. } | JailError::NotADirectory { .. })
    ));
    assert_eq!(root.open_child(&entries[1]).unwrap().path(), "b");
}

#[test]
fn removing_a_file_reports_what_was_there_and_leaves_the_directory() {
    let (dir, ws) = workspace();
    ws.write("d/a.txt", b"gone").unwrap();
    let removed = ws.remove_file("/workspace/d/./a.txt").unwrap();
    assert_eq!(removed.path, "d/a.txt");
    assert_eq!(removed.before.sha256(), Some(sha256_hex(b"gone").as_str()));
    assert!(!dir.path().join("d/a.txt").exists());
    assert!(dir.path().join("d").is_dir());
    assert!(matches!(
        ws.remove_file("d/a.txt"),
        Err(JailError::NotFound { .. })
    ));
}

#[test]
fn a_refused_removal_deletes_nothing() {
    let (dir, ws) = workspace();
    ws.write("a.txt", b"keep").unwrap();
    let outcome = ws.remove_file_if("a.txt", |_, _| Err("no")).unwrap();
    assert_eq!(outcome, Err("no"));
    assert!(dir.path().join("a.txt").exists());
}

#[test]
fn a_copy_streams_the_bytes_and_keeps_them_only_when_small() {
    let (dir, ws) = workspace();
    let big: Vec<u8> = (0..3 * COPY_BUFFER_BYTES + 17).map(|i| i as u8).collect();
    std::fs::write(dir.path().join("big.bin"), &big).unwrap();
    let allow = |_: &str, _: &Before| Ok::<(), ()>(());
    let copied = ws
        .copy_file_if("big.bin", "sub/copy.bin", 1024, allow)
        .unwrap()
        .unwrap();
    assert_eq!(copied.source, "big.bin");
    assert_eq!(copied.written.path, "sub/copy.bin");
    assert_eq!(copied.written.sha256, sha256_hex(&big));
    assert_eq!(copied.written.size, big.len() as u64);
    assert!(copied.written.changed);
    assert_eq!(copied.kept, None);
    assert_eq!(std::fs::read(dir.path().join("sub/copy.bin")).unwrap(), big);

    let small = ws
        .copy_file_if("sub/copy.bin", "again.bin", u64::MAX, allow)
        .unwrap()
        .unwrap();
    assert_eq!(small.kept.as_deref(), Some(big.as_slice()));
}

#[test]
fn copying_over_a_file_with_the_same_bytes_or_onto_itself_changes_nothing() {
    let (_dir, ws) = workspace();
    ws.write("a", b"same").unwrap();
    ws.write("b", b"same").unwrap();
    let allow = |_: &str, _: &Before| Ok::<(), ()>(());
    let onto_twin = ws.copy_file_if("a", "b", 1024, allow).unwrap().unwrap();
    assert!(!onto_twin.written.changed);
    let onto_itself = ws.copy_file_if("a", "a", 1024, allow).unwrap().unwrap();
    assert!(!onto_itself.written.changed);
    assert_eq!(onto_itself.kept.as_deref(), Some(&b"same"[..]));
}

#[test]
fn a_file_over_the_read_limit_can_still_be_copied() {
    let (dir, ws) = workspace();
    let file = std::fs::File::create(dir.path().join("huge.img")).unwrap();
    file.set_len(MAX_READ_BYTES + 1).unwrap();
    drop(file);
    assert!(matches!(
        ws.read("huge.img"),
        Err(JailError::TooLarge { .. })
    ));
    let copied = ws
        .copy_file_if("huge.img", "copy.img", 1024, |_, _| Ok::<(), ()>(()))
        .unwrap()
        .unwrap();
    assert_eq!(copied.written.size, MAX_READ_BYTES + 1);
    assert_eq!(copied.kept, None);
    let len = std::fs::metadata(dir.path().join("copy.img"))
        .unwrap()
        .len();
    assert_eq!(len, MAX_READ_BYTES + 1);
}

#[test]
fn a_child_is_read_without_following_a_symlink_at_its_name() {
    let (dir, ws) = workspace();
    std::fs::write(dir.path().join("real"), "x").unwrap();
    std::os::unix::fs::symlink("real", dir.path().join("link")).unwrap();
    let root = ws.open_dir(".").unwrap();
    let entries = root.entries().unwrap();
    let link = entries.iter().find(|e| e.name == "link").unwrap();
    let real = entries.iter().find(|e| e.name == "real").unwrap();
    assert!(root.read_child(link).is_err());
    assert_eq!(root.read_child(real).unwrap().bytes, b"x");
    assert!(root.modified(real).is_some());
}

#[test]
fn as_root_what_the_jail_creates_goes_to_the_directorys_owner_and_rewrites_keep_theirs() {
    use std::os::unix::fs::MetadataExt;
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: only a service running as root changes owners");
        return;
    }
    let chown = |path: &Path, uid: u32, gid: u32| {
        let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).unwrap();
        rustix::fs::fchown(
            &fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .unwrap();
    };
    let (dir, ws) = workspace();
    let owner = |rel: &str| {
        let meta = std::fs::symlink_metadata(dir.path().join(rel)).unwrap();
        (meta.uid(), meta.gid())
    };
    chown(dir.path(), 65534, 65534);
    std::fs::write(dir.path().join("theirs.txt"), "old").unwrap();
    chown(&dir.path().join("theirs.txt"), 1234, 5678);
    std::fs::write(dir.path().join("root.txt"), "old").unwrap();

    ws.write("new/sub/file.txt", b"new").unwrap();
    ws.write("theirs.txt", b"rewritten").unwrap();
    ws.write("root.txt", b"rewritten").unwrap();
    assert_eq!(owner("new"), (65534, 65534));
    assert_eq!(owner("new/sub"), (65534, 65534));
    assert_eq!(owner("new/sub/file.txt"), (65534, 65534));
    assert_eq!(
        owner("theirs.txt"),
        (1234, 5678),
        "a rewrite keeps the owner"
    );
    assert_eq!(owner("root.txt"), (0, 0), "a rewrite keeps the owner");

    // A copy lands in a directory with another owner; a hard-linked target's owner is not
    // copied (the link may lead out of the workspace): its directory's owner is used.
    std::fs::create_dir(dir.path().join("other")).unwrap();
    chown(&dir.path().join("other"), 4321, 4321);
    let allow = |_: &str, _: &Before| Ok::<(), ()>(());
    ws.copy_file_if("theirs.txt", "other/copy.txt", 0, allow)
        .unwrap()
        .unwrap();
    assert_eq!(owner("other/copy.txt"), (4321, 4321));
    std::fs::hard_link(
        dir.path().join("theirs.txt"),
        dir.path().join("other/linked.txt"),
    )
    .unwrap();
    ws.write("other/linked.txt", b"replaced").unwrap();
    assert_eq!(owner("other/linked.txt"), (4321, 4321));
    assert_eq!(owner("theirs.txt"), (1234, 5678));
}

#[test]
fn model_messages_say_what_to_do() {
    let e = JailError::OutsideWorkspace {
        path: "/etc/passwd".into(),
    };
    assert_eq!(
        e.model_message(),
        "Path '/etc/passwd' is outside the workspace (or leads out of it through '..' or \
         a symlink; absolute symlinks are never followed). Use a path under /workspace \
         (absolute, like /workspace/src/main.rs, or relative, like src/main.rs)."
    );
    let e = JailError::TooLarge {
        path: "big.log".into(),
        size: 20 * 1024 * 1024,
        limit: MAX_READ_BYTES,
    };
    assert!(e.model_message().contains("20 MiB"));
    assert!(e.model_message().contains("grep"));
}

#[test]
fn sizes_are_shown_in_binary_units() {
    assert_eq!(human_bytes(12), "12 bytes");
    assert_eq!(human_bytes(1536), "1.5 KiB");
    assert_eq!(human_bytes(MAX_READ_BYTES), "10 MiB");
}
