//! Time travel over HTTP: a scripted session of 60+ mixed calls (file tools, shell commands that
//! create, modify, chmod, symlink and delete, a background process writing between calls), the
//! real workspace snapshotted from the host after every call, then every `tree?at=SEQ` and a
//! sample of `files/…?at=SEQ` compared byte for byte with those snapshots — also once the
//! session is closed and its workspace gone; a rewind, then work going on; a hundred forks of
//! one state, each diverging; verify replays; the log as a stream with a reconnect and a second
//! replica writing.
use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use toolexec_tests::app::{Backend, TestApp};

/// What the host sees of one entry of a workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    File { bytes: Vec<u8>, mode: u32 },
    Symlink(Vec<u8>),
}

/// Every file and symlink under `root` (directories are not part of a state), by raw path.
fn snapshot(root: &Path) -> BTreeMap<Vec<u8>, Seen> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<Vec<u8>, Seen>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .as_os_str()
                .as_bytes()
                .to_vec();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                out.insert(rel, Seen::Symlink(target.as_os_str().as_bytes().to_vec()));
            } else if meta.is_dir() {
                walk(root, &path, out);
            } else if meta.is_file() {
                out.insert(
                    rel,
                    Seen::File {
                        bytes: std::fs::read(&path).unwrap(),
                        mode: meta.permissions().mode() & 0o7777,
                    },
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn sha256_hex(bytes: &[u8]) -> String {
    toolexec_core::sha256_hex(bytes)
}

/// Every entry of a session's tree at `at`, page by page.
async fn tree(app: &TestApp, sid: &str, at: i64) -> Vec<Value> {
    let mut entries = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/sessions/{sid}/tree?at={at}&limit=7");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let resp = app.get(&path).await;
        assert_eq!(resp.status(), 200, "{path}");
        let page: Value = resp.json().await.unwrap();
        assert_eq!(page["at"], at);
        entries.extend(page["entries"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => {
                assert_eq!(page["total"].as_u64(), Some(entries.len() as u64));
                return entries;
            }
        }
    }
}

fn raw_path(entry: &Value) -> Vec<u8> {
    toolexec_core::names::raw_bytes(entry["path"].as_str().unwrap(), entry["path_b64"].as_str())
        .unwrap()
}

/// The tree at `at` is exactly the snapshot: same paths, kinds, hashes, modes and targets.
fn assert_tree_is(entries: &[Value], snap: &BTreeMap<Vec<u8>, Seen>, what: &str) {
    let got: BTreeMap<Vec<u8>, &Value> = entries.iter().map(|e| (raw_path(e), e)).collect();
    let paths: Vec<String> = got
        .keys()
        .map(|k| String::from_utf8_lossy(k).into())
        .collect();
    let want: Vec<String> = snap
        .keys()
        .map(|k| String::from_utf8_lossy(k).into())
        .collect();
    assert_eq!(paths, want, "{what}: paths");
    for (path, seen) in snap {
        let e = got[path];
        match seen {
            Seen::File { bytes, mode } => {
                assert_eq!(e["kind"], "file", "{what}: {e}");
                assert_eq!(e["sha256"], sha256_hex(bytes), "{what}: {e}");
                assert_eq!(e["size"], bytes.len() as u64, "{what}: {e}");
                assert_eq!(e["mode"], *mode, "{what}: {e}");
            }
            Seen::Symlink(target) => {
                assert_eq!(e["kind"], "symlink", "{what}: {e}");
                assert_eq!(
                    toolexec_core::names::raw_bytes(
                        e["symlink_target"].as_str().unwrap(),
                        e["symlink_target_b64"].as_str()
                    )
                    .unwrap(),
                    *target,
                    "{what}: {e}"
                );
            }
        }
    }
}

fn encode_path(raw: &[u8]) -> String {
    raw.iter()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'/' | b'.' | b'-' | b'_' => {
                (*b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `files/{path}?at=` returns exactly the snapshot's bytes, with the hash and mode headers.
async fn assert_file_is(app: &TestApp, sid: &str, at: i64, path: &[u8], seen: &Seen) {
    let url = format!("/v1/sessions/{sid}/files/{}?at={at}", encode_path(path));
    let resp = app.get(&url).await;
    assert_eq!(resp.status(), 200, "{url}");
    let headers = resp.headers().clone();
    let body = resp.bytes().await.unwrap().to_vec();
    match seen {
        Seen::File { bytes, mode } => {
            assert_eq!(&body, bytes, "{url}");
            assert_eq!(headers["x-toolexec-kind"], "file");
            assert_eq!(
                headers["x-toolexec-sha256"].to_str().unwrap(),
                sha256_hex(bytes)
            );
            assert_eq!(
                headers["x-toolexec-mode"].to_str().unwrap(),
                format!("{mode:o}")
            );
        }
        Seen::Symlink(target) => {
            assert_eq!(&body, target, "{url}");
            assert_eq!(headers["x-toolexec-kind"], "symlink");
        }
    }
}

/// The arguments of a `shell` call that has the background process of the script write once
/// (`tick N` to bg.log) and waits until it has: the write is then this call's, deterministically.
fn trigger(n: usize) -> Value {
    json!({"command": format!("echo {n} > go; while [ -f go ]; do sleep 0.02; done")})
}

/// One call of the script, and whether it is a mutating call whose end is a stable point to
/// compare at.
fn script() -> Vec<(&'static str, Value)> {
    let mut s: Vec<(&'static str, Value)> = vec![
        (
            "write_file",
            json!({"file_path": "src/main.py", "content": "print('hello')\n"}),
        ),
        (
            "write_file",
            json!({"file_path": "src/util.py", "content": "def add(a, b):\n    return a + b\n"}),
        ),
        (
            "write_file",
            json!({"file_path": "README.md", "content": "# demo\n"}),
        ),
        ("read_file", json!({"file_path": "src/main.py"})),
        (
            "edit_file",
            json!({"file_path": "src/main.py", "old_string": "hello", "new_string": "hello, world"}),
        ),
        (
            "shell",
            json!({"command": "mkdir -p bin && printf '#!/bin/sh\\necho run\\n' > bin/run.sh && chmod 755 bin/run.sh"}),
        ),
        (
            "shell",
            json!({"command": "ln -s src/main.py main-link && ln -s ../README.md bin/readme"}),
        ),
        // The background process: it writes bg.log whenever `go` appears, then removes `go`.
        (
            "shell",
            json!({"command": "while true; do if [ -f go ]; then echo \"tick $(cat go)\" >> bg.log; rm go; fi; sleep 0.02; done", "background": true}),
        ),
        ("shell", trigger(1)),
        ("glob", json!({"pattern": "**/*.py"})),
        ("grep", json!({"pattern": "def "})),
        (
            "apply_patch",
            json!({"patch": "*** Begin Patch\n*** Update File: src/util.py\n@@\n def add(a, b):\n-    return a + b\n+    return b + a\n*** Add File: src/new.py\n+x = 1\n*** End Patch"}),
        ),
        (
            "shell",
            json!({"command": "chmod 600 README.md && echo more >> README.md"}),
        ),
        (
            "file_copy",
            json!({"source": "src/util.py", "dest": "backup/util.py"}),
        ),
        (
            "shell",
            json!({"command": "rm main-link && ln -s src/util.py main-link"}),
        ),
        ("shell", trigger(2)),
        ("read_file", json!({"file_path": "backup/util.py"})),
        ("file_delete", json!({"path": "backup/util.py"})),
        (
            "shell",
            json!({"command": "mkdir -p deep/a/b/c && for i in 1 2 3 4 5; do echo $i > deep/a/b/c/f$i; done"}),
        ),
        (
            "shell",
            json!({"command": "rm -r deep/a/b && echo kept > deep/keep.txt"}),
        ),
        (
            "shell",
            json!({"command": "printf 'bin\\0ary\\377' > blob.bin && head -c 3000 /dev/zero > zeros"}),
        ),
        (
            "shell",
            json!({"command": "mv src/new.py src/renamed.py && chmod +x src/renamed.py"}),
        ),
        ("list_dir", json!({"path": ".", "depth": 3})),
        ("shell", trigger(3)),
        (
            "shell",
            json!({"command": "printf 'x' > \"$(printf 'bad\\377name')\""}),
        ),
        ("read_file", json!({"file_path": "README.md"})),
        (
            "write_file",
            json!({"file_path": "README.md", "content": "# rewritten\n"}),
        ),
        (
            "shell",
            json!({"command": "rm bin/readme; ln -s /etc/passwd bin/abs-link"}),
        ),
        ("shell", json!({"command": "truncate -s 10 zeros"})),
    ];
    // More rounds of ordinary work, each a few calls.
    for i in 0..12 {
        let name: &'static str = Box::leak(format!("gen/file{i}.txt").into_boxed_str());
        s.push((
            "write_file",
            json!({"file_path": name, "content": format!("generation {i}\n")}),
        ));
        s.push(("shell", json!({"command": format!("echo round {i} >> log.txt; chmod {} gen/file{i}.txt", if i % 2 == 0 { "640" } else { "755" })})));
        if i % 3 == 0 {
            s.push(("shell", trigger(i + 10)));
        }
        if i % 4 == 1 {
            s.push((
                "shell",
                json!({"command": format!("rm -f gen/file{}.txt", i - 1)}),
            ));
        }
    }
    s.push(("shell", json!({"command": "rm -f go log.txt"})));
    s
}

/// The workspace of a session on the host.
fn host_dir(app: &TestApp, sid: &str) -> std::path::PathBuf {
    app.config.workspace_root().join(sid)
}

async fn time_travel(backend: Backend) {
    let app = backend.spawn().await;
    let s = app
        .session(json!({"files": {"seed.txt": "seeded\n"}}))
        .await;
    let sid = s["id"].as_str().unwrap().to_owned();
    let root = host_dir(&app, &sid);
    let mut points: Vec<(i64, BTreeMap<Vec<u8>, Seen>)> =
        vec![(s["last_seq"].as_i64().unwrap(), snapshot(&root))];
    let calls = script();
    assert!(calls.len() >= 60, "{} calls", calls.len());
    for (i, (name, args)) in calls.iter().enumerate() {
        let r = app.call(&sid, &format!("c{i}"), name, args.clone()).await;
        assert_eq!(r["status"], "ok", "call {i} {name} {args}: {r}");
        points.push((r["seq"].as_i64().unwrap(), snapshot(&root)));
    }
    let last = points.last().unwrap().0;

    // Every point of the script, rebuilt from the log, is what the host saw then.
    for (at, snap) in &points {
        let entries = tree(&app, &sid, *at).await;
        assert_tree_is(&entries, snap, &format!("tree at {at}"));
    }
    // A sample of files, byte for byte (and the symlinks' targets, the non-UTF-8 name).
    for (at, snap) in points.iter().step_by(9) {
        for (path, seen) in snap.iter().take(6) {
            assert_file_is(&app, &sid, *at, path, seen).await;
        }
    }
    let (at_end, snap_end) = points.last().unwrap();
    for (path, seen) in snap_end {
        assert_file_is(&app, &sid, *at_end, path, seen).await;
    }
    // What the tree says of an event in the middle of a call: the state after it.
    let out_of_range = app
        .get(&format!("/v1/sessions/{sid}/tree?at={}", last + 1))
        .await;
    assert_eq!(out_of_range.status(), 422);
    let body: Value = out_of_range.json().await.unwrap();
    assert_eq!(body["code"], "seq_out_of_range");
    let missing = app
        .get(&format!("/v1/sessions/{sid}/files/no/such?at={last}"))
        .await;
    assert_eq!(missing.status(), 404);

    // Rewind to the middle of the script: the live workspace is that point again.
    let (mid, mid_snap) = points[20].clone();
    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/rewind"),
            &json!({"to_seq": mid}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let rewound: Value = resp.json().await.unwrap();
    assert_eq!(rewound["to_seq"], mid);
    assert_eq!(
        rewound["processes_stopped"].as_array().unwrap().len(),
        0,
        "the background process started before that point: {rewound}"
    );
    assert_eq!(
        snapshot(&root),
        mid_snap,
        "the live workspace after the rewind"
    );
    let events = app.events(&sid).await;
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "workspace.rewound" && e["seq"] == rewound["seq"])
    );
    // Nothing was erased: the log still has every event, the later points still rebuild.
    let (late, late_snap) = &points[40];
    assert_tree_is(
        &tree(&app, &sid, *late).await,
        late_snap,
        "a later point after the rewind",
    );
    // After the rewind, the tree now is the rewound state.
    let now_seq = app
        .get(&format!("/v1/sessions/{sid}"))
        .await
        .json::<Value>()
        .await
        .unwrap()["last_seq"]
        .as_i64()
        .unwrap();
    assert_tree_is(
        &tree(&app, &sid, now_seq).await,
        &mid_snap,
        "the state right after the rewind",
    );
    // Read-before-write knowledge was reset for what the rewind changed: README.md was read at
    // call 25, after the point rewound to; writing it now needs a new read.
    let w = app
        .call(
            &sid,
            "after-rewind-1",
            "write_file",
            json!({"file_path": "README.md", "content": "again\n"}),
        )
        .await;
    assert_eq!(w["status"], "denied", "{w}");
    let r = app
        .call(
            &sid,
            "after-rewind-2",
            "read_file",
            json!({"file_path": "README.md"}),
        )
        .await;
    assert_eq!(r["status"], "ok");
    let w = app
        .call(
            &sid,
            "after-rewind-3",
            "write_file",
            json!({"file_path": "README.md", "content": "again\n"}),
        )
        .await;
    assert_eq!(w["status"], "ok", "{w}");
    // Work goes on, and is recorded against the rewound state.
    let sh = app
        .call(
            &sid,
            "after-rewind-4",
            "shell",
            json!({"command": "echo after > after.txt; cat README.md"}),
        )
        .await;
    assert_eq!(sh["status"], "ok", "{sh}");
    let now = sh["seq"].as_i64().unwrap();
    assert_tree_is(
        &tree(&app, &sid, now).await,
        &snapshot(&root),
        "after the rewind, working on",
    );

    // Closed, its workspace removed: every point still rebuilds from the log.
    let closed = app.delete(&format!("/v1/sessions/{sid}")).await;
    assert_eq!(closed.status(), 200);
    assert!(!root.exists(), "the workspace was removed");
    for (at, snap) in points.iter().step_by(5) {
        assert_tree_is(
            &tree(&app, &sid, *at).await,
            snap,
            &format!("closed, tree at {at}"),
        );
    }
    let (at, snap) = &points[30];
    for (path, seen) in snap.iter().take(4) {
        assert_file_is(&app, &sid, *at, path, seen).await;
    }
}

/// A hundred forks of one state share it (one base, where the service can mount overlays),
/// each diverges on its own, and the source does not change.
async fn hundred_forks(backend: Backend) {
    let app = backend.spawn().await;
    let mut files = serde_json::Map::new();
    for i in 0..50 {
        files.insert(format!("src/f{i}.txt"), json!(format!("file {i}\n")));
    }
    let s = app.session(json!({"files": files})).await;
    let sid = s["id"].as_str().unwrap().to_owned();
    let r = app
        .call(
            &sid,
            "c1",
            "shell",
            json!({"command": "chmod 700 src/f0.txt; ln -s src/f1.txt link"}),
        )
        .await;
    assert_eq!(r["status"], "ok");
    let at = r["seq"].as_i64().unwrap();
    let source_snap = snapshot(&host_dir(&app, &sid));
    // The source moves on after the fork point: forks do not see it.
    app.call(
        &sid,
        "c2",
        "shell",
        json!({"command": "echo later > later.txt"}),
    )
    .await;

    let mut forks = Vec::new();
    for i in 0..100 {
        let resp = app
            .post(
                &format!("/v1/sessions/{sid}/fork"),
                &json!({"at_seq": at, "metadata": {"variant": i}}),
            )
            .await;
        assert_eq!(
            resp.status(),
            201,
            "{}",
            resp.text().await.unwrap_or_default()
        );
        let fork: Value = resp.json().await.unwrap();
        assert_eq!(fork["origin"]["kind"], "fork");
        assert_eq!(fork["origin"]["session_id"], sid);
        assert_eq!(fork["origin"]["seq"], at);
        assert_eq!(fork["metadata"]["variant"], i);
        assert_eq!(fork["unrestorable"], json!([]));
        forks.push(fork);
    }
    let shares = forks[0]["shares_contents"].as_bool().unwrap();
    let fid = |i: usize| forks[i]["id"].as_str().unwrap().to_owned();
    // Each starts as the source was at the fork point …
    for i in [0, 37, 99] {
        assert_eq!(snapshot(&host_dir(&app, &fid(i))), source_snap, "fork {i}");
        let events = app.events(&fid(i)).await;
        assert_eq!(events[0]["kind"], "session.created");
        assert_eq!(events[0]["data"]["origin"]["session_id"], sid);
        assert_tree_is(
            &tree(&app, &fid(i), 1).await,
            &source_snap,
            "fork's tree at 1",
        );
    }
    // … and diverges alone: an in-place append (not through the jail) in one fork changes no
    // other fork and not the source.
    for i in 0..100 {
        let r = app
            .call(
                &fid(i),
                "d1",
                "shell",
                json!({"command": format!("echo variant {i} >> src/f2.txt; echo {i} > mine.txt")}),
            )
            .await;
        assert_eq!(r["status"], "ok", "{r}");
    }
    for i in [0, 50, 99] {
        let f2 = std::fs::read_to_string(host_dir(&app, &fid(i)).join("src/f2.txt")).unwrap();
        assert_eq!(f2, format!("file 2\nvariant {i}\n"));
        let entries = tree(&app, &fid(i), app.events(&fid(i)).await.len() as i64).await;
        let mine = entries.iter().find(|e| e["path"] == "mine.txt").unwrap();
        assert_eq!(mine["sha256"], sha256_hex(format!("{i}\n").as_bytes()));
    }
    assert_eq!(
        std::fs::read_to_string(host_dir(&app, &sid).join("src/f2.txt")).unwrap(),
        "file 2\n"
    );
    let layers = app.config.workspace_root().join(".layers");
    let bases = std::fs::read_dir(&layers)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("base-"))
                .count()
        })
        .unwrap_or(0);
    if shares {
        assert_eq!(bases, 1, "one base for a hundred forks of one state");
    } else {
        assert_eq!(bases, 0);
    }
    // A fork of a fork, and a policy that would loosen the source's.
    let resp = app
        .post(&format!("/v1/sessions/{}/fork", fid(3)), &json!({}))
        .await;
    assert_eq!(resp.status(), 201);
    let grand: Value = resp.json().await.unwrap();
    let g = grand["id"].as_str().unwrap();
    assert_eq!(
        std::fs::read_to_string(host_dir(&app, g).join("mine.txt")).unwrap(),
        "3\n"
    );
    let strict = app
        .session(json!({"policy": {"default_timeout_ms": 1000}, "tools": ["shell", "read_file"]}))
        .await;
    let strict_id = strict["id"].as_str().unwrap();
    for (body, field) in [
        (
            json!({"policy": {"default_timeout_ms": 5000}}),
            "default_timeout_ms",
        ),
        (json!({"tools": ["shell", "write_file"]}), "write_file"),
    ] {
        let resp = app
            .post(&format!("/v1/sessions/{strict_id}/fork"), &body)
            .await;
        assert_eq!(resp.status(), 422);
        let p: Value = resp.json().await.unwrap();
        assert_eq!(p["code"], "policy_not_tighter", "{p}");
        assert!(p["detail"].as_str().unwrap().contains(field), "{p}");
    }
    // A fork's policy that leaves the timeout out keeps the source's, never the service's
    // larger default.
    let resp = app
        .post(
            &format!("/v1/sessions/{strict_id}/fork"),
            &json!({"policy": {"network": "none"}}),
        )
        .await;
    assert_eq!(resp.status(), 201);
    let kept: Value = resp.json().await.unwrap();
    assert_eq!(kept["policy"]["default_timeout_ms"], 1000, "{kept}");
    app.delete(&format!("/v1/sessions/{}", kept["id"].as_str().unwrap()))
        .await;
    // A chain of forks stops where a rebuild would no longer follow it.
    let mut tip = strict_id.to_owned();
    for depth in 1..=64 {
        let resp = app
            .post(&format!("/v1/sessions/{tip}/fork"), &json!({}))
            .await;
        assert_eq!(resp.status(), 201, "fork {depth} of the chain");
        let next: Value = resp.json().await.unwrap();
        if depth > 1 {
            app.delete(&format!("/v1/sessions/{tip}")).await;
        }
        tip = next["id"].as_str().unwrap().to_owned();
    }
    let resp = app
        .post(&format!("/v1/sessions/{tip}/fork"), &json!({}))
        .await;
    assert_eq!(resp.status(), 422);
    let p: Value = resp.json().await.unwrap();
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("fork an earlier session"),
        "{p}"
    );
    assert_eq!(
        tree(&app, &tip, 1).await.len(),
        0,
        "the deepest fork still rebuilds"
    );
    app.delete(&format!("/v1/sessions/{tip}")).await;
    // Closing every fork takes the base with the last one.
    for i in 0..100 {
        assert_eq!(
            app.delete(&format!("/v1/sessions/{}", fid(i)))
                .await
                .status(),
            200
        );
    }
    assert_eq!(app.delete(&format!("/v1/sessions/{g}")).await.status(), 200);
    let bases = std::fs::read_dir(&layers)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("base-"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(bases, 0, "no fork uses the base any more");
}

/// Files the log holds by hash only are said, never guessed.
async fn what_cannot_be_restored(backend: Backend) {
    let app = backend.spawn_with(|c| c.limits.max_blob_bytes = 1024).await;
    let s = app.session(json!({})).await;
    let sid = s["id"].as_str().unwrap().to_owned();
    let r = app
        .call(
            &sid,
            "c1",
            "shell",
            json!({"command": "head -c 5000 /dev/urandom > big.bin; echo small > small.txt"}),
        )
        .await;
    let at = r["seq"].as_i64().unwrap();
    let entries = tree(&app, &sid, at).await;
    let big = entries.iter().find(|e| e["path"] == "big.bin").unwrap();
    assert_eq!(big["restorable"], false, "{big}");
    assert_eq!(big["unstored"], "too_large", "{big}");
    let resp = app
        .get(&format!("/v1/sessions/{sid}/files/big.bin?at={at}"))
        .await;
    assert_eq!(resp.status(), 409);
    let p: Value = resp.json().await.unwrap();
    assert_eq!(p["code"], "content_not_recorded", "{p}");
    let resp = app
        .post(&format!("/v1/sessions/{sid}/fork"), &json!({"at_seq": at}))
        .await;
    assert_eq!(resp.status(), 409);
    let p: Value = resp.json().await.unwrap();
    assert_eq!(p["code"], "unrestorable", "{p}");
    assert!(p["detail"].as_str().unwrap().contains("big.bin"), "{p}");
    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/fork"),
            &json!({"at_seq": at, "allow_partial": true}),
        )
        .await;
    assert_eq!(resp.status(), 201);
    let fork: Value = resp.json().await.unwrap();
    assert_eq!(fork["unrestorable"], json!(["big.bin"]));
    let fork_dir = host_dir(&app, fork["id"].as_str().unwrap());
    assert!(!fork_dir.join("big.bin").exists());
    assert_eq!(
        std::fs::read_to_string(fork_dir.join("small.txt")).unwrap(),
        "small\n"
    );
}

/// A deterministic session replays with no divergence; `date` and `$RANDOM` are reported at
/// their call, with the line.
async fn verify_replay(backend: Backend) {
    let app = backend.spawn().await;
    let s = app.session(json!({"files": {"a.txt": "alpha\n"}})).await;
    let sid = s["id"].as_str().unwrap().to_owned();
    let steps = [
        ("read_file", json!({"file_path": "a.txt"})),
        (
            "edit_file",
            json!({"file_path": "a.txt", "old_string": "alpha", "new_string": "beta"}),
        ),
        (
            "shell",
            json!({"command": "seq 1 20 > n.txt; chmod 755 n.txt; ln -s n.txt l; cat a.txt"}),
        ),
        ("grep", json!({"pattern": "beta"})),
        (
            "write_file",
            json!({"file_path": "big.txt", "content": "line\n".repeat(30_000)}),
        ),
        ("read_file", json!({"file_path": "big.txt"})),
        ("shell", json!({"command": "wc -l big.txt; rm l"})),
        ("list_dir", json!({"path": "."})),
    ];
    for (i, (name, args)) in steps.iter().enumerate() {
        let r = app.call(&sid, &format!("d{i}"), name, args.clone()).await;
        assert_eq!(r["status"], "ok", "{r}");
    }
    // read_output of an earlier (truncated) call: the replay must point it at its own.
    let big_read = app
        .events(&sid)
        .await
        .into_iter()
        .find(|e| e["kind"] == "invocation.finished" && e["data"]["call_id"] == "d5")
        .unwrap();
    let inv = big_read["invocation_id"].as_str().unwrap().to_owned();
    let r = app
        .call(
            &sid,
            "d8",
            "read_output",
            json!({"invocation_id": inv, "offset": 100, "limit": 50}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let rewound = app
        .post(&format!("/v1/sessions/{sid}/rewind"), &json!({"to_seq": 2}))
        .await;
    assert_eq!(rewound.status(), 200);
    let r = app
        .call(&sid, "d9", "shell", json!({"command": "ls; cat a.txt"}))
        .await;
    assert_eq!(r["status"], "ok");

    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/replay"),
            &json!({"mode": "verify"}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let replay: Value = resp.json().await.unwrap();
    assert_eq!(replay["status"], "finished", "{replay}");
    assert_eq!(replay["calls_total"], 10);
    assert_eq!(replay["calls_replayed"], 10);
    assert_eq!(replay["calls_diverged"], 0, "{replay:#}");
    for c in replay["calls"].as_array().unwrap() {
        assert!(
            c["status_matched"] == true
                && c["output_matched"] == true
                && c["side_effects_matched"] == true,
            "{c}"
        );
    }
    // The replay is a session of its own, with the recorded call ids, and can be read later.
    let rid = replay["id"].as_str().unwrap();
    let again: Value = app
        .get(&format!("/v1/replays/{rid}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again["calls_diverged"], 0);
    let rsid = replay["session_id"].as_str().unwrap();
    let rs: Value = app
        .get(&format!("/v1/sessions/{rsid}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(rs["origin"]["kind"], "replay");
    assert_eq!(rs["origin"]["session_id"], sid);
    let finished: Vec<String> = app
        .events(rsid)
        .await
        .into_iter()
        .filter(|e| e["kind"] == "invocation.finished")
        .map(|e| e["data"]["call_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        finished,
        (0..10).map(|i| format!("d{i}")).collect::<Vec<_>>()
    );

    // Non-determinism, reported precisely.
    let s = app.session(json!({})).await;
    let nid = s["id"].as_str().unwrap().to_owned();
    app.call(&nid, "n0", "shell", json!({"command": "echo stable"}))
        .await;
    app.call(
        &nid,
        "n1",
        "shell",
        json!({"command": "echo first; date +%s%N; echo last"}),
    )
    .await;
    app.call(
        &nid,
        "n2",
        "shell",
        json!({"command": "echo $RANDOM$RANDOM > r.txt"}),
    )
    .await;
    app.call(&nid, "n3", "shell", json!({"command": "echo stable again"}))
        .await;
    let resp = app
        .post(&format!("/v1/sessions/{nid}/replay"), &json!({}))
        .await;
    assert_eq!(resp.status(), 200);
    let replay: Value = resp.json().await.unwrap();
    assert_eq!(replay["calls_diverged"], 2, "{replay:#}");
    let calls = replay["calls"].as_array().unwrap();
    assert_eq!(calls[0]["divergences"], json!([]));
    assert_eq!(calls[3]["divergences"], json!([]));
    let d = &calls[1]["divergences"];
    assert_eq!(d.as_array().unwrap().len(), 1, "{d}");
    assert_eq!(d[0]["aspect"], "output");
    // "[exit code …]", "--- stdout ---", "first", then the date.
    assert_eq!(d[0]["line"], 4, "{d}");
    assert_ne!(d[0]["recorded"], d[0]["replayed"]);
    let d = &calls[2]["divergences"];
    assert_eq!(d[0]["aspect"], "side_effects", "{d}");
    assert_eq!(d[0]["path"], "r.txt", "{d}");
}

toolexec_tests::on_both_stores!(
    time_travel,
    hundred_forks,
    what_cannot_be_restored,
    verify_replay,
    rewind_stops_later_processes,
    a_rewind_raced_by_a_writer_records_what_is_on_disk,
    what_a_rebuild_may_cost_is_bounded
);

/// Another replica of `app`'s service: the same database and the same workspaces (shared
/// storage), its own node name.
async fn replica(
    app: &TestApp,
    node: &str,
    adjust: impl FnOnce(&mut toolexec_server::Config),
) -> TestApp {
    let mut config = app.config.clone();
    config.node = Some(node.into());
    adjust(&mut config);
    TestApp::start(config, app.data.clone(), app.db.clone()).await
}

/// Reads SSE events (`id`, `event`) from a response until `n` arrived or `within` passed.
async fn read_sse(
    resp: &mut reqwest::Response,
    n: usize,
    within: Duration,
) -> Vec<(Option<i64>, String)> {
    let mut out = Vec::new();
    let mut buf = String::new();
    let deadline = tokio::time::Instant::now() + within;
    while out.len() < n {
        let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(deadline, resp.chunk()).await else {
            break;
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let mut id = None;
            let mut kind = None;
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.parse().ok();
                } else if let Some(v) = line.strip_prefix("event: ") {
                    kind = Some(v.to_owned());
                }
            }
            if let Some(kind) = kind {
                out.push((id, kind));
            }
        }
    }
    out
}

/// The log as a stream: from the start, a reconnect with Last-Event-ID mid-stream, events a
/// second replica on the same Postgres writes, the end at `session.closed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_log_streams_across_a_reconnect_and_a_second_replica() {
    let a = Backend::Postgres.spawn().await;
    let b = replica(&a, "replica-b", |_| {}).await;
    let s = a.session(json!({})).await;
    let sid = s["id"].as_str().unwrap().to_owned();
    for i in 0..5 {
        a.call(
            &sid,
            &format!("a{i}"),
            "write_file",
            json!({"file_path": format!("a{i}.txt"), "content": "x"}),
        )
        .await;
    }
    let mut stream = a
        .http
        .get(a.url(&format!("/v1/sessions/{sid}/events/stream")))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert!(
        stream.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let first = read_sse(&mut stream, 10, Duration::from_secs(10)).await;
    let ids: Vec<i64> = first.iter().filter_map(|(id, _)| *id).collect();
    assert_eq!(ids, (1..=10).collect::<Vec<_>>());
    assert_eq!(first[0].1, "session.created");
    drop(stream);
    // Events recorded while nobody listened, some by the other replica.
    for i in 0..3 {
        b.call(
            &sid,
            &format!("b{i}"),
            "write_file",
            json!({"file_path": format!("b{i}.txt"), "content": "y"}),
        )
        .await;
    }
    let mut stream = a
        .http
        .get(a.url(&format!("/v1/sessions/{sid}/events/stream")))
        .header("Last-Event-ID", "10")
        .send()
        .await
        .unwrap();
    let resumed = read_sse(&mut stream, 100, Duration::from_secs(2)).await;
    let last_before = a.events(&sid).await.len() as i64;
    let ids: Vec<i64> = resumed.iter().filter_map(|(id, _)| *id).collect();
    assert_eq!(
        ids,
        (11..=last_before).collect::<Vec<_>>(),
        "no gap, no repeat"
    );
    // Live: written by the other replica while this stream is open.
    b.call(
        &sid,
        "b-live",
        "write_file",
        json!({"file_path": "live.txt", "content": "z"}),
    )
    .await;
    let live = read_sse(&mut stream, 3, Duration::from_secs(5)).await;
    let ids: Vec<i64> = live.iter().filter_map(|(id, _)| *id).collect();
    assert_eq!(
        ids,
        (last_before + 1..=last_before + 3).collect::<Vec<_>>(),
        "{live:?}"
    );
    assert_eq!(live[0].1, "invocation.started");
    // Closing the session ends the stream after session.closed.
    assert_eq!(b.delete(&format!("/v1/sessions/{sid}")).await.status(), 200);
    let end = read_sse(&mut stream, 10, Duration::from_secs(5)).await;
    assert_eq!(
        end.last().map(|(_, k)| k.as_str()),
        Some("session.closed"),
        "{end:?}"
    );
    let after_end = tokio::time::timeout(Duration::from_secs(5), stream.chunk()).await;
    assert!(
        matches!(after_end, Ok(Ok(None))),
        "the stream ended: {after_end:?}"
    );
    // ?after= resumes as Last-Event-ID does; a bad Last-Event-ID is a 400.
    let mut again = a
        .http
        .get(a.url(&format!(
            "/v1/sessions/{sid}/events/stream?after={last_before}"
        )))
        .send()
        .await
        .unwrap();
    let tail = read_sse(&mut again, 100, Duration::from_secs(3)).await;
    assert_eq!(tail.first().and_then(|(id, _)| *id), Some(last_before + 1));
    let bad = a
        .http
        .get(a.url(&format!("/v1/sessions/{sid}/events/stream")))
        .header("Last-Event-ID", "x")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

/// A reader that does not read is cut off with a final event, and the others go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_reader_that_falls_behind_is_disconnected_with_a_final_event() {
    let app = Backend::Sqlite.spawn().await;
    let s = app.session(json!({})).await;
    let sid = s["id"].as_str().unwrap().to_owned();
    let mut slow = app
        .http
        .get(app.url(&format!("/v1/sessions/{sid}/events/stream")))
        .send()
        .await
        .unwrap();
    let got = read_sse(&mut slow, 1, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 1);
    // Big events first, to fill the sockets between (each write_file's invocation.started
    // carries its 400 KiB, sent whole: under the stream's 512 KiB buffer), then far more than
    // the stream's buffer, while the slow reader reads nothing.
    let content = "x".repeat(400 << 10);
    for k in 0..30 {
        app.call(
            &sid,
            &format!("w{k}"),
            "write_file",
            json!({"file_path": format!("f{k}.txt"), "content": content}),
        )
        .await;
    }
    app.call(
        &sid,
        "small",
        "write_file",
        json!({"file_path": "small.txt", "content": "s"}),
    )
    .await;
    for n in 0..10 {
        let batch: Vec<Value> = (0..64)
            .map(|k| json!({"id": format!("r{n}-{k}"), "name": "read_file", "arguments": {"file_path": "small.txt"}}))
            .collect();
        app.calls(&sid, json!(batch)).await;
    }
    let rest = read_sse(&mut slow, 100_000, Duration::from_secs(10)).await;
    assert_eq!(
        rest.last().map(|(_, k)| k.as_str()),
        Some("stream.overflow"),
        "{} events, last {:?}",
        rest.len(),
        rest.last()
    );
    // A new reader gets everything.
    let mut fresh = app
        .http
        .get(app.url(&format!("/v1/sessions/{sid}/events/stream")))
        .send()
        .await
        .unwrap();
    let all = read_sse(&mut fresh, 100_000, Duration::from_secs(10)).await;
    let total = app
        .get(&format!("/v1/sessions/{sid}"))
        .await
        .json::<Value>()
        .await
        .unwrap()["last_seq"]
        .as_i64()
        .unwrap();
    assert_eq!(all.len() as i64, total);
}

/// Two replicas on one Postgres (and one workspace root): a call sent to the second while the
/// first runs a mutating call of the same session waits for it — the lease in the database,
/// not only the lock in memory — and a replica that cannot get the lease in time says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_never_interleave_a_sessions_calls() {
    let a = Backend::Postgres.spawn().await;
    let b = replica(&a, "replica-b", |_| {}).await;
    let s = a.session(json!({})).await;
    let sid = s["id"].as_str().unwrap().to_owned();
    let slow = {
        let (url, http, sid) = (
            a.url(&format!("/v1/sessions/{sid}/calls")),
            a.http.clone(),
            sid.clone(),
        );
        tokio::spawn(async move {
            let _ = sid;
            http.post(url)
                .json(&json!({"calls": [{"id": "slow", "name": "shell", "arguments": {"command": "sleep 1.5; echo a > a.txt"}}]}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = b
        .call(&sid, "other", "shell", json!({"command": "cat a.txt"}))
        .await;
    let slow = slow.await.unwrap();
    assert_eq!(slow["results"][0]["status"], "ok", "{slow}");
    // B ran after A's call had finished: it saw its file, and its start follows A's finish.
    assert_eq!(r["status"], "ok", "{r}");
    assert!(r["content"].as_str().unwrap().contains("\na\n"), "{r}");
    let events = a.events(&sid).await;
    let seq_of = |kind: &str, call: &str| {
        events
            .iter()
            .find(|e| e["kind"] == kind && (e["data"]["call_id"] == call))
            .and_then(|e| e["seq"].as_i64())
            .unwrap()
    };
    assert!(seq_of("invocation.started", "other") > seq_of("invocation.finished", "slow"));

    // A replica that waits for the lease longer than it may answers 503, naming the holder.
    let c = replica(&a, "replica-c", |c| c.limits.lease_wait_ms = 300).await;
    let slow = {
        let (url, http) = (a.url(&format!("/v1/sessions/{sid}/calls")), a.http.clone());
        tokio::spawn(async move {
            http.post(url)
                .json(&json!({"calls": [{"id": "slow2", "name": "shell", "arguments": {"command": "sleep 1.5"}}]}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    // Until A runs it (it may first wait for B to let the lease go).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !a
        .events(&sid)
        .await
        .iter()
        .any(|e| e["kind"] == "invocation.started" && e["data"]["call_id"] == "slow2")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "slow2 never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let resp = c
        .post(&format!("/v1/sessions/{sid}/calls"), &json!({"calls": [{"id": "c", "name": "read_file", "arguments": {"file_path": "a.txt"}}]}))
        .await;
    assert_eq!(resp.status(), 503);
    let p: Value = resp.json().await.unwrap();
    assert_eq!(p["code"], "unavailable");
    assert!(p["detail"].as_str().unwrap().contains("test-node"), "{p}");
    assert_eq!(slow.await.unwrap(), 200);
    // Nothing of the refused call was recorded; once A lets go, C runs it.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let r = c
        .call(&sid, "c", "read_file", json!({"file_path": "a.txt"}))
        .await;
    assert_eq!(r["status"], "ok", "{r}");
}

/// A rewind stops the background processes started after the point it goes back to, records
/// their exits, and leaves the ones started before running.
async fn rewind_stops_later_processes(backend: Backend) {
    let app = backend.spawn().await;
    let s = app.session(json!({})).await;
    let sid = s["id"].as_str().unwrap().to_owned();
    let early = app
        .call(
            &sid,
            "early",
            "shell",
            json!({"command": "sleep 300", "background": true}),
        )
        .await;
    assert_eq!(early["status"], "ok", "{early}");
    let point = app
        .call(
            &sid,
            "w",
            "write_file",
            json!({"file_path": "a.txt", "content": "a\n"}),
        )
        .await["seq"]
        .as_i64()
        .unwrap();
    let late = app
        .call(&sid, "late", "shell", json!({"command": "while true; do date >> late.log; sleep 0.05; done", "background": true}))
        .await;
    assert_eq!(late["status"], "ok", "{late}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/rewind"),
            &json!({"to_seq": point}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let rewound: Value = resp.json().await.unwrap();
    assert_eq!(rewound["processes_stopped"], json!(["p2"]), "{rewound}");
    // late.log is gone and stays gone: its writer was stopped before the files were put back.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!host_dir(&app, &sid).join("late.log").exists());
    let events = app.events(&sid).await;
    let exited: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "process.exited" && e["seq"].as_i64() > rewound["seq"].as_i64())
        .collect();
    assert_eq!(exited.len(), 1, "{events:?}");
    assert_eq!(exited[0]["data"]["process_id"], "p2");
    let r = app
        .call(
            &sid,
            "read-early",
            "process_read",
            json!({"process_id": "p1"}),
        )
        .await;
    assert!(r["content"].as_str().unwrap().contains("running"), "{r}");
}

/// A background process started before the point a rewind goes back to keeps running, and
/// keeps writing while the rewind puts files back: the rewind records what it found right
/// after, and that is the next scan's baseline, so the log still explains every byte on disk.
async fn a_rewind_raced_by_a_writer_records_what_is_on_disk(backend: Backend) {
    let app = backend.spawn().await;
    let s = app.session(json!({})).await;
    let sid = s["id"].as_str().unwrap().to_owned();
    let writer = app
        .call(
            &sid,
            "writer",
            "shell",
            json!({"command": "i=0; while true; do i=$((i+1)); echo $i > racer.txt; echo $i >> grow.log; done", "background": true}),
        )
        .await;
    assert_eq!(writer["status"], "ok", "{writer}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let point = app
        .call(
            &sid,
            "w",
            "write_file",
            json!({"file_path": "a.txt", "content": "a\n"}),
        )
        .await["seq"]
        .as_i64()
        .unwrap();
    for k in 0..5 {
        app.call(
            &sid,
            &format!("later{k}"),
            "write_file",
            json!({"file_path": format!("later{k}.txt"), "content": "later\n"}),
        )
        .await;
    }
    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/rewind"),
            &json!({"to_seq": point}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let rewound: Value = resp.json().await.unwrap();
    assert_eq!(rewound["processes_stopped"], json!([]), "{rewound}");
    // What the writer changed meanwhile (if it was scheduled in that moment) is named, not
    // claimed restored; nothing else is.
    let named: Vec<&str> = rewound["unrestorable"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        named.iter().all(|n| ["grow.log", "racer.txt"].contains(n)),
        "{rewound}"
    );
    let kill = app
        .call(&sid, "kill", "process_kill", json!({"process_id": "p1"}))
        .await;
    assert_eq!(kill["status"], "ok", "{kill}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let last = app
        .call(&sid, "settle", "shell", json!({"command": "true"}))
        .await["seq"]
        .as_i64()
        .unwrap();
    let on_disk = snapshot(&host_dir(&app, &sid));
    assert!(!on_disk.contains_key(b"later0.txt".as_slice()));
    assert_tree_is(
        &tree(&app, &sid, last).await,
        &on_disk,
        "after a raced rewind",
    );
    // And no step of the way is skipped: every file change recorded after the rewind starts
    // from what the log said the file was (a write the record missed would show here).
    let rewind_seq = rewound["seq"].as_i64().unwrap();
    let mut checked = 0;
    for event in app.events(&sid).await {
        let seq = event["seq"].as_i64().unwrap();
        let kind = event["kind"].as_str().unwrap();
        if seq <= rewind_seq || !kind.starts_with("file.") {
            continue;
        }
        let path = event["data"]["path"].as_str().unwrap();
        let before = tree(&app, &sid, seq - 1).await;
        let was = before.iter().find(|e| e["path"] == path);
        match kind {
            "file.created" => assert!(was.is_none(), "{event} but the log had {was:?}"),
            _ => assert_eq!(
                was.map(|e| &e["sha256"]),
                Some(&event["data"]["before_sha256"]),
                "{event} does not start where the log was"
            ),
        }
        checked += 1;
    }
    assert!(
        checked > 0,
        "the writer's last changes are recorded after the rewind"
    );
}

/// A state too large to rebuild is refused with its own code, and a tenant's event streams are
/// capped on a node (the slot coming back when a client goes away).
async fn what_a_rebuild_may_cost_is_bounded(backend: Backend) {
    let app = backend
        .spawn_with(|c| {
            c.limits.max_state_entries = 5;
            c.limits.max_streams_per_tenant = 1;
        })
        .await;
    let s = app.session(json!({})).await;
    let sid = s["id"].as_str().unwrap().to_owned();
    let small = app
        .call(&sid, "few", "shell", json!({"command": "touch a b c"}))
        .await["seq"]
        .as_i64()
        .unwrap();
    let many = app
        .call(
            &sid,
            "many",
            "shell",
            json!({"command": "touch d e f g h i"}),
        )
        .await["seq"]
        .as_i64()
        .unwrap();
    assert_eq!(tree(&app, &sid, small).await.len(), 3);
    let resp = app.get(&format!("/v1/sessions/{sid}/tree?at={many}")).await;
    assert_eq!(resp.status(), 409);
    let p: Value = resp.json().await.unwrap();
    assert_eq!(p["code"], "state_too_large", "{p}");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("limits.max_state_entries"),
        "{p}"
    );
    let resp = app
        .post(
            &format!("/v1/sessions/{sid}/fork"),
            &json!({"at_seq": many}),
        )
        .await;
    assert_eq!(resp.status(), 409);

    let stream = |app: &TestApp| {
        app.http
            .get(app.url(&format!("/v1/sessions/{sid}/events/stream")))
            .send()
    };
    let mut first = stream(&app).await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(
        !read_sse(&mut first, 1, Duration::from_secs(5))
            .await
            .is_empty()
    );
    let second = stream(&app).await.unwrap();
    assert_eq!(second.status(), 429);
    let p: Value = second.json().await.unwrap();
    assert_eq!(p["code"], "too_many_concurrent", "{p}");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("limits.max_streams_per_tenant"),
        "{p}"
    );
    drop(first);
    // The slot comes back once the server sees the client gone (its next write fails).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for poke in 0.. {
        app.call(&sid, &format!("poke{poke}"), "list_dir", json!({}))
            .await;
        let again = stream(&app).await.unwrap();
        if again.status() == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream slot never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
