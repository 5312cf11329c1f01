#!/usr/bin/env python3
"""Rows, commits, WAL and Postgres CPU per recorded read_file call (docs/benchmarks.md, issue 28).

usage: crates/toolexec-bench/rows_per_read.py TOOLEXEC_BINARY [CALLS] [CLIENTS]
Creates a database, starts `toolexec serve` on it (loopback, port 18xxx), makes CALLS read_file
calls (one per request, a fresh call id each) from CLIENTS threads, and prints the differences of
pg_stat_user_tables.n_tup_ins (invocations, events), pg_stat_database.xact_commit, WAL bytes and
the CPU time of the database's Postgres backends, divided by CALLS. Drops the database.
Postgres on 127.0.0.1:5432, user postgres, trust auth (as the tests). WAL bytes are the whole
cluster's: anything else writing meanwhile counts too. A debug build of the binary serves: the
rows and statements per call do not depend on it, Postgres's CPU per call a little (batch sizes).
"""
import json, os, subprocess, sys, tempfile, threading, time, urllib.request, uuid

binary = sys.argv[1]
calls = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
clients = int(sys.argv[3]) if len(sys.argv) > 3 else 8
db = "rows_per_read_" + uuid.uuid4().hex[:8]
PSQL = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-Atq"]

def sql(q, dbname="postgres"):
    return subprocess.run(PSQL + ["-d", dbname, "-c", q], check=True, capture_output=True, text=True).stdout.strip()

def backend_cpu_ticks():
    pids = sql(f"select pid from pg_stat_activity where datname = '{db}'").split()
    total = 0
    for pid in pids:
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except OSError:
            pass
    return total

def counters():
    ins = dict(
        line.split("|") for line in sql(
            "select relname, n_tup_ins from pg_stat_user_tables where relname in ('invocations','events')",
            db).splitlines())
    xact = int(sql(f"select xact_commit from pg_stat_database where datname = '{db}'"))
    lsn = sql("select pg_current_wal_lsn() - '0/0'::pg_lsn")
    return {k: int(v) for k, v in ins.items()}, xact, int(float(lsn)), backend_cpu_ticks()

sql(f"create database {db}")
port = 18000 + os.getpid() % 1000
data = tempfile.mkdtemp()
env = dict(os.environ, TOOLEXEC_DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{db}",
           TOOLEXEC_BIND=f"127.0.0.1:{port}", TOOLEXEC_DATA_DIR=data, TOOLEXEC_LOG_FORMAT="json",
           RUST_LOG="warn")
server = subprocess.Popen([binary, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=open(data + "/log", "w"))
base = f"http://127.0.0.1:{port}"

def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)

try:
    for _ in range(300):
        try:
            urllib.request.urlopen(base + "/healthz", timeout=1)
            break
        except Exception:
            time.sleep(0.1)
    sessions = [post("/v1/sessions", {"files": {"a.txt": "".join(f"line {i}\n" for i in range(60))}})["id"]
                for _ in range(clients)]
    # Warm up (and make every session's state cached), then measure.
    for sid in sessions:
        post(f"/v1/sessions/{sid}/calls", {"calls": [{"id": "warm", "name": "read_file", "arguments": {"file_path": "a.txt", "limit": 5}}]})
    time.sleep(11)  # idle backends flush their statistics every 10 s (Postgres 15)
    before = counters()
    errors = []
    def client(i):
        sid = sessions[i]
        for n in range(calls // clients):
            r = post(f"/v1/sessions/{sid}/calls", {"calls": [{"id": f"c{n}", "name": "read_file", "arguments": {"file_path": "a.txt", "limit": 5}}]})
            if r["results"][0]["status"] != "ok":
                errors.append(r)
    t0 = time.time()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads: t.start()
    for t in threads: t.join()
    elapsed = time.time() - t0
    time.sleep(11)  # idle backends flush their statistics every 10 s (Postgres 15)
    after = counters()
    n = (calls // clients) * clients
    ins = {k: (after[0][k] - before[0].get(k, 0)) / n for k in after[0]}
    print(json.dumps({
        "binary": binary, "calls": n, "clients": clients, "errors": len(errors),
        "calls_per_s": round(n / elapsed, 1),
        "invocation_rows_per_call": round(ins.get("invocations", 0), 3),
        "event_rows_per_call": round(ins.get("events", 0), 3),
        "commits_per_call": round((after[1] - before[1]) / n, 3),
        "wal_bytes_per_call": round((after[2] - before[2]) / n, 1),
        "postgres_cpu_us_per_call": round((after[3] - before[3]) * 10_000 / n, 1),
    }))
finally:
    server.terminate()
    server.wait(timeout=30)
    time.sleep(0.5)
    sql(f"drop database if exists {db} with (force)")
