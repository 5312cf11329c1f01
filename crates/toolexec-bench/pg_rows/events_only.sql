-- One event per call carrying what the invocation row holds: no invocation row.
WITH calls AS MATERIALIZED (SELECT id AS session_id FROM sessions LIMIT 15)
INSERT INTO events (session_id, seq, kind, invocation_id, data, created_at)
SELECT session_id, nextval('bench_seq'), 'invocation.finished', NULL,
  '{"call_id": "c", "name": "read_file", "arguments": {"file_path": "src/main.rs", "limit": 5}, "content": "     1\tfn main() {"}',
  now()
FROM calls;
