//! The multi-host backend: the encoded map under one etcd key, changed by an etcd transaction
//! that compares the stored value (or its absence) and puts the new one.

use crate::etcd_client::{Compare, Etcd, Put};
use crate::{check_swap, decode, MapStore, MapStoreError};
use carmine_cluster::OsdMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A waiter at most this many epochs behind is handed every epoch in turn; one further
/// behind gets the newest (its PGs peer again, as after any missed epoch).
pub const REPLAY_EPOCHS_MAX: u32 = 64;
/// How long a replay of the map's history may take before the newest map is taken instead
/// (etcd answers a watch from a past revision at once, unless it compacted it away).
const REPLAY_WAIT: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct EtcdMapStore {
    etcd: Etcd,
    cluster: String,
    key: String,
    /// The epoch of the last map read or handed to a waiter, and the revision that stored
    /// it: where a waiter that fell behind replays the map's history from.
    seen: Arc<Mutex<Option<(u32, i64)>>>,
}

impl EtcdMapStore {
    /// The map of cluster `cluster` in the etcd reachable at `endpoints` (`http://host:port`).
    pub fn new(endpoints: &[String], cluster: &str) -> Result<Self, MapStoreError> {
        Self::with_access(endpoints, &crate::EtcdAccess::default(), cluster)
    }

    /// Like [`EtcdMapStore::new`], over TLS and with etcd auth as `access` says.
    pub fn with_access(
        endpoints: &[String],
        access: &crate::EtcdAccess,
        cluster: &str,
    ) -> Result<Self, MapStoreError> {
        Ok(Self {
            etcd: Etcd::with_access(endpoints, access)?,
            cluster: cluster.to_owned(),
            key: crate::keys::map(cluster),
            seen: Arc::new(Mutex::new(None)),
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn etcd(&self) -> &Etcd {
        &self.etcd
    }

    /// Stores the cluster key (hex) under the cluster, unless one is there already; returns
    /// whether the stored key is `hex` (false: another key is stored, which is left alone).
    pub fn publish_key(&self, hex: &str) -> Result<bool, MapStoreError> {
        let key = crate::keys::cluster_key(self.cluster());
        let put = Put::Put {
            key: &key,
            value: hex.as_bytes(),
            lease: 0,
        };
        if self.etcd.txn(&[Compare::Absent(&key)], &[put])? {
            return Ok(true);
        }
        Ok(self.stored_key()?.as_deref() == Some(hex))
    }

    /// The cluster key stored in etcd (hex), if any.
    pub fn stored_key(&self) -> Result<Option<String>, MapStoreError> {
        let key = crate::keys::cluster_key(self.cluster());
        Ok(self
            .etcd
            .get(&key)?
            .0
            .map(|v| String::from_utf8_lossy(&v).trim().to_owned()))
    }

    /// The cluster's name (the `<c>` of `/carmine/<c>/`).
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// Like [`MapStore::swap`], but only while every one of `guards` holds too, in the same
    /// transaction: a manager's change goes through only while it still holds the leader key,
    /// so a deposed leader that has not noticed yet cannot commit an epoch.
    pub fn swap_guarded(
        &self,
        expected: Option<&OsdMap>,
        new: &OsdMap,
        guards: &[Compare<'_>],
    ) -> Result<(), MapStoreError> {
        check_swap(expected, new)?;
        let value = new.encode();
        let mut old: Option<Vec<u8>> = expected.map(|m| m.encode().to_vec());
        // At most twice: the stored bytes may be an older format's encoding of the very map
        // expected (the compare is on bytes); then once more against those exact bytes.
        for _ in 0..2 {
            let mut compares = vec![match &old {
                None => Compare::Absent(&self.key),
                Some(v) => Compare::Value(&self.key, v),
            }];
            compares.extend(guards.iter().copied());
            let put = Put::Put {
                key: &self.key,
                value: &value,
                lease: 0,
            };
            if self.etcd.txn(&compares, &[put])? {
                return Ok(());
            }
            let raw = self.etcd.get(&self.key)?.0;
            let current = raw.clone().map(decode).transpose()?;
            if current.as_ref() != expected {
                return Err(MapStoreError::Conflict {
                    current: current.map(Box::new),
                });
            }
            if raw == old {
                // The map is as expected, byte for byte: a guard failed.
                return Err(MapStoreError::Deposed);
            }
            old = raw;
        }
        Err(MapStoreError::Deposed)
    }
}

impl EtcdMapStore {
    fn remember(&self, epoch: u32, revision: i64) {
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = Some((epoch, revision));
    }

    /// The stored map, if newer than `epoch`: the one right after `epoch` if the key's
    /// history still has it and it is not too far back (and `left` leaves time to fetch
    /// it), else the newest.
    fn newer_stored(
        &self,
        epoch: u32,
        left: Duration,
    ) -> Result<(Option<OsdMap>, i64), MapStoreError> {
        let (kv, revision) = self.etcd.get_kv(&self.key)?;
        let Some(kv) = kv else {
            return Ok((None, revision));
        };
        let newest = decode(kv.value)?;
        if newest.epoch <= epoch {
            return Ok((None, revision));
        }
        if newest.epoch > epoch + 1 {
            if let Some(next) = self.replay_after(epoch, newest.epoch, left) {
                return Ok((Some(next), revision));
            }
        }
        self.remember(newest.epoch, kv.mod_revision);
        Ok((Some(newest), revision))
    }

    /// The map stored right after the one of `epoch`, from the key's history: an OSD that
    /// skips an epoch cannot tell whether a PG's acting set changed in it, and peers every
    /// PG again (Ceph's OSDs fetch every epoch they missed, too). `None` if it is not at
    /// hand: `epoch` is not the last map this store saw, it is more than
    /// [`REPLAY_EPOCHS_MAX`] behind `newest`, or etcd compacted the history.
    fn replay_after(&self, epoch: u32, newest: u32, left: Duration) -> Option<OsdMap> {
        let seen = *self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let (seen_epoch, revision) = seen?;
        let wait = REPLAY_WAIT.min(left);
        if seen_epoch != epoch
            || revision == 0
            || newest - epoch > REPLAY_EPOCHS_MAX
            || wait.is_zero()
        {
            return None;
        }
        let changed = self.etcd.watch(&self.key, false, revision, wait).ok()?;
        for kv in changed {
            if kv.value.is_empty() {
                continue;
            }
            let m = decode(kv.value).ok()?;
            if m.epoch > epoch && m.epoch <= newest {
                self.remember(m.epoch, kv.mod_revision);
                return Some(m);
            }
        }
        None
    }
}

impl MapStore for EtcdMapStore {
    fn get(&self) -> Result<Option<OsdMap>, MapStoreError> {
        let Some(kv) = self.etcd.get_kv(&self.key)?.0 else {
            return Ok(None);
        };
        let m = decode(kv.value)?;
        self.remember(m.epoch, kv.mod_revision);
        Ok(Some(m))
    }

    fn swap(&self, expected: Option<&OsdMap>, new: &OsdMap) -> Result<(), MapStoreError> {
        self.swap_guarded(expected, new, &[])
    }

    /// The next epoch after `epoch` where the key's history has it (see
    /// [`EtcdMapStore::replay_after`]), else the newest.
    fn wait_newer(&self, epoch: u32, timeout: Duration) -> Result<Option<OsdMap>, MapStoreError> {
        let start = Instant::now();
        let (newer, mut revision) = self.newer_stored(epoch, timeout)?;
        if newer.is_some() {
            return Ok(newer);
        }
        // Watch from the next revision: no change between the read and the watch is missed.
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(None);
            }
            let changed = self.etcd.watch(&self.key, false, revision, left)?;
            if changed.is_empty() {
                return Ok(None);
            }
            for kv in changed {
                // A deleted key carries no value: not a map, keep waiting.
                if kv.value.is_empty() {
                    continue;
                }
                let m = decode(kv.value)?;
                if m.epoch > epoch {
                    // The first change after the read: the next epoch.
                    self.remember(m.epoch, kv.mod_revision);
                    return Ok(Some(m));
                }
            }
            // Nothing newer: read again, then watch from there.
            let (newer, now) = self.newer_stored(epoch, timeout.saturating_sub(start.elapsed()))?;
            if newer.is_some() {
                return Ok(newer);
            }
            revision = now;
        }
    }
}
