//! The built-in tools, one file each, and the few helpers they share.
use std::sync::Arc;

use toolexec_core::Capability;

use crate::RecordedChange;
use crate::Tool;
use crate::ToolOutput;
use crate::reads::{CallReads, WriteCheck};
use toolexec_core::{FileChange, FileChangeKind, UnstoredReason};
use toolexec_workspace::jail::{
    Before, FileContents, JailError, UnreadReason, Workspace, Written, human_bytes,
};

pub mod apply_patch;
pub mod bash;
pub mod edit_file;
pub mod file_copy;
pub mod file_delete;
pub mod glob;
pub mod grep;
pub mod list_dir;
pub mod process_kill;
pub mod process_read;
pub mod process_write;
pub mod read_file;
pub mod read_many_files;
pub mod read_output;
pub mod shell;
pub mod str_replace_based_edit_tool;
pub mod tasks;
pub mod terminal;
pub mod update_plan;
pub mod web_fetch;
pub mod web_search;
pub mod write_file;

/// Every built-in tool, in catalog order.
pub fn all() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(read_file::ReadFile::new()),
        Arc::new(read_many_files::ReadManyFiles::new()),
        Arc::new(write_file::WriteFile::new()),
        Arc::new(edit_file::EditFile::new()),
        Arc::new(apply_patch::ApplyPatch::new()),
        Arc::new(str_replace_based_edit_tool::TextEditor::new()),
        Arc::new(grep::Grep::new()),
        Arc::new(glob::Glob::new()),
        Arc::new(list_dir::ListDir::new()),
        Arc::new(file_copy::FileCopy::new()),
        Arc::new(file_delete::FileDelete::new()),
        Arc::new(shell::Shell::new()),
        Arc::new(bash::Bash::new()),
        Arc::new(terminal::ExecCommand::new()),
        Arc::new(terminal::WriteStdin::new()),
        Arc::new(process_read::ProcessRead::new()),
        Arc::new(process_write::ProcessWrite::new()),
        Arc::new(process_kill::ProcessKill::new()),
        Arc::new(update_plan::UpdatePlan::new()),
        Arc::new(tasks::TaskCreate::new()),
        Arc::new(tasks::TaskUpdate::new()),
        Arc::new(tasks::TaskGet::new()),
        Arc::new(tasks::TaskList::new()),
        Arc::new(read_output::ReadOutput::new()),
        Arc::new(web_fetch::WebFetch::new()),
        Arc::new(web_search::WebSearch::new()),
    ]
}

/// What a completed write recorded, and how to say it: `created`, or `replaced the previous
/// 2.0 KiB`. `after` is kept as the blob when given (`after_stored` says whether it was).
pub(crate) fn written_change(
    written: &Written,
    capability: Capability,
    after: Option<Vec<u8>>,
) -> (RecordedChange, String) {
    let (kind, how) = match &written.before {
        Before::Absent => (FileChangeKind::Created, "created".to_owned()),
        before => (
            FileChangeKind::Modified,
            format!(
                "replaced the previous {}",
                before
                    .size()
                    .map_or_else(|| "contents".to_owned(), human_bytes)
            ),
        ),
    };
    let change = FileChange {
        kind,
        path: written.path.clone(),
        path_b64: None,
        before_sha256: written.before.sha256().map(str::to_owned),
        after_sha256: Some(written.sha256.clone()),
        before_size: written.before.size(),
        after_size: Some(written.size),
        after_stored: after.is_some(),
        // Only a copy leaves them out, when over the size it was asked to keep.
        after_unstored: after.is_none().then_some(UnstoredReason::TooLarge),
        after_mode: Some(written.mode),
        capability,
        symlink_target: None,
        symlink_target_b64: None,
    };
    (RecordedChange { change, after }, how)
}

/// Writes `edited` over `file` (what it was computed from, as read through the jail) if the file
/// still holds exactly those bytes, within the call's deadline; the session then counts as having
/// read the new contents. The change to record comes back with the write (`None` when `edited`
/// is what the file already held). Shared by the tools that edit a file in place (edit_file,
/// the text editor), so that they check, write and record an edit the same way.
pub(crate) fn write_edit(
    workspace: &Workspace,
    reads: &CallReads,
    deadline: &crate::Deadline,
    file: &FileContents,
    edited: String,
    action: Action,
) -> Result<(Written, Option<RecordedChange>), ToolOutput> {
    let shown = crate::text::shown_name(&file.path);
    if !deadline.commit_change() {
        return Err(too_late(
            deadline,
            &format!("writing the edit to '{shown}'"),
        ));
    }
    let expected = file.sha256.as_str();
    let written = match workspace.write_if(&file.path, edited.as_bytes(), |_, before| {
        if before.sha256() == Some(expected) {
            Ok(())
        } else {
            Err(format!(
                "Cannot {verb} '{shown}': the file has changed since you read it (it changed \
                 while the edit was being made). Use {read} to read its current contents, then \
                 {retry}.",
                verb = action.verb(),
                read = action.read_with(),
                retry = action.retry()
            ))
        }
    }) {
        Err(jail) => return Err(jail_failure(&jail)),
        Ok(Err(refusal)) => return Err(ToolOutput::denied(refusal)),
        Ok(Ok(written)) => written,
    };
    // The session wrote these bytes, so it knows the file as it is now.
    reads.record(&written.path, &written.sha256);
    if !written.changed {
        return Ok((written, None));
    }
    let change = FileChange {
        kind: FileChangeKind::Modified,
        path: written.path.clone(),
        path_b64: None,
        before_sha256: Some(file.sha256.clone()),
        after_sha256: Some(written.sha256.clone()),
        before_size: Some(file.bytes.len() as u64),
        after_size: Some(written.size),
        after_stored: true,
        after_unstored: None,
        after_mode: Some(written.mode),
        capability: Capability::FsWrite,
        symlink_target: None,
        symlink_target_b64: None,
    };
    let change = RecordedChange {
        change,
        after: Some(edited.into_bytes()),
    };
    Ok((written, Some(change)))
}

/// A jail refusal as the model sees it: `denied` for guardrails, `error` otherwise.
pub(crate) fn jail_failure(error: &JailError) -> ToolOutput {
    if error.is_guardrail() {
        ToolOutput::denied(error.model_message())
    } else {
        ToolOutput::error(error.model_message())
    }
}

/// Longest pattern a call may give (grep's regex and `glob_filter`, glob's pattern), in
/// characters; enforced by the tools' schemas (`maxLength`). Far beyond any pattern a person
/// writes, and it bounds what parsing one costs before the compiled size limits apply: a
/// regex of a million characters takes seconds to refuse.
pub const MAX_PATTERN_CHARS: u64 = 4096;

/// A glob compiled for matching, or the message for the model. Compiled as a one-glob set:
/// `GlobSet` reports a glob whose compiled form is over the size limit as an error, where
/// `Glob::compile_matcher` would panic.
/// `what` names the argument for the model (`glob pattern`), `field` is its name in the
/// arguments.
pub(crate) fn compile_glob(
    glob: &str,
    builder: &mut globset::GlobBuilder<'_>,
    what: &str,
    field: &str,
    examples: &str,
) -> Result<globset::GlobSet, ToolOutput> {
    let refuse = |e: &dyn std::fmt::Display| ToolOutput {
        status: toolexec_core::CallStatus::InvalidArguments,
        content: format!(
            "Invalid {what} {glob:?} (arguments/{field}): {e}. Use a pattern like {examples}."
        ),
        changes: Vec::new(),
        events: Vec::new(),
        structured: None,
    };
    let compiled = builder.build().map_err(|e| refuse(&e))?;
    globset::GlobSetBuilder::new()
        .add(compiled)
        .build()
        .map_err(|_| refuse(&"the pattern is too complex to compile; simplify it"))
}

/// The answer of a tool whose change would have started after the call's deadline
/// ([`crate::Deadline::commit_change`] said no): nothing was changed. `before` says what was
/// about to happen ("writing 'a.rs'").
pub(crate) fn too_late(deadline: &crate::Deadline, before: &str) -> ToolOutput {
    ToolOutput::timed_out(format!(
        "The call's time limit of {} ran out before {before}; nothing was changed. Call it \
         again; if it keeps running out, make the change in smaller steps.",
        deadline
            .budget()
            .map_or_else(|| "this call".to_owned(), crate::deadline::human_duration)
    ))
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

/// What a tool is about to do to an existing file, for the read-before-write messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Write,
    Edit,
    Delete,
    Patch,
    /// An edit by Anthropic's text editor (`str_replace_based_edit_tool`).
    EditorEdit,
}

impl Action {
    /// `Cannot {verb} 'path'`.
    fn verb(self) -> &'static str {
        match self {
            Action::Write => "write to",
            Action::Edit | Action::EditorEdit => "edit",
            Action::Delete => "delete",
            Action::Patch => "patch",
        }
    }

    /// `…, then {retry}.`
    fn retry(self) -> &'static str {
        match self {
            Action::Write => "write it again",
            Action::Edit => "call edit_file again",
            Action::Delete => "delete it again",
            Action::Patch => "apply the patch again",
            Action::EditorEdit => "call str_replace_based_edit_tool again",
        }
    }

    /// How the tool's model reads a file: the text editor's own `view`, else read_file.
    fn read_with(self) -> &'static str {
        match self {
            Action::EditorEdit => "the `view` command (or read_file)",
            _ => "read_file",
        }
    }
}

/// The read-before-write guardrail (SPEC §5), checked against exactly what is about to be
/// replaced or deleted.
///
/// A tool that declares [`Capability::ContentFromSource`] is exempt: everything it writes is a
/// faithful copy of an existing file, never text the model wrote without seeing what it
/// replaces. The exemption follows the declared capability, never the tool's name, so a new tool
/// gets it only by claiming that provenance in its spec (where it is recorded on every
/// invocation).
pub(crate) fn read_before_write(
    capabilities: &[Capability],
    reads: &CallReads,
    path: &str,
    before: &Before,
    action: Action,
) -> Result<(), String> {
    if capabilities.contains(&Capability::ContentFromSource) {
        return Ok(());
    }
    let (verb, retry) = (action.verb(), action.retry());
    let shown = crate::text::shown_name(path);
    match before {
        Before::Absent => Ok(()),
        Before::File { sha256, .. } => check_read(reads, path, sha256, action),
        Before::Unread {
            reason: UnreadReason::HardLink,
            ..
        } => Err(format!(
            "Cannot {verb} '{shown}': it has more than one hard link, so it may be a file from \
             outside the workspace and cannot be read first. Delete it with the shell \
             (rm '{shown}'), then {retry}."
        )),
        Before::Unread {
            reason: UnreadReason::TooLarge,
            size,
        } => Err(format!(
            "Cannot {verb} '{shown}': the existing file is {} and too large to have been read \
             with read_file. Use the shell to change or remove it.",
            human_bytes(*size)
        )),
    }
}

/// Whether the session has read `path` as it is now (contents hashing to `sha256`); the refusal
/// for the model if not.
pub(crate) fn check_read(
    reads: &CallReads,
    path: &str,
    sha256: &str,
    action: Action,
) -> Result<(), String> {
    let (verb, retry) = (action.verb(), action.retry());
    let shown = crate::text::shown_name(path);
    match reads.check(path, sha256) {
        WriteCheck::Allowed => Ok(()),
        WriteCheck::NeverRead => Err(match action {
            Action::Write => format!(
                "Cannot write to '{shown}': file exists but has not been read. Use read_file to \
                 read it first, then write it again (or use a new path to create a new file)."
            ),
            _ => format!(
                "Cannot {verb} '{shown}': file exists but has not been read. Use {read} to \
                 read it first, then {retry}.",
                read = action.read_with()
            ),
        }),
        WriteCheck::Stale => Err(format!(
            "Cannot {verb} '{shown}': the file has changed since you read it (something else \
             modified it). Use {read} to read its current contents, then {retry}.",
            read = action.read_with()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(contents: &[u8]) -> Before {
        Before::File {
            sha256: toolexec_core::sha256_hex(contents),
            size: contents.len() as u64,
            bytes: contents.to_vec(),
        }
    }

    #[test]
    fn an_unread_existing_file_is_refused_for_every_action() {
        let reads = CallReads::new(std::sync::Arc::default());
        for action in [Action::Write, Action::Edit, Action::Delete, Action::Patch] {
            let refusal =
                read_before_write(&[Capability::FsWrite], &reads, "a.rs", &file(b"x"), action)
                    .unwrap_err();
            assert!(refusal.contains("has not been read"), "{refusal}");
            assert!(refusal.contains("Use read_file"), "{refusal}");
        }
    }

    #[test]
    fn a_stale_read_is_refused_with_the_changed_since_message() {
        let reads = CallReads::new(std::sync::Arc::default());
        reads.record("a.rs", &toolexec_core::sha256_hex(b"old"));
        let refusal = read_before_write(
            &[Capability::FsWrite],
            &reads,
            "a.rs",
            &file(b"new"),
            Action::Delete,
        )
        .unwrap_err();
        assert!(refusal.contains("changed since you read it"), "{refusal}");
    }

    #[test]
    fn content_from_source_is_exempt_whatever_the_tool_is_called() {
        let reads = CallReads::new(std::sync::Arc::default());
        let exempt = [Capability::FsWrite, Capability::ContentFromSource];
        assert_eq!(
            read_before_write(&exempt, &reads, "a.rs", &file(b"x"), Action::Write),
            Ok(())
        );
        assert!(
            read_before_write(
                &[Capability::FsWrite],
                &reads,
                "a.rs",
                &file(b"x"),
                Action::Write
            )
            .is_err()
        );
    }

    #[test]
    fn new_files_need_no_read() {
        let reads = CallReads::new(std::sync::Arc::default());
        assert_eq!(
            read_before_write(
                &[Capability::FsWrite],
                &reads,
                "new.rs",
                &Before::Absent,
                Action::Write
            ),
            Ok(())
        );
    }
}
