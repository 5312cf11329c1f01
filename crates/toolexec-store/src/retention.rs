//! Retention: expiring closed sessions' logs and the blobs only they name (`toolexec retention`,
//! docs/operator.md "Retention and backup").
//!
//! A session expires when it was closed before the cutoff — unless a session that does not
//! expire was forked or replayed from it: a fork's workspace is folded from its origin's log,
//! so the origin is kept as long as any session made from it (a whole chain of closed sessions
//! expires together). Then the blobs: those named by the expiring sessions (in their events,
//! in the manifests of their `files.changed` events, as their invocations' outputs) that no
//! other session names are deleted, from the database and from the object store. Content
//! addressing shares a blob between every session that wrote the same bytes; those are kept.
//!
//! It reads the whole log once (a page at a time), so it is a batch job for a quiet hour, not
//! something the service runs on a request path.
use std::collections::{HashMap, HashSet};
use std::io::BufRead;

use chrono::{DateTime, Utc};
use toolexec_core::{Event, EventKind};
use uuid::Uuid;

use crate::{Result, Store, StoreError};

/// Events (and invocations) read per page.
const PAGE: u32 = 5_000;

/// Most bytes a `files.changed` manifest is read to (the time-travel rebuild's bound).
const MAX_MANIFEST_BYTES: u64 = 1 << 30;

/// What a run expired, or would have (`dry_run`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    pub dry_run: bool,
    pub closed_before: DateTime<Utc>,
    /// Sessions deleted (or to be), with their logs.
    pub sessions: Vec<Uuid>,
    /// Sessions closed before the cutoff and kept because a session that stays was forked or
    /// replayed from them.
    pub kept_as_origin: Vec<Uuid>,
    /// Events of the expired sessions (counted in a dry run too).
    pub events: u64,
    /// Invocations and replays deleted (0 in a dry run).
    pub invocations: u64,
    pub replays: u64,
    /// Hashes of blobs named by the expired sessions only: deleted (or to be) where stored.
    pub blobs: u64,
    /// Rows of blobs deleted (0 in a dry run): hashes named but never stored (a file over
    /// `limits.max_blob_bytes`) have none.
    pub blob_rows_deleted: u64,
    /// Of those, the ones that are objects of the object store.
    pub objects: u64,
    /// Blobs the expired sessions named that other sessions name too, kept.
    pub blobs_shared: u64,
}

/// Maps a refused delete (a foreign key: a session that stays refers to one that goes) to a
/// plain refusal.
pub(crate) fn refused_delete(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Database(db) if db.is_foreign_key_violation() => StoreError::Refused {
            reason: "a session that is not expiring refers to one that is (its origin)".into(),
            cause: e.to_string(),
        },
        _ => e.into(),
    }
}

/// Which of `sessions` expire at `closed_before`, and which are kept as origins.
pub fn expiring(
    sessions: &[crate::RetentionSession],
    closed_before: DateTime<Utc>,
) -> (HashSet<Uuid>, Vec<Uuid>) {
    let mut set: HashSet<Uuid> = sessions
        .iter()
        .filter(|s| s.closed_at.is_some_and(|at| at < closed_before))
        .map(|s| s.id)
        .collect();
    let closed = set.clone();
    let children: Vec<(Uuid, Uuid)> = sessions
        .iter()
        .filter_map(|s| s.origin.map(|o| (o, s.id)))
        .collect();
    // An origin stays while any session made from it stays (to a fixed point: a chain).
    loop {
        let keep: Vec<Uuid> = children
            .iter()
            .filter(|(origin, child)| set.contains(origin) && !set.contains(child))
            .map(|(origin, _)| *origin)
            .collect();
        if keep.is_empty() {
            break;
        }
        for k in keep {
            set.remove(&k);
        }
    }
    let mut kept: Vec<Uuid> = closed.difference(&set).copied().collect();
    kept.sort();
    (set, kept)
}

/// The blob hashes an event's data names: every string under a key ending in `sha256`, except
/// the identity of a call's arguments (which is no blob). Generous on purpose: a hash counted
/// that is no blob costs nothing, a blob missed would be deleted while named.
fn named_in(value: &serde_json::Value, out: &mut HashSet<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match v {
                    serde_json::Value::String(s)
                        if k.ends_with("sha256") && k != "arguments_sha256" =>
                    {
                        out.insert(s.clone());
                    }
                    _ => named_in(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| named_in(v, out)),
        _ => {}
    }
}

/// The blobs an event names, its manifest's included (read from the store).
async fn event_names(store: &dyn Store, event: &Event, out: &mut HashSet<String>) -> Result<()> {
    named_in(&event.data, out);
    if event.kind != EventKind::FilesChanged {
        return Ok(());
    }
    let Some(sha) = event.data.get("manifest_sha256").and_then(|v| v.as_str()) else {
        return Ok(());
    };
    let Some(manifest) = store.blob(sha).await? else {
        tracing::warn!(session = %event.session_id, seq = event.seq, "retention: a files.changed manifest is not stored");
        return Ok(());
    };
    let reader = std::io::BufReader::new(std::io::Read::take(
        flate2::read::GzDecoder::new(&manifest[..]),
        MAX_MANIFEST_BYTES,
    ));
    for line in reader.lines() {
        let line = line.map_err(|e| StoreError::Corrupt(format!("manifest {sha}: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let change: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| StoreError::Corrupt(format!("manifest {sha}: {e}")))?;
        named_in(&change, out);
    }
    Ok(())
}

/// The candidates named by events appended after `seqs_at_start` was read (to sessions that
/// had more events since, or are new).
async fn appended_since(
    store: &dyn Store,
    seqs_at_start: &HashMap<Uuid, i64>,
    candidates: &HashSet<String>,
) -> Result<HashSet<String>> {
    let mut named = HashSet::new();
    for (id, last_seq) in store.session_seqs().await? {
        let seen = seqs_at_start.get(&id).copied().unwrap_or(0);
        if last_seq <= seen {
            continue;
        }
        let mut after = Some((id, seen));
        'session: loop {
            let page = store.scan_events(after, PAGE).await?;
            let Some(last) = page.last() else { break };
            after = Some((last.session_id, last.seq));
            for event in &page {
                if event.session_id != id {
                    break 'session;
                }
                let mut names = HashSet::new();
                event_names(store, event, &mut names).await?;
                named.extend(names.into_iter().filter(|s| candidates.contains(s)));
            }
        }
    }
    Ok(named)
}

/// Expires what closed before `closed_before` (see the module docs); with `dry_run`, only says
/// what it would delete.
pub async fn run(store: &dyn Store, closed_before: DateTime<Utc>, dry_run: bool) -> Result<Report> {
    // Where every log ended when the run began: events appended later are read again at the
    // end (see `appended_since`).
    let seqs_at_start: HashMap<Uuid, i64> = store.session_seqs().await?.into_iter().collect();
    let sessions = store.retention_sessions().await?;
    let (expire, kept_as_origin) = expiring(&sessions, closed_before);
    let mut report = Report {
        dry_run,
        closed_before,
        kept_as_origin,
        ..Report::default()
    };
    if expire.is_empty() {
        return Ok(report);
    }
    let mut ids: Vec<Uuid> = expire.iter().copied().collect();
    ids.sort();
    // What the expiring sessions name: their own logs, each one range of the primary key.
    let mut candidates: HashSet<String> = HashSet::new();
    for id in &ids {
        let mut after = Some((*id, 0));
        'session: loop {
            let page = store.scan_events(after, PAGE).await?;
            let Some(last) = page.last() else { break };
            after = Some((last.session_id, last.seq));
            for event in &page {
                if event.session_id != *id {
                    break 'session;
                }
                report.events += 1;
                event_names(store, event, &mut candidates).await?;
            }
        }
    }
    // Then which of those any other session names: the whole log once, a page at a time, only
    // the candidates kept in memory.
    let mut named_elsewhere: HashSet<String> = HashSet::new();
    let mut outputs_after = None;
    loop {
        let page = store.scan_output_refs(outputs_after, PAGE).await?;
        let Some(last) = page.last() else { break };
        outputs_after = Some(last.invocation_id);
        for r in page {
            if expire.contains(&r.session_id) {
                candidates.insert(r.sha256);
            } else if candidates.contains(&r.sha256) {
                named_elsewhere.insert(r.sha256);
            }
        }
    }
    let mut after = None;
    loop {
        let page = store.scan_events(after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = Some((last.session_id, last.seq));
        for event in page.iter().filter(|e| !expire.contains(&e.session_id)) {
            let mut names = HashSet::new();
            event_names(store, event, &mut names).await?;
            named_elsewhere.extend(names.into_iter().filter(|s| candidates.contains(s)));
        }
    }
    let mut unnamed: Vec<String> = candidates
        .iter()
        .filter(|s| !named_elsewhere.contains(*s))
        .cloned()
        .collect();
    unnamed.sort();
    report.blobs = unnamed.len() as u64;
    for chunk in unnamed.chunks(1_000) {
        report.objects += store.blob_objects(chunk).await?.len() as u64;
    }
    report.blobs_shared = named_elsewhere.len() as u64;
    report.sessions = ids.clone();
    if dry_run {
        return Ok(report);
    }
    // The sessions first, then their blobs: a crash in between leaves blobs nothing names
    // (found again by no run, but harmless), never a log that names a deleted blob.
    let deleted = store.delete_sessions(&ids).await?;
    // A live session may have written one of these blobs again while the logs were read: what
    // was appended since the start names it too. (Left: a write landing between this read and
    // the delete below, a window of milliseconds — docs/operator.md.)
    let again = appended_since(store, &seqs_at_start, &candidates).await?;
    if !again.is_empty() {
        tracing::info!(
            blobs = again.len(),
            "retention: blobs named again while it ran are kept"
        );
        unnamed.retain(|s| !again.contains(s));
        report.blobs = unnamed.len() as u64;
        report.blobs_shared += again.len() as u64;
    }
    report.events = deleted.events;
    report.invocations = deleted.invocations;
    report.replays = deleted.replays;
    for chunk in unnamed.chunks(1_000) {
        report.blob_rows_deleted += store.delete_blobs(chunk).await?;
    }
    tracing::info!(
        sessions = deleted.sessions,
        events = deleted.events,
        blobs = report.blobs,
        objects = report.objects,
        "retention: expired"
    );
    Ok(report)
}
