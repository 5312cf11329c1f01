"""The Python client against the compiled service (SQLite and Postgres), over HTTP."""
from __future__ import annotations

import asyncio
import io
import json
import tarfile
import threading
import time

import pytest

import toolexec
from toolexec import Client, errors

from conftest import Proxy, Service, events_of


@pytest.fixture
def client(service: Service):
    with Client(service.url, service.api_key) as c:
        yield c


def test_client_from_environment_and_a_session_closed_on_exit(service, monkeypatch):
    monkeypatch.setenv("TOOLEXEC_URL", service.url)
    monkeypatch.setenv("TOOLEXEC_API_KEY", service.api_key)
    with Client() as c, c.session(metadata={"test": "env"}, env={"GREETING": "hi"}) as s:
        r = s.shell("echo $GREETING")
        assert r.status == "ok" and not r.is_error and r.content.strip().endswith("hi"), r
        sid = s.id
    assert Client(service.url, service.api_key).attach(sid).info.status == "closed"


def test_a_wrong_key_is_an_auth_error_with_code_status_and_request_id(service):
    with Client(service.url, "not-a-key") as c:
        with pytest.raises(errors.Unauthorized) as e:
            c.session()
    assert isinstance(e.value, errors.AuthError)
    assert e.value.code == "unauthorized" and e.value.status == 401 and e.value.request_id


def test_calls_helpers_and_typed_results(client):
    with client.session(tools=["shell", "read_file", "write_file", "edit_file"]) as s:
        w = s.write_file("a.txt", "one\ntwo\n")
        assert w.status == "ok", w
        r = s.read_file("a.txt")
        assert isinstance(r, toolexec.CallResult) and "two" in r.content and r.seq > 0
        results = s.calls([("shell", {"command": "wc -l < a.txt"}), {"id": "mine", "name": "read_file", "arguments": {"file_path": "a.txt"}}])
        assert [x.call_id for x in results][1] == "mine" and results[0].content.strip().endswith("2")
        # A tool that fails is a result, not an exception.
        bad = s.read_file("missing.txt")
        assert bad.is_error and bad.status == "error"
        unknown = s.call("no_such_tool")
        assert unknown.is_error


def test_every_problem_code_is_a_class_under_a_base(service):
    import urllib.request

    with urllib.request.urlopen(f"{service.url}/openapi.json") as r:
        doc = json.load(r)
    codes = doc["components"]["schemas"]["ProblemCode"]["enum"]
    assert set(codes) == set(errors.BY_CODE), set(codes) ^ set(errors.BY_CODE)
    bases = (errors.InvalidRequestError, errors.AuthError, errors.NotFoundError, errors.ConflictError, errors.UnavailableError)
    for code, cls in errors.BY_CODE.items():
        assert issubclass(cls, bases) and cls.code == code


def test_problems_raise_their_classes_and_409_is_not_retried(client, service):
    with pytest.raises(errors.NotFound) as nf:
        client.attach("00000000-0000-7000-8000-000000000000")
    assert isinstance(nf.value, errors.NotFoundError) and nf.value.status == 404
    with client.session() as s:
        s.call("shell", call_id="same", command="true")
        t0 = time.monotonic()
        with pytest.raises(errors.CallIdReused) as e:
            s.call("shell", call_id="same", command="false")
        assert isinstance(e.value, errors.ConflictError) and time.monotonic() - t0 < 1.0
        with pytest.raises(errors.SeqOutOfRange):
            s.rewind(10_000)
    with pytest.raises(errors.SessionClosed):
        s.shell("true")


def test_events_paged_and_followed(client):
    with client.session() as s:
        s.shell("echo hi > f.txt")
        kinds = [e.kind for e in s.events()]
        assert kinds[0] == "session.created" and "file.created" in kinds
        small = list(s.events(limit=2))
        assert [e.seq for e in small] == list(range(1, len(kinds) + 1))
    followed = list(s.events(follow=True))
    assert followed[-1].kind == "session.closed"
    assert [e.seq for e in followed] == list(range(1, len(followed) + 1))


def test_a_dropped_event_stream_resumes_from_the_last_seq(client, service, proxy: Proxy):
    s = client.session()
    via_proxy = Client(proxy.url, service.api_key, retry=toolexec.Retry(backoff=0.05))
    follower = via_proxy.attach(s.id)
    seen: list = []
    done = threading.Event()

    def follow() -> None:
        for e in follower.events(follow=True):
            seen.append(e)
        done.set()

    threading.Thread(target=follow, daemon=True).start()
    s.shell("echo 1 > one.txt")
    _wait(lambda: any(e.kind == "invocation.finished" for e in seen))
    proxy.cut()  # the stream's connection breaks mid-stream
    cut_at = len(seen)
    s.shell("echo 2 > two.txt")
    s.shell("echo 3 > three.txt")
    s.close()
    assert done.wait(30), "the follower reached session.closed"
    seqs = [e.seq for e in seen]
    assert seqs == list(range(1, len(seqs) + 1)), seqs  # nothing lost, nothing repeated
    assert seen[-1].kind == "session.closed" and len(seen) > cut_at
    assert proxy.cuts == 1 and sum(b"/events/stream" in r for r in proxy.requests) >= 2
    via_proxy.close()


def test_a_call_whose_answer_was_lost_is_retried_and_runs_once(client, service, proxy: Proxy):
    with client.session() as s:
        via_proxy = Client(proxy.url, service.api_key, retry=toolexec.Retry(backoff=0.05))
        mine = via_proxy.attach(s.id)
        proxy.cut_after_response_starts(b"/calls")
        r = mine.call("shell", call_id="once", command="echo ran >> count.txt; wc -l < count.txt")
        assert proxy.cuts == 1, "the first answer was cut"
        assert r.status == "ok" and r.content.strip().endswith("1"), r
        assert s.file("count.txt") == b"ran\n"
        started = [e for e in events_of(service.url, service.api_key, s.id) if e["kind"] == "invocation.started"]
        assert [e["data"]["call_id"] for e in started] == ["once"]
        via_proxy.close()


def test_still_running_is_retried_with_the_same_ids(client, service):
    # The service answers 503 still_running after 3 s (conftest); the call takes 5 s.
    with client.session() as s:
        t0 = time.monotonic()
        r = s.call("shell", call_id="slow", command="sleep 5; echo slept >> log.txt; echo done", timeout_ms=20000)
        assert r.status == "ok" and "done" in r.content and time.monotonic() - t0 >= 5
        assert s.file("log.txt") == b"slept\n"
        # Without retries the same batch surfaces the problem as its class.
        with Client(service.url, service.api_key, retry=toolexec.NO_RETRY) as once:
            with pytest.raises(errors.StillRunning) as e:
                once.attach(s.id).call("shell", call_id="slow2", command="sleep 4", timeout_ms=20000)
        assert e.value.status == 503 and isinstance(e.value, errors.UnavailableError)


def test_a_refused_connection_is_retried_until_the_deadline(service):
    port_closed = "http://127.0.0.1:9"  # nothing listens on discard
    c = Client(port_closed, retry=toolexec.Retry(attempts=50, backoff=0.05, max_backoff=0.1, deadline=1.0))
    t0 = time.monotonic()
    with pytest.raises((errors.DeadlineExceeded, errors.ConnectionFailed)):
        c.session()
    assert 0.5 < time.monotonic() - t0 < 3


def test_fork_rewind_tree_file_and_verify_replay(client):
    with client.session() as s:
        s.write_file("a.txt", "first\n")
        at = s.refresh().last_seq
        s.write_file("a.txt", "second\n")
        assert s.file("a.txt", at_seq=at) == b"first\n" and s.file("a.txt") == b"second\n"
        tree = s.tree(at_seq=at)
        assert [e.path for e in tree.entries] == ["a.txt"]
        with s.fork(at_seq=at) as f:
            assert f.id != s.id and f.read_file("a.txt").content.find("first") >= 0
        rewound = s.rewind(at)
        assert rewound.to_seq == at and s.read_file("a.txt").content.find("first") >= 0
        replay = s.verify_replay()
        assert replay.status == "finished" and replay.calls_diverged == 0, replay


def test_archive_in_and_out(client):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"print('packed')\n"
        info = tarfile.TarInfo("pkg/main.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with client.session() as s:
        up = s.upload(buf.getvalue())
        assert up.files == 1 and up.events == 1
        assert "packed" in s.shell("python3 pkg/main.py").content
        out = tarfile.open(fileobj=io.BytesIO(s.archive()))
        assert out.extractfile("pkg/main.py").read() == data  # type: ignore[union-attr]


def test_approvals_list_approve_and_deny(client):
    with client.session(policy={"approval": {"tools": ["shell"]}}) as s:
        r = s.call("shell", call_id="gated", command="echo approved > ok.txt")
        assert r.status == "pending_approval" and not r.is_error
        d = s.call("shell", call_id="gated2", command="echo no")
        waiting = client.approvals.list(s)
        assert [str(e.invocation_id) for e in waiting] == [str(r.invocation_id), str(d.invocation_id)]
        inv = client.approvals.approve(str(r.invocation_id), by="alice", reason="fine")
        assert inv.status in ("running", "ok")
        client.approvals.deny(str(d.invocation_id), by="bob", reason="no")
        # Retrying the call id gives the recorded result (waiting for it to end).
        _wait(lambda: s.call("shell", call_id="gated", command="echo approved > ok.txt").status == "ok")
        assert s.file("ok.txt") == b"approved\n"
        assert client.approvals.list(s) == []
        with pytest.raises(errors.AlreadyDecided):
            client.approvals.approve(str(d.invocation_id))


def test_async_client_the_same_surface(service):
    async def main() -> None:
        async with toolexec.AsyncClient(service.url, service.api_key) as c:
            async with c.session() as s:
                await s.write_file("x.txt", "async\n")
                results = await asyncio.gather(*(s.read_file("x.txt") for _ in range(4)))
                assert all("async" in r.content for r in results)
                kinds = [e.kind async for e in s.events()]
                assert "file.created" in kinds
                f = await s.fork()
                assert (await f.file("x.txt")) == b"async\n"
                await f.close()
            followed = [e.seq async for e in s.events(follow=True)]
            assert followed == list(range(1, len(followed) + 1))
            with pytest.raises(errors.SessionClosed):
                await s.shell("true")

    asyncio.run(main())


def _wait(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_bash_keeps_its_state_until_restarted(client):
    with client.session() as s:
        assert not s.bash("mkdir -p sub && cd sub && export FOO=bar && f() { echo fn; }").is_error
        r = s.bash("pwd; echo $FOO; f")
        assert r.content.splitlines()[-3:] == ["/workspace/sub", "bar", "fn"], r.content
        s.bash(restart=True)
        r = s.bash("pwd; echo ${FOO:-unset}")
        assert r.content.splitlines()[-2:] == ["/workspace", "unset"], r.content


def test_a_terminal_is_written_read_and_closed(client):
    with client.session() as s:
        with s.terminal("python3 -q -i", tty=True) as t:
            assert t.running and t.session_id is not None, t.started.content
            r = t.write("x = 6 * 7\n", yield_time_ms=1000)
            assert not r.is_error, r.content
            r = t.write("print(x)\n", yield_time_ms=2000)
            assert "42" in r.content, r.content
            sid = t.session_id
        # Closed: Ctrl-C, then end of input, ends the REPL; its id is gone.
        _wait(lambda: not t.running or "exited" in t.read(yield_time_ms=1000).content)
        gone = s.call("write_stdin", session_id=sid, chars="", yield_time_ms=250)
        assert gone.is_error and f"Unknown process id {sid}" in gone.content, gone.content
