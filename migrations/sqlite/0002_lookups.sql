-- Lookups that must not grow with a session's log or a tenant's history (same as on Postgres).

-- `process_read` / `process_kill` of a process this node does not know: its `process.started`
-- event by one probe. The store's query uses exactly this expression, so SQLite can use it.
CREATE INDEX events_process_started ON events (session_id, json_extract(data, '$.process_id'))
    WHERE kind = 'process.started';

-- The per-tenant cap on open sessions counts a tenant's active sessions at every create.
CREATE INDEX sessions_active_tenant ON sessions (tenant_id) WHERE status = 'active';
