//! What one call may put in the store, and what is recorded in place of a write the store
//! refuses.
//!
//! Two rules keep a call's record from costing the service without bound or being retried
//! forever:
//! - **A budget of blob bytes per call** (`limits.max_blob_bytes_per_call`): contents beyond it
//!   are recorded by hash and size only, and the file event says why (`after_unstored:
//!   "call_budget"`).
//! - **A refused write becomes a failed call.** When the store cannot hold a call's record (see
//!   [`toolexec_store::check`]), the call is recorded as `error`, saying in plain words that its
//!   record could not be stored and why, with the side effects the store can hold — first those
//!   that pass the store's checks, then, if even that is refused, none.
//!
//! It does not decide when to write (the engine does) nor how (the recorder does).
use std::collections::{HashMap, HashSet};

use serde_json::Value;
use toolexec_core::CallStatus;
use toolexec_store::{Blob, NewEvent, Outcome, Write};

/// `after_unstored` of a file whose contents did not fit the call's blob budget
/// ([`toolexec_core::UnstoredReason::CallBudget`], as the event's JSON spells it).
pub(crate) const CALL_BUDGET: &str = "call_budget";

/// Keeps the blobs of one call within `max` bytes. Blobs the record refers to by other means
/// (the full output, which the invocation points at, and manifests) are kept first; then
/// contents — files' and fetched bodies (`web.exchange`) — in log order, each whole or not at
/// all. A file whose contents do not fit keeps its hash and size and gets `after_stored: false`,
/// `after_unstored: "call_budget"`; a body, `body_stored: false`. Returns how many lost their
/// contents.
pub(crate) fn apply_blob_budget(
    side_effects: &mut [NewEvent],
    blobs: &mut Vec<Blob>,
    max: usize,
) -> usize {
    if blobs.iter().map(Blob::len).sum::<usize>() <= max {
        return 0;
    }
    let sizes: HashMap<String, usize> = blobs.iter().map(|b| (b.sha256.clone(), b.len())).collect();
    let contents: HashSet<&str> = side_effects
        .iter()
        .filter_map(|e| stored_contents(&e.data))
        .collect();
    let mut kept: HashSet<String> = HashSet::new();
    let mut used = 0usize;
    for (sha, len) in &sizes {
        if !contents.contains(sha.as_str()) {
            kept.insert(sha.clone());
            used += len;
        }
    }
    let mut dropped = 0;
    for event in side_effects.iter_mut() {
        let Some(sha) = stored_contents(&event.data).map(str::to_owned) else {
            continue;
        };
        let Some(&len) = sizes.get(&sha) else {
            continue;
        };
        if kept.contains(&sha) {
            continue;
        }
        if used + len <= max {
            used += len;
            kept.insert(sha);
        } else if let Some(data) = event.data.as_object_mut() {
            if data.contains_key("body_stored") {
                data.insert("body_stored".into(), Value::Bool(false));
            } else {
                data.insert("after_stored".into(), Value::Bool(false));
                data.insert("after_unstored".into(), Value::from(CALL_BUDGET));
            }
            dropped += 1;
        }
    }
    blobs.retain(|b| kept.contains(&b.sha256));
    dropped
}

/// The hash of contents an event says are stored: a file's after-contents, or a fetched body.
fn stored_contents(data: &Value) -> Option<&str> {
    stored_after(data).or_else(|| {
        (data.get("body_stored") == Some(&Value::Bool(true)))
            .then(|| data.get("body_sha256").and_then(Value::as_str))
            .flatten()
    })
}

/// The hash of a file event's after-contents when the event says they are stored.
fn stored_after(data: &Value) -> Option<&str> {
    (data.get("after_stored") == Some(&Value::Bool(true)))
        .then(|| data.get("after_sha256").and_then(Value::as_str))
        .flatten()
}

/// What to record, in order, in place of `write` after the store refused it for `reason`: the
/// call ending `error` with the side effects that pass the store's checks (and the blobs), then
/// with none. Each with the outcome it records. Nothing for a `Start`: a call whose start cannot
/// be recorded does not run.
pub(crate) fn fallbacks(write: &Write, reason: &str) -> Vec<(Write, Outcome)> {
    let (outcome, side_effects, blobs) = match write {
        Write::Start { .. } => return Vec::new(),
        Write::Finish {
            outcome,
            side_effects,
            blobs,
            ..
        }
        | Write::Record {
            outcome,
            side_effects,
            blobs,
            ..
        } => (outcome, side_effects, blobs),
    };
    let storable: Vec<NewEvent> = side_effects
        .iter()
        .filter(|e| e.unstorable().is_none())
        .cloned()
        .collect();
    let total = side_effects.len();
    let some = refused_outcome(outcome, reason, storable.len(), total);
    let none = refused_outcome(outcome, reason, 0, total);
    vec![
        (
            with_ending(write, some.clone(), storable, blobs.clone()),
            some,
        ),
        (
            with_ending(write, none.clone(), Vec::new(), Vec::new()),
            none,
        ),
    ]
}

fn with_ending(
    write: &Write,
    outcome: Outcome,
    side_effects: Vec<NewEvent>,
    blobs: Vec<Blob>,
) -> Write {
    match write {
        Write::Start { invocation } => Write::Start {
            invocation: invocation.clone(),
        },
        Write::Finish {
            session_id,
            invocation_id,
            ..
        } => Write::Finish {
            session_id: *session_id,
            invocation_id: *invocation_id,
            outcome,
            side_effects,
            blobs,
        },
        Write::Record { invocation, .. } => Write::Record {
            invocation: invocation.clone(),
            outcome,
            side_effects,
            blobs,
        },
    }
}

/// The end of a call whose record the store refused: `error`, and why, for the model.
fn refused_outcome(original: &Outcome, reason: &str, kept: usize, total: usize) -> Outcome {
    let effects = match (kept, total) {
        (_, 0) => String::new(),
        (k, t) if k == t => format!(" Its side effects ({t}) are recorded."),
        (0, t) => format!(
            " Its side effects ({t}) could not be recorded either: the workspace may hold changes the log does not show."
        ),
        (k, t) => format!(
            " Of its {t} side effects, the {k} the store can hold are recorded; the others are not."
        ),
    };
    let content = format!(
        "The call ran, but its result could not be recorded: {reason}. What it returned is not shown, because no result leaves the service unrecorded.{effects} Check the workspace (for example with read_file or list_dir) before you retry with a new call id."
    );
    Outcome {
        status: CallStatus::Error,
        output_chars: i64::try_from(content.chars().count()).unwrap_or(i64::MAX),
        content,
        truncated: None,
        output_sha256: None,
        finished_at: chrono::Utc::now(),
        duration_ms: original.duration_ms,
        // The model is not shown what the call read: none of it counts as read.
        reads: Vec::new(),
        structured: None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_call_budget_reason_is_spelled_as_the_event_type_spells_it() {
        assert_eq!(
            serde_json::to_value(toolexec_core::UnstoredReason::CallBudget).ok(),
            Some(serde_json::Value::from(super::CALL_BUDGET))
        );
    }

    use serde_json::json;
    use toolexec_core::EventKind;
    use uuid::Uuid;

    use super::*;

    fn file(blob: &Blob) -> NewEvent {
        NewEvent {
            kind: EventKind::FileCreated,
            data: json!({"path": "f", "after_sha256": blob.sha256, "after_size": blob.len(), "after_stored": true}),
        }
    }

    #[test]
    fn contents_beyond_the_budget_are_recorded_by_hash_and_the_event_says_why() {
        let a = Blob::new(vec![1u8; 400]);
        let b = Blob::new(vec![2u8; 400]);
        let c = Blob::new(vec![3u8; 100]);
        let output = Blob::new(vec![4u8; 300]);
        let mut effects = vec![file(&a), file(&b), file(&a), file(&c)];
        let mut blobs = vec![output.clone(), a.clone(), b.clone(), c.clone()];
        let dropped = apply_blob_budget(&mut effects, &mut blobs, 800);
        // The output (300) first, then a (400); b does not fit; a again is already kept; c fits.
        assert_eq!(dropped, 1);
        let kept: HashSet<&str> = blobs.iter().map(|b| b.sha256.as_str()).collect();
        assert_eq!(
            kept,
            HashSet::from([output.sha256.as_str(), a.sha256.as_str(), c.sha256.as_str()])
        );
        assert_eq!(effects[1].data["after_stored"], false);
        assert_eq!(effects[1].data["after_unstored"], CALL_BUDGET);
        assert_eq!(effects[1].data["after_sha256"], b.sha256.as_str());
        for i in [0, 2, 3] {
            assert_eq!(effects[i].data["after_stored"], true);
            assert!(effects[i].data.get("after_unstored").is_none());
        }
        // Within the budget nothing changes.
        let mut effects = vec![file(&c)];
        let mut blobs = vec![c];
        assert_eq!(apply_blob_budget(&mut effects, &mut blobs, 100), 0);
        assert_eq!(blobs.len(), 1);
    }

    #[test]
    fn fetched_bodies_count_against_the_budget_like_file_contents() {
        let page = Blob::new(vec![5u8; 600]);
        let file_blob = Blob::new(vec![6u8; 300]);
        let exchange = NewEvent {
            kind: EventKind::WebExchange,
            data: json!({"role": "page", "body_sha256": page.sha256, "body_stored": true}),
        };
        let mut effects = vec![file(&file_blob), exchange];
        let mut blobs = vec![file_blob.clone(), page];
        assert_eq!(apply_blob_budget(&mut effects, &mut blobs, 500), 1);
        assert_eq!(effects[1].data["body_stored"], false);
        assert!(effects[1].data.get("after_stored").is_none());
        assert_eq!(blobs.len(), 1);
        assert_eq!(blobs[0].sha256, file_blob.sha256);
    }

    #[test]
    fn a_refused_finish_falls_back_to_an_error_with_the_storable_side_effects_then_none() {
        let blob = Blob::new(b"x".to_vec());
        let good = file(&blob);
        let bad = NewEvent {
            kind: EventKind::FileCreated,
            data: json!({"path": "a\u{0}"}),
        };
        let write = Write::Finish {
            session_id: Uuid::now_v7(),
            invocation_id: Uuid::now_v7(),
            outcome: Outcome {
                status: CallStatus::Ok,
                content: "out".into(),
                truncated: None,
                output_chars: 3,
                output_sha256: None,
                finished_at: chrono::Utc::now(),
                duration_ms: 5.0,
                reads: Vec::new(),
                structured: None,
            },
            side_effects: vec![good.clone(), bad],
            blobs: vec![blob],
        };
        let steps = fallbacks(&write, "it is too large");
        assert_eq!(steps.len(), 2);
        let (first, outcome) = &steps[0];
        assert_eq!(outcome.status, CallStatus::Error);
        assert!(
            outcome
                .content
                .contains("could not be recorded: it is too large.")
        );
        assert!(outcome.content.contains("Of its 2 side effects, the 1"));
        match first {
            Write::Finish {
                side_effects,
                blobs,
                ..
            } => {
                assert_eq!(side_effects, &vec![good]);
                assert_eq!(blobs.len(), 1);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(first.unstorable(), None);
        let (last, outcome) = &steps[1];
        assert!(outcome.content.contains("could not be recorded either"));
        assert!(last.blobs().is_empty());
        assert_eq!(last.unstorable(), None);
    }
}
