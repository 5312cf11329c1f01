// The TypeScript client against the compiled service (SQLite and Postgres), over HTTP.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import * as toolexec from "../dist/index.js";
import { BY_CODE as errors_by_code, Client } from "../dist/index.js";
import { REPO, STORES, eventsOf, freePort, startProxy, startService, waitFor } from "./support.mjs";

const text = (bytes) => new TextDecoder().decode(bytes);

test("the client's version is the API's, and every problem code has its class", () => {
  const doc = JSON.parse(readFileSync(join(REPO, "openapi/openapi.json"), "utf8"));
  const pkg = JSON.parse(readFileSync(join(REPO, "clients/typescript/package.json"), "utf8"));
  assert.equal(pkg.version, doc.info.version);
  assert.equal(toolexec.VERSION, doc.info.version);
  const codes = doc.components.schemas.ProblemCode.enum;
  assert.deepEqual(Object.keys(errors_by_code), codes);
  const bases = [toolexec.InvalidRequestError, toolexec.AuthError, toolexec.NotFoundError, toolexec.ConflictError, toolexec.UnavailableError];
  for (const [code, cls] of Object.entries(errors_by_code)) {
    assert.equal(cls.code, code);
    assert.ok(bases.some((b) => cls.prototype instanceof b), code);
  }
});

for (const store of STORES) {
  describe(`against the service on ${store}`, () => {
    let service;
    let client;
    before(async () => {
      service = await startService(store);
      client = new Client(service.url, service.apiKey);
    });
    after(async () => {
      await service?.stop();
    });

    test("a client from the environment; a session closed by withSession and by await using", async () => {
      process.env.TOOLEXEC_URL = service.url;
      process.env.TOOLEXEC_API_KEY = service.apiKey;
      const c = new Client();
      delete process.env.TOOLEXEC_URL;
      delete process.env.TOOLEXEC_API_KEY;
      const sid = await c.withSession({ env: { GREETING: "hi" }, metadata: { test: "env" } }, async (s) => {
        const r = await s.shell("echo $GREETING");
        assert.equal(r.status, "ok");
        assert.match(r.content, /hi\s*$/);
        return s.id;
      });
      assert.equal((await c.attach(sid)).info.status, "closed");
      const s = await c.session();
      await s[Symbol.asyncDispose]();
      assert.equal(s.info.status, "closed");
    });

    test("a wrong key is an AuthError with code, status and request id", async () => {
      const c = new Client({ url: service.url, apiKey: "not-a-key" });
      await assert.rejects(c.session(), (e) => {
        assert.ok(e instanceof toolexec.Unauthorized && e instanceof toolexec.AuthError);
        assert.equal(e.code, "unauthorized");
        assert.equal(e.status, 401);
        assert.ok(e.requestId);
        return true;
      });
    });

    test("calls, helpers and results; a failing tool is a result", async () => {
      await client.withSession({}, async (s) => {
        assert.equal((await s.writeFile("a.txt", "one\ntwo\n")).status, "ok");
        const r = await s.readFile("a.txt");
        assert.match(r.content, /two/);
        assert.ok(r.seq > 0);
        const results = await s.calls([
          { name: "shell", arguments: { command: "wc -l < a.txt" } },
          { id: "mine", name: "read_file", arguments: { file_path: "a.txt" } },
        ]);
        assert.equal(results[1].call_id, "mine");
        assert.match(results[0].content, /2\s*$/);
        const bad = await s.readFile("missing.txt");
        assert.ok(bad.is_error);
        assert.equal(bad.status, "error");
      });
    });

    test("bash keeps its state until restarted", async () => {
      await client.withSession({}, async (s) => {
        assert.ok(!(await s.bash("mkdir -p sub && cd sub && export FOO=bar && f() { echo fn; }")).is_error);
        let r = await s.bash("pwd; echo $FOO; f");
        assert.deepEqual(r.content.trimEnd().split("\n").slice(-3), ["/workspace/sub", "bar", "fn"], r.content);
        await s.bash(undefined, { restart: true });
        r = await s.bash("pwd; echo ${FOO:-unset}");
        assert.deepEqual(r.content.trimEnd().split("\n").slice(-2), ["/workspace", "unset"], r.content);
      });
    });

    test("a terminal is written, read and closed", async () => {
      await client.withSession({}, async (s) => {
        const t = await s.terminal("python3 -q -i");
        assert.ok(t.running, t.started.content);
        const id = t.sessionId;
        assert.ok(!(await t.write("x = 6 * 7\n", { yield_time_ms: 1000 })).is_error);
        const r = await t.write("print(x)\n", { yield_time_ms: 2000 });
        assert.match(r.content, /42/);
        await t.close();
        await waitFor(async () => !t.running || /exited/.test((await t.read({ yield_time_ms: 1000 })).content));
        const gone = await s.call("write_stdin", { session_id: id, chars: "", yield_time_ms: 250 });
        assert.ok(gone.is_error);
        assert.match(gone.content, new RegExp(`Unknown process id ${id}`));
      });
    });

    test("problems throw their classes; a 409 is not retried", async () => {
      await assert.rejects(client.attach("00000000-0000-7000-8000-000000000000"), toolexec.NotFound);
      const s = await client.session();
      await s.call("shell", { command: "true" }, { id: "same" });
      const t0 = Date.now();
      await assert.rejects(s.call("shell", { command: "false" }, { id: "same" }), (e) => e instanceof toolexec.CallIdReused && e instanceof toolexec.ConflictError);
      assert.ok(Date.now() - t0 < 1000);
      await assert.rejects(s.rewind(10_000), toolexec.SeqOutOfRange);
      await s.close();
      await assert.rejects(s.shell("true"), toolexec.SessionClosed);
    });

    test("events paged and followed", async () => {
      const s = await client.session();
      await s.shell("echo hi > f.txt");
      const kinds = [];
      for await (const e of s.events()) kinds.push(e.kind);
      assert.equal(kinds[0], "session.created");
      assert.ok(kinds.includes("file.created"));
      const small = [];
      for await (const e of s.events({ limit: 2 })) small.push(e.seq);
      assert.deepEqual(small, kinds.map((_, i) => i + 1));
      await s.close();
      const followed = [];
      for await (const e of s.events({ follow: true })) followed.push(e);
      assert.equal(followed.at(-1).kind, "session.closed");
      assert.deepEqual(followed.map((e) => e.seq), followed.map((_, i) => i + 1));
    });

    test("a dropped event stream resumes from the last seq", async () => {
      const s = await client.session();
      const proxy = await startProxy(service.url);
      const follower = await new Client({ url: proxy.url, apiKey: service.apiKey, retry: { backoff: 0.05 } }).attach(s.id);
      const seen = [];
      const done = (async () => {
        for await (const e of follower.events({ follow: true })) seen.push(e);
      })();
      await s.shell("echo 1 > one.txt");
      await waitFor(() => seen.some((e) => e.kind === "invocation.finished"));
      proxy.cut();
      const cutAt = seen.length;
      await s.shell("echo 2 > two.txt");
      await s.shell("echo 3 > three.txt");
      await s.close();
      await done;
      assert.deepEqual(seen.map((e) => e.seq), seen.map((_, i) => i + 1));
      assert.equal(seen.at(-1).kind, "session.closed");
      assert.ok(seen.length > cutAt);
      assert.ok(proxy.requests.filter((r) => r.includes("/events/stream")).length >= 2);
      await proxy.close();
    });

    test("a call whose answer was lost is retried and runs once", async () => {
      const s = await client.session();
      const proxy = await startProxy(service.url);
      const mine = await new Client({ url: proxy.url, apiKey: service.apiKey, retry: { backoff: 0.05 } }).attach(s.id);
      proxy.cutAfterResponseStarts("/calls");
      const r = await mine.call("shell", { command: "echo ran >> count.txt; wc -l < count.txt" }, { id: "once" });
      assert.equal(proxy.cuts, 1, "the first answer was cut");
      assert.equal(r.status, "ok");
      assert.match(r.content, /1\s*$/);
      assert.equal(text(await s.file("count.txt")), "ran\n");
      const started = (await eventsOf(service, s.id)).filter((e) => e.kind === "invocation.started");
      assert.deepEqual(started.map((e) => e.data.call_id), ["once"]);
      await s.close();
      await proxy.close();
    });

    test("still_running is retried with the same ids", async () => {
      const s = await client.session();
      const t0 = Date.now();
      const r = await s.call("shell", { command: "sleep 5; echo slept >> log.txt; echo done", timeout_ms: 20000 }, { id: "slow" });
      assert.equal(r.status, "ok");
      assert.match(r.content, /done/);
      assert.ok(Date.now() - t0 >= 5000);
      assert.equal(text(await s.file("log.txt")), "slept\n");
      const once = await new Client({ url: service.url, apiKey: service.apiKey, retry: toolexec.NO_RETRY }).attach(s.id);
      await assert.rejects(once.call("shell", { command: "sleep 4", timeout_ms: 20000 }, { id: "slow2" }), (e) => e instanceof toolexec.StillRunning && e.status === 503);
      await s.close();
    });

    test("a refused connection is retried until the deadline", async () => {
      const port = await freePort(); // nothing listens there
      const c = new Client({ url: `http://127.0.0.1:${port}`, retry: { attempts: 50, backoff: 0.05, maxBackoff: 0.1, deadline: 1 } });
      const t0 = Date.now();
      await assert.rejects(c.session(), (e) => e instanceof toolexec.DeadlineExceeded || e instanceof toolexec.ConnectionFailed);
      const took = Date.now() - t0;
      assert.ok(took > 500 && took < 3000, `${took} ms`);
    });

    test("fork, rewind, tree, file and verify replay", async () => {
      await client.withSession({}, async (s) => {
        await s.writeFile("a.txt", "first\n");
        const at = (await s.refresh()).last_seq;
        await s.writeFile("a.txt", "second\n");
        assert.equal(text(await s.file("a.txt", at)), "first\n");
        assert.equal(text(await s.file("a.txt")), "second\n");
        assert.deepEqual((await s.tree(at)).entries.map((e) => e.path), ["a.txt"]);
        const f = await s.fork(at);
        assert.notEqual(f.id, s.id);
        assert.match((await f.readFile("a.txt")).content, /first/);
        await f.close();
        assert.equal((await s.rewind(at)).to_seq, at);
        assert.match((await s.readFile("a.txt")).content, /first/);
        const replay = await s.verifyReplay();
        assert.equal(replay.status, "finished");
        assert.equal(replay.calls_diverged, 0);
      });
    });

    test("archive in and out", async () => {
      const dir = mkdtempSync(join(tmpdir(), "ts-archive-"));
      execFileSync("mkdir", ["-p", join(dir, "src/pkg")]);
      writeFileSync(join(dir, "src/pkg/main.py"), "print('packed')\n");
      const tgz = execFileSync("tar", ["-czf", "-", "-C", join(dir, "src"), "pkg/main.py"]);
      await client.withSession({}, async (s) => {
        const up = await s.upload(new Uint8Array(tgz));
        assert.equal(up.files, 1);
        assert.match((await s.shell("python3 pkg/main.py")).content, /packed/);
        const tar = await s.archive();
        writeFileSync(join(dir, "out.tar"), tar);
        assert.equal(execFileSync("tar", ["-xOf", join(dir, "out.tar"), "pkg/main.py"], { encoding: "utf8" }), "print('packed')\n");
      });
    });

    test("approvals: list, approve, deny", async () => {
      await client.withSession({ policy: { approval: { tools: ["shell"] } } }, async (s) => {
        const r = await s.call("shell", { command: "echo approved > ok.txt" }, { id: "gated" });
        assert.equal(r.status, "pending_approval");
        assert.ok(!r.is_error);
        const d = await s.call("shell", { command: "echo no" }, { id: "gated2" });
        const waiting = await client.approvals.list(s);
        assert.deepEqual(waiting.map((e) => e.invocation_id), [r.invocation_id, d.invocation_id]);
        await client.approvals.approve(r.invocation_id, { by: "alice", reason: "fine" });
        await client.approvals.deny(d.invocation_id, { by: "bob", reason: "no" });
        await waitFor(async () => (await s.call("shell", { command: "echo approved > ok.txt" }, { id: "gated" })).status === "ok");
        assert.equal(text(await s.file("ok.txt")), "approved\n");
        assert.deepEqual(await client.approvals.list(s), []);
        await assert.rejects(client.approvals.approve(d.invocation_id), toolexec.AlreadyDecided);
      });
    });
  });
}
