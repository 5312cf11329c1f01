-- As on Postgres: the events a session's read-state is folded from, without the rest of its
-- log (the finished calls that read files, and the rewinds).
CREATE INDEX events_reads ON events (session_id, seq)
    WHERE kind = 'workspace.rewound'
       OR (kind = 'invocation.finished' AND json_type(data, '$.reads') IS NOT NULL);
