//! edit_file, apply_patch, read_many_files, file_copy and file_delete as a caller uses them:
//! read-before-write, recorded changes, and the refusals a model has to recover from.
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

use common::Session;
use serde_json::json;
use toolexec_core::{CallStatus, Capability, FileChangeKind, sha256_hex};
use toolexec_tools::reads::WriteCheck;

#[tokio::test]
async fn editing_an_unread_file_is_refused() {
    let s = Session::new();
    s.file("a.rs", "let x = 1;\n");
    let out = s
        .call(
            "edit_file",
            json!({"file_path": "a.rs", "old_string": "1", "new_string": "2"}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Denied);
    assert!(
        out.content
            .starts_with("Cannot edit 'a.rs': file exists but has not been read. Use read_file"),
        "{}",
        out.content
    );
    assert_eq!(s.read("a.rs"), b"let x = 1;\n");
}

#[tokio::test]
async fn editing_a_file_changed_since_it_was_read_is_refused_as_stale() {
    let s = Session::new();
    s.file("a.rs", "let x = 1;\n");
    s.call("read_file", json!({"file_path": "a.rs"})).await;
    s.file("a.rs", "let x = 10;\n");
    let out = s
        .call(
            "edit_file",
            json!({"file_path": "a.rs", "old_string": "10", "new_string": "2"}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Denied);
    assert!(
        out.content.contains("changed since you read it"),
        "{}",
        out.content
    );
}

#[tokio::test]
async fn an_edit_is_recorded_and_the_session_knows_the_new_contents() {
    let s = Session::new();
    s.file("a.rs", "fn a() {\n    1\n}\n");
    s.call("read_file", json!({"file_path": "a.rs"})).await;
    let out = s
        .call(
            "edit_file",
            json!({"file_path": "/workspace/a.rs", "old_string": "    1", "new_string": "    2"}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert_eq!(
        out.content,
        "Edited a.rs: replaced 1 occurrence at line 2.\n     1\tfn a() {\n     2\t    2\n     3\t}\n"
    );
    let [change] = out.changes.as_slice() else {
        panic!("{:?}", out.changes)
    };
    assert_eq!(change.change.kind, FileChangeKind::Modified);
    assert_eq!(
        change.change.before_sha256.as_deref(),
        Some(sha256_hex(b"fn a() {\n    1\n}\n").as_str())
    );
    assert_eq!(change.after.as_deref(), Some(&b"fn a() {\n    2\n}\n"[..]));
    // A second edit needs no new read.
    let again = s
        .call(
            "edit_file",
            json!({"file_path": "a.rs", "old_string": "    2", "new_string": "    3"}),
        )
        .await;
    assert_eq!(again.status, CallStatus::Ok, "{}", again.content);
}

#[tokio::test]
async fn patching_an_unread_file_is_refused_and_changes_nothing() {
    let s = Session::new();
    s.file("a.txt", "one\n");
    let out = s
        .call(
            "apply_patch",
            json!({"patch": "*** Begin Patch\n*** Add File: new.txt\n+x\n*** Update File: a.txt\n@@\n-one\n+two\n*** End Patch"}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Denied);
    assert!(
        out.content
            .contains("Cannot patch 'a.txt': file exists but has not been read"),
        "{}",
        out.content
    );
    assert!(!s.root.join("new.txt").exists());
    assert_eq!(s.read("a.txt"), b"one\n");
}

#[tokio::test]
async fn a_patch_records_created_modified_and_deleted_and_a_move_as_delete_plus_create() {
    let s = Session::new();
    s.file("keep.txt", "a\nb\n");
    s.file("old.txt", "x\n");
    s.file("gone.txt", "bye\n");
    for f in ["keep.txt", "old.txt", "gone.txt"] {
        s.call("read_file", json!({"file_path": f})).await;
    }
    let out = s
        .call(
            "apply_patch",
            json!({"patch": "*** Begin Patch\n*** Update File: keep.txt\n@@\n a\n-b\n+c\n*** Update File: old.txt\n*** Move to: moved/new.txt\n@@\n-x\n+y\n*** Delete File: gone.txt\n*** Add File: fresh.txt\n+hi\n*** End Patch"}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    let kinds: Vec<(FileChangeKind, &str)> = out
        .changes
        .iter()
        .map(|c| (c.change.kind, c.change.path.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            (FileChangeKind::Modified, "keep.txt"),
            (FileChangeKind::Deleted, "old.txt"),
            (FileChangeKind::Created, "moved/new.txt"),
            (FileChangeKind::Deleted, "gone.txt"),
            (FileChangeKind::Created, "fresh.txt"),
        ]
    );
    assert!(
        out.content.contains("A moved/new.txt (moved from old.txt)"),
        "{}",
        out.content
    );
    assert_eq!(s.read("moved/new.txt"), b"y\n");
    // The session knows what it wrote.
    assert_eq!(
        s.ctx.reads.check("keep.txt", &sha256_hex(b"a\nc\n")),
        WriteCheck::Allowed
    );
}

#[tokio::test]
async fn read_many_files_shows_each_file_and_errors_inline_and_counts_as_read() {
    let s = Session::new();
    s.file("a.txt", "alpha\n");
    s.file("b.bin", b"\0\x01");
    let out = s
        .call(
            "read_many_files",
            json!({"paths": ["a.txt", "missing.txt", "b.bin"]}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert!(
        out.content.starts_with(
            "=== a.txt ===\n     1\talpha\n\n=== missing.txt ===\n'missing.txt' does not exist."
        ),
        "{}",
        out.content
    );
    assert!(
        out.content
            .contains("=== b.bin ===\nCannot show 'b.bin': it looks like a binary file"),
        "{}",
        out.content
    );
    assert_eq!(
        s.ctx.reads.check("a.txt", &sha256_hex(b"alpha\n")),
        WriteCheck::Allowed
    );
}

#[tokio::test]
async fn read_many_files_fails_when_nothing_could_be_shown() {
    let s = Session::new();
    let out = s
        .call("read_many_files", json!({"paths": ["nope", "/etc/passwd"]}))
        .await;
    assert_eq!(out.status, CallStatus::Error);
    assert!(
        out.content.contains("outside the workspace"),
        "{}",
        out.content
    );
}

#[tokio::test]
async fn file_copy_copies_bytes_it_never_shows_and_records_them_as_content_from_source() {
    let s = Session::new();
    let png = b"\x89PNG\r\n\x1a\n\0\0binary";
    s.file("assets/logo.png", png);
    let out = s
        .call(
            "file_copy",
            json!({"source": "assets/logo.png", "dest": "public/img/logo.png"}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert_eq!(
        out.content,
        "Copied assets/logo.png (16 bytes) to public/img/logo.png (created)."
    );
    assert_eq!(s.read("public/img/logo.png"), png);
    let change = &out.changes[0];
    assert_eq!(change.change.kind, FileChangeKind::Created);
    assert_eq!(change.change.capability, Capability::ContentFromSource);
    assert_eq!(
        change.change.after_sha256.as_deref(),
        Some(sha256_hex(png).as_str())
    );
    assert_eq!(change.after.as_deref(), Some(&png[..]));
}

#[tokio::test]
async fn file_copy_refuses_an_existing_dest_without_overwrite_but_needs_no_read_with_it() {
    let s = Session::new();
    s.file("a.txt", "new");
    s.file("b.txt", "old, never read");
    let refused = s
        .call("file_copy", json!({"source": "a.txt", "dest": "b.txt"}))
        .await;
    assert_eq!(refused.status, CallStatus::Error);
    assert!(
        refused.content.contains("already exists"),
        "{}",
        refused.content
    );
    assert!(refused.content.contains("overwrite"), "{}", refused.content);
    assert_eq!(s.read("b.txt"), b"old, never read");

    let replaced = s
        .call(
            "file_copy",
            json!({"source": "a.txt", "dest": "b.txt", "overwrite": true}),
        )
        .await;
    assert_eq!(replaced.status, CallStatus::Ok, "{}", replaced.content);
    assert_eq!(replaced.changes[0].change.kind, FileChangeKind::Modified);
    assert_eq!(
        replaced.changes[0].change.before_sha256.as_deref(),
        Some(sha256_hex(b"old, never read").as_str())
    );
    assert_eq!(s.read("b.txt"), b"new");
}

#[tokio::test]
async fn a_large_copy_is_recorded_by_hash_without_its_contents() {
    let s = Session::new();
    let big = vec![7u8; 2 * 1024 * 1024];
    s.file("big.bin", &big);
    let out = s
        .call(
            "file_copy",
            json!({"source": "big.bin", "dest": "copy.bin"}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    let change = &out.changes[0];
    assert_eq!(change.after, None);
    assert!(!change.change.after_stored);
    assert_eq!(
        change.change.after_sha256.as_deref(),
        Some(sha256_hex(&big).as_str())
    );
    assert_eq!(s.read("copy.bin").len(), big.len());
}

#[tokio::test]
async fn file_copy_to_a_directory_asks_for_the_file_path() {
    let s = Session::new();
    s.file("a.txt", "x");
    std::fs::create_dir(s.root.join("dir")).unwrap();
    let out = s
        .call("file_copy", json!({"source": "a.txt", "dest": "dir"}))
        .await;
    assert_eq!(out.status, CallStatus::Error);
    assert!(out.content.contains("dir/a.txt"), "{}", out.content);
}

#[tokio::test]
async fn deleting_a_read_file_is_recorded_with_its_before_hash() {
    let s = Session::new();
    s.file("old.rs", "// legacy\n");
    s.call("read_file", json!({"file_path": "old.rs"})).await;
    let out = s.call("file_delete", json!({"path": "old.rs"})).await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert_eq!(out.content, "Deleted old.rs (10 bytes).");
    assert!(!s.root.join("old.rs").exists());
    let change = &out.changes[0].change;
    assert_eq!(change.kind, FileChangeKind::Deleted);
    assert_eq!(
        change.before_sha256.as_deref(),
        Some(sha256_hex(b"// legacy\n").as_str())
    );
    assert_eq!(change.after_sha256, None);
}

#[tokio::test]
async fn deleting_an_unread_file_is_refused() {
    let s = Session::new();
    s.file("a.rs", "x");
    let out = s.call("file_delete", json!({"path": "a.rs"})).await;
    assert_eq!(out.status, CallStatus::Denied);
    assert!(
        out.content
            .starts_with("Cannot delete 'a.rs': file exists but has not been read"),
        "{}",
        out.content
    );
    assert!(s.root.join("a.rs").exists());
}

#[tokio::test]
async fn deleting_a_directory_is_refused() {
    let s = Session::new();
    s.file("dir/inner.txt", "x");
    let out = s.call("file_delete", json!({"path": "dir"})).await;
    assert_eq!(out.status, CallStatus::Error);
    assert!(
        out.content.contains("'dir' is a directory"),
        "{}",
        out.content
    );
    assert!(s.root.join("dir/inner.txt").exists());
}

#[tokio::test]
async fn deleting_a_symlink_is_refused_and_its_target_survives() {
    let s = Session::new();
    s.file("real.txt", "x");
    std::os::unix::fs::symlink("real.txt", s.root.join("link.txt")).unwrap();
    let out = s.call("file_delete", json!({"path": "link.txt"})).await;
    assert_eq!(out.status, CallStatus::Error);
    assert!(out.content.contains("symbolic link"), "{}", out.content);
    assert!(s.root.join("real.txt").exists());
}

#[tokio::test]
async fn a_patch_that_deletes_through_a_symlink_is_refused_and_both_survive() {
    let s = Session::new();
    s.file("real.txt", "x\n");
    std::os::unix::fs::symlink("real.txt", s.root.join("link.txt")).unwrap();
    s.call("read_file", json!({"file_path": "real.txt"})).await;
    let out = s
        .call(
            "apply_patch",
            json!({"patch": "*** Begin Patch\n*** Delete File: link.txt\n*** End Patch"}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Error);
    assert!(
        out.content
            .contains("leads through a symlink to 'real.txt'"),
        "{}",
        out.content
    );
    assert!(s.root.join("real.txt").exists());
    assert!(std::fs::symlink_metadata(s.root.join("link.txt")).is_ok());
}

#[tokio::test]
async fn a_patch_over_a_file_changed_since_it_was_read_is_refused_as_stale() {
    let s = Session::new();
    s.file("a.txt", "one\n");
    s.call("read_file", json!({"file_path": "a.txt"})).await;
    s.file("a.txt", "one\nmore\n");
    let out = s
        .call(
            "apply_patch",
            json!({"patch": "*** Begin Patch\n*** Update File: a.txt\n@@\n-one\n+two\n*** End Patch"}),
        )
        .await;
    assert_eq!(out.status, CallStatus::Denied);
    assert!(
        out.content.contains("changed since you read it"),
        "{}",
        out.content
    );
    assert_eq!(s.read("a.txt"), b"one\nmore\n");
}

#[tokio::test]
async fn a_patch_path_with_dot_dot_through_a_symlinked_directory_changes_the_file_it_leads_to() {
    let s = Session::new();
    s.file("f", "root\n");
    s.file("a/f", "inner\n");
    s.file("a/b/keep", "x\n");
    std::os::unix::fs::symlink("a/b", s.root.join("in_dir")).unwrap();
    s.call("read_file", json!({"file_path": "f"})).await;
    s.call("read_file", json!({"file_path": "a/f"})).await;
    // `in_dir/../f` is `a/f` on disk (the kernel follows in_dir first), not `f`.
    let patch = "*** Begin Patch\n*** Update File: f\n@@\n-root\n+root changed\n*** Update File: in_dir/../f\n@@\n-inner\n+inner changed\n*** End Patch\n";
    let out = s.call("apply_patch", json!({"patch": patch})).await;
    assert_eq!(out.status, CallStatus::Ok, "{}", out.content);
    assert_eq!(s.read("f"), b"root changed\n");
    assert_eq!(s.read("a/f"), b"inner changed\n");
    let paths: Vec<&str> = out.changes.iter().map(|c| c.change.path.as_str()).collect();
    assert_eq!(paths, ["f", "a/f"]);
}
