-- Read-before-write state comes from the log: a node that builds a session's runtime (after a
-- take-over, a restart, an eviction, for a fork) folds what the session had read from the
-- `reads` of its `invocation.finished` events, newest first, and follows its
-- `workspace.rewound` events back (what was read after a rewind's `to_seq` no longer counts).
-- This partial index makes that fold read those events alone, however long the log is; the
-- other events (most finished calls read nothing) are not in it.
CREATE INDEX events_reads ON events (session_id, seq)
    WHERE kind = 'workspace.rewound' OR (kind = 'invocation.finished' AND data ? 'reads');
