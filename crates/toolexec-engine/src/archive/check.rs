//! The archive as a whole, checked before the first write: what one entry cannot be refused for
//! alone (`read` does that) but the archive or the workspace can.
//!
//! - **Within the archive** ([`Tree`]): a path is one thing — a file or symlink given twice (an
//!   archive appended to with `tar -r`), a file that is also the directory of other entries, an
//!   entry beneath one of the archive's own symlinks (it would be written through it, or the
//!   link replaced), are refused. Directories may repeat. Names and targets are kept in memory,
//!   bounded by [`MAX_NAME_TOTAL`].
//! - **Against the workspace** ([`Tree::check_workspace`]): the archive is laid over it. A file
//!   or symlink replaces a file or symlink; a directory of the workspace where the archive has a
//!   file (writing it would delete the directory and everything in it), and a file or symlink of
//!   the workspace where the archive needs a directory, are refused with what to do.
//! - **Links resolved as a whole** ([`Tree::check_links`]): a symlink whose target stays inside
//!   as text can still climb out through another link (`a/b -> ..`, then `z -> a/b/..` is the
//!   folder of every workspace). Each of the archive's links is resolved like the kernel does,
//!   component by component, through the links of the archive and of the workspace as they
//!   will be after the upload; and the workspace's own links are resolved again when the
//!   archive adds or replaces a link, so that the archive cannot complete a chain one of them
//!   starts. A component that is not a link (a directory, a file, nothing yet) counts as a
//!   directory, since a command may make it one later: the check is on what a link could ever
//!   reach, not on what it reaches today. A link that only leads out because of links the
//!   workspace already had is not the archive's doing and is left alone (the file tools and the
//!   sandbox never follow a link out).
//! - **The disk**: the bytes (in blocks) and the files (inodes) the archive adds must fit in
//!   what the workspace's filesystem has free — its disk quota, with one.
use std::collections::BTreeMap;

use toolexec_core::{ProblemCode, names};
use toolexec_workspace::Workspace;
use toolexec_workspace::jail::{EntryKind, JailError};

use super::read::{Item, Kind, refused};
use crate::{EngineError, Result};

/// Bytes of names and link targets one archive may hold in all (its tree is kept in memory
/// while it is checked): 64 MiB is 300 times the paths of the Linux kernel's tree.
pub(super) const MAX_NAME_TOTAL: u64 = 64 * 1024 * 1024;

/// Links followed in one resolution, as the kernel does (`MAXSYMLINKS`): past it a path cannot
/// be followed at all.
const MAX_LINK_HOPS: u32 = 40;

/// Block size counted for each file's contents and each new directory.
const BLOCK: u64 = 4096;

/// What a path is in the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    File {
        size: u64,
    },
    Symlink(Vec<u8>),
    /// `true`: named by an entry; `false`: only implied by the entries beneath it.
    Dir(bool),
}

/// What a path is in the workspace now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Found {
    Absent,
    Dir,
    File,
    Symlink(Vec<u8>),
    /// A FIFO, socket or device a command made.
    Other,
}

/// The archive's paths, as the check pass read them.
#[derive(Debug, Default)]
pub(super) struct Tree {
    nodes: BTreeMap<Vec<u8>, Node>,
    name_bytes: u64,
}

fn shown(path: &[u8]) -> String {
    names::display_bytes(path)
}

fn conflict(detail: String) -> EngineError {
    EngineError::Conflict {
        code: ProblemCode::ArchiveNotApplied,
        detail,
    }
}

/// The parents of `path`, deepest first (`a/b/c`: `a/b`, `a`).
fn parents(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut end = path.len();
    std::iter::from_fn(move || {
        let cut = path[..end].iter().rposition(|b| *b == b'/')?;
        end = cut;
        Some(&path[..cut])
    })
}

impl Tree {
    /// Adds an entry, refusing what makes one path two things.
    pub(super) fn add(&mut self, item: &Item) -> Result<()> {
        if item.path.is_empty() {
            // `./`: the workspace root itself (`read` refuses anything but a directory there).
            return Ok(());
        }
        let at = |why: String| refused(format!("entry {} ('{}'): {why}", item.n, item.shown()));
        self.name_bytes += item.path.len() as u64;
        if let Kind::Symlink { target } = &item.kind {
            self.name_bytes += target.len() as u64;
        }
        if self.name_bytes > MAX_NAME_TOTAL {
            return Err(refused(format!(
                "the archive's names and link targets add up to more than {MAX_NAME_TOTAL} \
                 bytes; upload it in parts"
            )));
        }
        for parent in parents(&item.path) {
            match self.nodes.get(parent) {
                // Its own parents were added with it.
                Some(Node::Dir(_)) => break,
                None => {
                    self.nodes.insert(parent.to_vec(), Node::Dir(false));
                }
                Some(Node::File { .. }) => {
                    return Err(at(format!(
                        "'{}' is a file in the archive and the directory of this entry too",
                        shown(parent)
                    )));
                }
                Some(Node::Symlink(_)) => {
                    return Err(at(format!(
                        "'{}' is a symlink in the archive: an entry beneath it would be \
                         written through it (give the directory itself)",
                        shown(parent)
                    )));
                }
            }
        }
        let node = match &item.kind {
            Kind::Directory => Node::Dir(true),
            Kind::File { .. } => Node::File { size: item.size },
            Kind::Symlink { target } => Node::Symlink(target.clone()),
        };
        match (self.nodes.get_mut(&item.path), node) {
            (None, node) => {
                self.nodes.insert(item.path.clone(), node);
            }
            (Some(Node::Dir(named)), Node::Dir(_)) => *named = true,
            (Some(Node::Dir(_)), _) => {
                return Err(at(format!(
                    "'{}' is a directory in the archive (of other entries) and not one here",
                    item.shown()
                )));
            }
            (Some(_), Node::Dir(_)) => {
                return Err(at(format!(
                    "'{}' is a file or symlink in the archive and a directory here",
                    item.shown()
                )));
            }
            (Some(_), _) => {
                return Err(at(
                    "the same path is in the archive twice (an archive appended to, as `tar -r` \
                     makes, holds every version: make it afresh)"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// Checks the archive against the workspace it is laid over; the blocks and inodes it
    /// needs, and whether it adds or replaces a symlink (its links must then be resolved).
    pub(super) fn check_workspace(&self, ws: &Workspace) -> Result<Needs> {
        let mut needs = Needs::default();
        // Beneath a directory the workspace does not have, it has nothing either.
        let mut new_dir: Option<&[u8]> = None;
        for (path, node) in &self.nodes {
            if let Some(dir) = new_dir {
                if path.starts_with(dir) && path.get(dir.len()) == Some(&b'/') {
                    needs.add(node, &Found::Absent);
                    continue;
                }
                new_dir = None;
            }
            let found = lookup(ws, path).map_err(jail_error)?;
            match (node, &found) {
                (Node::Dir(_), Found::Absent) => new_dir = Some(path),
                (Node::Dir(_), Found::Dir) => {}
                (Node::Dir(_), other) => {
                    let child = self
                        .nodes
                        .range::<[u8], _>((
                            std::ops::Bound::Excluded(path.as_slice()),
                            std::ops::Bound::Unbounded,
                        ))
                        .next()
                        .map(|(p, _)| shown(p))
                        .unwrap_or_default();
                    return Err(conflict(format!(
                        "'{}' is {} in the workspace where the archive has a directory (of \
                         '{child}'); nothing was written. Remove or rename it first (with the \
                         shell), then upload again",
                        shown(path),
                        describe(other)
                    )));
                }
                (_, Found::Dir) => {
                    return Err(conflict(format!(
                        "'{}' is a directory in the workspace where the archive has a file or \
                         symlink: writing it would delete the directory and everything in it; \
                         nothing was written. Remove or rename the directory first (with the \
                         shell), then upload again",
                        shown(path)
                    )));
                }
                _ => {}
            }
            needs.add(node, &found);
        }
        Ok(needs)
    }

    /// Resolves the archive's links (and, when the archive adds or replaces links, the
    /// workspace's) through the links of both, as they will be after the upload.
    pub(super) fn check_links(&self, ws: &Workspace, needs: &Needs) -> Result<()> {
        let after = |path: &[u8]| -> std::result::Result<Found, JailError> {
            match self.nodes.get(path) {
                Some(Node::Symlink(t)) => Ok(Found::Symlink(t.clone())),
                Some(Node::Dir(_)) => Ok(Found::Dir),
                Some(Node::File { .. }) => Ok(Found::File),
                None => lookup(ws, path),
            }
        };
        for (path, node) in &self.nodes {
            if let Node::Symlink(target) = node
                && escapes(path, target, &after).map_err(jail_error)?
            {
                return Err(refused(format!(
                    "'{}' is a symlink to '{}', which leads out of the workspace through the \
                     links of the archive or the workspace (resolved as the kernel would)",
                    shown(path),
                    shown(target)
                )));
            }
        }
        if !needs.links_changed {
            return Ok(());
        }
        let before = |path: &[u8]| lookup(ws, path);
        for (path, target) in workspace_links(ws).map_err(jail_error)? {
            if self.nodes.contains_key(&path) {
                continue;
            }
            if escapes(&path, &target, &after).map_err(jail_error)?
                && !escapes(&path, &target, &before).map_err(jail_error)?
            {
                return Err(refused(format!(
                    "the archive would make the workspace's symlink '{}' (to '{}') lead out of \
                     the workspace, through the links it adds",
                    shown(&path),
                    shown(&target)
                )));
            }
        }
        Ok(())
    }
}

/// What the archive adds to the workspace's filesystem, counted by the check.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Needs {
    pub blocks_bytes: u64,
    pub inodes: u64,
    /// The archive adds a symlink, or replaces one of the workspace's.
    pub links_changed: bool,
}

impl Needs {
    fn add(&mut self, node: &Node, found: &Found) {
        match node {
            Node::File { size } => {
                self.blocks_bytes += size.div_ceil(BLOCK) * BLOCK;
                self.inodes += 1;
            }
            Node::Symlink(_) => {
                self.links_changed = true;
                self.inodes += 1;
            }
            Node::Dir(_) if *found == Found::Absent => {
                self.blocks_bytes += BLOCK;
                self.inodes += 1;
            }
            Node::Dir(_) => {}
        }
        if matches!(found, Found::Symlink(_)) {
            self.links_changed = true;
        }
    }
}

/// Refuses an archive the workspace's filesystem has no room for, in blocks or in inodes (an
/// ext4 quota of 16 MiB has 4,096 of them: 6,000 empty files do not fit).
pub(super) fn check_disk(ws: &Workspace, needs: &Needs, quota: bool) -> Result<()> {
    let Ok(st) = rustix::fs::statvfs(ws.root_path()) else {
        return Ok(());
    };
    let which = if quota { " (its disk quota)" } else { "" };
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    if needs.blocks_bytes > free {
        return Err(conflict(format!(
            "the archive needs {} bytes on disk and the session's workspace has {free} bytes              free{which}; nothing was written",
            needs.blocks_bytes
        )));
    }
    // Filesystems with no fixed count of inodes report none.
    if st.f_files > 0 && needs.inodes > st.f_favail {
        return Err(conflict(format!(
            "the archive adds {} files, symlinks and directories and the session's workspace              has room for {} more{which}; nothing was written",
            needs.inodes, st.f_favail
        )));
    }
    Ok(())
}

fn describe(found: &Found) -> &'static str {
    match found {
        Found::File => "a file",
        Found::Symlink(_) => "a symlink",
        Found::Other => "a FIFO, socket or device",
        Found::Dir => "a directory",
        Found::Absent => "nothing",
    }
}

fn jail_error(e: JailError) -> EngineError {
    conflict(format!(
        "the workspace could not be checked ({}); nothing was written",
        e.model_message()
    ))
}

/// What `path` is in the workspace now, never following a link: its parents are opened
/// beneath the root with no symlink allowed; a parent that is not a directory means nothing is
/// there.
fn lookup(ws: &Workspace, path: &[u8]) -> std::result::Result<Found, JailError> {
    let (parent, name) = match path.iter().rposition(|b| *b == b'/') {
        Some(cut) => (&path[..cut], &path[cut + 1..]),
        None => (&b""[..], path),
    };
    let dir = match ws.open_dir_exact(parent) {
        Ok(dir) => dir,
        Err(
            JailError::NotFound { .. }
            | JailError::NotADirectory { .. }
            | JailError::SymlinkLoop { .. },
        ) => return Ok(Found::Absent),
        Err(e) => return Err(e),
    };
    let (entry, stat) = match dir.child(name) {
        Ok(found) => found,
        Err(JailError::NotFound { .. } | JailError::NotADirectory { .. }) => {
            return Ok(Found::Absent);
        }
        Err(e) => return Err(e),
    };
    Ok(match stat.kind {
        EntryKind::Dir => Found::Dir,
        EntryKind::File => Found::File,
        EntryKind::Symlink => Found::Symlink(dir.link_target(&entry)?),
        EntryKind::Other => Found::Other,
    })
}

/// A symlink's path and target.
type Link = (Vec<u8>, Vec<u8>);

/// Every symlink of the workspace with its target, walking it without following any.
fn workspace_links(ws: &Workspace) -> std::result::Result<Vec<Link>, JailError> {
    let mut links = Vec::new();
    let mut dirs: Vec<Vec<u8>> = vec![Vec::new()];
    while let Some(path) = dirs.pop() {
        let dir = match ws.open_dir_exact(&path) {
            Ok(dir) => dir,
            // Gone, or replaced, since it was listed.
            Err(
                JailError::NotFound { .. }
                | JailError::NotADirectory { .. }
                | JailError::SymlinkLoop { .. },
            ) => continue,
            Err(e) => return Err(e),
        };
        for entry in dir.entries()? {
            let mut child = path.clone();
            if !child.is_empty() {
                child.push(b'/');
            }
            child.extend_from_slice(entry.name_bytes());
            match entry.kind {
                EntryKind::Dir => dirs.push(child),
                EntryKind::Symlink => {
                    if let Ok(target) = dir.link_target(&entry) {
                        links.push((child, target));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(links)
}

/// Whether the link at `path` to `target` can lead out of the workspace, resolving it component
/// by component with `view` (what a path is): a link is replaced by its target (an absolute one
/// leads out), `..` climbs, and anything else counts as a directory. Past [`MAX_LINK_HOPS`]
/// links the kernel refuses the path (`ELOOP`): it leads nowhere.
fn escapes<E>(
    path: &[u8],
    target: &[u8],
    view: &impl Fn(&[u8]) -> std::result::Result<Found, E>,
) -> std::result::Result<bool, E> {
    if target.is_empty() || target.starts_with(b"/") {
        return Ok(true);
    }
    // The directory the link is in: a real one (the checks above refuse anything else there).
    let mut at: Vec<Vec<u8>> = parents(path)
        .next()
        .filter(|p| !p.is_empty())
        .map(|p| p.split(|b| *b == b'/').map(<[u8]>::to_vec).collect())
        .unwrap_or_default();
    let mut todo: std::collections::VecDeque<Vec<u8>> =
        target.split(|b| *b == b'/').map(<[u8]>::to_vec).collect();
    let mut hops = 0;
    while let Some(comp) = todo.pop_front() {
        match comp.as_slice() {
            b"" | b"." => continue,
            b".." => {
                if at.pop().is_none() {
                    return Ok(true);
                }
                continue;
            }
            _ => {}
        }
        at.push(comp);
        let here = at.join(&b'/');
        if let Found::Symlink(next) = view(&here)? {
            hops += 1;
            if hops > MAX_LINK_HOPS {
                return Ok(false);
            }
            at.pop();
            if next.is_empty() || next.starts_with(b"/") {
                return Ok(true);
            }
            for c in next.split(|b| *b == b'/').rev() {
                todo.push_front(c.to_vec());
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    fn view<'a>(
        links: &'a [(&'a str, &'a str)],
    ) -> impl Fn(&[u8]) -> std::result::Result<Found, Infallible> + 'a {
        move |p: &[u8]| {
            Ok(links
                .iter()
                .find(|(l, _)| l.as_bytes() == p)
                .map_or(Found::Absent, |(_, t)| {
                    Found::Symlink(t.as_bytes().to_vec())
                }))
        }
    }

    fn out(links: &[(&str, &str)], link: &str) -> bool {
        let target = links.iter().find(|(l, _)| *l == link).unwrap().1;
        escapes(link.as_bytes(), target.as_bytes(), &view(links)).unwrap()
    }

    #[test]
    fn a_chain_of_links_that_each_stay_inside_can_climb_out_together() {
        let chain = [("a/b", ".."), ("z", "a/b/..")];
        assert!(!out(&chain, "a/b"));
        assert!(out(&chain, "z"));
        let deeper = [("up", "a/b"), ("a/b", ".."), ("c/d/e", "../../up/..")];
        assert!(out(&deeper, "c/d/e"));
        assert!(!out(&deeper, "up"));
        let absolute = [("w", "/etc"), ("z", "w/passwd")];
        assert!(out(&absolute, "z"));
    }

    #[test]
    fn chains_that_stay_inside_and_loops_do_not_escape() {
        let inside = [
            ("p/to-c", "../c"),
            ("via", "p/to-c/x"),
            ("a/b", ".."),
            ("root-again", "a/b/c"),
        ];
        for l in ["p/to-c", "via", "root-again", "a/b"] {
            assert!(!out(&inside, l), "{l}");
        }
        let looping = [("l1", "l2"), ("l2", "l1"), ("l3", "l1/../..")];
        assert!(!out(&looping, "l1"));
        assert!(!out(&looping, "l3"));
    }

    #[test]
    fn parents_are_listed_deepest_first() {
        let p: Vec<&[u8]> = parents(b"a/b/c").collect();
        assert_eq!(p, [&b"a/b"[..], b"a"]);
        assert_eq!(parents(b"a").count(), 0);
    }
}
