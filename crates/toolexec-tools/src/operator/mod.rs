//! The operator's tools: the ones a deployment adds by configuration rather than code.
//!
//! - [`openapi`]: one HTTP tool per operation an operator admits from an OpenAPI document
//!   (`[[tools.openapi]]`);
//! - [`mcp_proxy`]: the tools of an MCP server the operator names (`[[tools.mcp]]`);
//! - [`custom`]: command tools (`[[tools.custom]]`), a program run in the session's sandbox.
//!
//! `http` is what the HTTP-backed ones share (the secret kept out of the record, the endpoint
//! checked against the network policy, the tools' names); their input schemas are imported
//! through `schema::import`.
pub mod custom;
pub(crate) mod http;
pub mod mcp_proxy;
pub mod openapi;

pub use http::{LoadNet, Secret};
