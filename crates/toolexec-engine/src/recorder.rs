//! Group commit: many calls' writes share one transaction.
//!
//! Every caller submits a [`Write`] and awaits its own result. A few writer loops each take
//! whatever is queued (up to [`MAX_BATCH`]) and commit it in one transaction, so under load one
//! fsync serves dozens of calls, and with no load a write is committed at once (no timer wait).
use std::sync::Arc;

use tokio::sync::{Mutex, mpsc, oneshot};
use toolexec_store::{Assigned, Store, StoreError, Write, WriteError};

use crate::metrics::Metrics;

/// Most writes in one transaction: large enough to amortise a commit across 32+ concurrent
/// clients, small enough that one transaction stays well under a millisecond of statements.
pub const MAX_BATCH: usize = 256;

/// Queue depth before submitters wait: back-pressure instead of unbounded memory.
const QUEUE_DEPTH: usize = 4096;

pub type WriteResult = Result<Result<Assigned, WriteError>, StoreError>;

type Job = (Write, oneshot::Sender<WriteResult>);

#[derive(Clone)]
pub struct Recorder {
    tx: mpsc::Sender<Job>,
}

impl Recorder {
    pub fn start(store: Arc<dyn Store>, writers: usize, metrics: Arc<Metrics>) -> Self {
        let (tx, rx) = mpsc::channel::<Job>(QUEUE_DEPTH);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..writers.max(1) {
            tokio::spawn(writer_loop(store.clone(), rx.clone(), metrics.clone()));
        }
        Self { tx }
    }

    /// Submits one write and waits until it is durable (or refused).
    pub async fn write(&self, write: Write) -> WriteResult {
        let (done, wait) = oneshot::channel();
        self.tx
            .send((write, done))
            .await
            .map_err(|_| StoreError::Unavailable("recorder stopped".into()))?;
        wait.await
            .map_err(|_| StoreError::Unavailable("recorder stopped".into()))?
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
        let (writes, waiters): (Vec<Write>, Vec<_>) = jobs.drain(..).unzip();
        let n = writes.len();
        let started = std::time::Instant::now();
        match store.commit(writes).await {
            Ok(results) => {
                metrics.commit(n, started.elapsed().as_secs_f64());
                for (waiter, result) in waiters.into_iter().zip(results) {
                    let _ = waiter.send(Ok(result));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, batch = n, "group commit failed; nothing of the batch was written");
                for waiter in waiters {
                    let _ = waiter.send(Err(StoreError::Unavailable(e.to_string())));
                }
            }
        }
    }
}
