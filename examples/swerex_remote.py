"""SWE-ReX's own client drives a toolexec session: what SWE-agent, SWE-smith and RL pipelines
already run, pointed at a sandboxed, recorded session instead of a container's swerex-remote.

    .ci/swerex                                   # a venv with swe-rex==1.4.0 and aiohttp
    export TOOLEXEC_URL=http://127.0.0.1:8080    # TOOLEXEC_API_KEY too if the service has keys
    ~/.cache/toolexec-ci/swerex-1.4.0/bin/python examples/swerex_remote.py

Every step is a recorded call: GET /v1/sessions/{id}/events lists them, and
POST /v1/sessions/{id}/replay re-runs them. docs/swerex.md has the mapping.
"""
import asyncio
import json
import os
import urllib.request

from swerex.exceptions import CommandTimeoutError
from swerex.runtime.abstract import (
    BashAction,
    BashInterruptAction,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    WriteFileRequest,
)
from swerex.runtime.remote import RemoteRuntime

URL = os.environ.get("TOOLEXEC_URL", "http://127.0.0.1:8080")
KEY = os.environ.get("TOOLEXEC_API_KEY", "")


def new_session():
    """A toolexec session (REST API); its SWE-ReX API is under …/swerex."""
    headers = {"content-type": "application/json"}
    if KEY:
        headers["authorization"] = f"Bearer {KEY}"
    req = urllib.request.Request(f"{URL}/v1/sessions", data=b"{}", headers=headers)
    with urllib.request.urlopen(req) as r:
        return json.load(r)["id"]


async def main():
    sid = new_session()
    # The host is the prefix, scheme included, no trailing slash, no port; `timeout` is
    # is_alive's (its default of 0.15 s is too short for a service over a network).
    rt = RemoteRuntime(host=f"{URL}/v1/sessions/{sid}/swerex", auth_token=KEY, timeout=30)
    assert (await rt.is_alive()).is_alive
    await rt.create_session(CreateBashSessionRequest())
    await rt.write_file(WriteFileRequest(path="/workspace/app.py", content="print(6 * 7)\n"))
    obs = await rt.run_in_session(BashAction(command="cd /workspace && python3 app.py"))
    print("run_in_session:", obs.output.strip(), "exit", obs.exit_code)
    try:
        await rt.run_in_session(BashAction(command="sleep 60", timeout=1))
    except CommandTimeoutError as e:
        print("timed out:", e)
        await rt.run_in_session(BashInterruptAction())
    out = await rt.execute(Command(command=["ls", "/workspace"]))
    print("execute:", out.stdout.split())
    print("read_file:", (await rt.read_file(ReadFileRequest(path="/workspace/app.py"))).content.strip())
    await rt.close()  # the bash sessions end; the toolexec session stays open
    print(f"session {sid}: see {URL}/v1/sessions/{sid}/events")


asyncio.run(main())
