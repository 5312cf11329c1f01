// Provider loops with the official SDKs against a scripted model server on loopback: the model
// asks for tools, the client runs them in a session, the next request carries the results.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";

import { Client } from "../dist/index.js";
import { STORES, eventsOf, startModel, startService, startsCall } from "./support.mjs";

const message = (content, stop) => (body) => ({
  id: "msg", type: "message", role: "assistant", model: body.model, content,
  stop_reason: stop, stop_sequence: null, usage: { input_tokens: 1, output_tokens: 1 },
});
const response = (output) => (body) => ({
  id: "resp", object: "response", created_at: 0, model: body.model, status: "completed",
  output, parallel_tool_calls: true, tool_choice: "auto", tools: [],
});
const completion = (msg) => (body) => ({
  id: "c", object: "chat.completion", created: 0, model: body.model,
  choices: [{ index: 0, finish_reason: "stop", message: msg }],
});

for (const store of STORES) {
  describe(`provider loops against the service on ${store}`, () => {
    let service;
    let client;
    before(async () => {
      service = await startService(store);
      client = new Client(service.url, service.apiKey);
    });
    after(async () => {
      await service?.stop();
    });

    test("Anthropic Messages API: tool_use blocks in, tool_result blocks out", async () => {
      const model = await startModel([
        message([
          { type: "tool_use", id: "toolu_1", name: "write_file", input: { file_path: "hi.py", content: "print('hi from claude')\n" } },
          { type: "tool_use", id: "toolu_2", name: "read_file", input: { file_path: "nope" } },
        ], "tool_use"),
        message([{ type: "tool_use", id: "toolu_3", name: "shell", input: { command: "python3 hi.py" } }], "tool_use"),
        message([{ type: "text", text: "done" }], "end_turn"),
      ]);
      const llm = new Anthropic({ apiKey: "k", baseURL: model.url, maxRetries: 0 });
      const sid = await client.withSession({}, async (s) => {
        const tools = await s.anthropic.tools();
        const messages = [{ role: "user", content: "run hi.py" }];
        for (;;) {
          const reply = await llm.messages.create({ model: "claude-test", max_tokens: 100, tools, messages });
          const results = await s.anthropic.run(reply);
          if (!results.length) break;
          messages.push({ role: "assistant", content: reply.content }, { role: "user", content: results });
        }
        return s.id;
      });
      await model.close();
      assert.ok(model.seen[0].tools.some((t) => t.name === "shell" && t.input_schema));
      const first = model.seen[1].messages.at(-1).content;
      assert.deepEqual(first.map((b) => b.tool_use_id), ["toolu_1", "toolu_2"]);
      assert.equal(first[0].type, "tool_result");
      assert.equal(first[1].is_error, true);
      assert.match(JSON.stringify(model.seen[2].messages.at(-1).content), /hi from claude/);
      // The read (toolu_2) is recorded in one event: its `invocation.finished`, carrying its start.
      const started = (await eventsOf(service, sid)).filter(startsCall);
      assert.deepEqual(started.map((e) => e.data.call_id), ["toolu_1", "toolu_2", "toolu_3"]);
    });

    test("OpenAI Responses API: function_call items in, function_call_output items out", async () => {
      const model = await startModel([
        response([{ type: "function_call", id: "fc_1", call_id: "call_1", name: "shell", arguments: JSON.stringify({ command: "echo from-gpt" }), status: "completed" }]),
        response([{ type: "message", id: "m", role: "assistant", status: "completed", content: [{ type: "output_text", text: "ok", annotations: [] }] }]),
      ]);
      const llm = new OpenAI({ apiKey: "k", baseURL: `${model.url}/v1`, maxRetries: 0 });
      await client.withSession({}, async (s) => {
        const tools = await s.openai.tools();
        const input = [{ role: "user", content: "echo" }];
        for (;;) {
          const r = await llm.responses.create({ model: "gpt-test", tools, input });
          const outputs = await s.openai.run(r.output);
          if (!outputs.length) break;
          input.push(...r.output, ...outputs);
        }
      });
      await model.close();
      assert.equal(model.seen[0].tools[0].type, "function");
      const out = model.seen[1].input.at(-1);
      assert.equal(out.type, "function_call_output");
      assert.equal(out.call_id, "call_1");
      assert.match(out.output, /from-gpt/);
    });

    test("OpenAI Chat Completions: tool_calls in, tool messages out", async () => {
      const model = await startModel([
        completion({ role: "assistant", content: null, tool_calls: [
          { id: "call_a", type: "function", function: { name: "write_file", arguments: JSON.stringify({ file_path: "c.txt", content: "chat" }) } },
          { id: "call_b", type: "function", function: { name: "read_file", arguments: JSON.stringify({ file_path: "c.txt" }) } },
        ] }),
        completion({ role: "assistant", content: "done" }),
      ]);
      const llm = new OpenAI({ apiKey: "k", baseURL: `${model.url}/v1`, maxRetries: 0 });
      await client.withSession({}, async (s) => {
        const tools = await s.openai.chat.tools();
        const messages = [{ role: "user", content: "write" }];
        for (;;) {
          const msg = (await llm.chat.completions.create({ model: "gpt-test", tools, messages })).choices[0].message;
          const results = await s.openai.chat.run(msg);
          if (!results.length) break;
          messages.push(msg, ...results);
        }
      });
      await model.close();
      const sent = model.seen[1].messages.slice(-2);
      assert.deepEqual(sent.map((m) => m.role), ["tool", "tool"]);
      assert.deepEqual(sent.map((m) => m.tool_call_id), ["call_a", "call_b"]);
      assert.match(sent[1].content, /chat/);
    });
  });
}
