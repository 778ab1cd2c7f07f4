//! The one-host backends' file mechanics: an exclusive `flock` on a lock file (held while the
//! returned file is open) serializes their read-modify-writes across processes, and a
//! durable atomic replace means a reader or a crash sees the old content or the new, never half.

use crate::MapStoreError;
use std::fs::File;
use std::io::Write;
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

/// Replaces `path` with `bytes`: written to a temporary file, synced, renamed over it, and the
/// directory synced (the rename itself is durable once the directory is).
pub(crate) fn replace_durably(path: &Path, bytes: &[u8]) -> Result<(), MapStoreError> {
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    };
    write().map_err(|e| MapStoreError::Unavailable(format!("{}: {e}", path.display())))
}
