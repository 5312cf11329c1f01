-- Replicas that share this database (see the Postgres migration of the same name). An
-- embedded SQLite store is one node's, so this table only ever holds that node.
CREATE TABLE nodes (
    node         TEXT    PRIMARY KEY NOT NULL,
    address      TEXT,
    -- Milliseconds since the Unix epoch (compared as numbers).
    heartbeat_at INTEGER NOT NULL,
    draining     INTEGER NOT NULL DEFAULT 0
);
