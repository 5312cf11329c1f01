//! `read_many_files`: several files in one call, each shown exactly as read_file shows it.
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::json;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};

use super::blocking;
use super::read_file::{Window, read_and_render};
use crate::{Tool, ToolContext, ToolOutput, parse_args};

/// Files one call may name: enough for a module and its tests, few enough that the 50,000-
/// character output is not mostly truncation markers.
pub const MAX_PATHS: u64 = 50;

const DESCRIPTION: &str = "\
Reads several text files in one call. Each file is shown as read_file shows it (numbered lines, \
the first 2000 of each), after a header line `=== path ===`.

Use it when you already know you need several files: a module and its tests, a set of configs. \
For one file, or to page through a long one with offset and limit, use read_file; to find files \
use glob or grep.

Each file shown counts as read for read-before-write, exactly as with read_file. A file that \
cannot be shown (missing, binary, outside the workspace, too large) gets its error under its \
header and the others are still read; the call fails only if no file could be shown.

Example: {\"paths\": [\"src/lib.rs\", \"src/parser.rs\", \"tests/parser.rs\"]}

Limits: at most 50 paths; per file, the first 2000 lines, lines cut at 2000 characters, files over \
10 MiB refused. The whole output is capped at 50,000 characters (the middle is cut).";

pub struct ReadManyFiles {
    spec: ToolSpec,
}

impl Default for ReadManyFiles {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadManyFiles {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "read_many_files".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "paths": {
                            "type": "array",
                            "items": {"type": "string", "minLength": 1},
                            "minItems": 1,
                            "maxItems": MAX_PATHS,
                            "description": "The files to read: each relative to /workspace or absolute under it."
                        }
                    },
                    "required": ["paths"],
                    "additionalProperties": false
                }),
                read_only: true,
                capabilities: vec![Capability::FsRead],
                output_limit: OutputLimit::new(50_000, TruncationMode::HeadTail),
            },
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    paths: Vec<String>,
}

#[async_trait]
impl Tool for ReadManyFiles {
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
        let outcome = blocking(move || {
            let mut out = String::new();
            let mut shown = 0;
            for path in &args.paths {
                if !out.is_empty() {
                    out.push('\n');
                }
                match read_and_render(&workspace, &reads, path, Window::default_lines()) {
                    Ok(file) => {
                        shown += 1;
                        out.push_str(&format!("=== {} ===\n{}", file.path, file.text));
                    }
                    Err(failure) => {
                        out.push_str(&format!("=== {path} ===\n{}\n", failure.content));
                    }
                }
                if !out.ends_with('\n') {
                    out.push('\n');
                }
            }
            (out, shown)
        })
        .await;
        match outcome {
            Ok((out, 0)) => ToolOutput::error(out),
            Ok((out, _)) => ToolOutput::ok(out),
            Err(output) => output,
        }
    }
}
