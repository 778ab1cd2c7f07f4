//! The longest read lease an OSD's recent runs may have granted (decision 0009): promises are
//! kept in memory, so a restarted OSD takes its predecessor's to run a lease past its own
//! start — which lease must be the predecessor's if that was longer (`--read-lease` shortened
//! across a restart). Kept beside the map: a file in the cluster directory, or a key in etcd.

use crate::etcd_client::{Etcd, Put};
use crate::{keys, MapStoreError};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn io(path: &Path, e: std::io::Error) -> MapStoreError {
    MapStoreError::Unavailable(format!("{}: {e}", path.display()))
}

/// Where one OSD's record lives.
pub enum ReadLeaseRecord {
    File(PathBuf),
    Etcd { etcd: Etcd, key: String },
}

impl ReadLeaseRecord {
    /// Beside a map file in `dir`.
    pub fn local(dir: &Path, osd: u32) -> Self {
        ReadLeaseRecord::File(dir.join(format!("osd.{osd}.read-lease")))
    }

    pub fn etcd(etcd: Etcd, cluster: &str, osd: u32) -> Self {
        ReadLeaseRecord::Etcd {
            etcd,
            key: keys::read_lease(cluster, osd),
        }
    }

    /// The lease recorded (`None`: none yet).
    pub fn get(&self) -> Result<Option<Duration>, MapStoreError> {
        let raw = match self {
            ReadLeaseRecord::File(path) => match std::fs::read(path) {
                Ok(b) => Some(b),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(io(path, e)),
            },
            ReadLeaseRecord::Etcd { etcd, key } => etcd.get(key)?.0,
        };
        raw.map(|b| {
            std::str::from_utf8(&b)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .map(Duration::from_nanos)
                .ok_or_else(|| {
                    MapStoreError::Invalid("the read lease record is not a number".into())
                })
        })
        .transpose()
    }

    /// Records `lease`, durably.
    pub fn set(&self, lease: Duration) -> Result<(), MapStoreError> {
        let text = lease.as_nanos().to_string();
        match self {
            ReadLeaseRecord::File(path) => {
                use std::io::Write;
                let tmp = path.with_extension("read-lease.tmp");
                let mut f = std::fs::File::create(&tmp).map_err(|e| io(&tmp, e))?;
                f.write_all(text.as_bytes()).map_err(|e| io(&tmp, e))?;
                f.sync_all().map_err(|e| io(&tmp, e))?;
                std::fs::rename(&tmp, path).map_err(|e| io(path, e))?;
                if let Some(dir) = path.parent() {
                    std::fs::File::open(dir)
                        .and_then(|d| d.sync_all())
                        .map_err(|e| io(dir, e))?;
                }
                Ok(())
            }
            ReadLeaseRecord::Etcd { etcd, key } => {
                let put = Put::Put {
                    key,
                    value: text.as_bytes(),
                    lease: 0,
                };
                etcd.txn(&[], std::slice::from_ref(&put)).map(|_| ())
            }
        }
    }

    /// At an OSD's start with `lease`: the longest lease its earlier runs may still have
    /// promises under (at least `lease`), recorded before the OSD serves. The caller records
    /// `lease` alone once that much time has passed since the start (their promises are over).
    pub fn starting(&self, lease: Duration) -> Result<Duration, MapStoreError> {
        let recorded = self.get()?;
        let longest = recorded.map_or(lease, |earlier| earlier.max(lease));
        if recorded != Some(longest) {
            self.set(longest)?;
        }
        Ok(longest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_recent_lease_is_kept_until_the_osd_says_otherwise() {
        let dir = std::env::temp_dir().join(format!("carmine-lease-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let r = ReadLeaseRecord::local(&dir, 3);
        assert_eq!(r.get().unwrap(), None);
        let s = Duration::from_secs;
        assert_eq!(r.starting(s(10)).unwrap(), s(10));
        // Restarted with a shorter lease: the earlier, longer one still binds.
        assert_eq!(r.starting(s(2)).unwrap(), s(10));
        assert_eq!(r.get().unwrap(), Some(s(10)));
        // Once the old promises are over, the OSD records its own.
        r.set(s(2)).unwrap();
        assert_eq!(r.starting(s(2)).unwrap(), s(2));
        std::fs::write(dir.join("osd.3.read-lease"), "garbage").unwrap();
        assert!(
            r.get().is_err(),
            "a damaged record is an error, not a default"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
