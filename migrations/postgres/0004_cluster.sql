-- Replicas that share this database. A session lives on the node that last held its lease
-- (session_leases.node, kept after the lease is released): a request for it that reaches
-- another node is forwarded there while that node is alive, and the next node to get a call for
-- a session whose node is gone takes it over (its workspace rebuilt from the log).
CREATE TABLE nodes (
    node         text        PRIMARY KEY,
    -- Where the other replicas reach it (`cluster.advertise_url`); NULL: it does not take
    -- forwarded requests.
    address      text,
    -- Its last heartbeat (every third of `limits.lease_ttl_ms`): older than the TTL, it is gone.
    heartbeat_at timestamptz NOT NULL,
    -- Shutting down: it finishes what it runs and hands its sessions over; requests for them wait.
    draining     boolean     NOT NULL DEFAULT false
);
