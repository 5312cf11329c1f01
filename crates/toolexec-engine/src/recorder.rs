//! Group commit: many calls' writes share one transaction — and one write can neither exhaust the
//! service nor sink the writes it shares a commit with.
//!
//! Every caller submits a [`Write`] and awaits its own result. A writer loop (one by default,
//! `recorder_writers`) takes whatever is queued (up to [`MAX_BATCH`]) and commit it in one transaction, so under load one
//! fsync serves dozens of calls, and with no load a write is committed at once (no timer wait).
//!
//! What keeps one write from hurting the others:
//! - **Checked before it is queued**, in the caller's task: a write the store cannot hold
//!   ([`Write::unstorable`]: a NUL in its text, a value over the database's limits) is answered
//!   [`WriteError::Refused`] alone and never joins a commit.
//! - **Big contents go first, on their own**: a write carrying more than [`INLINE_BLOB_BYTES`] of
//!   blobs stores them from the caller's task, in statements bounded by the store
//!   ([`Blobs::put_blobs`]), before it is queued — so a 1 GiB change set never sits in (or holds
//!   up) another session's commit. Blobs are content-addressed: one stored for a write that then
//!   fails is harmless.
//! - **The store's preparation too** ([`Calls::prepare`]): with blobs in object storage, the
//!   check that the bucket answers and the upload of large blobs happen in the caller's task,
//!   so no commit waits for a round trip to the bucket.
//! - **Commits are bounded in bytes** too (the store's statement bound), not only in writes.
//! - **A refused commit is retried apart**: if the store refuses a batch for anything but being
//!   unreachable, its halves are committed separately (recursively), so only the guilty write
//!   fails, with [`WriteError::Refused`]; the others land as if nothing happened.
//!
//! [`Blobs::put_blobs`]: toolexec_store::Blobs::put_blobs
//! [`Calls::prepare`]: toolexec_store::Calls::prepare
use std::sync::Arc;

use tokio::sync::{Mutex, mpsc, oneshot};
use toolexec_store::{Assigned, Blob, Store, StoreError, Write, WriteError};
use tracing::Instrument;

use crate::metrics::Metrics;

/// Most writes in one transaction: large enough to amortise a commit across 32+ concurrent
/// clients, small enough that one transaction stays well under a millisecond of statements.
pub const MAX_BATCH: usize = 256;

/// Queue depth before submitters wait: back-pressure instead of unbounded memory.
const QUEUE_DEPTH: usize = 4096;

/// Blob bytes a write may carry into a group commit (1 MiB; less if the store's statement bound
/// is smaller). Beyond it the contents are stored first, outside the commit: a commit then
/// carries at most [`MAX_BATCH`] small writes' worth, and a big change set costs only its own
/// call the time it takes.
pub const INLINE_BLOB_BYTES: usize = 1024 * 1024;

pub type WriteResult = Result<Result<Assigned, WriteError>, StoreError>;

/// A queued write, its size ([`Write::approx_bytes`], measured in the caller's task), and where
/// its result goes — with the write itself, so that a caller can retry it without a copy.
type Job = (Write, usize, oneshot::Sender<(WriteResult, Write)>);

/// Told the session of every write once it is durable (the live streams of the log).
pub type OnCommit = Arc<dyn Fn(uuid::Uuid) + Send + Sync>;

#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::Sender<Job>,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    on_commit: Option<OnCommit>,
}

impl Recorder {
    pub fn start(store: Arc<dyn Store>, writers: usize, metrics: Arc<Metrics>) -> Self {
        let (tx, rx) = mpsc::channel::<Job>(QUEUE_DEPTH);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..writers.max(1) {
            tokio::spawn(writer_loop(store.clone(), rx.clone(), metrics.clone()));
        }
        Self {
            tx,
            store,
            metrics,
            on_commit: None,
        }
    }

    /// The recorder, telling `on_commit` of each durable write's session.
    pub fn with_on_commit(mut self, on_commit: OnCommit) -> Self {
        self.on_commit = Some(on_commit);
        self
    }

    /// Submits one write and waits until it is durable (or refused).
    pub async fn write(&self, write: Write) -> WriteResult {
        self.write_back(write).await.0
    }

    /// Like [`Recorder::write`], and hands the write back (when the recorder still has it), so
    /// that a caller can retry it or record something in its place without having kept a copy.
    /// Blobs it handed to [`Blobs::put_blobs`] are no longer in it: they are stored.
    ///
    /// [`Blobs::put_blobs`]: toolexec_store::Blobs::put_blobs
    pub async fn write_back(&self, write: Write) -> (WriteResult, Option<Write>) {
        // A span per write waited for (a child of the call that waits): the time from submitting
        // it to its commit, whoever's transaction it rode in.
        let span = tracing::info_span!(
            "store.write",
            otel.name = %format_args!("store.write {}", write.kind()),
            write.kind = write.kind(),
            blob_bytes = write.blob_bytes(),
            outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let (result, back) = self.submit(write).instrument(span.clone()).await;
        match &result {
            Ok(Ok(_)) => span.record("outcome", "committed"),
            Ok(Err(e)) => span.record("outcome", tracing::field::display(e)),
            Err(e) => {
                span.record("otel.status_code", "ERROR");
                span.record("outcome", tracing::field::display(e))
            }
        };
        (result, back)
    }

    async fn submit(&self, mut write: Write) -> (WriteResult, Option<Write>) {
        if let Some(reason) = write.unstorable() {
            self.metrics.write_refused();
            return (Ok(Err(WriteError::Refused(reason))), Some(write));
        }
        // The store's own preparation (object storage: the probe that fails a call closed, the
        // upload of large blobs), here in the caller's task rather than in the commit loop.
        if let Err(e) = self.store.prepare(&mut write).await {
            return (Err(e), Some(write));
        }
        let inline = INLINE_BLOB_BYTES.min(self.store.blob_statement_bytes());
        if write.blob_bytes() > inline {
            let blobs = write.take_blobs();
            if let Err(e) = self.put_blobs(blobs.clone()).await {
                put_back(&mut write, blobs);
                return match e {
                    StoreError::Refused { reason, cause } => {
                        tracing::error!(%cause, "the store refused a write's file contents");
                        self.metrics.write_refused();
                        (Ok(Err(WriteError::Refused(reason))), Some(write))
                    }
                    other => (Err(other), Some(write)),
                };
            }
        }
        let bytes = write.approx_bytes();
        let (done, wait) = oneshot::channel();
        if let Err(mpsc::error::SendError((write, _, _))) = self.tx.send((write, bytes, done)).await
        {
            return (Err(stopped()), Some(write));
        }
        match wait.await {
            Ok((result, write)) => {
                if let (Ok(Ok(_)), Some(on_commit)) = (&result, &self.on_commit) {
                    on_commit(write.session_id());
                }
                (result, Some(write))
            }
            Err(_) => (Err(stopped()), None),
        }
    }

    /// Stores blobs on their own, in statements bounded by the store (each one's size is a
    /// sample of `toolexec_store_blob_statement_bytes`).
    pub async fn put_blobs(&self, blobs: Vec<Blob>) -> Result<(), StoreError> {
        for bytes in self.store.put_blobs(blobs).await? {
            self.metrics.blob_statement(bytes);
        }
        Ok(())
    }
}

fn stopped() -> StoreError {
    StoreError::Unavailable("recorder stopped".into())
}

fn put_back(write: &mut Write, taken: Vec<Blob>) {
    match write {
        Write::Start { .. } => {}
        Write::Finish { blobs, .. } | Write::Record { blobs, .. } => *blobs = taken,
    }
}

async fn writer_loop(
    store: Arc<dyn Store>,
    rx: Arc<Mutex<mpsc::Receiver<Job>>>,
    metrics: Arc<Metrics>,
) {
    let mut jobs: Vec<Job> = Vec::with_capacity(MAX_BATCH);
    loop {
        {
            // Hold the receiver only while collecting, so another loop can collect the next
            // batch while this one commits.
            let mut rx = rx.lock().await;
            if rx.recv_many(&mut jobs, MAX_BATCH).await == 0 {
                return;
            }
        }
        let bound = store.blob_statement_bytes();
        while !jobs.is_empty() {
            // As many queued writes as fit the bound (always at least one).
            let mut take = 0;
            let mut bytes = 0usize;
            while take < jobs.len() && (take == 0 || bytes + jobs[take].1 <= bound) {
                bytes += jobs[take].1;
                take += 1;
            }
            let mut writes = Vec::with_capacity(take);
            let mut waiters = Vec::with_capacity(take);
            for (write, _, waiter) in jobs.drain(..take) {
                writes.push(write);
                waiters.push(waiter);
            }
            let results = commit_apart(store.as_ref(), &metrics, &writes).await;
            for ((waiter, result), write) in waiters.into_iter().zip(results).zip(writes) {
                let _ = waiter.send((result, write));
            }
        }
    }
}

/// Commits `writes` in one transaction; if the store refuses the batch (for anything but being
/// unreachable), commits each half apart, so that only the write that cannot be stored fails.
/// One result per write, in order.
fn commit_apart<'a>(
    store: &'a dyn Store,
    metrics: &'a Metrics,
    writes: &'a [Write],
) -> futures::future::BoxFuture<'a, Vec<WriteResult>> {
    Box::pin(async move {
        let started = std::time::Instant::now();
        match store.commit(writes).await {
            Ok(results) => {
                metrics.commit(writes.len(), started.elapsed().as_secs_f64());
                results.into_iter().map(Ok).collect()
            }
            Err(StoreError::Unavailable(cause)) => {
                tracing::error!(%cause, batch = writes.len(), "group commit failed; nothing of the batch was written");
                writes
                    .iter()
                    .map(|_| Err(StoreError::Unavailable(cause.clone())))
                    .collect()
            }
            Err(e) if writes.len() == 1 => {
                tracing::error!(error = %e, session = %writes[0].session_id(), "the store refused a write");
                metrics.write_refused();
                vec![Ok(Err(WriteError::Refused(plain_reason(e))))]
            }
            Err(e) => {
                tracing::warn!(error = %e, batch = writes.len(), "the store refused a group commit; committing its writes apart to isolate the refused one");
                let (left, right) = writes.split_at(writes.len() / 2);
                let mut results = commit_apart(store, metrics, left).await;
                results.extend(commit_apart(store, metrics, right).await);
                results
            }
        }
    })
}

/// What the model and the client may read of a refusal: plain words, no database internals.
fn plain_reason(e: StoreError) -> String {
    match e {
        StoreError::Refused { reason, .. } => reason,
        _ => "the store failed to record it (the service's log has the cause)".into(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolexec_core::{CallStatus, Policy, Session, SessionStatus, new_id};
    use toolexec_store::prelude::*;
    use toolexec_store::sqlite::SqliteStore;
    use toolexec_store::{NewInvocation, Outcome};
    use uuid::Uuid;

    use super::*;

    fn record(session_id: Uuid, call_id: &str, content: &str) -> Write {
        Write::Record {
            invocation: NewInvocation {
                id: new_id(),
                session_id,
                call_id: call_id.into(),
                name: "read_file".into(),
                arguments: json!({}),
                arguments_sha256: String::new(),
                read_only: true,
                capabilities: vec![],
                node: "n".into(),
                started_at: chrono::Utc::now(),
            },
            outcome: Outcome {
                status: CallStatus::Ok,
                content: content.into(),
                truncated: None,
                output_chars: 0,
                output_sha256: None,
                finished_at: chrono::Utc::now(),
                duration_ms: 0.0,
                reads: Vec::new(),
                structured: None,
            },
            side_effects: vec![],
            blobs: vec![],
        }
    }

    /// Writes committed, counted from the recorder's own metric (`…_batch_size_sum`).
    fn committed(metrics: &Metrics) -> f64 {
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix("toolexec_store_commit_batch_size_sum "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unstorable_write_is_answered_alone_and_never_reaches_a_commit() {
        let store = SqliteStore::memory().await.unwrap();
        store.migrate().await.unwrap();
        let tenant = store.ensure_tenant("t").await.unwrap();
        let session = Session {
            id: new_id(),
            tenant_id: tenant.id,
            status: SessionStatus::Active,
            tools: None,
            policy: Policy::default(),
            env: Default::default(),
            metadata: json!({}),
            created_at: chrono::Utc::now(),
            closed_at: None,
            last_seq: 0,
            origin: None,
            environment: None,
            truncated: None,
        };
        store
            .create_session(&session, vec![], vec![], u64::MAX)
            .await
            .unwrap();
        let metrics = Arc::new(Metrics::default());
        let recorder = Recorder::start(Arc::new(store), 1, metrics.clone());
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..20 {
            let (recorder, sid) = (recorder.clone(), session.id);
            let content = if i == 7 { "bad\0text" } else { "fine" };
            tasks.spawn(async move {
                (
                    i,
                    recorder.write(record(sid, &format!("c{i}"), content)).await,
                )
            });
        }
        while let Some(done) = tasks.join_next().await {
            let (i, result) = done.unwrap();
            match result.unwrap() {
                Err(WriteError::Refused(reason)) => {
                    assert_eq!(i, 7);
                    assert!(
                        reason.starts_with("the output: it contains a NUL"),
                        "{reason}"
                    );
                }
                Ok(_) => assert_ne!(i, 7),
                other => panic!("{i}: {other:?}"),
            }
        }
        assert_eq!(committed(&metrics), 19.0);
        assert!(
            metrics
                .render()
                .contains("toolexec_store_writes_refused_total 1")
        );
    }
}
