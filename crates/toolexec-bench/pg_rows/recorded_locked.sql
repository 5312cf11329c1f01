-- recorded.sql under the sessions' row locks, with their last_seq moved, as a group commit does.
WITH locked AS MATERIALIZED (SELECT id, last_seq FROM sessions ORDER BY id FOR UPDATE),
calls AS MATERIALIZED (
  SELECT gen_random_uuid() AS id, id AS session_id, gen_random_uuid()::text AS call_id
  FROM locked),
new_invocations AS (
  INSERT INTO invocations (id, session_id, call_id, name, arguments, arguments_sha256, read_only,
    capabilities, node, status, is_error, content, started_at, finished_at, duration_ms,
    started_seq, finished_seq)
  SELECT id, session_id, call_id, 'read_file', '{"file_path": "src/main.rs", "limit": 5}', 'x',
    true, '["fs.read"]', 'bench', 'ok', false, '     1\tfn main() {', now(), now(), 0.1, 1, 1
  FROM calls),
new_events AS (
  INSERT INTO events (session_id, seq, kind, invocation_id, data, created_at)
  SELECT session_id, nextval('bench_seq'), 'invocation.finished', id, '{}', now() FROM calls)
UPDATE sessions AS s SET last_seq = s.last_seq + 1 FROM locked l WHERE s.id = l.id;
