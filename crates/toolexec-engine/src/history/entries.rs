//! The record's entries of a path as the history shows and restores them: tree rows, rewind
//! changes, and the errors of a path the record cannot give back.

use super::*;

pub(super) fn io_error(e: std::io::Error) -> EngineError {
    crate::runtimes::out_of_descriptors(&e)
        .unwrap_or_else(|| EngineError::Internal(format!("workspace: {e}")))
}

pub(super) fn not_recorded(shown: &str, entry: &Entry) -> EngineError {
    EngineError::Conflict {
        code: ProblemCode::ContentNotRecorded,
        detail: format!(
            "'{shown}' was there ({} bytes{}), but the log holds its hash and size only ({})",
            entry.size,
            entry
                .sha256
                .as_deref()
                .map(|s| format!(", sha256 {s}"))
                .unwrap_or_default(),
            entry
                .unstored
                .map(|r| serde_json::to_value(r)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default())
                .unwrap_or_else(|| "not read when recorded".into())
        ),
    }
}

pub(crate) fn unrestorable_names(state: &State) -> Vec<String> {
    state
        .unrestorable()
        .map(|(p, _)| names::display_bytes(p))
        .collect()
}

pub(crate) fn unrestorable_error(files: &[String], what: &str) -> EngineError {
    let shown: Vec<&str> = files.iter().take(20).map(String::as_str).collect();
    let more = files.len().saturating_sub(shown.len());
    EngineError::Conflict {
        code: ProblemCode::Unrestorable,
        detail: format!(
            "the log does not hold the contents of {} file(s) of that state: {}{}. Send \"allow_partial\": true to {what} without them",
            files.len(),
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ),
    }
}

pub(super) fn cursor_after(entries: &[TreeEntry]) -> String {
    let last = entries.last();
    let raw = last
        .and_then(|e| names::raw_bytes(&e.path, e.path_b64.as_deref()))
        .unwrap_or_default();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

pub(super) fn tree_entry(path: &[u8], entry: &Entry) -> TreeEntry {
    let name = names::RecordedName::new(path);
    let target = entry.target.as_deref().map(names::RecordedName::new);
    TreeEntry {
        path: name.display,
        path_b64: name.base64,
        kind: match entry.kind {
            EntryKind::File => TreeEntryKind::File,
            EntryKind::Symlink => TreeEntryKind::Symlink,
        },
        size: entry.size,
        sha256: entry.sha256.clone(),
        mode: entry.mode,
        symlink_target: target.as_ref().map(|t| t.display.clone()),
        symlink_target_b64: target.and_then(|t| t.base64),
        restorable: entry.restorable(),
        unstored: (!entry.restorable()).then_some(entry.unstored).flatten(),
        seq: entry.seq,
    }
}

/// Whether two states of a path are the same entry.
pub(super) fn same_entry(a: Option<&Entry>, b: Option<&Entry>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.kind == b.kind && a.sha256 == b.sha256 && a.mode == b.mode && a.target == b.target
        }
        _ => false,
    }
}

/// The change a rewind records for a path it put back to `after` (absent: removed).
pub(super) fn rewind_change(
    path: &[u8],
    before: Option<&Entry>,
    after: Option<&Entry>,
) -> FileChange {
    let name = names::RecordedName::new(path);
    let kind = match (before, after) {
        (_, None) => FileChangeKind::Deleted,
        (None, Some(_)) => FileChangeKind::Created,
        (Some(_), Some(_)) => FileChangeKind::Modified,
    };
    let target = after
        .and_then(|a| a.target.as_deref())
        .map(names::RecordedName::new);
    FileChange {
        kind,
        path: name.display,
        path_b64: name.base64,
        before_sha256: before.and_then(|b| b.sha256.clone()),
        after_sha256: after.and_then(|a| a.sha256.clone()),
        before_size: before.map(|b| b.size),
        after_size: after.map(|a| a.size),
        after_stored: after.is_some_and(|a| a.kind == EntryKind::File && a.stored),
        after_unstored: after.and_then(|a| (!a.restorable()).then_some(a.unstored).flatten()),
        after_mode: after.filter(|a| a.kind == EntryKind::File).map(|a| a.mode),
        capability: toolexec_core::Capability::FsWrite,
        symlink_target: target.as_ref().map(|t| t.display.clone()),
        symlink_target_b64: target.and_then(|t| t.base64),
    }
}

/// How the log records an entry found right after a rewind: as the target state has it when it
/// is that (its contents stored), as the log already had it when it is that, else as seen — by
/// hash and size, its contents not stored.
pub(super) fn as_recorded(
    seen: &SeenEntry<'_>,
    target: Option<&Entry>,
    before: Option<&Entry>,
) -> Entry {
    if let Some(t) = target.filter(|t| history::same(Some(seen), t)) {
        return t.clone();
    }
    if let Some(b) = before.filter(|b| history::same(Some(seen), b)) {
        return b.clone();
    }
    match seen {
        SeenEntry::Symlink { target } => Entry {
            kind: EntryKind::Symlink,
            sha256: Some(toolexec_core::sha256_hex(target)),
            size: target.len() as u64,
            mode: 0o777,
            target: Some(target.to_vec()),
            stored: true,
            unstored: None,
            seq: 0,
        },
        SeenEntry::File { sha256, size, mode } => Entry {
            kind: EntryKind::File,
            sha256: sha256.clone(),
            size: *size,
            mode: *mode,
            target: None,
            stored: false,
            unstored: Some(toolexec_core::UnstoredReason::NotRestored),
            seq: 0,
        },
    }
}
