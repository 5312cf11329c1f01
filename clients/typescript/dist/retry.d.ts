export interface RetryOptions {
    /** Attempts in all, the first included (1: no retry). */
    attempts?: number;
    /** First backoff, in seconds; doubled each attempt up to `maxBackoff`. */
    backoff?: number;
    maxBackoff?: number;
    /** Seconds a request and all its retries may take. */
    deadline?: number;
}
export declare const DEFAULT_RETRY: Required<RetryOptions>;
export declare const NO_RETRY: RetryOptions;
/** Whether sending the same request again is safe and may succeed. */
export declare function retryable(error: unknown, idempotent: boolean): boolean;
/** Seconds to wait before retry number `attempt` (1, 2, …). */
export declare function backoff(retry: Required<RetryOptions>, attempt: number, retryAfter: number | null): number;
export declare const sleep: (seconds: number) => Promise<void>;
