//! `file_delete`: delete one regular file the session has read.
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{
    Capability, FileChange, FileChangeKind, OutputLimit, ToolSpec, TruncationMode,
};

use super::{Action, blocking, jail_failure, read_before_write, too_late};
use crate::text::shown_name;
use crate::{CallReads, RecordedChange, Tool, ToolContext, ToolOutput, parse_args};
use toolexec_workspace::jail::{JailError, Workspace, human_bytes};

const DESCRIPTION: &str = "\
Deletes one file from the workspace.

Use it to remove a file that is no longer needed (after moving its contents elsewhere, say). It \
deletes exactly one regular file: directories are refused (use the shell to remove a directory), \
and so are symlinks (remove a link with the shell). To move a file, copy it with file_copy and then \
delete the original, or use apply_patch's '*** Move to:'.

Read-before-write: the file must have been read in this session (read_file, read_many_files or a \
grep hit) and not have changed since, so that nothing is deleted unseen; otherwise the call is \
refused and nothing is deleted. The deleted contents stay in the session's log.

Example: {\"path\": \"src/legacy/old_parser.rs\"}

Limits: one file per call; files over 10 MiB cannot have been read with read_file, so delete them \
with the shell.";

pub struct FileDelete {
    spec: ToolSpec,
}

impl Default for FileDelete {
    fn default() -> Self {
        Self::new()
    }
}

impl FileDelete {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "file_delete".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: false,
                capabilities: vec![Capability::FsWrite],
                output_limit: OutputLimit::new(50_000, TruncationMode::HeadTail),
            },
        }
    }
}

/// `file_delete`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The file to delete: relative to /workspace or absolute under it.
    #[schemars(length(min = 1))]
    path: String,
}

#[async_trait]
impl Tool for FileDelete {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(output) => return output,
        };
        let workspace = ctx.workspace.clone();
        let reads = ctx.reads.clone();
        let capabilities = self.spec.capabilities.clone();
        let deadline = ctx.deadline.clone();
        blocking(move || {
            if !deadline.commit_change() {
                let what = format!("deleting '{}'", shown_name(&args.path));
                return too_late(&deadline, &what);
            }
            delete(&workspace, &reads, &capabilities, &args.path)
        })
        .await
        .unwrap_or_else(|output| output)
    }
}

fn delete(
    workspace: &Workspace,
    reads: &CallReads,
    capabilities: &[Capability],
    path: &str,
) -> ToolOutput {
    let removed = match workspace.remove_file_if(path, |path, before| {
        read_before_write(capabilities, reads, path, before, Action::Delete)
    }) {
        Ok(Ok(removed)) => removed,
        Ok(Err(refusal)) => return ToolOutput::denied(refusal),
        Err(JailError::IsADirectory { path }) => {
            let path = shown_name(&path);
            return ToolOutput::error(format!(
                "'{path}' is a directory. file_delete deletes one file; remove a directory with \
                 the shell (rm -r '{path}') if you mean to."
            ));
        }
        Err(JailError::NotARegularFile { path, kind }) => {
            let path = shown_name(&path);
            return ToolOutput::error(format!(
                "'{path}' is {kind}, not a regular file. file_delete deletes regular files only; \
                 use the shell (rm '{path}') to remove it."
            ));
        }
        Err(jail) => return jail_failure(&jail),
    };
    reads.forget(&removed.path);
    let size = removed.before.size().unwrap_or(0);
    let change = FileChange {
        kind: FileChangeKind::Deleted,
        path: removed.path.clone(),
        path_b64: None,
        before_sha256: removed.before.sha256().map(str::to_owned),
        after_sha256: None,
        before_size: removed.before.size(),
        after_size: None,
        after_stored: false,
        after_unstored: None,
        after_mode: None,
        capability: Capability::FsWrite,
        symlink_target: None,
        symlink_target_b64: None,
    };
    let message = format!(
        "Deleted {} ({}).",
        shown_name(&removed.path),
        human_bytes(size)
    );
    ToolOutput::ok(message).with_change(RecordedChange {
        change,
        after: None,
    })
}
