//! The built-in tools, one file each, and the few helpers they share.
use std::sync::Arc;

use crate::Tool;
use crate::ToolOutput;
use crate::workspace::JailError;

pub mod list_dir;
pub mod read_file;
pub mod write_file;

/// Every built-in tool, in catalog order.
pub fn all() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(read_file::ReadFile::new()),
        Arc::new(write_file::WriteFile::new()),
        Arc::new(list_dir::ListDir::new()),
    ]
}

/// A jail refusal as the model sees it: `denied` for guardrails, `error` otherwise.
pub(crate) fn jail_failure(error: &JailError) -> ToolOutput {
    if error.is_guardrail() {
        ToolOutput::denied(error.model_message())
    } else {
        ToolOutput::error(error.model_message())
    }
}

/// Runs blocking file I/O off the async runtime.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ToolOutput> {
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        tracing::error!(error = %e, "file tool task failed");
        ToolOutput::error("The tool failed unexpectedly (internal error). Try the call again.")
    })
}

/// `1 line`, `3 lines`.
pub(crate) fn plural(count: usize, one: &str, many: &str) -> String {
    if count == 1 {
        format!("{count} {one}")
    } else {
        format!("{count} {many}")
    }
}
