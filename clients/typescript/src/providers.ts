/**
 * Provider loops in three lines: the catalog in a provider's shape, and the model's tool calls
 * run and answered in the shape its next request takes.
 *
 *     const tools = await s.anthropic.tools();                 // Messages API `tools`
 *     const reply = await anthropic.messages.create({ ..., tools, messages });
 *     messages.push({ role: "assistant", content: reply.content },
 *                   { role: "user", content: await s.anthropic.run(reply) });
 *
 *     const tools = await s.openai.tools();                    // Responses API `tools`
 *     const response = await openai.responses.create({ ..., tools, input });
 *     input.push(...response.output, ...(await s.openai.run(response.output)));
 *
 *     const tools = await s.openai.chat.tools();               // Chat Completions `tools`
 *     const message = (await openai.chat.completions.create({ ..., tools, messages })).choices[0].message;
 *     messages.push(message, ...(await s.openai.chat.run(message)));
 *
 * The model's own ids are the call ids, so a retried batch never runs a call twice. The official
 * SDKs are optional peer dependencies: only their types are imported (erased at run time).
 */
import type { Message, ToolResultBlockParam, ToolUnion } from "@anthropic-ai/sdk/resources/messages";
import type { ChatCompletionMessage, ChatCompletionTool, ChatCompletionToolMessageParam } from "openai/resources/chat/completions";
import type { ResponseInputItem, ResponseOutputItem, Tool as ResponsesTool } from "openai/resources/responses/responses";

import type { CallInput, Session } from "./client.js";

type Loose = Record<string, unknown>;

/** The `tool_use` blocks of an assistant message (or of its content). */
export function anthropicCalls(message: Message | { content: unknown[] } | unknown[]): CallInput[] {
  const content = (Array.isArray(message) ? message : message.content) as Loose[];
  return content
    .filter((b) => b.type === "tool_use")
    .map((b) => ({ id: b.id as string, name: b.name as string, arguments: (b.input ?? {}) as Loose }));
}

// Responses API items the service runs itself (issue 24: `?format=openai` takes them whole).
const NATIVE_OPENAI = new Set(["shell_call", "apply_patch_call"]);

/** The calls of a Responses API `output`: `function_call` items (and `shell_call`/`apply_patch_call`, whole). */
export function openaiCalls(output: readonly (ResponseOutputItem | Loose)[]): (CallInput | Loose)[] {
  const calls: (CallInput | Loose)[] = [];
  for (const item of output as Loose[]) {
    if (item.type === "function_call") {
      calls.push({ id: item.call_id as string, name: item.name as string, arguments: JSON.parse((item.arguments as string) || "{}") });
    } else if (NATIVE_OPENAI.has(item.type as string)) {
      calls.push(item);
    }
  }
  return calls;
}

/** The `tool_calls` of a Chat Completions assistant message. */
export function chatCalls(message: ChatCompletionMessage | Loose): CallInput[] {
  const toolCalls = ((message as Loose).tool_calls ?? []) as Loose[];
  return toolCalls.map((tc) => {
    const fn = tc.function as Loose;
    return { id: tc.id as string, name: fn.name as string, arguments: JSON.parse((fn.arguments as string) || "{}") };
  });
}

/** `s.anthropic`: the catalog as Anthropic's `tools`, and `tool_use` blocks run. */
export class Anthropic {
  constructor(private readonly session: Session) {}

  async tools(): Promise<ToolUnion[]> {
    return (await this.session.tools("anthropic")).tools as ToolUnion[];
  }

  /** Runs the message's `tool_use` blocks; the `tool_result` blocks for the next user turn. */
  async run(message: Message | { content: unknown[] } | unknown[]): Promise<ToolResultBlockParam[]> {
    const calls = anthropicCalls(message);
    if (!calls.length) return [];
    return (await this.session.calls(calls, "anthropic")).map((r) => r.rendered as unknown as ToolResultBlockParam);
  }
}

/** `s.openai.chat`: Chat Completions. */
export class OpenAIChat {
  constructor(private readonly session: Session) {}

  async tools(): Promise<ChatCompletionTool[]> {
    return (await this.session.tools("openai_chat")).tools as ChatCompletionTool[];
  }

  /** Runs the message's `tool_calls`; one `tool` message each. */
  async run(message: ChatCompletionMessage | Loose): Promise<ChatCompletionToolMessageParam[]> {
    const calls = chatCalls(message);
    if (!calls.length) return [];
    return (await this.session.calls(calls, "openai_chat")).map((r) => r.rendered as unknown as ChatCompletionToolMessageParam);
  }
}

/** `s.openai`: the Responses API (and `s.openai.chat` for Chat Completions). */
export class OpenAI {
  readonly chat: OpenAIChat;

  constructor(private readonly session: Session) {
    this.chat = new OpenAIChat(session);
  }

  async tools(): Promise<ResponsesTool[]> {
    return (await this.session.tools("openai")).tools as ResponsesTool[];
  }

  /** Runs the output's calls; the `function_call_output` items (and `shell_call_output`, `apply_patch_call_output`). */
  async run(output: readonly (ResponseOutputItem | Loose)[]): Promise<ResponseInputItem[]> {
    const calls = openaiCalls(output);
    if (!calls.length) return [];
    return (await this.session.calls(calls, "openai")).map((r) => r.rendered as unknown as ResponseInputItem);
  }
}
