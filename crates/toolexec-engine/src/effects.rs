//! What one call may make the log hold: its file changes beyond `limits.max_file_events_per_call`
//! summed up in one `files.changed` event with a manifest blob, and a full output over
//! `limits.max_stored_output_bytes` kept as its head and tail.
//!
//! Without these, one shell command that creates 100,000 empty files became 100,000 events
//! (~300 MB of service memory while recording, a 41 MB `GET /v1/invocations/{id}`), and one
//! read of a 4 MB file fifty times became a 200-million-character output blob.
use std::fmt::Write as _;
use std::io::Write as _;

use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::Value;
use toolexec_core::{EventKind, FilesChanged};
use toolexec_store::{Blob, NewEvent};

/// How the manifest of a `files.changed` event is encoded: gzip-compressed JSON Lines, one
/// `FileChange` per line. The lines repeat keys, hashes of identical contents and long common
/// path prefixes: 100,000 new empty files are 21 MB of JSON Lines and ~1 MB compressed, which is
/// what the service holds, copies into the store and keeps.
pub(crate) const MANIFEST_FORMAT: &str = "jsonl+gzip";

/// The side-effect events of a call's file changes, in order, as they accumulate: the first
/// `max_events` as `file.*` events, the rest as lines of a manifest summed up by [`Self::finish`].
pub(crate) struct FileEvents {
    max_events: usize,
    pub events: Vec<NewEvent>,
    summary: FilesChanged,
    /// Made at the first change past `max_events`: a deflate stream's state is ~300 KiB
    /// allocated and zeroed, which every call (most change nothing) would otherwise pay.
    manifest: Option<GzEncoder<Vec<u8>>>,
    /// One line of the manifest, reused.
    line: Vec<u8>,
    /// A write into the in-memory encoder failed (it cannot: it writes to a `Vec`).
    failed: Option<std::io::Error>,
    /// Created, modified, deleted: of all changes, events and summary together.
    all: [u64; 3],
}

impl FileEvents {
    pub(crate) fn new(max_events: usize) -> Self {
        Self {
            max_events,
            events: Vec::new(),
            summary: FilesChanged {
                changes: 0,
                created: 0,
                modified: 0,
                deleted: 0,
                after_bytes: 0,
                before_bytes: 0,
                manifest_sha256: String::new(),
                manifest_bytes: 0,
                manifest_format: MANIFEST_FORMAT.to_owned(),
            },
            manifest: None,
            line: Vec::new(),
            failed: None,
            all: [0; 3],
        }
    }

    /// Adds one `file.*` event (as `Runtimes::change_event` made it, its blob already taken).
    pub(crate) fn push(&mut self, event: NewEvent) {
        let kind = match event.kind {
            EventKind::FileCreated => 0,
            EventKind::FileModified => 1,
            _ => 2,
        };
        self.all[kind] += 1;
        if self.events.len() < self.max_events {
            self.events.push(event);
            return;
        }
        let s = &mut self.summary;
        s.changes += 1;
        match kind {
            0 => s.created += 1,
            1 => s.modified += 1,
            _ => s.deleted += 1,
        }
        let size = |key: &str| event.data.get(key).and_then(Value::as_u64).unwrap_or(0);
        s.after_bytes += size("after_size");
        s.before_bytes += size("before_size");
        // The manifest line is the payload the event would have had: serializing a `Value`
        // into a `Vec` cannot fail.
        self.line.clear();
        let _ = serde_json::to_writer(&mut self.line, &event.data);
        self.line.push(b'\n');
        let manifest = self
            .manifest
            .get_or_insert_with(|| GzEncoder::new(Vec::new(), Compression::default()));
        if let Err(e) = manifest.write_all(&self.line) {
            self.failed.get_or_insert(e);
        }
    }

    /// How many changes there were in all.
    pub(crate) fn total(&self) -> u64 {
        self.events.len() as u64 + self.summary.changes
    }

    /// The `file.*` events, then the `files.changed` event and its manifest blob if there were
    /// more changes than events, and the sentence for the model about them.
    pub(crate) fn finish(mut self) -> (Vec<NewEvent>, Option<Blob>, Option<String>) {
        if self.summary.changes == 0 {
            return (self.events, None, None);
        }
        let total = self.total();
        let finished = self.manifest.take().map(GzEncoder::finish);
        let manifest = match (self.failed.take(), finished) {
            (None, Some(Ok(bytes))) => bytes,
            (None, None) => Vec::new(),
            (Some(e), _) | (None, Some(Err(e))) => {
                // Unreachable in practice (the encoder writes to memory); the summary is still
                // recorded, and the log says its manifest is missing.
                tracing::error!(error = %e, "the manifest of a files.changed event could not be written");
                Vec::new()
            }
        };
        let blob = Blob::new(manifest);
        let s = &mut self.summary;
        s.manifest_sha256 = blob.sha256.clone();
        s.manifest_bytes = blob.bytes.len() as u64;
        let [created, modified, deleted] = self.all;
        let mut note = format!(
            "\n[This call changed {total} files in the workspace ({created} created, {modified} \
             modified, {deleted} deleted in all). The log records the first {} one by one and the \
             other {} as one files.changed summary ({} created, {} modified, {} deleted; {} bytes \
             now) with a manifest of each.]",
            self.events.len(),
            s.changes,
            s.created,
            s.modified,
            s.deleted,
            s.after_bytes,
        );
        note.push('\n');
        let data = serde_json::to_value(&*s).unwrap_or_default();
        self.events.push(NewEvent {
            kind: EventKind::FilesChanged,
            data,
        });
        (self.events, Some(blob), Some(note))
    }
}

/// Keeps one blob per content: 100,000 empty files are one empty blob, not 100,000 copies
/// travelling to the store (which would insert it once anyway).
pub(crate) fn dedup_blobs(blobs: &mut Vec<Blob>) {
    if blobs.len() > 1 {
        blobs.sort_unstable_by(|a, b| a.sha256.cmp(&b.sha256));
        blobs.dedup_by(|a, b| a.sha256 == b.sha256);
    }
}

/// The output as it is stored for `read_output`: whole up to `max_bytes`, else its first and
/// last `max_bytes / 2` (cut at character boundaries) around a marker that says how much was
/// dropped and why.
pub(crate) fn stored_output(full: String, max_bytes: usize) -> String {
    if full.len() <= max_bytes {
        return full;
    }
    let half = max_bytes / 2;
    let head_end = full.floor_char_boundary(half);
    let tail_start = full.ceil_char_boundary(full.len() - half);
    let dropped = &full[head_end..tail_start];
    let mut out = String::with_capacity(head_end + (full.len() - tail_start) + 300);
    out.push_str(&full[..head_end]);
    let _ = write!(
        out,
        "\n[… {} characters ({} bytes) of this output were dropped here: the service records at \
         most {max_bytes} bytes of one output (limits.max_stored_output_bytes), so it kept the \
         first and the last {half} bytes of this one, which had {} characters …]\n",
        dropped.chars().count(),
        dropped.len(),
        full.chars().count()
    );
    out.push_str(&full[tail_start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn change(kind: EventKind, path: &str, after: Option<u64>, before: Option<u64>) -> NewEvent {
        NewEvent {
            kind,
            data: json!({"kind": "created", "path": path, "after_size": after, "before_size": before}),
        }
    }

    #[test]
    fn up_to_the_cap_every_change_is_an_event_of_its_own() {
        let mut fe = FileEvents::new(3);
        for n in 0..3 {
            fe.push(change(
                EventKind::FileCreated,
                &format!("f{n}"),
                Some(1),
                None,
            ));
        }
        let (events, blob, note) = fe.finish();
        assert_eq!(events.len(), 3);
        assert!(blob.is_none() && note.is_none());
    }

    #[test]
    fn beyond_the_cap_one_summary_counts_the_rest_and_its_manifest_lists_each() {
        let mut fe = FileEvents::new(2);
        fe.push(change(EventKind::FileCreated, "a", Some(5), None));
        fe.push(change(EventKind::FileModified, "b", Some(7), Some(3)));
        fe.push(change(EventKind::FileCreated, "c", Some(10), None));
        fe.push(change(EventKind::FileModified, "d", Some(20), Some(4)));
        fe.push(change(EventKind::FileDeleted, "e", None, Some(6)));
        assert_eq!(fe.total(), 5);
        let (events, blob, note) = fe.finish();
        assert_eq!(events.len(), 3);
        assert_eq!(events[2].kind, EventKind::FilesChanged);
        let s: FilesChanged = serde_json::from_value(events[2].data.clone()).unwrap();
        assert_eq!((s.changes, s.created, s.modified, s.deleted), (3, 1, 1, 1));
        assert_eq!((s.after_bytes, s.before_bytes), (30, 10));
        let blob = blob.unwrap();
        assert_eq!(s.manifest_sha256, blob.sha256);
        assert_eq!(s.manifest_bytes, blob.bytes.len() as u64);
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(&blob.bytes[..]),
            &mut text,
        )
        .unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let paths: Vec<&str> = lines.iter().map(|l| l["path"].as_str().unwrap()).collect();
        assert_eq!(paths, ["c", "d", "e"]);
        let note = note.unwrap();
        assert!(note.contains("changed 5 files"), "{note}");
        assert!(
            note.contains("(2 created, 2 modified, 1 deleted in all)"),
            "{note}"
        );
        assert!(
            note.contains("the first 2 one by one and the other 3"),
            "{note}"
        );
    }

    #[test]
    fn a_content_is_sent_to_the_store_once() {
        let mut blobs = vec![
            Blob::new(Vec::new()),
            Blob::new(b"x".to_vec()),
            Blob::new(Vec::new()),
            Blob::new(b"x".to_vec()),
        ];
        dedup_blobs(&mut blobs);
        assert_eq!(blobs.len(), 2);
    }

    #[test]
    fn an_output_within_the_cap_is_stored_whole() {
        assert_eq!(stored_output("abc".into(), 3), "abc");
    }

    #[test]
    fn a_longer_output_keeps_its_ends_and_says_what_was_dropped() {
        let full = format!("{}{}{}", "h".repeat(100), "é".repeat(1000), "t".repeat(100));
        let stored = stored_output(full, 200);
        assert!(stored.starts_with(&"h".repeat(100)), "{stored}");
        assert!(stored.ends_with(&"t".repeat(100)), "{stored}");
        assert!(stored.contains("1000 characters (2000 bytes) of this output were dropped"));
        assert!(stored.contains("which had 1200 characters"));
        // Cut inside a two-byte character: the boundaries move to whole characters.
        let odd = stored_output(format!("a{}", "é".repeat(100)), 100);
        assert!(
            odd.starts_with(&format!("a{}\n[…", "é".repeat(24))),
            "{odd}"
        );
        assert!(odd.ends_with(&format!("]\n{}", "é".repeat(25))), "{odd}");
    }
}
