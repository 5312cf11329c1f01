//! `list_dir`: a directory's tree, a few levels deep, without following symlinks.
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use toolexec_core::{Capability, OutputLimit, ToolSpec, TruncationMode};

use super::{blocking, jail_failure};
use crate::text::{shown_name, shown_name_bytes};
use crate::walk::{Bounds, NOT_EXPANDED, Stop, WalkReport, bounded_entries};
use crate::{Tool, ToolContext, ToolOutput, parse_args};
use toolexec_workspace::jail::{Entry, EntryKind, JailError, Workspace, WorkspaceDir};

/// Deepest listing a call may ask for: deeper trees are better explored a directory at a time.
pub const MAX_DEPTH: u64 = 10;

/// Entries shown before the listing stops: about 40,000 characters at typical name lengths,
/// inside the tool's 50,000-character output limit.
pub const MAX_ENTRIES: usize = 1000;

/// Longest single-child chain folded into one entry (`a/b/c/…`); bounds the look-ahead below the
/// requested depth.
const MAX_CHAIN: usize = 32;

const DESCRIPTION: &str = "\
Lists a directory of the workspace as an indented tree. Directories end with `/`; symlinks are \
shown as `name -> target` and never followed.

Use it to get your bearings in a project or to see what a directory holds. To find files by name \
pattern across the tree use glob; to find files by content use grep.

`depth` is how many levels to show (default 1: only the directory's own entries; at most 10). A \
chain of directories that each contain only one directory is shown as one entry (`src/main/java/`). \
Dependency, build and VCS directories (.git, node_modules, target, .venv, __pycache__, dist, \
build) are listed but not expanded; list one by its path to see inside.

Example: {\"path\": \"src\", \"depth\": 2} lists src/ and the contents of each directory in it.

Limits: at most 1000 entries are shown; a note says when the listing stopped early (also at \
the call's time limit, or after reading the service's limit of directory entries). Paths are \
relative to /workspace or absolute under it.";

pub struct ListDir {
    spec: ToolSpec,
}

impl Default for ListDir {
    fn default() -> Self {
        Self::new()
    }
}

impl ListDir {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "list_dir".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: true,
                capabilities: vec![Capability::FsRead],
                output_limit: OutputLimit::new(50_000, TruncationMode::HeadTail),
            },
        }
    }
}

/// `list_dir`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The directory to list: relative to /workspace or absolute under it. Default: the workspace root.
    #[schemars(length(min = 1))]
    path: Option<String>,
    /// How many levels to show. Default 1.
    #[schemars(range(min = 1, max = MAX_DEPTH))]
    depth: Option<u64>,
}

#[async_trait]
impl Tool for ListDir {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn run(&self, ctx: &ToolContext, args: serde_json::Value) -> ToolOutput {
        let args: Args = match parse_args(args) {
            Ok(args) => args,
            Err(output) => return output,
        };
        let path = args.path.unwrap_or_else(|| ".".to_owned());
        let depth = args.depth.unwrap_or(1).clamp(1, MAX_DEPTH) as usize;
        let workspace = ctx.workspace.clone();
        let bounds = Bounds::of(ctx);
        match blocking(move || list_within(&workspace, &path, depth, bounds)).await {
            Ok(Ok((text, Some(Stop::Time)))) => ToolOutput::timed_out(text),
            Ok(Ok((text, _))) => ToolOutput::ok(text),
            Ok(Err(jail)) => jail_failure(&jail),
            Err(output) => output,
        }
    }
}

#[cfg(test)]
fn list(workspace: &Workspace, path: &str, depth: usize) -> Result<String, JailError> {
    list_within(workspace, path, depth, Bounds::unlimited()).map(|(text, _)| text)
}

/// The listing, and where it stopped early if a bound (entries read, the deadline) cut it.
pub(crate) fn list_within(
    workspace: &Workspace,
    path: &str,
    depth: usize,
    bounds: Bounds,
) -> Result<(String, Option<Stop>), JailError> {
    let root = workspace.open_dir(path)?;
    let mut listing = Listing {
        bounds,
        ..Listing::default()
    };
    // The root must be listable (an error says why); its entries count like any others.
    let (entries, complete) = root.entries_up_to(listing.bounds.max_entries)?;
    listing.read.entries += entries.len();
    if !complete {
        listing.read.stop(Stop::Entries);
    }
    let header = if root.path() == "." {
        "./".to_owned()
    } else {
        format!("{}/", shown_name(root.path()))
    };
    listing.out.push_str(&header);
    listing.out.push('\n');
    if entries.is_empty() {
        listing.out.push_str("  (empty directory)\n");
    }
    listing.walk(&root, entries, depth, 1);
    let stopped = listing.read.stopped;
    Ok((listing.finish(depth), stopped))
}

#[derive(Default)]
struct Listing {
    out: String,
    shown: usize,
    stopped: bool,
    collapsed: bool,
    not_expanded: bool,
    depth_reached: bool,
    bounds: Bounds,
    /// Entries read and where a bound stopped the listing.
    read: WalkReport,
}

impl Listing {
    fn walk(&mut self, dir: &WorkspaceDir, entries: Vec<Entry>, depth_left: usize, level: usize) {
        for entry in entries {
            if self.shown >= MAX_ENTRIES {
                self.stopped = true;
                return;
            }
            // Past the entry limit the entries already read are still shown (no directory is
            // read further); past the deadline nothing more is.
            if self.bounds.deadline.expired() {
                self.read.stop(Stop::Time);
                return;
            }
            self.shown += 1;
            let indent = "  ".repeat(level);
            // Names and link targets come from whoever made the files: escaped, so that one
            // entry prints as one line (see `shown_name`).
            let name = shown_name_bytes(entry.name_bytes());
            match entry.kind {
                EntryKind::File => self.line(&indent, &name, ""),
                EntryKind::Other => self.line(&indent, &name, "  [special file]"),
                EntryKind::Symlink => {
                    let target = dir.read_link(&entry).unwrap_or_else(|| "?".to_owned());
                    self.line(&indent, &name, &format!(" -> {}", shown_name(&target)));
                }
                EntryKind::Dir if NOT_EXPANDED.contains(&entry.name.as_str()) => {
                    self.not_expanded = true;
                    self.line(&indent, &format!("{name}/"), "  [not expanded]");
                }
                EntryKind::Dir => self.directory(dir, &entry, &indent, depth_left, level),
            }
        }
    }

    fn directory(
        &mut self,
        parent: &WorkspaceDir,
        entry: &Entry,
        indent: &str,
        depth_left: usize,
        level: usize,
    ) {
        let mut label = shown_name_bytes(entry.name_bytes()).into_owned();
        let Ok(mut dir) = parent.open_child(entry) else {
            self.line(indent, &format!("{label}/"), "  [cannot be opened]");
            return;
        };
        // Two entries tell whether a directory is empty or a link in a chain; only a directory
        // that is expanded is read further. (A directory of a million files below the depth
        // asked for costs two entries, not a million.)
        let Ok((mut peek, mut complete)) = dir.entries_up_to(2) else {
            self.line(indent, &format!("{label}/"), "  [cannot be read]");
            return;
        };
        self.read.entries += peek.len();
        // Fold a chain of single-directory directories into one entry, looking past the
        // requested depth: `src/main/java/com/example/` is one place, not five.
        for _ in 0..MAX_CHAIN {
            let [only] = peek.as_slice() else { break };
            if only.kind != EntryKind::Dir || NOT_EXPANDED.contains(&only.name.as_str()) {
                break;
            }
            let Ok(child) = dir.open_child(only) else {
                break;
            };
            let Ok((child_peek, child_complete)) = child.entries_up_to(2) else {
                break;
            };
            self.read.entries += child_peek.len();
            label = format!("{label}/{}", shown_name_bytes(only.name_bytes()));
            dir = child;
            peek = child_peek;
            complete = child_complete;
            self.collapsed = true;
        }
        self.line(indent, &format!("{label}/"), "");
        if depth_left > 1 {
            let entries = if complete {
                peek
            } else {
                match bounded_entries(&dir, &self.bounds, &mut self.read) {
                    Some(entries) => entries,
                    None => return,
                }
            };
            self.walk(&dir, entries, depth_left - 1, level + 1);
        } else if !peek.is_empty() {
            self.depth_reached = true;
        }
    }

    fn line(&mut self, indent: &str, name: &str, suffix: &str) {
        self.out.push_str(indent);
        self.out.push_str(name);
        self.out.push_str(suffix);
        self.out.push('\n');
    }

    fn finish(mut self, depth: usize) -> String {
        let mut notes = Vec::new();
        if let Some(stop) = self.read.stopped {
            notes.push(format!(
                "{} List a subdirectory, or use a smaller depth, to see the rest.",
                stop.sentence("listing", &self.bounds, &self.read)
            ));
        }
        if self.stopped {
            notes.push(format!(
                "The listing stopped after {MAX_ENTRIES} entries. List a subdirectory, or use a \
                 smaller depth, to see the rest."
            ));
        }
        if self.collapsed {
            notes.push(
                "An entry like a/b/c/ is a chain of directories that each contain only the next \
                 one."
                    .to_owned(),
            );
        }
        if self.not_expanded {
            notes.push(
                "Directories marked [not expanded] hold dependencies, build output or VCS data; \
                 call list_dir with one's path to see inside."
                    .to_owned(),
            );
        }
        if self.depth_reached && !self.stopped && self.read.stopped.is_none() {
            notes.push(format!(
                "Directories deeper than depth {depth} are not expanded; call list_dir with a \
                 larger depth or on a subdirectory."
            ));
        }
        if !notes.is_empty() {
            self.out.push('\n');
            self.out.push_str(&notes.join("\n"));
            self.out.push('\n');
        }
        self.out
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests build their fixtures on the host"
)]
mod tests {
    use std::fs;

    use super::*;

    fn tree(files: &[&str]) -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        for file in files {
            let path = dir.path().join(file);
            if file.ends_with('/') {
                fs::create_dir_all(path).unwrap();
            } else {
                fs::create_dir_all(path.parent().unwrap()).unwrap();
                fs::write(path, "x").unwrap();
            }
        }
        let ws = Workspace::open(dir.path()).unwrap();
        (dir, ws)
    }

    #[test]
    fn directories_end_with_a_slash_and_entries_are_sorted() {
        let (_dir, ws) = tree(&["b.txt", "a/x", "a/y", "c/"]);
        let text = list(&ws, ".", 1).unwrap();
        assert!(text.starts_with("./\n  a/\n  b.txt\n  c/\n"), "{text}");
        assert!(text.contains("deeper than depth 1"), "{text}");
    }

    #[test]
    fn single_child_chains_collapse_into_one_entry() {
        let (_dir, ws) = tree(&[
            "src/main/java/App.java",
            "src/main/java/Util.java",
            "README",
        ]);
        let text = list(&ws, ".", 2).unwrap();
        assert!(
            text.starts_with("./\n  README\n  src/main/java/\n    App.java\n    Util.java\n"),
            "{text}"
        );
        assert!(text.contains("chain of directories"), "{text}");
    }

    #[test]
    fn dependency_directories_are_listed_but_not_expanded() {
        let (_dir, ws) = tree(&["node_modules/left-pad/index.js", "src/a.js"]);
        let text = list(&ws, ".", 3).unwrap();
        assert!(text.contains("  node_modules/  [not expanded]\n"), "{text}");
        assert!(!text.contains("left-pad"), "{text}");
        let inside = list(&ws, "node_modules", 1).unwrap();
        assert!(inside.contains("left-pad/"), "{inside}");
    }

    #[test]
    fn symlinks_are_shown_and_not_followed() {
        let (dir, ws) = tree(&["real/inner.txt"]);
        std::os::unix::fs::symlink("real", dir.path().join("alias")).unwrap();
        let text = list(&ws, ".", 3).unwrap();
        assert!(text.contains("  alias -> real\n"), "{text}");
        assert_eq!(text.matches("inner.txt").count(), 1, "{text}");
    }

    #[test]
    fn an_empty_directory_says_so() {
        let (_dir, ws) = tree(&["empty/"]);
        assert_eq!(
            list(&ws, "empty", 1).unwrap(),
            "empty/\n  (empty directory)\n"
        );
    }

    #[test]
    fn a_big_directory_stops_at_the_entry_cap_with_a_note() {
        let names: Vec<String> = (0..MAX_ENTRIES + 5).map(|n| format!("f{n:05}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let (_dir, ws) = tree(&refs);
        let text = list(&ws, ".", 1).unwrap();
        assert_eq!(
            text.lines().filter(|l| l.starts_with("  f")).count(),
            MAX_ENTRIES
        );
        assert!(text.contains("stopped after 1000 entries"), "{text}");
    }

    #[test]
    fn names_print_as_one_line_each_with_controls_and_bad_bytes_escaped() {
        use std::os::unix::ffi::OsStrExt;
        let (dir, ws) = tree(&[
            "a\n  forged.txt",
            "\u{1b}[31mred",
            "evil\u{202e}txt.exe",
            "d/",
        ]);
        for raw in [&b"bad\xff"[..], b"bad\xfe"] {
            fs::write(dir.path().join(std::ffi::OsStr::from_bytes(raw)), "x").unwrap();
        }
        std::os::unix::fs::symlink("t\narget", dir.path().join("link")).unwrap();
        fs::write(dir.path().join("d/in\rside"), "x").unwrap();
        let text = list(&ws, ".", 2).unwrap();
        assert!(text.contains("\n  a\\n  forged.txt\n"), "{text}");
        assert!(!text.contains("\n  forged.txt"), "{text}");
        assert!(text.contains("\n  \\x1b[31mred\n"), "{text}");
        assert!(text.contains("\n  evil\\u{202e}txt.exe\n"), "{text}");
        assert!(text.contains("\n  bad\\xfe\n  bad\\xff\n"), "{text}");
        assert!(text.contains("\n  link -> t\\narget\n"), "{text}");
        assert!(text.contains("\n  d/\n    in\\rside\n"), "{text}");
        assert!(!text.contains(['\u{1b}', '\r', '\u{202e}']), "{text}");
        // Seven entries (and the d/ chain), each on its own line under the header.
        assert_eq!(
            text.lines().take_while(|l| !l.is_empty()).count(),
            9,
            "{text}"
        );
    }

    #[test]
    fn listing_a_file_is_refused() {
        let (_dir, ws) = tree(&["a.txt"]);
        assert!(matches!(
            list(&ws, "a.txt", 1),
            Err(JailError::NotADirectory { .. })
        ));
    }
}
