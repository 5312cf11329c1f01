#!/usr/bin/env bash
# What Postgres spends on a recorded read's rows, apart from the service (docs/benchmarks.md,
# issue 28, "The floor, every part measured").
#
# usage: crates/toolexec-bench/pg_rows/run.sh [SECONDS]
# Creates a database with the real schema (migrations/postgres, in order), 15 sessions, then
# times with `pgbench` (one connection, synchronous_commit off: CPU, not WAL flushes) statements
# shaped like one group commit of 15 read_file calls (one per session): a bare round trip, the
# event rows alone, the invocation and event rows (as recorded), the same with the sessions'
# FOR UPDATE and last_seq update, and the invocation and event rows without the three foreign
# keys. Prints ms per statement and µs per call; drops the database. Postgres on
# 127.0.0.1:5432, user postgres, trust auth (as the tests). The tables grow during the run, so
# the order is fixed and each statement runs twice, alternating.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
seconds=${1:-10}
db=pg_rows_$$
psql_() { psql -h 127.0.0.1 -U postgres -v ON_ERROR_STOP=1 -q "$@"; }
trap 'psql_ -d postgres -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true' EXIT
psql_ -d postgres -c "CREATE DATABASE $db"
for f in "$root"/migrations/postgres/*.sql; do psql_ -d "$db" -f "$f" >/dev/null; done
psql_ -d "$db" -f "$here/setup.sql"
run() {
  local ms
  ms=$(PGOPTIONS='-c synchronous_commit=off' pgbench -n -h 127.0.0.1 -U postgres -c 1 \
    -T "$seconds" -f "$here/$1.sql" "$db" 2>/dev/null | sed -n 's/^latency average = \([0-9.]*\) ms$/\1/p')
  printf '%-22s %6.3f ms per statement  %5.1f µs per call\n' "$1" "$ms" "$(echo "$ms * 1000 / 15" | bc -l)"
}
for _ in 1 2; do
  for s in round_trip events_only recorded recorded_locked; do run "$s"; done
done
psql_ -d "$db" -c "ALTER TABLE invocations DROP CONSTRAINT invocations_session_id_fkey" \
  -c "ALTER TABLE events DROP CONSTRAINT events_session_id_fkey" \
  -c "ALTER TABLE events DROP CONSTRAINT events_invocation_id_fkey"
echo "(without the three foreign keys)"
run recorded
run recorded
