-- The recording store, SQLite flavour: the same tables as on Postgres.
-- Types: uuids are 16-byte BLOBs (sqlx's encoding, which sorts like the uuid), timestamps are
-- RFC 3339 TEXT, JSON is TEXT. JSON columns are declared TEXT on purpose: a column declared
-- `JSON` would get NUMERIC affinity and turn a stored `5` into an integer.

CREATE TABLE tenants (
    id         BLOB    PRIMARY KEY NOT NULL,
    name       TEXT    NOT NULL UNIQUE,
    created_at TEXT    NOT NULL
);

CREATE TABLE api_keys (
    id         BLOB    PRIMARY KEY NOT NULL,
    tenant_id  BLOB    NOT NULL REFERENCES tenants (id),
    key_sha256 TEXT    NOT NULL UNIQUE,
    prefix     TEXT    NOT NULL,
    created_at TEXT    NOT NULL,
    revoked_at TEXT
);

CREATE INDEX api_keys_tenant_id ON api_keys (tenant_id);

CREATE TABLE sessions (
    id         BLOB    PRIMARY KEY NOT NULL,
    tenant_id  BLOB    NOT NULL REFERENCES tenants (id),
    status     TEXT    NOT NULL CHECK (status IN ('active', 'closed')),
    tools      TEXT,
    policy     TEXT    NOT NULL,
    env        TEXT    NOT NULL,
    metadata   TEXT    NOT NULL,
    last_seq   INTEGER NOT NULL DEFAULT 0,
    created_at TEXT    NOT NULL,
    closed_at  TEXT
);

CREATE INDEX sessions_tenant_id_id ON sessions (tenant_id, id);

CREATE TABLE blobs (
    sha256     TEXT    PRIMARY KEY NOT NULL,
    size       INTEGER NOT NULL,
    data       BLOB    NOT NULL,
    created_at TEXT    NOT NULL
);

CREATE TABLE invocations (
    id               BLOB    PRIMARY KEY NOT NULL,
    session_id       BLOB    NOT NULL REFERENCES sessions (id),
    call_id          TEXT    NOT NULL,
    name             TEXT    NOT NULL,
    arguments        TEXT    NOT NULL,
    arguments_sha256 TEXT    NOT NULL,
    read_only        BOOLEAN NOT NULL,
    capabilities     TEXT    NOT NULL,
    node             TEXT    NOT NULL,
    status           TEXT    NOT NULL,
    is_error         BOOLEAN NOT NULL DEFAULT 0,
    content          TEXT,
    truncated        TEXT,
    output_chars     INTEGER,
    output_sha256    TEXT,
    started_at       TEXT    NOT NULL,
    finished_at      TEXT,
    duration_ms      REAL,
    started_seq      INTEGER NOT NULL,
    finished_seq     INTEGER,
    UNIQUE (session_id, call_id)
);

CREATE INDEX invocations_running_node ON invocations (node) WHERE status = 'running';

CREATE TABLE events (
    session_id    BLOB    NOT NULL REFERENCES sessions (id),
    seq           INTEGER NOT NULL CHECK (seq > 0),
    kind          TEXT    NOT NULL,
    invocation_id BLOB    REFERENCES invocations (id),
    data          TEXT    NOT NULL,
    created_at    TEXT    NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;

CREATE INDEX events_invocation_id ON events (invocation_id) WHERE invocation_id IS NOT NULL;

-- The log is append-only by construction.
CREATE TRIGGER events_refuse_update BEFORE UPDATE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only: UPDATE refused');
END;

CREATE TRIGGER events_refuse_delete BEFORE DELETE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only: DELETE refused');
END;
