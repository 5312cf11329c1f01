//! What the operator decides for the engine: where workspaces live, ceilings sessions cannot
//! exceed, and how the recorder batches.
use std::path::PathBuf;

/// Operator ceilings and budgets (`[limits]` in the config file). A session's policy may only
/// tighten these. Every budget says, where it is enforced, what the model is told when it is hit.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Most calls accepted in one batch: bounds the work one request can queue.
    pub max_calls_per_batch: usize,
    /// Largest per-tool output limit a session may ask for, in characters.
    pub max_output_chars: usize,
    /// Longest default timeout a session may set, in milliseconds (SPEC: shell caps at 600 s).
    pub max_timeout_ms: u64,
    /// File contents larger than this (bytes) are recorded by hash only, not stored as a blob.
    pub max_blob_bytes: usize,
    /// Most seed files in `POST /v1/sessions`.
    pub max_seed_files: usize,
    // --- sessions and descriptors ---
    /// Most open (active) sessions one tenant may hold; creating another is a 409
    /// `too_many_open_sessions` that says to close some. Bounds what one tenant's sessions pin
    /// on a node (workspaces, descriptors, runtimes).
    pub max_open_sessions_per_tenant: u64,
    // --- workspace scans ---
    // --- the store ---
    /// Most bytes of file contents (and full outputs) one call stores as blobs. Beyond it, files
    /// are recorded by hash and size only (`after_stored: false`, `after_unstored:
    /// "call_budget"`), so one call cannot grow the database by more than this.
    pub max_blob_bytes_per_call: usize,
    /// Most bytes of blob contents one statement carries to the store. Bigger change sets are
    /// written in several statements, outside the group commit: no statement nears Postgres's
    /// 1 GiB message limit, and one call's contents never hold up other sessions' commits.
    pub blob_bytes_per_statement: usize,
    // --- tool outputs and side effects ---
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_calls_per_batch: 64,
            max_output_chars: 200_000,
            max_timeout_ms: 600_000,
            max_blob_bytes: 10 * 1024 * 1024,
            max_seed_files: 1_000,
            // --- sessions and descriptors ---
            max_open_sessions_per_tenant: 1_000,
            // --- workspace scans ---
            // --- the store ---
            max_blob_bytes_per_call: 128 * 1024 * 1024,
            blob_bytes_per_statement: toolexec_store::check::DEFAULT_BLOB_STATEMENT_BYTES,
            // --- tool outputs and side effects ---
        }
    }
}

#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// This instance's name; it marks the invocations it runs so that at start-up it interrupts
    /// only its own leftovers, never another replica's running calls.
    pub node: String,
    /// Parent directory of the session workspaces (`<root>/<session id>`).
    pub workspace_root: PathBuf,
    pub limits: Limits,
    /// Concurrent group-commit loops. Two keep one transaction filling while another commits.
    pub recorder_writers: usize,
    /// Record `invocation.started` durably before read-only tools run too (two writes per call
    /// instead of one). Off by default: a read-only tool has no side effect to guard, and its
    /// result is returned only once recorded either way. For audits that must see every
    /// attempt, even one the service crashed during.
    pub durable_start_for_read_only: bool,
    /// Where `shell` and the process tools run commands; `None`: they answer that commands
    /// cannot run here.
    pub sandbox: Option<std::sync::Arc<toolexec_sandbox::Sandbox>>,
}

impl EngineConfig {
    pub fn new(node: impl Into<String>, workspace_root: impl Into<PathBuf>) -> Self {
        Self {
            node: node.into(),
            workspace_root: workspace_root.into(),
            limits: Limits::default(),
            recorder_writers: 2,
            durable_start_for_read_only: false,
            sandbox: None,
        }
    }
}
