//! What one call can make the service hold and store (issue 8, part C), against the real
//! service on both stores, checked from the host side: the database's size (`pg_database_size`,
//! the SQLite files), the peak RSS of this process (the server runs in it; nextest gives every
//! test a process of its own, and the peak is reset just before the call), the blobs in the
//! store. And the names list_dir, glob and grep print, which must not let a file forge entries.
//!
//! `budget_suite!` turns every listed body into `budget_tools::postgres::<name>` and
//! `budget_tools::sqlite::<name>`.
use std::collections::BTreeSet;

use serde_json::{Value, json};
use toolexec_tests::app::Backend;
use toolexec_tests::app::{DbControl, TestApp};

toolexec_tests::on_both_stores!(
    read_many_files_of_one_big_file_fifty_times_stays_within_the_read_budget,
    an_output_over_the_stored_cap_is_recorded_as_head_and_tail,
    file_changes_beyond_the_cap_are_one_summary_whose_manifest_lists_the_rest,
    a_hundred_thousand_new_files_stay_within_the_event_cap_and_page,
    list_dir_glob_and_grep_print_forged_names_as_one_escaped_entry,
);

/// Bytes the store takes on disk: the Postgres database, or the SQLite file with its WAL.
async fn store_bytes(app: &TestApp) -> u64 {
    match &app.db {
        Some(db) => db
            .query_strings("SELECT pg_database_size(current_database())::text")
            .await[0]
            .parse()
            .unwrap(),
        None => ["toolexec.db", "toolexec.db-wal"]
            .iter()
            .filter_map(|f| std::fs::metadata(app.config.data_dir.join(f)).ok())
            .map(|m| m.len())
            .sum(),
    }
}

/// A line of /proc/self/status, in bytes.
fn status_bytes(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("{key} not in /proc/self/status"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kb * 1024
}

/// Resets the peak RSS of this process to its current RSS (Linux ≥ 4.0), so that the next
/// `VmHWM` is the peak of what follows; returns the RSS now.
fn reset_peak_rss() -> u64 {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    status_bytes("VmRSS:")
}

const MIB: u64 = 1024 * 1024;

fn content(r: &Value) -> &str {
    r["content"].as_str().unwrap_or_default()
}

async fn session(app: &TestApp) -> (String, std::path::PathBuf) {
    let s = app.session(json!({})).await;
    let id = s["id"].as_str().unwrap().to_owned();
    let dir = app.config.workspace_root().join(&id);
    (id, dir)
}

/// `lines` lines of `width` characters that compress badly (a xorshift stream over 62
/// letters and digits): the database cannot hide a 200 MB output by compressing it.
fn incompressible_text(lines: usize, width: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut text = String::with_capacity(lines * (width + 1));
    for _ in 0..lines {
        for _ in 0..width {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            text.push(ALPHABET[(state % 62) as usize] as char);
        }
        text.push('\n');
    }
    text
}

/// The case: one 4 MB file named 50 times produced a 200-million-character output,
/// +380 MB of database and 788 MB of peak RSS. Now the call returns at most the read budget
/// (1 MiB of text), each path once, and says what it did not read.
async fn read_many_files_of_one_big_file_fifty_times_stays_within_the_read_budget(
    backend: Backend,
) {
    let app = backend.spawn_with(|_| {}).await;
    let (sid, dir) = session(&app).await;
    // 2,000 lines of 1,999 characters: read_file would show all of it (4,000,000 bytes).
    std::fs::write(dir.join("big.txt"), incompressible_text(2000, 1999)).unwrap();
    let before = store_bytes(&app).await;
    let rss = reset_peak_rss();

    let r = app
        .call(
            &sid,
            "r1",
            "read_many_files",
            json!({"paths": vec!["big.txt"; 50]}),
        )
        .await;

    let peak = status_bytes("VmHWM:").saturating_sub(rss);
    let grown = store_bytes(&app).await.saturating_sub(before);
    eprintln!(
        "{backend:?}: peak RSS +{} KiB, store +{} KiB",
        peak / 1024,
        grown / 1024
    );
    assert_eq!(r["status"], "ok", "{r}");
    let total = r["truncated"]["total_chars"].as_u64().unwrap();
    // The budget, its notes and 50 headers: not 200 million characters.
    assert!(
        total > 1_000_000 && total < 1_100_000,
        "output of {total} characters"
    );
    assert!(
        content(&r).contains("=== big.txt ===\n     1\t"),
        "{}",
        content(&r)
    );
    let inv = app.invocation_of(&r).await;
    assert_eq!(inv["output_chars"], total);
    // What the model was told is at the end of the recorded output: the offset to continue
    // from, and that the other 49 copies were not shown again.
    let full: Value = app
        .get(&format!(
            "/v1/invocations/{}/output?offset=1000000&limit=1000000",
            r["invocation_id"].as_str().unwrap()
        ))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(full["complete"], true, "{}", full["total_chars"]);
    let full = full["content"].as_str().unwrap();
    assert!(
        full.contains("this call's read budget (1 MiB of text) is used up")
            && full.contains("Call read_file with offset="),
        "{full}"
    );
    assert_eq!(
        full.matches("(Named again: shown above, once.)").count(),
        49
    );
    // The issue measured +380 MB and 788 MB of peak RSS for this request.
    assert!(grown < 16 * MIB, "the store grew by {} MiB", grown / MIB);
    assert!(peak < 96 * MIB, "peak RSS grew by {} MiB", peak / MIB);
}

/// A truncated output is kept for read_output, but only up to `max_stored_output_bytes`: a
/// longer one keeps its head and tail with a marker, and the model, read_output and
/// `GET /v1/invocations/{id}/output` all say so.
async fn an_output_over_the_stored_cap_is_recorded_as_head_and_tail(backend: Backend) {
    let cap: u64 = 64 * 1024;
    let app = backend
        .spawn_with(|c| c.limits.max_stored_output_bytes = cap as usize)
        .await;
    let (sid, _) = session(&app).await;
    let before = store_bytes(&app).await;
    // ~1 MB of output (the sandbox captures up to 1 MiB): 13,000 lines of 76 characters.
    let r = app
        .call(
            &sid,
            "big",
            "shell",
            json!({"command": "head -c 750000 /dev/urandom | base64 -w 76; echo THE-END"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(
        content(&r).contains(
            "to page through the recorded output (only its first and last 32768 bytes are kept"
        ),
        "{}",
        content(&r)
    );
    let id = r["invocation_id"].as_str().unwrap();
    let output_chars = r["truncated"]["total_chars"].as_u64().unwrap();
    assert!(output_chars > 1_000_000, "{output_chars}");

    let slice: Value = app
        .get(&format!("/v1/invocations/{id}/output?limit=1000000"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(slice["complete"], false, "{slice}");
    assert_eq!(slice["output_chars"], output_chars);
    let stored = slice["content"].as_str().unwrap();
    assert_eq!(slice["total_chars"], stored.chars().count());
    assert!(stored.len() < cap as usize + 1000, "{}", stored.len());
    assert!(
        stored.starts_with("[exit code 0 after "),
        "{}",
        &stored[..100]
    );
    assert!(
        stored.ends_with("THE-END\n"),
        "{}",
        &stored[stored.len() - 100..]
    );
    assert!(
        stored.contains(" of this output were dropped here: the service records at most 65536 bytes of one output"),
        "no marker"
    );

    let page = app
        .call(
            &sid,
            "page",
            "read_output",
            json!({"invocation_id": id, "offset": 30000, "limit": 5000}),
        )
        .await;
    assert!(
        content(&page).contains(&format!(
            "(The output had {output_chars} characters; the service recorded only its beginning and its end"
        )),
        "{}",
        content(&page)
    );
    assert!(
        content(&page).contains("were dropped here"),
        "{}",
        content(&page)
    );

    // An output within the cap is recorded whole.
    let small = app
        .call(&sid, "small", "shell", json!({"command": "seq 1 11000"}))
        .await;
    let small_id = small["invocation_id"].as_str().unwrap();
    let slice: Value = app
        .get(&format!("/v1/invocations/{small_id}/output?limit=1000000"))
        .await
        .json()
        .await
        .unwrap();
    assert!(small["truncated"].is_object(), "{small}");
    assert_eq!(slice["complete"], true, "{}", slice["total_chars"]);
    assert!(slice["content"].as_str().unwrap().contains("\n10000\n"));

    let grown = store_bytes(&app).await.saturating_sub(before);
    assert!(grown < 4 * MIB, "the store grew by {} KiB", grown / 1024);
}

/// The mechanism, at a small cap: N `file.*` events, then one `files.changed` whose manifest
/// (a blob in the store) lists every other change, each exactly once; the model is told; the
/// invocation's side effects come a page at a time.
async fn file_changes_beyond_the_cap_are_one_summary_whose_manifest_lists_the_rest(
    backend: Backend,
) {
    const N: usize = 40;
    let app = backend
        .spawn_with(|c| c.limits.max_file_events_per_call = N)
        .await;
    let (sid, _) = session(&app).await;
    // A baseline with files to modify and delete, then one command that creates 300, modifies
    // 20 and deletes 10.
    app.call(
        &sid,
        "setup",
        "shell",
        json!({"command": "mkdir old && for i in $(seq 1 30); do echo v1 > old/$i; done"}),
    )
    .await;
    let r = app
        .call(
            &sid,
            "many",
            "shell",
            json!({"command": "mkdir new && cd new && seq -w 1 300 | xargs touch && \
                   for i in $(seq 1 20); do echo changed >> ../old/$i; done && \
                   for i in $(seq 21 30); do rm ../old/$i; done"}),
        )
        .await;
    assert_eq!(r["status"], "ok", "{r}");
    assert!(
        content(&r).contains(
            "This call changed 330 files in the workspace (300 created, 20 modified, 10 deleted \
             in all). The log records the first 40 one by one and the other 290 as one \
             files.changed summary"
        ),
        "{}",
        content(&r)
    );

    let inv = app.invocation_of(&r).await;
    assert_eq!(
        inv["side_effects_total"],
        N + 1,
        "{}",
        inv["side_effects_total"]
    );
    assert_eq!(inv["side_effects_next_after"], Value::Null);
    let effects = inv["side_effects"].as_array().unwrap();
    assert_eq!(effects.len(), N + 1);
    let mut paths = BTreeSet::new();
    for e in &effects[..N] {
        assert!(e["kind"].as_str().unwrap().starts_with("file."), "{e}");
        assert!(paths.insert(e["data"]["path"].as_str().unwrap().to_owned()));
    }
    let summary = &effects[N];
    assert_eq!(summary["kind"], "files.changed", "{summary}");
    let data = &summary["data"];
    assert_eq!(data["changes"], 290, "{data}");
    assert_eq!(
        data["created"].as_u64().unwrap()
            + data["modified"].as_u64().unwrap()
            + data["deleted"].as_u64().unwrap(),
        290
    );
    assert_eq!(data["manifest_format"], "jsonl+gzip");

    // The manifest, from the store: every other change, each once, with what a file event
    // would have said.
    let sha = data["manifest_sha256"].as_str().unwrap();
    let manifest = app.state.engine.store().blob(sha).await.unwrap().unwrap();
    assert_eq!(data["manifest_bytes"], manifest.len());
    assert_eq!(toolexec_core::sha256_hex(&manifest), sha);
    let mut lines = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(manifest.as_slice()),
        &mut lines,
    )
    .unwrap();
    let mut kinds = [0u64; 3];
    for line in lines.lines() {
        let change: toolexec_core::FileChange = serde_json::from_str(line).unwrap();
        assert!(paths.insert(change.path.clone()), "{} twice", change.path);
        kinds[change.kind as usize] += 1;
        if change.kind == toolexec_core::FileChangeKind::Created {
            assert_eq!(
                change.after_sha256.as_deref(),
                Some(toolexec_core::sha256_hex(b"").as_str())
            );
        }
    }
    assert_eq!(
        [
            data["created"].as_u64(),
            data["modified"].as_u64(),
            data["deleted"].as_u64()
        ],
        kinds.map(Some)
    );
    let expected: BTreeSet<String> = (1..=300)
        .map(|n| format!("new/{n:03}"))
        .chain((1..=30).map(|n| format!("old/{n}")))
        .collect();
    assert_eq!(paths, expected);

    // Paging: 41 side effects in pages of 15.
    let id = r["invocation_id"].as_str().unwrap();
    let mut after = 0;
    let mut seen = Vec::new();
    loop {
        let page: Value = app
            .get(&format!("/v1/invocations/{id}?after={after}&limit=15"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(page["side_effects_total"], N + 1);
        let list = page["side_effects"].as_array().unwrap();
        assert!(list.len() <= 15);
        seen.extend(list.iter().map(|e| e["seq"].as_i64().unwrap()));
        match page["side_effects_next_after"].as_i64() {
            Some(next) => after = next,
            None => break,
        }
    }
    let all: Vec<i64> = effects.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seen, all);
    assert!(seen.windows(2).all(|w| w[0] < w[1]));
}

/// The case at its real scale and the default cap: 100,000 empty files from one
/// command (measured before: +300 MB of RSS while recording, a 41 MB GET /v1/invocations/{id}).
async fn a_hundred_thousand_new_files_stay_within_the_event_cap_and_page(backend: Backend) {
    let app = backend.spawn_with(|_| {}).await;
    let (sid, _) = session(&app).await;
    app.call(&sid, "baseline", "shell", json!({"command": "true"}))
        .await;
    let before = store_bytes(&app).await;
    let rss = reset_peak_rss();
    let r = app
        .call(
            &sid,
            "files",
            "shell",
            json!({"command": "mkdir d && cd d && seq -w 1 100000 | xargs touch", "timeout_ms": 120000}),
        )
        .await;
    let peak = status_bytes("VmHWM:").saturating_sub(rss);
    let grown = store_bytes(&app).await.saturating_sub(before);
    eprintln!(
        "{backend:?}: peak RSS +{} KiB, store +{} KiB",
        peak / 1024,
        grown / 1024
    );
    assert_eq!(r["status"], "ok", "{r}");
    assert!(
        content(&r).contains("This call changed 100000 files in the workspace (100000 created"),
        "{}",
        content(&r)
    );

    let id = r["invocation_id"].as_str().unwrap();
    let rss = reset_peak_rss();
    let resp = app.get(&format!("/v1/invocations/{id}")).await;
    assert_eq!(resp.status(), 200);
    let body = resp.bytes().await.unwrap();
    let get_peak = status_bytes("VmHWM:").saturating_sub(rss);
    eprintln!(
        "{backend:?}: GET peak RSS +{} KiB, {} bytes",
        get_peak / 1024,
        body.len()
    );
    let inv: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(inv["side_effects_total"], 1001);
    assert_eq!(inv["side_effects"].as_array().unwrap().len(), 1000);
    let next = inv["side_effects_next_after"].as_i64().unwrap();
    let last: Value = app
        .get(&format!("/v1/invocations/{id}?after={next}"))
        .await
        .json()
        .await
        .unwrap();
    let last = last["side_effects"].as_array().unwrap();
    assert_eq!(last.len(), 1);
    assert_eq!(last[0]["kind"], "files.changed");
    assert_eq!(last[0]["data"]["changes"], 99_000);
    assert_eq!(last[0]["data"]["created"], 99_000);
    // One page of 1,000 file events: about 300 KB, not 41 MB.
    assert!(body.len() < 2 * MIB as usize, "{} bytes", body.len());
    // The manifest: ~210 bytes of JSON a change, ~1 MB gzipped; the 1,000 events are small.
    assert!(grown < 16 * MIB, "the store grew by {} MiB", grown / MIB);
    // Before: +300 MB while recording (+200 MB with the event cap alone, before the manifest
    // was compressed and the blobs deduplicated). What remains (~85 MB in a debug build) is the
    // scan's view of 100,000 new entries, which has a budget of its own; recording adds ~0.
    assert!(peak < 160 * MIB, "peak RSS grew by {} MiB", peak / MIB);
    // Before: the 41 MB document cost +175 MB.
    assert!(
        get_peak < 32 * MIB,
        "GET peak RSS grew by {} MiB",
        get_peak / MIB
    );
}

/// File names chosen to lie: a newline followed by what looks like another entry, terminal
/// escapes, a right-to-left override, bytes that are not UTF-8. Each is one escaped entry in
/// list_dir, glob and grep.
async fn list_dir_glob_and_grep_print_forged_names_as_one_escaped_entry(backend: Backend) {
    let app = backend.spawn_with(|_| {}).await;
    let (sid, _) = session(&app).await;
    let make = app
        .call(
            &sid,
            "make",
            "shell",
            json!({"command": "mkdir src && cd src && \
                for n in \"$(printf 'a\\n  forged.txt')\" \"$(printf 'esc\\033[31mred.txt')\" \
                         \"$(printf 'evil\\342\\200\\256txt.exe')\" \"$(printf 'bad\\377')\" \
                         \"$(printf 'bad\\376')\" plain.txt; do echo needle > \"$n\"; done && set -- * && echo $#"}),
        )
        .await;
    assert!(content(&make).contains("\n6\n"), "{}", content(&make));
    let expected = [
        "a\\n  forged.txt",
        "bad\\xfe",
        "bad\\xff",
        "esc\\x1b[31mred.txt",
        "evil\\u{202e}txt.exe",
        "plain.txt",
    ];
    let clean = |text: &str| {
        assert!(
            !text.contains(['\u{1b}', '\u{202e}', '\r', '\u{fffd}']),
            "raw control character or lossy name in {text:?}"
        );
    };

    let listed = app
        .call(&sid, "ls", "list_dir", json!({"path": "src"}))
        .await;
    let text = content(&listed);
    clean(text);
    let entries: Vec<&str> = text
        .lines()
        .skip(1)
        .take_while(|l| !l.is_empty())
        .map(|l| l.strip_prefix("  ").unwrap())
        .collect();
    assert_eq!(entries, expected, "{text}");

    let globbed = app
        .call(&sid, "glob", "glob", json!({"pattern": "src/*"}))
        .await;
    let text = content(&globbed);
    clean(text);
    let mut paths: Vec<&str> = text.lines().collect();
    paths.sort();
    let want: Vec<String> = expected.iter().map(|n| format!("src/{n}")).collect();
    assert_eq!(paths, want, "{text}");

    let grepped = app
        .call(&sid, "grep", "grep", json!({"pattern": "needle"}))
        .await;
    let text = content(&grepped);
    clean(text);
    let hits: Vec<&str> = text.lines().collect();
    let want: Vec<String> = expected
        .iter()
        .map(|n| format!("src/{n}:1:needle"))
        .collect();
    assert_eq!(hits, want, "{text}");
}
