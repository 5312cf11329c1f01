"""The compiled service, started per test module on each store (SQLite, Postgres), and a TCP
proxy on loopback that can break connections on purpose.

TOOLEXEC_BIN names the binary (default: target/debug/toolexec of this repository, which
`cargo build -p toolexec-server` makes); TOOLEXEC_TEST_DATABASE_URL the Postgres superuser
connection (default postgres://postgres@127.0.0.1:5432/postgres), under which each test module
creates a database of its own and drops it after.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BIN = Path(os.environ.get("TOOLEXEC_BIN", REPO / "target" / "debug" / "toolexec"))
ADMIN_URL = os.environ.get("TOOLEXEC_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")


@dataclass
class Service:
    url: str
    api_key: str
    store: str
    process: subprocess.Popen[bytes]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _psql(sql: str) -> None:
    subprocess.run(["psql", ADMIN_URL, "-qAtc", sql], check=True, capture_output=True)


def start_service(store: str, extra_env: dict[str, str] | None = None) -> Iterator[Service]:
    assert BIN.is_file(), f"{BIN} is missing: run `cargo build -p toolexec-server` first"
    data = Path(tempfile.mkdtemp(prefix=f"toolexec-py-{store}-"))
    port = _free_port()
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "TOOLEXEC_DATA_DIR": str(data),
        "TOOLEXEC_BIND": f"127.0.0.1:{port}",
        "TOOLEXEC_LOG_FORMAT": "json",
        "RUST_LOG": "warn",
        # A batch longer than this is answered 503 still_running (the retry test needs one).
        "TOOLEXEC_LIMITS__REQUEST_TIMEOUT_MS": "3000",
        **(extra_env or {}),
    }
    db = None
    if store == "postgres":
        db = f"toolexec_pyclient_{uuid.uuid4().hex[:12]}"
        _psql(f"CREATE DATABASE {db}")
        env["TOOLEXEC_DATABASE_URL"] = ADMIN_URL.rsplit("/", 1)[0] + "/" + db
    key = subprocess.run(
        [str(BIN), "keys", "create", "--tenant", "pyclient"], env=env, cwd=data,
        check=True, capture_output=True, text=True,
    ).stdout.strip().splitlines()[-1]
    log = open(data / "server.log", "wb")
    proc = subprocess.Popen([str(BIN), "serve"], env=env, cwd=data, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    import urllib.request

    while True:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"toolexec did not start:\n{(data / 'server.log').read_text()}")
        time.sleep(0.1)
    try:
        yield Service(url, key, store, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        if db:
            _psql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(request: pytest.FixtureRequest) -> Iterator[Service]:
    yield from start_service(request.param)


class Proxy:
    """Forwards 127.0.0.1:port to the service, one thread pair per connection. `cut()` breaks
    every open connection; `cut_after_response_starts(marker)` lets the next request containing
    `marker` reach the service, then breaks the connection as the answer starts coming back (the
    service has acted; the client never sees the answer)."""

    def __init__(self, target_url: str) -> None:
        host, port = target_url.removeprefix("http://").split(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.marker: bytes | None = None
        self.cuts = 0
        self.requests: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.conns += [client, upstream]
            armed = threading.Event()
            threading.Thread(target=self._pipe, args=(client, upstream, armed, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, armed, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, armed: threading.Event, outbound: bool) -> None:
        try:
            while data := src.recv(65536):
                if outbound:
                    self.requests.append(data[:200])
                    if self.marker and self.marker in data:
                        self.marker = None
                        armed.set()
                elif armed.is_set():
                    # The answer starts: the service has finished the calls. Break it here.
                    armed.clear()
                    self.cuts += 1
                    self._close(src, dst)
                    return
                dst.sendall(data)
        except OSError:
            pass
        self._close(src, dst)

    @staticmethod
    def _close(*socks: socket.socket) -> None:
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def cut_after_response_starts(self, marker: bytes) -> None:
        self.marker = marker

    def cut(self) -> None:
        with self.lock:
            conns, self.conns = self.conns, []
        self.cuts += 1
        self._close(*conns)

    def close(self) -> None:
        self.listener.close()
        self.cut()


@pytest.fixture
def proxy(service: Service) -> Iterator[Proxy]:
    p = Proxy(service.url)
    yield p
    p.close()


def events_of(url: str, key: str, sid: str) -> list[dict]:
    import urllib.request

    req = urllib.request.Request(f"{url}/v1/sessions/{sid}/events?limit=1000", headers={"authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req) as r:
        return json.load(r)["events"]  # type: ignore[no-any-return]


def starts_call(e: dict) -> bool:
    """Whether a log event starts a call: its `invocation.started`, or the `invocation.finished`
    of a read recorded in one event (it carries the call's `arguments`)."""
    return e["kind"] == "invocation.started" or (e["kind"] == "invocation.finished" and "arguments" in e["data"])
