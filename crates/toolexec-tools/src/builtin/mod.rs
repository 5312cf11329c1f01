//! The built-in tools, one file each.
use std::sync::Arc;

use crate::Tool;

/// Every built-in tool, in catalog order.
pub fn all() -> Vec<Arc<dyn Tool>> {
    Vec::new()
}
