"""The Python client's own cost per call next to raw httpx2, in the same run: `read_file`
(`limit: 5`) from 8 concurrent sessions, one call per request, a fresh call id each, on one
asyncio loop. Rounds alternate raw and client so that both see the same service and machine.

    TOOLEXEC_URL=… TOOLEXEC_API_KEY=… python3 clients/bench/bench.py [--calls 400] [--rounds 3]

Prints calls/s, p50/p99 latency and the process CPU per call (the client's own work: building
the request, JSON, pydantic, retry bookkeeping) of each, and the client's overhead.
(clients/bench/run starts the service and runs both this and bench.mjs.)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid

import httpx2

from toolexec import AsyncClient, AsyncSession

SESSIONS = 8


async def raw_loop(http: httpx2.AsyncClient, url: str, headers: dict[str, str], sid: str, n: int, lat: list[float]) -> None:
    for _ in range(n):
        t0 = time.perf_counter()
        body = {"calls": [{"id": f"call_{uuid.uuid4().hex}", "name": "read_file", "arguments": {"file_path": "a.txt", "limit": 5}}]}
        r = await http.post(f"{url}/v1/sessions/{sid}/calls", json=body, headers=headers)
        r.raise_for_status()
        result = json.loads(r.content)["results"][0]
        assert not result["is_error"], result
        lat.append(time.perf_counter() - t0)


async def client_loop(s: AsyncSession, n: int, lat: list[float]) -> None:
    for _ in range(n):
        t0 = time.perf_counter()
        r = await s.read_file("a.txt", limit=5)
        assert not r.is_error, r
        lat.append(time.perf_counter() - t0)


def summary(name: str, lat: list[float], wall: float, cpu: float) -> dict[str, float]:
    lat = sorted(lat)
    return {
        "name": name, "calls_s": len(lat) / wall, "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[int(len(lat) * 0.99)], "cpu_us": 1e6 * cpu / len(lat),
    }  # type: ignore[dict-item]


async def offline_cost(answer: bytes, session: dict[str, object], n: int = 5000) -> dict[str, float]:
    async def handler(request: httpx2.Request) -> httpx2.Response:
        await request.aread()
        if request.url.path.endswith("/calls"):
            return httpx2.Response(200, content=answer, headers={"content-type": "application/json"})
        return httpx2.Response(200, json=session)

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    client = AsyncClient("http://bench", "key", http=http)
    s = await client.attach(str(session["id"]))
    headers = {"authorization": "Bearer key"}
    out: dict[str, list[float]] = {"raw httpx2": [], "toolexec client": []}
    for _ in range(3):
        c0 = time.process_time()
        await raw_loop(http, "http://bench", headers, s.id, n, [])
        out["raw httpx2"].append(time.process_time() - c0)
        c0 = time.process_time()
        await client_loop(s, n, [])
        out["toolexec client"].append(time.process_time() - c0)
    return {k: 1e6 * min(v) / n for k, v in out.items()}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=400, help="calls per session per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    url = os.environ.get("TOOLEXEC_URL", "http://127.0.0.1:8080").rstrip("/")
    key = os.environ.get("TOOLEXEC_API_KEY", "")
    headers = {"authorization": f"Bearer {key}"} if key else {}
    limits = httpx2.Limits(max_connections=100, max_keepalive_connections=100)
    async with AsyncClient(url, key) as client, httpx2.AsyncClient(timeout=httpx2.Timeout(30.0, read=None), limits=limits) as http:
        sessions = [await client.session(metadata={"bench": "clients"}) for _ in range(SESSIONS)]
        for s in sessions:
            await s.write_file("a.txt", "".join(f"line {i}\n" for i in range(60)))
        # Warm both paths (connections, caches).
        await asyncio.gather(*(client_loop(s, 20, []) for s in sessions))
        await asyncio.gather(*(raw_loop(http, url, headers, s.id, 20, []) for s in sessions))
        rows: dict[str, list[dict[str, float]]] = {"raw httpx2": [], "toolexec client": []}
        names = list(rows)
        for i in range(args.rounds):
            # Each round runs both, in alternating order (the machine's load drifts).
            for name in names if i % 2 == 0 else names[::-1]:
                lat: list[float] = []
                w0, c0 = time.perf_counter(), time.process_time()
                if name == "raw httpx2":
                    await asyncio.gather(*(raw_loop(http, url, headers, s.id, args.calls, lat) for s in sessions))
                else:
                    await asyncio.gather(*(client_loop(s, args.calls, lat) for s in sessions))
                rows[name].append(summary(name, lat, time.perf_counter() - w0, time.process_time() - c0))
        # The client's own CPU, without the network and the service: the same calls answered
        # in-process (httpx2.MockTransport) with a real answer of this run, one task at a time.
        sample = (await http.post(f"{url}/v1/sessions/{sessions[0].id}/calls", headers=headers, json={
            "calls": [{"id": "sample", "name": "read_file", "arguments": {"file_path": "a.txt", "limit": 5}}]})).content
        offline = await offline_cost(sample, sessions[0].info.model_dump(mode="json"))
        for s in sessions:
            await s.close()
    med = {name: {k: statistics.median(r[k] for r in rs) for k in ("calls_s", "p50_ms", "p99_ms", "cpu_us")} for name, rs in rows.items()}
    print(f"python, read_file, {SESSIONS} concurrent sessions, {args.rounds} rounds x {args.calls * SESSIONS} calls each (medians)")
    print(f"{'':18} {'calls/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/call':>12}")
    for name, m in med.items():
        print(f"{name:18} {m['calls_s']:9.0f} {m['p50_ms']:8.2f} {m['p99_ms']:8.2f} {m['cpu_us']:12.0f}")
    ratios = sorted(r["calls_s"] / c["calls_s"] for r, c in zip(rows["raw httpx2"], rows["toolexec client"]))
    print("per round, raw calls/s over client calls/s: " + " ".join(f"{x:.2f}" for x in ratios))
    raw, cli = med["raw httpx2"], med["toolexec client"]
    print("in-process (no network, no service), CPU per call: " + ", ".join(f"{k} {v:.0f} us" for k, v in offline.items()))
    print(f"client overhead: throughput {100 * (raw['calls_s'] / cli['calls_s'] - 1):+.1f} %, "
          f"p50 {100 * (cli['p50_ms'] / raw['p50_ms'] - 1):+.1f} %, CPU per call {cli['cpu_us'] - raw['cpu_us']:+.0f} us")


if __name__ == "__main__":
    asyncio.run(main())
