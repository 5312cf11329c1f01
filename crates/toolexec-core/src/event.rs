//! The append-only log: events numbered by a gapless per-session `seq`, invocations and the side
//! effects they caused.
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::call::InvocationStatus;
use crate::tool::Capability;
use crate::truncate::Truncation;

/// Kinds of log events. Stored as their dotted string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
pub enum EventKind {
    #[serde(rename = "session.created")]
    SessionCreated,
    #[serde(rename = "session.closed")]
    SessionClosed,
    /// A call began: `call_id`, `name`, `arguments`, `read_only`, `capabilities`. A read-only
    /// call that ends with no side effect has none: its `invocation.finished` carries these
    /// fields instead ([`EventKind::starts_call`]).
    #[serde(rename = "invocation.started")]
    InvocationStarted,
    /// A call ended: `call_id`, `name`, `status`, `is_error`, `duration_ms`, `truncated`,
    /// `output_chars`, `output_sha256` (and `reads`, `structured` when it has them). For a
    /// read-only call with no side effect it is the call's only event, at one seq, and also
    /// carries its start: `arguments`, `read_only`, `capabilities`.
    #[serde(rename = "invocation.finished")]
    InvocationFinished,
    #[serde(rename = "file.created")]
    FileCreated,
    #[serde(rename = "file.modified")]
    FileModified,
    #[serde(rename = "file.deleted")]
    FileDeleted,
    /// `update_plan` replaced the session's plan (the todo list).
    #[serde(rename = "plan.updated")]
    PlanUpdated,
    /// `shell` started a background process.
    #[serde(rename = "process.started")]
    ProcessStarted,
    /// A background process exited (recorded by the call that first saw it, or at close).
    #[serde(rename = "process.exited")]
    ProcessExited,
    /// The file changes of one call beyond its first `limits.max_file_events_per_call`, summed
    /// up ([`FilesChanged`]); every one of them is listed in the manifest blob it names.
    #[serde(rename = "files.changed")]
    FilesChanged,
    /// `POST /v1/sessions/{id}/rewind` put the workspace back to its state after an earlier
    /// event ([`Rewound`]); the `file.*` events that follow it (no invocation) are what it
    /// changed.
    #[serde(rename = "workspace.rewound")]
    WorkspaceRewound,
    /// A connection a command made through the session's egress proxy, allowed or refused
    /// (recorded by the `shell` call that ran the command, or by the next one for a background
    /// process's).
    #[serde(rename = "network.request")]
    NetworkRequest,
    /// One request a web tool (`web_fetch`, `web_search`) made to the outside world and what
    /// came back ([`WebExchange`]): an observation, which a verify replay serves again from the
    /// record instead of asking the network.
    #[serde(rename = "web.exchange")]
    WebExchange,
    /// A node took the session over from one that is gone (or rebuilt a workspace it lost):
    /// calls and background processes that were running there are recorded interrupted
    /// (before this event), and the workspace was rebuilt from the log.
    #[serde(rename = "session.taken_over")]
    SessionTakenOver,
    /// A todo (a plan step or a task) was created ([`crate::todo::Todo`]).
    #[serde(rename = "todo.created")]
    TodoCreated,
    /// A todo changed: the event has it whole, as it is now.
    #[serde(rename = "todo.updated")]
    TodoUpdated,
    /// A todo was removed (a task set to `deleted`, a step gone from the plan).
    #[serde(rename = "todo.deleted")]
    TodoDeleted,
    /// A call waits for a person's decision (the session's `policy.approval`): its call, why
    /// it waits, and until when. Its `invocation.started` follows its approval.
    #[serde(rename = "approval.requested")]
    ApprovalRequested,
    /// A person approved or denied a waiting call, or nobody did in time: `decision`
    /// (`approved`/`denied`), `by` (who), `reason`, `expired`.
    #[serde(rename = "approval.decided")]
    ApprovalDecided,
    /// `exec_command` started a program in a terminal: `terminal_id` (its session ID),
    /// `command`, `workdir`, `tty`, `cols`, `rows`.
    #[serde(rename = "terminal.opened")]
    TerminalOpened,
    /// What a terminal printed and the call that returned it showed the model: `raw` (escape
    /// sequences kept, lossily decoded, at most 256 KiB; `raw_bytes` counts all), `dropped_bytes`
    /// (cut from an unread buffer past 1 MiB). What the model typed is the call's own `chars`.
    #[serde(rename = "terminal.output")]
    TerminalOutput,
    /// A terminal's program ended (`exit_code`, `killed_by` when the service ended it: idle,
    /// session closed, rewind, take-over).
    #[serde(rename = "terminal.exited")]
    TerminalExited,
}

impl EventKind {
    pub const ALL: [EventKind; 23] = [
        EventKind::SessionCreated,
        EventKind::SessionClosed,
        EventKind::InvocationStarted,
        EventKind::InvocationFinished,
        EventKind::FileCreated,
        EventKind::FileModified,
        EventKind::FileDeleted,
        EventKind::PlanUpdated,
        EventKind::ProcessStarted,
        EventKind::ProcessExited,
        EventKind::FilesChanged,
        EventKind::WorkspaceRewound,
        EventKind::NetworkRequest,
        EventKind::WebExchange,
        EventKind::SessionTakenOver,
        EventKind::TodoCreated,
        EventKind::TodoUpdated,
        EventKind::TodoDeleted,
        EventKind::ApprovalRequested,
        EventKind::ApprovalDecided,
        EventKind::TerminalOpened,
        EventKind::TerminalOutput,
        EventKind::TerminalExited,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::SessionCreated => "session.created",
            EventKind::SessionClosed => "session.closed",
            EventKind::InvocationStarted => "invocation.started",
            EventKind::InvocationFinished => "invocation.finished",
            EventKind::FileCreated => "file.created",
            EventKind::FileModified => "file.modified",
            EventKind::FileDeleted => "file.deleted",
            EventKind::PlanUpdated => "plan.updated",
            EventKind::ProcessStarted => "process.started",
            EventKind::ProcessExited => "process.exited",
            EventKind::FilesChanged => "files.changed",
            EventKind::WorkspaceRewound => "workspace.rewound",
            EventKind::NetworkRequest => "network.request",
            EventKind::WebExchange => "web.exchange",
            EventKind::SessionTakenOver => "session.taken_over",
            EventKind::TodoCreated => "todo.created",
            EventKind::TodoUpdated => "todo.updated",
            EventKind::TodoDeleted => "todo.deleted",
            EventKind::ApprovalRequested => "approval.requested",
            EventKind::ApprovalDecided => "approval.decided",
            EventKind::TerminalOpened => "terminal.opened",
            EventKind::TerminalOutput => "terminal.output",
            EventKind::TerminalExited => "terminal.exited",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether an event of this kind with this `data` records the start of a call: its
    /// `invocation.started`, or the `invocation.finished` of a call recorded in one event (the
    /// one that carries `arguments`). Every call has exactly one such event, however it was
    /// recorded; a call denied before it ran has none.
    pub fn starts_call(self, data: &serde_json::Value) -> bool {
        match self {
            EventKind::InvocationStarted => true,
            EventKind::InvocationFinished => data.get("arguments").is_some(),
            _ => false,
        }
    }

    /// Side effects are every event an invocation causes other than its own start and finish.
    pub fn is_side_effect(self) -> bool {
        matches!(
            self,
            EventKind::FileCreated
                | EventKind::FileModified
                | EventKind::FileDeleted
                | EventKind::PlanUpdated
                | EventKind::ProcessStarted
                | EventKind::ProcessExited
                | EventKind::FilesChanged
                | EventKind::NetworkRequest
                | EventKind::WebExchange
                | EventKind::TodoCreated
                | EventKind::TodoUpdated
                | EventKind::TodoDeleted
                | EventKind::TerminalOpened
                | EventKind::TerminalOutput
                | EventKind::TerminalExited
        )
    }

    /// Events that change what the workspace holds, in the order a rebuild applies them.
    pub fn changes_files(self) -> bool {
        matches!(
            self,
            EventKind::FileCreated
                | EventKind::FileModified
                | EventKind::FileDeleted
                | EventKind::FilesChanged
        )
    }
}

/// One row of a session's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    pub session_id: Uuid,
    /// 1, 2, 3, … per session, no gaps.
    pub seq: i64,
    pub kind: EventKind,
    pub invocation_id: Option<Uuid>,
    /// Kind-specific payload (see the event kinds in the docs). In a page or a stream, an
    /// event larger than its bound shows the beginning of its data only (`truncated`).
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
    pub created_at: DateTime<Utc>,
    /// Present when `data` is cut short: its size, and the path that serves the event whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub truncated: Option<crate::excerpt::Truncated>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileChangeKind {
    Created,
    Modified,
    Deleted,
}

impl FileChangeKind {
    pub fn event_kind(self) -> EventKind {
        match self {
            FileChangeKind::Created => EventKind::FileCreated,
            FileChangeKind::Modified => EventKind::FileModified,
            FileChangeKind::Deleted => EventKind::FileDeleted,
        }
    }
}

/// The payload of a `file.*` event: one file created, modified or deleted in the workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FileChange {
    pub kind: FileChangeKind,
    /// Workspace-relative path, `/`-separated. For a path that is not UTF-8, a display form
    /// with each invalid byte written `\xHH`, and `path_b64` holds the exact bytes.
    pub path: String,
    /// Standard base64 of the raw path bytes, present only when the path is not UTF-8 (see
    /// `toolexec_core::names`): two names never share one record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub path_b64: Option<String>,
    pub before_sha256: Option<String>,
    pub after_sha256: Option<String>,
    pub before_size: Option<u64>,
    pub after_size: Option<u64>,
    /// Whether the after contents are stored as a blob (they are unless over the size limit).
    pub after_stored: bool,
    /// The permission bits of a regular file after the change (`0o644`, `0o755`, …; the
    /// setuid, setgid and sticky bits included). Absent for symlinks and deletions, and in
    /// events recorded before modes were (a rebuild then assumes `0o644`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub after_mode: Option<u32>,
    /// Why the after contents are not stored, for a file that exists after the change: absent
    /// when they are stored, and for deletions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub after_unstored: Option<UnstoredReason>,
    /// The capability under which the change was made (`fs.write`, `content_from_source`, …).
    pub capability: Capability,
    /// Set when the path is a symbolic link after the change (created or modified): the link's
    /// target text, not followed (a display form like `path`'s if it is not UTF-8).
    /// `after_sha256` and `after_size` are then those of this text, and the stored blob is the
    /// text. Absent for regular files and for deletions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub symlink_target: Option<String>,
    /// Standard base64 of the raw target bytes, present only when they are not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub symlink_target_b64: Option<String>,
}

/// Why a file's contents after a change are not stored as a blob (`FileChange::after_unstored`).
/// With `too_large` and `content_budget` the file was read and `after_sha256` is its hash; with
/// the others it was not read (or not to the end), and `after_sha256` is absent: the record has
/// its size and the change is found again by its metadata (inode, size, times).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum UnstoredReason {
    /// Larger than `limits.max_blob_bytes`.
    TooLarge,
    /// The workspace scan's budget for retained contents (`limits.scan_content_budget_bytes`)
    /// was used up by smaller files.
    ContentBudget,
    /// The workspace scan's hash budget (`limits.scan_hash_budget_bytes`) was used up.
    HashBudget,
    /// The workspace scan's deadline (`limits.scan_time_budget_ms`) passed.
    TimeBudget,
    /// Larger than the scanner hashes at all (a sparse file can claim terabytes).
    TooLargeToHash,
    /// More than one hard link: never read, since a link may lead to a file outside the
    /// workspace.
    HardLink,
    /// The service could not read it (permissions, an I/O error).
    Unreadable,
    /// The call's budget of stored blob bytes (`limits.max_blob_bytes_per_call`) was used up.
    CallBudget,
    /// A rewind could not put the file back as the log had it (it could not be written, or a
    /// process changed it while the rewind ran): recorded as found right after the rewind.
    NotRestored,
}

/// One entry of the `reads` of an `invocation.finished` event: a file the call read (or wrote,
/// which counts as reading what it wrote), for read-before-write. A node that rebuilds a
/// session's runtime folds these from the log (docs/design.md, "Read-state from the log").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FileRead {
    /// The path as the file tools name it (workspace-relative, `/`-separated; a name that is
    /// not UTF-8 in its display form).
    pub path: String,
    /// SHA-256 of the contents the call saw; `null`: the call deleted the file, and what was
    /// read of it before no longer counts.
    pub sha256: Option<String>,
}

/// The payload of a `workspace.rewound` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Rewound {
    /// The workspace is now as it was right after this event.
    pub to_seq: i64,
    /// Files and symlinks the rewind wrote (restored or put back), removed, in all.
    pub restored: u64,
    pub removed: u64,
    /// Files and symlinks that are not as they were at `to_seq` after the rewind: the log has
    /// no contents for them (over `limits.max_blob_bytes`, past a scan budget), or they could
    /// not be written or removed, or a process changed them meanwhile. The `file.*` events
    /// after this one record each as it really is.
    pub unrestorable: Vec<String>,
    /// Background processes started after `to_seq`, stopped by the rewind.
    pub processes_stopped: Vec<String>,
}

/// The payload of a `files.changed` event: the file changes of one call beyond the first
/// `limits.max_file_events_per_call` (which are `file.*` events of their own), counted, with
/// every one of them in a manifest blob so that the log still holds each path, hash and content
/// blob needed to rebuild the workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FilesChanged {
    /// Changes summed up here (not counting the individual `file.*` events before it).
    pub changes: u64,
    pub created: u64,
    pub modified: u64,
    pub deleted: u64,
    /// Sum of `after_size` of the changes: bytes of the files as they are now.
    pub after_bytes: u64,
    /// Sum of `before_size`: bytes the changes replaced or removed.
    pub before_bytes: u64,
    /// The blob listing the changes: gzip-compressed JSON Lines, one [`FileChange`] per line
    /// (exactly the payload a `file.*` event would have had), in the order they were found.
    pub manifest_sha256: String,
    /// Size of the blob (compressed).
    pub manifest_bytes: u64,
    /// `jsonl+gzip`.
    pub manifest_format: String,
}

/// What a `web.exchange` was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExchangeRole {
    /// One hop of `web_fetch`'s GET of a page (a redirect, or the page itself).
    Page,
    /// `web_search`'s request to the operator's search provider.
    Search,
    /// `web_fetch`'s question (`prompt`) to the operator's summarizer model.
    Summary,
    /// A call of an operation of an operator's HTTP API (`[[tools.openapi]]`): the request's
    /// method and URL (never its `Authorization` header) and the response.
    Api,
    /// A `tools/call` forwarded to an operator's upstream MCP server (`[[tools.mcp]]`): the
    /// upstream's `CallToolResult` as JSON is the body.
    Mcp,
}

/// Why an exchange brought no usable response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExchangeErrorKind {
    /// The network policy refused the destination (at the URL or at the dial): the call was
    /// `denied`.
    Refused,
    /// The time limit passed before the exchange ended.
    TimedOut,
    /// Anything else: a connection or TLS failure, a broken body, a redirect loop, an answer
    /// that could not be used.
    Failed,
    /// Never sent: the tenant's share of the operator's paid services
    /// (`web.paid_calls_per_minute`) was used up.
    Quota,
}

/// How an exchange failed, in the words its call's result used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExchangeError {
    pub kind: ExchangeErrorKind,
    /// The sentence the model was told (never a refused address).
    pub message: String,
}

/// The payload of a `web.exchange` event: one request a web tool made to the outside world and
/// what came back. A fetch that follows redirects records one per hop, in order (`hop` 0, 1,
/// …); the last one of a call holds its outcome: the body, or the `error`. Recorded as a side
/// effect of the invocation, so that a verify replay serves the same observation (the same
/// bytes, status and headers) without going to the network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WebExchange {
    pub role: ExchangeRole,
    /// The exchange's place among its call's exchanges of the same role, from 0.
    pub hop: u32,
    /// `GET` or `POST` (any method for `api`; `tools/call` for `mcp`).
    pub method: String,
    /// The URL asked for: the page (or redirect target) for `page`, the provider's endpoint
    /// with the query for `search` (keys are never in URLs); absent for `summary` (the
    /// operator's endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The search provider (`brave`, `tavily`, `searxng`) or the summarizer's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The response's status; absent when none came (see `error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The response headers that say what the body is and where it came from
    /// (`content-type`, `content-length`, `content-encoding`, `location`, `last-modified`,
    /// `etag`, `date`), lower-case names; values that are not printable ASCII are left out.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub headers: std::collections::BTreeMap<String, String>,
    /// SHA-256 and length of the body as read (decoded, at most the tool's body cap); absent
    /// for a redirect's body, which is never read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_bytes: Option<u64>,
    /// The body went on past the cap, and the rest was not read.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub body_truncated: bool,
    /// Whether the body is stored as a blob (it is unless over `limits.max_blob_bytes`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub body_stored: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ExchangeError>,
    pub duration_ms: f64,
    /// Set in a replay: the recorded invocation this observation was served from (no network
    /// was used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_from: Option<Uuid>,
}

/// The recorded execution of one call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Invocation {
    pub id: Uuid,
    pub session_id: Uuid,
    pub call_id: String,
    pub name: String,
    #[schema(value_type = Object)]
    pub arguments: serde_json::Value,
    /// SHA-256 of the canonical JSON of the arguments as sent: the call's identity for retries.
    pub arguments_sha256: String,
    pub status: InvocationStatus,
    pub is_error: bool,
    /// What the model was shown (possibly truncated). `None` while running.
    pub content: Option<String>,
    pub truncated: Option<Truncation>,
    /// Length of the full output in characters.
    pub output_chars: Option<i64>,
    pub read_only: bool,
    /// The capabilities the tool declared, recorded at the time of the call.
    pub capabilities: Vec<Capability>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub duration_ms: Option<f64>,
    pub started_seq: i64,
    pub finished_seq: Option<i64>,
    /// Side-effect events (files created, modified, deleted, processes, plan changes) in log
    /// order: one page of them (`GET /v1/invocations/{id}?after=SEQ&limit=N`, at most 1,000).
    #[serde(default)]
    pub side_effects: Vec<Event>,
    /// How many side-effect events the invocation has in all.
    #[serde(default)]
    pub side_effects_total: u64,
    /// Pass as `after` to get the next page of side effects; `null` when this page reaches the
    /// last one.
    #[serde(default)]
    pub side_effects_next_after: Option<i64>,
}
