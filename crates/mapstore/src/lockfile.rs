//! An exclusive `flock` on a lock file, held while the returned file is open: how the one-host
//! backends serialize their read-modify-writes across processes.

use crate::MapStoreError;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Opens (creating) `path` and takes an exclusive `flock` on it, waiting for the holder.
pub(crate) fn lock_exclusive(path: &Path) -> Result<File, MapStoreError> {
    let io = |e: std::io::Error| MapStoreError::Unavailable(format!("{}: {e}", path.display()));
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io)?;
    // SAFETY: flock on a descriptor we own; released when `f` is closed.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    Ok(f)
}
