/**
 * The client: `Client`, `Session`, `Terminal`, `Approvals`. Requests go through openapi-fetch,
 * typed by the generated `paths`; each is sent by `Client.send`, which retries what is safe.
 */
import { type Client as FetchClient } from "openapi-fetch";
import { Anthropic, OpenAI } from "./providers.js";
import { type RetryOptions } from "./retry.js";
import type * as schema from "./schema.js";
import type { paths } from "./schema.js";
/** One call's result: `content`, `is_error`, `status`, `rendered` (with a `format`), … */
export type CallResult = schema.CallResultOut;
/** What an OpenAI `shell_call` or `apply_patch_call` item (sent with `format: "openai"`) did: the
 * calls it ran and the output item for the Responses API (`rendered`). */
export type ItemResult = schema.OpenAiItemResultOut;
/** One entry of a batch's answer: a call's result, or (OpenAI items only) an item's. */
export type Result = CallResult | ItemResult;
export type Event = schema.Event;
export type SessionInfo = schema.Session;
export type Policy = schema.Policy;
export type ResultFormat = "openai" | "openai_chat" | "anthropic" | "mcp";
export type CatalogFormat = "toolexec" | ResultFormat;
/** A call: `{ name, arguments, id? }` (an id is made when there is none, so retries are safe). */
export interface CallInput {
    name: string;
    arguments?: Record<string, unknown>;
    id?: string;
}
export interface ClientOptions {
    /** Default: TOOLEXEC_URL, else http://127.0.0.1:8080. */
    url?: string;
    /** Default: TOOLEXEC_API_KEY (sent as `Authorization: Bearer`). */
    apiKey?: string;
    retry?: RetryOptions;
    /** Your own fetch (a proxy, a test double). */
    fetch?: typeof globalThis.fetch;
}
export interface SessionOptions {
    tools?: string[];
    policy?: Policy;
    env?: Record<string, string>;
    /** Sent only when given (a service that knows environments). */
    environment?: string;
    metadata?: Record<string, unknown>;
    files?: Record<string, string>;
}
export declare const DEFAULT_URL = "http://127.0.0.1:8080";
type Answer<T> = {
    data?: T;
    error?: unknown;
    response: Response;
};
/** A toolexec service. */
export declare class Client {
    readonly url: string;
    readonly apiKey: string | undefined;
    readonly retry: Required<RetryOptions>;
    readonly approvals: Approvals;
    /** The generated, typed fetch client (openapi-fetch), for anything not wrapped here. */
    readonly api: FetchClient<paths>;
    readonly headers: Record<string, string>;
    private readonly fetchImpl;
    constructor(urlOrOptions?: string | ClientOptions, apiKey?: string);
    /**
     * Sends one request (`attempt` makes it), retrying what is safe (see retry.ts). Throws the
     * problem's error class, `ConnectionFailed` or `DeadlineExceeded`.
     */
    send<T>(attempt: () => Promise<Answer<T>>, idempotent: boolean): Promise<T>;
    /** Seconds to wait before the next attempt; throws when there is none. */
    wait(start: number, attempt: number, error: unknown, idempotent: boolean): number;
    /** A raw request (the event stream), with the client's headers. */
    fetch(path: string, init?: RequestInit): Promise<Response>;
    /** Creates a session. Close it with `s.close()`, `await using s = …`, or use `withSession`. */
    session(options?: SessionOptions): Promise<Session>;
    /** Runs `fn` with a new session and closes it after, whatever happens. */
    withSession<T>(options: SessionOptions, fn: (s: Session) => Promise<T>): Promise<T>;
    /** A session that exists (opened elsewhere, or a fork's). */
    attach(sessionId: string): Promise<Session>;
    sessions(query?: {
        limit?: number;
        cursor?: string;
    }): Promise<schema.SessionList>;
    /** The catalog, in toolexec's shape or a provider's. */
    tools(format?: CatalogFormat): Promise<{
        tools: unknown[];
    }>;
    invocation(id: string): Promise<schema.Invocation>;
    /** An invocation's full output. */
    output(id: string): Promise<schema.OutputSlice>;
    replay(id: string): Promise<schema.Replay>;
}
/** Calls waiting for a person (`policy.approval`). */
export declare class Approvals {
    private readonly client;
    constructor(client: Client);
    /** The `approval.requested` events of a session not yet decided (oldest first). */
    list(session: Session | string): Promise<Event[]>;
    approve(invocationId: string, decision?: schema.ApprovalDecision): Promise<schema.Invocation>;
    deny(invocationId: string, decision?: schema.ApprovalDecision): Promise<schema.Invocation>;
}
/** An open session: calls, its log, time travel, archives, provider helpers. */
export declare class Session {
    readonly client: Client;
    readonly id: string;
    info: SessionInfo;
    readonly anthropic: Anthropic;
    readonly openai: OpenAI;
    constructor(client: Client, info: SessionInfo);
    private get path();
    close(): Promise<SessionInfo>;
    refresh(): Promise<SessionInfo>;
    /** Runs a batch, in order. Retried safely: the same ids are sent again. */
    calls(calls: (CallInput | Record<string, unknown>)[], format?: ResultFormat): Promise<Result[]>;
    /** Runs one call: `s.call("read_file", { file_path: "a.txt" })`. */
    call(name: string, args?: Record<string, unknown>, options?: {
        id?: string;
    }): Promise<CallResult>;
    shell(command: string, args?: Record<string, unknown>): Promise<CallResult>;
    readFile(filePath: string, args?: Record<string, unknown>): Promise<CallResult>;
    writeFile(filePath: string, content: string): Promise<CallResult>;
    /** The persistent shell (Anthropic's `bash` arguments): state carries over between calls. */
    bash(command?: string, options?: {
        restart?: boolean;
    }): Promise<CallResult>;
    /** Starts a program (`exec_command`); drive it with the Terminal's write/read/close. */
    terminal(cmd: string, args?: Record<string, unknown>): Promise<Terminal>;
    /** Cancels every pending call of the session. */
    cancel(): Promise<schema.SessionCancel>;
    tools(format?: CatalogFormat): Promise<{
        tools: unknown[];
    }>;
    /**
     * The log after `after`. With `follow`, the live stream until the session closes,
     * reconnecting after a dropped connection from the last seq seen.
     */
    events(options?: {
        after?: number;
        follow?: boolean;
        limit?: number;
    }): AsyncGenerator<Event>;
    /** A new session starting as this one was right after `atSeq` (default: now). */
    fork(atSeq?: number, options?: Omit<schema.ForkRequest, "at_seq">): Promise<Session>;
    rewind(toSeq: number, options?: {
        allowPartial?: boolean;
    }): Promise<schema.RewindResult>;
    tree(atSeq?: number, options?: {
        cursor?: string;
        limit?: number;
    }): Promise<schema.Tree>;
    /** A file's bytes as they were right after `atSeq` (default: now). */
    file(path: string, atSeq?: number): Promise<Uint8Array>;
    /** Re-runs the session's calls in a fresh one and compares; waits for the report. */
    verifyReplay(options?: {
        wait?: boolean;
        poll?: number;
    }): Promise<schema.Replay>;
    /** The workspace (now, or right after `atSeq`) as tar bytes. */
    archive(atSeq?: number, options?: {
        allowPartial?: boolean;
    }): Promise<Uint8Array>;
    /** Unpacks a tar (or tar.gz) into the workspace. */
    upload(data: Uint8Array): Promise<schema.ArchiveUploaded>;
    private bytes;
}
/** A program started with `exec_command`, driven with `write_stdin`. */
export declare class Terminal {
    readonly session: Session;
    readonly started: CallResult;
    output: string;
    sessionId: number | null;
    constructor(session: Session, started: CallResult);
    get running(): boolean;
    /** Sends `chars` ("\u0003" is Ctrl-C); the result holds what the program printed. */
    write(chars: string, args?: Record<string, unknown>): Promise<CallResult>;
    /** Polls for output without writing. */
    read(args?: Record<string, unknown>): Promise<CallResult>;
    /** Ends the program (Ctrl-C, then end of input) if it still runs. */
    close(): Promise<void>;
}
export {};
