"""A whole agent loop in one page: a model (Anthropic's Messages API) decides which tools to
call, toolexec runs them in a sandboxed session and records them, and the results go back to
the model until it stops asking.

    pip install ./clients/python anthropic
    export ANTHROPIC_API_KEY=…                   # (ANTHROPIC_BASE_URL for a proxy or a fake)
    export TOOLEXEC_URL=http://127.0.0.1:8080    # TOOLEXEC_API_KEY too if the service has keys
    python3 examples/agent_loop.py "Write hello.py that prints hello, then run it"

Everything the model did stays in the session's log: GET /v1/sessions/{id}/events.
The TypeScript twin is examples/agent_loop.mjs.
"""
import sys

import anthropic

from toolexec import Client


def run(task, model="claude-sonnet-4-5", max_turns=20):
    """Runs `task` to the end; returns (the model's last text, the session id)."""
    llm = anthropic.Anthropic()
    with Client() as toolexec, toolexec.session(metadata={"example": "agent_loop"}) as s:
        tools = s.anthropic.tools()  # the session's catalog in Anthropic's shape
        messages = [{"role": "user", "content": task}]
        text = ""
        for _ in range(max_turns):
            reply = llm.messages.create(model=model, max_tokens=4096, tools=tools, messages=messages)
            text = "".join(b.text for b in reply.content if b.type == "text")
            # Runs the tool_use blocks (their ids are the call ids: a retry never runs a call
            # twice) and answers with the tool_result blocks for the next user turn.
            results = s.anthropic.run(reply)
            if not results:
                break
            messages += [{"role": "assistant", "content": reply.content},
                         {"role": "user", "content": results}]
        return text, s.id


if __name__ == "__main__":
    answer, session_id = run(" ".join(sys.argv[1:]) or "List the files in the workspace.")
    print(answer)
    print(f"(the session's log: /v1/sessions/{session_id}/events)")
