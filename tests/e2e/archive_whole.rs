//! Issue 23 §5: an archive goes in whole or not at all. Every refusal happens in the check pass,
//! before the first write — links resolved against the links of the archive and of the
//! workspace, names, duplicates, what is in the way in the workspace, the disk — so a refused
//! upload leaves the workspace and the log exactly as they were. On both stores.
use serde_json::{Value, json};
use toolexec_tests::app::{Backend, TestApp};

use crate::archive::{E, put, tar_of};

toolexec_tests::on_both_stores!(
    a_symlink_chain_that_climbs_out_is_refused_and_nothing_is_written,
    a_name_the_workspace_cannot_take_is_refused_before_anything_is_written,
    what_is_in_the_way_in_the_workspace_is_refused_before_anything_is_written,
);

/// A tar whose entries may have names of any length (GNU long names), as `tar` makes them.
fn long_tar(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, *data).unwrap();
    }
    b.into_inner().unwrap()
}

async fn session(app: &TestApp) -> String {
    app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The workspace as the shell sees it (every entry, symlinks with their targets), and the log.
async fn snapshot(app: &TestApp, sid: &str) -> (String, Vec<Value>) {
    let events = app.events_all(sid).await;
    let dir = app.config.workspace_root().join(sid);
    let mut listing = Vec::new();
    let mut stack = vec![dir.clone()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let shown = path.strip_prefix(&dir).unwrap().display().to_string();
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                listing.push(format!("{shown} -> {}", target.display()));
            } else if meta.is_dir() {
                listing.push(format!("{shown}/"));
                stack.push(path);
            } else {
                listing.push(format!("{shown} ({} bytes)", meta.len()));
            }
        }
    }
    listing.sort();
    (listing.join("\n"), events)
}

async fn refused(app: &TestApp, sid: &str, body: Vec<u8>, status: u16, code: &str, says: &str) {
    let before = snapshot(app, sid).await;
    let (got, problem) = put(app, sid, body).await;
    assert_eq!(got, status, "{says}: {problem}");
    assert_eq!(problem["code"], code, "{says}: {problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains(says), "wanted '{says}' in: {problem}");
    let after = snapshot(app, sid).await;
    assert_eq!(after.0, before.0, "the workspace changed: {problem}");
    assert_eq!(
        after.1.len(),
        before.1.len(),
        "the log changed: {problem}: {:?}",
        &after.1[before.1.len().min(after.1.len())..]
    );
}

async fn a_symlink_chain_that_climbs_out_is_refused_and_nothing_is_written(backend: Backend) {
    let app = backend.spawn().await;
    let sid = session(&app).await;
    // `a/b -> ..` is the workspace root; `a/b/..` is then the folder of every workspace. Each
    // link alone stays inside lexically.
    let chain = tar_of(&[
        E::File("first.txt", b"written first\n", 0o644),
        E::Dir("a/"),
        E::Symlink("a/b", ".."),
        E::Symlink("z", "a/b/.."),
    ]);
    refused(&app, &sid, chain, 422, "invalid_archive", "leads out").await;
    // Longer: through a link to a link, and a link that only climbs once resolved.
    let deeper = tar_of(&[
        E::Symlink("up", "a/b"),
        E::Dir("a/"),
        E::Symlink("a/b", ".."),
        E::Symlink("c/d/e", "../../up/.."),
    ]);
    refused(&app, &sid, deeper, 422, "invalid_archive", "leads out").await;

    // The first half of the chain already in the workspace (made by a command): the archive's
    // link is resolved through it too.
    let r = app
        .call(
            &sid,
            "mk",
            "shell",
            json!({"command": "mkdir -p a && ln -s .. a/b && ls -la a"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let rest = tar_of(&[
        E::File("first.txt", b"written first\n", 0o644),
        E::Symlink("z", "a/b/.."),
    ]);
    refused(&app, &sid, rest, 422, "invalid_archive", "leads out").await;
    // And an archive link that makes a workspace link climb out: `y -> q/..` is harmless until
    // `q` is a link to the root.
    let r = app
        .call(&sid, "mk2", "shell", json!({"command": "ln -s q/.. y"}))
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let completes = tar_of(&[E::Symlink("q", "a/b")]);
    refused(&app, &sid, completes, 422, "invalid_archive", "'y'").await;

    // Chains that stay inside are taken.
    let inside = tar_of(&[
        E::Dir("c/"),
        E::File("c/x", b"x\n", 0o644),
        E::Dir("p/"),
        E::Symlink("p/to-c", "../c"),
        E::Symlink("via", "p/to-c/x"),
        E::Symlink("root-again", "a/b/c"),
        E::Symlink("loop1", "loop2"),
        E::Symlink("loop2", "loop1"),
    ]);
    let (status, body) = put(&app, &sid, inside).await;
    assert_eq!(status, 200, "{body}");
    let r = app
        .call(
            &sid,
            "cat",
            "shell",
            json!({"command": "cat via root-again/x"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(r["content"].as_str().unwrap().contains("x\nx\n"), "{r}");
}

async fn a_name_the_workspace_cannot_take_is_refused_before_anything_is_written(backend: Backend) {
    let app = backend.spawn().await;
    let sid = session(&app).await;
    let first = ("first.txt", &b"written first\n"[..]);
    // The case of the review: a 300-byte name after an entry that is fine.
    let long = format!("dir/{}", "n".repeat(300));
    refused(
        &app,
        &sid,
        long_tar(&[first, (&long, b"x")]),
        422,
        "invalid_archive",
        "255",
    )
    .await;
    // A whole path over PATH_MAX, every component short.
    let deep = vec!["d"; 2100].join("/");
    refused(
        &app,
        &sid,
        long_tar(&[first, (&deep, b"x")]),
        422,
        "invalid_archive",
        "4095",
    )
    .await;
    // The same file twice (an appended archive), a file that is also a directory, a file under
    // a symlink of the archive.
    let twice = tar_of(&[
        E::File("first.txt", b"one\n", 0o644),
        E::File("./first.txt", b"two\n", 0o644),
    ]);
    refused(&app, &sid, twice, 422, "invalid_archive", "twice").await;
    let file_and_dir = tar_of(&[
        E::File("first.txt", b"one\n", 0o644),
        E::File("src", b"a file\n", 0o644),
        E::File("src/main.rs", b"fn main() {}\n", 0o644),
    ]);
    refused(&app, &sid, file_and_dir, 422, "invalid_archive", "'src'").await;
    let dir_then_file = tar_of(&[E::Dir("lib/"), E::File("lib", b"a file\n", 0o644)]);
    refused(&app, &sid, dir_then_file, 422, "invalid_archive", "'lib'").await;
    let under_link = tar_of(&[
        E::Dir("real/"),
        E::Symlink("link", "real"),
        E::File("link/x", b"x\n", 0o644),
    ]);
    refused(&app, &sid, under_link, 422, "invalid_archive", "'link'").await;

    // Names that are not UTF-8 are taken, and recorded exactly.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(2);
    let name = &mut h.as_old_mut().name;
    name[..6].copy_from_slice(b"caf\xe9.x");
    h.set_cksum();
    b.append(&h, &b"ok"[..]).unwrap();
    let (status, body) = put(&app, &sid, b.into_inner().unwrap()).await;
    assert_eq!(status, 200, "{body}");
    let events = app.events_all(&sid).await;
    let created = events.last().unwrap();
    assert_eq!(created["kind"], "file.created", "{created}");
    assert_eq!(created["data"]["path"], "caf\\xe9.x", "{created}");
}

async fn what_is_in_the_way_in_the_workspace_is_refused_before_anything_is_written(
    backend: Backend,
) {
    let app = backend.spawn().await;
    let sid = session(&app).await;
    let r = app
        .call(
            &sid,
            "mk",
            "shell",
            json!({"command": "mkdir -p src/deep && echo keep > src/deep/keep.rs && echo plain > notes && mkdir vendor && ln -s vendor lib"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let first = E::File("first.txt", b"written first\n", 0o644);
    // A file where the workspace has a directory: writing it would delete the directory and
    // everything in it.
    let over_dir = tar_of(&[first, E::File("src", b"a file\n", 0o644)]);
    refused(
        &app,
        &sid,
        over_dir,
        409,
        "archive_not_applied",
        "'src' is a directory",
    )
    .await;
    // A directory where the workspace has a file, or a symlink.
    let first = E::File("first.txt", b"written first\n", 0o644);
    let under_file = tar_of(&[first, E::File("notes/today.md", b"x\n", 0o644)]);
    refused(
        &app,
        &sid,
        under_file,
        409,
        "archive_not_applied",
        "'notes'",
    )
    .await;
    let first = E::File("first.txt", b"written first\n", 0o644);
    let under_link = tar_of(&[first, E::File("lib/x.rs", b"x\n", 0o644)]);
    refused(&app, &sid, under_link, 409, "archive_not_applied", "'lib'").await;

    // A file over a file, a symlink over a file and a file over a symlink are replaced.
    let over = tar_of(&[
        E::File("notes", b"new notes\n", 0o644),
        E::Symlink("src/deep/keep.rs", "../../notes"),
        E::File("lib", b"was a link\n", 0o644),
    ]);
    let (status, body) = put(&app, &sid, over).await;
    assert_eq!(status, 200, "{body}");
    let r = app
        .call(
            &sid,
            "cat",
            "shell",
            json!({"command": "cat src/deep/keep.rs lib && test -d vendor && echo vendor-kept"}),
        )
        .await;
    let text = r["content"].as_str().unwrap();
    assert!(text.contains("new notes\nwas a link\nvendor-kept"), "{r}");
}

/// The disk: with a quota, an archive the session's filesystem cannot hold — in bytes or in
/// files (inodes) — is refused before the first write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archive_the_disk_quota_cannot_hold_is_refused_before_anything_is_written() {
    let app = toolexec_tests::app::spawn_app_with(|c| {
        c.limits.session_disk_bytes = 16 * 1024 * 1024;
    })
    .await;
    let sid = session(&app).await;
    // 6,000 empty files: a 16 MiB ext4 has 4,096 inodes.
    let names: Vec<String> = (0..6000).map(|i| format!("d{}/f{i}", i % 20)).collect();
    let entries: Vec<E<'_>> = names.iter().map(|n| E::File(n, b"", 0o644)).collect();
    refused(
        &app,
        &sid,
        tar_of(&entries),
        409,
        "archive_not_applied",
        "files",
    )
    .await;
    // 20 MiB of contents.
    let big = vec![7u8; 5 << 20];
    let names: Vec<String> = (0..4).map(|i| format!("big{i}")).collect();
    let entries: Vec<E<'_>> = names.iter().map(|n| E::File(n, &big, 0o644)).collect();
    refused(
        &app,
        &sid,
        tar_of(&entries),
        409,
        "archive_not_applied",
        "bytes",
    )
    .await;
}
