//! What a tool declares about itself: its manual for the model, its argument schema, whether it
//! only reads, the capabilities it may use, and how its output is cut for the model.
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A capability a tool may exercise. Recorded on every invocation; policy decisions (such as the
/// read-before-write exemption) are made from these, never from a tool's name.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema,
)]
pub enum Capability {
    #[serde(rename = "fs.read")]
    FsRead,
    #[serde(rename = "fs.write")]
    FsWrite,
    #[serde(rename = "process")]
    Process,
    #[serde(rename = "network")]
    Network,
    /// Copies bytes the model never saw; exempt from read-before-write.
    #[serde(rename = "content_from_source")]
    ContentFromSource,
}

impl Capability {
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::FsRead => "fs.read",
            Capability::FsWrite => "fs.write",
            Capability::Process => "process",
            Capability::Network => "network",
            Capability::ContentFromSource => "content_from_source",
        }
    }
}

/// Which part of an over-long output the model sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TruncationMode {
    /// Keep the beginning.
    Head,
    /// Keep the end (search results and edit summaries: the latest lines matter most).
    Tail,
    /// Keep the beginning and the end, cut the middle.
    HeadTail,
}

/// The per-tool output limit, in characters (Unicode scalar values), and the truncation mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OutputLimit {
    pub max_chars: usize,
    pub mode: TruncationMode,
}

impl OutputLimit {
    pub const fn new(max_chars: usize, mode: TruncationMode) -> Self {
        Self { max_chars, mode }
    }
}

/// A tool as the catalog shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ToolSpec {
    pub name: String,
    /// The tool's manual for the model: when to use it, when not, an example, its limits.
    pub description: String,
    /// JSON Schema (draft 2020-12) of the `arguments` object.
    #[schema(value_type = Object)]
    pub input_schema: serde_json::Value,
    /// Read-only tools of a batch run concurrently; the others run alone and in order.
    pub read_only: bool,
    pub capabilities: Vec<Capability>,
    pub output_limit: OutputLimit,
}

impl ToolSpec {
    pub fn has(&self, cap: Capability) -> bool {
        self.capabilities.contains(&cap)
    }
}
