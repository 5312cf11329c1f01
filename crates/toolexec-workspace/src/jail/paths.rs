//! Paths as the model gives them: checked, normalised for messages, split into parent and name.

use super::*;

/// A path as the model gave it, checked and split into what the kernel resolves and what the
/// model is shown.
pub(super) struct Target {
    /// Relative to the root, as given (the kernel folds `..` and symlinks).
    pub(super) kernel: String,
    /// Lexically normalised, for messages.
    pub(super) display: String,
}

pub(super) fn parse_path(input: &str) -> Result<Target, JailError> {
    let invalid = |reason: String| JailError::InvalidPath {
        path: shorten(&input.replace('\0', "\\0")),
        reason,
    };
    if input.is_empty() {
        return Err(invalid("the path is empty".to_owned()));
    }
    if input.contains('\0') {
        return Err(invalid("it contains a NUL byte".to_owned()));
    }
    if input.len() > MAX_PATH_BYTES {
        return Err(invalid(format!(
            "it is {} bytes long; the limit is {MAX_PATH_BYTES}",
            input.len()
        )));
    }
    let relative = match input.strip_prefix('/') {
        None => input,
        Some(rest) => match rest.strip_prefix(VIRTUAL_ROOT.trim_start_matches('/')) {
            Some("") => ".",
            Some(under) if under.starts_with('/') => match under.trim_start_matches('/') {
                "" => ".",
                r => r,
            },
            _ => {
                return Err(JailError::OutsideWorkspace {
                    path: shorten(input),
                });
            }
        },
    };
    if let Some(long) = relative.split('/').find(|c| c.len() > MAX_COMPONENT_BYTES) {
        return Err(invalid(format!(
            "a component is {} bytes long; the limit is {MAX_COMPONENT_BYTES}",
            long.len()
        )));
    }
    Ok(Target {
        kernel: relative.to_owned(),
        display: normalize(relative),
    })
}

/// `a/./b//c/../d` → `a/b/d`; `.` for the root. Leading `..` stay (the kernel refuses them).
pub(super) fn normalize(relative: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for component in relative.split('/') {
        match component {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    if parts.is_empty() {
        ".".to_owned()
    } else {
        parts.join("/")
    }
}

/// Splits a write target into its parent (as the kernel resolves it) and its final name.
pub(super) fn split_parent(target: &Target) -> Result<(&str, &str), JailError> {
    let kernel = target.kernel.as_str();
    let (parent, name) = match kernel.rsplit_once('/') {
        Some((parent, name)) => (if parent.is_empty() { "." } else { parent }, name),
        None => (".", kernel),
    };
    match name {
        "" => Err(JailError::InvalidPath {
            path: shorten(&target.display),
            reason: "it ends with '/'; give the path of a file".to_owned(),
        }),
        "." | ".." => Err(JailError::IsADirectory {
            path: target.display.clone(),
        }),
        _ => Ok((parent, name)),
    }
}
