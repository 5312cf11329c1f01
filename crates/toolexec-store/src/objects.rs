//! Blobs in S3-compatible object storage: [`ObjectBlobs`] wraps a database [`Store`] and keeps
//! every blob larger than [`BlobsConfig::inline_max_bytes`] as the object
//! `<s3_prefix><sha256>` of a bucket instead of a row of `blobs`.
//!
//! The order of a write is what makes it crash-safe: the objects are written first, then the
//! database rows that say they are there (`blob_objects`), then the events that name them. A
//! crash in between leaves an object (or a row) that nothing names, never an event that names
//! nothing; content addressing makes writing the same object again harmless.
//!
//! It fails closed: a batch that starts calls is refused ([`StoreError::Unavailable`], so the
//! call is answered 503 and nothing runs) while the object store cannot be reached, and a write
//! whose objects cannot be written appends nothing. Reads take a blob from wherever the
//! database says it is.
//!
//! It does not decide what a blob is or when it may go: retention ([`crate::retention`]) calls
//! [`Retention::delete_blobs`], which here deletes the rows and then the objects.
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use toolexec_core::{Event, EventKind, Invocation, Session, Tenant};
use uuid::Uuid;

use crate::{
    Approvals, Assigned, Blob, Blobs, Calls, Deleted, Events, History, Lease, Leases, NewEvent,
    Nodes, OutputRef, Result, Retention, RetentionSession, SessionOwner, SessionPage, Sessions,
    Store, StoreError, Tenants, Write, WriteError,
};

/// Default [`BlobsConfig::inline_max_bytes`]: 64 KiB. Most blobs are source files and short
/// outputs; kept in the database they cost no round trip to the object store when written and
/// none per file when a workspace is rebuilt (a fork of 500 files would otherwise be 500 GETs),
/// and Postgres holds them well. What fills a database is the large ones — build outputs,
/// archives, fetched pages — and those go to the bucket.
pub const DEFAULT_INLINE_MAX_BYTES: usize = 64 * 1024;

/// How long a successful round trip to the object store vouches for it: a batch that starts
/// calls within this time of the last success is not probed again. One second bounds both the
/// probes (at most one a second) and the window in which a call can start although the store
/// just went down (its finish then waits for the store, retried, like any store outage).
const HEALTHY_FOR: Duration = Duration::from_secs(1);

/// The object written at start-up (and asked for by the liveness probe): under the prefix, and
/// no hash, so never taken for a blob.
const PROBE_KEY: &str = "toolexec-probe";

/// Most object requests in flight at once for one write or read.
const PARALLEL_REQUESTS: usize = 16;

/// Connect timeout: an unreachable endpoint is found out quickly, and the call refused.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Request timeout: long enough for a blob of `limits.max_blob_bytes` over a slow link.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Retries of a failed request (with backoff) and the time they may take in all: bounded, so a
/// store that is down refuses calls within seconds instead of holding them for minutes.
const MAX_RETRIES: usize = 2;
const RETRY_TIMEOUT: Duration = Duration::from_secs(10);

/// Where blobs live (`blobs.*` in docs/operator.md).
#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct BlobsConfig {
    /// `database` (default: every blob a row of the database) or `s3`.
    pub backend: String,
    /// Blobs of at most this many bytes stay in the database with `backend = "s3"`.
    pub inline_max_bytes: usize,
    /// The S3 endpoint (`http://127.0.0.1:9000`, `https://s3.eu-west-1.amazonaws.com`, …);
    /// unset: AWS S3 of the region (or `AWS_ENDPOINT_URL`).
    pub s3_endpoint: Option<String>,
    pub s3_bucket: Option<String>,
    /// Unset: `AWS_REGION` / `AWS_DEFAULT_REGION`, else `us-east-1`.
    pub s3_region: Option<String>,
    /// Prepended to the hash to make an object's key (`toolexec/blobs/` → `toolexec/blobs/<sha256>`).
    pub s3_prefix: String,
    /// Allow an `http://` endpoint (a store on a private network or loopback).
    pub s3_allow_http: bool,
    /// Credentials; unset: the standard AWS variables (`AWS_ACCESS_KEY_ID`, …), then the
    /// instance or pod identity. Never logged.
    pub s3_access_key_id: Option<String>,
    pub s3_secret_access_key: Option<String>,
    pub s3_session_token: Option<String>,
}

impl Default for BlobsConfig {
    fn default() -> Self {
        Self {
            backend: "database".into(),
            inline_max_bytes: DEFAULT_INLINE_MAX_BYTES,
            s3_endpoint: None,
            s3_bucket: None,
            s3_region: None,
            s3_prefix: String::new(),
            s3_allow_http: false,
            s3_access_key_id: None,
            s3_secret_access_key: None,
            s3_session_token: None,
        }
    }
}

impl std::fmt::Debug for BlobsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret = |v: &Option<String>| v.as_ref().map(|_| "***");
        f.debug_struct("BlobsConfig")
            .field("backend", &self.backend)
            .field("inline_max_bytes", &self.inline_max_bytes)
            .field("s3_endpoint", &self.s3_endpoint)
            .field("s3_bucket", &self.s3_bucket)
            .field("s3_region", &self.s3_region)
            .field("s3_prefix", &self.s3_prefix)
            .field("s3_allow_http", &self.s3_allow_http)
            .field("s3_access_key_id", &secret(&self.s3_access_key_id))
            .field("s3_secret_access_key", &secret(&self.s3_secret_access_key))
            .field("s3_session_token", &secret(&self.s3_session_token))
            .finish()
    }
}

/// The configuration keys whose values are secrets (never shown by `toolexec config`).
pub const SECRET_KEYS: [&str; 3] = [
    "blobs.s3_access_key_id",
    "blobs.s3_secret_access_key",
    "blobs.s3_session_token",
];

impl BlobsConfig {
    /// Whether blobs go to object storage.
    pub fn uses_object_store(&self) -> std::result::Result<bool, String> {
        match self.backend.as_str() {
            "database" => Ok(false),
            "s3" => Ok(true),
            other => Err(format!(
                "blobs.backend must be \"database\" or \"s3\", not {other:?}"
            )),
        }
    }

    /// The S3 client this configuration describes: the standard AWS environment variables
    /// first, then what the configuration sets.
    pub fn s3(&self) -> std::result::Result<Arc<dyn ObjectStore>, String> {
        use object_store::aws::AmazonS3Builder;
        let bucket = self
            .s3_bucket
            .as_deref()
            .filter(|b| !b.is_empty())
            .ok_or("blobs.backend = \"s3\" needs blobs.s3_bucket")?;
        // The TLS of the client is rustls with the ring provider (no aws-lc in the build).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_allow_http(self.s3_allow_http)
            .with_client_options(
                object_store::ClientOptions::new()
                    .with_allow_http(self.s3_allow_http)
                    .with_connect_timeout(CONNECT_TIMEOUT)
                    .with_timeout(REQUEST_TIMEOUT),
            )
            .with_retry(object_store::RetryConfig {
                max_retries: MAX_RETRIES,
                retry_timeout: RETRY_TIMEOUT,
                ..Default::default()
            });
        if let Some(endpoint) = &self.s3_endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(region) = &self.s3_region {
            builder = builder.with_region(region);
        }
        if let Some(v) = &self.s3_access_key_id {
            builder = builder.with_access_key_id(v);
        }
        if let Some(v) = &self.s3_secret_access_key {
            builder = builder.with_secret_access_key(v);
        }
        if let Some(v) = &self.s3_session_token {
            builder = builder.with_token(v);
        }
        let s3 = builder
            .build()
            .map_err(|e| format!("blobs: the S3 configuration is not usable: {e}"))?;
        Ok(Arc::new(s3))
    }
}

/// A database store whose large blobs are objects of an object store (see the module docs).
pub struct ObjectBlobs {
    inner: Arc<dyn Store>,
    objects: Arc<dyn ObjectStore>,
    prefix: String,
    inline_max_bytes: usize,
    /// When a round trip to the object store last succeeded; `None`: the last one failed.
    healthy_at: std::sync::Mutex<Option<Instant>>,
}

impl ObjectBlobs {
    /// Wraps `inner`; `prefix` is prepended to the hash to make a key.
    pub fn new(
        inner: Arc<dyn Store>,
        objects: Arc<dyn ObjectStore>,
        prefix: &str,
        inline_max_bytes: usize,
    ) -> std::result::Result<Self, String> {
        // A key must be a valid object path: no leading '/', no empty or '.' segments.
        let probe = format!("{prefix}{}", "0".repeat(64));
        Path::parse(&probe).map_err(|e| format!("blobs.s3_prefix {prefix:?}: {e}"))?;
        Ok(Self {
            inner,
            objects,
            prefix: prefix.to_owned(),
            inline_max_bytes,
            healthy_at: std::sync::Mutex::new(None),
        })
    }

    /// The object key of a blob.
    pub fn key(&self, sha256: &str) -> Path {
        Path::from_iter(
            format!("{}{sha256}", self.prefix)
                .split('/')
                .filter(|s| !s.is_empty()),
        )
    }

    fn unavailable(&self, what: &str, e: impl std::fmt::Display) -> StoreError {
        self.set_healthy(false);
        StoreError::Unavailable(format!(
            "the object store for blobs is unreachable ({what}): {e}"
        ))
    }

    fn set_healthy(&self, ok: bool) {
        if let Ok(mut at) = self.healthy_at.lock() {
            *at = ok.then(Instant::now);
        }
    }

    /// Fails unless the object store answered within `HEALTHY_FOR` or answers a probe now.
    pub async fn ensure_reachable(&self) -> Result<()> {
        let fresh = self
            .healthy_at
            .lock()
            .ok()
            .and_then(|at| *at)
            .is_some_and(|at| at.elapsed() < HEALTHY_FOR);
        if fresh {
            return Ok(());
        }
        // A HEAD of a key that need not exist: any answer of the store (found or not) is one.
        match self.objects.head(&self.key(PROBE_KEY)).await {
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {
                self.set_healthy(true);
                Ok(())
            }
            Err(e) => Err(self.unavailable("probe", e)),
        }
    }

    /// Writes and reads back a small object: the bucket exists, and the credentials may write
    /// and read under the prefix. Run at start, so that a wrong bucket or key stops the service
    /// with a clear error instead of refusing every call.
    pub async fn check_writable(&self) -> std::result::Result<(), String> {
        let key = self.key(PROBE_KEY);
        let body = Bytes::from_static(b"toolexec writes its blobs here\n");
        self.objects
            .put(&key, body.clone().into())
            .await
            .map_err(|e| format!("blobs: cannot write {key} to the bucket: {e}"))?;
        let read = self
            .objects
            .get(&key)
            .await
            .map_err(|e| format!("blobs: cannot read {key} from the bucket: {e}"))?
            .bytes()
            .await
            .map_err(|e| format!("blobs: cannot read {key} from the bucket: {e}"))?;
        if read != body {
            return Err(format!("blobs: {key} read back other bytes than written"));
        }
        self.set_healthy(true);
        Ok(())
    }

    /// Puts the blobs above the inline bound into the object store and records them, and
    /// returns the others (to be written by the database with the write that names them).
    async fn offload(&self, blobs: Vec<Blob>) -> Result<Vec<Blob>> {
        let (large, inline): (Vec<Blob>, Vec<Blob>) = blobs
            .into_iter()
            .partition(|b| b.len() > self.inline_max_bytes);
        if large.is_empty() {
            return Ok(inline);
        }
        // Always written, even when recorded already: a PUT of the same bytes is harmless, and
        // it renews the object's date, which retention reads (docs/design.md).
        futures::stream::iter(large.iter().cloned().map(|blob| self.put_one(blob)))
            .buffer_unordered(PARALLEL_REQUESTS)
            .try_collect::<Vec<_>>()
            .await?;
        self.set_healthy(true);
        let rows: Vec<(String, u64)> = large
            .iter()
            .map(|b| (b.sha256.clone(), b.len() as u64))
            .collect();
        self.inner.put_blob_objects(&rows).await?;
        Ok(inline)
    }

    async fn put_one(&self, blob: Blob) -> Result<()> {
        self.objects
            .put(&self.key(&blob.sha256), blob.bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| self.unavailable("writing a blob", e))
    }

    /// Reads objects, checking that their bytes hash to their name.
    async fn fetch(&self, sha256s: Vec<String>) -> Result<Vec<Blob>> {
        let blobs: Vec<Option<Blob>> =
            futures::stream::iter(sha256s.into_iter().map(|sha256| self.get_one(sha256)))
                .buffer_unordered(PARALLEL_REQUESTS)
                .try_collect()
                .await?;
        Ok(blobs.into_iter().flatten().collect())
    }

    async fn get_one(&self, sha256: String) -> Result<Option<Blob>> {
        let bytes: Bytes = match self.objects.get(&self.key(&sha256)).await {
            Ok(got) => got
                .bytes()
                .await
                .map_err(|e| self.unavailable("reading a blob", e))?,
            // Recorded but gone (deleted by hand): read as a blob that is not stored.
            Err(object_store::Error::NotFound { .. }) => {
                tracing::error!(%sha256, "a blob recorded in the object store is missing there");
                return Ok(None);
            }
            Err(e) => return Err(self.unavailable("reading a blob", e)),
        };
        let blob = Blob::new(bytes);
        if blob.sha256 != sha256 {
            return Err(StoreError::Corrupt(format!(
                "the object of blob {sha256} holds other bytes ({})",
                blob.sha256
            )));
        }
        Ok(Some(blob))
    }

    async fn delete_one(&self, sha256: String) -> Result<()> {
        match self.objects.delete(&self.key(&sha256)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.unavailable("deleting a blob", e)),
        }
    }
}

#[async_trait]
impl Store for ObjectBlobs {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn migrate(&self) -> Result<()> {
        self.inner.migrate().await
    }
    async fn ping(&self) -> Result<()> {
        self.inner.ping().await?;
        self.ensure_reachable().await
    }
}

#[async_trait]
impl Tenants for ObjectBlobs {
    async fn ensure_tenant(&self, name: &str) -> Result<Tenant> {
        self.inner.ensure_tenant(name).await
    }
    async fn create_api_key(&self, tenant_id: Uuid, key_sha256: &str, prefix: &str) -> Result<()> {
        self.inner
            .create_api_key(tenant_id, key_sha256, prefix)
            .await
    }
    async fn tenant_for_key(&self, key_sha256: &str) -> Result<Option<Tenant>> {
        self.inner.tenant_for_key(key_sha256).await
    }
    async fn has_api_keys(&self) -> Result<bool> {
        self.inner.has_api_keys().await
    }
}

#[async_trait]
impl Sessions for ObjectBlobs {
    async fn create_session(
        &self,
        session: &Session,
        events: Vec<NewEvent>,
        blobs: Vec<Blob>,
        max_open_sessions: u64,
    ) -> Result<Session> {
        let blobs = self.offload(blobs).await?;
        self.inner
            .create_session(session, events, blobs, max_open_sessions)
            .await
    }
    async fn get_session(&self, tenant_id: Uuid, id: Uuid) -> Result<Session> {
        self.inner.get_session(tenant_id, id).await
    }
    async fn list_sessions(
        &self,
        tenant_id: Uuid,
        before: Option<Uuid>,
        limit: u32,
        bounds: crate::pages::ByteBounds,
    ) -> Result<SessionPage> {
        self.inner
            .list_sessions(tenant_id, before, limit, bounds)
            .await
    }
    async fn session_excerpt(&self, tenant_id: Uuid, id: Uuid, chars: u32) -> Result<Session> {
        self.inner.session_excerpt(tenant_id, id, chars).await
    }
    async fn close_session(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        data: serde_json::Value,
    ) -> Result<Session> {
        self.inner.close_session(tenant_id, id, data).await
    }
}

#[async_trait]
impl Calls for ObjectBlobs {
    async fn lookup_calls(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        call_ids: &[String],
    ) -> Result<(Session, Vec<Invocation>)> {
        self.inner
            .lookup_calls(tenant_id, session_id, call_ids)
            .await
    }
    async fn call_ids(&self, session_id: Uuid, after: &str, limit: u32) -> Result<Vec<String>> {
        self.inner.call_ids(session_id, after, limit).await
    }
    async fn last_call_arguments(
        &self,
        session_id: Uuid,
        name: &str,
    ) -> Result<Option<serde_json::Value>> {
        self.inner.last_call_arguments(session_id, name).await
    }
    async fn commit(
        &self,
        batch: &[Write],
    ) -> Result<Vec<std::result::Result<Assigned, WriteError>>> {
        // The recorder has prepared its writes (`prepare`): this uploads only what a caller
        // that did not left in them.
        if !batch
            .iter()
            .any(|w| w.blobs().iter().any(|b| b.len() > self.inline_max_bytes))
        {
            return self.inner.commit(batch).await;
        }
        let mut rest = batch.to_vec();
        for write in &mut rest {
            let blobs = write.take_blobs();
            let inline = self.offload(blobs).await?;
            match write {
                Write::Start { .. } => {}
                Write::Finish { blobs, .. } | Write::Record { blobs, .. } => *blobs = inline,
            }
        }
        self.inner.commit(&rest).await
    }
    async fn prepare(&self, write: &mut Write) -> Result<()> {
        // Fail closed: nothing starts while the blobs of its finish could not be written.
        if matches!(write, Write::Start { .. } | Write::Record { .. }) {
            self.ensure_reachable().await?;
        }
        if !write
            .blobs()
            .iter()
            .any(|b| b.len() > self.inline_max_bytes)
        {
            return Ok(());
        }
        let inline = self.offload(write.blobs().to_vec()).await?;
        match write {
            Write::Start { .. } => {}
            Write::Finish { blobs, .. } | Write::Record { blobs, .. } => *blobs = inline,
        }
        Ok(())
    }
    async fn interrupt_running(&self, node: &str, content: &str) -> Result<u64> {
        self.inner.interrupt_running(node, content).await
    }
    async fn interrupt_session(&self, session_id: Uuid, content: &str) -> Result<u64> {
        self.inner.interrupt_session(session_id, content).await
    }
    async fn invocation_page(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Invocation> {
        self.inner
            .invocation_page(tenant_id, id, after, limit)
            .await
    }
    async fn invocation_output(&self, tenant_id: Uuid, id: Uuid) -> Result<String> {
        match self.inner.invocation_output_sha256(tenant_id, id).await? {
            None => self.inner.invocation_output(tenant_id, id).await,
            Some(sha256) => match self.blob(&sha256).await? {
                Some(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
                None => Err(StoreError::Corrupt(format!(
                    "output blob {sha256} is missing"
                ))),
            },
        }
    }
}

#[async_trait]
impl Events for ObjectBlobs {
    async fn events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Event>> {
        self.inner.events(tenant_id, session_id, after, limit).await
    }
    async fn event_texts(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
        bounds: crate::pages::ByteBounds,
    ) -> Result<crate::pages::EventTexts> {
        self.inner
            .event_texts(tenant_id, session_id, after, limit, bounds)
            .await
    }
    async fn event_text(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        seq: i64,
        chars: Option<u32>,
    ) -> Result<Option<crate::pages::EventText>> {
        self.inner
            .event_text(tenant_id, session_id, seq, chars)
            .await
    }
    async fn events_of_kinds(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        kinds: &[EventKind],
        after: i64,
        up_to: i64,
        limit: u32,
    ) -> Result<Vec<Event>> {
        self.inner
            .events_of_kinds(tenant_id, session_id, kinds, after, up_to, limit)
            .await
    }
    async fn todo_events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Event>> {
        self.inner
            .todo_events(tenant_id, session_id, after, limit)
            .await
    }
    fn read_records(
        &self,
        session_id: Uuid,
        up_to: i64,
    ) -> futures::stream::BoxStream<'_, Result<crate::ReadRecord>> {
        self.inner.read_records(session_id, up_to)
    }
    async fn process_started(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        process_id: &str,
    ) -> Result<Option<serde_json::Value>> {
        self.inner
            .process_started(tenant_id, session_id, process_id)
            .await
    }
    async fn last_process_number(&self, session_id: Uuid) -> Result<u64> {
        self.inner.last_process_number(session_id).await
    }
}

#[async_trait]
impl Blobs for ObjectBlobs {
    async fn put_blobs(&self, blobs: Vec<Blob>) -> Result<Vec<usize>> {
        let inline = self.offload(blobs).await?;
        self.inner.put_blobs(inline).await
    }
    fn blob_statement_bytes(&self) -> usize {
        self.inner.blob_statement_bytes()
    }
    async fn blob(&self, sha256: &str) -> Result<Option<Vec<u8>>> {
        if let Some(bytes) = self.inner.blob(sha256).await? {
            return Ok(Some(bytes));
        }
        Ok(self
            .blobs(&[sha256.to_owned()])
            .await?
            .into_iter()
            .next()
            .map(|b| b.bytes.to_vec()))
    }
    async fn blobs(&self, sha256s: &[String]) -> Result<Vec<Blob>> {
        let mut found = self.inner.blobs(sha256s).await?;
        if found.len() < sha256s.len() {
            let have: std::collections::HashSet<&str> =
                found.iter().map(|b| b.sha256.as_str()).collect();
            let missing: Vec<String> = sha256s
                .iter()
                .filter(|s| !have.contains(s.as_str()))
                .cloned()
                .collect();
            let elsewhere = self.inner.blob_objects(&missing).await?;
            found.extend(self.fetch(elsewhere).await?);
        }
        Ok(found)
    }
    async fn put_blob_objects(&self, objects: &[(String, u64)]) -> Result<()> {
        self.inner.put_blob_objects(objects).await
    }
    async fn blob_objects(&self, sha256s: &[String]) -> Result<Vec<String>> {
        self.inner.blob_objects(sha256s).await
    }
    async fn invocation_output_sha256(&self, tenant_id: Uuid, id: Uuid) -> Result<Option<String>> {
        self.inner.invocation_output_sha256(tenant_id, id).await
    }
}

#[async_trait]
impl History for ObjectBlobs {
    async fn append_events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        events: Vec<NewEvent>,
        blobs: Vec<Blob>,
    ) -> Result<(i64, i64)> {
        let blobs = self.offload(blobs).await?;
        self.inner
            .append_events(tenant_id, session_id, events, blobs)
            .await
    }
    async fn save_replay(&self, tenant_id: Uuid, replay: &toolexec_core::Replay) -> Result<()> {
        self.inner.save_replay(tenant_id, replay).await
    }
    async fn replay(&self, tenant_id: Uuid, id: Uuid) -> Result<toolexec_core::Replay> {
        self.inner.replay(tenant_id, id).await
    }
}

#[async_trait]
impl Approvals for ObjectBlobs {
    async fn request_approval(
        &self,
        invocation: crate::NewInvocation,
        data: serde_json::Value,
        max_waiting: u64,
    ) -> Result<std::result::Result<i64, crate::WriteError>> {
        self.inner
            .request_approval(invocation, data, max_waiting)
            .await
    }
    async fn decide_approval(
        &self,
        tenant_id: Uuid,
        invocation_id: Uuid,
        decided: serde_json::Value,
        denied: Option<crate::Outcome>,
        node: &str,
    ) -> Result<std::result::Result<crate::Decided, crate::WriteError>> {
        // A denial's outcome is its short reason, never a blob.
        self.inner
            .decide_approval(tenant_id, invocation_id, decided, denied, node)
            .await
    }
    async fn pending_approvals(
        &self,
        of: crate::Waiters<'_>,
    ) -> Result<Vec<crate::PendingApproval>> {
        self.inner.pending_approvals(of).await
    }
}

#[async_trait]
impl Leases for ObjectBlobs {
    async fn acquire_lease(&self, session_id: Uuid, node: &str, ttl: Duration) -> Result<Lease> {
        self.inner.acquire_lease(session_id, node, ttl).await
    }
    async fn renew_leases(&self, node: &str, ttl: Duration) -> Result<Vec<Uuid>> {
        self.inner.renew_leases(node, ttl).await
    }
    async fn release_leases(&self, node: &str, session_ids: &[Uuid]) -> Result<()> {
        self.inner.release_leases(node, session_ids).await
    }
}

#[async_trait]
impl Nodes for ObjectBlobs {
    async fn node_heartbeat(
        &self,
        node: &str,
        address: Option<&str>,
        draining: bool,
    ) -> Result<()> {
        self.inner.node_heartbeat(node, address, draining).await
    }
    async fn remove_node(&self, node: &str) -> Result<()> {
        self.inner.remove_node(node).await
    }
    async fn session_owner(
        &self,
        session_id: Uuid,
        alive_within: Duration,
    ) -> Result<Option<SessionOwner>> {
        self.inner.session_owner(session_id, alive_within).await
    }
    async fn invocation_session(&self, invocation_id: Uuid) -> Result<Option<Uuid>> {
        self.inner.invocation_session(invocation_id).await
    }
}

#[async_trait]
impl Retention for ObjectBlobs {
    async fn retention_sessions(&self) -> Result<Vec<RetentionSession>> {
        self.inner.retention_sessions().await
    }
    async fn session_seqs(&self) -> Result<Vec<(Uuid, i64)>> {
        self.inner.session_seqs().await
    }
    async fn scan_events(&self, after: Option<(Uuid, i64)>, limit: u32) -> Result<Vec<Event>> {
        self.inner.scan_events(after, limit).await
    }
    async fn scan_output_refs(&self, after: Option<Uuid>, limit: u32) -> Result<Vec<OutputRef>> {
        self.inner.scan_output_refs(after, limit).await
    }
    async fn delete_sessions(&self, ids: &[Uuid]) -> Result<Deleted> {
        self.inner.delete_sessions(ids).await
    }
    async fn delete_blobs(&self, sha256s: &[String]) -> Result<u64> {
        // The rows first: a crash before the objects are deleted leaves objects nothing names
        // (harmless), never a row that names an object that is gone.
        let objects = self.inner.blob_objects(sha256s).await?;
        let rows = self.inner.delete_blobs(sha256s).await?;
        futures::stream::iter(objects.into_iter().map(|sha256| self.delete_one(sha256)))
            .buffer_unordered(PARALLEL_REQUESTS)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(rows)
    }
}
