//! The multi-host backend: the encoded map under one etcd key, changed by an etcd transaction
//! that compares the stored value (or its absence) and puts the new one.

use crate::etcd_client::{Compare, Etcd, Put};
use crate::{check_swap, decode, MapStore, MapStoreError};
use carmine_cluster::OsdMap;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct EtcdMapStore {
    etcd: Etcd,
    cluster: String,
    key: String,
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

impl MapStore for EtcdMapStore {
    fn get(&self) -> Result<Option<OsdMap>, MapStoreError> {
        self.etcd.get(&self.key)?.0.map(decode).transpose()
    }

    fn swap(&self, expected: Option<&OsdMap>, new: &OsdMap) -> Result<(), MapStoreError> {
        self.swap_guarded(expected, new, &[])
    }

    fn wait_newer(&self, epoch: u32, timeout: Duration) -> Result<Option<OsdMap>, MapStoreError> {
        let start = Instant::now();
        let (raw, mut revision) = self.etcd.get(&self.key)?;
        if let Some(m) = raw.map(decode).transpose()? {
            if m.epoch > epoch {
                return Ok(Some(m));
            }
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
                    return Ok(Some(m));
                }
            }
            // Nothing newer: read again, then watch from there.
            let (raw, now) = self.etcd.get(&self.key)?;
            if let Some(m) = raw.map(decode).transpose()? {
                if m.epoch > epoch {
                    return Ok(Some(m));
                }
            }
            revision = now;
        }
    }
}
