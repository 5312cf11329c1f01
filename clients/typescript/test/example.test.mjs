// examples/agent_loop.mjs, installed beside the client as a user would have it, runs a scripted
// model (an Anthropic Messages API on loopback) through a recorded session.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { REPO, eventsOf, startModel, startService } from "./support.mjs";

let service;
before(async () => {
  service = await startService("sqlite");
});
after(async () => {
  await service?.stop();
});

test("the TypeScript agent loop example runs on the client", async () => {
  const dir = mkdtempSync(join(tmpdir(), "toolexec-example-"));
  // Installed from the repository as the README says (a copy with its dependencies, not a link).
  writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "example", private: true, type: "module" }));
  execFileSync("npm", ["install", "--install-links", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error", join(REPO, "clients/typescript")], { cwd: dir, stdio: "inherit" });
  mkdirSync(join(dir, "node_modules/@anthropic-ai"), { recursive: true });
  symlinkSync(join(REPO, "clients/typescript/node_modules/@anthropic-ai/sdk"), join(dir, "node_modules/@anthropic-ai/sdk"));
  copyFileSync(join(REPO, "examples/agent_loop.mjs"), join(dir, "agent_loop.mjs"));
  const reply = (content, stop) => (body) => ({
    id: "msg", type: "message", role: "assistant", model: body.model, content, stop_reason: stop,
    stop_sequence: null, usage: { input_tokens: 1, output_tokens: 1 },
  });
  const model = await startModel([
    reply([{ type: "tool_use", id: "toolu_01", name: "write_file", input: { file_path: "hello.py", content: "print('hello from the loop')\n" } }], "tool_use"),
    reply([{ type: "tool_use", id: "toolu_02", name: "shell", input: { command: "python3 hello.py" } }], "tool_use"),
    (body) => reply([{ type: "text", text: "done: " + JSON.stringify(body.messages.at(-1).content[0].content) }], "end_turn")(body),
  ]);
  Object.assign(process.env, {
    ANTHROPIC_BASE_URL: model.url, ANTHROPIC_API_KEY: "test-key",
    TOOLEXEC_URL: service.url, TOOLEXEC_API_KEY: service.apiKey,
  });
  const { run } = await import(join(dir, "agent_loop.mjs"));
  const { text, sessionId } = await run("Write hello.py that prints hello, then run it");
  await model.close();
  assert.match(text, /hello from the loop/);
  assert.equal(model.seen[1].messages.at(-1).content[0].tool_use_id, "toolu_01");
  const events = await eventsOf(service, sessionId);
  assert.deepEqual(events.filter((e) => e.kind === "invocation.started").map((e) => e.data.call_id), ["toolu_01", "toolu_02"]);
  assert.equal(events.at(-1).kind, "session.closed");
});
