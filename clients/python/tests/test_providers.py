"""Provider loops with the official SDKs against a scripted model server on loopback: the
model asks for tools, the client runs them in a session, the next request carries the results."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import openai
import pytest

from toolexec import Client

from conftest import Service, events_of, starts_call


class Model:
    """Answers each POST with the next scripted reply (a function of the request body)."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.seen: list[dict[str, Any]] = []
        model = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                model.seen.append(body)
                reply = model.script[len(model.seen) - 1](body)
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"


@pytest.fixture
def client(service: Service) -> Iterator[Client]:
    with Client(service.url, service.api_key) as c:
        yield c


def _message(content: list[dict[str, Any]], stop: str) -> Any:
    return lambda body: {
        "id": "msg", "type": "message", "role": "assistant", "model": body["model"], "content": content,
        "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1},
    }


def test_anthropic_loop(client: Client, service: Service) -> None:
    model = Model([
        _message([{"type": "tool_use", "id": "toolu_1", "name": "write_file",
                   "input": {"file_path": "hi.py", "content": "print('hi from claude')\n"}},
                  {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {"file_path": "nope"}}], "tool_use"),
        _message([{"type": "tool_use", "id": "toolu_3", "name": "shell", "input": {"command": "python3 hi.py"}}], "tool_use"),
        _message([{"type": "text", "text": "done"}], "end_turn"),
    ])
    llm = anthropic.Anthropic(api_key="k", base_url=model.url, max_retries=0)
    with client.session() as s:
        tools = s.anthropic.tools()
        messages: list[Any] = [{"role": "user", "content": "run hi.py"}]
        while True:
            reply = llm.messages.create(model="claude-test", max_tokens=100, tools=tools, messages=messages)
            results = s.anthropic.run(reply)
            if not results:
                break
            messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": results}]
        sid = s.id
    assert any(t["name"] == "shell" and "input_schema" in t for t in model.seen[0]["tools"])
    first = model.seen[1]["messages"][-1]["content"]
    assert [b["tool_use_id"] for b in first] == ["toolu_1", "toolu_2"]
    assert first[0]["type"] == "tool_result" and not first[0].get("is_error") and first[1]["is_error"] is True
    assert "hi from claude" in json.dumps(model.seen[2]["messages"][-1]["content"])
    # The read (toolu_2) is recorded in one event: its `invocation.finished`, carrying its start.
    started = [e["data"]["call_id"] for e in events_of(service.url, service.api_key, sid) if starts_call(e)]
    assert started == ["toolu_1", "toolu_2", "toolu_3"]


def _response(output: list[dict[str, Any]]) -> Any:
    return lambda body: {
        "id": "resp", "object": "response", "created_at": 0, "model": body["model"], "status": "completed",
        "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
    }


def test_openai_responses_loop(client: Client) -> None:
    model = Model([
        _response([{"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell",
                    "arguments": json.dumps({"command": "echo from-gpt"}), "status": "completed"}]),
        _response([{"type": "message", "id": "m", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "ok", "annotations": []}]}]),
    ])
    llm = openai.OpenAI(api_key="k", base_url=model.url + "/v1", max_retries=0)
    with client.session() as s:
        tools = s.openai.tools()
        items: list[Any] = [{"role": "user", "content": "echo"}]
        while True:
            response = llm.responses.create(model="gpt-test", tools=tools, input=items)
            outputs = s.openai.run(response.output)
            if not outputs:
                break
            items += [o.model_dump(exclude_none=True) for o in response.output] + outputs
    assert model.seen[0]["tools"][0]["type"] == "function"
    out = model.seen[1]["input"][-1]
    assert out["type"] == "function_call_output" and out["call_id"] == "call_1" and "from-gpt" in out["output"]


def test_openai_chat_completions_loop(client: Client) -> None:
    def completion(message: dict[str, Any]) -> Any:
        return lambda body: {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                             "choices": [{"index": 0, "finish_reason": "stop", "message": message}]}

    model = Model([
        completion({"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "write_file", "arguments": json.dumps({"file_path": "c.txt", "content": "chat"})}},
            {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": json.dumps({"file_path": "c.txt"})}},
        ]}),
        completion({"role": "assistant", "content": "done"}),
    ])
    llm = openai.OpenAI(api_key="k", base_url=model.url + "/v1", max_retries=0)
    with client.session() as s:
        tools = s.openai.chat.tools()
        messages: list[Any] = [{"role": "user", "content": "write"}]
        while True:
            message = llm.chat.completions.create(model="gpt-test", tools=tools, messages=messages).choices[0].message
            results = s.openai.chat.run(message)
            if not results:
                break
            messages += [message.model_dump(exclude_none=True), *results]
    sent = model.seen[1]["messages"][-2:]
    assert [m["role"] for m in sent] == ["tool", "tool"] and [m["tool_call_id"] for m in sent] == ["call_a", "call_b"]
    assert "chat" in sent[1]["content"]


def test_anthropic_native_tools_are_listed_and_run(client: Client) -> None:
    with client.session() as s:
        tools = s.anthropic.tools()
        assert {"type": "bash_20250124", "name": "bash"} in tools, tools
        assert {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"} in tools, tools
        blocks = [
            {"type": "tool_use", "id": "t1", "name": "str_replace_based_edit_tool",
             "input": {"command": "create", "path": "n.txt", "file_text": "native\n"}},
            {"type": "tool_use", "id": "t2", "name": "bash", "input": {"command": "cat n.txt"}},
        ]
        created, catted = s.anthropic.run(blocks)
        assert created["tool_use_id"] == "t1" and not created.get("is_error"), created
        assert catted["tool_use_id"] == "t2" and "native" in json.dumps(catted["content"]), catted


def test_openai_shell_call_and_apply_patch_call_items_run(client: Client) -> None:
    model = Model([
        _response([
            {"type": "apply_patch_call", "id": "apc_1", "call_id": "call_patch", "status": "completed",
             "operation": {"type": "create_file", "path": "hello.py", "diff": "+print('hello')\n"}},
            {"type": "shell_call", "id": "sh_1", "call_id": "call_shell", "status": "completed",
             "action": {"commands": ["python3 hello.py"], "timeout_ms": 10000, "max_output_length": 1000}},
        ]),
        _response([{"type": "message", "id": "m", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "ok", "annotations": []}]}]),
    ])
    llm = openai.OpenAI(api_key="k", base_url=model.url + "/v1", max_retries=0)
    with client.session() as s:
        response = llm.responses.create(model="gpt-test", tools=[{"type": "apply_patch"}], input="hi")
        patched, shelled = s.openai.run(response.output)
        assert patched["type"] == "apply_patch_call_output" and patched["status"] == "completed", patched
        assert shelled["type"] == "shell_call_output" and shelled["call_id"] == "call_shell", shelled
        assert shelled["output"][0]["stdout"] == "hello\n", shelled
        llm.responses.create(model="gpt-test", input=[patched, shelled], tools=[{"type": "apply_patch"}])
    assert model.seen[1]["input"] == [patched, shelled]
