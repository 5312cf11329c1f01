-- The invocation row and its one event per call, as a read-only call is recorded.
WITH calls AS MATERIALIZED (
  SELECT gen_random_uuid() AS id, id AS session_id, gen_random_uuid()::text AS call_id
  FROM sessions LIMIT 15),
new_invocations AS (
  INSERT INTO invocations (id, session_id, call_id, name, arguments, arguments_sha256, read_only,
    capabilities, node, status, is_error, content, started_at, finished_at, duration_ms,
    started_seq, finished_seq)
  SELECT id, session_id, call_id, 'read_file', '{"file_path": "src/main.rs", "limit": 5}', 'x',
    true, '["fs.read"]', 'bench', 'ok', false, '     1\tfn main() {', now(), now(), 0.1, 1, 1
  FROM calls)
INSERT INTO events (session_id, seq, kind, invocation_id, data, created_at)
SELECT session_id, nextval('bench_seq'), 'invocation.finished', id, '{}', now() FROM calls;
