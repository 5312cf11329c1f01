//! Verify replays: a new session re-runs a recorded session's calls in order, and a report says,
//! call by call, whether the status, the output and the side effects came out the same — and
//! where they first differ when they do not.
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::call::InvocationStatus;

/// How a replay runs. Only `verify` exists: re-execute and compare.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReplayMode {
    #[default]
    Verify,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReplayStatus {
    /// Still re-running calls; `calls` holds those done so far.
    Running,
    /// Every recorded call was re-run (or could not be, which its entry says).
    Finished,
    /// The replay stopped before the end (`error` says why).
    Failed,
}

impl ReplayStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayStatus::Running => "running",
            ReplayStatus::Finished => "finished",
            ReplayStatus::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "running" => Some(ReplayStatus::Running),
            "finished" => Some(ReplayStatus::Finished),
            "failed" => Some(ReplayStatus::Failed),
            _ => None,
        }
    }
}

/// What of a call is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Aspect {
    Status,
    Output,
    SideEffects,
}

/// The first difference of one aspect of a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Divergence {
    pub aspect: Aspect,
    /// In words: `line 3 of the output differs`, `a.txt: contents differ`, …
    pub detail: String,
    /// The 1-based line of the output where it first differs (`output`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u64>,
    /// The file whose change differs first (`side_effects`), workspace-relative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// What the source session recorded there (a line, a status, a hash), cut to 500
    /// characters; absent when it had nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded: Option<String>,
    /// What the replay got there, likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed: Option<String>,
}

/// One recorded call and how its re-run compares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ReplayedCall {
    pub call_id: String,
    pub name: String,
    /// The recorded invocation of the source session.
    pub recorded_invocation_id: Uuid,
    /// The invocation of the replay session (absent if it could not run).
    pub replayed_invocation_id: Option<Uuid>,
    pub recorded_status: InvocationStatus,
    pub replayed_status: Option<InvocationStatus>,
    /// Whether its result came from the record instead of running again (observations from
    /// outside, such as web responses, matched by tool, arguments and ordinal).
    pub served_from_record: bool,
    pub status_matched: bool,
    pub output_matched: bool,
    pub side_effects_matched: bool,
    /// The first difference of each aspect that did not match; empty when the call matched.
    pub divergences: Vec<Divergence>,
}

/// A replay and its report (`POST /v1/sessions/{id}/replay`, `GET /v1/replays/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Replay {
    pub id: Uuid,
    pub mode: ReplayMode,
    pub status: ReplayStatus,
    /// The recorded session.
    pub source_session_id: Uuid,
    /// The new session that re-ran the calls (its own log records the re-run).
    pub session_id: Uuid,
    /// Recorded calls to re-run, and how many have been.
    pub calls_total: u64,
    pub calls_replayed: u64,
    /// Calls with at least one divergence.
    pub calls_diverged: u64,
    pub calls: Vec<ReplayedCall>,
    /// Why a `failed` replay stopped.
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}
