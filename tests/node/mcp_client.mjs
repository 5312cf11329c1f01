// The official MCP TypeScript SDK (@modelcontextprotocol/sdk, pinned in package.json) drives one
// toolexec session over its MCP endpoint. Run by tests/e2e/mcp.rs: `node mcp_client.mjs URL
// [MODE]`. MODE `basic` (the default) lists the tools, calls read_file and a read_file that
// fails; `stamp` calls shell three times with a command whose output changes each time it runs
// (`date +%s%N`), then the same command named by `_meta["toolexec/call_id"]` (the key's older
// spelling) twice, and that id once more with another command (refused). Prints one JSON object:
// the negotiated version, the tools and each call's result as the SDK parsed it (or the JSON-RPC
// error it threw), and the JSON-RPC ids it sent each tools/call under (seen on the wire).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpError } from "@modelcontextprotocol/sdk/types.js";

const url = new URL(process.argv[2]);
const mode = process.argv[3] ?? "basic";
const sent = [];
const recording = async (input, init) => {
  if (init?.method === "POST" && typeof init.body === "string") {
    const message = JSON.parse(init.body);
    if (message.method === "tools/call") sent.push({ id: message.id, tool: message.params.name });
  }
  return fetch(input, init);
};

const timer = setTimeout(() => {
  console.error("timed out after 60 s");
  process.exit(2);
}, 60_000);

const client = new Client({ name: "toolexec-node-test", version: "0.0.0" });
const transport = new StreamableHTTPClientTransport(url, { fetch: recording });
await client.connect(transport);
const out = { version: transport.protocolVersion, sent };
out.tools = (await client.listTools()).tools;
if (mode === "stamp") {
  const stamp = { command: "date +%s%N" };
  const named = { "toolexec/call_id": "ts-stamp-1" };
  out.calls = {
    stamp_1: await client.callTool({ name: "shell", arguments: stamp }),
    stamp_2: await client.callTool({ name: "shell", arguments: stamp }),
    stamp_3: await client.callTool({ name: "shell", arguments: stamp }),
    named: await client.callTool({ name: "shell", arguments: stamp, _meta: named }),
    named_again: await client.callTool({ name: "shell", arguments: stamp, _meta: named }),
  };
  try {
    const other = await client.callTool({
      name: "shell",
      arguments: { command: "echo other" },
      _meta: named,
    });
    out.calls.named_other = { result: other };
  } catch (e) {
    if (!(e instanceof McpError)) throw e;
    out.calls.named_other = { error: { code: e.code, message: e.message, data: e.data } };
  }
} else {
  out.calls = {
    read: await client.callTool({ name: "read_file", arguments: { file_path: "notes.txt" } }),
    missing: await client.callTool({ name: "read_file", arguments: { file_path: "no/such/file.txt" } }),
  };
}
await client.close();
clearTimeout(timer);
console.log(JSON.stringify(out));
