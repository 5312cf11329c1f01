// The TypeScript client's own cost per call next to raw fetch, in the same run: `read_file`
// (`limit: 5`) from 8 concurrent sessions, one call per request, a fresh call id each. Rounds
// alternate raw and client so that both see the same service and machine.
//
//     TOOLEXEC_URL=… TOOLEXEC_API_KEY=… node clients/bench/bench.mjs [calls] [rounds]
//
// Needs clients/typescript built (npm ci && npm run build there). Prints calls/s, p50/p99 and
// the process CPU per call of each, and the client's overhead.
import { randomUUID } from "node:crypto";
import { cpuUsage } from "node:process";

import { Client } from "../typescript/dist/index.js";

const SESSIONS = 8;
const calls = Number(process.argv[2] ?? 400);
const rounds = Number(process.argv[3] ?? 3);
const url = (process.env.TOOLEXEC_URL ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
const key = process.env.TOOLEXEC_API_KEY ?? "";
const headers = { "content-type": "application/json", ...(key ? { authorization: `Bearer ${key}` } : {}) };

async function rawLoop(sid, n, lat) {
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const body = { calls: [{ id: `call_${randomUUID()}`, name: "read_file", arguments: { file_path: "a.txt", limit: 5 } }] };
    const r = await fetch(`${url}/v1/sessions/${sid}/calls`, { method: "POST", headers, body: JSON.stringify(body) });
    if (!r.ok) throw new Error(`${r.status}`);
    const result = (await r.json()).results[0];
    if (result.is_error) throw new Error(result.content);
    lat.push(performance.now() - t0);
  }
}

async function clientLoop(s, n, lat) {
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const r = await s.readFile("a.txt", { limit: 5 });
    if (r.is_error) throw new Error(r.content);
    lat.push(performance.now() - t0);
  }
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const client = new Client(url, key);
const sessions = [];
for (let i = 0; i < SESSIONS; i++) sessions.push(await client.session({ metadata: { bench: "clients" } }));
const file = Array.from({ length: 60 }, (_, i) => `line ${i}\n`).join("");
for (const s of sessions) await s.writeFile("a.txt", file);
await Promise.all(sessions.map((s) => clientLoop(s, 20, [])));
await Promise.all(sessions.map((s) => rawLoop(s.id, 20, [])));
const rows = { "raw fetch": [], "toolexec client": [] };
for (let round = 0; round < rounds; round++) {
  // Each round runs both, in alternating order (the machine's load drifts).
  const names = Object.keys(rows);
  for (const name of round % 2 === 0 ? names : names.reverse()) {
    const lat = [];
    const w0 = performance.now();
    const c0 = cpuUsage();
    if (name === "raw fetch") await Promise.all(sessions.map((s) => rawLoop(s.id, calls, lat)));
    else await Promise.all(sessions.map((s) => clientLoop(s, calls, lat)));
    const cpu = cpuUsage(c0);
    const wall = (performance.now() - w0) / 1000;
    lat.sort((a, b) => a - b);
    rows[name].push({
      calls_s: lat.length / wall, p50: lat[Math.floor(lat.length / 2)], p99: lat[Math.floor(lat.length * 0.99)],
      cpu_us: (cpu.user + cpu.system) / lat.length,
    });
  }
}
// The client's own CPU, without the network and the service: the same calls answered in-process
// (a fetch double) with a real answer of this run, one at a time.
const sample = await (await fetch(`${url}/v1/sessions/${sessions[0].id}/calls`, {
  method: "POST", headers,
  body: JSON.stringify({ calls: [{ id: "sample", name: "read_file", arguments: { file_path: "a.txt", limit: 5 } }] }),
})).text();
const info = JSON.stringify(sessions[0].info);
const double = async (input, init) => {
  const u = typeof input === "string" ? input : input.url;
  if (typeof input !== "string") await input.text();
  return new Response(u.endsWith("/calls") ? sample : info, { status: 200, headers: { "content-type": "application/json" } });
};
const realFetch = globalThis.fetch;
globalThis.fetch = double;
const offlineClient = await new Client({ url: "http://bench", apiKey: "key", fetch: double }).attach(sessions[0].id);
const offline = { "raw fetch": [], "toolexec client": [] };
const N = 5000;
for (let i = 0; i < 3; i++) {
  let c0 = cpuUsage();
  await rawLoop(sessions[0].id, N, []);
  let c = cpuUsage(c0);
  offline["raw fetch"].push((c.user + c.system) / N);
  c0 = cpuUsage();
  await clientLoop(offlineClient, N, []);
  c = cpuUsage(c0);
  offline["toolexec client"].push((c.user + c.system) / N);
}
globalThis.fetch = realFetch;
for (const s of sessions) await s.close();
const med = Object.fromEntries(Object.entries(rows).map(([n, rs]) => [n, Object.fromEntries(["calls_s", "p50", "p99", "cpu_us"].map((k) => [k, median(rs.map((r) => r[k]))]))]));
console.log(`typescript, read_file, ${SESSIONS} concurrent sessions, ${rounds} rounds x ${calls * SESSIONS} calls each (medians)`);
console.log(`${"".padEnd(18)} ${"calls/s".padStart(9)} ${"p50 ms".padStart(8)} ${"p99 ms".padStart(8)} ${"CPU us/call".padStart(12)}`);
for (const [n, m] of Object.entries(med)) {
  console.log(`${n.padEnd(18)} ${m.calls_s.toFixed(0).padStart(9)} ${m.p50.toFixed(2).padStart(8)} ${m.p99.toFixed(2).padStart(8)} ${m.cpu_us.toFixed(0).padStart(12)}`);
}
const ratios = rows["raw fetch"].map((r, i) => r.calls_s / rows["toolexec client"][i].calls_s).sort((a, b) => a - b);
console.log(`per round, raw calls/s over client calls/s: ${ratios.map((x) => x.toFixed(2)).join(" ")}`);
console.log(`in-process (no network, no service), CPU per call: ${Object.entries(offline).map(([k, v]) => `${k} ${Math.min(...v).toFixed(0)} us`).join(", ")}`);
const raw = med["raw fetch"];
const cli = med["toolexec client"];
const pct = (a, b) => `${(100 * (a / b - 1)).toFixed(1)} %`;
console.log(`client overhead: throughput ${pct(raw.calls_s, cli.calls_s)}, p50 ${pct(cli.p50, raw.p50)}, CPU per call ${(cli.cpu_us - raw.cpu_us).toFixed(0)} us`);
