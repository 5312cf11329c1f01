//! The init program the service execs for every command: the static build of
//! `toolexec-sandbox-init` embedded in this crate (see build.rs), or a file the operator names
//! (`sandbox.init`), copied into a sealed memfd at start-up.
//!
//! A sealed memfd cannot be changed by anyone (root included) once sealed, has no path a
//! sandbox user could reach or replace, and shows as `/memfd:…` rather than a host path in
//! `/proc/1/exe`. Commands exec it through `/proc/self/fd/N`, so the sandbox user needs no
//! search permission on any directory to start it. Whatever it is loaded from must be a
//! statically linked executable: one with a program interpreter (the dynamic loader) is refused,
//! because the loader would run before the sandbox exists.
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{MemfdFlags, Mode, OFlags, SealFlags};

/// The static init built by build.rs.
static EMBEDDED: &[u8] = include_bytes!(env!("TOOLEXEC_STATIC_INIT"));

/// The init, ready to be exec'd.
#[derive(Debug)]
pub(crate) struct InitImage {
    /// Read-only descriptor of the sealed memfd (a writable descriptor would make `exec` fail
    /// with `ETXTBSY`).
    file: File,
    /// Where it came from, for messages.
    pub origin: String,
}

impl InitImage {
    /// The embedded static init, or the operator's file when one is configured.
    pub fn load(configured: Option<&Path>) -> Result<Self, String> {
        match configured {
            None => Self::from_bytes(EMBEDDED, "the embedded static init".into()),
            Some(path) => {
                let bytes = std::fs::read(path).map_err(|e| {
                    format!("the sandbox init {} cannot be read: {e}", path.display())
                })?;
                Self::from_bytes(&bytes, path.display().to_string())
            }
        }
    }

    fn from_bytes(bytes: &[u8], origin: String) -> Result<Self, String> {
        check_static_elf(bytes).map_err(|e| format!("{origin}: {e}"))?;
        let sealed = sealed_memfd("toolexec-sandbox-init", bytes, true)
            .map_err(|e| format!("{origin}: cannot load it into a sealed memfd: {e}"))?;
        Ok(Self {
            file: sealed,
            origin,
        })
    }

    /// What to exec: `/proc/self/fd/N` of the sealed copy.
    pub fn exec_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// A memfd holding `bytes`, sealed against every change, reopened read-only (`exec` refuses a
/// file that is open for writing). `executable`: created with `MFD_EXEC` where the kernel knows
/// it (6.3+, where `vm.memfd_noexec` may otherwise make memfds non-executable).
pub(crate) fn sealed_memfd(name: &str, bytes: &[u8], executable: bool) -> io::Result<File> {
    let fd = memfd(name, executable)?;
    let mut file = File::from(fd);
    file.write_all(bytes)?;
    rustix::fs::fcntl_add_seals(
        &file,
        SealFlags::SEAL | SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE,
    )?;
    let reopened = rustix::fs::open(
        format!("/proc/self/fd/{}", file.as_fd().as_raw_fd()),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(File::from(reopened))
}

/// A memfd for a command's spec: read once by the init, from offset 0.
pub(crate) fn spec_memfd(bytes: &[u8]) -> io::Result<File> {
    use std::io::Seek;
    let mut file = File::from(memfd("toolexec-sandbox-spec", false)?);
    file.write_all(bytes)?;
    file.rewind()?;
    Ok(file)
}

fn memfd(name: &str, executable: bool) -> io::Result<OwnedFd> {
    let base = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    let extra = if executable {
        MemfdFlags::EXEC
    } else {
        MemfdFlags::NOEXEC_SEAL
    };
    match rustix::fs::memfd_create(name, base | extra) {
        Ok(fd) => Ok(fd),
        // Before Linux 6.3 neither flag exists; memfds are executable there.
        Err(rustix::io::Errno::INVAL) => Ok(rustix::fs::memfd_create(name, base)?),
        Err(e) => Err(e.into()),
    }
}

/// Refuses anything but a 64-bit little-endian ELF executable without a program interpreter
/// (`PT_INTERP`): a dynamically linked init would run the dynamic loader, and with it whatever
/// the loader is told to load, before the sandbox exists.
pub(crate) fn check_static_elf(bytes: &[u8]) -> Result<(), String> {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        bytes
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        bytes
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        bytes.get(at..at + 8).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        })
    };
    if bytes.get(..4) != Some(b"\x7fELF".as_slice())
        || bytes.get(4) != Some(&2)
        || bytes.get(5) != Some(&1)
    {
        return Err("not a 64-bit little-endian ELF executable".into());
    }
    let malformed = || "a malformed ELF header".to_string();
    let phoff = usize::try_from(u64_at(0x20).ok_or_else(malformed)?).map_err(|_| malformed())?;
    let phentsize = usize::from(u16_at(0x36).ok_or_else(malformed)?);
    let phnum = usize::from(u16_at(0x38).ok_or_else(malformed)?);
    if phentsize < 4 {
        return Err(malformed());
    }
    for i in 0..phnum {
        let at = phoff
            .checked_add(i.checked_mul(phentsize).ok_or_else(malformed)?)
            .ok_or_else(malformed)?;
        if u32_at(at).ok_or_else(malformed)? == PT_INTERP {
            return Err(
                "dynamically linked (it has a program interpreter); the sandbox init must be a static executable — build it with `-C target-feature=+crt-static`, or leave sandbox.init unset to use the one built into toolexec"
                    .into(),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_embedded_init_is_a_static_executable() {
        check_static_elf(EMBEDDED).unwrap();
    }

    #[test]
    fn a_dynamically_linked_program_is_refused_as_the_init() {
        let bash = std::fs::read("/bin/bash").unwrap();
        let err = check_static_elf(&bash).unwrap_err();
        assert!(err.contains("dynamically linked"), "{err}");
        assert!(InitImage::load(Some(Path::new("/bin/bash"))).is_err());
        assert!(check_static_elf(b"#!/bin/sh\necho hi\n").is_err());
        assert!(check_static_elf(&EMBEDDED[..40]).is_err());
    }

    #[test]
    fn the_loaded_init_cannot_be_changed() {
        let image = InitImage::load(None).unwrap();
        // Neither through a new writable open nor by growing or shrinking it.
        let reopened = std::fs::OpenOptions::new()
            .write(true)
            .open(image.exec_path());
        match reopened {
            Err(_) => {}
            Ok(mut f) => assert!(f.write_all(b"x").is_err()),
        }
        let meta = std::fs::metadata(image.exec_path()).unwrap();
        assert_eq!(meta.len(), EMBEDDED.len() as u64);
    }
}
