"""The official SWE-ReX client (swe-rex 1.4.0, pinned; `.ci/swerex` makes its venv) drives
toolexec sessions through their SWE-ReX API (tests/e2e/swerex.rs runs this against the
compiled binary).

Only the client's own models and RemoteRuntime are used for the API's calls; raw HTTP
(urllib) only where the client cannot go: a missing key, X-Request-ID repeats (the client never
retries), and the REST API for the record (events, verify replay).

    swerex_client.py BASE KEY_A KEY_B

Prints "ok", or fails with the first check that did not hold.
"""

import asyncio
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request

from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (
    BashAction,
    BashInterruptAction,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)
from swerex.runtime.remote import RemoteRuntime

BASE, KEY_A, KEY_B = sys.argv[1:4]


def http(method, path, key=None, body=None, headers=None, auth="x-api-key"):
    """(status, parsed JSON body) of a raw request."""
    h = {"content-type": "application/json"}
    if key and auth == "x-api-key":
        h["X-API-Key"] = key
    elif key:
        h["Authorization"] = f"Bearer {key}"
    h.update(headers or {})
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def new_session():
    status, s = http("POST", "/v1/sessions", KEY_A, {}, auth="bearer")
    assert status == 201, (status, s)
    return s["id"]


def runtime(sid, key=KEY_A):
    # As the docs say: the prefix with the scheme, no trailing slash, no port; a timeout for
    # is_alive (its default is 0.15 s).
    return RemoteRuntime(host=f"{BASE}/v1/sessions/{sid}/swerex", auth_token=key, timeout=30)


async def raises(cls, coro):
    try:
        await coro
    except cls as e:
        return e
    raise AssertionError(f"expected {cls.__name__}")


def run(cmd, **kw):
    return BashAction(command=cmd, **kw)


async def shells(rt, sid):
    # Two named bash sessions, each a terminal of its own, state kept in each.
    out = await rt.create_session(CreateBashSessionRequest())
    assert out.output == "", out
    await raises(SessionExistsError, rt.create_session(CreateBashSessionRequest()))
    await rt.write_file(WriteFileRequest(path="/workspace/env.sh", content="export FROM_RC=sourced\n"))
    await rt.create_session(
        CreateBashSessionRequest(session="two", startup_source=["/workspace/env.sh"])
    )
    r = await rt.run_in_session(run("mkdir -p /workspace/a && cd /workspace/a && export X=7 && f() { echo fn-$1; }"))
    assert r.exit_code == 0 and r.output == "", r
    r = await rt.run_in_session(run("pwd; echo $X; f 1"))
    assert r.output == "/workspace/a\n7\nfn-1\n", r
    r = await rt.run_in_session(run("pwd; echo ${X:-unset} $FROM_RC", session="two"))
    assert r.output == "/workspace\nunset sourced\n", r
    r = await rt.run_in_session(run("printf 'no newline'; (exit 3)", check="silent"))
    assert (r.output, r.exit_code) == ("no newline", 3), r
    r = await rt.run_in_session(run("false", check="ignore"))
    assert r.exit_code is None, r
    e = await raises(NonZeroExitCodeError, rt.run_in_session(run("echo out; false", error_msg="boom")))
    assert "boom" in str(e) and "exit code 1" in str(e), e
    e = await raises(BashIncorrectSyntaxError, rt.run_in_session(run("if then fi; touch /workspace/ran")))
    assert set(e.extra_info) == {"bash_stdout", "bash_stderr"}, e.extra_info
    assert "syntax error" in e.extra_info["bash_stderr"], e.extra_info
    await raises(FileNotFoundError, rt.read_file(ReadFileRequest(path="/workspace/ran")))
    # A multi-line command, a heredoc, quotes, a long line: one command.
    text = "line 'one' \"two\" $HOME\n" + "x" * 5000
    r = await rt.run_in_session(run(f"cat <<'EOF'\n{text}\nEOF\necho done"))
    assert r.output == text + "\ndone\n", r.output[-100:]
    # A timeout, then an interrupt recovers the shell, its state kept.
    e = await raises(CommandTimeoutError, rt.run_in_session(run("sleep 30", timeout=0.5)))
    assert "sleep 30" in str(e), e
    r = await rt.run_in_session(BashInterruptAction())
    assert r.exit_code == 0, r
    r = await rt.run_in_session(run("echo $X; pwd"))
    assert r.output == "7\n/workspace/a\n", r
    # An interactive program, driven with expect.
    r = await rt.run_in_session(run("python3", is_interactive_command=True, expect=[">>> "]))
    assert r.expect_string == ">>> " and "Python" in r.output, r
    r = await rt.run_in_session(run("print(6*7)", is_interactive_command=True, expect=[">>> "]))
    assert r.output == "42", r
    r = await rt.run_in_session(run("quit()", is_interactive_quit=True))
    assert r.expect_string == "SHELLPS1PREFIX", r
    r = await rt.run_in_session(run("echo back in $X"))
    assert r.output == "back in 7\n", r
    await raises(SessionDoesNotExistError, rt.run_in_session(run("true", session="nope")))
    await rt.close_session(CloseBashSessionRequest(session="two"))
    await raises(SessionDoesNotExistError, rt.run_in_session(run("true", session="two")))
    await raises(SessionDoesNotExistError, rt.close_session(CloseBashSessionRequest(session="two")))
    # Two requests racing for one name: exactly one gets it, the other is told it exists (and
    # the shell it started ends).
    both = await asyncio.gather(
        rt.create_session(CreateBashSessionRequest(session="race")),
        rt.create_session(CreateBashSessionRequest(session="race")),
        return_exceptions=True,
    )
    lost = [r for r in both if isinstance(r, BaseException)]
    assert len(lost) == 1 and isinstance(lost[0], SessionExistsError), both
    await rt.close_session(CloseBashSessionRequest(session="race"))
    # A name is bounded (raw HTTP: the client's error for a plain 422 is its own).
    status, body = http("POST", f"/v1/sessions/{sid}/swerex/create_session", KEY_A,
                        {"session": "n" * 257, "session_type": "bash"})
    assert status == 422 and "256 characters" in body["detail"], (status, body)


async def commands(rt):
    r = await rt.execute(Command(command=["printf", "%s|", "a b", "c"]))
    assert (r.stdout, r.stderr, r.exit_code) == ("a b|c|", "", 0), r
    r = await rt.execute(Command(command="echo out; echo err >&2; exit 4", shell=True))
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 4), r
    r = await rt.execute(Command(command="echo out; echo err >&2", shell=True, merge_output_streams=True))
    assert (r.stdout, r.stderr) == ("out\nerr\n", ""), r
    r = await rt.execute(Command(command=["env"], env={"ONLY": "this"}))
    assert r.stdout == "ONLY=this\n", r
    await rt.write_file(WriteFileRequest(path="/workspace/sub/dir/f.txt", content="x"))
    r = await rt.execute(Command(command=["pwd"], cwd="/workspace/sub/dir"))
    assert r.stdout == "/workspace/sub/dir\n", r
    await raises(NonZeroExitCodeError, rt.execute(Command(command=["false"], check=True)))
    await raises(CommandTimeoutError, rt.execute(Command(command=["sleep", "30"], timeout=0.5)))
    await raises(FileNotFoundError, rt.execute(Command(command=["no-such-program"])))
    e = await raises(PermissionError, rt.execute(Command(command=["pwd"], cwd="/etc")))
    assert "/workspace" in str(e), e


async def files(rt):
    # Parents created; replaced whatever is there (read first or not); read back exactly.
    await rt.write_file(WriteFileRequest(path="/workspace/new/deep/a.txt", content="one\n"))
    r = await rt.read_file(ReadFileRequest(path="/workspace/new/deep/a.txt"))
    assert r.content == "one\n", r
    await rt.run_in_session(run("printf 'changed\\r\\nby shell' > /workspace/new/deep/a.txt"))
    r = await rt.read_file(ReadFileRequest(path="/workspace/new/deep/a.txt"))
    assert r.content == "changed\r\nby shell", r
    await rt.write_file(WriteFileRequest(path="/workspace/new/deep/a.txt", content="two"))
    assert (await rt.read_file(ReadFileRequest(path="/workspace/new/deep/a.txt"))).content == "two"
    await raises(FileNotFoundError, rt.read_file(ReadFileRequest(path="/workspace/missing.txt")))
    for path in ["/etc/passwd", "/workspace/../etc/passwd", "/root/x"]:
        e = await raises(PermissionError, rt.read_file(ReadFileRequest(path=path)))
        assert "/workspace" in str(e), e
    e = await raises(PermissionError, rt.write_file(WriteFileRequest(path="/tmp/x", content="x")))
    assert "/workspace" in str(e), e
    # A link out of the workspace is refused like the path it leads to.
    await rt.run_in_session(run("ln -sf /etc/passwd /workspace/escape"))
    e = await raises(PermissionError, rt.read_file(ReadFileRequest(path="/workspace/escape")))
    assert "/workspace" in str(e), e
    # Uploads: a file, and a directory (zipped by the client, unzipped by the archive import).
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(f"{d}/tree/sub")
        with open(f"{d}/tree/sub/x.txt", "w") as f:
            f.write("in a dir\n")
        with open(f"{d}/tree/top.txt", "w") as f:
            f.write("top\n")
        with open(f"{d}/single.bin", "wb") as f:
            f.write(b"\x00\x01binary")
        await rt.upload(UploadRequest(source_path=f"{d}/tree", target_path="/workspace/up"))
        await rt.upload(UploadRequest(source_path=f"{d}/single.bin", target_path="/workspace/one/single.bin"))
    assert (await rt.read_file(ReadFileRequest(path="/workspace/up/sub/x.txt"))).content == "in a dir\n"
    assert (await rt.read_file(ReadFileRequest(path="/workspace/up/top.txt"))).content == "top\n"
    r = await rt.execute(Command(command=["od", "-An", "-c", "/workspace/one/single.bin"]))
    assert "\\0 001   b   i   n" in r.stdout, r
    with tempfile.NamedTemporaryFile() as f:
        e = await raises(PermissionError, rt.upload(UploadRequest(source_path=f.name, target_path="/opt/x")))
        assert "/workspace" in str(e), e


async def other_tenant(sid):
    rt = runtime(sid, KEY_B)
    alive = await rt.is_alive()
    assert not alive.is_alive and "404" in alive.message, alive
    for coro in [
        rt.create_session(CreateBashSessionRequest(session="b")),
        rt.run_in_session(run("true")),
        rt.execute(Command(command=["true"])),
        rt.read_file(ReadFileRequest(path="/workspace/env.sh")),
        rt.write_file(WriteFileRequest(path="/workspace/b.txt", content="b")),
        rt.close(),
    ]:
        try:
            await coro
        except Exception as e:  # aiohttp's ClientResponseError: 404
            assert getattr(e, "status", None) == 404, e
        else:
            raise AssertionError("another tenant's key was served")
    assert http("GET", f"/v1/sessions/{sid}/swerex/is_alive") == (401, {"detail": "Not authenticated"})
    assert http("GET", f"/v1/sessions/{sid}/swerex/is_alive", "tx_wrong") == (401, {"detail": "Invalid API Key"})
    # X-API-Key is this prefix's only: the REST API still wants a bearer token.
    status, _ = http("GET", f"/v1/sessions/{sid}", KEY_A)
    assert status == 401, status
    assert http("GET", f"/v1/sessions/{sid}", KEY_A, auth="bearer")[0] == 200


def request_ids(sid):
    # A repeated X-Request-ID gets the recorded response, and runs nothing again; any earlier
    # id, not only the last.
    def post(rid, cmd):
        return http(
            "POST",
            f"/v1/sessions/{sid}/swerex/run_in_session",
            KEY_A,
            {"command": cmd, "action_type": "bash"},
            headers={"X-Request-ID": rid},
        )

    first = post("rid-1", "echo once >> /workspace/counter; wc -l < /workspace/counter")
    assert first[0] == 200 and first[1]["output"] == "1\n", first
    second = post("rid-2", "echo twice >> /workspace/counter; wc -l < /workspace/counter")
    assert second[1]["output"] == "2\n", second
    assert post("rid-1", "echo once >> /workspace/counter; wc -l < /workspace/counter") == first
    # More expect strings than write_stdin's patterns take: refused, saying why (not a timeout).
    many = http(
        "POST",
        f"/v1/sessions/{sid}/swerex/run_in_session",
        KEY_A,
        {"command": "true", "action_type": "bash", "expect": [f"x{i}" for i in range(16)]},
    )
    assert many[0] == 422 and "at most 15" in many[1]["detail"], many
    failed = post("rid-3", "exit_code_three() { return 3; }; exit_code_three")
    assert failed[0] == 511 and failed[1]["swerexception"]["class_path"].endswith("NonZeroExitCodeError"), failed
    assert post("rid-3", "exit_code_three() { return 3; }; exit_code_three") == failed
    status, body = http("POST", f"/v1/sessions/{sid}/swerex/read_file", KEY_A, {"path": "/workspace/counter"})
    assert body == {"content": "once\ntwice\n"}, body


async def recorded_and_replayed():
    # A session driven only through this API: every request is recorded calls of its tools,
    # and a verify replay re-runs them with no divergence.
    sid = new_session()
    rt = runtime(sid)
    assert (await rt.is_alive()).is_alive
    await rt.create_session(CreateBashSessionRequest())
    await rt.run_in_session(run("cd /workspace && export N=3 && mkdir -p out"))
    await rt.run_in_session(run("for i in $(seq $N); do echo $i; done > out/n.txt; cat out/n.txt"))
    await rt.write_file(WriteFileRequest(path="/workspace/out/w.txt", content="written\n"))
    await rt.read_file(ReadFileRequest(path="/workspace/out/w.txt"))
    await rt.execute(Command(command="ls out | sort", shell=True, cwd="/workspace"))
    await rt.run_in_session(run("false", check="silent"))
    await rt.close_session(CloseBashSessionRequest())
    status, events = http("GET", f"/v1/sessions/{sid}/events?limit=1000", KEY_A, auth="bearer")
    assert status == 200, (status, events)
    names = [e["data"]["name"] for e in events["events"] if e["kind"] == "invocation.started"]
    for tool in ["exec_command", "write_stdin", "write_file", "shell"]:
        assert tool in names, names
    assert any(e["kind"] == "file.created" or e["kind"] == "files.changed" for e in events["events"]), [
        e["kind"] for e in events["events"]
    ]
    status, replay = http("POST", f"/v1/sessions/{sid}/replay", KEY_A, {}, auth="bearer")
    assert status == 200 and replay["status"] == "finished", (status, replay)
    assert replay["calls_replayed"] == len(names) and replay["calls_diverged"] == 0, json.dumps(replay)[:3000]


async def main():
    sid = new_session()
    rt = runtime(sid)
    alive = await rt.is_alive()
    assert alive.is_alive and alive.message == "", alive
    await shells(rt, sid)
    await commands(rt)
    await files(rt)
    await other_tenant(sid)
    request_ids(sid)
    # close: the bash sessions end, the toolexec session stays open.
    await rt.create_session(CreateBashSessionRequest(session="last"))
    await rt.close()
    await raises(SessionDoesNotExistError, rt.run_in_session(run("true", session="last")))
    await raises(SessionDoesNotExistError, rt.run_in_session(run("true")))
    assert (await rt.is_alive()).is_alive
    await recorded_and_replayed()
    print("ok")


asyncio.run(main())
