//! Handlers, one module per resource. Each handler extracts, calls one engine function and maps
//! the result; tenancy comes from the [`crate::auth::AuthTenant`] extractor.
pub mod approvals;
pub mod archive;
pub mod calls;
pub mod cancel;
pub mod environments;
pub mod health;
pub mod history;
pub mod log;
pub mod sessions;
pub mod todos;
pub mod tools;
