/**
 * Which failures are retried, and how long to wait (the same rules as the Python client).
 *
 * Retried, with exponential backoff (and the server's `Retry-After`), within one total
 * deadline per request:
 * - a connection that could not be made (nothing was sent: any request);
 * - a connection that broke after the request went out, for requests that are safe to send
 *   again: reads, a session's close, approvals, archive uploads, and tool calls — a call id the
 *   service has recorded is answered from the record, never run twice;
 * - 503 `unavailable`/`overloaded`, 429 `rate_limited`/`too_many_concurrent`/
 *   `too_many_auth_failures` (nothing ran), and 503 `still_running` (the same call ids again).
 * Never retried: a 409, another 4xx, a 500.
 */
import { ApiError } from "./errors.js";
export const DEFAULT_RETRY = { attempts: 8, backoff: 0.2, maxBackoff: 10, deadline: 1800 };
export const NO_RETRY = { attempts: 1 };
const RETRIED_CODES = new Set([
    "unavailable",
    "overloaded",
    "still_running",
    "rate_limited",
    "too_many_concurrent",
    "too_many_auth_failures",
]);
// Errors of Node's fetch (undici) that mean nothing reached the service.
const NOT_SENT = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "UND_ERR_CONNECT_TIMEOUT", "EHOSTUNREACH", "ENETUNREACH"]);
function causeCode(error) {
    let e = error;
    for (let i = 0; i < 4 && e && typeof e === "object"; i++) {
        const code = e.code;
        if (typeof code === "string")
            return code;
        e = e.cause;
    }
    return undefined;
}
/** Whether sending the same request again is safe and may succeed. */
export function retryable(error, idempotent) {
    if (error instanceof ApiError)
        return RETRIED_CODES.has(error.code);
    if (error instanceof TypeError || (error instanceof Error && error.name === "SocketError")) {
        const code = causeCode(error);
        if (code && NOT_SENT.has(code))
            return true;
        return idempotent; // it may have run: only where running twice is impossible
    }
    return false;
}
/** Seconds to wait before retry number `attempt` (1, 2, …). */
export function backoff(retry, attempt, retryAfter) {
    let delay = Math.min(retry.maxBackoff, retry.backoff * 2 ** (attempt - 1));
    delay = delay / 2 + (Math.random() * delay) / 2;
    return Math.max(delay, retryAfter ?? 0);
}
export const sleep = (seconds) => new Promise((resolve) => setTimeout(resolve, seconds * 1000));
//# sourceMappingURL=retry.js.map