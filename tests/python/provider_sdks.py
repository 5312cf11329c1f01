"""The official OpenAI and Anthropic Python SDKs build requests from toolexec's catalog as it is.

Run by tests/e2e/dialects.rs with the base URL of a running toolexec. Offline: each SDK sends to
an in-process mock transport, which records the request and answers with a minimal response.
Prints "ok" when every tool went through each SDK unchanged and marked strict.
"""
import json
import sys
import urllib.request

import anthropic
import httpx2
import openai

base = sys.argv[1]


def catalog(fmt):
    with urllib.request.urlopen(f"{base}/v1/tools?format={fmt}") as r:
        return json.load(r)["tools"]


sent = {}


def answer(request):
    body = json.loads(request.content)
    sent[request.url.path] = body
    path = request.url.path
    if path.endswith("/responses"):
        data = {"id": "resp_1", "object": "response", "created_at": 0, "model": body["model"],
                "status": "completed", "output": [], "parallel_tool_calls": True,
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
for t in anthropic_tools:
    assert t["strict"] is True, t["name"]
print("ok", len(responses_tools), "tools")
