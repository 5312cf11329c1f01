//! `read_output`: pages through the full, untruncated output of an earlier call of the same
//! session, as recorded.
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{OutputLimit, ToolSpec, TruncationMode};
use uuid::Uuid;

use crate::{Tool, ToolContext, ToolOutput, parse_args};

/// Default and largest page, in characters: with the header and footer a page stays under the
/// tool's own 50,000-character output limit, so a page is never cut again.
pub const DEFAULT_PAGE_CHARS: usize = 40_000;
pub const MAX_PAGE_CHARS: usize = 45_000;

const DESCRIPTION: &str = "\
Reads the full output of an earlier call of this session, a page at a time. When a result was too \
long, you were shown its beginning and end with a marker like \"[… N characters cut here — call \
read_output with invocation_id \\\"…\\\" …]\"; this tool returns the part that was cut.

Use it when the part you need was cut from a long result. Do not use it to re-read a file (use \
read_file with offset/limit) or to repeat a search (narrow the search instead).

`offset` is the first character to return (default 0); `limit` how many (default 40000, at most \
45000). The answer says which characters it holds and the offset to continue from.

Example: {\"invocation_id\": \"0190f5c2-…\", \"offset\": 40000}

Limits: only invocations of this session; outputs are as recorded, not re-run. An output over the \
service's limit for a recorded output (4 MiB by default) is kept as its beginning and end, with a \
marker where the middle was dropped; the answer says so.";

pub struct ReadOutput {
    spec: ToolSpec,
}

impl Default for ReadOutput {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadOutput {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "read_output".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: true,
                capabilities: vec![],
                output_limit: OutputLimit::new(50_000, TruncationMode::HeadTail),
            },
        }
    }
}

/// `read_output`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The invocation whose output to read (from the truncation marker).
    #[schemars(regex(pattern = "^[0-9a-fA-F-]{32,36}$"))]
    invocation_id: Uuid,
    /// First character to return. Default 0.
    #[schemars(range(min = 0))]
    offset: Option<usize>,
    /// Characters to return. Default 40000.
    #[schemars(range(min = 1, max = MAX_PAGE_CHARS))]
    limit: Option<usize>,
}

#[async_trait]
impl Tool for ReadOutput {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(out) => return out,
        };
        let recorded = match ctx.outputs.output(ctx.session_id, args.invocation_id).await {
            Ok(recorded) => recorded,
            Err(message) => return ToolOutput::error(message),
        };
        let full = recorded.text;
        let total = full.chars().count();
        let offset = args.offset.unwrap_or(0);
        let limit = args
            .limit
            .unwrap_or(DEFAULT_PAGE_CHARS)
            .clamp(1, MAX_PAGE_CHARS);
        if offset >= total && total > 0 {
            return ToolOutput::error(format!(
                "offset {offset} is past the end: the output has {total} characters. Use an offset below {total}."
            ));
        }
        let page: String = full.chars().skip(offset).take(limit).collect();
        let end = offset + page.chars().count();
        let mut text = format!(
            "Output of invocation {}: characters {offset}–{end} of {total}.\n",
            args.invocation_id
        );
        if recorded.output_chars > total {
            text.push_str(&format!(
                "(The output had {} characters; the service recorded only its beginning and its \
                 end, {total} characters with a marker where the middle was dropped. To see the \
                 middle, run a narrower call: read_file with offset and limit, a more specific \
                 grep, or a command that prints less.)\n",
                recorded.output_chars
            ));
        }
        text.push_str(&page);
        if end < total {
            text.push_str(&format!(
                "\n[{} more characters; call read_output with offset={end} to continue]",
                total - end
            ));
        }
        ToolOutput::ok(text)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use std::sync::Arc;

    use super::*;
    use crate::{OutputSource, Workspace};

    struct Fixed(Uuid, String, Option<i64>);

    #[async_trait]
    impl OutputSource for Fixed {
        async fn output(&self, _: Uuid, id: Uuid) -> Result<crate::RecordedOutput, String> {
            if id == self.0 {
                Ok(crate::RecordedOutput::new(self.1.clone(), self.2))
            } else {
                Err("not in this session".into())
            }
        }
    }

    #[tokio::test]
    async fn pages_say_where_they_are_and_how_to_continue() {
        let dir = tempfile::tempdir().unwrap();
        let id = Uuid::now_v7();
        let mut ctx = ToolContext::new(
            Uuid::now_v7(),
            Arc::new(Workspace::open(dir.path()).unwrap()),
        );
        ctx.outputs = Arc::new(Fixed(id, "0123456789".into(), None));
        let out = ReadOutput::new()
            .run(
                &ctx,
                json!({"invocation_id": id.to_string(), "offset": 2, "limit": 3}),
            )
            .await;
        assert_eq!(out.status, toolexec_core::CallStatus::Ok);
        assert!(out.content.contains("characters 2–5 of 10"));
        assert!(out.content.contains("\n234\n"));
        assert!(out.content.contains("offset=5"));
        let past = ReadOutput::new()
            .run(&ctx, json!({"invocation_id": id.to_string(), "offset": 10}))
            .await;
        assert!(past.status.is_error());
        let other = ReadOutput::new()
            .run(&ctx, json!({"invocation_id": Uuid::now_v7().to_string()}))
            .await;
        assert!(other.status.is_error());
        assert!(other.content.contains("not in this session"));
    }

    #[tokio::test]
    async fn an_output_recorded_as_head_and_tail_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let id = Uuid::now_v7();
        let mut ctx = ToolContext::new(
            Uuid::now_v7(),
            Arc::new(Workspace::open(dir.path()).unwrap()),
        );
        ctx.outputs = Arc::new(Fixed(id, "head[… dropped …]tail".into(), Some(9_000_000)));
        let out = ReadOutput::new()
            .run(&ctx, json!({"invocation_id": id.to_string()}))
            .await;
        assert!(
            out.content
                .contains("The output had 9000000 characters; the service recorded only its beginning and its end"),
            "{}",
            out.content
        );
    }
}
