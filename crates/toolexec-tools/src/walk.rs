//! The tree walk grep and glob share: regular files under a directory, in path order, with
//! `.gitignore` rules and the default exclusions applied, never leaving the workspace.
//!
//! The walk does not hand host paths to a walker library. It starts from a directory opened
//! through the jail and descends only with [`WorkspaceDir::open_child`], which opens one real
//! directory relative to its parent's descriptor with symlinks refused: a symlink (to a file or a
//! directory, inside or out) is never followed, and a directory swapped for a symlink in the
//! middle of the walk cannot lead it out. File contents are read the same way
//! ([`WorkspaceDir::read_child`]). The `ignore` crate is used only for its `.gitignore` matcher,
//! fed with `.gitignore` files read through the jail.
//!
//! `.gitignore` files apply wherever they are found between the workspace root and the files
//! (whether or not the workspace is a git repository): deeper files take precedence, `!`
//! re-includes, and an ignored directory is not entered. The start directory itself is never
//! ignored, so searching an ignored directory by its path works.
//!
//! A walk is bounded ([`Bounds`]): it reads at most `max_entries` directory entries (of every
//! kind, ignored ones too: each costs a `getdents` slot, a possible `statat` and memory), stops
//! at the call's deadline, and compiles at most [`MAX_GITIGNORE_RULES`] rules of each
//! `.gitignore` (the matcher's build time grows faster than its rule count, and the file is
//! whatever the workspace holds). Where it stopped is in the [`WalkReport`], for the note that
//! tells the model its result is partial and how to narrow it.
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::rc::Rc;

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::deadline::{Deadline, human_duration};
use toolexec_workspace::jail::{Entry, EntryKind, VIRTUAL_ROOT, Workspace, WorkspaceDir};

/// Dependencies, build output and VCS internals, which bury the project's own files: searches
/// skip them unless they start inside one, and list_dir lists them without expanding them
/// unless asked for one (SPEC §5).
pub const NOT_EXPANDED: [&str; 7] = [
    ".git",
    "node_modules",
    "target",
    ".venv",
    "__pycache__",
    "dist",
    "build",
];

/// Deepest directory nesting walked; also bounds the open directory descriptors (one per level).
pub(crate) const MAX_WALK_DEPTH: usize = 64;

/// Rules compiled from one `.gitignore`; the rest of the file is not applied (and a note says
/// so). Real ones have tens to hundreds of rules. Compiling is one call that cannot look at the
/// deadline, and its cost grows faster than the rule count: rules like `d1/**/x1*.log` took
/// 2.3 s for 1,000, 26 s for 10,000 and 400 s for 100,000 in a debug build.
pub(crate) const MAX_GITIGNORE_RULES: usize = 1_000;

/// What bounds one walk (or listing): directory entries read, and the call's deadline.
#[derive(Debug, Clone)]
pub(crate) struct Bounds {
    pub max_entries: usize,
    pub deadline: Deadline,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            max_entries: crate::DEFAULT_MAX_WALK_ENTRIES,
            deadline: Deadline::none(),
        }
    }
}

impl Bounds {
    pub(crate) fn of(ctx: &crate::ToolContext) -> Self {
        Self {
            max_entries: ctx.max_walk_entries,
            deadline: ctx.deadline.clone(),
        }
    }

    /// Without limits, for tests.
    #[cfg(test)]
    pub(crate) fn unlimited() -> Self {
        Self {
            max_entries: usize::MAX,
            deadline: Deadline::none(),
        }
    }
}

/// Why a walk stopped before it had seen everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// It read `Bounds::max_entries` directory entries.
    Entries,
    /// The call's deadline passed.
    Time,
}

impl Stop {
    /// The sentence that says where the walk stopped, without the advice (which depends on the
    /// tool): "The search stopped after reading 200000 directory entries (the limit for one
    /// call), so the results are partial."
    pub(crate) fn sentence(self, what: &str, bounds: &Bounds, report: &WalkReport) -> String {
        match self {
            Stop::Entries => format!(
                "The {what} stopped after reading {} directory entries (the limit for one call), \
                 so the results are partial.",
                report.entries
            ),
            Stop::Time => format!(
                "The {what} stopped at the time limit of {} for one call, after reading {} \
                 directory entries, so the results are partial.",
                bounds
                    .deadline
                    .budget()
                    .map_or_else(|| "this call".to_owned(), human_duration),
                report.entries
            ),
        }
    }
}

/// Whether a visit wants more files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    Continue,
    Stop,
}

/// What the walk passed over, for the notes under a result.
#[derive(Debug, Default)]
pub(crate) struct WalkReport {
    /// Regular files offered to the visitor.
    pub files: usize,
    /// Directory entries read (every kind).
    pub entries: usize,
    /// Excluded directories that were skipped (workspace-relative paths).
    pub skipped_dirs: BTreeSet<String>,
    /// Files and directories left out by `.gitignore` rules.
    pub ignored: usize,
    /// Where the walk stopped early, if it did.
    pub stopped: Option<Stop>,
    /// Directories below [`MAX_WALK_DEPTH`] were not entered.
    pub too_deep: bool,
    /// `.gitignore` files of which only the first [`MAX_GITIGNORE_RULES`] rules apply.
    pub long_gitignores: BTreeSet<String>,
}

impl WalkReport {
    /// Notes where the walk stopped, the first time.
    pub(crate) fn stop(&mut self, why: Stop) {
        self.stopped.get_or_insert(why);
    }
}

/// One level of `.gitignore` rules and the levels above it.
struct Rules {
    matcher: Gitignore,
    parent: Option<Rc<Rules>>,
}

fn ignored(rules: Option<&Rc<Rules>>, path: &str, is_dir: bool) -> bool {
    let candidate = virtual_path(path);
    let mut current = rules;
    while let Some(level) = current {
        match level.matcher.matched(&candidate, is_dir) {
            Match::Ignore(_) => return true,
            Match::Whitelist(_) => return false,
            Match::None => current = level.parent.as_ref(),
        }
    }
    false
}

/// Paths are matched as `/workspace/<path>`, so every `.gitignore` has an absolute root to
/// strip, and `.`-prefixed names are never mistaken for relative markers.
fn virtual_path(path: &str) -> PathBuf {
    if path == "." {
        PathBuf::from(VIRTUAL_ROOT)
    } else {
        PathBuf::from(format!("{VIRTUAL_ROOT}/{path}"))
    }
}

/// The rules of one `.gitignore` (lines git would reject are skipped, as git skips them), at
/// most [`MAX_GITIGNORE_RULES`] of them; `report` learns of a file that had more.
fn parse_gitignore(
    dir: &str,
    contents: &[u8],
    parent: Option<Rc<Rules>>,
    report: &mut WalkReport,
) -> Option<Rc<Rules>> {
    let mut builder = GitignoreBuilder::new(virtual_path(dir));
    let mut rules = 0;
    for line in String::from_utf8_lossy(contents).lines() {
        let rule = line.trim();
        if rule.is_empty() || rule.starts_with('#') {
            continue;
        }
        if rules == MAX_GITIGNORE_RULES {
            report.long_gitignores.insert(if dir == "." {
                ".gitignore".to_owned()
            } else {
                format!("{dir}/.gitignore")
            });
            break;
        }
        rules += 1;
        let _ = builder.add_line(None, line);
    }
    match builder.build() {
        Ok(matcher) if !matcher.is_empty() => Some(Rc::new(Rules { matcher, parent })),
        _ => parent,
    }
}

/// Whether the exclusions apply: not when the search was asked for inside an excluded directory.
pub(crate) fn exclusions_apply(start: &str) -> bool {
    !start.split('/').any(|c| NOT_EXPANDED.contains(&c))
}

struct Frame {
    dir: WorkspaceDir,
    entries: std::vec::IntoIter<Entry>,
    rules: Option<Rc<Rules>>,
    depth: usize,
}

/// A directory's entries as far as the entry budget allows (`None` when it is used up).
pub(crate) fn bounded_entries(
    dir: &WorkspaceDir,
    bounds: &Bounds,
    report: &mut WalkReport,
) -> Option<Vec<Entry>> {
    let left = bounds.max_entries.saturating_sub(report.entries);
    if left == 0 {
        report.stop(Stop::Entries);
        return None;
    }
    // An unreadable directory (permissions, removed meanwhile) is passed over.
    let (entries, complete) = dir.entries_up_to(left).unwrap_or_default();
    report.entries += entries.len();
    if !complete {
        report.stop(Stop::Entries);
    }
    Some(entries)
}

fn frame(
    dir: WorkspaceDir,
    inherited: Option<Rc<Rules>>,
    depth: usize,
    bounds: &Bounds,
    report: &mut WalkReport,
) -> Frame {
    let entries = bounded_entries(&dir, bounds, report).unwrap_or_default();
    let mut rules = inherited;
    if let Some(gitignore) = entries
        .iter()
        .find(|e| e.name == ".gitignore" && e.kind == EntryKind::File)
        && let Ok(file) = dir.read_child(gitignore)
    {
        rules = parse_gitignore(dir.path(), &file.bytes, rules, report);
    }
    Frame {
        dir,
        entries: entries.into_iter(),
        rules,
        depth,
    }
}

/// The `.gitignore` rules of the directories above `start` (from the workspace root down).
fn inherited_rules(ws: &Workspace, start: &str, report: &mut WalkReport) -> Option<Rc<Rules>> {
    if start == "." {
        return None;
    }
    let mut rules = None;
    let mut dir = ".".to_owned();
    let components: Vec<&str> = start.split('/').collect();
    for component in components {
        let gitignore = if dir == "." {
            ".gitignore".to_owned()
        } else {
            format!("{dir}/.gitignore")
        };
        if let Ok(file) = ws.read(&gitignore) {
            rules = parse_gitignore(&dir, &file.bytes, rules, report);
        }
        dir = if dir == "." {
            component.to_owned()
        } else {
            format!("{dir}/{component}")
        };
    }
    rules
}

/// Calls `visit` with every regular file under `start` in path order (entries sorted by name,
/// depth first), with its directory, entry and workspace-relative path, until it says stop or
/// a bound is reached (`report.stopped` says which).
pub(crate) fn walk_files(
    ws: &Workspace,
    start: WorkspaceDir,
    bounds: &Bounds,
    visit: &mut dyn FnMut(&WorkspaceDir, &Entry, &str) -> Flow,
) -> WalkReport {
    let mut report = WalkReport::default();
    let skip_excluded = exclusions_apply(start.path());
    let inherited = inherited_rules(ws, start.path(), &mut report);
    let first = frame(start, inherited, 0, bounds, &mut report);
    let mut stack = vec![first];
    while let Some(top) = stack.last_mut() {
        // One clock read per entry: a walk notices its deadline within microseconds of work.
        if bounds.deadline.expired() {
            report.stop(Stop::Time);
            break;
        }
        let Some(entry) = top.entries.next() else {
            stack.pop();
            continue;
        };
        let path = top.dir.path_of(&entry);
        match entry.kind {
            EntryKind::Dir => {
                if skip_excluded && NOT_EXPANDED.contains(&entry.name.as_str()) {
                    report.skipped_dirs.insert(path);
                    continue;
                }
                if ignored(top.rules.as_ref(), &path, true) {
                    report.ignored += 1;
                    continue;
                }
                if top.depth + 1 > MAX_WALK_DEPTH {
                    report.too_deep = true;
                    continue;
                }
                if report.entries >= bounds.max_entries {
                    report.stop(Stop::Entries);
                    continue;
                }
                // A directory that cannot be opened (permissions, or swapped for a symlink
                // since it was listed) is passed over.
                if let Ok(child) = top.dir.open_child(&entry) {
                    let rules = top.rules.clone();
                    let depth = top.depth + 1;
                    let next = frame(child, rules, depth, bounds, &mut report);
                    stack.push(next);
                }
            }
            EntryKind::File => {
                if ignored(top.rules.as_ref(), &path, false) {
                    report.ignored += 1;
                    continue;
                }
                report.files += 1;
                if visit(&top.dir, &entry, &path) == Flow::Stop {
                    break;
                }
            }
            // Symlinks are never followed; FIFOs, sockets and devices are never opened.
            EntryKind::Symlink | EntryKind::Other => {}
        }
    }
    report
}

/// How a tool prints the path of `entry` in `dir`: the entry's own name from its bytes (so a name
/// that is not UTF-8 shows as `\xHH`, not as U+FFFD), everything escaped as
/// [`shown_name`](crate::text::shown_name) says.
pub(crate) fn shown_path(dir: &WorkspaceDir, entry: &Entry) -> String {
    let name = crate::text::shown_name_bytes(entry.name_bytes());
    if dir.path() == "." {
        name.into_owned()
    } else {
        format!("{}/{name}", crate::text::shown_name(dir.path()))
    }
}

/// The notes about what a walk passed over that are worth telling the model when a search found
/// nothing (or less than expected).
pub(crate) fn notes(report: &WalkReport) -> Vec<String> {
    let mut notes = Vec::new();
    if !report.skipped_dirs.is_empty() {
        let dirs: Vec<std::borrow::Cow<'_, str>> = report
            .skipped_dirs
            .iter()
            .take(10)
            .map(|dir| crate::text::shown_name(dir))
            .collect();
        let more = report.skipped_dirs.len().saturating_sub(dirs.len());
        notes.push(format!(
            "Not searched: {}{} (dependency, build or VCS directories; give one as `path` to \
             search inside it).",
            dirs.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ));
    }
    if report.ignored > 0 {
        notes.push(format!(
            "{} ignored by .gitignore rules (give an ignored directory as `path` to search it).",
            crate::text::plural(report.ignored, "path was", "paths were")
        ));
    }
    if report.too_deep {
        notes.push(format!(
            "Directories nested deeper than {MAX_WALK_DEPTH} levels were not entered."
        ));
    }
    if !report.long_gitignores.is_empty() {
        let files: Vec<std::borrow::Cow<'_, str>> = report
            .long_gitignores
            .iter()
            .take(10)
            .map(|f| crate::text::shown_name(f))
            .collect();
        notes.push(format!(
            "Only the first {MAX_GITIGNORE_RULES} rules of {} were applied (a longer \
             .gitignore is cut there), so some ignored paths may have been searched.",
            files.join(", ")
        ));
    }
    notes
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests build their fixtures on the host"
)]
mod tests {
    use std::fs;

    use super::*;

    fn files(ws: &Workspace, start: &str) -> (Vec<String>, WalkReport) {
        let mut seen = Vec::new();
        let dir = ws.open_dir(start).unwrap();
        let report = walk_files(ws, dir, &Bounds::unlimited(), &mut |_, _, path| {
            seen.push(path.to_owned());
            Flow::Continue
        });
        (seen, report)
    }

    fn tree(paths: &[(&str, &str)]) -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        for (path, contents) in paths {
            let full = dir.path().join(path);
            fs::create_dir_all(full.parent().unwrap()).unwrap();
            fs::write(full, contents).unwrap();
        }
        let ws = Workspace::open(dir.path()).unwrap();
        (dir, ws)
    }

    #[test]
    fn files_come_in_path_order_and_excluded_directories_are_skipped() {
        let (_dir, ws) = tree(&[
            ("b.txt", ""),
            ("a/z.txt", ""),
            ("a/b/c.txt", ""),
            ("node_modules/x/i.js", ""),
            (".git/HEAD", ""),
        ]);
        let (seen, report) = files(&ws, ".");
        assert_eq!(seen, ["a/b/c.txt", "a/z.txt", "b.txt"]);
        assert_eq!(
            report.skipped_dirs.into_iter().collect::<Vec<_>>(),
            [".git", "node_modules"]
        );
    }

    #[test]
    fn an_excluded_directory_asked_for_by_path_is_walked() {
        let (_dir, ws) = tree(&[("node_modules/x/i.js", "")]);
        assert_eq!(files(&ws, "node_modules").0, ["node_modules/x/i.js"]);
    }

    #[test]
    fn gitignore_rules_apply_at_every_level_with_negation() {
        let (_dir, ws) = tree(&[
            (".gitignore", "*.log\nout/\n"),
            ("a.log", ""),
            ("keep.txt", ""),
            ("out/x.txt", ""),
            ("sub/.gitignore", "!important.log\nlocal.txt\n"),
            ("sub/important.log", ""),
            ("sub/other.log", ""),
            ("sub/local.txt", ""),
        ]);
        let (seen, report) = files(&ws, ".");
        assert_eq!(
            seen,
            [
                ".gitignore",
                "keep.txt",
                "sub/.gitignore",
                "sub/important.log"
            ]
        );
        assert_eq!(report.ignored, 4);
    }

    #[test]
    fn rules_from_above_the_start_directory_still_apply_below_it() {
        let (_dir, ws) = tree(&[
            (".gitignore", "*.tmp\n"),
            ("sub/a.tmp", ""),
            ("sub/b.rs", ""),
        ]);
        assert_eq!(files(&ws, "sub").0, ["sub/b.rs"]);
    }

    #[test]
    fn symlinks_are_never_followed() {
        let (dir, ws) = tree(&[("real/f.txt", "")]);
        std::os::unix::fs::symlink("real", dir.path().join("dir-link")).unwrap();
        std::os::unix::fs::symlink("real/f.txt", dir.path().join("file-link")).unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("outside")).unwrap();
        assert_eq!(files(&ws, ".").0, ["real/f.txt"]);
    }
}
