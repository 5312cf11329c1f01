-- Time travel: sessions that start from another session's state (forks and replays), the
-- reports of verify replays, and the per-session lease that keeps one node at a time running a
-- session's calls.

-- A fork or a replay starts as `origin_session_id` was right after its event `origin_seq`; its
-- workspace is rebuilt from that session's log, then its own.
ALTER TABLE sessions ADD COLUMN origin_kind text CHECK (origin_kind IN ('fork', 'replay'));
ALTER TABLE sessions ADD COLUMN origin_session_id uuid REFERENCES sessions (id);
ALTER TABLE sessions ADD COLUMN origin_seq bigint;

CREATE INDEX sessions_origin ON sessions (origin_session_id) WHERE origin_session_id IS NOT NULL;

CREATE TABLE replays (
    id                uuid        PRIMARY KEY,
    tenant_id         uuid        NOT NULL REFERENCES tenants (id),
    source_session_id uuid        NOT NULL REFERENCES sessions (id),
    -- The session that re-ran the calls.
    session_id        uuid        NOT NULL REFERENCES sessions (id),
    status            text        NOT NULL CHECK (status IN ('running', 'finished', 'failed')),
    -- The report as the API returns it (calls, divergences, counts).
    report            jsonb       NOT NULL,
    created_at        timestamptz NOT NULL,
    finished_at       timestamptz
);

CREATE INDEX replays_source ON replays (source_session_id);

-- Which node runs a session's calls: held while the node serves the session, renewed by its
-- heartbeat, free once released or expired. Another node waits for it rather than run a call
-- beside the holder's.
CREATE TABLE session_leases (
    session_id uuid        PRIMARY KEY REFERENCES sessions (id),
    node       text        NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE INDEX session_leases_node ON session_leases (node);
