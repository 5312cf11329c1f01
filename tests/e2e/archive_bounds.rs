//! Issue 23 §4, archive uploads: what one upload costs the node is bounded in bytes and CPU,
//! measured on the compiled binary (its own process: its peak resident memory and CPU time).
//! A gzip bomb is refused at the first header past a limit, before its data is inflated; large
//! entries are streamed to disk, never held whole; the node takes a bounded number of uploads at
//! once.
use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolexec_tests::app::spawn_app_with;
use toolexec_tests::binary::{Served, serve, toolexec};

/// A deflate stream cut into independent pieces: each piece is compressed by a fresh encoder
/// and sync-flushed (byte-aligned, no reference to earlier bytes), so pieces can be repeated
/// and concatenated into one valid stream without compressing gigabytes in the test.
fn piece(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.flush().unwrap();
    enc.get_ref().clone()
}

fn header(name: &str, size: u64) -> [u8; 512] {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(size);
    h.set_path(name).unwrap();
    h.set_cksum();
    *h.as_bytes()
}

/// A gzip stream of `entries` (name, size in 100 MiB blocks of `block`), each header followed
/// by its contents; the trailer's CRC is not computed (a bomb is refused before its end).
fn gz_of_blocks(entries: &[(String, u64, usize)], block: &[u8]) -> Vec<u8> {
    let block_piece = piece(block);
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    for (name, size, blocks) in entries {
        out.extend_from_slice(&piece(&header(name, *size)));
        for _ in 0..*blocks {
            out.extend_from_slice(&block_piece);
        }
    }
    out.extend_from_slice(&piece(&[0u8; 1024]));
    // A final empty block, then CRC-32 and size (not checked before the end).
    out.extend_from_slice(&[0x03, 0x00]);
    out.extend_from_slice(&[0u8; 8]);
    out
}

const BLOCK: usize = 100 << 20;

/// The server's peak resident memory (kB) and CPU time (s) so far.
fn usage(served: &Served) -> (u64, f64) {
    let pid = served.child.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // USER_HZ is 100 on Linux's x86-64 and arm64 ABIs.
    (hwm, ticks as f64 / 100.0)
}

fn binary_with(data: &std::path::Path, env: &[(&str, &str)]) -> Served {
    let mut cmd = toolexec(data);
    cmd.env("TOOLEXEC_BIND", "127.0.0.1:0")
        .env("TOOLEXEC_DATA_DIR", data)
        .env("TOOLEXEC_LOG_FORMAT", "json");
    for (k, v) in env {
        cmd.env(k, v);
    }
    serve(cmd)
}

fn private_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

async fn new_session(http: &reqwest::Client, base: &str) -> String {
    let s: Value = http
        .post(format!("{base}/v1/sessions"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    s["id"].as_str().unwrap().to_owned()
}

async fn upload(http: &reqwest::Client, base: &str, sid: &str, body: Vec<u8>) -> (u16, Value) {
    let resp = http
        .put(format!("{base}/v1/sessions/{sid}/archive"))
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_bomb_is_refused_at_its_first_header_past_a_limit_with_bounded_cpu_and_memory() {
    let data = private_dir();
    // Default limits but the unpacked bound, lowered so that the bomb of many files at the
    // per-file limit crosses it after a few of them.
    let served = binary_with(
        data.path(),
        &[("TOOLEXEC_LIMITS__MAX_ARCHIVE_UNPACKED_BYTES", "536870912")],
    );
    let http = reqwest::Client::new();
    let sid = new_session(&http, &served.base).await;
    let zeros = vec![0u8; BLOCK];

    // One header declaring 8 GiB, followed by ~7.8 GiB of zeros (an 8 MiB upload).
    let one = gz_of_blocks(&[("huge".into(), (8 << 30) - 1, 78)], &zeros);
    // 200 files of 100 MiB (each within the per-file limit): 20 GiB in a ~20 MiB upload.
    let files: Vec<(String, u64, usize)> = (0..200)
        .map(|i| (format!("f{i:03}"), BLOCK as u64, 1))
        .collect();
    let many = gz_of_blocks(&files, &zeros);
    drop(zeros);
    for (name, body, says) in [
        ("one huge header", one, "limit for one file"),
        ("many files", many, "limits.max_archive_unpacked_bytes"),
    ] {
        let (hwm_before, cpu_before) = usage(&served);
        let started = Instant::now();
        let (status, problem) = upload(&http, &served.base, &sid, body).await;
        let took = started.elapsed();
        let (hwm_after, cpu_after) = usage(&served);
        let cpu = cpu_after - cpu_before;
        eprintln!(
            "{name}: {status} in {took:?}, {cpu:.2} s CPU, peak RSS {hwm_before} -> {hwm_after} kB"
        );
        assert_eq!(status, 422, "{name}: {problem}");
        assert_eq!(problem["code"], "invalid_archive", "{name}: {problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains(says),
            "{name}: {problem}"
        );
        // Before: the first pass inflated every byte (7.8 GiB, 20 GiB) before any size check.
        // Now the many-files bomb inflates 500 MiB (the bound), the huge header nothing.
        assert!(cpu < 2.0, "{name}: {cpu:.2} s of CPU");
        assert!(took < Duration::from_secs(10), "{name}: {took:?}");
        assert!(
            hwm_after < hwm_before + 64 * 1024,
            "{name}: peak RSS {hwm_before} -> {hwm_after} kB"
        );
    }
    let events: Value = http
        .get(format!("{}/v1/sessions/{sid}/events", served.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(events["events"].as_array().unwrap().len(), 1, "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_concurrent_uploads_of_large_files_keep_the_service_memory_bounded() {
    let data = private_dir();
    let served = binary_with(data.path(), &[]);
    let http = reqwest::Client::new();
    // One file of 100 MiB (the most one file may be), not zeros: its bytes must all be written.
    let mut pattern = vec![0u8; 64 * 1024];
    let mut x: u32 = 0x9e37_79b9;
    for b in pattern.iter_mut() {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        *b = (x >> 24) as u8;
    }
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&header("big.bin", BLOCK as u64)).unwrap();
    for _ in 0..BLOCK / pattern.len() {
        enc.write_all(&pattern).unwrap();
    }
    enc.write_all(&[0u8; 1024]).unwrap();
    let body = enc.finish().unwrap();
    let mut sids = Vec::new();
    for _ in 0..4 {
        sids.push(new_session(&http, &served.base).await);
    }
    let (hwm_before, _) = usage(&served);
    let uploads = sids
        .iter()
        .map(|sid| upload(&http, &served.base, sid, body.clone()));
    let results = futures::future::join_all(uploads).await;
    let (hwm_after, _) = usage(&served);
    eprintln!("4 uploads of 100 MiB: peak RSS {hwm_before} -> {hwm_after} kB");
    for (status, body) in &results {
        assert_eq!(*status, 200, "{body}");
        assert_eq!(body["bytes"], BLOCK as u64, "{body}");
    }
    // Before: each upload held its file whole (4 x 100 MiB and more). Now an entry is copied
    // through a fixed buffer, and a file over `max_blob_bytes` is hashed, not kept.
    assert!(
        hwm_after < hwm_before + 96 * 1024,
        "peak RSS {hwm_before} -> {hwm_after} kB"
    );
    // Every byte is on disk.
    for sid in &sids {
        let on_disk =
            std::fs::read(data.path().join("workspaces").join(sid).join("big.bin")).unwrap();
        assert_eq!(on_disk.len(), BLOCK);
        assert!(on_disk.chunks(pattern.len()).all(|c| c == pattern));
    }
}

/// The node takes `limits.max_concurrent_archive_uploads` uploads at once, whoever sends them:
/// one more is 503 `overloaded` with a `Retry-After`, and its body is not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_takes_a_bounded_number_of_uploads_at_once_and_says_when_to_retry() {
    let app = spawn_app_with(|c| c.limits.max_concurrent_archive_uploads = 1).await;
    let a = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let b = app.session(json!({})).await["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    use tokio::io::AsyncWriteExt;
    s.write_all(
        format!(
            "PUT /v1/sessions/{a}/archive HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 10240\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    s.write_all(&[0u8; 512]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resp = app
        .http
        .put(app.url(&format!("/v1/sessions/{b}/archive")))
        .body(crate::archive::tar_of(&[crate::archive::E::File(
            "x", b"x", 0o644,
        )]))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let problem: Value = resp.json().await.unwrap();
    assert_eq!(problem["code"], "overloaded", "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("limits.max_concurrent_archive_uploads"),
        "{problem}"
    );
    drop(s);
    let mut status = 0;
    for _ in 0..50 {
        let (st, _) = crate::archive::put(
            &app,
            &b,
            crate::archive::tar_of(&[crate::archive::E::File("x", b"x", 0o644)]),
        )
        .await;
        status = st;
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        status, 200,
        "the node's slot is given back when the client goes"
    );
}
