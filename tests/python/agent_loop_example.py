"""Runs examples/agent_loop.py (on the Python client, clients/python) against a real toolexec
(argv[1]) and a fake model: an Anthropic Messages API served on loopback that plays a scripted
conversation — write a file, run it, then answer with what the run printed. Prints "ok" when the
loop went through and the log has it. The client is imported from the repository's source
(its dependencies, httpx2 and pydantic, come with the anthropic SDK).
"""
import json
import os
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

base = sys.argv[1]
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python", "src"))

SCRIPT = [
    [{"type": "tool_use", "id": "toolu_01", "name": "write_file",
      "input": {"file_path": "hello.py", "content": "print('hello from the loop')\n"}}],
    [{"type": "tool_use", "id": "toolu_02", "name": "shell",
      "input": {"command": "python3 hello.py", "timeout_ms": 10000}}],
]
seen = []


class FakeModel(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        seen.append(body)
        turn = len(seen) - 1
        if turn < len(SCRIPT):
            content, stop = SCRIPT[turn], "tool_use"
        else:
            # The last tool_result the loop sent back: what the command printed.
            result = body["messages"][-1]["content"][0]
            printed = json.dumps(result["content"])
            content = [{"type": "text", "text": "done: " + printed}]
            stop = "end_turn"
        reply = {"id": f"msg_{turn}", "type": "message", "role": "assistant", "model": body["model"],
                 "content": content, "stop_reason": stop, "stop_sequence": None,
                 "usage": {"input_tokens": 1, "output_tokens": 1}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), FakeModel)
threading.Thread(target=server.serve_forever, daemon=True).start()
os.environ["ANTHROPIC_BASE_URL"] = f"http://127.0.0.1:{server.server_port}"
os.environ["ANTHROPIC_API_KEY"] = "test-key"
os.environ["TOOLEXEC_URL"] = base

import agent_loop  # noqa: E402

answer, sid = agent_loop.run("Write hello.py that prints hello, then run it")
server.shutdown()
assert "hello from the loop" in answer, answer
# The model got toolexec's catalog in Anthropic's shape.
assert any(t["name"] == "shell" and "input_schema" in t for t in seen[0]["tools"]), seen[0]["tools"][:1]
# The second request carried the first call's tool_result, tied to the model's tool_use id.
first_result = seen[1]["messages"][-1]["content"][0]
assert first_result["type"] == "tool_result" and first_result["tool_use_id"] == "toolu_01", first_result
# Everything is in the (closed) session's log, under the model's ids.
with urllib.request.urlopen(f"{base}/v1/sessions/{sid}/events?limit=1000") as r:
    events = json.load(r)["events"]
started = [e["data"].get("call_id") for e in events if e["kind"] == "invocation.started"]
assert "toolu_01" in started and "toolu_02" in started, started
assert any(e["kind"] == "file.created" and e["data"]["path"] == "hello.py" for e in events)
print("ok")
