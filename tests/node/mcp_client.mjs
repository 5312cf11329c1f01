// The official MCP TypeScript SDK (@modelcontextprotocol/sdk, pinned in package.json) drives one
// toolexec session over its MCP endpoint. Run by tests/e2e/mcp.rs: `node mcp_client.mjs URL`.
// Lists the tools, calls read_file and a read_file that fails, and prints one JSON object: the
// negotiated version, the tools and each call's result as the SDK parsed it, and the JSON-RPC
// ids it sent each tools/call under (seen on the wire).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = new URL(process.argv[2]);
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
out.calls = {
  read: await client.callTool({ name: "read_file", arguments: { file_path: "notes.txt" } }),
  missing: await client.callTool({ name: "read_file", arguments: { file_path: "no/such/file.txt" } }),
};
await client.close();
clearTimeout(timer);
console.log(JSON.stringify(out));
