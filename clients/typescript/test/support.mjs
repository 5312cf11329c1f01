// The compiled service on a store (SQLite or Postgres), a TCP proxy that breaks connections on
// purpose, and a scripted model server: what the suites drive the client against.
// TOOLEXEC_BIN names the binary (default: target/debug/toolexec of this repository);
// TOOLEXEC_TEST_DATABASE_URL the Postgres superuser connection, under which each suite creates
// a database of its own and drops it after.
import { execFileSync, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createServer as createHttpServer } from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
const BIN = process.env.TOOLEXEC_BIN ?? join(REPO, "target/debug/toolexec");
const ADMIN_URL = process.env.TOOLEXEC_TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/postgres";
export const STORES = ["sqlite", "postgres"];

const psql = (sql) => execFileSync("psql", [ADMIN_URL, "-qAtc", sql], { stdio: "pipe" });

export async function freePort() {
  const srv = net.createServer();
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  const { port } = srv.address();
  await new Promise((r) => srv.close(r));
  return port;
}

/** Starts the service; `await service.stop()` ends it and drops its database. */
export async function startService(store) {
  const data = mkdtempSync(join(tmpdir(), `toolexec-ts-${store}-`));
  const port = await freePort();
  const env = {
    PATH: "/usr/local/bin:/usr/bin:/bin",
    TOOLEXEC_DATA_DIR: data,
    TOOLEXEC_BIND: `127.0.0.1:${port}`,
    TOOLEXEC_LOG_FORMAT: "json",
    RUST_LOG: "warn",
    // A batch longer than this is answered 503 still_running (the retry test needs one).
    TOOLEXEC_LIMITS__REQUEST_TIMEOUT_MS: "3000",
  };
  let db = null;
  if (store === "postgres") {
    db = `toolexec_tsclient_${randomBytes(6).toString("hex")}`;
    psql(`CREATE DATABASE ${db}`);
    env.TOOLEXEC_DATABASE_URL = ADMIN_URL.replace(/\/[^/]*$/, `/${db}`);
  }
  const apiKey = execFileSync(BIN, ["keys", "create", "--tenant", "tsclient"], { env, cwd: data, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] })
    .trim()
    .split("\n")
    .pop();
  const log = openSync(join(data, "server.log"), "w");
  const child = spawn(BIN, ["serve"], { env, cwd: data, stdio: ["ignore", log, log] });
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 60_000;
  for (;;) {
    try {
      if ((await fetch(`${url}/readyz`)).ok) break;
    } catch {}
    if (child.exitCode !== null || Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`toolexec did not start:\n${readFileSync(join(data, "server.log"), "utf8")}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    apiKey,
    store,
    async stop() {
      child.kill("SIGTERM");
      await new Promise((r) => (child.exitCode !== null ? r() : child.once("exit", r)));
      if (db) psql(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
      rmSync(data, { recursive: true, force: true });
    },
  };
}

/**
 * Forwards a loopback port to the service. `cut()` breaks every open connection;
 * `cutAfterResponseStarts(marker)` lets the next request containing `marker` reach the service,
 * then breaks its connection as the answer starts (the service acted; the client never hears).
 */
export async function startProxy(targetUrl) {
  const target = new URL(targetUrl);
  const sockets = new Set();
  const proxy = { cuts: 0, requests: [], marker: null };
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(target.port), target.hostname);
    let armed = false;
    sockets.add(client).add(upstream);
    client.on("data", (d) => {
      proxy.requests.push(d.subarray(0, 200).toString("latin1"));
      if (proxy.marker && d.includes(proxy.marker)) {
        proxy.marker = null;
        armed = true;
      }
      upstream.write(d);
    });
    upstream.on("data", (d) => {
      if (armed) {
        armed = false;
        proxy.cuts += 1;
        client.destroy();
        upstream.destroy();
        return;
      }
      client.write(d);
    });
    const end = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on("close", end).on("error", end);
    upstream.on("close", end).on("error", end);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  proxy.url = `http://127.0.0.1:${server.address().port}`;
  proxy.cut = () => {
    proxy.cuts += 1;
    for (const s of sockets) s.destroy();
    sockets.clear();
  };
  proxy.cutAfterResponseStarts = (marker) => {
    proxy.marker = marker;
  };
  proxy.close = () => {
    proxy.cut();
    return new Promise((r) => server.close(r));
  };
  return proxy;
}

/** A model API on loopback that answers the n-th POST with `script[n](body)`. */
export async function startModel(script) {
  const seen = [];
  const server = createHttpServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = JSON.parse(Buffer.concat(chunks).toString());
      seen.push(body);
      const data = JSON.stringify(script[seen.length - 1](body));
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(data) });
      res.end(data);
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${server.address().port}`, seen, close: () => new Promise((r) => server.close(r)) };
}

export async function eventsOf(service, sid) {
  const r = await fetch(`${service.url}/v1/sessions/${sid}/events?limit=1000`, {
    headers: { authorization: `Bearer ${service.apiKey}` },
  });
  return (await r.json()).events;
}

/** Whether a log event starts a call: its `invocation.started`, or the `invocation.finished` of a
 *  read recorded in one event (it carries the call's `arguments`). */
export function startsCall(e) {
  return e.kind === "invocation.started" || (e.kind === "invocation.finished" && e.data.arguments !== undefined);
}

export async function waitFor(cond, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error("timed out waiting");
    await new Promise((r) => setTimeout(r, 50));
  }
}
