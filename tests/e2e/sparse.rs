//! Issue 23 §4, forks: a sparse file costs its data, not its apparent size, wherever the record
//! is written back out — a fork's base, a rewind, the spool of an archive download. Before, a
//! 4 KB workspace of sparse files became a fork base of its full apparent size (the zeros
//! written out), outside every quota. On both stores.
use std::os::unix::fs::MetadataExt;

use serde_json::{Value, json};
use toolexec_tests::app::{Backend, TestApp};

toolexec_tests::on_both_stores!(
    sparse_files_keep_their_holes_through_a_fork_a_rewind_and_a_download,
    a_huge_sparse_file_is_recorded_by_its_size_and_a_fork_says_it_cannot_restore_it,
);

/// 9 MiB: under `limits.max_blob_bytes`, so a scan records it with its contents.
const SIZE: u64 = 9 << 20;
const NAMES: [&str; 6] = ["s1", "s2", "s3", "s4", "s5", "s6"];

/// Bytes allocated on disk for the file at `path`.
fn allocated(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

fn check_sparse(dir: &std::path::Path, what: &str) {
    for name in NAMES {
        let path = dir.join(name);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), SIZE + 5, "{what}: {name}");
        let used = allocated(&path);
        // The 5 bytes at the end take one block; the 9 MiB before them none.
        assert!(
            used <= 64 * 1024,
            "{what}: {name} takes {used} bytes on disk"
        );
    }
    let tail = std::fs::read(dir.join("s1")).unwrap();
    assert!(tail[..SIZE as usize].iter().all(|b| *b == 0), "{what}");
    assert_eq!(&tail[SIZE as usize..], b"tail\n", "{what}");
}

async fn shell(app: &TestApp, sid: &str, id: &str, command: &str) -> Value {
    let r = app
        .call(sid, id, "shell", json!({ "command": command }))
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    r
}

async fn sparse_files_keep_their_holes_through_a_fork_a_rewind_and_a_download(backend: Backend) {
    let app = backend.spawn().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    shell(
        &app,
        &sid,
        "mk",
        &format!(
            "for f in {}; do truncate -s {SIZE} $f && echo tail >> $f; done && du -sk .",
            NAMES.join(" ")
        ),
    )
    .await;
    let events = app.events_all(&sid).await;
    let recorded: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "file.created")
        .collect();
    assert_eq!(recorded.len(), NAMES.len(), "{events:?}");
    for e in &recorded {
        // Recorded with its contents: the log alone can rebuild it.
        assert_eq!(e["data"]["after_stored"], true, "{e}");
    }
    let at = events.last().unwrap()["seq"].as_i64().unwrap();
    let root = app.config.workspace_root();
    check_sparse(&root.join(&sid), "the session");

    // A fork: its base is written from the log.
    let resp = app
        .post(&format!("/v1/sessions/{sid}/fork"), &json!({"at_seq": at}))
        .await;
    assert_eq!(resp.status(), 201);
    let fork: Value = resp.json().await.unwrap();
    let fid = fork["id"].as_str().unwrap();
    check_sparse(&root.join(fid), "the fork");
    // Everything the fork's workspace and base take on disk together.
    let mut total = 0;
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let meta = std::fs::symlink_metadata(entry.path()).unwrap();
            if meta.is_dir() && entry.file_name() != *sid.as_str() {
                stack.push(entry.path());
            } else if meta.is_file() {
                total += meta.blocks() * 512;
            }
        }
    }
    assert!(
        total < 4 << 20,
        "the fork takes {total} bytes on disk for 54 MiB of holes"
    );

    // A rewind writes them back the same way.
    shell(&app, &sid, "rm", "rm s*").await;
    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/rewind"),
            &json!({ "to_seq": at }),
        )
        .await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    check_sparse(&root.join(&sid), "the rewound session");

    // A download: the spool keeps the holes too (its file is open, deleted, while the body is
    // streamed: found through this process's descriptors, since the server runs in it).
    let resp = app
        .get(&format!("/v1/sessions/{sid}/archive?at={at}"))
        .await;
    assert_eq!(resp.status(), 200);
    let mut spooled = None;
    for fd in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        let target = target.display().to_string();
        if target.contains(".uploads/") && target.ends_with(".tar (deleted)") {
            spooled = Some((std::fs::metadata(fd.path()).unwrap(), target));
        }
    }
    let (meta, target) = spooled.expect("the download's spool is open");
    assert!(meta.len() > 6 * SIZE, "{target}: {} bytes", meta.len());
    assert!(
        meta.blocks() * 512 < 4 << 20,
        "{target} takes {} bytes on disk",
        meta.blocks() * 512
    );
    let bytes = resp.bytes().await.unwrap();
    let mut archive = tar::Archive::new(&bytes[..]);
    let mut seen = 0;
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
        assert_eq!(data.len() as u64, SIZE + 5);
        assert!(data[..SIZE as usize].iter().all(|b| *b == 0));
        assert_eq!(&data[SIZE as usize..], b"tail\n");
        seen += 1;
    }
    assert_eq!(seen, NAMES.len());
}

async fn a_huge_sparse_file_is_recorded_by_its_size_and_a_fork_says_it_cannot_restore_it(
    backend: Backend,
) {
    // By default a command cannot make a file over `sandbox.file_size_bytes` (1 GiB), even a
    // sparse one: `truncate -s 10G` fails, and what is recorded is the empty file it made.
    let app = backend.spawn().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = app
        .call(
            &sid,
            "big",
            "shell",
            json!({"command": "truncate -s 10G big"}),
        )
        .await;
    assert_eq!(r["status"], "error", "{r}");
    // SIGXFSZ: the file size limit.
    assert!(r["content"].as_str().unwrap().contains("signal 25"), "{r}");
    let events = app.events_all(&sid).await;
    let made = events.iter().find(|e| e["data"]["path"] == "big").unwrap();
    assert_eq!(made["data"]["after_size"], 0, "{made}");
    drop(app);

    // An operator who raises it: the file is recorded by its size, never read.
    let app = backend
        .spawn_with(|c| c.sandbox.file_size_bytes = 16 << 30)
        .await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let started = std::time::Instant::now();
    shell(
        &app,
        &sid,
        "big",
        "truncate -s 10G big && echo small > small",
    )
    .await;
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let events = app.events_all(&sid).await;
    let big = events
        .iter()
        .find(|e| e["data"]["path"] == "big")
        .unwrap_or_else(|| panic!("{events:?}"));
    // Larger than the scanner hashes (4 GiB): recorded by size and metadata.
    assert_eq!(big["data"]["after_size"], 10u64 << 30, "{big}");
    assert_eq!(big["data"]["after_stored"], false, "{big}");
    assert_eq!(big["data"]["after_unstored"], "too_large_to_hash", "{big}");
    let at = events.last().unwrap()["seq"].as_i64().unwrap();
    // A fork cannot rebuild it and says so; with `allow_partial` it leaves it out.
    let resp = app
        .post(&format!("/v1/sessions/{sid}/fork"), &json!({"at_seq": at}))
        .await;
    assert_eq!(resp.status(), 409);
    let p: Value = resp.json().await.unwrap();
    assert_eq!(p["code"], "unrestorable", "{p}");
    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/fork"),
            &json!({"at_seq": at, "allow_partial": true}),
        )
        .await;
    assert_eq!(resp.status(), 201);
    let fork: Value = resp.json().await.unwrap();
    assert_eq!(fork["unrestorable"], json!(["big"]), "{fork}");
    let fork_dir = app
        .config
        .workspace_root()
        .join(fork["id"].as_str().unwrap());
    assert!(!fork_dir.join("big").exists());
    assert!(fork_dir.join("small").exists());
    // A download says so too.
    let resp = app.get(&format!("/v1/sessions/{sid}/archive")).await;
    assert_eq!(resp.status(), 409);
    // A rewind to before it removes it; a rewind never writes it out.
    let resp = app
        .post(&format!("/v1/sessions/{sid}/rewind"), &json!({"to_seq": 1}))
        .await;
    assert_eq!(resp.status(), 200);
    assert!(!app.config.workspace_root().join(&sid).join("big").exists());
}
