//! `file_copy`: copy one file's bytes to another path without them passing through the model.
//!
//! It declares [`Capability::ContentFromSource`]: everything it writes is a faithful copy of an
//! existing file, so the read-before-write guardrail stands down for the destination (see
//! `builtin::read_before_write`: the exemption follows the declared capability, not this tool's
//! name). Clobbering is guarded instead by an explicit `overwrite` flag: an existing destination
//! is replaced only when the call says so.
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};

use super::{Action, blocking, jail_failure, read_before_write, too_late, written_change};
use crate::reads::WriteCheck;
use crate::text::shown_name;
use crate::{CallReads, Tool, ToolContext, ToolOutput, parse_args};
use toolexec_workspace::jail::{Copied, JailError, Workspace, human_bytes};

/// Copies up to this size are recorded with their contents (as a blob); bigger ones with their
/// hash and size only (`after: None`), so copying a large asset does not double its storage in
/// the event log.
pub const MAX_RECORDED_BYTES: u64 = 1024 * 1024;

const DESCRIPTION: &str = "\
Copies one file to another path in the workspace. The bytes go straight from file to file: they \
never pass through you, so any file can be copied whatever its size or type (images, archives, \
binaries, huge data files).

Use it to duplicate a file as a starting point, to copy assets or fixtures, or (with file_delete) \
to move a file. To change a file's contents use edit_file, apply_patch or write_file; to copy a \
whole directory use the shell.

`dest` is the full path of the new file (not a directory to copy into); missing parent \
directories are created. If dest already exists the call is refused unless `overwrite` is true; \
with `overwrite` the old contents are replaced (recorded in the session's log). Because the new \
contents are an exact copy of an existing file, dest does not need to have been read first. The \
source must be a regular file inside the workspace (not a directory, symlinks are followed only \
inside the workspace, hard-linked files are refused).

Example: {\"source\": \"templates/config.example.toml\", \"dest\": \"config.toml\"}

Limits: one file per call. The copy is atomic: dest holds either its old contents or the whole \
copy, never part of it.";

pub struct FileCopy {
    spec: ToolSpec,
}

impl Default for FileCopy {
    fn default() -> Self {
        Self::new()
    }
}

impl FileCopy {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "file_copy".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: false,
                capabilities: vec![
                    Capability::FsRead,
                    Capability::FsWrite,
                    Capability::ContentFromSource,
                ],
                output_limit: OutputLimit::new(50_000, TruncationMode::HeadTail),
            },
        }
    }
}

/// `file_copy`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The file to copy: relative to /workspace or absolute under it.
    #[schemars(length(min = 1))]
    source: String,
    /// The path of the copy (a file path, not a directory).
    #[schemars(length(min = 1))]
    dest: String,
    /// Replace dest if it already exists. Default false: an existing dest is refused.
    overwrite: Option<bool>,
}

/// Why a copy was not made.
enum Refusal {
    /// dest exists and the call did not ask to overwrite it.
    Exists(String),
    /// The read-before-write guardrail (only for a tool without `content_from_source`).
    Guardrail(String),
}

#[async_trait]
impl Tool for FileCopy {
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
                let what = format!("copying to '{}'", shown_name(&args.dest));
                return too_late(&deadline, &what);
            }
            copy(&workspace, &reads, &capabilities, &args)
        })
        .await
        .unwrap_or_else(|output| output)
    }
}

fn copy(
    workspace: &Workspace,
    reads: &CallReads,
    capabilities: &[Capability],
    args: &Args,
) -> ToolOutput {
    let outcome = workspace.copy_file_if(
        &args.source,
        &args.dest,
        MAX_RECORDED_BYTES,
        |path, before| {
            if before.exists() && !args.overwrite.unwrap_or(false) {
                return Err(Refusal::Exists(format!(
                    "Cannot copy to '{}': it already exists{}. Set overwrite to true to \
                     replace it, or choose another dest.",
                    shown_name(path),
                    before
                        .size()
                        .map(|s| format!(" ({})", human_bytes(s)))
                        .unwrap_or_default()
                )));
            }
            read_before_write(capabilities, reads, path, before, Action::Write)
                .map_err(Refusal::Guardrail)
        },
    );
    let copied = match outcome {
        Ok(Ok(copied)) => copied,
        Ok(Err(Refusal::Exists(text))) => return ToolOutput::error(text),
        Ok(Err(Refusal::Guardrail(text))) => return ToolOutput::denied(text),
        Err(JailError::IsADirectory { path })
            if Workspace::display_path(&args.dest).is_ok_and(|d| d == path) =>
        {
            let path = shown_name(&path);
            return ToolOutput::error(format!(
                "'{path}' is a directory. dest must be the full path of the new file, like \
                 {path}/{}.",
                shown_name(args.source.rsplit('/').next().unwrap_or("name"))
            ));
        }
        Err(jail) => return jail_failure(&jail),
    };
    let Copied {
        source,
        written,
        kept,
    } = copied;
    // If the session had read the source as it was copied, it knows the copy's contents too.
    if reads.check(&source, &written.sha256) == WriteCheck::Allowed {
        reads.record(&written.path, &written.sha256);
    }
    let size = human_bytes(written.size);
    let (shown_source, shown_dest) = (shown_name(&source), shown_name(&written.path));
    if !written.changed {
        return ToolOutput::ok(format!(
            "{shown_dest} already holds exactly the contents of {shown_source} ({size}); nothing \
             was written."
        ));
    }
    let (change, how) = written_change(&written, Capability::ContentFromSource, kept);
    let message = format!("Copied {shown_source} ({size}) to {shown_dest} ({how}).");
    ToolOutput::ok(message).with_change(change)
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests build their fixtures on the host"
)]
mod tests {
    use serde_json::json;
    use std::sync::Arc;

    use super::*;

    fn session() -> (tempfile::TempDir, crate::ToolContext) {
        let dir = tempfile::tempdir().unwrap();
        let ctx = crate::ToolContext::new(
            uuid::Uuid::now_v7(),
            Arc::new(Workspace::open(dir.path()).unwrap()),
        );
        (dir, ctx)
    }

    #[tokio::test]
    async fn the_exemption_comes_from_the_declared_capability_not_the_name() {
        let (dir, ctx) = session();
        std::fs::write(dir.path().join("a.txt"), "new").unwrap();
        std::fs::write(dir.path().join("b.txt"), "unread").unwrap();
        let args = json!({"source": "a.txt", "dest": "b.txt", "overwrite": true});

        // Same name, same code, without the provenance claim: the guardrail applies.
        let mut tool = FileCopy::new();
        tool.spec
            .capabilities
            .retain(|c| *c != Capability::ContentFromSource);
        let out = tool.run(&ctx, args.clone()).await;
        assert_eq!(
            out.status,
            toolexec_core::CallStatus::Denied,
            "{}",
            out.content
        );
        assert!(out.content.contains("has not been read"), "{}", out.content);
        assert_eq!(std::fs::read(dir.path().join("b.txt")).unwrap(), b"unread");

        let out = FileCopy::new().run(&ctx, args).await;
        assert_eq!(out.status, toolexec_core::CallStatus::Ok, "{}", out.content);
        assert_eq!(std::fs::read(dir.path().join("b.txt")).unwrap(), b"new");
    }
}
