//! The workspace jail (placeholder, being written).
#[derive(Debug)]
pub struct Workspace;
