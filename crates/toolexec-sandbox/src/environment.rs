//! A session's image: the unpacked tree of an OCI image (from `toolexec-image`'s cache) that
//! stands for the host's `/usr` and `/etc` in each of the session's sandboxes.
//!
//! The cache is beneath the workspace root (`<workspace_root>/.images`), and the init reaches
//! the tree the way it reaches a workspace: by a path beneath the directory the service passes
//! it, after entering the sandbox's mount namespace (where a bind needs its source), so the
//! sandbox user needs no search permission on the data folder above. The init binds each of the
//! tree's top-level entries read-only, `nosuid,nodev`: every sandbox on one image shares the one
//! copy on disk.
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// The image a session runs in.
#[derive(Debug)]
pub struct SessionImage {
    /// The unpacked tree (beneath the workspace root).
    pub(crate) rootfs: PathBuf,
    /// The image config's `Env`, `NAME=value` (applied after the sandbox's base environment,
    /// before the session's `env`).
    pub(crate) env: Vec<(String, String)>,
    /// `/bin/bash` when the image has it, `/bin/sh` otherwise: the shell of `shell` commands.
    pub(crate) shell: &'static str,
    /// The manifest digest, for messages.
    pub digest: String,
    /// What keeps the tree in the cache while the session runs in it (the cache's lease).
    hold: Option<Hold>,
}

/// Something held for as long as the image is (its lease in the cache), opaque here.
struct Hold(
    #[expect(dead_code, reason = "held for its drop: the lease ends with the image")]
    Box<dyn std::any::Any + Send + Sync>,
);

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hold")
    }
}

impl SessionImage {
    /// Opens the tree at `rootfs` with the config's `Env` (entries without `=` are ignored).
    pub fn open(rootfs: &Path, env: &[String], digest: &str) -> std::io::Result<Self> {
        let root = rustix::fs::open(
            rootfs,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        // Resolved as the sandbox will (links relative to the image's root, `/bin` often one),
        // never through a link to the host's own files.
        let has = |path: &str| {
            rustix::fs::openat2(
                &root,
                path,
                OFlags::PATH | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
            )
            .and_then(|fd| rustix::fs::fstat(&fd))
            .is_ok_and(|st| {
                rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
            })
        };
        let shell = if has("bin/bash") {
            "/bin/bash"
        } else {
            "/bin/sh"
        };
        let env = env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .filter(|(k, _)| !k.is_empty())
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        drop(root);
        Ok(Self {
            rootfs: rootfs.to_path_buf(),
            env,
            shell,
            digest: digest.to_owned(),
            hold: None,
        })
    }

    /// This image, keeping `hold` (the cache's lease on the tree) for as long as it lives.
    pub fn holding(mut self, hold: impl Send + Sync + 'static) -> Self {
        self.hold = Some(Hold(Box::new(hold)));
        self
    }

    /// The shell `shell` commands run with (`/bin/bash`, or `/bin/sh` in an image without it).
    pub fn shell(&self) -> &'static str {
        self.shell
    }
}
