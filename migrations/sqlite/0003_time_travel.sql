-- Time travel (as on Postgres): forks and replays, replay reports, per-session leases.

ALTER TABLE sessions ADD COLUMN origin_kind TEXT CHECK (origin_kind IN ('fork', 'replay'));
ALTER TABLE sessions ADD COLUMN origin_session_id BLOB REFERENCES sessions (id);
ALTER TABLE sessions ADD COLUMN origin_seq INTEGER;

CREATE INDEX sessions_origin ON sessions (origin_session_id) WHERE origin_session_id IS NOT NULL;

CREATE TABLE replays (
    id                BLOB PRIMARY KEY NOT NULL,
    tenant_id         BLOB NOT NULL REFERENCES tenants (id),
    source_session_id BLOB NOT NULL REFERENCES sessions (id),
    session_id        BLOB NOT NULL REFERENCES sessions (id),
    status            TEXT NOT NULL CHECK (status IN ('running', 'finished', 'failed')),
    report            TEXT NOT NULL,
    created_at        TEXT NOT NULL,
    finished_at       TEXT
);

CREATE INDEX replays_source ON replays (source_session_id);

CREATE TABLE session_leases (
    session_id BLOB    PRIMARY KEY NOT NULL REFERENCES sessions (id),
    node       TEXT    NOT NULL,
    -- Milliseconds since the Unix epoch (compared as numbers).
    expires_at INTEGER NOT NULL
);

CREATE INDEX session_leases_node ON session_leases (node);
