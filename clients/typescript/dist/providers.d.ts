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
export declare function anthropicCalls(message: Message | {
    content: unknown[];
} | unknown[]): CallInput[];
/** The calls of a Responses API `output`: `function_call` items (and `shell_call`/`apply_patch_call`, whole). */
export declare function openaiCalls(output: readonly (ResponseOutputItem | Loose)[]): (CallInput | Loose)[];
/** The `tool_calls` of a Chat Completions assistant message. */
export declare function chatCalls(message: ChatCompletionMessage | Loose): CallInput[];
/** `s.anthropic`: the catalog as Anthropic's `tools`, and `tool_use` blocks run. */
export declare class Anthropic {
    private readonly session;
    constructor(session: Session);
    tools(): Promise<ToolUnion[]>;
    /** Runs the message's `tool_use` blocks; the `tool_result` blocks for the next user turn. */
    run(message: Message | {
        content: unknown[];
    } | unknown[]): Promise<ToolResultBlockParam[]>;
}
/** `s.openai.chat`: Chat Completions. */
export declare class OpenAIChat {
    private readonly session;
    constructor(session: Session);
    tools(): Promise<ChatCompletionTool[]>;
    /** Runs the message's `tool_calls`; one `tool` message each. */
    run(message: ChatCompletionMessage | Loose): Promise<ChatCompletionToolMessageParam[]>;
}
/** `s.openai`: the Responses API (and `s.openai.chat` for Chat Completions). */
export declare class OpenAI {
    private readonly session;
    readonly chat: OpenAIChat;
    constructor(session: Session);
    tools(): Promise<ResponsesTool[]>;
    /** Runs the output's calls; the `function_call_output` items (and `shell_call_output`, `apply_patch_call_output`). */
    run(output: readonly (ResponseOutputItem | Loose)[]): Promise<ResponseInputItem[]>;
}
export {};
