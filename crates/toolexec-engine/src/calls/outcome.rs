//! What a call's result and record are made of: the output truncated for the model (the full
//! output kept as a blob, itself capped), file changes turned into side-effect events with their
//! blobs (summed up past the per-call cap), and the other events a tool emitted.
use std::sync::Arc;
use std::time::Instant;

use toolexec_core::{CallResult, OutputLimit, Session, TruncationMode, truncate};
use toolexec_store::{Blob, NewInvocation, Outcome};
use toolexec_tools::{Tool, ToolOutput};
use uuid::Uuid;

use super::Calls;
use crate::Engine;

/// The output limit of a call: its tool's, or the session's override for that tool; a call of
/// no known tool gets the default of "others" (SPEC §4).
pub(super) fn output_limit(
    tool: Option<&Arc<dyn Tool>>,
    session: &Session,
    name: &str,
) -> OutputLimit {
    let mut limit = tool.map_or(OutputLimit::new(50_000, TruncationMode::HeadTail), |t| {
        t.spec().output_limit
    });
    if let Some(chars) = session.policy.output_limits.get(name) {
        limit.max_chars = *chars;
    }
    limit
}

impl Calls {
    pub(super) fn outcome(
        &self,
        engine: &Engine,
        limit: OutputLimit,
        inv: &NewInvocation,
        out: ToolOutput,
        t0: Instant,
    ) -> Recorded {
        self.outcome_for(
            engine,
            limit,
            NewInvocationRef {
                id: inv.id,
                call_id: &inv.call_id,
                name: &inv.name,
            },
            out,
            t0,
        )
    }

    /// Truncates the output for the model, keeps the full output as a blob when cut, and turns
    /// file changes into side-effect events with their blobs.
    pub(super) fn outcome_for(
        &self,
        engine: &Engine,
        limit: OutputLimit,
        inv: NewInvocationRef<'_>,
        out: ToolOutput,
        t0: Instant,
    ) -> Recorded {
        let limits = &engine.config.limits;
        // File changes first: past the per-call cap they are summed up, and the model is told.
        let mut blobs = Vec::new();
        let mut files = crate::effects::FileEvents::new(limits.max_file_events_per_call);
        for change in out.changes {
            let (event, blob) = engine.runtimes.change_event(engine, change);
            files.push(event);
            blobs.extend(blob);
        }
        let (mut side_effects, manifest, files_note) = files.finish();
        blobs.extend(manifest);
        crate::effects::dedup_blobs(&mut blobs);
        let mut full = out.content;
        full.extend(files_note);
        // Text with NUL cannot be stored (nor is it useful to a model): shown as U+FFFD.
        if full.contains('\0') {
            full = full.replace('\0', "\u{FFFD}");
        }
        let hint = if full.len() <= limits.max_stored_output_bytes {
            format!(
                "call read_output with invocation_id \"{}\" to page through the full output",
                inv.id
            )
        } else {
            format!(
                "call read_output with invocation_id \"{}\" to page through the recorded output \
                 (only its first and last {} bytes are kept: it is over the service's {}-byte \
                 limit for a recorded output)",
                inv.id,
                limits.max_stored_output_bytes / 2,
                limits.max_stored_output_bytes
            )
        };
        let (content, truncated) = truncate(&full, limit, &hint);
        let output_sha256 = truncated.as_ref().map(|_| {
            let stored = crate::effects::stored_output(full, limits.max_stored_output_bytes);
            let blob = Blob::new(stored.into_bytes());
            let sha = blob.sha256.clone();
            blobs.push(blob);
            sha
        });
        for mut event in out.events {
            // Bytes an event names (a fetched body) are stored with it, as file contents are:
            // up to `limits.max_blob_bytes`, else named by hash only.
            if let Some(bytes) = event.blob.take() {
                if bytes.len() <= limits.max_blob_bytes {
                    // Hashed by the tool already (off the async workers): not hashed again.
                    blobs.push(match event.data["body_sha256"].as_str() {
                        Some(sha) => Blob {
                            sha256: sha.to_owned(),
                            bytes,
                        },
                        None => Blob::new(bytes),
                    });
                } else if let Some(fields) = event.data.as_object_mut() {
                    fields.insert("body_stored".into(), false.into());
                }
            }
            side_effects.push(toolexec_store::NewEvent {
                kind: event.kind,
                data: event.data,
            });
        }
        crate::effects::dedup_blobs(&mut blobs);
        let duration_ms = t0.elapsed().as_secs_f64() * 1000.0;
        let output_chars = truncated
            .as_ref()
            .map_or_else(|| content.chars().count(), |t| t.total_chars);
        Recorded {
            result: CallResult {
                call_id: inv.call_id.to_owned(),
                invocation_id: inv.id,
                name: inv.name.to_owned(),
                status: out.status,
                is_error: out.status.is_error(),
                content: content.clone(),
                truncated: truncated.clone(),
                duration_ms,
                seq: 0,
                structured: out.structured.clone(),
            },
            outcome: Outcome {
                status: out.status,
                content,
                truncated,
                output_chars: i64::try_from(output_chars).unwrap_or(i64::MAX),
                output_sha256,
                finished_at: chrono::Utc::now(),
                duration_ms,
                reads: Vec::new(),
                structured: out.structured,
            },
            side_effects,
            blobs,
        }
    }
}

/// The parts of an invocation needed to build its result.
pub(super) struct NewInvocationRef<'a> {
    pub id: Uuid,
    pub call_id: &'a str,
    pub name: &'a str,
}

/// A call's result for the client and what its record holds.
pub(super) struct Recorded {
    pub result: CallResult,
    pub outcome: Outcome,
    pub side_effects: Vec<toolexec_store::NewEvent>,
    pub blobs: Vec<Blob>,
}
