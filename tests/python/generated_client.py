"""Drives a session through the Python client that openapi-python-client generated from
openapi/openapi.json (the Rust test generates it first): proof that the document is usable by a
standard generator, and that the client it makes works against the real service.

Usage: generated_client.py BASE_URL GENERATED_DIR
"""
import io
import sys
import tarfile

base, generated = sys.argv[1], sys.argv[2]
sys.path.insert(0, generated)

from toolexec_client import Client  # noqa: E402
from toolexec_client.api.calls import run_calls  # noqa: E402
from toolexec_client.api.sessions import close_session, create_session, put_archive  # noqa: E402
from toolexec_client.models import Call, CallArguments, CallsRequest, NewSession, Session  # noqa: E402
from toolexec_client.types import File  # noqa: E402

client = Client(base_url=base, raise_on_unexpected_status=True)

session = create_session.sync(client=client, body=NewSession.from_dict({"metadata": {"via": "generated client"}}))
assert isinstance(session, Session), session
sid = session.id

# A project in as tar, through the binary upload the document declares.
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w") as tar:
    data = b"print('hello from the archive')\n"
    info = tarfile.TarInfo("app/main.py")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
uploaded = put_archive.sync(id=sid, client=client, body=File(payload=io.BytesIO(buf.getvalue())))
assert uploaded is not None and uploaded.files == 1, uploaded

calls = CallsRequest(
    calls=[
        Call(id="gen-1", name="read_file", arguments=CallArguments.from_dict({"file_path": "app/main.py"})),
        Call(id="gen-2", name="shell", arguments=CallArguments.from_dict({"command": "python3 app/main.py"})),
    ]
)
results = run_calls.sync(id=sid, client=client, body=calls)
assert results is not None and len(results.results) == 2, results
read, ran = results.results
assert read.status.value == "ok", read
assert "hello from the archive" in read.content, read.content
assert ran.status.value == "ok", ran
assert "hello from the archive" in ran.content, ran.content

closed = close_session.sync(id=sid, client=client)
assert closed is not None and closed.status.value == "closed", closed
print("ok")
