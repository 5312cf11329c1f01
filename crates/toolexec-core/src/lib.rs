//! The domain of toolexec: what a tool is, what a call and its result look like, what gets
//! recorded (invocations, events, side effects) and how output is truncated for the model.
//!
//! This crate owns vocabulary only. It must not know about HTTP, SQL or the filesystem, so that
//! every other crate can depend on it without dragging those in.
#![forbid(unsafe_code)]

pub mod call;
pub mod event;
pub mod excerpt;
pub mod hash;
pub mod history;
pub mod json;
pub mod names;
pub mod problem;
pub mod replay;
pub mod session;
pub mod todo;
pub mod tool;
pub mod truncate;

pub use call::{Call, CallResult, CallStatus, InvocationStatus};
pub use event::{
    Event, EventKind, ExchangeError, ExchangeErrorKind, ExchangeRole, FileChange, FileChangeKind,
    FileRead, FilesChanged, Invocation, Rewound, UnstoredReason, WebExchange,
};
pub use excerpt::Truncated;
pub use hash::{Sha256Hex, sha256_hex};
pub use history::{
    ForkRequest, Forked, RewindRequest, RewindResult, Tree, TreeEntry, TreeEntryKind,
};
pub use problem::ProblemCode;
pub use replay::{Aspect, Divergence, Replay, ReplayMode, ReplayStatus, ReplayedCall};
pub use session::{
    ApprovalPolicy, DEFAULT_APPROVAL_TIMEOUT_MS, EnvironmentRequest, NetworkPolicy, NewSession,
    Origin, OriginKind, Policy, Session, SessionEnvironment, SessionStatus, Tenant,
};
pub use tool::{Capability, OutputLimit, ToolSpec, TruncationMode};
pub use truncate::{Truncation, truncate};

/// A fresh, time-ordered id (UUID v7), so that ids sort by creation time in indexes and logs.
pub fn new_id() -> uuid::Uuid {
    uuid::Uuid::now_v7()
}
