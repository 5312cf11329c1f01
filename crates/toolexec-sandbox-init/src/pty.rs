//! A pseudo-terminal made inside the sandbox, for `exec_command` with `tty: true`: the spare
//! opens the sandbox's own `/dev/ptmx` (a link to the `ptmx` of the devpts instance mounted at
//! `/dev/pts` when the root was built), hands the master to the service and keeps the slave as
//! the command's stdio. Nothing of the host's devpts is used: the slave is `/dev/pts/N` of the
//! sandbox's instance, which holds only the session's terminals.
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// Opens a `cols`×`rows` terminal, passes its master to `hand_over` (then closes it here) and
/// returns its slave (close-on-exec: the caller moves it onto the command's stdio).
pub fn open_in_sandbox(
    cols: u16,
    rows: u16,
    hand_over: impl FnOnce(BorrowedFd<'_>) -> Result<(), String>,
) -> Result<OwnedFd, String> {
    // SAFETY: open with a valid C string; the descriptor is owned at once.
    let master = unsafe {
        let fd = libc::open(
            c"/dev/ptmx".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(os_err(
                "opening /dev/ptmx (the sandbox's own devpts instance)",
            ));
        }
        OwnedFd::from_raw_fd(fd)
    };
    let m = master.as_fd();
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let unlock: libc::c_int = 0;
    // SAFETY: ioctls on our own master with pointers to live values of the types they take.
    let slave = unsafe {
        use std::os::fd::AsRawFd;
        if libc::ioctl(m.as_raw_fd(), libc::TIOCSPTLCK, &unlock) < 0 {
            return Err(os_err("unlocking the terminal"));
        }
        if libc::ioctl(m.as_raw_fd(), libc::TIOCSWINSZ, &size) < 0 {
            return Err(os_err("sizing the terminal"));
        }
        // The slave of this very master, without a lookup by name.
        let fd = libc::ioctl(
            m.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(os_err("opening the terminal's slave (TIOCGPTPEER)"));
        }
        OwnedFd::from_raw_fd(fd)
    };
    hand_over(m)?;
    drop(master);
    Ok(slave)
}
