/**
 * The client: `Client`, `Session`, `Terminal`, `Approvals`. Requests go through openapi-fetch,
 * typed by the generated `paths`; each is sent by `Client.send`, which retries what is safe.
 */
import createClient from "openapi-fetch";
import { ConnectionFailed, DeadlineExceeded, ToolexecError, fromProblem } from "./errors.js";
import { Anthropic, OpenAI } from "./providers.js";
import { DEFAULT_RETRY, backoff, retryable, sleep } from "./retry.js";
export const DEFAULT_URL = "http://127.0.0.1:8080";
const env = (name) => globalThis.process?.env[name];
/** A toolexec service. */
export class Client {
    url;
    apiKey;
    retry;
    approvals;
    /** The generated, typed fetch client (openapi-fetch), for anything not wrapped here. */
    api;
    headers;
    fetchImpl;
    constructor(urlOrOptions, apiKey) {
        const o = typeof urlOrOptions === "string" ? { url: urlOrOptions, apiKey } : { ...(urlOrOptions ?? {}) };
        if (apiKey !== undefined)
            o.apiKey = apiKey;
        this.url = (o.url ?? env("TOOLEXEC_URL") ?? DEFAULT_URL).replace(/\/+$/, "");
        this.apiKey = o.apiKey ?? env("TOOLEXEC_API_KEY");
        this.retry = { ...DEFAULT_RETRY, ...(o.retry ?? {}) };
        this.headers = this.apiKey ? { authorization: `Bearer ${this.apiKey}` } : {};
        this.fetchImpl = o.fetch ?? globalThis.fetch;
        this.api = createClient({ baseUrl: this.url, headers: this.headers, fetch: this.fetchImpl });
        this.approvals = new Approvals(this);
    }
    /**
     * Sends one request (`attempt` makes it), retrying what is safe (see retry.ts). Throws the
     * problem's error class, `ConnectionFailed` or `DeadlineExceeded`.
     */
    async send(attempt, idempotent) {
        const start = Date.now();
        for (let n = 1;; n++) {
            try {
                const { data, error, response } = await attempt();
                if (!response.ok)
                    throw problem(response, error);
                return data;
            }
            catch (e) {
                await sleep(this.wait(start, n, e, idempotent));
            }
        }
    }
    /** Seconds to wait before the next attempt; throws when there is none. */
    wait(start, attempt, error, idempotent) {
        if (attempt >= this.retry.attempts || !retryable(error, idempotent)) {
            if (error instanceof ToolexecError)
                throw error;
            throw new ConnectionFailed(`${error?.message ?? error}`, { cause: error });
        }
        const delay = backoff(this.retry, attempt, error.retryAfter ?? null);
        if ((Date.now() - start) / 1000 + delay > this.retry.deadline) {
            throw new DeadlineExceeded(`gave up after ${attempt} attempts: ${error?.message ?? error}`, { cause: error });
        }
        return delay;
    }
    /** A raw request (the event stream), with the client's headers. */
    fetch(path, init = {}) {
        return this.fetchImpl(this.url + path, { ...init, headers: { ...this.headers, ...init.headers } });
    }
    /** Creates a session. Close it with `s.close()`, `await using s = …`, or use `withSession`. */
    async session(options = {}) {
        const body = Object.fromEntries(Object.entries(options).filter(([, v]) => v !== undefined));
        const info = await this.send(() => this.api.POST("/v1/sessions", { body }), false);
        return new Session(this, info);
    }
    /** Runs `fn` with a new session and closes it after, whatever happens. */
    async withSession(options, fn) {
        const s = await this.session(options);
        try {
            return await fn(s);
        }
        finally {
            await s.close();
        }
    }
    /** A session that exists (opened elsewhere, or a fork's). */
    async attach(sessionId) {
        const info = await this.send(() => this.api.GET("/v1/sessions/{id}", { params: { path: { id: sessionId } } }), true);
        return new Session(this, info);
    }
    sessions(query = {}) {
        return this.send(() => this.api.GET("/v1/sessions", { params: { query } }), true);
    }
    /** The catalog, in toolexec's shape or a provider's. */
    tools(format) {
        return this.send(() => this.api.GET("/v1/tools", { params: { query: format ? { format } : {} } }), true);
    }
    invocation(id) {
        return this.send(() => this.api.GET("/v1/invocations/{id}", { params: { path: { id } } }), true);
    }
    /** An invocation's full output. */
    output(id) {
        return this.send(() => this.api.GET("/v1/invocations/{id}/output", { params: { path: { id } } }), true);
    }
    replay(id) {
        return this.send(() => this.api.GET("/v1/replays/{id}", { params: { path: { id } } }), true);
    }
}
function problem(response, body) {
    const after = response.headers.get("retry-after");
    return fromProblem(response.status, body, response.headers.get("x-request-id"), after === null ? null : Number(after));
}
/** Calls waiting for a person (`policy.approval`). */
export class Approvals {
    client;
    constructor(client) {
        this.client = client;
    }
    /** The `approval.requested` events of a session not yet decided (oldest first). */
    async list(session) {
        const s = typeof session === "string" ? await this.client.attach(session) : session;
        const waiting = new Map();
        for await (const e of s.events()) {
            if (!e.invocation_id)
                continue;
            if (e.kind === "approval.requested")
                waiting.set(e.invocation_id, e);
            else if (e.kind === "approval.decided" || e.kind === "invocation.finished")
                waiting.delete(e.invocation_id);
        }
        return [...waiting.values()];
    }
    approve(invocationId, decision = {}) {
        // The same decision again is answered 200: a retry is harmless.
        const c = this.client;
        return c.send(() => c.api.POST("/v1/invocations/{id}/approve", { params: { path: { id: invocationId } }, body: decision }), true);
    }
    deny(invocationId, decision = {}) {
        const c = this.client;
        return c.send(() => c.api.POST("/v1/invocations/{id}/deny", { params: { path: { id: invocationId } }, body: decision }), true);
    }
}
let counter = 0;
const newCallId = () => `call_${Date.now().toString(36)}_${(counter++).toString(36)}_${Math.random().toString(36).slice(2, 10)}`;
/** An open session: calls, its log, time travel, archives, provider helpers. */
export class Session {
    client;
    id;
    info;
    anthropic;
    openai;
    constructor(client, info) {
        this.client = client;
        this.info = info;
        this.id = info.id;
        this.anthropic = new Anthropic(this);
        this.openai = new OpenAI(this);
    }
    get path() {
        return { params: { path: { id: this.id } } };
    }
    /** `await using s = await client.session()` closes it at the end of the block. */
    async [Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose")]() {
        await this.close();
    }
    async close() {
        const c = this.client;
        this.info = await c.send(() => c.api.DELETE("/v1/sessions/{id}", this.path), true);
        return this.info;
    }
    async refresh() {
        const c = this.client;
        this.info = await c.send(() => c.api.GET("/v1/sessions/{id}", this.path), true);
        return this.info;
    }
    // Calls ----------------------------------------------------------------------------------
    /** Runs a batch, in order. Retried safely: the same ids are sent again. */
    async calls(calls, format) {
        const body = {
            calls: calls.map((c) => "name" in c
                ? { id: c.id ?? newCallId(), name: c.name, arguments: c.arguments ?? {} }
                : c),
        };
        // The hot path skips openapi-fetch (which builds a `Request` per call, ~0.2 ms of CPU) for a
        // plain fetch of the same typed body and answer (docs/benchmarks.md, "The clients").
        const c = this.client;
        const url = `/v1/sessions/${this.id}/calls${format ? `?format=${format}` : ""}`;
        const init = { method: "POST", body: JSON.stringify(body), headers: { "content-type": "application/json" } };
        const out = await c.send(async () => {
            const response = await c.fetch(url, init);
            if (!response.ok)
                return { error: await response.json().catch(() => null), response };
            return { data: (await response.json()), response };
        }, true);
        return out.results;
    }
    /** Runs one call: `s.call("read_file", { file_path: "a.txt" })`. */
    async call(name, args = {}, options = {}) {
        const [r] = await this.calls([{ name, arguments: args, id: options.id }]);
        if (!r || !("invocation_id" in r))
            throw new TypeError(`expected a call's result, got ${JSON.stringify(r)}`);
        return r;
    }
    shell(command, args = {}) {
        return this.call("shell", { command, ...args });
    }
    readFile(filePath, args = {}) {
        return this.call("read_file", { file_path: filePath, ...args });
    }
    writeFile(filePath, content) {
        return this.call("write_file", { file_path: filePath, content });
    }
    /** The persistent shell (Anthropic's `bash` arguments): state carries over between calls. */
    bash(command, options = {}) {
        const args = options.restart ? { restart: true } : {};
        if (command !== undefined)
            args.command = command;
        return this.call("bash", args);
    }
    /** Starts a program (`exec_command`); drive it with the Terminal's write/read/close. */
    async terminal(cmd, args = {}) {
        return new Terminal(this, await this.call("exec_command", { cmd, tty: true, ...args }));
    }
    /** Cancels every pending call of the session. */
    cancel() {
        const c = this.client;
        return c.send(() => c.api.POST("/v1/sessions/{id}/cancel", this.path), true);
    }
    tools(format) {
        const c = this.client;
        const query = format ? { format } : {};
        return c.send(() => c.api.GET("/v1/sessions/{id}/tools", { params: { path: { id: this.id }, query } }), true);
    }
    // The log --------------------------------------------------------------------------------
    /**
     * The log after `after`. With `follow`, the live stream until the session closes,
     * reconnecting after a dropped connection from the last seq seen.
     */
    async *events(options = {}) {
        let after = options.after ?? 0;
        const limit = options.limit ?? 1000;
        const c = this.client;
        if (!options.follow) {
            for (;;) {
                const page = await c.send(() => c.api.GET("/v1/sessions/{id}/events", { params: { path: { id: this.id }, query: { after, limit } } }), true);
                yield* page.events;
                if (page.events.length < limit || page.events.length === 0)
                    return;
                after = page.events[page.events.length - 1].seq;
            }
        }
        let start = Date.now();
        let attempt = 0;
        for (;;) {
            try {
                const response = await c.fetch(`/v1/sessions/${this.id}/events/stream`, {
                    headers: { "last-event-id": String(after), accept: "text/event-stream" },
                });
                if (!response.ok)
                    throw problem(response, await response.json().catch(() => null));
                let resumed = false;
                for await (const sse of readSse(response.body)) {
                    if (sse.event.startsWith("stream.")) {
                        // overflow or a store error: resume from where the service says
                        after = Number(JSON.parse(sse.data).resume_after ?? after);
                        resumed = true;
                        break;
                    }
                    if (!sse.id)
                        continue;
                    const event = JSON.parse(sse.data);
                    after = event.seq;
                    attempt = 0;
                    start = Date.now();
                    yield event;
                    if (event.kind === "session.closed")
                        return;
                }
                if (!resumed)
                    return; // the service ended the stream: the session is closed
            }
            catch (e) {
                attempt += 1;
                await sleep(c.wait(start, attempt, e, true));
            }
        }
    }
    // Time travel and replay -----------------------------------------------------------------
    /** A new session starting as this one was right after `atSeq` (default: now). */
    async fork(atSeq, options = {}) {
        const c = this.client;
        const body = { ...options, ...(atSeq !== undefined ? { at_seq: atSeq } : {}) };
        return new Session(c, await c.send(() => c.api.POST("/v1/sessions/{id}/fork", { ...this.path, body }), false));
    }
    rewind(toSeq, options = {}) {
        const c = this.client;
        const body = { to_seq: toSeq, allow_partial: options.allowPartial ?? false };
        return c.send(() => c.api.POST("/v1/sessions/{id}/rewind", { ...this.path, body }), false);
    }
    tree(atSeq, options = {}) {
        const c = this.client;
        const query = { ...options, ...(atSeq !== undefined ? { at: atSeq } : {}) };
        return c.send(() => c.api.GET("/v1/sessions/{id}/tree", { params: { path: { id: this.id }, query } }), true);
    }
    /** A file's bytes as they were right after `atSeq` (default: now). */
    async file(path, atSeq) {
        const c = this.client;
        const query = atSeq !== undefined ? `?at=${atSeq}` : "";
        const url = `/v1/sessions/${this.id}/files/${path.replace(/^\/+/, "").split("/").map(encodeURIComponent).join("/")}${query}`;
        return this.bytes(() => c.fetch(url));
    }
    /** Re-runs the session's calls in a fresh one and compares; waits for the report. */
    async verifyReplay(options = {}) {
        const c = this.client;
        let replay = await c.send(() => c.api.POST("/v1/sessions/{id}/replay", { ...this.path, body: { mode: "verify" } }), false);
        while ((options.wait ?? true) && replay.status === "running") {
            await sleep(options.poll ?? 0.25);
            replay = await c.replay(replay.id);
        }
        return replay;
    }
    // Archives -------------------------------------------------------------------------------
    /** The workspace (now, or right after `atSeq`) as tar bytes. */
    archive(atSeq, options = {}) {
        const q = new URLSearchParams();
        if (atSeq !== undefined)
            q.set("at", String(atSeq));
        if (options.allowPartial)
            q.set("allow_partial", "true");
        const query = q.size ? `?${q}` : "";
        return this.bytes(() => this.client.fetch(`/v1/sessions/${this.id}/archive${query}`));
    }
    /** Unpacks a tar (or tar.gz) into the workspace. */
    upload(data) {
        const c = this.client;
        return c.send(async () => {
            const response = await c.fetch(`/v1/sessions/${this.id}/archive`, {
                method: "PUT",
                body: data,
                headers: { "content-type": "application/octet-stream" },
            });
            const body = await response.json();
            return response.ok ? { data: body, response } : { error: body, response };
        }, true);
    }
    bytes(get) {
        return this.client.send(async () => {
            const response = await get();
            if (!response.ok)
                return { error: await response.json().catch(() => null), response };
            return { data: new Uint8Array(await response.arrayBuffer()), response };
        }, true);
    }
}
/** A program started with `exec_command`, driven with `write_stdin`. */
export class Terminal {
    session;
    started;
    output;
    sessionId;
    constructor(session, started) {
        this.session = session;
        this.started = started;
        this.output = started.content;
        this.sessionId = terminalId(started);
    }
    get running() {
        return this.sessionId !== null;
    }
    /** Sends `chars` ("\u0003" is Ctrl-C); the result holds what the program printed. */
    async write(chars, args = {}) {
        const r = await this.session.call("write_stdin", { session_id: this.sessionId, chars, ...args });
        this.output = r.content;
        if (r.is_error || r.content.includes("Process exited with code"))
            this.sessionId = null;
        return r;
    }
    /** Polls for output without writing. */
    read(args = {}) {
        return this.write("", args);
    }
    /** Ends the program (Ctrl-C, then end of input) if it still runs. */
    async close() {
        if (this.running)
            await this.write("\u0003");
        if (this.running)
            await this.write("\u0004");
    }
}
function terminalId(r) {
    const m = /^Process running with session ID (\d+)/m.exec(r.content);
    return m ? Number(m[1]) : null;
}
/** Server-Sent Events from a byte stream (the WHATWG parsing rules, minus `retry`). */
async function* readSse(body) {
    const decoder = new TextDecoder();
    let buffer = "";
    let id = "";
    let event = "";
    let data = [];
    const reader = body.getReader();
    try {
        for (;;) {
            const { value, done } = await reader.read();
            if (done)
                return;
            buffer += decoder.decode(value, { stream: true });
            let nl;
            while ((nl = buffer.search(/\r\n|\n|\r/)) >= 0) {
                const line = buffer.slice(0, nl);
                buffer = buffer.slice(nl + (buffer.startsWith("\r\n", nl) ? 2 : 1));
                if (line === "") {
                    if (data.length)
                        yield { id, event: event || "message", data: data.join("\n") };
                    event = "";
                    data = [];
                    continue;
                }
                if (line.startsWith(":"))
                    continue;
                const colon = line.indexOf(":");
                const field = colon < 0 ? line : line.slice(0, colon);
                let value2 = colon < 0 ? "" : line.slice(colon + 1);
                if (value2.startsWith(" "))
                    value2 = value2.slice(1);
                if (field === "data")
                    data.push(value2);
                else if (field === "event")
                    event = value2;
                else if (field === "id")
                    id = value2;
            }
        }
    }
    finally {
        reader.releaseLock();
        await body.cancel().catch(() => undefined);
    }
}
//# sourceMappingURL=client.js.map