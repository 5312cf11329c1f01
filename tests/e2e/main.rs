//! End-to-end tests: a real server on port 0 over a fresh Postgres database per test (and the
//! embedded SQLite store), in-process router tests, the store suite on both backends, and the
//! OpenAPI drift check.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod api;
mod approvals;
mod archive;
mod binary;
mod budget_scan;
mod budget_store;
mod budget_tools;
mod byte_pages;
mod call_index;
mod cancel;
mod cluster;
mod custom_tools;
mod descriptors;
mod dialects;
mod examples;
mod generated_client;
mod http_jail;
mod http_limits;
mod http_scenarios;
mod mcp;
mod mcp_proxy;
mod memory_bounds;
mod object_store;
mod observability;
mod openapi;
mod openapi_tools;
mod problems;
mod quotas;
mod recording;
mod refactor;
mod sandbox_escape;
mod shapes;
mod shell;
mod store;
mod tenancy;
mod time_travel;
mod todos;
mod tool_deadlines;
mod web_fetch;
