"""Provider loops in three lines: the catalog in a provider's shape, and the model's tool calls
run and answered in the shape its next request takes.

    tools = s.anthropic.tools()                       # Messages API `tools`
    reply = anthropic.Anthropic().messages.create(..., tools=tools, messages=messages)
    messages += [{"role": "assistant", "content": reply.content},
                 {"role": "user", "content": s.anthropic.run(reply)}]

    tools = s.openai.tools()                          # Responses API `tools`
    response = openai.OpenAI().responses.create(..., tools=tools, input=items)
    items += response.output + s.openai.run(response.output)

    tools = s.openai.chat.tools()                     # Chat Completions `tools`
    message = completion.choices[0].message
    messages += [message, *s.openai.chat.run(message)]

The model's own ids are the call ids, so a retried batch never runs a call twice. The official
SDKs (`anthropic`, `openai`) are optional: their objects and plain dicts are both accepted, and
their types are only named for type checkers.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterable, Union

if TYPE_CHECKING:  # the SDKs stay optional dependencies
    from anthropic.types import Message, ToolParam, ToolResultBlockParam
    from openai.types.chat import (
        ChatCompletionMessage,
        ChatCompletionToolMessageParam,
        ChatCompletionToolParam,
    )
    from openai.types.responses import ResponseInputItemParam, ResponseOutputItem, ToolParam as ResponsesToolParam

    from ._client import AsyncSession, Session

    AnthropicMessage = Union[Message, dict[str, Any], Iterable[Any]]
    ResponsesOutput = Iterable[Union[ResponseOutputItem, dict[str, Any]]]
    ChatMessage = Union[ChatCompletionMessage, dict[str, Any]]


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _plain(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    return dump(exclude_none=True) if dump else obj


def anthropic_calls(message: Any) -> list[dict[str, Any]]:
    """The `tool_use` blocks of an assistant message (an SDK `Message`, a dict, or its blocks)."""
    content = message if isinstance(message, (list, tuple)) else _get(message, "content", [])
    return [
        {"id": _get(b, "id"), "name": _get(b, "name"), "arguments": _plain(_get(b, "input")) or {}}
        for b in content
        if _get(b, "type") == "tool_use"
    ]


# Responses API items the service runs itself (issue 24: `?format=openai` takes them whole).
_NATIVE_OPENAI = ("shell_call", "apply_patch_call")


def openai_calls(output: Any) -> list[dict[str, Any]]:
    """The calls of a Responses API `output`: `function_call` items (and the built-in `shell_call`
    and `apply_patch_call` items, passed on as they are)."""
    calls: list[dict[str, Any]] = []
    for item in output:
        kind = _get(item, "type")
        if kind == "function_call":
            arguments = _get(item, "arguments") or "{}"
            calls.append({"id": _get(item, "call_id"), "name": _get(item, "name"), "arguments": json.loads(arguments)})
        elif kind in _NATIVE_OPENAI:
            calls.append(_plain(item))
    return calls


def chat_calls(message: Any) -> list[dict[str, Any]]:
    """The `tool_calls` of a Chat Completions assistant message."""
    out = []
    for tc in _get(message, "tool_calls") or []:
        fn = _get(tc, "function")
        out.append({"id": _get(tc, "id"), "name": _get(fn, "name"), "arguments": json.loads(_get(fn, "arguments") or "{}")})
    return out


class Anthropic:
    """`s.anthropic`: the catalog as Anthropic's `tools`, and `tool_use` blocks run."""

    def __init__(self, session: Session) -> None:
        self._s = session

    def tools(self) -> list[ToolParam]:
        return self._s.tools(format="anthropic")["tools"]  # type: ignore[no-any-return]

    def run(self, message: AnthropicMessage) -> list[ToolResultBlockParam]:
        """Runs the message's `tool_use` blocks; the `tool_result` blocks for the next user turn."""
        calls = anthropic_calls(message)
        if not calls:
            return []
        return [r.rendered for r in self._s.calls(calls, format="anthropic")]  # type: ignore[misc]


class OpenAIChat:
    """`s.openai.chat`: Chat Completions."""

    def __init__(self, session: Session) -> None:
        self._s = session

    def tools(self) -> list[ChatCompletionToolParam]:
        return self._s.tools(format="openai_chat")["tools"]  # type: ignore[no-any-return]

    def run(self, message: ChatMessage) -> list[ChatCompletionToolMessageParam]:
        """Runs the message's `tool_calls`; one `tool` message each, to append to `messages`."""
        calls = chat_calls(message)
        if not calls:
            return []
        return [r.rendered for r in self._s.calls(calls, format="openai_chat")]  # type: ignore[misc]


class OpenAI:
    """`s.openai`: the Responses API (and `s.openai.chat` for Chat Completions)."""

    def __init__(self, session: Session) -> None:
        self._s = session
        self.chat = OpenAIChat(session)

    def tools(self) -> list[ResponsesToolParam]:
        return self._s.tools(format="openai")["tools"]  # type: ignore[no-any-return]

    def run(self, output: ResponsesOutput) -> list[ResponseInputItemParam]:
        """Runs the output's calls; the `function_call_output` items (and `shell_call_output`,
        `apply_patch_call_output`) to add to the next request's `input`."""
        calls = openai_calls(output)
        if not calls:
            return []
        return [r.rendered for r in self._s.calls(calls, format="openai")]  # type: ignore[misc]


class AsyncAnthropic:
    def __init__(self, session: AsyncSession) -> None:
        self._s = session

    async def tools(self) -> list[ToolParam]:
        return (await self._s.tools(format="anthropic"))["tools"]  # type: ignore[no-any-return]

    async def run(self, message: AnthropicMessage) -> list[ToolResultBlockParam]:
        calls = anthropic_calls(message)
        if not calls:
            return []
        return [r.rendered for r in await self._s.calls(calls, format="anthropic")]  # type: ignore[misc]


class AsyncOpenAIChat:
    def __init__(self, session: AsyncSession) -> None:
        self._s = session

    async def tools(self) -> list[ChatCompletionToolParam]:
        return (await self._s.tools(format="openai_chat"))["tools"]  # type: ignore[no-any-return]

    async def run(self, message: ChatMessage) -> list[ChatCompletionToolMessageParam]:
        calls = chat_calls(message)
        if not calls:
            return []
        return [r.rendered for r in await self._s.calls(calls, format="openai_chat")]  # type: ignore[misc]


class AsyncOpenAI:
    def __init__(self, session: AsyncSession) -> None:
        self._s = session
        self.chat = AsyncOpenAIChat(session)

    async def tools(self) -> list[ResponsesToolParam]:
        return (await self._s.tools(format="openai"))["tools"]  # type: ignore[no-any-return]

    async def run(self, output: ResponsesOutput) -> list[ResponseInputItemParam]:
        calls = openai_calls(output)
        if not calls:
            return []
        return [r.rendered for r in await self._s.calls(calls, format="openai")]  # type: ignore[misc]
