-- 15 active sessions of one tenant, and the sequence that numbers the events.
INSERT INTO tenants (id, name) VALUES ('00000000-0000-0000-0000-000000000001', 'bench');
INSERT INTO sessions (id, tenant_id, status, policy, env, metadata, created_at)
SELECT gen_random_uuid(), '00000000-0000-0000-0000-000000000001', 'active', '{}', '{}', '{}', now()
FROM generate_series(1, 15);
CREATE SEQUENCE bench_seq;
