// A whole agent loop in one page, in TypeScript's runtime (the twin of examples/agent_loop.py):
// a model (Anthropic's Messages API) decides which tools to call, toolexec runs them in a
// sandboxed session and records them, and the results go back to the model until it stops asking.
//
//     (cd clients/typescript && npm ci && npm run build)
//     npm install ./clients/typescript @anthropic-ai/sdk
//     export ANTHROPIC_API_KEY=…                   # (ANTHROPIC_BASE_URL for a proxy or a fake)
//     export TOOLEXEC_URL=http://127.0.0.1:8080    # TOOLEXEC_API_KEY too if the service has keys
//     node examples/agent_loop.mjs "Write hello.py that prints hello, then run it"
//
// Everything the model did stays in the session's log: GET /v1/sessions/{id}/events.
import Anthropic from "@anthropic-ai/sdk";
import { Client } from "toolexec";

/** Runs `task` to the end; returns the model's last text and the session id. */
export async function run(task, { model = "claude-sonnet-4-5", maxTurns = 20 } = {}) {
  const llm = new Anthropic();
  return new Client().withSession({ metadata: { example: "agent_loop" } }, async (s) => {
    const tools = await s.anthropic.tools(); // the session's catalog in Anthropic's shape
    const messages = [{ role: "user", content: task }];
    let text = "";
    for (let turn = 0; turn < maxTurns; turn++) {
      const reply = await llm.messages.create({ model, max_tokens: 4096, tools, messages });
      text = reply.content.filter((b) => b.type === "text").map((b) => b.text).join("");
      // Runs the tool_use blocks (their ids are the call ids: a retry never runs a call twice)
      // and answers with the tool_result blocks for the next user turn.
      const results = await s.anthropic.run(reply);
      if (!results.length) break;
      messages.push({ role: "assistant", content: reply.content }, { role: "user", content: results });
    }
    return { text, sessionId: s.id };
  });
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { text, sessionId } = await run(process.argv.slice(2).join(" ") || "List the files in the workspace.");
  console.log(text);
  console.log(`(the session's log: /v1/sessions/${sessionId}/events)`);
}
