/** The `tool_use` blocks of an assistant message (or of its content). */
export function anthropicCalls(message) {
    const content = (Array.isArray(message) ? message : message.content);
    return content
        .filter((b) => b.type === "tool_use")
        .map((b) => ({ id: b.id, name: b.name, arguments: (b.input ?? {}) }));
}
// Responses API items the service runs itself (issue 24: `?format=openai` takes them whole).
const NATIVE_OPENAI = new Set(["shell_call", "apply_patch_call"]);
/** The calls of a Responses API `output`: `function_call` items (and `shell_call`/`apply_patch_call`, whole). */
export function openaiCalls(output) {
    const calls = [];
    for (const item of output) {
        if (item.type === "function_call") {
            calls.push({ id: item.call_id, name: item.name, arguments: JSON.parse(item.arguments || "{}") });
        }
        else if (NATIVE_OPENAI.has(item.type)) {
            calls.push(item);
        }
    }
    return calls;
}
/** The `tool_calls` of a Chat Completions assistant message. */
export function chatCalls(message) {
    const toolCalls = (message.tool_calls ?? []);
    return toolCalls.map((tc) => {
        const fn = tc.function;
        return { id: tc.id, name: fn.name, arguments: JSON.parse(fn.arguments || "{}") };
    });
}
/** `s.anthropic`: the catalog as Anthropic's `tools`, and `tool_use` blocks run. */
export class Anthropic {
    session;
    constructor(session) {
        this.session = session;
    }
    async tools() {
        return (await this.session.tools("anthropic")).tools;
    }
    /** Runs the message's `tool_use` blocks; the `tool_result` blocks for the next user turn. */
    async run(message) {
        const calls = anthropicCalls(message);
        if (!calls.length)
            return [];
        return (await this.session.calls(calls, "anthropic")).map((r) => r.rendered);
    }
}
/** `s.openai.chat`: Chat Completions. */
export class OpenAIChat {
    session;
    constructor(session) {
        this.session = session;
    }
    async tools() {
        return (await this.session.tools("openai_chat")).tools;
    }
    /** Runs the message's `tool_calls`; one `tool` message each. */
    async run(message) {
        const calls = chatCalls(message);
        if (!calls.length)
            return [];
        return (await this.session.calls(calls, "openai_chat")).map((r) => r.rendered);
    }
}
/** `s.openai`: the Responses API (and `s.openai.chat` for Chat Completions). */
export class OpenAI {
    session;
    chat;
    constructor(session) {
        this.session = session;
        this.chat = new OpenAIChat(session);
    }
    async tools() {
        return (await this.session.tools("openai")).tools;
    }
    /** Runs the output's calls; the `function_call_output` items (and `shell_call_output`, `apply_patch_call_output`). */
    async run(output) {
        const calls = openaiCalls(output);
        if (!calls.length)
            return [];
        return (await this.session.calls(calls, "openai")).map((r) => r.rendered);
    }
}
//# sourceMappingURL=providers.js.map