"""The client: `Client`/`Session` (blocking) and `AsyncClient`/`AsyncSession` (asyncio).

Each operation is described once, as a request and a parser (`_Ops`, `_SessionOps`); the two
clients only differ in how they send it (`_send` with retries) and wait.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx2

from . import models
from ._retry import Retry, retry_after, retryable
from .errors import ConnectionFailed, DeadlineExceeded, ToolexecError, from_problem

T = TypeVar("T")

CallResult = models.CallResultOut
#: What an OpenAI `shell_call` or `apply_patch_call` item sent with `format="openai"` did: the
#: calls it ran and the output item for the Responses API (`rendered`).
ItemResult = models.OpenAiItemResultOut
#: One entry of a batch's answer: a call's result, or (OpenAI items only) an item's.
Result = CallResult | ItemResult
"""One call's result: `content`, `is_error`, `status`, `rendered` (with a `format`), …"""

DEFAULT_URL = "http://127.0.0.1:8080"


@dataclass
class _Req(Generic[T]):
    """One HTTP request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[httpx2.Response], T]
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    content: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # Safe to send again after a connection broke mid-request (see _retry.py).
    idempotent: bool = False


def _json(model: type[T]) -> Callable[[httpx2.Response], T]:
    return lambda r: model.model_validate_json(r.content)  # type: ignore[attr-defined]


def _raw(r: httpx2.Response) -> Any:
    return r.json()


def _bytes(r: httpx2.Response) -> bytes:
    return r.content


def _none(r: httpx2.Response) -> None:
    return None


def _call_dict(call: Mapping[str, Any] | tuple[Any, ...]) -> dict[str, Any]:
    """`{"name", "arguments", "id"?}` or `(name, arguments)` → a call with an id."""
    if isinstance(call, tuple):
        name, arguments = call
        call = {"name": name, "arguments": arguments}
    if "name" not in call:  # a provider's own item (an OpenAI `shell_call`): sent as it is
        return dict(call)
    out = {"id": call.get("id") or f"call_{uuid.uuid4().hex}", "name": call["name"]}
    out["arguments"] = dict(call.get("arguments") or {})
    return out


def _q(path: str) -> str:
    return quote(path.lstrip("/"), safe="/")


class _Ops:
    """The client-level operations, as requests."""

    @staticmethod
    def create_session(body: dict[str, Any]) -> _Req[models.Session]:
        return _Req("POST", "/v1/sessions", _json(models.Session), json=body)

    @staticmethod
    def get_session(sid: str) -> _Req[models.Session]:
        return _Req("GET", f"/v1/sessions/{sid}", _json(models.Session), idempotent=True)

    @staticmethod
    def list_sessions(limit: int | None, cursor: str | None) -> _Req[models.SessionList]:
        params = {k: v for k, v in {"limit": limit, "cursor": cursor}.items() if v is not None}
        return _Req("GET", "/v1/sessions", _json(models.SessionList), params=params, idempotent=True)

    @staticmethod
    def tools(format: str | None) -> _Req[Any]:
        params = {"format": format} if format else {}
        return _Req("GET", "/v1/tools", _raw, params=params, idempotent=True)

    @staticmethod
    def invocation(iid: str) -> _Req[models.Invocation]:
        return _Req("GET", f"/v1/invocations/{iid}", _json(models.Invocation), idempotent=True)

    @staticmethod
    def output(iid: str) -> _Req[Any]:
        return _Req("GET", f"/v1/invocations/{iid}/output", _raw, idempotent=True)

    @staticmethod
    def decide(iid: str, decision: str, by: str | None, reason: str | None) -> _Req[models.Invocation]:
        body = {k: v for k, v in {"by": by, "reason": reason}.items() if v is not None}
        # The same decision again is answered 200: a retry is harmless.
        return _Req("POST", f"/v1/invocations/{iid}/{decision}", _json(models.Invocation), json=body, idempotent=True)

    @staticmethod
    def replay(rid: str) -> _Req[models.Replay]:
        return _Req("GET", f"/v1/replays/{rid}", _json(models.Replay), idempotent=True)


class _SessionOps:
    """A session's operations, as requests."""

    def __init__(self, sid: str) -> None:
        self.base = f"/v1/sessions/{sid}"

    def calls(self, calls: list[dict[str, Any]], format: str | None) -> _Req[list[Result]]:
        def parse(r: httpx2.Response) -> list[Result]:
            return models.CallsResponse.model_validate_json(r.content).results

        params = {"format": format} if format else {}
        # Idempotent by call id: a recorded call is answered from the record, never run twice.
        return _Req("POST", f"{self.base}/calls", parse, params=params, json={"calls": calls}, idempotent=True)

    def close(self) -> _Req[models.Session]:
        return _Req("DELETE", self.base, _json(models.Session), idempotent=True)

    def info(self) -> _Req[models.Session]:
        return _Req("GET", self.base, _json(models.Session), idempotent=True)

    def tools(self, format: str | None) -> _Req[Any]:
        params = {"format": format} if format else {}
        return _Req("GET", f"{self.base}/tools", _raw, params=params, idempotent=True)

    def events_page(self, after: int, limit: int) -> _Req[models.EventPage]:
        return _Req("GET", f"{self.base}/events", _json(models.EventPage), params={"after": after, "limit": limit}, idempotent=True)

    def fork(self, body: dict[str, Any]) -> _Req[models.Forked]:
        return _Req("POST", f"{self.base}/fork", _json(models.Forked), json=body)

    def rewind(self, to_seq: int, allow_partial: bool) -> _Req[models.RewindResult]:
        body = {"to_seq": to_seq, "allow_partial": allow_partial}
        return _Req("POST", f"{self.base}/rewind", _json(models.RewindResult), json=body)

    def tree(self, at_seq: int | None, cursor: str | None, limit: int | None) -> _Req[models.Tree]:
        params = {k: v for k, v in {"at": at_seq, "cursor": cursor, "limit": limit}.items() if v is not None}
        return _Req("GET", f"{self.base}/tree", _json(models.Tree), params=params, idempotent=True)

    def file(self, path: str, at_seq: int | None) -> _Req[bytes]:
        params = {"at": at_seq} if at_seq is not None else {}
        return _Req("GET", f"{self.base}/files/{_q(path)}", _bytes, params=params, idempotent=True)

    def replay(self) -> _Req[models.Replay]:
        return _Req("POST", f"{self.base}/replay", _json(models.Replay), json={"mode": "verify"})

    def archive(self, at_seq: int | None, allow_partial: bool) -> _Req[bytes]:
        params: dict[str, Any] = {"at": at_seq} if at_seq is not None else {}
        if allow_partial:
            params["allow_partial"] = "true"
        return _Req("GET", f"{self.base}/archive", _bytes, params=params, idempotent=True)

    def upload(self, data: bytes) -> _Req[models.ArchiveUploaded]:
        return _Req(
            "PUT", f"{self.base}/archive", _json(models.ArchiveUploaded), content=data,
            headers={"content-type": "application/octet-stream"}, idempotent=True,
        )

    def cancel(self) -> _Req[Any]:
        return _Req("POST", f"{self.base}/cancel", _raw, idempotent=True)


def _session_body(
    tools: list[str] | None, policy: Mapping[str, Any] | None, env: Mapping[str, str] | None,
    environment: str | None, metadata: Mapping[str, Any] | None, files: Mapping[str, str] | None,
) -> dict[str, Any]:
    body = {
        "tools": tools, "policy": dict(policy) if policy is not None else None,
        "env": dict(env) if env is not None else None, "environment": environment,
        "metadata": dict(metadata) if metadata is not None else None,
        "files": dict(files) if files is not None else None,
    }
    return {k: v for k, v in body.items() if v is not None}


class _Base:
    def __init__(self, url: str | None, api_key: str | None, retry: Retry | None, timeout: float) -> None:
        self.url = (url or os.environ.get("TOOLEXEC_URL") or DEFAULT_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("TOOLEXEC_API_KEY")
        self.retry = retry or Retry()
        self._headers = {"user-agent": "toolexec-python"}
        if self.api_key:
            self._headers["authorization"] = f"Bearer {self.api_key}"
        # connect/write/pool bounded; reads wait for a batch (the service bounds it with
        # `limits.request_timeout_ms`, then answers `still_running`) within the deadline.
        self._timeout = httpx2.Timeout(timeout, read=None)

    def _check(self, r: httpx2.Response) -> None:
        if r.status_code >= 400:
            try:
                body: Any = r.json()
            except ValueError:
                body = r.text
            raise from_problem(r.status_code, body, r.headers.get("x-request-id"), retry_after(r))

    def _budget(self, start: float, attempt: int, error: BaseException, idempotent: bool) -> float:
        """Seconds to wait before the next attempt; raises when there is none."""
        if attempt >= self.retry.attempts or not retryable(error, idempotent):
            self._give_up(error)
        wait = self.retry.wait(attempt, getattr(error, "retry_after", None))
        if time.monotonic() + wait - start > self.retry.deadline:
            raise DeadlineExceeded(f"gave up after {attempt} attempts: {error}") from error
        return wait

    @staticmethod
    def _give_up(error: BaseException) -> None:
        if isinstance(error, ToolexecError):
            raise error
        raise ConnectionFailed(f"{type(error).__name__}: {error}") from error


# ----------------------------------------------------------------------------------------------
# Blocking client


class Client(_Base):
    """A toolexec service. `url` and `api_key` default to TOOLEXEC_URL and TOOLEXEC_API_KEY."""

    def __init__(
        self, url: str | None = None, api_key: str | None = None, *, retry: Retry | None = None,
        timeout: float = 30.0, http: httpx2.Client | None = None,
    ) -> None:
        super().__init__(url, api_key, retry, timeout)
        self._http = http or httpx2.Client(timeout=self._timeout, limits=httpx2.Limits(max_connections=100, max_keepalive_connections=100))
        self.approvals = Approvals(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, req: _Req[T]) -> T:
        start = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                r = self._http.request(
                    req.method, self.url + req.path, params=req.params or None, json=req.json,
                    content=req.content, headers={**self._headers, **req.headers},
                )
                self._check(r)
                return req.parse(r)
            except (httpx2.TransportError, ToolexecError) as e:
                time.sleep(self._budget(start, attempt, e, req.idempotent))

    def session(
        self, tools: list[str] | None = None, policy: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None, environment: str | None = None,
        metadata: Mapping[str, Any] | None = None, files: Mapping[str, str] | None = None,
    ) -> Session:
        """Creates a session; `with client.session(...) as s:` closes it on exit."""
        info = self._send(_Ops.create_session(_session_body(tools, policy, env, environment, metadata, files)))
        return Session(self, info)

    def attach(self, session_id: str) -> Session:
        """A session that exists (opened elsewhere, or a fork's)."""
        return Session(self, self._send(_Ops.get_session(session_id)))

    def sessions(self, limit: int | None = None, cursor: str | None = None) -> models.SessionList:
        return self._send(_Ops.list_sessions(limit, cursor))

    def tools(self, format: str | None = None) -> Any:
        """The catalog (`GET /v1/tools`), in toolexec's shape or a provider's (`format`)."""
        return self._send(_Ops.tools(format))

    def invocation(self, invocation_id: str) -> models.Invocation:
        return self._send(_Ops.invocation(invocation_id))

    def output(self, invocation_id: str) -> Any:
        """An invocation's full output (`GET /v1/invocations/{id}/output`)."""
        return self._send(_Ops.output(invocation_id))


class Approvals:
    """Calls waiting for a person (`policy.approval`)."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self, session: Session | str) -> list[models.Event]:
        """The `approval.requested` events of a session not yet decided (oldest first)."""
        s = session if isinstance(session, Session) else self._c.attach(session)
        return _pending(s.events())

    def approve(self, invocation_id: str, by: str | None = None, reason: str | None = None) -> models.Invocation:
        return self._c._send(_Ops.decide(invocation_id, "approve", by, reason))

    def deny(self, invocation_id: str, by: str | None = None, reason: str | None = None) -> models.Invocation:
        return self._c._send(_Ops.decide(invocation_id, "deny", by, reason))


def _pending(events: Iterable[models.Event]) -> list[models.Event]:
    waiting: dict[str, models.Event] = {}
    for e in events:
        iid = str(e.invocation_id) if e.invocation_id else None
        if e.kind == "approval.requested" and iid:
            waiting[iid] = e
        elif e.kind in ("approval.decided", "invocation.finished") and iid:
            waiting.pop(iid, None)
    return list(waiting.values())


class Session:
    """An open session. Calls, its log, time travel, archives, provider helpers."""

    def __init__(self, client: Client, info: models.Session) -> None:
        self.client = client
        self.info = info
        self.id = str(info.id)
        self._ops = _SessionOps(self.id)
        from .providers import Anthropic, OpenAI

        self.anthropic = Anthropic(self)
        self.openai = OpenAI(self)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<toolexec.Session {self.id}>"

    def close(self) -> models.Session:
        self.info = self.client._send(self._ops.close())
        return self.info

    def refresh(self) -> models.Session:
        self.info = self.client._send(self._ops.info())
        return self.info

    # Calls ------------------------------------------------------------------------------------

    def calls(self, calls: Iterable[Mapping[str, Any] | tuple[Any, ...]], format: str | None = None) -> list[Result]:
        """Runs a batch: each `{"name", "arguments", "id"?}` or `(name, arguments)`. Retried safely
        with the same ids (an id is made for a call without one)."""
        return self.client._send(self._ops.calls([_call_dict(c) for c in calls], format))

    def call(self, name: str, /, *, call_id: str | None = None, **arguments: Any) -> CallResult:
        """Runs one call: `s.call("read_file", file_path="a.txt")`."""
        return _one(self.calls([{"id": call_id, "name": name, "arguments": arguments}]))

    def shell(self, command: str, **arguments: Any) -> CallResult:
        return self.call("shell", command=command, **arguments)

    def read_file(self, file_path: str, **arguments: Any) -> CallResult:
        return self.call("read_file", file_path=file_path, **arguments)

    def write_file(self, file_path: str, content: str) -> CallResult:
        return self.call("write_file", file_path=file_path, content=content)

    def bash(self, command: str | None = None, restart: bool = False) -> CallResult:
        """The persistent shell (Anthropic's `bash` arguments): state carries over between calls."""
        arguments: dict[str, Any] = {"restart": True} if restart else {}
        if command is not None:
            arguments["command"] = command
        return self.call("bash", **arguments)

    def terminal(self, cmd: str, *, tty: bool = True, **arguments: Any) -> Terminal:
        """Starts a program (`exec_command`); write to and read from it with the Terminal."""
        r = self.call("exec_command", cmd=cmd, tty=tty, **arguments)
        return Terminal(self, r)

    def cancel(self) -> Any:
        """Cancels every pending call of the session."""
        return self.client._send(self._ops.cancel())

    def tools(self, format: str | None = None) -> Any:
        return self.client._send(self._ops.tools(format))

    # The log ----------------------------------------------------------------------------------

    def events(self, after: int = 0, follow: bool = False, limit: int = 1000) -> Iterator[models.Event]:
        """The log after `after`. With `follow`, the live stream until the session closes,
        reconnecting after a dropped connection from the last seq seen."""
        if not follow:
            while True:
                page = self.client._send(self._ops.events_page(after, limit))
                yield from page.events
                if len(page.events) < limit or not page.events:
                    return
                after = page.events[-1].seq
        yield from self._follow(after)

    def _follow(self, after: int) -> Iterator[models.Event]:
        c = self.client
        start, attempt = time.monotonic(), 0
        while True:
            try:
                with c._http.stream(
                    "GET", f"{c.url}{self._ops.base}/events/stream",
                    headers={**c._headers, "last-event-id": str(after), "accept": "text/event-stream"},
                ) as r:
                    if r.status_code >= 400:
                        r.read()
                        c._check(r)
                    for sse in httpx2.EventSource(r):
                        if sse.event.startswith("stream."):  # overflow or error: resume
                            after = int(json.loads(sse.data).get("resume_after", after))
                            break
                        if not sse.id:
                            continue
                        event = models.Event.model_validate_json(sse.data)
                        after = event.seq
                        attempt, start = 0, time.monotonic()
                        yield event
                        if event.kind == "session.closed":
                            return
                    else:
                        return  # the service ended the stream: the session is closed
            except (httpx2.TransportError, ToolexecError) as e:
                attempt += 1
                time.sleep(c._budget(start, attempt, e, True))

    # Time travel and replay -------------------------------------------------------------------

    def fork(self, at_seq: int | None = None, *, policy: Mapping[str, Any] | None = None,
             tools: list[str] | None = None, metadata: Mapping[str, Any] | None = None,
             allow_partial: bool = False) -> Session:
        """A new session starting as this one was right after `at_seq` (default: now)."""
        body = {"at_seq": at_seq, "policy": policy, "tools": tools, "metadata": metadata}
        body = {k: v for k, v in body.items() if v is not None}
        if allow_partial:
            body["allow_partial"] = True
        forked: models.Forked = self.client._send(self._ops.fork(body))
        return Session(self.client, forked)

    def rewind(self, to_seq: int, allow_partial: bool = False) -> models.RewindResult:
        return self.client._send(self._ops.rewind(to_seq, allow_partial))

    def tree(self, at_seq: int | None = None, cursor: str | None = None, limit: int | None = None) -> models.Tree:
        return self.client._send(self._ops.tree(at_seq, cursor, limit))

    def file(self, path: str, at_seq: int | None = None) -> bytes:
        """A file's bytes as they were right after `at_seq` (default: now)."""
        return self.client._send(self._ops.file(path, at_seq))

    def verify_replay(self, wait: bool = True, poll: float = 0.25) -> models.Replay:
        """Re-runs the session's calls in a fresh one and compares; waits for the report."""
        replay = self.client._send(self._ops.replay())
        while wait and replay.status == "running":
            time.sleep(poll)
            replay = self.client._send(_Ops.replay(str(replay.id)))
        return replay

    # Archives ---------------------------------------------------------------------------------

    def archive(self, at_seq: int | None = None, allow_partial: bool = False) -> bytes:
        """The workspace (now, or right after `at_seq`) as a tar."""
        return self.client._send(self._ops.archive(at_seq, allow_partial))

    def upload(self, data: bytes) -> models.ArchiveUploaded:
        """Unpacks a tar (or tar.gz) into the workspace."""
        return self.client._send(self._ops.upload(data))


class Terminal:
    """A program started with `exec_command`, driven with `write_stdin`."""

    def __init__(self, session: Session, started: CallResult) -> None:
        self.session = session
        self.started = started
        self.output = started.content
        self.session_id = _terminal_id(started)

    @property
    def running(self) -> bool:
        return self.session_id is not None

    def write(self, chars: str, **arguments: Any) -> CallResult:
        """Sends `chars` (`"\\u0003"` is Ctrl-C); the result holds what the program printed."""
        r = self.session.call("write_stdin", session_id=self.session_id, chars=chars, **arguments)
        self._seen(r)
        return r

    def read(self, **arguments: Any) -> CallResult:
        """Polls for output without writing."""
        return self.write("", **arguments)

    def close(self) -> None:
        """Ends the program (Ctrl-C, then end of input) if it still runs."""
        if self.running:
            self.write("\u0003")
        if self.running:
            self.write("\u0004")

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _seen(self, r: CallResult) -> None:
        self.output = r.content
        if "Process exited with code" in r.content or r.is_error:
            self.session_id = None


def _one(results: list[Result]) -> CallResult:
    """The result of a batch of one named call (never an OpenAI item's)."""
    (r,) = results
    if not isinstance(r, CallResult):
        raise TypeError(f"expected a call's result, got an item's: {r!r}")
    return r


def _terminal_id(r: CallResult) -> int | None:
    for line in r.content.splitlines():
        if line.startswith("Process running with session ID "):
            return int(line.rsplit(" ", 1)[1])
    return None


# ----------------------------------------------------------------------------------------------
# asyncio client: the same surface, awaited.


class AsyncClient(_Base):
    """`async with AsyncClient() as c: async with await c.session() as s: await s.shell("ls")`."""

    def __init__(
        self, url: str | None = None, api_key: str | None = None, *, retry: Retry | None = None,
        timeout: float = 30.0, http: httpx2.AsyncClient | None = None,
    ) -> None:
        super().__init__(url, api_key, retry, timeout)
        self._http = http or httpx2.AsyncClient(timeout=self._timeout, limits=httpx2.Limits(max_connections=100, max_keepalive_connections=100))
        self.approvals = AsyncApprovals(self)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _send(self, req: _Req[T]) -> T:
        start = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                r = await self._http.request(
                    req.method, self.url + req.path, params=req.params or None, json=req.json,
                    content=req.content, headers={**self._headers, **req.headers},
                )
                self._check(r)
                return req.parse(r)
            except (httpx2.TransportError, ToolexecError) as e:
                await asyncio.sleep(self._budget(start, attempt, e, req.idempotent))

    def session(
        self, tools: list[str] | None = None, policy: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None, environment: str | None = None,
        metadata: Mapping[str, Any] | None = None, files: Mapping[str, str] | None = None,
    ) -> _SessionOpener:
        """`async with client.session(...) as s:` (closes on exit), or `s = await client.session()`."""
        return _SessionOpener(self, _session_body(tools, policy, env, environment, metadata, files))

    async def attach(self, session_id: str) -> AsyncSession:
        return AsyncSession(self, await self._send(_Ops.get_session(session_id)))

    async def sessions(self, limit: int | None = None, cursor: str | None = None) -> models.SessionList:
        return await self._send(_Ops.list_sessions(limit, cursor))

    async def tools(self, format: str | None = None) -> Any:
        return await self._send(_Ops.tools(format))

    async def invocation(self, invocation_id: str) -> models.Invocation:
        return await self._send(_Ops.invocation(invocation_id))

    async def output(self, invocation_id: str) -> Any:
        return await self._send(_Ops.output(invocation_id))


class _SessionOpener:
    """What `AsyncClient.session()` returns: awaitable, or an async context manager."""

    def __init__(self, client: AsyncClient, body: dict[str, Any]) -> None:
        self._c, self._body = client, body
        self._s: AsyncSession | None = None

    def __await__(self) -> Any:
        return self._open().__await__()

    async def _open(self) -> AsyncSession:
        return AsyncSession(self._c, await self._c._send(_Ops.create_session(self._body)))

    async def __aenter__(self) -> AsyncSession:
        self._s = await self._open()
        return self._s

    async def __aexit__(self, *exc: object) -> None:
        if self._s is not None:
            await self._s.close()


class AsyncApprovals:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self, session: AsyncSession | str) -> list[models.Event]:
        s = session if isinstance(session, AsyncSession) else await self._c.attach(session)
        return _pending([e async for e in s.events()])

    async def approve(self, invocation_id: str, by: str | None = None, reason: str | None = None) -> models.Invocation:
        return await self._c._send(_Ops.decide(invocation_id, "approve", by, reason))

    async def deny(self, invocation_id: str, by: str | None = None, reason: str | None = None) -> models.Invocation:
        return await self._c._send(_Ops.decide(invocation_id, "deny", by, reason))


class AsyncSession:
    """An open session, awaited. The same methods as `Session`."""

    def __init__(self, client: AsyncClient, info: models.Session) -> None:
        self.client = client
        self.info = info
        self.id = str(info.id)
        self._ops = _SessionOps(self.id)
        from .providers import AsyncAnthropic, AsyncOpenAI

        self.anthropic = AsyncAnthropic(self)
        self.openai = AsyncOpenAI(self)

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<toolexec.AsyncSession {self.id}>"

    async def close(self) -> models.Session:
        self.info = await self.client._send(self._ops.close())
        return self.info

    async def refresh(self) -> models.Session:
        self.info = await self.client._send(self._ops.info())
        return self.info

    async def calls(self, calls: Iterable[Mapping[str, Any] | tuple[Any, ...]], format: str | None = None) -> list[Result]:
        return await self.client._send(self._ops.calls([_call_dict(c) for c in calls], format))

    async def call(self, name: str, /, *, call_id: str | None = None, **arguments: Any) -> CallResult:
        return _one(await self.calls([{"id": call_id, "name": name, "arguments": arguments}]))

    async def shell(self, command: str, **arguments: Any) -> CallResult:
        return await self.call("shell", command=command, **arguments)

    async def read_file(self, file_path: str, **arguments: Any) -> CallResult:
        return await self.call("read_file", file_path=file_path, **arguments)

    async def write_file(self, file_path: str, content: str) -> CallResult:
        return await self.call("write_file", file_path=file_path, content=content)

    async def bash(self, command: str | None = None, restart: bool = False) -> CallResult:
        arguments: dict[str, Any] = {"restart": True} if restart else {}
        if command is not None:
            arguments["command"] = command
        return await self.call("bash", **arguments)

    async def terminal(self, cmd: str, *, tty: bool = True, **arguments: Any) -> AsyncTerminal:
        r = await self.call("exec_command", cmd=cmd, tty=tty, **arguments)
        return AsyncTerminal(self, r)

    async def cancel(self) -> Any:
        return await self.client._send(self._ops.cancel())

    async def tools(self, format: str | None = None) -> Any:
        return await self.client._send(self._ops.tools(format))

    async def events(self, after: int = 0, follow: bool = False, limit: int = 1000) -> AsyncIterator[models.Event]:
        if not follow:
            while True:
                page = await self.client._send(self._ops.events_page(after, limit))
                for e in page.events:
                    yield e
                if len(page.events) < limit or not page.events:
                    return
                after = page.events[-1].seq
        c = self.client
        start, attempt = time.monotonic(), 0
        while True:
            try:
                async with c._http.stream(
                    "GET", f"{c.url}{self._ops.base}/events/stream",
                    headers={**c._headers, "last-event-id": str(after), "accept": "text/event-stream"},
                ) as r:
                    if r.status_code >= 400:
                        await r.aread()
                        c._check(r)
                    ended = True
                    async for sse in httpx2.EventSource(r):
                        if sse.event.startswith("stream."):
                            after = int(json.loads(sse.data).get("resume_after", after))
                            ended = False
                            break
                        if not sse.id:
                            continue
                        event = models.Event.model_validate_json(sse.data)
                        after = event.seq
                        attempt, start = 0, time.monotonic()
                        yield event
                        if event.kind == "session.closed":
                            return
                    if ended:
                        return
            except (httpx2.TransportError, ToolexecError) as e:
                attempt += 1
                await asyncio.sleep(c._budget(start, attempt, e, True))

    async def fork(self, at_seq: int | None = None, *, policy: Mapping[str, Any] | None = None,
                   tools: list[str] | None = None, metadata: Mapping[str, Any] | None = None,
                   allow_partial: bool = False) -> AsyncSession:
        body = {"at_seq": at_seq, "policy": policy, "tools": tools, "metadata": metadata}
        body = {k: v for k, v in body.items() if v is not None}
        if allow_partial:
            body["allow_partial"] = True
        forked: models.Forked = await self.client._send(self._ops.fork(body))
        return AsyncSession(self.client, forked)

    async def rewind(self, to_seq: int, allow_partial: bool = False) -> models.RewindResult:
        return await self.client._send(self._ops.rewind(to_seq, allow_partial))

    async def tree(self, at_seq: int | None = None, cursor: str | None = None, limit: int | None = None) -> models.Tree:
        return await self.client._send(self._ops.tree(at_seq, cursor, limit))

    async def file(self, path: str, at_seq: int | None = None) -> bytes:
        return await self.client._send(self._ops.file(path, at_seq))

    async def verify_replay(self, wait: bool = True, poll: float = 0.25) -> models.Replay:
        replay = await self.client._send(self._ops.replay())
        while wait and replay.status == "running":
            await asyncio.sleep(poll)
            replay = await self.client._send(_Ops.replay(str(replay.id)))
        return replay

    async def archive(self, at_seq: int | None = None, allow_partial: bool = False) -> bytes:
        return await self.client._send(self._ops.archive(at_seq, allow_partial))

    async def upload(self, data: bytes) -> models.ArchiveUploaded:
        return await self.client._send(self._ops.upload(data))


class AsyncTerminal:
    def __init__(self, session: AsyncSession, started: CallResult) -> None:
        self.session = session
        self.started = started
        self.output = started.content
        self.session_id = _terminal_id(started)

    @property
    def running(self) -> bool:
        return self.session_id is not None

    async def write(self, chars: str, **arguments: Any) -> CallResult:
        r = await self.session.call("write_stdin", session_id=self.session_id, chars=chars, **arguments)
        self.output = r.content
        if "Process exited with code" in r.content or r.is_error:
            self.session_id = None
        return r

    async def read(self, **arguments: Any) -> CallResult:
        return await self.write("", **arguments)

    async def close(self) -> None:
        if self.running:
            await self.write("\u0003")
        if self.running:
            await self.write("\u0004")

    async def __aenter__(self) -> AsyncTerminal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
