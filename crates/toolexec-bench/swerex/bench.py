"""run_in_session("true") through the official SWE-ReX client (swe-rex 1.4.0), against toolexec's
SWE-ReX API (sandboxed, recorded) and against a real `swerex-remote` on the same machine, in the
same run, at 1 and 8 clients (8 bash sessions).

    cargo build --profile dist -p toolexec-server
    VENV=$(.ci/swerex)
    $VENV/bin/python crates/toolexec-bench/swerex/bench.py --seconds 10

It starts both servers itself: the release binary (`--toolexec-bin`, SQLite in a temporary data
directory unless `--database-url` names a Postgres) with an API key, and `swerex-remote` from the
venv this runs in, with an auth token. Each client is an asyncio task of this process calling
RemoteRuntime.run_in_session in a loop on a bash session of its own; "8 clients" is 8 bash
sessions of one toolexec session (swerex-remote: of its one runtime), and, as a second toolexec
row, 8 toolexec sessions with one bash session each. Prints p50/p99 (ms), calls/s, and the ratio
of toolexec's calls/s to swerex-remote's.
"""
import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from swerex.runtime.abstract import BashAction, CreateBashSessionRequest
from swerex.runtime.remote import RemoteRuntime


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_toolexec(binary, database_url):
    binary = os.path.abspath(binary)
    data = tempfile.mkdtemp(prefix="swerex-bench-")
    os.chmod(data, 0o700)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TOOLEXEC_DATA_DIR": data}
    if database_url:
        env["TOOLEXEC_DATABASE_URL"] = database_url
    key = subprocess.run(
        [binary, "keys", "create", "--tenant", "bench"], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()
    port = free_port()
    env.update(TOOLEXEC_BIND=f"127.0.0.1:{port}", TOOLEXEC_LOG_FORMAT="json", RUST_LOG="warn")
    proc = subprocess.Popen([binary, "serve"], env=env, cwd=data, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/healthz")
    return proc, base, key, data


def start_swerex(token):
    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "swerex-remote")
    proc = subprocess.Popen(
        [exe, "--host", "127.0.0.1", "--port", str(port), "--auth-token", token],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/", headers={"X-API-Key": token})
    return proc, base


def wait_http(url, headers=None):
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2):
                return
        except Exception:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within 60 s")


def new_session(base, key):
    req = urllib.request.Request(
        f"{base}/v1/sessions",
        data=b"{}",
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(req) as r:
        return json.load(r)["id"]


async def measure(runtimes, seconds, warmup=10):
    """runtimes: one (RemoteRuntime, bash session name) per client."""
    for rt, name in runtimes:
        await rt.create_session(CreateBashSessionRequest(session=name))
        for _ in range(warmup):
            await rt.run_in_session(BashAction(command="true", session=name))
    latencies = []
    stop = time.perf_counter() + seconds

    async def client(rt, name):
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            obs = await rt.run_in_session(BashAction(command="true", session=name))
            latencies.append(time.perf_counter() - t0)
            assert obs.exit_code == 0, obs

    t0 = time.perf_counter()
    await asyncio.gather(*(client(rt, name) for rt, name in runtimes))
    wall = time.perf_counter() - t0
    latencies.sort()
    p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000  # noqa: E731
    return {"calls": len(latencies), "per_s": len(latencies) / wall, "p50": p(0.50), "p99": p(0.99)}


def row(label, clients, m):
    print(f"{label:<38} {clients:>7} {m['calls']:>7} {m['per_s']:>9.1f} {m['p50']:>8.2f} {m['p99']:>8.2f}", flush=True)


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--toolexec-bin", default="target/dist/toolexec")
    ap.add_argument("--database-url", default=os.environ.get("TOOLEXEC_BENCH_DATABASE_URL", ""))
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    token = "bench-token"
    tx, tx_base, key, data = start_toolexec(args.toolexec_bin, args.database_url)
    sr, sr_base = start_swerex(token)
    try:
        print(f"{'target':<38} {'clients':>7} {'calls':>7} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
        results = {}
        for clients in (1, 8):
            sid = new_session(tx_base, key)
            rts = [
                (RemoteRuntime(host=f"{tx_base}/v1/sessions/{sid}/swerex", auth_token=key, timeout=30), f"b{i}")
                for i in range(clients)
            ]
            results[("toolexec", clients)] = m = await measure(rts, args.seconds)
            row("toolexec (1 session, sandboxed, recorded)", clients, m)
            rts = [
                (RemoteRuntime(host=sr_base, auth_token=token, timeout=30), f"c{clients}-{i}")
                for i in range(clients)
            ]
            results[("swerex", clients)] = m = await measure(rts, args.seconds)
            row("swerex-remote 1.4.0", clients, m)
            if clients > 1:
                rts = []
                for i in range(clients):
                    sid = new_session(tx_base, key)
                    rts.append(
                        (RemoteRuntime(host=f"{tx_base}/v1/sessions/{sid}/swerex", auth_token=key, timeout=30), "b")
                    )
                m = await measure(rts, args.seconds)
                row("toolexec (a session per client)", clients, m)
        for clients in (1, 8):
            a, b = results[("toolexec", clients)], results[("swerex", clients)]
            print(
                f"{clients} client(s): toolexec/swerex-remote calls/s = {a['per_s'] / b['per_s']:.1f}x; "
                f"p50 {a['p50']:.2f} ms vs {b['p50']:.2f} ms"
            )
    finally:
        for p in (tx, sr):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(data, ignore_errors=True)


asyncio.run(main())
