"""Drives every operation of openapi/openapi.json through the Python client that
openapi-generator (a generator nobody here wrote or configured) made from it, against the real
service: proof that the document says what the service does, for a generator that takes it at its
word (types, media types, headers, security).

Usage: openapi_generator_client.py BASE_URL GENERATED_DIR [API_KEY]

Prints `ok N operations` at the end; exits non-zero at the first operation that fails, or when
an operation of the document was not driven.
"""
import io
import json
import sys
import tarfile
import threading
import time
import urllib.request

base, generated = sys.argv[1], sys.argv[2]
key = sys.argv[3] if len(sys.argv) > 3 else None
sys.path.insert(0, generated)

import toolexec_gen as gen  # noqa: E402
from toolexec_gen.api import (  # noqa: E402
    CallsApi,
    EnvironmentsApi,
    HealthApi,
    HistoryApi,
    LogApi,
    SessionsApi,
    ToolsApi,
)

config = gen.Configuration(host=base, access_token=key)
client = gen.ApiClient(config)
calls, health, history, log, sessions, tools = (
    CallsApi(client),
    HealthApi(client),
    HistoryApi(client),
    LogApi(client),
    SessionsApi(client),
    ToolsApi(client),
)

driven = set()


def op(name):
    """Marks an operation (its operationId) as driven."""
    driven.add(name)


def call(cid, tool, **arguments):
    # A batch's entry is a oneOf (a call, or an OpenAI shell_call / apply_patch_call item): the
    # generator wraps it in CallItem, and each answer in ItemResultOut.
    return gen.CallItem(gen.Call(id=cid, name=tool, arguments=arguments))


def run(sid, *batch):
    answer = calls.run_calls(sid, gen.CallsRequest(calls=list(batch)))
    return [r.actual_instance for r in answer.results]


def events_of(sid):
    page = log.list_events(sid, limit=1000)
    return page.events


# Health: public, no key needed (the document says `security: []`).
assert health.healthz().status == "ok"
op("healthz")
ready = health.readyz()
assert ready.status == "ready", ready
op("readyz")
metrics = health.metrics()
assert "toolexec" in metrics, metrics[:200]
op("metrics")

# The catalog, in toolexec's shape and in a provider's.
catalog = tools.list_tools()
names = [t.actual_instance.name for t in catalog.tools]
assert "shell" in names and "read_file" in names, names
openai = tools.list_tools(format="openai")
assert openai.tools, openai
op("list_tools")
one = tools.get_tool("read_file")
assert one.actual_instance.name == "read_file", one
op("get_tool")

# A session, seeded with a file; one with an approval gate on the shell.
s = sessions.create_session(
    gen.NewSession(metadata={"via": "openapi-generator"}, files={"src/app.py": "print('seeded')\n"})
)
sid = s.id
op("create_session")
assert sessions.get_session(sid).id == sid
op("get_session")
listed = sessions.list_sessions(limit=100)
assert any(x.id == sid for x in listed.sessions), listed
op("list_sessions")
assert "shell" in [t.actual_instance.name for t in tools.session_tools(sid).tools]
op("session_tools")

# A project in as tar (binary body).
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as tar:
    for path, data in [("pkg/main.py", b"print('from the archive')\n"), ("pkg/data.bin", bytes(range(256)))]:
        info = tarfile.TarInfo(path)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
up = sessions.put_archive(sid, buf.getvalue())
assert up.files == 2, up
op("put_archive")

# Calls: a read, a write, a command, a plan.
results = run(
    sid,
    call("g-1", "read_file", file_path="src/app.py"),
    call("g-2", "write_file", file_path="notes.txt", content="one\n"),
    call("g-3", "shell", command="python3 pkg/main.py && seq 1 3000"),
    call("g-4", "update_plan", plan=[{"step": "drive every operation", "status": "in_progress"}]),
)
assert [r.status.value for r in results] == ["ok"] * 4, [(r.call_id, r.status, r.content[:200]) for r in results]
assert "seeded" in results[0].content, results[0].content
op("run_calls")
after_write = results[1].seq
shell = results[2]

inv = log.get_invocation(shell.invocation_id)
assert inv.call_id == "g-3" and inv.status.value == "ok", inv
op("get_invocation")
out = log.get_output(shell.invocation_id, offset=0, limit=1_000_000)
assert "from the archive" in out.content and "3000" in out.content, out.content[-200:]
op("get_output")
todos = sessions.get_todos(sid)
assert todos.todos and todos.todos[0].subject == "drive every operation", todos
op("get_todos")
page = log.list_events(sid, limit=1000)
kinds = [e.kind.value for e in page.events]
assert "session.created" in kinds and "file.created" in kinds, kinds
op("list_events")
created = next(e for e in page.events if e.kind.value == "file.created")
whole = log.get_event(sid, created.seq)
assert whole.seq == created.seq and whole.kind.value == "file.created", whole
assert whole.data == created.data, (whole.data, created.data)
op("get_event")

# The workspace at a step: tree, files (text and binary, with their headers), tar.
tree = history.get_tree(sid)
paths = [e.path for e in tree.entries]
assert "src/app.py" in paths and "pkg/data.bin" in paths, paths
op("get_tree")
text = history.get_file_with_http_info(sid, "src/app.py")
assert text.status_code == 200 and text.data == b"print('seeded')\n", text.data
assert text.headers["content-type"].startswith("text/plain"), text.headers
assert text.headers["etag"].strip('"') == text.headers["x-toolexec-sha256"], text.headers
binary = history.get_file_with_http_info(sid, "pkg/data.bin")
assert binary.data == bytes(range(256)), binary.data[:20]
assert binary.headers["content-type"] == "application/octet-stream", binary.headers
assert binary.headers["x-toolexec-kind"] == "file", binary.headers
earlier = history.get_file(sid, "notes.txt", at=after_write)
assert earlier == b"one\n", earlier
op("get_file")
tar_bytes = sessions.get_archive_with_http_info(sid, at=after_write)
assert tar_bytes.headers["x-toolexec-seq"] == str(after_write), tar_bytes.headers
with tarfile.open(fileobj=io.BytesIO(tar_bytes.data)) as tar:
    assert "notes.txt" in tar.getnames(), tar.getnames()
op("get_archive")

# Time travel: write again, rewind, fork, replay.
again = run(sid, call("g-5", "write_file", file_path="notes.txt", content="two\n"))
assert again[0].status.value == "ok", again[0].content
rewound = history.rewind(sid, gen.RewindRequest(to_seq=after_write))
assert rewound.to_seq == after_write, rewound
assert history.get_file(sid, "notes.txt") == b"one\n"
op("rewind")
fork = history.fork(sid, gen.ForkRequest(at_seq=after_write, metadata={"fork": True}))
assert fork.origin.session_id == sid, fork
assert history.get_file(fork.id, "notes.txt") == b"one\n"
op("fork")
replay = history.start_replay(sid, gen.ReplayRequest())
assert replay.source_session_id == sid and replay.calls_total >= 5, replay
op("start_replay")
deadline = time.time() + 120
report = history.get_replay(replay.id)
while report.status.value == "running" and time.time() < deadline:
    time.sleep(0.5)
    report = history.get_replay(replay.id)
assert report.status.value == "finished", report
assert report.calls_replayed == report.calls_total, report
op("get_replay")

# Cancelling: one running command by its invocation, another with its session's cancel.
def running_shell(cid, into):
    def go():
        into.append(run(sid, call(cid, "shell", command="sleep 60; echo never"))[0])

    t = threading.Thread(target=go)
    t.start()
    deadline = time.time() + 30
    while time.time() < deadline:
        for e in events_of(sid):
            if e.kind.value == "invocation.started" and e.data.get("call_id") == cid:
                return t, e.invocation_id
        time.sleep(0.2)
    raise AssertionError(f"{cid} never started")


ended = []
t, inv_id = running_shell("g-6", ended)
cancelled = calls.cancel_invocation(inv_id)
assert cancelled.id == inv_id, cancelled
t.join(30)
assert ended and ended[0].status.value == "cancelled", ended
op("cancel_invocation")
ended = []
t, _ = running_shell("g-7", ended)
report = calls.cancel_session_calls(sid)
assert report.session_id == sid and report.ended, report
t.join(30)
assert ended and ended[0].status.value == "cancelled", ended
op("cancel_session_calls")

# Approvals: a gated command approved, another denied.
gated = sessions.create_session(
    gen.NewSession(policy=gen.Policy(approval=gen.ApprovalPolicy(tools=["shell"])))
).id
waiting = run(gated, call("a-1", "shell", command="echo approved-ran"), call("a-2", "shell", command="echo never"))
assert [w.status.value for w in waiting] == ["pending_approval"] * 2, waiting
approved = calls.approve(waiting[0].invocation_id, gen.ApprovalDecision(by="ci", reason="looks fine"))
assert approved.id == waiting[0].invocation_id, approved
deadline = time.time() + 60
while log.get_invocation(waiting[0].invocation_id).status.value in ("pending_approval", "running"):
    assert time.time() < deadline, "the approved call never ended"
    time.sleep(0.2)
assert "approved-ran" in log.get_invocation(waiting[0].invocation_id).content
op("approve")
denied = calls.deny(waiting[1].invocation_id, gen.ApprovalDecision(by="ci", reason="not now"))
assert denied.status.value == "denied", denied
op("deny")

# Pre-pulling an image: this service has no environments configured, so the answer is the
# document's 422 problem, which the generated client raises with its status and body.
try:
    EnvironmentsApi(client).pull_environment(gen.PullRequest(image="registry.example/tool:1"))
except gen.ApiException as e:
    assert e.status == 422, e
    problem = json.loads(e.body)
    assert problem["code"] == "image_not_allowed" and "no environments configured" in problem["detail"], problem
else:
    raise AssertionError("an image was pulled by a service with no environments")
op("pull_environment")

# Closing, then the log as a live stream (it ends after `session.closed`).
closed = sessions.close_session(sid)
assert closed.status.value == "closed", closed
op("close_session")
# A text/event-stream answer is read raw (the generator has no SSE reader); each frame is the
# document's `StreamEvent` (`id`, `event`, `data`), its `data` an `Event`.
raw = log.stream_events_without_preload_content(sid, _request_timeout=60)
assert raw.status == 200, raw.status
assert raw.headers["content-type"].startswith("text/event-stream"), raw.headers
frames = []
for block in raw.read().decode().split("\n\n"):
    frame = {}
    for line in block.splitlines():
        field, _, value = line.partition(":")
        if field in ("id", "event", "data"):
            frame[field] = value[1:] if value.startswith(" ") else value
    if frame:
        frames.append(gen.StreamEvent.from_dict(frame))
streamed = [gen.Event.from_json(f.data) for f in frames]
assert [f.event for f in frames] == [e.kind.value for e in streamed], frames
assert streamed[0].kind.value == "session.created" and streamed[-1].kind.value == "session.closed", streamed
assert [e.seq for e in streamed] == list(range(1, len(streamed) + 1)), [e.seq for e in streamed]
op("stream_events")

# Every operation of the document was driven.
documented = set()
with urllib.request.urlopen(base + "/openapi.json") as doc:
    paths = json.load(doc)["paths"]
for path_item in paths.values():
    for operation in path_item.values():
        documented.add(operation["operationId"])
missing = documented - driven
assert not missing, f"operations not driven: {sorted(missing)}"
print(f"ok {len(driven)} operations")
