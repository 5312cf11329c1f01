"""Three agent ecosystems drive one toolexec session (argv[1]: its base URL), each in its own
dialect, with its official SDK — and a gated call waits for a person:

1. an Anthropic-style loop (the `anthropic` SDK against a scripted Messages API on loopback):
   the model's tool_use runs through `?format=anthropic` and its tool_result goes back;
2. an OpenAI-style loop (the `openai` SDK against a scripted Responses API on loopback): the
   model's function_call runs through `?format=openai` and its function_call_output goes back;
3. an MCP client (the `mcp` SDK over the session's Streamable HTTP endpoint) calls `shell`, which
   the session's policy makes wait for approval: a reviewer approves it meanwhile, and the MCP
   call returns what the command printed.

Then the session's one log has all three calls under the ids each ecosystem gave them, and the
approval under the reviewer's name. Prints "ok".
"""
import asyncio
import json
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import openai
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

base = sys.argv[1]


def rest(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.load(r)


seen = {"anthropic": [], "openai": []}


class FakeModels(BaseHTTPRequestHandler):
    """Scripted models: one tool call each, then a final answer."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if self.path.endswith("/messages"):
            seen["anthropic"].append(body)
            if len(seen["anthropic"]) == 1:
                content = [{"type": "tool_use", "id": "toolu_three_1", "name": "write_file",
                            "input": {"file_path": "doors.txt", "content": "written by claude\n"}}]
                stop = "tool_use"
            else:
                content, stop = [{"type": "text", "text": "written"}], "end_turn"
            reply = {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                     "content": content, "stop_reason": stop, "stop_sequence": None,
                     "usage": {"input_tokens": 1, "output_tokens": 1}}
        else:
            seen["openai"].append(body)
            if len(seen["openai"]) == 1:
                # A strict model sends every property; the optional ones as null.
                output = [{"type": "function_call", "id": "fc_1", "call_id": "call_three_1",
                           "name": "read_file", "status": "completed",
                           "arguments": json.dumps({"file_path": "doors.txt", "offset": None,
                                                    "limit": None})}]
            else:
                output = [{"type": "message", "id": "m_1", "role": "assistant",
                           "status": "completed",
                           "content": [{"type": "output_text", "text": "read", "annotations": []}]}]
            reply = {"id": "resp_1", "object": "response", "created_at": 0, "model": body["model"],
                     "status": "completed", "output": output, "parallel_tool_calls": True,
                     "tool_choice": "auto", "tools": []}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), FakeModels)
threading.Thread(target=server.serve_forever, daemon=True).start()
models = f"http://127.0.0.1:{server.server_port}"

sid = rest("POST", "/v1/sessions", {"policy": {"approval": {"tools": ["shell"]}}})["id"]


def calls(fmt, batch):
    return rest("POST", f"/v1/sessions/{sid}/calls?format={fmt}", {"calls": batch})["results"]


# 1. An Anthropic-style loop.
claude = anthropic.Anthropic(api_key="test", base_url=models, max_retries=0)
tools = rest("GET", f"/v1/sessions/{sid}/tools?format=anthropic")["tools"]
messages = [{"role": "user", "content": "write doors.txt"}]
while True:
    reply = claude.messages.create(model="claude-test", max_tokens=256, messages=messages,
                                   tools=tools)
    if reply.stop_reason != "tool_use":
        break
    uses = [b for b in reply.content if b.type == "tool_use"]
    results = calls("anthropic", [{"id": u.id, "name": u.name, "arguments": u.input} for u in uses])
    messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
    messages.append({"role": "user", "content": [r["rendered"] for r in results]})
assert seen["anthropic"][1]["messages"][-1]["content"][0]["tool_use_id"] == "toolu_three_1"
assert seen["anthropic"][1]["messages"][-1]["content"][0]["is_error"] is False

# 2. An OpenAI-style loop (Responses API).
gpt = openai.OpenAI(api_key="test", base_url=f"{models}/v1", max_retries=0)
tools = rest("GET", f"/v1/sessions/{sid}/tools?format=openai")["tools"]
items = [{"role": "user", "content": "read doors.txt"}]
while True:
    response = gpt.responses.create(model="gpt-test", input=items, tools=tools)
    fcs = [o for o in response.output if o.type == "function_call"]
    if not fcs:
        break
    results = calls("openai", [{"id": f.call_id, "name": f.name,
                                "arguments": json.loads(f.arguments)} for f in fcs])
    items += [o.model_dump(exclude_none=True) for o in response.output]
    items += [r["rendered"] for r in results]
back = seen["openai"][1]["input"][-1]
assert back["type"] == "function_call_output" and back["call_id"] == "call_three_1", back
assert "written by claude" in back["output"], back


# 3. An MCP client; its shell call waits for a reviewer, who approves it.
def reviewer():
    deadline = time.time() + 30
    while time.time() < deadline:
        events = rest("GET", f"/v1/sessions/{sid}/events?limit=1000")["events"]
        asked = [e for e in events if e["kind"] == "approval.requested"]
        if asked:
            rest("POST", f"/v1/invocations/{asked[0]['invocation_id']}/approve",
                 {"by": "reviewer@example.com", "reason": "reads a file"})
            return
        time.sleep(0.1)


async def mcp_call():
    async with create_mcp_http_client() as http:
        async with streamable_http_client(f"{base}/v1/sessions/{sid}/mcp", http_client=http) as (
                read, write, *_):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return await session.call_tool("shell", {"command": "cat doors.txt"})


threading.Thread(target=reviewer, daemon=True).start()
result = asyncio.run(asyncio.wait_for(mcp_call(), 60))
assert not result.is_error, result
assert "written by claude" in result.content[0].text, result
server.shutdown()

# One log: the three doors' calls under their own ids, and who approved the gated one.
events = rest("GET", f"/v1/sessions/{sid}/events?limit=1000")["events"]
# A call starts with `invocation.started`, or is a read recorded in one event: its
# `invocation.finished`, carrying its `arguments`.
started = [e["data"]["call_id"] for e in events
           if e["kind"] == "invocation.started" or (e["kind"] == "invocation.finished" and "arguments" in e["data"])]
assert started[:2] == ["toolu_three_1", "call_three_1"], started
assert len(started) == 3, started
decided = [e for e in events if e["kind"] == "approval.decided"]
assert decided[0]["data"]["by"]["name"] == "reviewer@example.com", decided
assert decided[0]["data"]["decision"] == "approved", decided
print("ok")
