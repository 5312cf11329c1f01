-- Lookups that must not grow with a session's log or a tenant's history.

-- `process_read` / `process_kill` of a process this node does not know: its `process.started`
-- event, found by one probe instead of paging through the session's log. Partial: only those
-- events are indexed, so the index stays small however many events a session has.
CREATE INDEX events_process_started ON events (session_id, (data->>'process_id'))
    WHERE kind = 'process.started';

-- The per-tenant cap on open sessions counts a tenant's active sessions at every create; closed
-- ones, the bulk over time, are not in this index.
CREATE INDEX sessions_active_tenant ON sessions (tenant_id) WHERE status = 'active';
