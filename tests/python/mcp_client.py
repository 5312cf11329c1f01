"""A real MCP client — the official Python SDK (`mcp`, pinned in .ci/run) — drives one toolexec
session over its MCP endpoint.

Run by tests/e2e/mcp.rs: `mcp_client.py URL MODE [API_KEY]`, where MODE is `handshake` (the
`initialize` lifecycle of 2025-11-25) or `discover` (the stateless 2026-07-28 lifecycle): lists
the tools, calls read_file, shell and edit_file, and a read_file that fails; or `stamp`
(2025-11-25): three shell calls whose output changes each time one runs (`date +%s%N`), then the same
command named by `_meta["dev.toolexec/call_id"]` twice, and that id once more with another
command (refused). Prints one JSON object: the negotiated version, the tools, each call's result
as the SDK parsed it (or the JSON-RPC error it raised), and the JSON-RPC ids the SDK sent each
tools/call under (seen on the wire).
"""
import asyncio
import json
import sys

from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

url, mode = sys.argv[1], sys.argv[2]
key = sys.argv[3] if len(sys.argv) > 3 else None
sent = []


async def record(request):
    if request.method != "POST":
        return
    try:
        message = json.loads(request.content)
    except ValueError:
        return
    if message.get("method") == "tools/call":
        sent.append({"id": message["id"], "tool": message["params"]["name"]})


def dump(model):
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


STAMP = {"command": "date +%s%N"}
NAMED = {"dev.toolexec/call_id": "py-stamp-1"}


async def stamp(session):
    """A call that must run each time, then an idempotent one by its `_meta` call id."""
    calls = {}
    for label in ("stamp_1", "stamp_2", "stamp_3"):
        calls[label] = dump(await session.call_tool("shell", STAMP))
    calls["named"] = dump(await session.call_tool("shell", STAMP, meta=NAMED))
    calls["named_again"] = dump(await session.call_tool("shell", STAMP, meta=NAMED))
    try:
        other = await session.call_tool("shell", {"command": "echo other"}, meta=NAMED)
        calls["named_other"] = {"result": dump(other)}
    except MCPError as e:
        calls["named_other"] = {"error": dump(e.error)}
    return calls


async def main():
    headers = {"Authorization": f"Bearer {key}"} if key else None
    http = create_mcp_http_client(headers=headers)
    http.event_hooks = {"request": [record], "response": []}
    out = {}
    async with http:
        async with streamable_http_client(url, http_client=http) as (read, write, *_):
            async with ClientSession(read, write) as session:
                if mode in ("handshake", "stamp"):
                    await session.initialize()
                else:
                    await session.discover()
                out["version"] = session.protocol_version
                out["tools"] = [dump(t) for t in (await session.list_tools()).tools]
                calls = {
                    "read": ("read_file", {"file_path": "notes.txt"}),
                    "shell": ("shell", {"command": "echo from-mcp > made.txt; cat made.txt"}),
                    "edit": (
                        "edit_file",
                        {"file_path": "notes.txt", "old_string": "hello", "new_string": "goodbye"},
                    ),
                    "missing": ("read_file", {"file_path": "no/such/file.txt"}),
                }
                if mode == "stamp":
                    out["calls"] = await stamp(session)
                else:
                    out["calls"] = {}
                    for label, (name, args) in calls.items():
                        out["calls"][label] = dump(await session.call_tool(name, args))
    out["sent"] = sent
    print(json.dumps(out))


asyncio.run(asyncio.wait_for(main(), 60))
