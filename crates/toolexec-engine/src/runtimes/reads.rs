//! Read-state from the log: what a session had read right after one of its events, folded from
//! the `reads` of its `invocation.finished` events (docs/design.md, "Read-state from the log").
//!
//! A session's runtime is built with it wherever the runtime is built from the record — a
//! take-over, a restart, a reload after an eviction (`Runtimes::runtime`), a fork or a replay at
//! its origin's seq — and a rewind puts it back to what it was at the seq it rewinds to. The
//! tools keep it current on the node afterwards; each call's reads go into its record.
//!
//! The fold walks the session's read records newest first (a stream over a partial index, one
//! row at a time), so the first entry of a path decides it. A `workspace.rewound` event sends
//! the walk to its `to_seq`: what was read between the two no longer counts. The start of the
//! session's log sends it to its origin's seq (a fork or a replay), recursively.
use std::collections::HashMap;
use std::time::Instant;

use futures::StreamExt;
use toolexec_core::Session;
use toolexec_store::{ReadRecord, StoreError};

use crate::history::MAX_ORIGIN_DEPTH;
use crate::runtimes::Runtimes;
use crate::{Engine, EngineError, Result};

impl Runtimes {
    /// What `session` had read right after its event `up_to` (`i64::MAX`: now), path → SHA-256
    /// of the contents read.
    pub(crate) async fn reads_at(
        &self,
        engine: &Engine,
        session: &Session,
        up_to: i64,
    ) -> Result<HashMap<String, String>> {
        let started = Instant::now();
        // Path → the entry that decides it (`None`: deleted by the session since its read).
        let mut decided: HashMap<String, Option<String>> = HashMap::new();
        let (mut id, mut upper, mut origin) = (session.id, up_to, session.origin);
        let (mut records, mut followed) = (0u64, 0usize);
        loop {
            let mut rewound_to = None;
            // Nothing at or before seq 0 (a session made just now from its origin's state).
            if upper >= 1 {
                let mut rows = engine.store.read_records(id, upper);
                while let Some(row) = rows.next().await {
                    records += 1;
                    match row {
                        Ok(ReadRecord::Reads { reads, .. }) => {
                            for read in reads.into_iter().rev() {
                                decided.entry(read.path).or_insert(read.sha256);
                            }
                        }
                        Ok(ReadRecord::Rewound { seq, to_seq }) => {
                            // Always back in the log, so the walk ends.
                            rewound_to = Some(to_seq.min(seq - 1));
                            break;
                        }
                        // Fail closed: what cannot be read does not count as read.
                        Err(StoreError::Corrupt(e)) => {
                            tracing::warn!(session = %id, error = %e, "a read record of the log cannot be read; it does not count");
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            if let Some(to_seq) = rewound_to {
                upper = to_seq;
                continue;
            }
            let Some(o) = origin else { break };
            followed += 1;
            if followed > MAX_ORIGIN_DEPTH {
                return Err(EngineError::Internal(format!(
                    "session {} has more than {MAX_ORIGIN_DEPTH} origins",
                    session.id
                )));
            }
            origin = engine
                .store
                .get_session(session.tenant_id, o.session_id)
                .await?
                .origin;
            (id, upper) = (o.session_id, o.seq);
        }
        let seen: HashMap<String, String> = decided
            .into_iter()
            .filter_map(|(path, sha)| sha.map(|sha| (path, sha)))
            .collect();
        tracing::debug!(
            session = %session.id,
            up_to,
            records,
            files = seen.len(),
            ms = started.elapsed().as_secs_f64() * 1000.0,
            "read-state rebuilt from the log"
        );
        Ok(seen)
    }
}
