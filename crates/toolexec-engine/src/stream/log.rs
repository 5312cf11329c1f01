//! Reading the record: a session's events, one invocation, and an invocation's full output.
use serde::Serialize;
use toolexec_core::Invocation;
use uuid::Uuid;

use super::Streams;
use crate::Result;

/// Default and largest page of events.
pub const DEFAULT_EVENTS_PAGE: u32 = 100;
pub const MAX_EVENTS_PAGE: u32 = 1_000;
/// Default and largest slice of an output, in characters.
pub const DEFAULT_OUTPUT_SLICE: usize = 50_000;
pub const MAX_OUTPUT_SLICE: usize = 1_000_000;

/// A slice of an invocation's full output, by character offsets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutputSlice {
    pub invocation_id: Uuid,
    pub offset: usize,
    pub total_chars: usize,
    /// Where the next slice starts; `None` at the end.
    pub next_offset: Option<usize>,
    pub content: String,
    /// False when the record holds only the head and tail of the output (it was over
    /// `limits.max_stored_output_bytes`): the text has a marker where the middle was dropped.
    pub complete: bool,
    /// Length of the output the tool produced, in characters (`total_chars` is what is stored).
    pub output_chars: usize,
}

impl Streams {
    /// One invocation with a page of its side effects: those after seq `after`, at most `limit`
    /// (1–1000, default 1000).
    /// An invocation once it has ended — not running, not waiting for approval — or as it is
    /// when `wait` has passed (`GET /v1/invocations/{id}?wait=SECONDS`). Follows the session's
    /// live log meanwhile (one of the tenant's streams, `limits.max_streams_per_tenant`), so
    /// an end recorded by another node is seen too.
    pub async fn wait_invocation(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        wait: std::time::Duration,
        after: Option<i64>,
        limit: Option<u32>,
    ) -> Result<Invocation> {
        use futures::StreamExt;
        let inv = self.invocation(tenant_id, id, after, limit).await?;
        if inv.status.finished().is_some() || wait.is_zero() {
            return Ok(inv);
        }
        // Where the log is now, then the invocation again: an end recorded after this read has
        // a later seq, so the stream from here sees it.
        let session = self.store.get_session(tenant_id, inv.session_id).await?;
        let inv = self.invocation(tenant_id, id, after, limit).await?;
        if inv.status.finished().is_some() {
            return Ok(inv);
        }
        let stream = self
            .stream(tenant_id, inv.session_id, session.last_seq)
            .await?;
        let mut stream = std::pin::pin!(stream);
        let _ = tokio::time::timeout(wait, async {
            while let Some(item) = stream.next().await {
                match item {
                    crate::stream::StreamItem::Event(e) => {
                        if e.invocation_id == Some(id)
                            && e.kind == toolexec_core::EventKind::InvocationFinished
                        {
                            return;
                        }
                    }
                    // The stream cannot go on: answer with the invocation as it is.
                    _ => return,
                }
            }
        })
        .await;
        self.invocation(tenant_id, id, after, limit).await
    }

    pub async fn invocation(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        after: Option<i64>,
        limit: Option<u32>,
    ) -> Result<Invocation> {
        let limit = limit
            .unwrap_or(toolexec_store::SIDE_EFFECTS_PAGE)
            .clamp(1, toolexec_store::SIDE_EFFECTS_PAGE);
        Ok(self
            .store
            .invocation_page(tenant_id, id, after.unwrap_or(0).max(0), limit)
            .await?)
    }

    pub async fn invocation_output(
        &self,
        tenant_id: Uuid,
        id: Uuid,
        offset: Option<usize>,
        limit: Option<usize>,
    ) -> Result<OutputSlice> {
        // The row says how long the output was; the stored text may be shorter (head and tail).
        let inv = self.store.invocation_page(tenant_id, id, 0, 0).await?;
        let full = self.store.invocation_output(tenant_id, id).await?;
        let offset = offset.unwrap_or(0);
        let limit = limit
            .unwrap_or(DEFAULT_OUTPUT_SLICE)
            .clamp(1, MAX_OUTPUT_SLICE);
        let total_chars = full.chars().count();
        let output_chars = inv
            .output_chars
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(total_chars);
        let content: String = full.chars().skip(offset).take(limit).collect();
        let end = offset.saturating_add(limit);
        Ok(OutputSlice {
            invocation_id: id,
            offset,
            total_chars,
            next_offset: (end < total_chars).then_some(end),
            content,
            complete: output_chars == total_chars,
            output_chars,
        })
    }
}
