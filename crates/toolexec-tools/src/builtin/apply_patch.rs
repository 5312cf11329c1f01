//! `apply_patch`: add, delete, update and move files with one patch, all or nothing.
//!
//! Three phases. Parse the whole patch ([`crate::patch`]). Verify: play every operation
//! against an in-memory view of the files it touches (read through the jail), so later
//! operations see earlier ones, and check read-before-write for every existing file the patch
//! would change. Commit: only when everything applied, write the final state of each touched
//! file (atomically, each write re-checking that the file is still what was verified); if a
//! write fails at the OS level, put back what was already written from the verified before-
//! contents (best effort) and say exactly what happened.
//!
//! Read-before-write: every existing file the patch changes — updated, deleted, the source of a
//! move, a move's existing destination, an existing file an `Add File` overwrites — must have
//! been read in this session and be unchanged since. Files the patch itself creates need no read.
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use similar::{ChangeTag, TextDiff};
use toolexec_core::{
    Capability, FileChange, FileChangeKind, OutputLimit, ToolSpec, TruncationMode, sha256_hex,
};

use super::{Action, blocking, check_read, too_late};
use crate::patch::{self, Hunk, HunkFailure, Mismatch, Op};
use crate::text::{decode_for_edit, numbered_range, plural, shown_name, view_lines};
use crate::{CallReads, Deadline, RecordedChange, Tool, ToolContext, ToolOutput, parse_args};
use toolexec_workspace::jail::{Before, JailError, Workspace, human_bytes};

/// File lines shown around the place a hunk stopped matching.
const FAILURE_CONTEXT_LINES: usize = 2;

/// A compact reminder of the format, appended to parse errors.
const FORMAT_REMINDER: &str = "The format is:\n*** Begin Patch\n*** Update File: path\n@@\n \
context line\n-removed line\n+added line\n*** End Patch\n(with '*** Add File: path' followed by \
'+' lines, and '*** Delete File: path').";

const DESCRIPTION: &str = "\
Applies a patch that adds, deletes, updates or moves files, all or nothing: the whole patch is \
checked against the current files first, and if any part does not apply, nothing is changed.

Use it for changes across several files, or several places in one file, in one step. For one small \
change edit_file is simpler; to write a whole new file write_file works too.

Format (every path relative to /workspace or absolute under it):
*** Begin Patch
*** Add File: <path>            then the new file's lines, each starting with +
*** Delete File: <path>
*** Update File: <path>
*** Move to: <new path>         (optional: rename the updated file)
@@ <optional line to find first, e.g. a function signature>
 <context line, starting with a space>
-<line to remove>
+<line to add>
*** End of File                 (optional: the hunk is at the very end of the file)
*** End Patch

Give each hunk about 3 lines of unchanged context before and after the change so it matches one \
place. Hunks of one file must be in file order. Lines are found exactly, else ignoring trailing \
whitespace, else ignoring indentation too; the + lines are written exactly as given. Updated files \
end with a newline and keep CRLF line endings if they have them.

Read-before-write: every existing file the patch changes (updated, deleted, moved, or overwritten \
by Add File or Move to) must have been read in this session (read_file, read_many_files or a grep \
hit) and be unchanged since. Files the patch creates need no read.

Example: {\"patch\": \"*** Begin Patch\\n*** Update File: src/app.py\\n@@ def greet():\\n-    \
print(\\\"Hi\\\")\\n+    print(\\\"Hello\\\")\\n*** Add File: docs/NOTES.md\\n+# Notes\\n*** End \
Patch\"}

If a hunk does not apply, the error names the file, the hunk number and the first line that did \
not match, and shows what the file has there. Limits: text (UTF-8) files up to 10 MiB.";

pub struct ApplyPatch {
    spec: ToolSpec,
}

impl Default for ApplyPatch {
    fn default() -> Self {
        Self::new()
    }
}

impl ApplyPatch {
    pub fn new() -> Self {
        Self {
            spec: ToolSpec {
                name: "apply_patch".to_owned(),
                description: DESCRIPTION.to_owned(),
                input_schema: crate::schema::arguments_schema::<Args>(),
                read_only: false,
                capabilities: vec![Capability::FsRead, Capability::FsWrite],
                output_limit: OutputLimit::new(10_000, TruncationMode::Tail),
            },
        }
    }
}

/// `apply_patch`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The whole patch, from '*** Begin Patch' to '*** End Patch'.
    #[schemars(length(min = 1))]
    patch: String,
}

#[async_trait]
impl Tool for ApplyPatch {
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
        let deadline = ctx.deadline.clone();
        blocking(move || apply(&workspace, &reads, &args.patch, &deadline))
            .await
            .unwrap_or_else(|output| output)
    }
}

fn apply(workspace: &Workspace, reads: &CallReads, text: &str, deadline: &Deadline) -> ToolOutput {
    let patch = match patch::parse(text) {
        Ok(patch) => patch,
        Err(e) => {
            return ToolOutput::error(format!(
                "The patch could not be parsed; nothing was changed.\nPatch line {}: {}.\n\
                 {FORMAT_REMINDER}",
                e.line, e.message
            ));
        }
    };
    if patch.ops.is_empty() {
        return ToolOutput::error(format!(
            "The patch contains no operations; nothing was changed. Put at least one '*** Add \
             File:', '*** Delete File:' or '*** Update File:' between the markers.\n\
             {FORMAT_REMINDER}"
        ));
    }
    let mut plan = Plan::default();
    for op in &patch.ops {
        // Verifying is the long part (finding each hunk's lines); nothing is written until
        // every file is verified, so stopping here leaves the workspace as it was.
        if deadline.expired() {
            return too_late(deadline, "every file of the patch was verified");
        }
        if let Err(failure) = plan.apply(workspace, reads, op, deadline) {
            // A hunk search cut short by the deadline looks like a hunk not found.
            if deadline.expired() {
                return too_late(deadline, "every file of the patch was verified");
            }
            return failure.into_output();
        }
    }
    if !deadline.commit_change() {
        return too_late(deadline, "writing the patched files");
    }
    plan.commit(workspace, reads)
}

/// One file the patch touches: what it was when verified and what it becomes.
#[derive(Debug)]
struct Entry {
    /// Resolved workspace-relative path (the display path for a file that does not exist yet).
    path: String,
    /// Contents (and hash) when verified; `None` if the file did not exist.
    original: Option<(Vec<u8>, String)>,
    /// Contents after the patch so far; `None` if it does not exist (then).
    current: Option<Vec<u8>>,
    /// Set when read-before-write has been checked (once per file).
    checked: bool,
    /// Where a file moved here came from, for the summary.
    moved_from: Option<String>,
}

/// The patch played against an in-memory view of the files, in first-touched order.
#[derive(Debug, Default)]
struct Plan {
    entries: Vec<Entry>,
}

/// Why verification stopped: the model-facing text and whether it is a guardrail refusal.
struct Failure {
    text: String,
    denied: bool,
}

impl Failure {
    fn error(text: String) -> Self {
        Self {
            text,
            denied: false,
        }
    }

    fn into_output(self) -> ToolOutput {
        let text = format!(
            "The patch was not applied; nothing was changed.\n{}",
            self.text
        );
        if self.denied {
            ToolOutput::denied(text)
        } else {
            ToolOutput::error(text)
        }
    }
}

/// `*** Update File: src/a.rs (patch line 4)`.
fn where_in_patch(op: &Op) -> String {
    let header = match op {
        Op::Add { .. } => "*** Add File:",
        Op::Delete { .. } => "*** Delete File:",
        Op::Update { .. } => "*** Update File:",
    };
    format!(
        "{header} {} (patch line {})",
        shown_name(op.path()),
        op.line()
    )
}

impl Plan {
    fn apply(
        &mut self,
        ws: &Workspace,
        reads: &CallReads,
        op: &Op,
        deadline: &Deadline,
    ) -> Result<(), Failure> {
        match op {
            Op::Add { path, contents, .. } => {
                let at = self.entry(ws, path, op)?;
                self.check_read(reads, at, op)?;
                self.entries[at].current = Some(contents.clone().into_bytes());
            }
            Op::Delete { path, .. } => {
                let at = self.entry(ws, path, op)?;
                if self.entries[at].current.is_none() {
                    return Err(missing(op, &self.entries[at].path, "delete"));
                }
                self.not_through_a_symlink(path, at, op)?;
                self.check_read(reads, at, op)?;
                self.entries[at].current = None;
            }
            Op::Update {
                path,
                move_to,
                hunks,
                ..
            } => {
                let at = self.entry(ws, path, op)?;
                let Some(bytes) = self.entries[at].current.as_deref() else {
                    return Err(missing(op, &self.entries[at].path, "update"));
                };
                let shown = self.entries[at].path.clone();
                let text = decode_for_edit(&shown, bytes, "apply_patch")
                    .map_err(|e| Failure::error(format!("{}: {e}", where_in_patch(op))))?;
                let updated = patch::apply_hunks_within(text, hunks, deadline)
                    .map_err(|f| Failure::error(hunk_failure(&shown, text, hunks, &f)))?;
                self.check_read(reads, at, op)?;
                match move_to {
                    Some(dest) => {
                        let to = self.entry(ws, dest, op)?;
                        if to != at {
                            self.not_through_a_symlink(path, at, op)?;
                            self.check_read(reads, to, op)?;
                            self.entries[at].current = None;
                            self.entries[to].moved_from = Some(shown);
                        }
                        self.entries[to].current = Some(updated.into_bytes());
                    }
                    None => self.entries[at].current = Some(updated.into_bytes()),
                }
            }
        }
        Ok(())
    }

    /// The entry for `path`, reading the file through the jail the first time it is touched.
    fn entry(&mut self, ws: &Workspace, path: &str, op: &Op) -> Result<usize, Failure> {
        let jail = |e: &JailError| Failure {
            text: format!("{}: {}", where_in_patch(op), e.model_message()),
            denied: e.is_guardrail(),
        };
        let display = Workspace::display_path(path).map_err(|e| jail(&e))?;
        // The text form folds `..` without following symlinks (`link/../f` is shown as `f`,
        // but the kernel reads `target/../f`), so it may name an entry only when the path has
        // no `..`; otherwise only the filesystem's answer counts.
        let lexical = !path.split('/').any(|c| c == "..");
        if lexical && let Some(at) = self.find(&display) {
            return Ok(at);
        }
        let (resolved, original) = match ws.read(path) {
            Ok(file) => (file.path, Some((file.bytes, file.sha256))),
            Err(JailError::NotFound { .. }) if !lexical => {
                return Err(Failure::error(format!(
                    "{}: '{}' does not exist. Name a file the patch creates or moves to \
                     without '..' (for example '{}' if that is the one you mean).",
                    where_in_patch(op),
                    shown_name(path),
                    shown_name(&display)
                )));
            }
            Err(JailError::NotFound { .. }) => (display, None),
            Err(JailError::TooLarge { size, limit, .. }) => {
                return Err(Failure::error(format!(
                    "{}: '{}' is {}, over the {} limit for files apply_patch changes. \
                     Use the shell for it.",
                    where_in_patch(op),
                    shown_name(&display),
                    human_bytes(size),
                    human_bytes(limit)
                )));
            }
            Err(e) => return Err(jail(&e)),
        };
        if let Some(at) = self.find(&resolved) {
            return Ok(at);
        }
        self.entries.push(Entry {
            path: resolved,
            current: original.as_ref().map(|(bytes, _)| bytes.clone()),
            original,
            checked: false,
            moved_from: None,
        });
        Ok(self.entries.len() - 1)
    }

    /// A file the patch removes (deleted, or the source of a move) must be named by its real
    /// path: removing the file a symlink points to, and leaving the link dangling, is not what
    /// `*** Delete File: link` reads as.
    fn not_through_a_symlink(&self, path: &str, at: usize, op: &Op) -> Result<(), Failure> {
        let real = &self.entries[at].path;
        match Workspace::display_path(path) {
            Ok(display) if display != *real && self.entries[at].original.is_some() => {
                let (display, real) = (shown_name(&display), shown_name(real));
                Err(Failure::error(format!(
                    "{}: '{display}' leads through a symlink to '{real}'. Name the file by its \
                     real path ('{real}') to remove it, or remove the link itself with the shell.",
                    where_in_patch(op)
                )))
            }
            _ => Ok(()),
        }
    }

    fn find(&self, path: &str) -> Option<usize> {
        self.entries.iter().position(|e| e.path == path)
    }

    /// Read-before-write for an entry that existed before the patch, once.
    fn check_read(&mut self, reads: &CallReads, at: usize, op: &Op) -> Result<(), Failure> {
        let entry = &mut self.entries[at];
        if entry.checked {
            return Ok(());
        }
        if let Some((_, sha256)) = &entry.original {
            check_read(reads, &entry.path, sha256, Action::Patch).map_err(|refusal| Failure {
                text: format!("{}: {refusal}", where_in_patch(op)),
                denied: true,
            })?;
        }
        entry.checked = true;
        Ok(())
    }

    /// Writes the verified final state of every touched file, or as little as possible.
    fn commit(self, ws: &Workspace, reads: &CallReads) -> ToolOutput {
        let mut done: Vec<&Entry> = Vec::new();
        let mut modes: Vec<Option<u32>> = Vec::new();
        for entry in &self.entries {
            let original_bytes = entry.original.as_ref().map(|(b, _)| b.as_slice());
            if entry.current.as_deref() == original_bytes {
                continue;
            }
            match commit_one(ws, entry) {
                Ok(mode) => modes.push(mode),
                Err(problem) => {
                    let rollback = roll_back(ws, &done);
                    let text = format!(
                        "The patch was verified, but writing {} failed: {problem}\n{rollback}",
                        shown_name(&entry.path)
                    );
                    return ToolOutput::error(text);
                }
            }
            done.push(entry);
        }
        if done.is_empty() {
            return ToolOutput::ok(
                "The patch applied, but it changes nothing: every file already has the patched \
                 contents.",
            );
        }

        let mut lines = Vec::with_capacity(done.len());
        let mut output = ToolOutput::ok(String::new());
        for (entry, mode) in done.into_iter().zip(modes) {
            let before = entry.original.as_ref();
            let (kind, letter) = match (&entry.current, before) {
                (Some(_), None) => (FileChangeKind::Created, "A"),
                (Some(_), Some(_)) => (FileChangeKind::Modified, "M"),
                (None, _) => (FileChangeKind::Deleted, "D"),
            };
            let after_sha = entry.current.as_deref().map(sha256_hex);
            match &after_sha {
                // The session wrote these bytes, so it knows the file as it is now.
                Some(sha) => reads.record(&entry.path, sha),
                None => reads.forget(&entry.path),
            }
            let mut line = format!("{letter} {}", shown_name(&entry.path));
            if let Some(from) = &entry.moved_from {
                line.push_str(&format!(" (moved from {})", shown_name(from)));
            }
            if let Some(stat) =
                line_stat(before.map(|(b, _)| b.as_slice()), entry.current.as_deref())
            {
                line.push_str(&format!(" ({stat})"));
            }
            lines.push(line);
            output = output.with_change(RecordedChange {
                change: FileChange {
                    kind,
                    path: entry.path.clone(),
                    path_b64: None,
                    before_sha256: before.map(|(_, sha)| sha.clone()),
                    after_sha256: after_sha,
                    before_size: before.map(|(b, _)| b.len() as u64),
                    after_size: entry.current.as_ref().map(|c| c.len() as u64),
                    after_stored: entry.current.is_some(),
                    after_unstored: None,
                    after_mode: mode,
                    capability: Capability::FsWrite,
                    symlink_target: None,
                    symlink_target_b64: None,
                },
                after: entry.current.clone(),
            });
        }
        output.content = format!(
            "Applied the patch: {} changed.\n{}",
            plural(lines.len(), "file", "files"),
            lines.join("\n")
        );
        output
    }
}

fn missing(op: &Op, path: &str, verb: &str) -> Failure {
    Failure::error(format!(
        "{}: '{}' does not exist, so there is nothing to {verb}. Check the path with glob \
         or list_dir (to create a file use '*** Add File:').",
        where_in_patch(op),
        shown_name(path)
    ))
}

/// Writes or deletes one file, provided it is still exactly what was verified.
/// Writes or deletes one file; the permission bits of a file written.
fn commit_one(ws: &Workspace, entry: &Entry) -> Result<Option<u32>, String> {
    let expected = entry.original.as_ref().map(|(_, sha)| sha.as_str());
    let unchanged = |before: &Before| -> Result<(), String> {
        if before.sha256() == expected && before.exists() == expected.is_some() {
            Ok(())
        } else {
            Err(format!(
                "'{}' changed while the patch was being applied.",
                shown_name(&entry.path)
            ))
        }
    };
    match &entry.current {
        Some(bytes) => match ws.write_if(&entry.path, bytes, |_, before| unchanged(before)) {
            Ok(Ok(written)) => Ok(Some(written.mode)),
            Ok(Err(refusal)) => Err(refusal),
            Err(e) => Err(e.model_message()),
        },
        None => match ws.remove_file_if(&entry.path, |_, before| unchanged(before)) {
            Ok(Ok(_)) => Ok(None),
            Ok(Err(refusal)) => Err(refusal),
            Err(e) => Err(e.model_message()),
        },
    }
}

/// Puts back the files already written, from their verified before-contents; best effort.
fn roll_back(ws: &Workspace, done: &[&Entry]) -> String {
    if done.is_empty() {
        return "Nothing had been written yet, so nothing was changed.".to_owned();
    }
    let mut restored = Vec::new();
    let mut failed = Vec::new();
    for entry in done.iter().rev() {
        let result = match &entry.original {
            Some((bytes, _)) => ws.write(&entry.path, bytes).map(|_| ()),
            None => ws.remove_file(&entry.path).map(|_| ()),
        };
        match result {
            Ok(()) => restored.push(shown_name(&entry.path).into_owned()),
            Err(e) => failed.push(format!(
                "{} ({})",
                shown_name(&entry.path),
                e.model_message()
            )),
        }
    }
    let mut text = format!(
        "The files already written were rolled back to their contents before the patch: {}.",
        restored.join(", ")
    );
    if !failed.is_empty() {
        text = format!(
            "Rolling back the files already written failed for: {}. Restored: {}. Check these \
             files with read_file before trying again.",
            failed.join("; "),
            if restored.is_empty() {
                "none".to_owned()
            } else {
                restored.join(", ")
            }
        );
    }
    text.push_str(
        " Directories the patch created may remain. Fix the cause and apply the patch again.",
    );
    text
}

/// Longest a `+3 -1` line count may take; a diff of two big, very different files takes
/// minutes without a limit.
const LINE_STAT_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(250);

/// `+3 -1` for a text change; `None` for additions and deletions of non-text.
fn line_stat(before: Option<&[u8]>, after: Option<&[u8]>) -> Option<String> {
    let before = std::str::from_utf8(before.unwrap_or_default()).ok()?;
    let after = std::str::from_utf8(after.unwrap_or_default()).ok()?;
    // Counted after the files are written, so it must not hold the call: past the timeout
    // the diff is coarser (the counts may be higher than the least possible), never wrong.
    let diff = TextDiff::configure()
        .timeout(LINE_STAT_TIMEOUT)
        .diff_lines(before, after);
    let (mut added, mut removed) = (0, 0);
    for change in diff.iter_all_changes() {
        match change.tag() {
            ChangeTag::Insert => added += 1,
            ChangeTag::Delete => removed += 1,
            ChangeTag::Equal => {}
        }
    }
    Some(format!("+{added} -{removed}"))
}

/// The model-facing account of a hunk that did not apply: file, hunk, the first line that did
/// not match, and what the file has there.
fn hunk_failure(path: &str, text: &str, hunks: &[Hunk], failure: &HunkFailure) -> String {
    let hunk = &hunks[failure.hunk - 1];
    let lines = view_lines(text);
    let head = format!(
        "{}, hunk {} of {} (patch line {})",
        shown_name(path),
        failure.hunk,
        hunks.len(),
        hunk.line
    );
    let after = |from: usize| {
        if from == 0 {
            String::new()
        } else {
            format!(" after line {from} (where the previous hunk or @@ line matched)")
        }
    };
    match &failure.kind {
        Mismatch::Context { header, from } => format!(
            "{head}: the @@ line {header:?} was not found in the file{}. The text after @@ must \
             be a line of the file (like a function signature) that comes before the hunk's \
             lines; use '@@' alone if you do not need it.",
            after(*from)
        ),
        Mismatch::NotAtEnd { found } => format!(
            "{head}: the hunk ends with '*** End of File', but its lines are at line {} and the \
             file continues after them. The file ends with:\n{}Remove '*** End of File' or fix \
             the hunk's lines.",
            found + 1,
            numbered_range(&lines, lines.len().saturating_sub(3), lines.len())
        ),
        Mismatch::Lines {
            partial: Some((start, matched)),
            from,
        } => {
            let index = start + matched;
            let expected = &hunk.old[*matched];
            let has = match lines.get(index) {
                Some(line) => format!("line {} of the file is {line:?}", index + 1),
                None => "the file ends there".to_owned(),
            };
            let shown_from = index.saturating_sub(FAILURE_CONTEXT_LINES + 1);
            let shown_to = index + FAILURE_CONTEXT_LINES + 1;
            let matched_part = if *matched == 1 {
                format!("Its first line matched at line {}", start + 1)
            } else {
                format!("Its first {matched} lines matched from line {}", start + 1)
            };
            format!(
                "{head}: the hunk's lines were not found in the file{}. {matched_part}, but then \
                 it expects {expected:?} (a line starting with ' ' or '-') and {has}. The file \
                 has there:\n{}Fix the hunk so its ' ' and '-' lines are exactly the file's lines \
                 (read the file again if it may have changed).",
                after(*from),
                numbered_range(&lines, shown_from, shown_to)
            )
        }
        Mismatch::Lines {
            partial: None,
            from,
        } => {
            let first = hunk.old.first().map(String::as_str).unwrap_or_default();
            let mut text = format!(
                "{head}: the hunk's first line {first:?} was not found in the file{}.",
                after(*from)
            );
            if let Some((line_index, ratio)) = most_similar_line(&lines, first) {
                text.push_str(&format!(
                    " The most similar line is line {} ({:.0}% similar):\n{}",
                    line_index + 1,
                    ratio * 100.0,
                    numbered_range(
                        &lines,
                        line_index.saturating_sub(FAILURE_CONTEXT_LINES),
                        line_index + FAILURE_CONTEXT_LINES + 1
                    )
                ));
            } else {
                text.push('\n');
            }
            text.push_str(
                "Fix the hunk so its ' ' and '-' lines are exactly the file's lines (read the \
                 file again if it may have changed).",
            );
            text
        }
    }
}

fn most_similar_line(lines: &[&str], wanted: &str) -> Option<(usize, f32)> {
    let near = crate::text::closest_window(lines, &[wanted])?;
    (near.ratio >= 0.5).then_some((near.start, near.ratio))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, original: Option<&[u8]>, current: Option<&[u8]>) -> Entry {
        Entry {
            path: path.to_owned(),
            original: original.map(|b| (b.to_vec(), sha256_hex(b))),
            current: current.map(<[u8]>::to_vec),
            checked: true,
            moved_from: None,
        }
    }

    #[test]
    fn a_failure_while_writing_rolls_back_what_was_already_written() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        ws.write("a.txt", b"a before").unwrap();
        ws.write("gone.txt", b"deleted").unwrap();
        // b.txt changes between verification and commit: its write is refused.
        ws.write("b.txt", b"changed behind our back").unwrap();
        let plan = Plan {
            entries: vec![
                entry("a.txt", Some(b"a before"), Some(b"a after")),
                entry("new.txt", None, Some(b"created")),
                entry("gone.txt", Some(b"deleted"), None),
                entry("b.txt", Some(b"b as verified"), Some(b"b after")),
            ],
        };
        let out = plan.commit(&ws, &CallReads::new(std::sync::Arc::default()));
        assert_eq!(out.status, toolexec_core::CallStatus::Error);
        assert!(
            out.content.contains("writing b.txt failed"),
            "{}",
            out.content
        );
        assert!(
            out.content
                .contains("rolled back to their contents before the patch"),
            "{}",
            out.content
        );
        assert!(out.changes.is_empty());
        assert_eq!(ws.read("a.txt").unwrap().bytes, b"a before");
        assert_eq!(ws.read("gone.txt").unwrap().bytes, b"deleted");
        assert!(matches!(
            ws.read("new.txt"),
            Err(JailError::NotFound { .. })
        ));
        assert_eq!(ws.read("b.txt").unwrap().bytes, b"changed behind our back");
    }
}
