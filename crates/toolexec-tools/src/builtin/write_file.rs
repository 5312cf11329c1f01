//! `write_file`: create a file or replace one the session has read.
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};

use super::{Action, blocking, jail_failure, read_before_write, too_late, written_change};
use crate::text::{plural, shown_name};
use crate::{Tool, ToolContext, ToolOutput, parse_args};

const DESCRIPTION: &str = "\
Writes a file in the workspace: creates it (and any missing parent directories) or replaces its \
whole contents.

Use it to create a new file, or to rewrite a file completely. To change part of an existing file, \
prefer edit_file (or apply_patch): it sends only the change, and cannot drop lines by accident.

Read-before-write: replacing an existing file requires that this session has read it with \
read_file (or seen it in grep results) and that it has not changed since; otherwise the call is \
refused and nothing is written. Read the file, then write again. New files are always allowed.

Paths are relative to /workspace (src/main.rs) or absolute under it (/workspace/src/main.rs); \
anything outside the workspace is refused, and so is writing to a symlink.

Example: {\"file_path\": \"src/util/strings.rs\", \"content\": \"pub fn shout(s: &str) -> String {\\n    s.to_uppercase()\\n}\\n\"} \
creates src/util/ if needed and writes the file.

Limits: `content` is written exactly as given (UTF-8, no newline added). The file is replaced \
atomically: readers see the old or the new contents, never a mix. An existing file keeps its \
permission bits.";

pub struct WriteFile {
    spec: ToolSpec,
}

impl Default for WriteFile {
    fn default() -> Self {
        Self::new()
    }
}

impl WriteFile {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "write_file".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: false,
                capabilities: vec![Capability::FsWrite],
                output_limit: OutputLimit::new(1_000, TruncationMode::Tail),
            },
        }
    }
}

/// `write_file`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The file to write: relative to /workspace (src/main.rs) or absolute under it (/workspace/src/main.rs).
    #[schemars(length(min = 1))]
    file_path: String,
    /// The complete new contents of the file.
    content: String,
}

#[async_trait]
impl Tool for WriteFile {
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
        let Args { file_path, content } = args;
        let outcome = blocking(move || {
            if !deadline.commit_change() {
                let what = format!("writing '{}'", shown_name(&file_path));
                return Err(too_late(&deadline, &what));
            }
            let written = workspace.write_if(&file_path, content.as_bytes(), |path, before| {
                read_before_write(&capabilities, &reads, path, before, Action::Write)
            });
            Ok((written, content))
        })
        .await;
        let (written, content) = match outcome {
            Ok(Ok(pair)) => pair,
            Ok(Err(output)) | Err(output) => return output,
        };
        let written = match written {
            Err(jail) => return jail_failure(&jail),
            Ok(Err(refusal)) => return ToolOutput::denied(refusal),
            Ok(Ok(written)) => written,
        };
        // The session wrote these bytes, so it knows the file as it is now.
        ctx.reads.record(&written.path, &written.sha256);

        let lines = plural(content.lines().count(), "line", "lines");
        let size = plural(content.len(), "byte", "bytes");
        if !written.changed {
            return ToolOutput::ok(format!(
                "{} already holds exactly this content ({lines}, {size}); nothing was written.",
                shown_name(&written.path)
            ));
        }
        let (change, how) =
            written_change(&written, Capability::FsWrite, Some(content.into_bytes()));
        ToolOutput::ok(format!(
            "Wrote {lines} ({size}) to {} ({how}).",
            shown_name(&written.path)
        ))
        .with_change(change)
    }
}
