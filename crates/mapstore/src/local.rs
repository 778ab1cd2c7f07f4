//! The one-host backend: the encoded map in a file, changed under an exclusive `flock` of a
//! lock file beside it and replaced by an atomic rename, so readers see the old map or the new
//! one, never half of one, and a crash never leaves a torn map.

use crate::{check_swap, decode, MapStore, MapStoreError};
use carmine_cluster::OsdMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often `wait_newer` looks at the file.
const POLL: Duration = Duration::from_millis(50);

#[derive(Clone, Debug)]
pub struct LocalMapStore {
    path: PathBuf,
}

impl LocalMapStore {
    /// The map kept in `path` (created by the first swap).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read(&self) -> Result<Option<Vec<u8>>, MapStoreError> {
        match std::fs::read(&self.path) {
            Ok(raw) => Ok(Some(raw)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&self.path, e)),
        }
    }

    /// An exclusive lock held while it lives: one swap at a time, across processes.
    fn lock(&self) -> Result<File, MapStoreError> {
        crate::lockfile::lock_exclusive(&self.path.with_extension("lock"))
    }
}

fn io(path: &Path, e: std::io::Error) -> MapStoreError {
    MapStoreError::Unavailable(format!("{}: {e}", path.display()))
}

impl MapStore for LocalMapStore {
    fn get(&self) -> Result<Option<OsdMap>, MapStoreError> {
        self.read()?.map(decode).transpose()
    }

    fn swap(&self, expected: Option<&OsdMap>, new: &OsdMap) -> Result<(), MapStoreError> {
        check_swap(expected, new)?;
        let _lock = self.lock()?;
        let stored = self.read()?;
        let same = match (&stored, expected) {
            (None, None) => true,
            // By content, not bytes: a map stored in an older format re-encodes differently.
            (Some(raw), Some(m)) => decode(raw.clone())? == *m,
            _ => false,
        };
        if !same {
            return Err(MapStoreError::Conflict {
                current: stored.map(decode).transpose()?.map(Box::new),
            });
        }
        crate::lockfile::replace_durably(&self.path, &new.encode())
    }

    fn wait_newer(&self, epoch: u32, timeout: Duration) -> Result<Option<OsdMap>, MapStoreError> {
        let start = Instant::now();
        loop {
            if let Some(m) = self.get()? {
                if m.epoch > epoch {
                    return Ok(Some(m));
                }
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(None);
            }
            std::thread::sleep(POLL.min(left));
        }
    }
}
