-- The recording store. Every table a session touches is keyed so that a session's rows sit
-- together; the event log is append-only (see the trigger at the end).

CREATE TABLE tenants (
    id         uuid        PRIMARY KEY,
    name       text        NOT NULL UNIQUE,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id         uuid        PRIMARY KEY,
    tenant_id  uuid        NOT NULL REFERENCES tenants (id),
    -- Only the hash of a key is stored; `prefix` is a short non-secret part for humans.
    key_sha256 text        NOT NULL UNIQUE,
    prefix     text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

CREATE INDEX api_keys_tenant_id ON api_keys (tenant_id);

CREATE TABLE sessions (
    id         uuid        PRIMARY KEY,
    tenant_id  uuid        NOT NULL REFERENCES tenants (id),
    status     text        NOT NULL CHECK (status IN ('active', 'closed')),
    tools      jsonb,
    policy     jsonb       NOT NULL,
    env        jsonb       NOT NULL,
    metadata   jsonb       NOT NULL,
    -- The seq of the newest event; the next one is last_seq + 1, assigned under FOR UPDATE.
    last_seq   bigint      NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL,
    closed_at  timestamptz
);

-- Listing a tenant's sessions newest first (ids are UUIDv7, so id order is creation order).
CREATE INDEX sessions_tenant_id_id ON sessions (tenant_id, id);

CREATE TABLE blobs (
    sha256     text        PRIMARY KEY,
    size       bigint      NOT NULL,
    data       bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE invocations (
    id               uuid             PRIMARY KEY,
    session_id       uuid             NOT NULL REFERENCES sessions (id),
    call_id          text             NOT NULL,
    name             text             NOT NULL,
    arguments        jsonb            NOT NULL,
    arguments_sha256 text             NOT NULL,
    read_only        boolean          NOT NULL,
    capabilities     jsonb            NOT NULL,
    -- The service instance that runs it: at start-up an instance interrupts only its own.
    node             text             NOT NULL,
    status           text             NOT NULL,
    is_error         boolean          NOT NULL DEFAULT false,
    content          text,
    truncated        jsonb,
    output_chars     bigint,
    output_sha256    text,
    started_at       timestamptz      NOT NULL,
    finished_at      timestamptz,
    duration_ms      double precision,
    started_seq      bigint           NOT NULL,
    finished_seq     bigint,
    UNIQUE (session_id, call_id)
);

-- Start-up recovery looks for the running invocations of one node; finished ones are the bulk.
CREATE INDEX invocations_running_node ON invocations (node) WHERE status = 'running';

CREATE TABLE events (
    session_id    uuid        NOT NULL REFERENCES sessions (id),
    seq           bigint      NOT NULL CHECK (seq > 0),
    kind          text        NOT NULL,
    invocation_id uuid        REFERENCES invocations (id),
    data          jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, seq)
);

CREATE INDEX events_invocation_id ON events (invocation_id) WHERE invocation_id IS NOT NULL;

-- The log is append-only by construction: whatever the application does, rows never change.
CREATE FUNCTION events_refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events are append-only: % refused', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE TRIGGER events_append_only_rows
    BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_refuse_change();

CREATE TRIGGER events_append_only_truncate
    BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_refuse_change();
