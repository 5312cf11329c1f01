"""A whole agent loop in one page: a model (Anthropic's Messages API) decides which tools to
call, toolexec runs them in a sandboxed session and records them, and the results go back to
the model until it stops asking.

    pip install anthropic
    export ANTHROPIC_API_KEY=…                   # (ANTHROPIC_BASE_URL for a proxy or a fake)
    export TOOLEXEC_URL=http://127.0.0.1:8080    # TOOLEXEC_API_KEY too if the service has keys
    python3 examples/agent_loop.py "Write hello.py that prints hello, then run it"

Everything the model did stays in the session's log: GET /v1/sessions/{id}/events.
"""
import json
import os
import sys
import urllib.request

import anthropic

TOOLEXEC = os.environ.get("TOOLEXEC_URL", "http://127.0.0.1:8080").rstrip("/")


def toolexec(method, path, body=None):
    """One request to toolexec; the JSON it answers."""
    headers = {"content-type": "application/json"}
    if os.environ.get("TOOLEXEC_API_KEY"):
        headers["authorization"] = "Bearer " + os.environ["TOOLEXEC_API_KEY"]
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(TOOLEXEC + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req) as resp:
        return json.load(resp)


def run(task, model="claude-sonnet-4-5", max_turns=20):
    """Runs `task` to the end; returns (the model's last text, the session id)."""
    session = toolexec("POST", "/v1/sessions", {"metadata": {"example": "agent_loop"}})
    sid = session["id"]
    # The catalog in Anthropic's own shape (strict input schemas): passed to the model as it is.
    tools = toolexec("GET", "/v1/tools?format=anthropic")["tools"]
    model_client = anthropic.Anthropic()
    messages = [{"role": "user", "content": task}]
    text = ""
    try:
        for _ in range(max_turns):
            reply = model_client.messages.create(
                model=model, max_tokens=4096, tools=tools, messages=messages
            )
            messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
            text = "".join(b.text for b in reply.content if b.type == "text")
            uses = [b for b in reply.content if b.type == "tool_use"]
            if not uses:
                return text, sid
            # The model's tool_use ids are the call ids: a retry of this request never runs a
            # call twice. ?format=anthropic renders each result as a tool_result block.
            calls = [{"id": u.id, "name": u.name, "arguments": u.input} for u in uses]
            out = toolexec("POST", f"/v1/sessions/{sid}/calls?format=anthropic", {"calls": calls})
            messages.append({"role": "user", "content": [r["rendered"] for r in out["results"]]})
        return text, sid
    finally:
        toolexec("DELETE", f"/v1/sessions/{sid}")


if __name__ == "__main__":
    answer, session_id = run(" ".join(sys.argv[1:]) or "List the files in the workspace.")
    print(answer)
    print(f"(the session's log: {TOOLEXEC}/v1/sessions/{session_id}/events)")
