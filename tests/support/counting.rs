//! A store that counts how often the service reads the event log, around a real one: lets a test
//! assert the number of queries a request costs instead of its wall time.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use toolexec_core::{Event, EventKind, Invocation, Replay, Session, Tenant};
use toolexec_store::{
    Approvals, Assigned, Blob, Blobs, Calls, Events, History, Leases, NewEvent, Nodes, Result,
    Retention, SessionPage, Sessions, Store, Tenants, Write, WriteError,
};
use uuid::Uuid;

/// Delegates everything to `inner`; counts the log reads.
pub struct CountingStore {
    pub inner: Arc<dyn Store>,
    /// Calls of [`Events::process_started`].
    pub process_lookups: AtomicU64,
    /// Calls of [`Events::events`], [`Events::event_texts`], [`Events::event_text`] and
    /// [`Events::events_of_kinds`] (a page of the log each).
    pub event_pages: AtomicU64,
    /// Calls of [`Calls::lookup_calls`] (recorded calls looked up by id).
    pub call_lookups: AtomicU64,
    /// Calls of [`Events::todo_events`] (one probe of the todo index each).
    pub todo_lookups: AtomicU64,
    /// Calls of [`Tenants::tenant_for_key`] (an API key looked up).
    pub key_lookups: AtomicU64,
    /// Calls of [`Events::read_records`] (one walk of the read index each).
    pub read_lookups: AtomicU64,
    /// Run (once) at the start of [`Retention::delete_sessions`]: something that happens while
    /// retention runs, between its reading of the logs and its deletes.
    pub before_delete_sessions: tokio::sync::Mutex<Option<futures::future::BoxFuture<'static, ()>>>,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn Store>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            process_lookups: AtomicU64::new(0),
            event_pages: AtomicU64::new(0),
            call_lookups: AtomicU64::new(0),
            todo_lookups: AtomicU64::new(0),
            key_lookups: AtomicU64::new(0),
            read_lookups: AtomicU64::new(0),
            before_delete_sessions: tokio::sync::Mutex::new(None),
        })
    }

    /// Log reads so far: process lookups plus event pages.
    pub fn log_reads(&self) -> u64 {
        self.process_lookups.load(Ordering::SeqCst) + self.event_pages.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Store for CountingStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn migrate(&self) -> Result<()> {
        self.inner.migrate().await
    }
    async fn ping(&self) -> Result<()> {
        self.inner.ping().await
    }
}

#[async_trait]
impl Tenants for CountingStore {
    async fn ensure_tenant(&self, name: &str) -> Result<Tenant> {
        self.inner.ensure_tenant(name).await
    }
    async fn create_api_key(&self, tenant_id: Uuid, key_sha256: &str, prefix: &str) -> Result<()> {
        self.inner
            .create_api_key(tenant_id, key_sha256, prefix)
            .await
    }
    async fn tenant_for_key(&self, key_sha256: &str) -> Result<Option<Tenant>> {
        self.key_lookups.fetch_add(1, Ordering::SeqCst);
        self.inner.tenant_for_key(key_sha256).await
    }
    async fn has_api_keys(&self) -> Result<bool> {
        self.inner.has_api_keys().await
    }
}

#[async_trait]
impl Sessions for CountingStore {
    async fn create_session(
        &self,
        session: &Session,
        events: Vec<NewEvent>,
        blobs: Vec<Blob>,
        max_open_sessions: u64,
    ) -> Result<Session> {
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
        bounds: toolexec_store::pages::ByteBounds,
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
impl Calls for CountingStore {
    async fn lookup_calls(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        call_ids: &[String],
    ) -> Result<(Session, Vec<Invocation>)> {
        self.call_lookups.fetch_add(1, Ordering::SeqCst);
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
        self.inner.commit(batch).await
    }
    async fn prepare(&self, write: &mut Write) -> Result<()> {
        self.inner.prepare(write).await
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
        self.inner.invocation_output(tenant_id, id).await
    }
}

#[async_trait]
impl Events for CountingStore {
    async fn events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Event>> {
        self.event_pages.fetch_add(1, Ordering::SeqCst);
        self.inner.events(tenant_id, session_id, after, limit).await
    }
    async fn event_texts(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        after: i64,
        limit: u32,
        bounds: toolexec_store::pages::ByteBounds,
    ) -> Result<toolexec_store::pages::EventTexts> {
        self.event_pages.fetch_add(1, Ordering::SeqCst);
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
    ) -> Result<Option<toolexec_store::pages::EventText>> {
        self.event_pages.fetch_add(1, Ordering::SeqCst);
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
        self.event_pages.fetch_add(1, Ordering::SeqCst);
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
        self.todo_lookups.fetch_add(1, Ordering::SeqCst);
        self.inner
            .todo_events(tenant_id, session_id, after, limit)
            .await
    }
    fn read_records(
        &self,
        session_id: Uuid,
        up_to: i64,
    ) -> futures::stream::BoxStream<'_, Result<toolexec_store::ReadRecord>> {
        self.read_lookups.fetch_add(1, Ordering::SeqCst);
        self.inner.read_records(session_id, up_to)
    }
    async fn process_started(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        process_id: &str,
    ) -> Result<Option<serde_json::Value>> {
        self.process_lookups.fetch_add(1, Ordering::SeqCst);
        self.inner
            .process_started(tenant_id, session_id, process_id)
            .await
    }
    async fn last_process_number(&self, session_id: Uuid) -> Result<u64> {
        self.inner.last_process_number(session_id).await
    }
}

#[async_trait]
impl Blobs for CountingStore {
    async fn put_blobs(&self, blobs: Vec<Blob>) -> Result<Vec<usize>> {
        self.inner.put_blobs(blobs).await
    }
    fn blob_statement_bytes(&self) -> usize {
        self.inner.blob_statement_bytes()
    }
    async fn blob(&self, sha256: &str) -> Result<Option<Vec<u8>>> {
        self.inner.blob(sha256).await
    }
    async fn blobs(&self, sha256s: &[String]) -> Result<Vec<Blob>> {
        self.inner.blobs(sha256s).await
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
impl History for CountingStore {
    async fn append_events(
        &self,
        tenant_id: Uuid,
        session_id: Uuid,
        events: Vec<NewEvent>,
        blobs: Vec<Blob>,
    ) -> Result<(i64, i64)> {
        self.inner
            .append_events(tenant_id, session_id, events, blobs)
            .await
    }
    async fn save_replay(&self, tenant_id: Uuid, replay: &Replay) -> Result<()> {
        self.inner.save_replay(tenant_id, replay).await
    }
    async fn replay(&self, tenant_id: Uuid, id: Uuid) -> Result<Replay> {
        self.inner.replay(tenant_id, id).await
    }
}

#[async_trait]
impl Approvals for CountingStore {
    async fn request_approval(
        &self,
        invocation: toolexec_store::NewInvocation,
        data: serde_json::Value,
        max_waiting: u64,
    ) -> Result<std::result::Result<i64, WriteError>> {
        self.inner
            .request_approval(invocation, data, max_waiting)
            .await
    }
    async fn decide_approval(
        &self,
        tenant_id: Uuid,
        invocation_id: Uuid,
        decided: serde_json::Value,
        denied: Option<toolexec_store::Outcome>,
        node: &str,
    ) -> Result<std::result::Result<toolexec_store::Decided, WriteError>> {
        self.inner
            .decide_approval(tenant_id, invocation_id, decided, denied, node)
            .await
    }
    async fn pending_approvals(
        &self,
        of: toolexec_store::Waiters<'_>,
    ) -> Result<Vec<toolexec_store::PendingApproval>> {
        self.inner.pending_approvals(of).await
    }
}

#[async_trait]
impl Leases for CountingStore {
    async fn acquire_lease(
        &self,
        session_id: Uuid,
        node: &str,
        ttl: std::time::Duration,
    ) -> Result<toolexec_store::Lease> {
        self.inner.acquire_lease(session_id, node, ttl).await
    }
    async fn renew_leases(&self, node: &str, ttl: std::time::Duration) -> Result<Vec<Uuid>> {
        self.inner.renew_leases(node, ttl).await
    }
    async fn release_leases(&self, node: &str, session_ids: &[Uuid]) -> Result<()> {
        self.inner.release_leases(node, session_ids).await
    }
}

#[async_trait]
impl Nodes for CountingStore {
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
        alive_within: std::time::Duration,
    ) -> Result<Option<toolexec_store::SessionOwner>> {
        self.inner.session_owner(session_id, alive_within).await
    }
    async fn invocation_session(&self, invocation_id: Uuid) -> Result<Option<Uuid>> {
        self.inner.invocation_session(invocation_id).await
    }
}

#[async_trait]
impl Retention for CountingStore {
    async fn retention_sessions(&self) -> Result<Vec<toolexec_store::RetentionSession>> {
        self.inner.retention_sessions().await
    }
    async fn session_seqs(&self) -> Result<Vec<(Uuid, i64)>> {
        self.inner.session_seqs().await
    }
    async fn scan_events(&self, after: Option<(Uuid, i64)>, limit: u32) -> Result<Vec<Event>> {
        self.inner.scan_events(after, limit).await
    }
    async fn scan_output_refs(
        &self,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<Vec<toolexec_store::OutputRef>> {
        self.inner.scan_output_refs(after, limit).await
    }
    async fn delete_sessions(&self, ids: &[Uuid]) -> Result<toolexec_store::Deleted> {
        let hook = self.before_delete_sessions.lock().await.take();
        if let Some(hook) = hook {
            hook.await;
        }
        self.inner.delete_sessions(ids).await
    }
    async fn delete_blobs(&self, sha256s: &[String]) -> Result<u64> {
        self.inner.delete_blobs(sha256s).await
    }
}
