/**
 * toolexec: sandboxed, recorded tool execution for LLM agent loops.
 *
 *     import { Client } from "toolexec";
 *     const s = await new Client().session();          // TOOLEXEC_URL, TOOLEXEC_API_KEY
 *     console.log((await s.shell("ls -la")).content);
 *     await s.close();
 *
 * See clients/typescript/README.md for the whole surface.
 */
export * from "./client.js";
export * from "./errors.js";
export * from "./providers.js";
export { DEFAULT_RETRY, NO_RETRY, type RetryOptions } from "./retry.js";
export type * as models from "./schema.js";
export type { paths, components, operations } from "./schema.js";
/** The client's version: the API's (openapi/openapi.json `info.version`). */
export declare const VERSION = "0.1.0";
