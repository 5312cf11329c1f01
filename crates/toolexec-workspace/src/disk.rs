//! A session's disk quota: its workspace is a filesystem of its own, an ext4 image of the
//! quota's size mounted through a loop device, so a write past the quota fails with `ENOSPC`
//! as it happens (the kernel refuses the block), from a command or from a file tool alike.
//!
//! Why this and not another mechanism:
//! - `RLIMIT_FSIZE` bounds one file, not the sum: `for i in $(seq 1000); do head -c 1G …` fills
//!   the disk;
//! - project quotas (ext4 `prjquota`, XFS `pquota`) need the host filesystem formatted and
//!   mounted for them, which an operator cannot change per deployment (not here either);
//! - a size-capped tmpfs counts against memory, and a node holds far more workspace than RAM;
//! - measuring after a command (`du`) is too late: the disk is full by then.
//!
//! The image is sparse: it takes on the host what the session wrote (plus ~1 MiB of metadata),
//! not its quota. Made with `mkfs.ext4` (no journal: a workspace is rebuilt from the log after a
//! crash, it needs no crash consistency of its own) and mounted with `mount -o loop` (util-linux
//! sets `LO_FLAGS_AUTOCLEAR`: the loop device is released with the last unmount), both run by the
//! service, which must be root for this. The images live in `.disks/` (mode 0700: the sandbox
//! user cannot reach them, so a command never touches the filesystem's raw bytes).
//!
//! Layout: `.disks/<session>.img`, mounted on the workspace directory itself (`<session>/`), or
//! for a fork on layers, on `.disks/<session>.fs`, which holds the overlay's upper and work
//! directories (the fork's own writes are what counts; its base is shared).
#![allow(
    clippy::disallowed_methods,
    reason = "this module manages the service's own images and mount points, never a path a model named"
)]
use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

/// The smallest quota that can hold an ext4 filesystem with room to work in.
pub const MIN_DISK_BYTES: u64 = 8 << 20;

/// Per-session filesystems of `bytes` each, their images beneath `dir`.
#[derive(Debug, Clone)]
pub struct Disks {
    dir: PathBuf,
    bytes: u64,
    owner: (u32, u32),
    mounted: Arc<Mounted>,
}

/// The disks this process mounted: unmounted when the last [`Disks`] goes (a service that stops
/// leaves no mount behind; one killed leaves them to its successor, which finds them mounted
/// and uses them as they are — never a second mount of one image).
#[derive(Debug, Default)]
struct Mounted(Mutex<HashSet<PathBuf>>, Mutex<()>);

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Ok(targets) = self.0.lock() {
            for target in targets.iter() {
                let _ = rustix::mount::unmount(target, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }
}

impl Disks {
    /// Disks of `bytes` beneath `<root>/.disks`, their root directories owned by `owner`.
    /// Checks that one can be made and mounted here (root, `mkfs.ext4`, loop devices): a quota
    /// the operator asked for that cannot be enforced is an error, never a silent no-op.
    pub fn new(root: &Path, bytes: u64, owner: (u32, u32)) -> io::Result<Self> {
        if bytes < MIN_DISK_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a session disk quota of {bytes} bytes is below the minimum of {MIN_DISK_BYTES} (8 MiB)"
                ),
            ));
        }
        if !rustix::process::geteuid().is_root() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "a session disk quota needs the service to run as root (it mounts each session's \
                 filesystem through a loop device)",
            ));
        }
        let dir = root.join(".disks");
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let disks = Self {
            dir,
            bytes,
            owner,
            mounted: Arc::default(),
        };
        disks.sweep(root);
        disks.probe().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot enforce a session disk quota here ({e}); it needs mkfs.ext4 \
                     (e2fsprogs), mount (util-linux) and loop devices (/dev/loop-control)"
                ),
            )
        })?;
        Ok(disks)
    }

    /// Each session's quota, bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn image(&self, session: &str) -> PathBuf {
        self.dir.join(format!("{session}.img"))
    }

    /// Where a fork's disk is mounted (its overlay's upper and work directories are in it).
    pub(crate) fn fork_mount(&self, session: &str) -> PathBuf {
        self.dir.join(format!("{session}.fs"))
    }

    /// Whether `session` has a disk (made before, maybe not mounted in this process).
    pub fn has(&self, session: &str) -> bool {
        self.image(session).is_file()
    }

    /// Makes the disk of `session` and mounts it on `target` (an empty directory, created if
    /// missing). Refused when the node's filesystem has less free space than one quota: a
    /// session must be able to use what it was promised.
    pub fn make(&self, session: &str, target: &Path) -> io::Result<()> {
        let free = rustix::fs::statvfs(&self.dir)
            .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
            .map_err(io::Error::from)?;
        if free < self.bytes {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!(
                    "this node's disk has {free} bytes free, less than one session's quota of {} bytes",
                    self.bytes
                ),
            ));
        }
        let image = self.image(session);
        let made = (|| {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&image)?;
            file.set_len(self.bytes)?;
            drop(file);
            let (uid, gid) = self.owner;
            run(Command::new(program("mkfs.ext4"))
                .args(["-q", "-F", "-m", "0", "-O", "^has_journal", "-E"])
                .arg(format!(
                    "root_owner={uid}:{gid},lazy_itable_init=1,nodiscard"
                ))
                .arg(&image))?;
            match std::fs::create_dir(target) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            self.mount(session, target)?;
            // mkfs leaves lost+found (root's, 0700): not the model's, and only fsck uses it.
            std::fs::remove_dir(target.join("lost+found"))?;
            Ok(())
        })();
        if made.is_err() {
            self.release(session, target);
        }
        made
    }

    /// Mounts the disk of `session` on `target` unless something is mounted there already.
    /// One check-and-mount at a time in this process: two calls racing to open a session after
    /// a restart must not mount its image twice (two ext4 instances over one image corrupt it).
    pub fn mount(&self, session: &str, target: &Path) -> io::Result<()> {
        let _one = self
            .mounted
            .1
            .lock()
            .map_err(|_| io::Error::other("the disk mount lock is poisoned"))?;
        if is_mount_point(target) {
            return Ok(());
        }
        run(Command::new(program("mount"))
            .args(["-t", "ext4", "-o", "loop,nosuid,nodev,noatime"])
            .arg(self.image(session))
            .arg(target))?;
        if let Ok(mut m) = self.mounted.0.lock() {
            m.insert(target.to_path_buf());
        }
        Ok(())
    }

    /// Unmounts the disk of `session` from `target` (lazily: a process still in it keeps it
    /// until it leaves) and deletes its image.
    pub fn release(&self, session: &str, target: &Path) {
        if is_mount_point(target)
            && let Err(e) = rustix::mount::unmount(target, rustix::mount::UnmountFlags::DETACH)
        {
            tracing::warn!(dir = %target.display(), error = %e, "could not unmount a session's disk");
        }
        if let Ok(mut m) = self.mounted.0.lock() {
            m.remove(target);
        }
        if let Err(e) = std::fs::remove_file(self.image(session))
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(session, error = %e, "could not remove a session's disk image");
        }
    }

    /// Images a crashed service left without a session (made, then the session's record was
    /// never written), an hour old: removed.
    fn sweep(&self, root: &Path) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(session) = name.strip_suffix(".img") else {
                continue;
            };
            if crate::lifecycle::is_stale(&entry)
                && !root.join(session).exists()
                && !self.fork_mount(session).exists()
            {
                tracing::info!(session, "removing a disk image no session uses");
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// Makes, mounts, writes past and removes a small disk.
    fn probe(&self) -> io::Result<()> {
        let name = format!("probe-{}", uuid::Uuid::new_v4().simple());
        let target = self.dir.join(format!("{name}.mnt"));
        let small = Self {
            bytes: MIN_DISK_BYTES,
            mounted: Arc::default(),
            ..self.clone()
        };
        let result = small.make(&name, &target).and_then(|()| {
            if is_mount_point(&target) {
                Ok(())
            } else {
                Err(io::Error::other("the probe disk did not mount"))
            }
        });
        small.release(&name, &target);
        let _ = std::fs::remove_dir(&target);
        result
    }
}

/// Whether `dir` is the root of a mount (its device differs from its parent's).
pub(crate) fn is_mount_point(dir: &Path) -> bool {
    let (Ok(me), Some(Ok(parent))) = (
        std::fs::symlink_metadata(dir),
        dir.parent().map(std::fs::symlink_metadata),
    ) else {
        return false;
    };
    me.is_dir() && (me.dev() != parent.dev() || me.ino() == parent.ino())
}

/// `name` from `PATH`, else from the system directories a service's `PATH` often lacks
/// (`/usr/sbin`, `/sbin`: where e2fsprogs and util-linux install them).
fn program(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

fn run(command: &mut Command) -> io::Result<()> {
    let program = command.get_program().to_string_lossy().into_owned();
    let out = command
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("{program}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "{program} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests look at the result on the host"
)]
mod tests {
    use super::*;
    use std::io::Write;

    fn disks(bytes: u64) -> Option<(tempfile::TempDir, Disks)> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("not root: the disk quota needs root; tested by the e2e suite as root");
            return None;
        }
        let root = tempfile::tempdir().unwrap();
        let d = Disks::new(root.path(), bytes, (0, 0)).unwrap();
        Some((root, d))
    }

    #[test]
    fn a_write_past_the_quota_fails_as_it_happens_and_the_host_keeps_its_space() {
        let Some((root, d)) = disks(16 << 20) else {
            return;
        };
        let target = root.path().join("s1");
        d.make("s1", &target).unwrap();
        assert!(is_mount_point(&target));
        assert_eq!(
            std::fs::read_dir(&target).unwrap().count(),
            0,
            "no lost+found"
        );
        let mut f = std::fs::File::create(target.join("big")).unwrap();
        let chunk = vec![7u8; 1 << 20];
        let mut written = 0u64;
        let err = loop {
            match f.write_all(&chunk).and_then(|()| f.sync_data()) {
                Ok(()) => written += chunk.len() as u64,
                Err(e) => break e,
            }
            assert!(
                written <= 16 << 20,
                "wrote {written} bytes into a 16 MiB disk"
            );
        };
        assert_eq!(err.raw_os_error(), Some(libc_enospc()), "{err}");
        assert!(written >= 8 << 20, "only {written} bytes fit");
        // The image on the host is no bigger than the quota.
        let image = std::fs::metadata(d.image("s1")).unwrap();
        assert!(image.blocks() * 512 <= 16 << 20);
        drop(f);
        d.release("s1", &target);
        assert!(!is_mount_point(&target));
        assert!(!d.has("s1"));
    }

    #[test]
    fn a_quota_below_the_minimum_is_refused_with_the_reason() {
        let root = tempfile::tempdir().unwrap();
        let err = Disks::new(root.path(), 1 << 20, (0, 0)).unwrap_err();
        assert!(err.to_string().contains("minimum"), "{err}");
    }

    fn libc_enospc() -> i32 {
        rustix::io::Errno::NOSPC.raw_os_error()
    }
}
