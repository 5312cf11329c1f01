//! Getting a project in and out: `PUT /v1/sessions/{id}/archive` (tar, tar.gz) checked whole,
//! jailed, recorded; `GET` the workspace back as tar, now or at a step.
use std::io::{Read, Write};

use serde_json::{Value, json};
use toolexec_tests::app::{TestApp, spawn_app, spawn_app_with};

/// A tar built entry by entry: (path, kind).
pub(crate) enum E<'a> {
    File(&'a str, &'a [u8], u32),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    HardLink(&'a str, &'a str),
    Fifo(&'a str),
    Char(&'a str),
}

pub(crate) fn tar_of(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        match e {
            E::File(p, data, mode) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                // Raw names: the builder would refuse `..` and absolute paths itself.
                raw_name(&mut h, p);
                h.set_cksum();
                b.append(&h, *data).unwrap();
            }
            E::Dir(p) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                raw_name(&mut h, p);
                h.set_cksum();
                b.append(&h, &[][..]).unwrap();
            }
            E::Symlink(p, t) | E::HardLink(p, t) => {
                h.set_entry_type(if matches!(e, E::Symlink(..)) {
                    tar::EntryType::Symlink
                } else {
                    tar::EntryType::Link
                });
                h.set_mode(0o777);
                h.set_size(0);
                raw_name(&mut h, p);
                h.set_link_name_literal(t).unwrap();
                h.set_cksum();
                b.append(&h, &[][..]).unwrap();
            }
            E::Fifo(p) | E::Char(p) => {
                h.set_entry_type(if matches!(e, E::Fifo(_)) {
                    tar::EntryType::Fifo
                } else {
                    tar::EntryType::Char
                });
                h.set_mode(0o644);
                h.set_size(0);
                raw_name(&mut h, p);
                h.set_cksum();
                b.append(&h, &[][..]).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

pub(crate) fn raw_name(h: &mut tar::Header, path: &str) {
    let name = &mut h.as_old_mut().name;
    name.fill(0);
    name[..path.len()].copy_from_slice(path.as_bytes());
}

pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

pub(crate) async fn put(app: &TestApp, sid: &str, body: Vec<u8>) -> (u16, Value) {
    let resp = app
        .http
        .put(app.url(&format!("/v1/sessions/{sid}/archive")))
        .header("content-type", "application/x-tar")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

pub(crate) async fn get_tar(
    app: &TestApp,
    sid: &str,
    query: &str,
) -> (u16, Vec<(String, Vec<u8>, u32, Option<String>)>) {
    let resp = app.get(&format!("/v1/sessions/{sid}/archive{query}")).await;
    let status = resp.status().as_u16();
    if status != 200 {
        return (status, Vec::new());
    }
    assert_eq!(resp.headers()["content-type"], "application/x-tar");
    let bytes = resp.bytes().await.unwrap();
    let mut out = Vec::new();
    let mut archive = tar::Archive::new(&bytes[..]);
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
        let mode = entry.header().mode().unwrap();
        let link = entry
            .link_name_bytes()
            .map(|l| String::from_utf8(l.into_owned()).unwrap());
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        out.push((path, data, mode, link));
    }
    (status, out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_goes_in_as_tar_gz_is_recorded_and_comes_back_out_at_any_step() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let binary: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let project = tar_of(&[
        E::Dir("./"),
        E::Dir("./src/"),
        E::File("./src/main.rs", b"fn main() { println!(\"hi\"); }\n", 0o644),
        E::File(
            "./bin/run.sh",
            b"#!/bin/sh\necho ran from the archive\n",
            0o4755,
        ),
        E::File("./assets/blob.bin", &binary, 0o600),
        E::Symlink("./main.rs", "src/main.rs"),
        E::Symlink("./bin/up", "../src"),
        E::Dir("./empty/"),
    ]);
    let (status, body) = put(&app, &sid, gzip(&project)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["files"], 3, "{body}");
    assert_eq!(body["symlinks"], 2, "{body}");
    assert_eq!(body["directories"], 3, "{body}");
    assert_eq!(body["events"], 5, "{body}");
    let after_upload = body["last_seq"].as_i64().unwrap();

    // The files are there for the tools and the sandbox, modes kept (setuid dropped).
    let r = app
        .call(&sid, "run", "shell", json!({"command": "stat -c '%a %n' bin/run.sh && ./bin/run.sh && cat main.rs && ls bin/up/"}))
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    let text = r["content"].as_str().unwrap();
    assert!(text.contains("755 bin/run.sh"), "{r}");
    assert!(text.contains("ran from the archive"), "{r}");
    assert!(text.contains("fn main()"), "{r}");
    assert!(text.contains("main.rs"), "{r}");
    // Uploaded files were not read by the model: read-before-write holds.
    let w = app
        .call(
            &sid,
            "w",
            "write_file",
            json!({"file_path": "src/main.rs", "content": "x"}),
        )
        .await;
    assert!(
        w["content"].as_str().unwrap().contains("has not been read"),
        "{w}"
    );

    // Recorded: one file event per file and symlink, with the contents as blobs.
    let events = app.events(&sid).await;
    let created: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "file.created" && e["seq"].as_i64().unwrap() <= after_upload)
        .collect();
    assert_eq!(created.len(), 5, "{events:?}");
    assert!(created.iter().all(|e| e["invocation_id"].is_null()));
    let bin = created
        .iter()
        .find(|e| e["data"]["path"] == "assets/blob.bin")
        .unwrap();
    assert_eq!(bin["data"]["after_stored"], true, "{bin}");
    assert_eq!(bin["data"]["after_size"], 70_000);

    // Out again, from the log: at the upload, and before it (empty).
    let (status, entries) = get_tar(&app, &sid, &format!("?at={after_upload}")).await;
    assert_eq!(status, 200);
    let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "assets/blob.bin",
            "bin/run.sh",
            "bin/up",
            "main.rs",
            "src/main.rs"
        ]
    );
    let blob = entries.iter().find(|e| e.0 == "assets/blob.bin").unwrap();
    assert_eq!(blob.1, binary);
    assert_eq!(blob.2, 0o600);
    let run = entries.iter().find(|e| e.0 == "bin/run.sh").unwrap();
    assert_eq!(run.2, 0o755);
    let up = entries.iter().find(|e| e.0 == "bin/up").unwrap();
    assert_eq!(up.3.as_deref(), Some("../src"));
    let (status, before) = get_tar(&app, &sid, "?at=1").await;
    assert_eq!(status, 200);
    assert!(before.is_empty());
    // The same state gives the same bytes.
    let once = app
        .get(&format!("/v1/sessions/{sid}/archive?at={after_upload}"))
        .await
        .bytes()
        .await
        .unwrap();
    let twice = app
        .get(&format!("/v1/sessions/{sid}/archive?at={after_upload}"))
        .await
        .bytes()
        .await
        .unwrap();
    assert_eq!(once, twice);

    // A fork of the session at the upload has the project: the record is enough to rebuild it.
    let f: Value = app
        .post(
            &format!("/v1/sessions/{sid}/fork"),
            &json!({"at_seq": after_upload}),
        )
        .await
        .json()
        .await
        .unwrap();
    let fid = f["id"].as_str().unwrap_or_else(|| panic!("{f}")).to_owned();
    let r = app
        .call(&fid, "cat", "shell", json!({"command": "./bin/run.sh && cmp assets/blob.bin /dev/stdin < assets/blob.bin && echo same"}))
        .await;
    assert!(
        r["content"]
            .as_str()
            .unwrap()
            .contains("ran from the archive"),
        "{r}"
    );

    // Another tenant's session, a closed one.
    let other = uuid::Uuid::now_v7();
    let (status, _) = put(&app, &other.to_string(), tar_of(&[])).await;
    assert_eq!(status, 404);
    assert_eq!(
        app.delete(&format!("/v1/sessions/{fid}")).await.status(),
        200
    );
    let (status, body) = put(&app, &fid, tar_of(&[E::File("a", b"x", 0o644)])).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "session_closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_archive_is_refused_whole_and_writes_nothing() {
    let app = spawn_app_with(|c| {
        c.limits.max_archive_files = 50;
        c.limits.max_archive_unpacked_bytes = 1 << 20;
        c.limits.max_archive_bytes = 4 << 20;
    })
    .await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let good = E::File("ok.txt", b"fine\n", 0o644);
    let zeros = vec![0u8; 2 << 20];
    let many: Vec<String> = (0..60).map(|i| format!("f{i}")).collect();
    let many_entries: Vec<E<'_>> = many.iter().map(|n| E::File(n, b"x", 0o644)).collect();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "dot-dot",
            tar_of(&[good, E::File("../evil", b"x", 0o644)]),
            "'..'",
        ),
        (
            "deep dot-dot",
            tar_of(&[E::File("a/../../evil", b"x", 0o644)]),
            "'..'",
        ),
        (
            "absolute",
            tar_of(&[E::File("/etc/evil", b"x", 0o644)]),
            "absolute",
        ),
        (
            "hard link",
            tar_of(&[E::File("a", b"x", 0o644), E::HardLink("b", "/etc/passwd")]),
            "hard link",
        ),
        (
            "symlink out",
            tar_of(&[E::Symlink("l", "../../etc/passwd")]),
            "leads out",
        ),
        (
            "absolute symlink",
            tar_of(&[E::Symlink("l", "/etc/passwd")]),
            "leads out",
        ),
        ("fifo", tar_of(&[E::Fifo("p")]), "FIFO"),
        ("device", tar_of(&[E::Char("null")]), "device"),
        (
            "too many",
            tar_of(&many_entries),
            "limits.max_archive_files",
        ),
        (
            "gzip bomb",
            gzip(&tar_of(&[E::File("zeros", &zeros, 0o644)])),
            "limits.max_archive_unpacked_bytes",
        ),
        (
            "not a tar",
            b"this is not an archive at all, just text that goes on".repeat(20),
            "not",
        ),
        ("empty body", Vec::new(), "the body is empty"),
    ];
    for (name, body, says) in cases {
        let (status, problem) = put(&app, &sid, body).await;
        assert_eq!(status, 422, "{name}: {problem}");
        assert_eq!(problem["code"], "invalid_archive", "{name}: {problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(says),
            "{name}: {problem}"
        );
    }
    // Nothing of any of them is in the workspace or the log.
    let events = app.events(&sid).await;
    assert_eq!(events.len(), 1, "only session.created: {events:?}");
    let r = app
        .call(&sid, "ls", "shell", json!({"command": "ls -A | wc -l"}))
        .await;
    assert_eq!(
        r["content"].as_str().unwrap().lines().nth(2).map(str::trim),
        Some("0"),
        "{r}"
    );
    assert!(!std::path::Path::new("/etc/evil").exists());

    // Over the upload bound, declared: 413 before the body is sent.
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    s.write_all(
        format!(
            "PUT /v1/sessions/{sid}/archive HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-tar\r\nContent-Length: {}\r\n\r\n",
            5u64 << 20
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        s.read_to_end(&mut answer),
    )
    .await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("archive_too_large"), "{answer}");
    // Streamed without a length: refused once it crosses the bound.
    let chunks = (0..4)
        .map(|_| vec![1u8; 1 << 20])
        .chain(std::iter::once(vec![1u8]))
        .map(Ok::<_, std::io::Error>);
    let resp = app
        .http
        .put(app.url(&format!("/v1/sessions/{sid}/archive")))
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let problem: Value = resp.json().await.unwrap();
    assert_eq!(problem["code"], "archive_too_large");
    let left: Vec<_> = std::fs::read_dir(app.config.data_dir.join("workspaces/.uploads"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "spool files left: {left:?}");
}

/// One raw tar entry: a ustar header of `kind` declaring `size`, then `data` padded to 512.
pub(crate) fn raw_entry(
    out: &mut Vec<u8>,
    name: &str,
    kind: tar::EntryType,
    size: u64,
    data: &[u8],
) {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_size(size);
    raw_name(&mut h, name);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

/// A pax record line: `LEN key=value\n`, LEN counting itself.
fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}{body}").len() != len {
        len += 1;
    }
    format!("{len}{body}").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_headers_cannot_smuggle_sizes_or_memory_past_the_checks() {
    let app = spawn_app_with(|c| c.limits.max_archive_unpacked_bytes = 1 << 20).await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // A GNU long name declaring 8 MiB (the tar reader would hold it whole): refused on its size.
    let mut bomb = Vec::new();
    let name = vec![b'a'; 8 << 20];
    raw_entry(
        &mut bomb,
        "././@LongLink",
        tar::EntryType::GNULongName,
        name.len() as u64,
        &name,
    );
    raw_entry(&mut bomb, "x", tar::EntryType::Regular, 1, b"x");
    bomb.extend_from_slice(&[0u8; 1024]);
    let (status, problem) = put(&app, &sid, gzip(&bomb)).await;
    assert_eq!(status, 422, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("extension header"),
        "{problem}"
    );

    // A pax `size` of 2 MiB under a header that says 0: the real size is what counts.
    let mut smuggled = Vec::new();
    let record = pax_record("size", &(2u64 << 20).to_string());
    raw_entry(
        &mut smuggled,
        "PaxHeaders/big",
        tar::EntryType::XHeader,
        record.len() as u64,
        &record,
    );
    raw_entry(
        &mut smuggled,
        "big",
        tar::EntryType::Regular,
        0,
        &vec![7u8; 2 << 20],
    );
    smuggled.extend_from_slice(&[0u8; 1024]);
    let (status, problem) = put(&app, &sid, gzip(&smuggled)).await;
    assert_eq!(status, 422, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("pax 'size' record"),
        "{problem}"
    );
    let events = app.events(&sid).await;
    assert_eq!(events.len(), 1, "nothing recorded: {events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_client_goes_away_is_finished_and_recorded_whole() {
    let app = spawn_app().await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let names: Vec<String> = (0..6000).map(|i| format!("d{}/f{i}", i % 50)).collect();
    let entries: Vec<E<'_>> = names.iter().map(|n| E::File(n, b"", 0o644)).collect();
    let body = tar_of(&entries);
    // The client gives up once the body is sent, long before the upload is done.
    let req = app
        .http
        .put(app.url(&format!("/v1/sessions/{sid}/archive")))
        .body(body)
        .timeout(std::time::Duration::from_millis(300))
        .send()
        .await;
    assert!(req.is_err(), "the upload answered within 300 ms: {req:?}");
    // It goes on: every file on disk ends up in the log.
    let mut recorded = 0;
    for _ in 0..100 {
        let events = app.events_all(&sid).await;
        recorded = events
            .iter()
            .filter(|e| e["kind"] == "file.created")
            .count();
        if recorded == 6000 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(recorded, 6000);
    let r = app
        .call(
            &sid,
            "count",
            "shell",
            json!({"command": "find . -type f | wc -l"}),
        )
        .await;
    assert!(r["content"].as_str().unwrap().contains("\n6000\n"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_has_at_most_its_archive_transfers_at_once() {
    let app = spawn_app_with(|c| c.limits.max_archive_transfers_per_tenant = 1).await;
    let sid = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // One upload that stalls after its head...
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    use tokio::io::AsyncWriteExt;
    s.write_all(
        format!(
            "PUT /v1/sessions/{sid}/archive HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10240\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    s.write_all(&[0u8; 512]).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // ...holds the tenant's one slot: another is 429 and says which limit.
    let resp = app.get(&format!("/v1/sessions/{sid}/archive")).await;
    assert_eq!(resp.status(), 429);
    let problem: Value = resp.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("limits.max_archive_transfers_per_tenant"),
        "{problem}"
    );
    drop(s);
    let mut status = 0;
    for _ in 0..50 {
        status = app
            .get(&format!("/v1/sessions/{sid}/archive"))
            .await
            .status()
            .as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(status, 200, "the slot is given back when the client goes");
}
