//! One download per digest across the processes that share a cache (two services on one data
//! folder, `toolexec images pull` beside the service): a pull holds an exclusive `flock` on the
//! digest's file in `locks/` while it downloads and unpacks; another process's pull of the same
//! digest waits for it, then finds the image in place. Within a process, pulls of one digest
//! share one future first (the store's `inflight`), so only one of them waits here.
//!
//! The files stay (empty, one per digest ever pulled): removing one while another process may
//! be about to lock it would let two pulls hold "the" lock on two different files.
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use rustix::fs::{FlockOperation, Mode, OFlags};

use crate::{ImageError, io};

/// How often a pull waiting for another process's tries the lock again.
const RETRY: Duration = Duration::from_millis(50);

/// The exclusive lock of the digest whose hex is `hex`, in the cache's `locks/` folder: waits
/// (asynchronously, so that the pull's deadline and its caller's giving up still apply) while
/// another process holds it. Released when the descriptor is dropped.
pub(crate) async fn exclusive(locks: &Path, hex: &str) -> Result<OwnedFd, ImageError> {
    let path = locks.join(hex);
    let fd = rustix::fs::open(
        &path,
        OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| io(&path, e))?;
    loop {
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(fd),
            Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {
                tokio::time::sleep(RETRY).await;
            }
            Err(e) => return Err(io(&path, e)),
        }
    }
}
