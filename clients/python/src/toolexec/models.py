# Generated from openapi/openapi.json by clients/generate (datamodel-code-generator); do not edit.

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, RootModel


class AnthropicTool(BaseModel):
    """
    Anthropic Messages `tools` entry (strict tool use).
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    name: str
    description: str
    input_schema: dict[str, Any]
    """
    The arguments' JSON Schema in Anthropic's strict form (as OpenAI's, without the
    numeric and length constraints it does not take: the descriptions say them, and the
    service enforces them).
    """
    strict: bool
    """
    Always `true`.
    """


class ApprovalDecision(BaseModel):
    """
    A person's decision on a waiting call. Both fields are optional (`{}` is a decision).
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    by: str | None = Field(
        None, examples=["alice@example.com"], max_length=200, min_length=1
    )
    """
    Who decides, as the record should name them (a user name, a reviewer's id); recorded
    with the tenant whose API key made the request. 1 to 200 characters.
    """
    reason: str | None = Field(
        None, examples=["rm -rf is not allowed in this repository"], max_length=2000
    )
    """
    Why: recorded, and for a denial part of what the model reads. At most 2,000 characters.
    """


class ArchiveUploaded(BaseModel):
    """
    What an archive upload put in a session's workspace (`PUT /v1/sessions/{id}/archive`).
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    files: int = Field(..., ge=0)
    """
    Regular files in the archive.
    """
    symlinks: int = Field(..., ge=0)
    """
    Symlinks in the archive.
    """
    directories: int = Field(..., ge=0)
    """
    Directory entries (not recorded: the log records files and symlinks).
    """
    bytes: int = Field(..., ge=0)
    """
    Bytes of file contents unpacked.
    """
    events: int = Field(..., ge=0)
    """
    File events recorded (created or modified; a file that already held these bytes is not
    a change).
    """
    last_seq: int
    """
    The session's last seq after the upload.
    """


class Call(BaseModel):
    """
    One tool call, as emitted by the model.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    id: str = Field(..., examples=["toolu_01"], max_length=256, min_length=1)
    """
    The model's tool-call id; unique within a session. A repeated id returns the recorded
    result instead of running again. 1 to 256 characters.
    """
    name: str = Field(..., examples=["read_file"])
    """
    Tool name from the catalog.
    """
    arguments: dict[str, Any] | None = None
    """
    The tool's arguments, validated against its `input_schema`.
    """


class Divergence(BaseModel):
    """
    The first difference of one aspect of a call.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    aspect: Literal["status", "output", "side_effects"]
    """
    What of a call is compared.
    """
    detail: str
    """
    In words: `line 3 of the output differs`, `a.txt: contents differ`, …
    """
    line: int | None = Field(None, ge=0)
    """
    The 1-based line of the output where it first differs (`output`).
    """
    path: str | None = None
    """
    The file whose change differs first (`side_effects`), workspace-relative.
    """
    recorded: str | None = None
    """
    What the source session recorded there (a line, a status, a hash), cut to 500
    characters; absent when it had nothing.
    """
    replayed: str | None = None
    """
    What the replay got there, likewise.
    """


class EnvironmentRequest(BaseModel):
    """
    `environment` of `POST /v1/sessions`.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    image: str
    """
    A name of `environments.images` (`"py312"`), or `host/repo:tag`, `host/repo@sha256:…`
    of a registry in `environments.allow_registries`.
    """


class FileBytes(RootModel[bytes]):
    root: bytes
    """
    A file's bytes, as they are (text or not).
    """


class Health(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
    )
    status: str
    """
    `ok`
    """


class McpAnnotations(BaseModel):
    """
    What an MCP client is told about a tool's effects.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    readOnlyHint: bool
    """
    It changes nothing (files, processes).
    """
    destructiveHint: bool
    """
    It may overwrite or delete what is there (files, processes, the session's plan): every
    tool that is not read-only here.
    """
    openWorldHint: bool
    """
    It reaches outside the session: the network (in the catalog, tools with the `network`
    capability; on a session's MCP endpoint also the tools that run processes when the
    session's policy allows the network).
    """


class McpTool(BaseModel):
    """
    An MCP `tools/list` entry.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    name: str
    description: str
    inputSchema: dict[str, Any]
    """
    toolexec's own form of the schema (MCP has no strict mode).
    """
    annotations: McpAnnotations


class OpenAiChatFunction(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
    )
    name: str
    description: str
    parameters: dict[str, Any]
    """
    As [`OpenAiTool::parameters`].
    """
    strict: bool
    """
    Always `true`.
    """


class OpenAiChatTool(BaseModel):
    """
    OpenAI Chat Completions `tools` entry (strict mode).
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    type: str = Field(..., examples=["function"])
    """
    Always `function`.
    """
    function: OpenAiChatFunction


class OpenAiTool(BaseModel):
    """
    OpenAI Responses API `tools` entry (strict mode).
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    type: str = Field(..., examples=["function"])
    """
    Always `function`.
    """
    name: str
    description: str
    parameters: dict[str, Any]
    """
    The arguments' JSON Schema in OpenAI's strict form: closed objects, every property
    required, optional ones nullable (`null` means "not given").
    """
    strict: bool
    """
    Always `true`.
    """


class OutputSlice(BaseModel):
    """
    A slice of an invocation's full, untruncated output.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    invocation_id: UUID
    offset: int = Field(..., ge=0)
    total_chars: int = Field(..., ge=0)
    next_offset: int | None = Field(None, ge=0)
    """
    Where the next slice starts; `null` at the end.
    """
    content: str
    complete: bool
    """
    `false` when the service recorded only the beginning and the end of this output (it was
    over `limits.max_stored_output_bytes`): the text then has a marker, where the middle was
    dropped, saying how much. `total_chars` counts the stored text.
    """
    output_chars: int = Field(..., ge=0)
    """
    Length of the output the tool produced, in characters.
    """


class PatchOperation(BaseModel):
    """
    The file operation of an `apply_patch_call`.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    type: str = Field(..., pattern="^(create_file|update_file|delete_file)$")
    """
    `create_file`, `update_file` or `delete_file`.
    """
    path: str = Field(..., min_length=1)
    """
    The file, relative to /workspace or absolute under it.
    """
    diff: str | None = None
    """
    In OpenAI's V4A form: for `create_file` every line starts with `+`; for `update_file`
    `@@` hunks of ` ` context, `-` removed and `+` added lines. Not given for `delete_file`.
    """


class OutputLimits(RootModel[int]):
    root: int = Field(..., ge=0)


class PullRequest(BaseModel):
    """
    The body of `POST /v1/environments`.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    image: str
    """
    A name of `environments.images`, or a reference to a registry in
    `environments.allow_registries` — what a session's `environment.image` may be.
    """


class ReplayRequest(BaseModel):
    """
    The body of `POST /v1/sessions/{id}/replay`.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    mode: Literal["verify"] | None = None
    """
    `verify` (the default): re-run and compare.
    """


class ReplayedCall(BaseModel):
    """
    One recorded call and how its re-run compares.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    call_id: str
    name: str
    recorded_invocation_id: UUID
    """
    The recorded invocation of the source session.
    """
    replayed_invocation_id: UUID | None = None
    """
    The invocation of the replay session (absent if it could not run).
    """
    recorded_status: Literal["running", "pending_approval", "ok", "error", "invalid_arguments", "unknown_tool", "denied", "timed_out", "cancelled", "interrupted"]
    """
    The state of a recorded invocation: still running, or finished with a [`CallStatus`].
    """
    replayed_status: Literal["running", "pending_approval", "ok", "error", "invalid_arguments", "unknown_tool", "denied", "timed_out", "cancelled", "interrupted"] | None = (
        None
    )
    served_from_record: bool
    """
    Whether its result came from the record instead of running again (observations from
    outside, such as web responses, matched by tool, arguments and ordinal).
    """
    status_matched: bool
    output_matched: bool
    side_effects_matched: bool
    divergences: list[Divergence]
    """
    The first difference of each aspect that did not match; empty when the call matched.
    """


class RewindRequest(BaseModel):
    """
    The body of `POST /v1/sessions/{id}/rewind`.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    to_seq: int
    """
    The workspace goes back to its state right after this event.
    """
    allow_partial: bool | None = None
    """
    Go ahead even if the state has files whose contents the log does not hold (they are
    left as they are and listed); otherwise such a rewind is a 409 `unrestorable`.
    """


class Rewound(BaseModel):
    """
    The payload of a `workspace.rewound` event.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    to_seq: int
    """
    The workspace is now as it was right after this event.
    """
    restored: int = Field(..., ge=0)
    """
    Files and symlinks the rewind wrote (restored or put back), removed, in all.
    """
    removed: int = Field(..., ge=0)
    unrestorable: list[str]
    """
    Files and symlinks that are not as they were at `to_seq` after the rewind: the log has
    no contents for them (over `limits.max_blob_bytes`, past a scan budget), or they could
    not be written or removed, or a process changed them meanwhile. The `file.*` events
    after this one record each as it really is.
    """
    processes_stopped: list[str]
    """
    Background processes started after `to_seq`, stopped by the rewind.
    """


class SandboxReadiness(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
    )
    mode: str
    """
    `enforced`, `unsandboxed` (the operator turned isolation off: commands run on the host),
    `unavailable` (commands fail closed) or `none` (no sandbox configured).
    """
    ready: bool
    detail: str
    """
    What is enforced, or why the sandbox is unusable.
    """


class SessionEnvironment(BaseModel):
    """
    The image a session runs in, as it was resolved when the session was created: forks,
    rewinds and replays run in `digest`, whatever `image`'s tag names today.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    image: str
    """
    The reference it was pulled as (a configured name resolved to its reference).
    """
    digest: str
    """
    The manifest digest for this host's platform (`sha256:…`).
    """
    name: str | None = None
    """
    The configured name it was asked for by, if it was.
    """


class ShellAction(BaseModel):
    """
    What a `shell_call` asks to run.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    commands: list[str] = Field(..., min_length=1)
    """
    Each a bash command line, run one after another in order (as `shell` calls); at most
    as many as a batch may hold.
    """
    timeout_ms: int | None = Field(None, ge=1)
    """
    Each command's time limit (the `shell` tool's `timeout_ms`; above the service's ceiling,
    the ceiling). Default: the session's default timeout.
    """
    max_output_length: int | None = Field(None, ge=0)
    """
    Characters of each command's stdout and of its stderr handed back (the beginning);
    echoed in the output item. Default: all the `shell` result holds.
    """


class ShellCallItem(BaseModel):
    """
    An OpenAI Responses API `shell_call` output item, as the model emitted it: commands for the
    client to run (here, in the session's sandbox with the `shell` tool). Other fields of the
    item (`id`, `status`, `caller`, `created_by`) are accepted and ignored.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    type: str = Field(..., pattern="^shell_call$")
    """
    Always `shell_call`.
    """
    call_id: str = Field(..., max_length=250, min_length=1)
    """
    The model's id for the call; the commands are recorded as `shell` calls with ids
    `{call_id}#1`, `{call_id}#2`, ….
    """
    action: ShellAction
    environment: dict[str, Any] | None = None
    """
    Where the model meant the commands to run: absent or `{"type": "local"}` (the client's
    own environment, this service). A hosted container is OpenAI's to run, and refused.
    """


class StreamEvent(BaseModel):
    """
    One Server-Sent Event of `GET /v1/sessions/{id}/events/stream`, as its fields arrive.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    id: str | None = None
    """
    The event's `seq` (absent on `stream.overflow` and `stream.error`): send it back as
    `Last-Event-ID` to resume after it.
    """
    event: str
    """
    The event's kind (`session.created`, `invocation.started`, …), or `stream.overflow` /
    `stream.error` (`{"reason", "resume_after"}`).
    """
    data: str
    """
    The event as JSON (an `Event`, as `GET …/events` returns them).
    """


class TarStream(RootModel[bytes]):
    root: bytes
    """
    A tar stream (gzipped or not), as bytes.
    """


class Truncated(BaseModel):
    """
    Set on an event (or a session) shown truncated: its `data` (its `env` and `metadata`) is
    the beginning of the value, cut where it went over the bound of the page or stream that
    shows it. `full` serves it whole.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    bytes: int = Field(..., ge=0)
    """
    Bytes of the JSON text of what was cut short (an event's `data`; a session's `tools`,
    `policy`, `env` and `metadata` together), as the store holds it.
    """
    full: str
    """
    The path that serves it whole (`GET`, with the same credentials): an event
    (`/v1/sessions/{id}/events/{seq}`) or a session (`/v1/sessions/{id}`).
    """


class Metadatum(BaseModel):
    """
    One key/value note of a task (strict tool schemas take no free-form objects, so metadata is
    a list of pairs).
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    key: str = Field(..., max_length=100, min_length=1)
    value: str = Field(..., max_length=1000)


class ToolTaskCreateArguments(BaseModel):
    """
    Creates a task in this session's shared task list: a `subject` (a short imperative title), a `description` (what done looks like), optionally an `activeForm` (how it reads while in progress, "Running the tests") and `metadata` notes. It starts `pending`; the result gives its id (`t3`).

    Use it to track multi-step work: create the tasks up front, set each `in_progress` with TaskUpdate when you start it and `completed` when done. Tasks are recorded in the session's log.

    Example: {"subject": "Fix the failing parser test", "description": "tests/parse.rs passes", "activeForm": "Fixing the parser test"}
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    activeForm: str | None = Field(None, max_length=500, min_length=1)
    """
    How the task reads while in progress ("Running the tests").
    """
    description: str = Field(..., max_length=5000)
    """
    What the task is and what done looks like.
    """
    metadata: list[Metadatum] | None = Field(None, max_length=20)
    """
    Key/value notes.
    """
    subject: str = Field(..., max_length=500, min_length=1)
    """
    A short, imperative title.
    """


class ToolTaskGetArguments(BaseModel):
    """
    Shows one task of this session's task list in full (subject, status, description, active form, metadata) by its id. Example: {"taskId": "t3"}
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    taskId: str = Field(..., max_length=32, min_length=1)
    """
    The task's id (`t3`).
    """


class ToolTaskListArguments(BaseModel):
    """
    Lists this session's tasks with their ids and status (and the steps of the plan, if update_plan made one). Example: {}
    """

    model_config = ConfigDict(
        extra="ignore",
    )


class ToolTaskUpdateArguments(BaseModel):
    """
    Changes a task of this session's task list by its id (`taskId`, from TaskCreate or TaskList): its `status` (`pending`, `in_progress`, `completed`, or `deleted` to remove it), `subject`, `description`, `activeForm` or `metadata` (replaced whole). Fields left out (or null) stay as they are.

    Set a task `in_progress` when you start it and `completed` as soon as it is done.

    Example: {"taskId": "t3", "status": "completed"}
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    activeForm: str | None = Field(None, max_length=500, min_length=1)
    description: str | None = Field(None, max_length=5000)
    metadata: list[Metadatum] | None = Field(None, max_length=20)
    """
    Key/value notes (replace the task's).
    """
    status: Literal["pending", "in_progress", "completed", "deleted"] | None = None
    """
    Its new status; `deleted` removes it from the list.
    """
    subject: str | None = Field(None, max_length=500, min_length=1)
    taskId: str = Field(..., max_length=32, min_length=1)
    """
    The task's id (`t3`).
    """


class ToolApplyPatchArguments(BaseModel):
    """
    Applies a patch that adds, deletes, updates or moves files, all or nothing: the whole patch is checked against the current files first, and if any part does not apply, nothing is changed.

    Use it for changes across several files, or several places in one file, in one step. For one small change edit_file is simpler; to write a whole new file write_file works too.

    Format (every path relative to /workspace or absolute under it):
    *** Begin Patch
    *** Add File: <path>            then the new file's lines, each starting with +
    *** Delete File: <path>
    *** Update File: <path>
    *** Move to: <new path>         (optional: rename the updated file)
    @@ <optional line to find first, e.g. a function signature>
     <context line, starting with a space>
    -<line to remove>
    +<line to add>
    *** End of File                 (optional: the hunk is at the very end of the file)
    *** End Patch

    Give each hunk about 3 lines of unchanged context before and after the change so it matches one place. Hunks of one file must be in file order. Lines are found exactly, else ignoring trailing whitespace, else ignoring indentation too; the + lines are written exactly as given. Updated files end with a newline and keep CRLF line endings if they have them.

    Read-before-write: every existing file the patch changes (updated, deleted, moved, or overwritten by Add File or Move to) must have been read in this session (read_file, read_many_files or a grep hit) and be unchanged since. Files the patch creates need no read.

    Example: {"patch": "*** Begin Patch\\n*** Update File: src/app.py\\n@@ def greet():\\n-    print(\\"Hi\\")\\n+    print(\\"Hello\\")\\n*** Add File: docs/NOTES.md\\n+# Notes\\n*** End Patch"}

    If a hunk does not apply, the error names the file, the hunk number and the first line that did not match, and shows what the file has there. Limits: text (UTF-8) files up to 10 MiB.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    patch: str = Field(..., min_length=1)
    """
    The whole patch, from '*** Begin Patch' to '*** End Patch'.
    """


class ToolBashArguments(BaseModel):
    """
    Runs a command in a persistent bash shell: one shell per session, kept between calls, so the working directory, exported variables, functions and an activated virtualenv carry over from one call to the next. `restart: true` replaces it with a fresh shell (in /workspace, nothing kept).

    The shell runs in the session's sandbox, like `shell`: an unprivileged user, only /workspace and a private /tmp writable, no network unless the session's policy grants it. stdin is empty (/dev/null): commands that prompt get end-of-file, so pass flags such as `-y` or `--no-input`; for programs you must talk to (a REPL, a prompt) use exec_command with tty: true and write_stdin. stdout and stderr come back together, in the order they were written, then `[exit code N]` when it is not 0. Every file the command changes in /workspace is recorded.

    Time: 2 minutes a call (the session's default timeout when it sets one, up to the operator's ceiling). Past it the command is interrupted (SIGINT, then its processes are killed) and the shell is kept; a shell that does not come back is restarted, and the result says its state was lost. Background jobs (`cmd &`) keep running between calls until the shell is restarted; their output comes with the next call's.

    Examples:
    {"command": "cd backend && source .venv/bin/activate"}
    {"command": "pytest -x -q 2>&1 | tail -n 30"}
    {"restart": true}

    Limits: output is captured up to the operator's cap (1 MiB by default; past it the command is stopped) and you see at most 50,000 characters (the beginning and the end; read_output pages through the rest).
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    command: str | None = Field(None, max_length=100000)
    """
    The bash command to run in the session's shell. Required unless restart is true.
    """
    restart: bool | None = None
    """
    Replace the shell with a fresh one (nothing of the old one's state is kept). With a command, the command runs in the fresh shell.
    """


class ToolEditFileArguments(BaseModel):
    """
    Replaces exact text in an existing file: `old_string` must appear in the file exactly as written (every space, tab and line break) and is replaced by `new_string`.

    Use it for targeted changes to a file you have read: a line, a block, a function. To make several changes across files in one step use apply_patch; to create a file or rewrite one completely use write_file.

    Read-before-write: the file must have been read in this session (read_file, read_many_files or a grep hit) and must not have changed since; otherwise the call is refused and nothing is written. After an edit the session counts as having read the new contents, so further edits need no new read.

    Matching is exact, never fuzzy. If old_string is not found, the error shows the most similar text in the file with its line numbers and how it differs, so you can copy the exact text and retry. If it is found more than once, the error gives the count and the line numbers: add surrounding lines to old_string to make it unique, or set `replace_all` to true to replace every occurrence. Do not include read_file's line-number prefixes in old_string.

    The rest of the file is kept byte for byte: tabs, a missing final newline, the encoding. In a file with CRLF (Windows) line endings write old_string and new_string with plain \\n line breaks: they are matched as \\r\\n and new_string is written with \\r\\n. Only UTF-8 text files can be edited; binary, UTF-16 and other non-UTF-8 files are refused rather than re-encoded.

    Example: {"file_path": "src/main.rs", "old_string": "    println!(\\"helo\\");", "new_string": "    println!(\\"hello\\");"} fixes the typo on that line.

    Output: a one-line summary and the edited region with line numbers. Limits: files up to 10 MiB.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    file_path: str = Field(..., min_length=1)
    """
    The file to edit: relative to /workspace (src/main.rs) or absolute under it (/workspace/src/main.rs).
    """
    new_string: str
    """
    The text to put in its place (may be empty to delete old_string).
    """
    old_string: str = Field(..., min_length=1)
    """
    The exact text to replace, as it appears in the file (without read_file's line numbers).
    """
    replace_all: bool | None = None
    """
    Replace every occurrence of old_string. Default false: old_string must occur exactly once.
    """


class ToolExecCommandArguments(BaseModel):
    """
    Runs a command in a terminal of the session's sandbox (Codex's exec_command) and returns its output after `yield_time_ms` or when it exits, whichever comes first. A program still running then gets a session ID: send it input and read its output with write_stdin.

    `tty: false` (default): pipes, stdin closed to you (for builds, tests, servers whose output you poll). `tty: true`: a pseudo-terminal (80x24, or `cols`/`rows`), for programs that need one: REPLs (python3 -i, node), prompts, pagers, debuggers. TERM=dumb NO_COLOR=1 PAGER=cat are set; what you see has escape sequences removed. The command runs with `shell` (default /bin/bash) as a login shell (`login`, default true) in `workdir` (default /workspace). The sandbox is `shell`'s: no network unless the session's policy allows it.

    Examples:
    {"cmd": "python3 -i", "tty": true}
    {"cmd": "npm run dev", "yield_time_ms": 5000}

    Limits: yield_time_ms 250-30000 (default 10000); max_output_tokens (default 10000) caps the output returned (its middle is cut); at most 16 terminals open per session (an error past it); a terminal nobody touched for 30 minutes is killed; 1 MiB of unread output is kept per terminal (its beginning and end).
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    cmd: str = Field(..., max_length=100000, min_length=1)
    """
    Shell command to execute.
    """
    cols: int | None = Field(None, ge=10, le=1000)
    """
    Terminal width with tty: true (default 80). An extension of Codex's arguments.
    """
    justification: str | None = Field(None, max_length=10000)
    """
    Codex's approval argument: accepted and ignored.
    """
    login: bool | None = None
    """
    Run the shell as a login shell (-l; default true).
    """
    max_output_tokens: int | None = Field(None, ge=1, le=1000000)
    """
    Most tokens of output to return (default 10000).
    """
    prefix_rule: list[str] | None = Field(None, max_length=64)
    """
    Codex's approval argument: accepted and ignored.
    """
    rows: int | None = Field(None, ge=2, le=1000)
    """
    Terminal height with tty: true (default 24). An extension of Codex's arguments.
    """
    sandbox_permissions: str | None = Field(None, max_length=100)
    """
    Codex's approval argument: accepted and ignored (the session's policy.approval decides).
    """
    shell: str | None = Field(None, max_length=200, min_length=1)
    """
    Shell binary to launch (default /bin/bash).
    """
    tty: bool | None = None
    """
    Allocate a pseudo-terminal (default false): needed to send input later.
    """
    workdir: str | None = None
    """
    Working directory, relative to /workspace or absolute under it (default /workspace).
    """
    yield_time_ms: int | None = Field(None, ge=0)
    """
    How long to wait for output before returning, ms (default 10000, clamped to 250-30000).
    """


class ToolFileCopyArguments(BaseModel):
    """
    Copies one file to another path in the workspace. The bytes go straight from file to file: they never pass through you, so any file can be copied whatever its size or type (images, archives, binaries, huge data files).

    Use it to duplicate a file as a starting point, to copy assets or fixtures, or (with file_delete) to move a file. To change a file's contents use edit_file, apply_patch or write_file; to copy a whole directory use the shell.

    `dest` is the full path of the new file (not a directory to copy into); missing parent directories are created. If dest already exists the call is refused unless `overwrite` is true; with `overwrite` the old contents are replaced (recorded in the session's log). Because the new contents are an exact copy of an existing file, dest does not need to have been read first. The source must be a regular file inside the workspace (not a directory, symlinks are followed only inside the workspace, hard-linked files are refused).

    Example: {"source": "templates/config.example.toml", "dest": "config.toml"}

    Limits: one file per call. The copy is atomic: dest holds either its old contents or the whole copy, never part of it.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    dest: str = Field(..., min_length=1)
    """
    The path of the copy (a file path, not a directory).
    """
    overwrite: bool | None = None
    """
    Replace dest if it already exists. Default false: an existing dest is refused.
    """
    source: str = Field(..., min_length=1)
    """
    The file to copy: relative to /workspace or absolute under it.
    """


class ToolFileDeleteArguments(BaseModel):
    """
    Deletes one file from the workspace.

    Use it to remove a file that is no longer needed (after moving its contents elsewhere, say). It deletes exactly one regular file: directories are refused (use the shell to remove a directory), and so are symlinks (remove a link with the shell). To move a file, copy it with file_copy and then delete the original, or use apply_patch's '*** Move to:'.

    Read-before-write: the file must have been read in this session (read_file, read_many_files or a grep hit) and not have changed since, so that nothing is deleted unseen; otherwise the call is refused and nothing is deleted. The deleted contents stay in the session's log.

    Example: {"path": "src/legacy/old_parser.rs"}

    Limits: one file per call; files over 10 MiB cannot have been read with read_file, so delete them with the shell.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    path: str = Field(..., min_length=1)
    """
    The file to delete: relative to /workspace or absolute under it.
    """


class ToolGlobArguments(BaseModel):
    """
    Finds files in the workspace whose path matches a glob pattern, and lists them one per line, most recently modified first.

    Use it to find files by name or extension (`**​/*.rs`, `src/**​/test_*.py`, `**​/Cargo.toml`), or to see which files changed last. To search inside files use grep; to see a directory's layout use list_dir.

    The pattern is matched against each file's path relative to `path` (default: the workspace root): `*` and `?` stay within one directory level, `**` spans any number of levels, `{a,b}` is either, `[abc]` a character class. So `*.rs` finds .rs files directly in `path` only; `**​/*.rs` finds them at any depth. Paths in the output are relative to /workspace.

    .gitignore rules are respected, symlinks are not followed, and dependency, build and VCS directories (.git, node_modules, target, .venv, __pycache__, dist, build) are skipped unless `path` is inside one. Listing a file does not count as reading it: read_file it before changing it.

    Example: {"pattern": "**​/*.{ts,tsx}", "path": "web/src"} lists the TypeScript files under web/src, newest first.

    Limits: at most 500 paths are listed; a note gives the total when there are more. The search stops at the call's time limit or after reading the service's limit of directory entries, and then says its list is partial: narrow it with `path`.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    path: str | None = Field(None, min_length=1)
    """
    The directory to search: relative to /workspace or absolute under it. Default: the workspace root.
    """
    pattern: str = Field(..., max_length=4096, min_length=1)
    """
    The glob to match against paths relative to `path`, like **​/*.rs or src/**​/*.test.ts.
    """


class ToolGrepArguments(BaseModel):
    """
    Searches file contents in the workspace for a regular expression and returns matching lines as `path:line:content`, sorted by path and line.

    Use it to find where something is defined or used, to find which files mention a name, or to look into files too big to read whole. To find files by name use glob; to read a whole file use read_file.

    The pattern is a Rust/ripgrep regex: `fn\\s+main`, `TODO|FIXME`, `log.*Error`; escape special characters to match them literally (`\\(`, `\\.`, `\\[`). A match never spans lines. `case_insensitive` (default false) ignores case. `path` is a directory to search (default: the whole workspace) or a single file. `glob_filter` limits the files searched: a pattern without `/` matches file names anywhere (`*.rs`, `*.{ts,tsx}`); with `/` it matches the path relative to `path` (`src/**​/*.rs`).

    .gitignore rules are respected, symlinks are not followed, binary files are skipped, and dependency, build and VCS directories (.git, node_modules, target, .venv, __pycache__, dist, build) are skipped unless `path` is inside one. Files with matches shown count as read for read-before-write, so you can edit them with edit_file right away.

    Example: {"pattern": "fn\\\\s+parse_\\\\w+", "path": "src", "glob_filter": "*.rs"} finds the parse_ functions under src/.

    Limits: `max_results` matching lines (default 100, at most 1000); a note says when there were more. Lines are cut at 500 characters. Files over 10 MiB are not searched (a note says which). A pattern too complex to compile (like `a{1000}{1000}`) is refused: simplify it. A search stops at the call's time limit or after reading the service's limit of directory entries, and then says its results are partial: narrow it with `path` or `glob_filter`.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    case_insensitive: bool | None = None
    """
    Ignore case. Default false.
    """
    glob_filter: str | None = Field(None, max_length=4096, min_length=1)
    """
    Only search files matching this glob: `*.rs` matches names anywhere; a pattern with `/` matches paths relative to `path`.
    """
    max_results: int | None = Field(None, ge=1, le=1000)
    """
    The most matching lines to return. Default 100, at most 1000.
    """
    path: str | None = Field(None, min_length=1)
    """
    The directory (or one file) to search: relative to /workspace or absolute under it. Default: the whole workspace.
    """
    pattern: str = Field(..., max_length=4096, min_length=1)
    """
    The regular expression to search for (Rust/ripgrep syntax).
    """


class ToolListDirArguments(BaseModel):
    """
    Lists a directory of the workspace as an indented tree. Directories end with `/`; symlinks are shown as `name -> target` and never followed.

    Use it to get your bearings in a project or to see what a directory holds. To find files by name pattern across the tree use glob; to find files by content use grep.

    `depth` is how many levels to show (default 1: only the directory's own entries; at most 10). A chain of directories that each contain only one directory is shown as one entry (`src/main/java/`). Dependency, build and VCS directories (.git, node_modules, target, .venv, __pycache__, dist, build) are listed but not expanded; list one by its path to see inside.

    Example: {"path": "src", "depth": 2} lists src/ and the contents of each directory in it.

    Limits: at most 1000 entries are shown; a note says when the listing stopped early (also at the call's time limit, or after reading the service's limit of directory entries). Paths are relative to /workspace or absolute under it.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    depth: int | None = Field(None, ge=1, le=10)
    """
    How many levels to show. Default 1.
    """
    path: str | None = Field(None, min_length=1)
    """
    The directory to list: relative to /workspace or absolute under it. Default: the workspace root.
    """


class ToolProcessKillArguments(BaseModel):
    """
    Stops a background process (started with shell and background: true) and every process it started.

    The signal (default TERM) goes to the process and its children; whatever has not exited 2 seconds later is killed. KILL stops everything at once. Closing the session stops all its background processes too.

    Example: {"process_id": "p1"}

    Limits: none; stopping an exited process just reports how it ended.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    process_id: str = Field(..., max_length=64, min_length=1)
    """
    The id shell returned ("p1").
    """
    signal: Literal["TERM", "INT", "HUP", "KILL"] | None = None
    """
    Signal to send first (default TERM).
    """


class ToolProcessReadArguments(BaseModel):
    """
    Shows what a background process (started with shell and background: true) printed, and whether it still runs.

    Output is read by cursor: the first call without `after` returns everything kept so far; each answer ends with the cursor to pass as `after` next time, so you only see new output. With `wait_ms` the call waits up to that long (at most 30000) for new output when there is none yet, or for the process to exit — use it instead of polling in a loop. stdout and stderr of a background process are one stream.

    Example: {"process_id": "p1", "after": 2048, "wait_ms": 5000}

    Limits: at most 64 KiB per call (call again with the returned cursor for more); the service keeps the last 1 MiB of a process's output, and says how much older output was dropped.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    after: int | None = Field(None, ge=0)
    """
    Cursor from the previous process_read: only output after it is returned.
    """
    process_id: str = Field(..., max_length=64, min_length=1)
    """
    The id shell returned ("p1").
    """
    wait_ms: int | None = Field(None, ge=0, le=30000)
    """
    Wait up to this long for new output (or the exit) when there is none yet. Default 0.
    """


class ToolProcessWriteArguments(BaseModel):
    """
    Writes text to the standard input of a background process (started with shell and background: true), for example an answer to a prompt or a command for a REPL.

    Nothing is added: include the newline ("\\n") if the program reads lines. Then call process_read (with wait_ms) to see its answer.

    Example: {"process_id": "p2", "input": "yes\\n"}

    Limits: 64 KiB per call; fails if the process has exited or does not read its input within 5 s.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    input: str = Field(..., max_length=65536)
    """
    The text to write to its stdin, newline included if needed.
    """
    process_id: str = Field(..., max_length=64, min_length=1)
    """
    The id shell returned ("p1").
    """


class ToolReadFileArguments(BaseModel):
    """
    Reads a text file from the workspace and returns its lines numbered like `cat -n` (right-aligned line number, a tab, the line).

    Use it to look at a file before changing it, or to inspect code, configuration or logs. Reading a file also satisfies the read-before-write rule: write_file (and the other tools that change files) refuse to overwrite an existing file this session has not read, or one that changed since it was read.

    Do not use it to find which file contains something (use grep), to list files (list_dir or glob), or for binary files (they are refused; use the shell).

    Paths are relative to /workspace (src/main.rs) or absolute under it (/workspace/src/main.rs); anything outside the workspace is refused.

    By default the first 2000 lines are returned. For longer files, page with `offset` (the 1-based line to start at) and `limit` (how many lines); when lines remain, the output ends with a note giving the offset to continue from.

    Example: {"file_path": "src/main.rs", "offset": 120, "limit": 40} returns lines 120 to 159.

    Limits: files over 10 MiB are refused (use grep, or the shell to print a range); lines longer than 2000 characters are cut with a marker; one call returns at most 1 MiB of text (the operator may set another budget), and a note gives the offset to continue from when it stops early; a file with a NUL byte in its first 8 KiB is treated as binary and refused; bytes that are not valid UTF-8 are shown as U+FFFD.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    file_path: str = Field(..., min_length=1)
    """
    The file to read: relative to /workspace (src/main.rs) or absolute under it (/workspace/src/main.rs).
    """
    limit: int | None = Field(None, ge=1)
    """
    Maximum number of lines to return. Default 2000.
    """
    offset: int | None = Field(None, ge=1)
    """
    1-based line number to start reading at. Default 1.
    """


class Path(RootModel[str]):
    root: str = Field(..., min_length=1)


class ToolReadManyFilesArguments(BaseModel):
    """
    Reads several text files in one call. Each file is shown as read_file shows it (numbered lines, the first 2000 of each), after a header line `=== path ===`.

    Use it when you already know you need several files: a module and its tests, a set of configs. For one file, or to page through a long one with offset and limit, use read_file; to find files use glob or grep.

    Each file shown counts as read for read-before-write, exactly as with read_file. A file that cannot be shown (missing, binary, outside the workspace, too large) gets its error under its header and the others are still read; the call fails only if no file could be shown.

    Example: {"paths": ["src/lib.rs", "src/parser.rs", "tests/parser.rs"]}

    A path named twice is shown once. One call returns at most 1 MiB of file text in all (the operator may set another budget): the file it runs out in ends with the offset to continue from, and the files after it are not read; a note at the end lists them. Read those with read_file, or with another read_many_files call.

    Limits: at most 50 paths; per file, the first 2000 lines, lines cut at 2000 characters, files over 10 MiB refused; 1 MiB of text per call. You are shown at most 50,000 characters (the middle is cut; read_output pages through the rest).
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    paths: list[Path] = Field(..., max_length=50, min_length=1)
    """
    The files to read: each relative to /workspace or absolute under it.
    """


class ToolReadOutputArguments(BaseModel):
    """
    Reads the full output of an earlier call of this session, a page at a time. When a result was too long, you were shown its beginning and end with a marker like "[… N characters cut here — call read_output with invocation_id \\"…\\" …]"; this tool returns the part that was cut.

    Use it when the part you need was cut from a long result. Do not use it to re-read a file (use read_file with offset/limit) or to repeat a search (narrow the search instead).

    `offset` is the first character to return (default 0); `limit` how many (default 40000, at most 45000). The answer says which characters it holds and the offset to continue from.

    Example: {"invocation_id": "0190f5c2-…", "offset": 40000}

    Limits: only invocations of this session; outputs are as recorded, not re-run. An output over the service's limit for a recorded output (4 MiB by default) is kept as its beginning and end, with a marker where the middle was dropped; the answer says so.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    invocation_id: UUID
    """
    The invocation whose output to read (from the truncation marker).
    """
    limit: int | None = Field(None, ge=1, le=45000)
    """
    Characters to return. Default 40000.
    """
    offset: int | None = Field(None, ge=0)
    """
    First character to return. Default 0.
    """


class ToolShellArguments(BaseModel):
    """
    Runs a command with `/bin/bash -c` in a sandbox whose working directory is /workspace (your workspace, read-write). Returns the exit code, then stdout and stderr as two separate sections.

    Use it to build, run tests, run scripts, use git, install into the workspace, and for file operations the file tools do not cover (moving directories, archives). Prefer read_file, grep, glob and edit_file/apply_patch for reading, searching and editing: they are faster, their output is made for you, and edits through them are checked.

    The sandbox: an unprivileged user with no capabilities; only /workspace and a private /tmp are writable (the system directories are read-only); no network unless the session's policy grants it, and then only HTTP and HTTPS to public addresses through a proxy the sandbox is already set up to use (HTTP_PROXY/HTTPS_PROXY; tools that ignore them have no network); no access to other sessions, to the host's processes or to the service. HOME is /workspace; stdin is empty (/dev/null), so commands that prompt get end-of-file: pass flags such as `-y` or `--no-input` instead. Every file the command creates, changes or deletes in /workspace is recorded, and files you read earlier and a command changed must be read again before you edit them.

    Time: `timeout_ms` (default 10 s unless the session sets another, at most the operator's ceiling, 600 s by default). When it expires the command and every process it started are killed and the output so far is returned with a 'timed out' note. `idle_timeout_ms` also stops a command that prints nothing for that long (useful for commands that might wait for input). Processes a command leaves running in the background (`cmd &`, daemons) are killed when it exits: for a server or a watcher use `background: true`, which returns a process id at once; then use process_read to see its output, process_write to send it input and process_kill to stop it.

    Examples:
    {"command": "cargo test --quiet 2>&1 | tail -n 50", "timeout_ms": 120000}
    {"command": "python -m pytest -x -q", "workdir": "backend"}
    {"command": "python -m http.server 8000", "background": true}

    Limits: output is captured up to the operator's cap (1 MiB by default; past it the command is stopped) and you see at most 50,000 characters (the beginning and the end; read_output pages through the rest). Memory, processes, CPU and file sizes are limited per session.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    background: bool | None = None
    """
    Start the command and return its process id at once, without waiting for it to finish.
    """
    command: str = Field(..., max_length=100000, min_length=1)
    """
    The bash command line to run (bash -c).
    """
    description: str | None = Field(None, max_length=1000)
    """
    What the command does, in a few words (recorded, shown to people reviewing the session).
    """
    idle_timeout_ms: int | None = Field(None, ge=100, le=600000)
    """
    Stop the command if it prints nothing for this many milliseconds.
    """
    timeout_ms: int | None = Field(None, ge=1, le=600000)
    """
    Stop the command after this many milliseconds (default: the session's default timeout, 10000 unless set; capped by the operator's maximum). Ignored with background: true unless given.
    """
    workdir: str | None = Field(None, min_length=1)
    """
    Working directory, relative to /workspace or absolute under it (default /workspace). It must exist.
    """


class ToolStrReplaceBasedEditToolArguments(BaseModel):
    """
    Anthropic's text editor (text_editor_20250728): view, create and edit files in the workspace. Every call has a `command` and a `path` (absolute under /workspace, like /workspace/src/main.rs, or relative to it).

    Commands:
    - view: show a file with line numbers like `cat -n`, or, for a directory, its files and directories two levels deep. `view_range: [start, end]` (1-based, inclusive; end -1 means to the end of the file) shows part of a file. `max_characters` cuts the shown text after that many characters.
    - create: write a new file with `file_text` (missing parent directories are created). An existing file is never overwritten: edit it with str_replace or insert.
    - str_replace: replace `old_str`, which must appear exactly once in the file (every space, tab and line break), with `new_str` (empty or left out: delete it). If it appears zero times or more than once nothing is changed and the error says how often and on which lines: add surrounding lines to make it unique.
    - insert: insert `new_str` as whole lines after line `insert_line` (0 inserts at the top of the file; the number of lines of the file appends at the end).

    Read-before-write: str_replace and insert change a file only if this session has viewed it (or read it with read_file, read_many_files, or seen it in a grep hit) and it has not changed since; otherwise the call is refused and nothing is written. After an edit the session counts as having read the new contents. Only UTF-8 text files are edited; a file with CRLF line endings keeps them.

    Example: {"command": "str_replace", "path": "/workspace/app.py", "old_str": "print('helo')", "new_str": "print('hello')"}

    There is no undo_edit: to go back, edit again (or rewind the session). Limits: files up to 10 MiB; a view returns at most 1 MiB of text (the operator may set another budget) and lines longer than 2000 characters are cut.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    command: Literal["view", "create", "str_replace", "insert"]
    """
    What to do: view, create, str_replace or insert.
    """
    file_text: str | None = None
    """
    create: the new file's contents.
    """
    insert_line: int | None = None
    """
    insert: the line after which new_str goes; 0 inserts at the top of the file.
    """
    max_characters: int | None = Field(None, ge=1)
    """
    view: show at most this many characters of the file.
    """
    new_str: str | None = None
    """
    str_replace: the replacement (default empty: delete old_str). insert: the text to insert.
    """
    old_str: str | None = None
    """
    str_replace: the exact text to replace; it must occur exactly once.
    """
    path: str = Field(..., min_length=1)
    """
    The file or directory: absolute under /workspace (/workspace/src/main.rs) or relative to it.
    """
    view_range: list[int] | None = Field(None, max_length=2, min_length=2)
    """
    view: the lines to show, [start, end], 1-based and inclusive; end -1 means to the end of the file.
    """


class PlanItem(BaseModel):
    """
    One step of the plan.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    status: Literal["pending", "in_progress", "completed"]
    step: str = Field(..., max_length=500, min_length=1)
    """
    What the step is, in a few words.
    """


class ToolUpdatePlanArguments(BaseModel):
    """
    Replaces your plan for this task: an ordered list of steps, each `pending`, `in_progress` or `completed`. The plan is recorded in the session's log, so whoever reviews the session sees what you intended and how far you got.

    Use it for work of three or more steps: write the plan first, then update it as you go — mark a step `in_progress` when you start it and `completed` as soon as it is done, add steps you discover, and say why in `explanation` when the plan changes. Do not use it for a single quick action. At most one step may be `in_progress` at a time.

    Example: {"plan": [{"step": "Find every caller of parse()", "status": "completed"}, {"step": "Rename parse() to parse_config()", "status": "in_progress"}, {"step": "Run the tests", "status": "pending"}], "explanation": "callers found in 3 files"}

    Limits: at most 100 steps; each step at most 500 characters. The whole plan is sent every time (it replaces the previous one).
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    explanation: str | None = Field(None, max_length=2000)
    """
    Why the plan changed (optional).
    """
    plan: list[PlanItem] = Field(..., max_length=100)
    """
    The whole plan, in order.
    """


class ToolWebFetchArguments(BaseModel):
    """
    Fetches a web page (http or https) and returns its text: HTML converted to Markdown (scripts, styles, navigation, headers, footers and sidebars dropped), JSON and plain text as they are. Other content (images, PDFs, archives) is not shown; the result gives its type and size.

    Use it to read documentation, an API's JSON, a changelog or a README from the web. Long pages come in parts: the result says how many characters the page has and which part is shown, and gives the `start_index` to ask for the next part. With `prompt`, the page is given to a summarizer model with your question and its answer is returned instead of the page (only if the service has one configured; otherwise the call fails and says so).

    Only public internet addresses can be reached (plus networks the operator allow-listed); local, private and cloud-metadata addresses are refused, on every redirect too. Redirects are followed up to 5 times; `Refresh` headers and meta refreshes are not followed. The session needs network access (`policy.network: "allow"`) unless the operator lets web tools reach the internet without it. Bodies are read up to 5 MiB. An HTTP error status (4xx, 5xx) makes the call an error that still shows the page.

    Example: {"url": "https://docs.rs/serde/latest/serde/", "max_length": 20000} returns the first 20,000 characters of the page as Markdown; call it again with {"url": "…", "start_index": 20000} for the next part.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    max_length: int | None = Field(None, ge=1, le=100000)
    """
    Most characters of page text to return. Default and maximum 100000.
    """
    prompt: str | None = Field(None, max_length=4000, min_length=1)
    """
    A question about the page for the service's summarizer model; its answer is returned instead of the page text.
    """
    start_index: int | None = Field(None, ge=0)
    """
    The character of the page text to start at (from a previous result's next start_index). Default 0.
    """
    timeout_ms: int | None = Field(None, ge=1, le=60000)
    """
    Time limit of the whole fetch (redirects, body and summary), milliseconds. Default 30000.
    """
    url: str = Field(..., max_length=8192, min_length=1)
    """
    The http or https URL to fetch.
    """


class ToolWebSearchArguments(BaseModel):
    """
    Searches the web and returns numbered results, each with its title, URL and a snippet. Use it to find documentation, an error message's cause or a project's page; then read a result with web_fetch.

    Only available where the operator configured a search provider (Brave, Tavily or SearXNG); otherwise the call fails and says so. The session needs network access (`policy.network: "allow"`) unless the operator lets web tools reach the internet without it.

    Example: {"query": "tokio broadcast channel lagged", "max_results": 5}
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    max_results: int | None = Field(None, ge=1, le=20)
    """
    Most results to return. Default 5.
    """
    query: str = Field(..., max_length=500, min_length=1)
    """
    What to search for.
    """


class ToolWriteFileArguments(BaseModel):
    """
    Writes a file in the workspace: creates it (and any missing parent directories) or replaces its whole contents.

    Use it to create a new file, or to rewrite a file completely. To change part of an existing file, prefer edit_file (or apply_patch): it sends only the change, and cannot drop lines by accident.

    Read-before-write: replacing an existing file requires that this session has read it with read_file (or seen it in grep results) and that it has not changed since; otherwise the call is refused and nothing is written. Read the file, then write again. New files are always allowed.

    Paths are relative to /workspace (src/main.rs) or absolute under it (/workspace/src/main.rs); anything outside the workspace is refused, and so is writing to a symlink.

    Example: {"file_path": "src/util/strings.rs", "content": "pub fn shout(s: &str) -> String {\\n    s.to_uppercase()\\n}\\n"} creates src/util/ if needed and writes the file.

    Limits: `content` is written exactly as given (UTF-8, no newline added). The file is replaced atomically: readers see the old or the new contents, never a mix. An existing file keeps its permission bits.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    content: str
    """
    The complete new contents of the file.
    """
    file_path: str = Field(..., min_length=1)
    """
    The file to write: relative to /workspace (src/main.rs) or absolute under it (/workspace/src/main.rs).
    """


class ToolWriteStdinArguments(BaseModel):
    """
    Writes `chars` to a running exec_command session (Codex's write_stdin) and returns its output since the last call: after `yield_time_ms` (default 250) or when it exits. Empty `chars` polls: it waits until output arrives or `yield_time_ms` passes (5000-300000 ms for a poll). End lines with \\n; \\u0003 is Ctrl-C, \\u0004 Ctrl-D (end of input). Only tty: true sessions take input.

    `until` (a list of regular expressions) returns as soon as the output matches one, like `expect`; the block then says `Matched: N` (or `none`).

    Examples:
    {"session_id": 4711, "chars": "print(6*7)\\n"}
    {"session_id": 4711, "chars": "", "yield_time_ms": 30000}
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    chars: str | None = Field(None, max_length=100000)
    """
    Bytes to write to stdin (may be empty to poll).
    """
    max_output_tokens: int | None = Field(None, ge=1, le=1000000)
    """
    Most tokens of output to return (default 10000).
    """
    session_id: int = Field(..., ge=0)
    """
    Identifier of the running exec_command session.
    """
    until: list[str] | None = Field(None, max_length=16, min_length=1)
    """
    Return as soon as the output matches one of these regular expressions (Rust syntax, on the raw output), like `expect`: the output up to the end of the match comes back with a `Matched: N` line, the rest stays unread; `yield_time_ms` is then the most to wait (250-300000, default 30000). An extension of Codex's arguments.
    """
    yield_time_ms: int | None = Field(None, ge=0)
    """
    How long to wait for output before returning, ms (default 250; a poll 5000-300000).
    """


class AnthropicNativeTool(BaseModel):
    """
    An Anthropic Messages `tools` entry for a tool Anthropic defines itself: its type and name,
    no schema (the model knows the tool's arguments).
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    type: Literal["bash_20250124", "text_editor_20250728"]
    """
    The Anthropic-defined tool types this service runs. A closed set in the document, so that a
    generated client tells an entry of this shape from an OpenAI `function` entry (both have a
    `type` and a `name`).
    """
    name: str
    """
    `bash` or `str_replace_based_edit_tool`.
    """


class ApplyPatchCallItem(BaseModel):
    """
    An OpenAI Responses API `apply_patch_call` output item: one file operation, run here as an
    `apply_patch` call with the same id. Other fields (`id`, `status`, `caller`, `created_by`)
    are accepted and ignored.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    type: str = Field(..., pattern="^apply_patch_call$")
    """
    Always `apply_patch_call`.
    """
    call_id: str = Field(..., max_length=256, min_length=1)
    operation: PatchOperation


class ApprovalPolicy(BaseModel):
    """
    Which calls of a session need a person's approval before they run: a call of a tool named in
    `tools`, or of a tool that declares one of `capabilities`. Such a call is answered at once
    with `status: "pending_approval"` and its invocation id; `POST /v1/invocations/{id}/approve`
    runs it, `…/deny` records it `denied` without running it, and one nobody decides within
    `timeout_ms` is recorded `denied` too.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    tools: list[str] | None = None
    """
    Tools whose every call waits for approval: `["shell", "write_file"]`.
    """
    capabilities: list[Literal["fs.read", "fs.write", "process", "network", "content_from_source"]] | None = (
        None
    )
    """
    Capabilities whose tools' calls wait for approval: `process` (runs commands), `network`
    (reaches the outside world), `fs.write` (changes the workspace), `fs.read`.
    """
    timeout_ms: int | None = Field(None, ge=0)
    """
    How long a call waits for a decision before it is recorded `denied` (milliseconds);
    default 15 minutes (or the operator's `limits.max_approval_wait_ms` if lower), at most
    that ceiling.
    """


class CallsRequest(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
    )
    calls: list[Call | ShellCallItem | ApplyPatchCallItem] = Field(..., min_length=1)
    """
    The model's tool calls, in the order it emitted them. Each tool's argument schema is in
    the components as `tool.<name>.arguments` and at `GET /v1/tools`. At least one;
    at most `limits.max_calls_per_batch` (64 by default), counting each command of a
    `shell_call` as a call. With `?format=openai`, the Responses API's `shell_call` and
    `apply_patch_call` output items may be given as they are, among the calls.
    """


class Event(BaseModel):
    """
    One row of a session's log.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    session_id: UUID
    seq: int
    """
    1, 2, 3, … per session, no gaps.
    """
    kind: Literal["session.created", "session.closed", "invocation.started", "invocation.finished", "file.created", "file.modified", "file.deleted", "plan.updated", "process.started", "process.exited", "files.changed", "workspace.rewound", "network.request", "web.exchange", "session.taken_over", "todo.created", "todo.updated", "todo.deleted", "approval.requested", "approval.decided", "terminal.opened", "terminal.output", "terminal.exited"]
    """
    Kinds of log events. Stored as their dotted string.
    """
    invocation_id: UUID | None = None
    data: dict[str, Any]
    """
    Kind-specific payload (see the event kinds in the docs). In a page or a stream, an
    event larger than its bound shows the beginning of its data only (`truncated`).
    """
    created_at: AwareDatetime
    truncated: Truncated | None = None
    """
    Present when `data` is cut short: its size, and the path that serves the event whole.
    """


class EventPage(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
    )
    events: list[Event]
    """
    In `seq` order. An event larger than the page's bound alone shows the beginning of its
    data, with `truncated`.
    """
    next_after: int | None = None
    """
    Pass as `after` for the next page; `null` when this page reached the end of the log so
    far. A page ends early, with this cursor, where the next event would take it over the
    service's `limits.page_bytes`.
    """


class Origin(BaseModel):
    """
    The session (of the same tenant) and the event after which a fork's or a replay's workspace
    started as that session's was.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    kind: Literal["fork", "replay"]
    """
    How a session came from another one.
    """
    session_id: UUID
    seq: int


class OutputLimit(BaseModel):
    """
    The per-tool output limit, in characters (Unicode scalar values), and the truncation mode.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    max_chars: int = Field(..., ge=0)
    mode: Literal["head", "tail", "head_tail"]
    """
    Which part of an over-long output the model sees.
    """


class Policy(BaseModel):
    """
    What a session may do. The operator's configuration sets ceilings; a session can only
    tighten them (values above a ceiling are refused when the session is created).
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    network: Literal["none", "allow"] | None = None
    """
    Network for tools that use it (`none` unless granted).
    """
    default_timeout_ms: int | None = Field(None, ge=0)
    """
    Default timeout of a call, in milliseconds (tools that run processes).
    """
    output_limits: dict[str, OutputLimits] | None = None
    """
    Per-tool output limit overrides, in characters: `{"read_file": 20000}`.
    """
    approval: ApprovalPolicy | None = None


class Problem(BaseModel):
    """
    RFC 9457 problem details, with a stable machine-readable `code`.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    type: str
    """
    A URI naming the problem type (`urn:toolexec:problem:<code>`).
    """
    title: str
    """
    The problem type's fixed title (docs/problems.md).
    """
    status: int = Field(..., ge=0)
    detail: str
    code: Literal["malformed_json", "invalid_query", "unreadable_body", "unauthorized", "forbidden", "not_found", "no_route", "method_not_allowed", "request_timeout", "call_id_reused", "session_closed", "not_running_here", "unrestorable", "content_not_recorded", "state_too_large", "replay_running", "already_decided", "too_many_open_sessions", "archive_not_applied", "archive_too_large", "body_too_large", "unsupported_media_type", "invalid_request", "empty_batch", "batch_too_large", "invalid_call_id", "invalid_tool_name", "invalid_metadata", "invalid_env", "unknown_tool", "policy_above_ceiling", "seq_out_of_range", "policy_not_tighter", "too_many_files", "invalid_seed_file", "invalid_archive", "image_not_allowed", "image_not_found", "image_wrong_platform", "image_too_large", "invalid_image", "rate_limited", "too_many_auth_failures", "too_many_concurrent", "internal", "registry_unauthorized", "registry_unreachable", "unavailable", "still_running", "overloaded"] = (
        Field(..., title="ProblemCode")
    )
    """
    Stable code to branch on (docs/problems.md lists them all, with when each happens).
    """


class PulledEnvironment(BaseModel):
    """
    An image in this node's cache.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    environment: SessionEnvironment
    """
    What a session created with the same `image` now records: the reference, the manifest
    digest for this host's platform, the configured name.
    """
    cached: bool
    """
    Whether it was in the cache already (nothing was downloaded).
    """
    unpacked_bytes: int = Field(..., ge=0)
    """
    Bytes of its files unpacked, and of its blobs as downloaded.
    """
    download_bytes: int = Field(..., ge=0)


class Readiness(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
    )
    status: str
    """
    `ready` or `not_ready`.
    """
    store: str
    """
    `postgres` or `sqlite`.
    """
    store_status: str
    """
    `ok`, or why the store is not usable.
    """
    sandbox: SandboxReadiness
    """
    Whether `shell` and the process tools can run commands, and how they are isolated.
    """
    auth: str
    """
    How requests are authenticated.
    """


class Replay(BaseModel):
    """
    A replay and its report (`POST /v1/sessions/{id}/replay`, `GET /v1/replays/{id}`).
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    id: UUID
    mode: Literal["verify"]
    """
    How a replay runs. Only `verify` exists: re-execute and compare.
    """
    status: Literal["running", "finished", "failed"]
    source_session_id: UUID
    """
    The recorded session.
    """
    session_id: UUID
    """
    The new session that re-ran the calls (its own log records the re-run).
    """
    calls_total: int = Field(..., ge=0)
    """
    Recorded calls to re-run, and how many have been.
    """
    calls_replayed: int = Field(..., ge=0)
    calls_diverged: int = Field(..., ge=0)
    """
    Calls with at least one divergence.
    """
    calls: list[ReplayedCall]
    error: str | None = None
    """
    Why a `failed` replay stopped.
    """
    created_at: AwareDatetime
    finished_at: AwareDatetime | None = None


class RewindResult(Rewound):
    """
    What a rewind did (`POST /v1/sessions/{id}/rewind`): its `workspace.rewound` event.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    session_id: UUID
    seq: int
    """
    The seq of the `workspace.rewound` event; the `file.*` events after it list each change.
    """


class Session(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
    )
    id: UUID
    status: Literal["active", "closed"]
    tools: list[str] | None = None
    """
    Allow-list of tool names; `null` means every tool in the catalog.
    """
    policy: Policy
    env: dict[str, str]
    metadata: dict[str, Any]
    created_at: AwareDatetime
    closed_at: AwareDatetime | None = None
    last_seq: int
    """
    The `seq` of the newest event in the session's log.
    """
    origin: Origin | None = None
    environment: SessionEnvironment | None = None
    """
    The OCI image its commands run in; absent when they see the host's `/usr` and `/etc`.
    """
    truncated: Truncated | None = None
    """
    In a page of `GET /v1/sessions`, present when the session was larger than the page's
    bound: its `tools`, `env` and `metadata` show the beginnings of their values only, and
    `full` (`GET /v1/sessions/{id}`) serves it whole.
    """


class SessionList(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
    )
    sessions: list[Session]
    """
    Newest first. A session larger than the page's bound alone shows the beginnings of its
    `tools`, `env` and `metadata` only, with `truncated`.
    """
    next_cursor: str | None = None
    """
    Pass as `cursor` for the next page; `null` on the last page. A page ends early, with
    this cursor, where the next session would take it over the service's
    `limits.page_bytes`.
    """


class Todo(BaseModel):
    """
    One todo, as the current list shows it (and as `todo.created` and `todo.updated` carry it).
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    id: str
    """
    `t1`, `t2`, … in the order they were created; never reused in a session.
    """
    source: Literal["plan", "task"]
    """
    Where a todo came from.
    """
    subject: str
    """
    A task's subject, or a plan step's text.
    """
    description: str | None = None
    active_form: str | None = None
    """
    How the task is shown while in progress ("Running the tests").
    """
    status: Literal["pending", "in_progress", "completed"]
    """
    A todo's state.
    """
    metadata: list[list[str]] | None = None
    """
    A task's key/value notes, in order: each a `[key, value]` pair.
    """
    position: int | None = Field(None, ge=0)
    """
    A plan step's place in the plan, from 0.
    """


class ToolSpec(BaseModel):
    """
    A tool as the catalog shows it.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    name: str
    description: str
    """
    The tool's manual for the model: when to use it, when not, an example, its limits.
    """
    input_schema: dict[str, Any]
    """
    JSON Schema (draft 2020-12) of the `arguments` object.
    """
    read_only: bool
    """
    Read-only tools of a batch run concurrently; the others run alone and in order.
    """
    capabilities: list[Literal["fs.read", "fs.write", "process", "network", "content_from_source"]]
    output_limit: OutputLimit


class TreeEntry(BaseModel):
    """
    One file or symlink of the workspace as it was.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    path: str
    """
    Workspace-relative, `/`-separated; for a name that is not UTF-8, a display form with
    `\\xHH` for each invalid byte, and `path_b64` holds the bytes.
    """
    path_b64: str | None = None
    kind: Literal["file", "symlink"]
    size: int = Field(..., ge=0)
    """
    Bytes (of the target text, for a symlink).
    """
    sha256: str | None = None
    """
    SHA-256 of the contents (of the target text, for a symlink); absent when the file was
    recorded without being read (hard-linked, past a scan budget).
    """
    mode: int = Field(..., ge=0)
    """
    Permission bits (`0o644` is 420); `0o777` for a symlink.
    """
    symlink_target: str | None = None
    """
    A symlink's target, not followed (a display form like `path`'s if not UTF-8).
    """
    symlink_target_b64: str | None = None
    restorable: bool
    """
    Whether the log holds the contents (`GET …/files/{path}?at=` can return them, a fork or
    rewind can put them back).
    """
    unstored: Literal["too_large", "content_budget", "hash_budget", "time_budget", "too_large_to_hash", "hard_link", "unreadable", "call_budget", "not_restored"] | None = (
        None
    )
    """
    Why not, when not.
    """
    seq: int
    """
    The event that gave the entry this state.
    """


class Truncation(BaseModel):
    """
    What was cut from an output.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    total_chars: int = Field(..., ge=0)
    """
    Length of the full output, in characters.
    """
    omitted_chars: int = Field(..., ge=0)
    """
    Characters of the full output that `content` omits.
    """
    mode: Literal["head", "tail", "head_tail"]
    """
    Which part of an over-long output the model sees.
    """


class CallResult(BaseModel):
    """
    The result of one call, ready to hand to the model.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    call_id: str
    invocation_id: UUID
    name: str
    status: Literal["ok", "error", "invalid_arguments", "unknown_tool", "denied", "timed_out", "cancelled", "interrupted", "pending_approval"]
    """
    How a call ended. Everything but `ok` is an error the model should read.
    """
    is_error: bool
    content: str
    """
    What the model should read — for errors too: what went wrong and how to recover.
    """
    truncated: Truncation | None = None
    duration_ms: float
    seq: int
    """
    The `seq` of this invocation's `invocation.finished` event.
    """


class CallResultOut(CallResult):
    """
    A call's result, and with `?format=` the same result as that ecosystem expects it back in
    the model's next request.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    rendered: dict[str, Any] | None = None
    """
    The result in the shape `format` asked for: OpenAI's `function_call_output` item
    (`openai`; no error flag there, so a failed call's output starts with its status in
    brackets), a Chat Completions `tool` message (`openai_chat`), an Anthropic
    `tool_result` block with `is_error` (`anthropic`), an MCP `CallToolResult` with
    `isError` (`mcp`). Absent without `format`.
    """


class CatalogEntry(ToolSpec):
    """
    A tool as toolexec's catalog shows it: its spec, and whether this service can run it.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    available: bool
    """
    False when the service cannot run the tool (a provider it needs is not configured);
    its calls then fail saying so. The other formats leave such tools out of the list.
    """
    unavailable_reason: str | None = None
    """
    Why it is not available.
    """
    requires_session_network: bool | None = None
    """
    For tools that reach the network (`web_fetch`, `web_search`): whether a session needs
    `policy.network: "allow"` to use them (`true`), or this service lets them reach the
    public internet in every session (`false`: the operator's
    `web.public_when_network_none`).
    """


class ForkRequest(BaseModel):
    """
    The body of `POST /v1/sessions/{id}/fork`.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    at_seq: int | None = None
    """
    The fork starts as the source was right after this event (default: its last).
    """
    metadata: dict[str, Any] | None = None
    """
    The fork's metadata (default: the source's).
    """
    policy: Policy | None = None
    tools: list[str] | None = None
    """
    A tool allow-list within the source's (default: the source's).
    """
    allow_partial: bool | None = None
    """
    Go ahead even if the state has files whose contents the log does not hold (the fork
    starts without them, and `unrestorable` lists them); otherwise a 409 `unrestorable`.
    """


class Forked(Session):
    """
    A fork (`POST /v1/sessions/{id}/fork`, 201): the new session, and what it could not get.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    unrestorable: list[str]
    """
    Files of the state the fork started without (their contents are not in the log).
    """
    shares_contents: bool
    """
    Whether the fork shares its base's contents (overlay) or got a copy.
    """


class Invocation(BaseModel):
    """
    The recorded execution of one call.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    id: UUID
    session_id: UUID
    call_id: str
    name: str
    arguments: dict[str, Any]
    arguments_sha256: str
    """
    SHA-256 of the canonical JSON of the arguments as sent: the call's identity for retries.
    """
    status: Literal["running", "pending_approval", "ok", "error", "invalid_arguments", "unknown_tool", "denied", "timed_out", "cancelled", "interrupted"]
    """
    The state of a recorded invocation: still running, or finished with a [`CallStatus`].
    """
    is_error: bool
    content: str | None = None
    """
    What the model was shown (possibly truncated). `None` while running.
    """
    truncated: Truncation | None = None
    output_chars: int | None = None
    """
    Length of the full output in characters.
    """
    read_only: bool
    capabilities: list[Literal["fs.read", "fs.write", "process", "network", "content_from_source"]]
    """
    The capabilities the tool declared, recorded at the time of the call.
    """
    started_at: AwareDatetime
    finished_at: AwareDatetime | None = None
    duration_ms: float | None = None
    started_seq: int
    finished_seq: int | None = None
    side_effects: list[Event] | None = None
    """
    Side-effect events (files created, modified, deleted, processes, plan changes) in log
    order: one page of them (`GET /v1/invocations/{id}?after=SEQ&limit=N`, at most 1,000).
    """
    side_effects_total: int | None = Field(None, ge=0)
    """
    How many side-effect events the invocation has in all.
    """
    side_effects_next_after: int | None = None
    """
    Pass as `after` to get the next page of side effects; `null` when this page reaches the
    last one.
    """


class NewSession(BaseModel):
    """
    The body of `POST /v1/sessions`.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    tools: list[str] | None = None
    """
    Allow-list of tool names; all tools when absent.
    """
    policy: Policy | None = None
    env: dict[str, str] | None = None
    """
    Environment variables for processes the session runs.
    """
    metadata: dict[str, Any] | None = None
    """
    Free-form client data, stored and returned as is.
    """
    files: dict[str, str] | None = None
    """
    Files to seed the workspace with: workspace-relative path → UTF-8 contents.
    """
    environment: EnvironmentRequest | None = None


class OpenAiItemResultOut(BaseModel):
    """
    What a `shell_call` or `apply_patch_call` item did: the calls it ran, and the output item
    to hand back to the Responses API.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    type: str = Field(..., examples=["shell_call"])
    """
    The item's `type`: `shell_call` or `apply_patch_call`.
    """
    call_id: str
    """
    The item's `call_id`.
    """
    calls: list[CallResult]
    """
    The calls it ran, in order, as recorded: a `shell` call per command (ids
    `{call_id}#1`, `{call_id}#2`, …), or one `apply_patch` call (id `call_id`). Empty when
    the item was refused before anything ran (a diff with another file's header).
    """
    rendered: dict[str, Any]
    """
    `shell_call_output {call_id, max_output_length, output: [{stdout, stderr, outcome}]}`
    (one entry per command, `outcome` `{"type": "exit", "exit_code"}` or
    `{"type": "timeout"}`), or `apply_patch_call_output {call_id, status: completed |
    failed, output}`.
    """


class SessionCancel(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
    )
    session_id: UUID
    results: list[CallResult]
    """
    The calls of the session that had not ended when the cancel came, batch by batch in
    request order, as they ended: `cancelled` (with the output so far of a stopped command,
    or "nothing ran" for a call that had not started), or the real result of a change that
    was under way. Empty when nothing was pending.
    """
    ended: bool
    """
    `false` when some call was still ending after 10 s (answer 202): its batch's response and
    the log have its result.
    """


class SessionTodos(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
    )
    session_id: UUID
    todos: list[Todo]
    """
    The plan's steps in plan order (`source: "plan"`, from `update_plan`), then the tasks in
    the order they were created (`source: "task"`, from `TaskCreate`). Deleted ones are
    gone; the `todo.*` events of the log have their history.
    """


class Tree(BaseModel):
    """
    `GET /v1/sessions/{id}/tree?at=SEQ`: one page of the workspace as it was right after event
    `at`, rebuilt from the log alone.
    """

    model_config = ConfigDict(
        extra="ignore",
    )
    session_id: UUID
    at: int
    """
    The event the tree is the state after.
    """
    total: int = Field(..., ge=0)
    """
    Files and symlinks in all (directories are implied by the paths; empty ones are not
    recorded).
    """
    unrestorable: int = Field(..., ge=0)
    """
    Of them, files whose contents the log does not hold.
    """
    entries: list[TreeEntry]
    """
    Entries in byte order of their paths.
    """
    next_cursor: str | None = None
    """
    Pass as `cursor` for the next page; `null` on the last.
    """


class Catalog(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
    )
    tools: list[CatalogEntry | OpenAiTool | OpenAiChatTool | AnthropicTool | AnthropicNativeTool | McpTool]
    """
    `ToolSpec` objects, or the requested ecosystem's definitions.
    """


class CallsResponse(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
    )
    results: list[CallResultOut | OpenAiItemResultOut]
    """
    One result per call (or OpenAI item), in request order.
    """
