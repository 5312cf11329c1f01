"""The official OpenAI and Anthropic Python SDKs build requests from toolexec's catalog as it is,
and an agent loop over the Responses API's own shell and apply_patch tools runs their calls here.

Run by tests/e2e/dialects.rs with the base URL of a running toolexec. Offline: each SDK sends to
an in-process mock transport, which records the request and answers with a scripted response.
Prints "ok" when every tool went through each SDK unchanged (function tools marked strict,
Anthropic's own tools as their native types), and when the SDK's shell_call and apply_patch_call
items, run by toolexec, come back as output items the SDK's types accept and send on unchanged.
"""
import json
import sys
import urllib.request

import anthropic
import httpx2
import openai
import pydantic
from anthropic.types import ToolBash20250124Param, ToolTextEditor20250728Param
from openai.types.responses import ResponseApplyPatchToolCall, ResponseFunctionShellToolCall
from openai.types.responses.response_input_item_param import ApplyPatchCallOutput, ShellCallOutput

base = sys.argv[1]


def catalog(fmt):
    with urllib.request.urlopen(f"{base}/v1/tools?format={fmt}") as r:
        return json.load(r)["tools"]


def post(path, body):
    request = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as r:
        return json.load(r)


sent = {}
# What the scripted Responses API answers next: the model's calls of its shell and apply_patch.
scripted_output = []


def answer(request):
    body = json.loads(request.content)
    sent[request.url.path] = body
    path = request.url.path
    if path.endswith("/responses"):
        data = {"id": "resp_1", "object": "response", "created_at": 0, "model": body["model"],
                "status": "completed", "output": scripted_output, "parallel_tool_calls": True,
                "tool_choice": "auto", "tools": []}
    elif path.endswith("/chat/completions"):
        data = {"id": "c_1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": []}
    else:
        data = {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                "content": [], "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 1}}
    return httpx2.Response(200, json=data)


transport = httpx2.MockTransport(answer)
responses_tools = catalog("openai")
chat_tools = catalog("openai_chat")
anthropic_tools = catalog("anthropic")
assert responses_tools and chat_tools and anthropic_tools

oa = openai.OpenAI(api_key="sk-test", base_url="http://api.test/v1",
                   http_client=httpx2.Client(transport=transport), max_retries=0)
oa.responses.create(model="gpt-test", input="list the files", tools=responses_tools)
oa.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "hi"}],
                           tools=chat_tools)
an = anthropic.Anthropic(api_key="sk-ant-test", base_url="http://api.test",
                         http_client=httpx2.Client(transport=transport), max_retries=0)
an.messages.create(model="claude-test", max_tokens=16,
                   messages=[{"role": "user", "content": "hi"}], tools=anthropic_tools)

assert sent["/v1/responses"]["tools"] == responses_tools, "openai responses changed the tools"
assert sent["/v1/chat/completions"]["tools"] == chat_tools, "openai chat changed the tools"
assert sent["/v1/messages"]["tools"] == anthropic_tools, "anthropic changed the tools"
for t in responses_tools:
    assert t["strict"] is True and t["type"] == "function", t["name"]
native = {"bash": ToolBash20250124Param, "str_replace_based_edit_tool": ToolTextEditor20250728Param}
for t in anthropic_tools:
    if "type" in t:
        # Anthropic's own tool, as the SDK's type for it.
        pydantic.TypeAdapter(native[t["name"]]).validate_python(t, strict=True)
        assert set(t) == {"type", "name"}, t
    else:
        assert t["strict"] is True, t["name"]
assert any(t.get("type") == "text_editor_20250728" for t in anthropic_tools), anthropic_tools
for t in catalog("anthropic&native=false"):
    assert t["strict"] is True and "type" not in t, t["name"]

# An agent loop over the Responses API's own tools: the model's shell_call and apply_patch_call
# come back typed by the SDK, run in a toolexec session, and their outputs go into the next turn.
shell_tools = [{"type": "shell", "environment": {"type": "local"}}, {"type": "apply_patch"}]
scripted_output[:] = [
    {"type": "apply_patch_call", "id": "apc_1", "call_id": "call_patch", "status": "completed",
     "operation": {"type": "create_file", "path": "hello.py", "diff": "+print('hello')\n"}},
    {"type": "shell_call", "id": "sh_1", "call_id": "call_shell", "status": "completed",
     "action": {"commands": ["python3 hello.py", "exit 7"], "timeout_ms": 10000,
                "max_output_length": 1000}},
]
first = oa.responses.create(model="gpt-test", input="say hello", tools=shell_tools)
patch_call, shell_call = first.output
assert isinstance(patch_call, ResponseApplyPatchToolCall), patch_call
assert isinstance(shell_call, ResponseFunctionShellToolCall), shell_call

session = post("/v1/sessions", {})
ran = post(f"/v1/sessions/{session['id']}/calls?format=openai",
           {"calls": [item.model_dump(mode="json", exclude_none=True) for item in first.output]})
patched, shelled = (r["rendered"] for r in ran["results"])
pydantic.TypeAdapter(ApplyPatchCallOutput).validate_python(patched, strict=True)
pydantic.TypeAdapter(ShellCallOutput).validate_python(shelled, strict=True)
assert patched == {"type": "apply_patch_call_output", "call_id": "call_patch",
                   "status": "completed", "output": patched["output"]}, patched
assert shelled["call_id"] == "call_shell" and shelled["max_output_length"] == 1000, shelled
hello, seven = shelled["output"]
assert hello == {"stdout": "hello\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}, hello
assert seven["outcome"] == {"type": "exit", "exit_code": 7}, seven

scripted_output[:] = []
turn = [item.model_dump(mode="json", exclude_none=True) for item in first.output]
oa.responses.create(model="gpt-test", input=turn + [patched, shelled], tools=shell_tools)
assert sent["/v1/responses"]["input"][-2:] == [patched, shelled], "the SDK changed the outputs"
print("ok", len(responses_tools), "tools")
