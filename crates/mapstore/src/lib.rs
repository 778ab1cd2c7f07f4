//! Where the cluster map lives (issue #11): one small interface, two backends.
//!
//! - [`LocalMapStore`]: a file in the cluster directory, for one host (the embedded default);
//! - [`EtcdMapStore`]: a key in etcd (≥ 3.4), through its JSON gateway, for a cluster that
//!   spans hosts. [`PrivateEtcd`] runs one from `PATH` inside a cluster directory.
//!
//! Every change is a compare-and-swap: [`MapStore::swap`] writes a map only if the stored one
//! is still the map the caller read (or none), and only one epoch further. So two writers never
//! both win, and no epoch number is ever written twice. The calls block: they run on a control
//! thread, never on a reactor (decision 0006).

mod access;
mod etcd;
pub mod etcd_client;
pub mod failure_reports;
pub mod keys;
mod local;
pub mod local_membership;
mod lockfile;
pub mod membership;
mod pg_history;
mod private_etcd;
pub mod read_lease;
mod tls_material;

pub use access::EtcdAccess;
pub use etcd::{EtcdMapStore, REPLAY_EPOCHS_MAX};
pub use local::LocalMapStore;
pub use pg_history::{Change, EtcdPgHistory, LocalPgHistory, PgHistoryStore, Recorded};
pub use private_etcd::PrivateEtcd;

use carmine_cluster::{MapError, OsdMap};
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MapStoreError {
    /// The stored map is not the one the caller expected: someone else changed it first.
    /// `current` is what is stored now (`None`: no map).
    #[error("the map changed meanwhile (now {})", describe(.current))]
    Conflict { current: Option<Box<OsdMap>> },
    /// What is stored does not decode: never overwritten behind the operator's back.
    #[error("the stored map is damaged: {0}")]
    Corrupt(#[source] MapError),
    #[error("invalid map change: {0}")]
    Invalid(String),
    /// A guarded change was refused because its guard no longer holds: the writer is not
    /// the leader any more.
    #[error("refused: this manager is no longer the leader")]
    Deposed,
    /// The backend could not be reached or failed (I/O, etcd down, bad reply).
    #[error("map store unavailable: {0}")]
    Unavailable(String),
    /// This process's registration is no longer its own: another process of the same OSD
    /// holds the key. It must stop serving (two processes must never serve one OSD).
    #[error("{0}")]
    Displaced(String),
    /// A PG's recorded history does not decode: never overwritten (it may name the only OSDs
    /// holding acknowledged writes).
    #[error("the recorded history of pg {pg} is damaged: {source}")]
    DamagedHistory {
        pg: String,
        #[source]
        source: carmine_pg::HistoryError,
    },
}

fn describe(m: &Option<Box<OsdMap>>) -> String {
    match m {
        Some(m) => format!("epoch {}", m.epoch),
        None => "no map".into(),
    }
}

/// The cluster map's home. Implementations are cheap to clone or share per thread.
pub trait MapStore {
    /// The stored map, if any.
    fn get(&self) -> Result<Option<OsdMap>, MapStoreError>;

    /// Stores `new` if the stored map is exactly `expected` (`None`: no map yet). `new` must be
    /// valid and one epoch after `expected` (epoch 1 for the first map).
    fn swap(&self, expected: Option<&OsdMap>, new: &OsdMap) -> Result<(), MapStoreError>;

    /// Waits up to `timeout` for a map of an epoch above `epoch`; `None` if none came. A store
    /// that keeps the map's history (etcd) hands a waiter that fell a few epochs behind the
    /// next one, so that it sees every epoch; others hand the newest.
    fn wait_newer(&self, epoch: u32, timeout: Duration) -> Result<Option<OsdMap>, MapStoreError>;
}

/// The checks every backend applies before a swap.
pub(crate) fn check_swap(expected: Option<&OsdMap>, new: &OsdMap) -> Result<(), MapStoreError> {
    new.validate()
        .map_err(|e| MapStoreError::Invalid(e.to_string()))?;
    let want = expected.map_or(1, |m| m.epoch + 1);
    if new.epoch != want {
        return Err(MapStoreError::Invalid(format!(
            "the new map has epoch {}, it must be {want}",
            new.epoch
        )));
    }
    Ok(())
}

pub(crate) fn decode(raw: Vec<u8>) -> Result<OsdMap, MapStoreError> {
    OsdMap::decode(raw.into()).map_err(MapStoreError::Corrupt)
}

/// Reads, changes and swaps until the swap wins: `change` gets the current map (`None`: no
/// map yet) and returns the next one, or `None` to change nothing. Gives up after `tries`
/// conflicts. Returns the map stored in the end.
pub fn update<S: MapStore + ?Sized>(
    store: &S,
    tries: usize,
    mut change: impl FnMut(Option<&OsdMap>) -> Result<Option<OsdMap>, MapStoreError>,
) -> Result<Option<OsdMap>, MapStoreError> {
    let mut current = store.get()?;
    for _ in 0..tries {
        let Some(next) = change(current.as_ref())? else {
            return Ok(current);
        };
        match store.swap(current.as_ref(), &next) {
            Ok(()) => return Ok(Some(next)),
            Err(MapStoreError::Conflict { current: now }) => current = now.map(|m| *m),
            Err(e) => return Err(e),
        }
    }
    Err(MapStoreError::Unavailable(format!(
        "the map kept changing: {tries} attempts lost the race"
    )))
}
