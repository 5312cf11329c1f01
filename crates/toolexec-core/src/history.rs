//! Reading a session's record back: its workspace at any event (a tree, a file), putting a live
//! workspace back to an earlier event (rewind), and starting a new session from one (fork).
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::event::{Rewound, UnstoredReason};
use crate::session::{Policy, Session};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TreeEntryKind {
    File,
    Symlink,
}

/// One file or symlink of the workspace as it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TreeEntry {
    /// Workspace-relative, `/`-separated; for a name that is not UTF-8, a display form with
    /// `\xHH` for each invalid byte, and `path_b64` holds the bytes.
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub path_b64: Option<String>,
    pub kind: TreeEntryKind,
    /// Bytes (of the target text, for a symlink).
    pub size: u64,
    /// SHA-256 of the contents (of the target text, for a symlink); absent when the file was
    /// recorded without being read (hard-linked, past a scan budget).
    pub sha256: Option<String>,
    /// Permission bits (`0o644` is 420); `0o777` for a symlink.
    pub mode: u32,
    /// A symlink's target, not followed (a display form like `path`'s if not UTF-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub symlink_target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub symlink_target_b64: Option<String>,
    /// Whether the log holds the contents (`GET …/files/{path}?at=` can return them, a fork or
    /// rewind can put them back).
    pub restorable: bool,
    /// Why not, when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub unstored: Option<UnstoredReason>,
    /// The event that gave the entry this state.
    pub seq: i64,
}

/// `GET /v1/sessions/{id}/tree?at=SEQ`: one page of the workspace as it was right after event
/// `at`, rebuilt from the log alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Tree {
    pub session_id: uuid::Uuid,
    /// The event the tree is the state after.
    pub at: i64,
    /// Files and symlinks in all (directories are implied by the paths; empty ones are not
    /// recorded).
    pub total: u64,
    /// Of them, files whose contents the log does not hold.
    pub unrestorable: u64,
    /// Entries in byte order of their paths.
    pub entries: Vec<TreeEntry>,
    /// Pass as `cursor` for the next page; `null` on the last.
    pub next_cursor: Option<String>,
}

/// The body of `POST /v1/sessions/{id}/rewind`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindRequest {
    /// The workspace goes back to its state right after this event.
    pub to_seq: i64,
    /// Go ahead even if the state has files whose contents the log does not hold (they are
    /// left as they are and listed); otherwise such a rewind is a 409 `unrestorable`.
    #[serde(default)]
    pub allow_partial: bool,
}

/// What a rewind did (`POST /v1/sessions/{id}/rewind`): its `workspace.rewound` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RewindResult {
    pub session_id: uuid::Uuid,
    /// The seq of the `workspace.rewound` event; the `file.*` events after it list each change.
    pub seq: i64,
    #[serde(flatten)]
    pub rewound: Rewound,
}

/// The body of `POST /v1/sessions/{id}/fork`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// The fork starts as the source was right after this event (default: its last).
    #[serde(default)]
    pub at_seq: Option<i64>,
    /// The fork's metadata (default: the source's).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<serde_json::Value>,
    /// A policy at most as permissive as the source's (default: the source's).
    #[serde(default)]
    pub policy: Option<Policy>,
    /// A tool allow-list within the source's (default: the source's).
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Go ahead even if the state has files whose contents the log does not hold (the fork
    /// starts without them, and `unrestorable` lists them); otherwise a 409 `unrestorable`.
    #[serde(default)]
    pub allow_partial: bool,
}

/// A fork (`POST /v1/sessions/{id}/fork`, 201): the new session, and what it could not get.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Forked {
    #[serde(flatten)]
    pub session: Session,
    /// Files of the state the fork started without (their contents are not in the log).
    pub unrestorable: Vec<String>,
    /// Whether the fork shares its base's contents (overlay) or got a copy.
    pub shares_contents: bool,
}

/// What an archive upload put in a session's workspace (`PUT /v1/sessions/{id}/archive`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ArchiveUploaded {
    /// Regular files in the archive.
    pub files: u64,
    /// Symlinks in the archive.
    pub symlinks: u64,
    /// Directory entries (not recorded: the log records files and symlinks).
    pub directories: u64,
    /// Bytes of file contents unpacked.
    pub bytes: u64,
    /// File events recorded (created or modified; a file that already held these bytes is not
    /// a change).
    pub events: u64,
    /// The session's last seq after the upload.
    pub last_seq: i64,
}
