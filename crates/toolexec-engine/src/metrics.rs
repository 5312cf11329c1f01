//! Prometheus metrics of the service: HTTP requests by route template and status, calls by tool
//! and status, call latency, and the recorder's commit latency and batch sizes. Rendered as
//! Prometheus text at `GET /metrics`.
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub tool: String,
    pub status: String,
}

/// An HTTP request as counted: its route as a template (`/v1/sessions/{id}/calls`, never the
/// raw path: one series per route, not per session), its method and its response's status.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub route: String,
    pub status: String,
}

/// An HTTP request's route and method, for its latency (the status is left out of the
/// histogram: route x method x status x buckets would multiply the series for little).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub method: String,
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabel {
    pub tool: String,
}

pub struct Metrics {
    registry: Mutex<Registry>,
    calls: Family<CallLabels, Counter>,
    call_seconds: Family<ToolLabel, Histogram>,
    commit_seconds: Histogram,
    commit_batch: Histogram,
    scan_seconds: Histogram,
    scans: Family<ScanLabel, Counter>,
    sessions_evicted: Counter,
    blob_statement_bytes: Histogram,
    writes_refused: Counter,
    call_index: Family<AnswerLabel, Counter>,
    http_requests: Family<HttpLabels, Counter>,
    http_seconds: Family<RouteLabels, Histogram>,
    sessions_created: Counter,
    sessions_cached: Gauge,
    takeovers: Counter,
    takeover_seconds: Histogram,
    image_pulls: Counter,
    image_cache_hits: Counter,
    image_pull_seconds: Histogram,
    image_cache_bytes: Gauge,
}

/// What a session's call index answered for a call id about to run (`crate::callindex`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct AnswerLabel {
    pub answer: &'static str,
}

/// How a workspace scan found its changes: `events` (inotify) or why it walked the tree.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ScanLabel {
    pub mode: String,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

fn latency_histogram() -> Histogram {
    // 50 µs … ~26 s: from a cached read to a long build step.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 20))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("toolexec");
        let calls = Family::<CallLabels, Counter>::default();
        let call_seconds = Family::<ToolLabel, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        let commit_seconds = latency_histogram();
        let commit_batch = Histogram::new(exponential_buckets(1.0, 2.0, 10));
        let scan_seconds = latency_histogram();
        let scans = Family::<ScanLabel, Counter>::default();
        let sessions_evicted = Counter::default();
        registry.register(
            "session_runtimes_evicted",
            "Idle sessions whose runtime (workspace handle, inotify instance, read-state) was dropped to stay within limits.max_cached_sessions",
            sessions_evicted.clone(),
        );
        registry.register(
            "workspace_scans",
            "Workspace scans by mode: events (inotify, no walk) or the reason for a full walk",
            scans.clone(),
        );
        registry.register(
            "workspace_scan_duration_seconds",
            "Time to find a mutating call's file changes by scanning the workspace",
            scan_seconds.clone(),
        );
        registry.register("calls", "Tool calls run, by tool and status", calls.clone());
        registry.register(
            "call_duration_seconds",
            "Time from a call's start to its recorded result",
            call_seconds.clone(),
        );
        registry.register(
            "store_commit_duration_seconds",
            "Latency of one group commit (one transaction) to the store",
            commit_seconds.clone(),
        );
        registry.register(
            "store_commit_batch_size",
            "Writes per group commit",
            commit_batch.clone(),
        );
        // 64 KiB … 1 GiB: every bound an operator may set falls on a bucket edge.
        let blob_statement_bytes = Histogram::new(exponential_buckets(65_536.0, 2.0, 15));
        registry.register(
            "store_blob_statement_bytes",
            "Blob contents sent in one statement, outside the group commit (bounded by limits.blob_bytes_per_statement)",
            blob_statement_bytes.clone(),
        );
        let writes_refused = Counter::default();
        registry.register(
            "store_writes_refused",
            "Writes the store cannot hold, answered alone (the call is recorded as failed instead)",
            writes_refused.clone(),
        );
        let call_index = Family::<AnswerLabel, Counter>::default();
        registry.register(
            "call_index_answers",
            "Call ids checked against a session's call index before running: new (no store read), recorded (a retry, read from the store) or not_recorded (a false positive of the filter, or an index still loading: one store read for nothing)",
            call_index.clone(),
        );
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by method, route template and status code",
            http_requests.clone(),
        );
        let http_seconds = Family::<RouteLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "http_request_duration_seconds",
            "Time from a request's arrival to its response's head, by method and route template (a stream's body is not counted)",
            http_seconds.clone(),
        );
        let sessions_created = Counter::default();
        registry.register(
            "sessions_created",
            "Sessions created on this node",
            sessions_created.clone(),
        );
        let sessions_cached = Gauge::default();
        registry.register(
            "sessions_cached",
            "Sessions whose runtime (workspace handle, resident sandbox, read-state) this node keeps now (at most limits.max_cached_sessions)",
            sessions_cached.clone(),
        );
        let takeovers = Counter::default();
        registry.register(
            "session_takeovers",
            "Sessions this node took over from a replica that was gone or handed them over",
            takeovers.clone(),
        );
        let takeover_seconds = latency_histogram();
        registry.register(
            "session_takeover_duration_seconds",
            "Time to take a session over: interrupting its calls, rebuilding its workspace from the log, recording session.taken_over",
            takeover_seconds.clone(),
        );
        let image_pulls = Counter::default();
        registry.register(
            "image_pulls",
            "Images a session asked for that were not in this node's cache: pulled (or waited for while another request pulled them)",
            image_pulls.clone(),
        );
        let image_cache_hits = Counter::default();
        registry.register(
            "image_cache_hits",
            "Images a session asked for that were in this node's cache already",
            image_cache_hits.clone(),
        );
        let image_pull_seconds = latency_histogram();
        registry.register(
            "image_pull_duration_seconds",
            "Time to pull and unpack an image a session asked for",
            image_pull_seconds.clone(),
        );
        let image_cache_bytes = Gauge::default();
        registry.register(
            "image_cache_bytes",
            "Bytes of the images unpacked in this node's cache (set after each pull)",
            image_cache_bytes.clone(),
        );
        Self {
            image_pulls,
            image_cache_hits,
            image_pull_seconds,
            image_cache_bytes,
            sessions_created,
            sessions_cached,
            takeovers,
            takeover_seconds,
            http_requests,
            http_seconds,
            call_index,
            registry: Mutex::new(registry),
            blob_statement_bytes,
            writes_refused,
            calls,
            call_seconds,
            commit_seconds,
            commit_batch,
            scan_seconds,
            scans,
            sessions_evicted,
        }
    }
}

impl Metrics {
    pub fn call(&self, tool: &str, status: &str, seconds: f64) {
        self.calls
            .get_or_create(&CallLabels {
                tool: tool.to_owned(),
                status: status.to_owned(),
            })
            .inc();
        self.call_seconds
            .get_or_create(&ToolLabel {
                tool: tool.to_owned(),
            })
            .observe(seconds);
    }

    /// One HTTP request answered. `route` must be a template (or a fixed word for requests that
    /// matched none), so that the label's values stay bounded.
    pub fn http_request(&self, method: &str, route: &str, status: u16, seconds: f64) {
        self.http_requests
            .get_or_create(&HttpLabels {
                method: method.to_owned(),
                route: route.to_owned(),
                status: status.to_string(),
            })
            .inc();
        self.http_seconds
            .get_or_create(&RouteLabels {
                method: method.to_owned(),
                route: route.to_owned(),
            })
            .observe(seconds);
    }

    pub fn session_created(&self) {
        self.sessions_created.inc();
    }

    /// An image a session asked for: from the cache, or pulled in `seconds`.
    pub fn image_resolved(&self, cached: bool, seconds: f64) {
        if cached {
            self.image_cache_hits.inc();
        } else {
            self.image_pulls.inc();
            self.image_pull_seconds.observe(seconds);
        }
    }

    /// Bytes of the images unpacked in the cache.
    pub fn image_cache_bytes(&self, bytes: u64) {
        self.image_cache_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    pub fn session_taken_over(&self, seconds: f64) {
        self.takeovers.inc();
        self.takeover_seconds.observe(seconds);
    }

    /// Sessions whose runtime this node keeps (set when the metrics are rendered).
    pub fn sessions_cached(&self, n: usize) {
        self.sessions_cached
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn commit(&self, batch: usize, seconds: f64) {
        self.commit_seconds.observe(seconds);
        self.commit_batch.observe(batch as f64);
    }

    pub fn blob_statement(&self, bytes: usize) {
        self.blob_statement_bytes.observe(bytes as f64);
    }

    pub fn write_refused(&self) {
        self.writes_refused.inc();
    }

    pub fn workspace_scan(&self, mode: &str, seconds: f64) {
        self.scan_seconds.observe(seconds);
        self.scans
            .get_or_create(&ScanLabel {
                mode: mode.to_owned(),
            })
            .inc();
    }

    /// Call ids the index answered: `new` without a store read; `recorded` and `not_recorded`
    /// after one.
    pub fn call_index_answers(&self, new: u64, recorded: u64, not_recorded: u64) {
        for (answer, n) in [
            ("new", new),
            ("recorded", recorded),
            ("not_recorded", not_recorded),
        ] {
            if n > 0 {
                self.call_index
                    .get_or_create(&AnswerLabel { answer })
                    .inc_by(n);
            }
        }
    }

    pub fn sessions_evicted(&self, n: u64) {
        self.sessions_evicted.inc_by(n);
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Ok(registry) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        }
        out
    }
}
