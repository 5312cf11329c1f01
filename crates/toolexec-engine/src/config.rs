//! What the operator decides for the engine: where workspaces live, ceilings sessions cannot
//! exceed, and how the recorder batches.
use std::path::PathBuf;

/// Default of [`Limits::tool_timeout_ms`]: one minute.
pub const DEFAULT_TOOL_TIMEOUT_MS: u64 = 60_000;

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
    /// Memory one session's call index may take on the node serving it (bytes). The index
    /// tells a new call id from a possible retry without a store read (a Bloom filter, ~2.5
    /// bytes per call, 1 % of new calls checked against the store); a session too long for it
    /// keeps this much, and more of its new calls are checked against the store.
    pub call_index_max_bytes: usize,
    /// Most sessions whose runtime (workspace descriptor, inotify instance, process table,
    /// read-state) a node keeps at once; the least recently used idle ones are dropped beyond it
    /// (and rebuilt on their next call, with their read-state forgotten). The service lowers it
    /// further to what its open-file limit allows (see docs/operator.md).
    pub max_cached_sessions: usize,
    /// Longest a call may wait for a person's approval (a session's
    /// `policy.approval.timeout_ms`), milliseconds; default one day.
    pub max_approval_wait_ms: u64,
    /// Most calls of one session that may wait for approval at once; a gated call beyond it
    /// is recorded `denied` without asking, saying why. Bounds what one session's waiting
    /// calls hold (rows, timers).
    pub max_waiting_approvals_per_session: u64,
    /// Longest a request waits for its batch of calls, milliseconds. A batch that runs longer
    /// goes on: the request is answered 503 `still_running`, and the same calls sent again
    /// (same ids) return their results as they are recorded. Bounds how long one request holds a
    /// connection, whatever its calls do.
    pub request_timeout_ms: u64,
    // --- which node runs a session's calls (docs/design.md, "One node at a time") ---
    /// How long a node's lease of a session lasts without its heartbeat renewing it
    /// (milliseconds): how long the session waits after its node died before another node may
    /// take it.
    pub lease_ttl_ms: u64,
    /// How long a node keeps the lease of a session it no longer uses (milliseconds): calls of
    /// an agent loop close together pay no round trip for it; another node waits this long for
    /// an idle session.
    pub lease_linger_ms: u64,
    /// How long a call waits for the lease of its session held by another node before it is
    /// answered 503 (milliseconds).
    pub lease_wait_ms: u64,
    // --- sessions and descriptors ---
    /// Most open (active) sessions one tenant may hold; creating another is a 409
    /// `too_many_open_sessions` that says to close some. Bounds what one tenant's sessions pin
    /// on a node (workspaces, descriptors, runtimes).
    pub max_open_sessions_per_tenant: u64,
    /// Commands (foreground and background) one tenant's sessions may run at once on this
    /// node; `0`: no limit. Past it a `shell` call fails at once with a result that says to
    /// wait or stop a background process. Bounds the processes, cgroups and memory one tenant
    /// holds on a node (each command's own tree is bounded by the sandbox's `pids.max`).
    pub max_processes_per_tenant: usize,
    /// Each session's disk quota (bytes): its workspace becomes a filesystem of this size of
    /// its own (an ext4 image on a loop device, made when the session is), so a write past it
    /// fails as it happens, from a command or a file tool. `0`: off (a session is bounded only
    /// by `RLIMIT_FSIZE` per file). Needs the service to run as root with `mkfs.ext4`, `mount`
    /// and loop devices; set and not enforceable, the service does not start. See
    /// docs/security.md.
    pub session_disk_bytes: u64,
    /// Workspace disk one tenant may hold across its open sessions (bytes), each open session
    /// reserving `session_disk_bytes`; `0`: no limit. Past it `POST /v1/sessions` (and a fork)
    /// is a 409 `too_many_open_sessions` that names this limit. Only with `session_disk_bytes`.
    pub tenant_disk_bytes: u64,
    // --- archives (PUT/GET /v1/sessions/{id}/archive) ---
    /// Largest archive upload (the request body, compressed or not), bytes; past it 413
    /// `archive_too_large` and nothing is written.
    pub max_archive_bytes: u64,
    /// Most entries (files, symlinks, directories) one archive may hold; past it 422
    /// `invalid_archive`.
    pub max_archive_files: u64,
    /// Most bytes one archive may unpack to (file contents, long names and pax records),
    /// counted on each header before the bytes it announces are inflated: a gzip bomb stops at
    /// its first header past it. Past it 422 `invalid_archive`.
    pub max_archive_unpacked_bytes: u64,
    /// Archive uploads and downloads one tenant may have under way on this node at once (429
    /// `too_many_concurrent` beyond): each holds a request slot and spool space while it lasts.
    pub max_archive_transfers_per_tenant: usize,
    /// Archive uploads this node takes at once, all tenants together; one more is answered
    /// 503 `overloaded` with a `Retry-After`, its body unread. Each holds a spool of up to
    /// `max_archive_bytes` on disk and one core while it inflates.
    pub max_concurrent_archive_uploads: usize,
    // --- workspace scans ---
    /// Contents of changed files one workspace scan keeps for the log, in total (bytes). Past
    /// it a file is recorded by hash and size (`after_unstored: "content_budget"`), smaller
    /// files taking the place of larger ones. Bounds the service memory a command's output
    /// files cost.
    pub scan_content_budget_bytes: u64,
    /// Contents of changed files that all the workspace scans of this node keep at once, from
    /// the scan until the call's record is committed (bytes). A scan gets what is left of it,
    /// up to `scan_content_budget_bytes`; with nothing left its files are recorded by hash and
    /// size (`after_unstored: "content_budget"`). Bounds the service memory that concurrent
    /// sessions' commands cost together, not only one at a time.
    pub node_content_budget_bytes: u64,
    /// Bytes one workspace scan hashes, in total. Past it a changed file is recorded by its
    /// metadata only, without a hash (`after_unstored: "hash_budget"`). Bounds the service CPU
    /// a command's files cost (sparse files included).
    pub scan_hash_budget_bytes: u64,
    /// How long one workspace scan may hash (milliseconds); then the files not hashed yet are
    /// recorded by metadata only (`after_unstored: "time_budget"`). The scan's time is part of
    /// the call's recorded duration.
    pub scan_time_budget_ms: u64,
    /// Inotify instances the service holds for workspace scans (one per session that ran a
    /// command); unset: half of `fs.inotify.max_user_instances` at start-up. Sessions beyond
    /// it walk their workspace at every scan.
    pub max_inotify_instances: Option<usize>,
    /// Inotify watches the service holds (one per directory of those workspaces); unset: half
    /// of `fs.inotify.max_user_watches` at start-up.
    pub max_inotify_watches: Option<usize>,
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
    /// Bytes of file text (numbered lines) one `read_file` or `read_many_files` call returns;
    /// past it the model is told where to continue (`read_file` with `offset`) and which files
    /// were not read. Bounds what one small request can make the service hold and record.
    pub max_read_bytes_per_call: usize,
    /// Largest full output (bytes) kept for `read_output` when a result is truncated; a longer
    /// one is stored as its head and tail with a marker saying how much was dropped.
    pub max_stored_output_bytes: usize,
    /// File changes of one call recorded as individual `file.*` events; the rest are summed up
    /// in one `files.changed` event whose manifest blob lists every one of them.
    pub max_file_events_per_call: usize,
    // --- time and walks ---
    /// Wall-clock time one call of a tool may run (milliseconds), for every tool that does not
    /// run commands (`shell` and the process tools keep their own time limits). Past it the
    /// call ends `timed_out` with what it had so far (a search's partial results); a change
    /// already under way is finished, one not yet begun is not made.
    pub tool_timeout_ms: u64,
    /// Directory entries one grep, glob or list_dir call may read; then it stops and says its
    /// result is partial and how to narrow it. Bounds the time and memory of a walk over a
    /// workspace full of generated files.
    pub max_walk_entries: usize,
    /// Terminals (`exec_command` programs) a session may have open at once; past it
    /// `exec_command` is refused with a message saying so (Codex keeps 64 and silently ends the
    /// least recently used one instead).
    pub max_terminals_per_session: usize,
    /// A terminal no call touched for this long (milliseconds) is killed; its end is recorded.
    pub terminal_idle_timeout_ms: u64,
    // --- time travel ---
    /// Files and symlinks a state rebuilt from the log may hold (a tree, a file, a fork, a
    /// rewind, a replay); a larger one is refused (409 `state_too_large`). Bounds the memory of
    /// one rebuild (~250 bytes an entry).
    pub max_state_entries: usize,
    /// States this node rebuilds from logs at once; more wait (up to `lease_wait_ms`, then 503).
    pub max_concurrent_folds: usize,
    /// Event streams one tenant may follow on this node at once (429 `too_many_concurrent`).
    pub max_streams_per_tenant: usize,
    // --- reading the record: bounded in bytes (docs/operator.md, "Pages and streams") ---
    /// Most bytes of one page of `GET /v1/sessions/{id}/events` and of `GET /v1/sessions`
    /// (the JSON the service sends, and what it holds to send it). A page ends early, with
    /// its cursor, where the next event would take it over; an event (a session) larger than
    /// the page alone is shown truncated, with the path that serves it whole. At least 128 KiB
    /// (smaller values count as 128 KiB).
    pub page_bytes: u64,
    /// Most bytes of events one event stream (`GET …/events/stream`) holds for its client,
    /// and that the node keeps of a streamed session's live log. A client that falls further
    /// behind is cut off with `stream.overflow` and resumes from its cursor; an event larger
    /// than this is sent truncated, with the path that serves it whole. At least 128 KiB.
    pub stream_buffer_bytes: u64,
    /// Event streams this node serves at once, all tenants together (each holds up to about
    /// three times `stream_buffer_bytes`); beyond it 503 `unavailable`. A wait for an
    /// invocation (`GET /v1/invocations/{id}?wait=`) counts as one.
    pub max_streams_per_node: usize,
    /// Replays one tenant may run on this node at once (429 `too_many_concurrent`).
    pub max_replays_per_tenant: usize,
    // --- environments (OCI images) ---
    /// The most one image may be: its blobs as downloaded, and again its files unpacked
    /// (sizes counted at each header, before the bytes are inflated).
    pub max_image_bytes: u64,
    /// Tar entries one image's layers may hold in all: bounds its inodes and unpacking time.
    pub max_image_entries: u64,
    /// Longest one image pull may take, download and unpacking, in milliseconds.
    pub image_pull_timeout_ms: u64,
    /// Pulls one tenant may have under way on this node at once through
    /// `POST /v1/environments` (429 `too_many_concurrent` past it). A pull holds its slot until
    /// it ends, also after the client that asked for it went away (docs/environments.md).
    pub max_pulls_per_tenant: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_calls_per_batch: 64,
            max_output_chars: 200_000,
            max_timeout_ms: 600_000,
            max_approval_wait_ms: 24 * 60 * 60 * 1000,
            max_waiting_approvals_per_session: 32,
            max_blob_bytes: 10 * 1024 * 1024,
            max_seed_files: 1_000,
            // A million calls at a 1 % false-positive rate (~3.1 MB); ~1.4 KB for a session's
            // first thousand.
            call_index_max_bytes: 4 * 1024 * 1024,
            max_cached_sessions: 10_000,
            request_timeout_ms: 900_000,
            lease_ttl_ms: 10_000,
            lease_linger_ms: 500,
            lease_wait_ms: 30_000,
            // --- sessions and descriptors ---
            max_open_sessions_per_tenant: 1_000,
            // Far above what an agent loop runs at once; a tenant's fork-bomb of sessions
            // stops here.
            max_processes_per_tenant: 256,
            session_disk_bytes: 0,
            tenant_disk_bytes: 0,
            // --- archives ---
            // A large repository's source tree, compressed.
            max_archive_bytes: 1024 * 1024 * 1024,
            // Twice the files of the Linux kernel's tree.
            max_archive_files: 200_000,
            max_image_bytes: 8 * 1024 * 1024 * 1024,
            max_image_entries: 1_000_000,
            image_pull_timeout_ms: 30 * 60 * 1000,
            max_archive_unpacked_bytes: 4 * 1024 * 1024 * 1024,
            max_archive_transfers_per_tenant: 4,
            // Twice the cores of a small node: uploads are CPU-bound while they inflate.
            max_concurrent_archive_uploads: 8,
            // --- workspace scans ---
            // Six files at the 10 MiB blob limit, or every source file of a large repository;
            // small beside the session's 1 GiB memory limit (the store copies it once more).
            scan_content_budget_bytes: 64 * 1024 * 1024,
            // Four scans at their full budget at once.
            node_content_budget_bytes: 256 * 1024 * 1024,
            // About 1.7 s of one core for SHA-256 on the reference VM (docs/benchmarks.md).
            scan_hash_budget_bytes: 1024 * 1024 * 1024,
            // Past the hash budget's time on the reference VM; stops slow storage.
            scan_time_budget_ms: 5_000,
            max_inotify_instances: None,
            max_inotify_watches: None,
            // --- the store ---
            max_blob_bytes_per_call: 128 * 1024 * 1024,
            blob_bytes_per_statement: toolexec_store::check::DEFAULT_BLOB_STATEMENT_BYTES,
            // --- tool outputs and side effects ---
            max_read_bytes_per_call: toolexec_tools::DEFAULT_MAX_READ_BYTES,
            max_stored_output_bytes: 4 * 1024 * 1024,
            max_file_events_per_call: 1_000,
            // --- time and walks ---
            // Far beyond what a search of a large repository takes (seconds), short enough
            // that a call stuck on a costly pattern or a huge tree answers within a minute.
            tool_timeout_ms: DEFAULT_TOOL_TIMEOUT_MS,
            max_walk_entries: toolexec_tools::DEFAULT_MAX_WALK_ENTRIES,
            max_terminals_per_session: 16,
            terminal_idle_timeout_ms: 30 * 60 * 1000,
            // --- time travel ---
            // Twice the Linux kernel's files; ~50 MB of memory for the largest state.
            max_state_entries: 200_000,
            // Four of the largest states at once: ~200 MB.
            max_concurrent_folds: 4,
            max_streams_per_tenant: 64,
            // Four pages of 1,000 small events, or eight of a file of 512 KiB recorded whole.
            page_bytes: 4 * 1024 * 1024,
            // Hundreds of ordinary events; a file of 500 KB written by a call still whole.
            stream_buffer_bytes: 512 * 1024,
            // At 512 KiB buffers, at most ~400 MB for streams whose clients all stall.
            max_streams_per_node: 256,
            max_replays_per_tenant: 4,
            // Two pulls of the largest image at the default limits are 16 GiB of downloads
            // under way for one tenant: enough to pre-pull while another image lands.
            max_pulls_per_tenant: 2,
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
    /// Concurrent group-commit loops. One by default: with one commit in flight the next batch
    /// fills while it commits, and batches are about twice as large as with two, which cut
    /// Postgres's CPU per recorded call by a third (docs/benchmarks.md); two commits of one
    /// session also wait for each other's row lock and then miss the store's one-statement path.
    pub recorder_writers: usize,
    /// Record `invocation.started` durably before read-only tools run too (two writes per call
    /// instead of one). Off by default: a read-only tool has no side effect to guard, and its
    /// result is returned only once recorded either way. For audits that must see every
    /// attempt, even one the service crashed during.
    pub durable_start_for_read_only: bool,
    /// Where `shell` and the process tools run commands; `None`: they answer that commands
    /// cannot run here.
    pub sandbox: Option<std::sync::Arc<toolexec_sandbox::Sandbox>>,
    /// The images sessions may run in (`[environments]`) and their cache; `None`: no
    /// environment is configured and every session sees the host's `/usr` and `/etc`.
    pub environments: Option<std::sync::Arc<crate::environments::Environments>>,
    /// What the web tools may reach (the network policy, the resolver) and `web_fetch`'s
    /// summarizer. Tests put a `StaticResolver` here: the rest of the path is production's.
    pub web: std::sync::Arc<toolexec_tools::web::WebAccess>,
    /// How this node works with the other replicas of the service (`[cluster]`).
    pub cluster: ClusterConfig,
}

/// How a node works with the other replicas that share its store.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// The URL the other replicas reach this node at (`http://toolexec-0.toolexec-headless:8080`):
    /// requests for a session that lives here are forwarded to it. Unset: this node takes no
    /// forwarded requests, and one that gets a request for a session living on another node
    /// waits for that node's lease (workspaces on shared storage) instead of forwarding it.
    pub advertise_url: Option<String>,
    /// Workspaces are on storage every replica mounts at the same path: a node that takes a
    /// session over uses its workspace as it is instead of rebuilding it from the log.
    pub shared_workspaces: bool,
}

impl EngineConfig {
    pub fn new(node: impl Into<String>, workspace_root: impl Into<PathBuf>) -> Self {
        Self {
            node: node.into(),
            workspace_root: workspace_root.into(),
            limits: Limits::default(),
            recorder_writers: 1,
            durable_start_for_read_only: false,
            sandbox: None,
            environments: None,
            web: std::sync::Arc::new(toolexec_tools::web::WebAccess::default()),
            cluster: ClusterConfig::default(),
        }
    }
}
