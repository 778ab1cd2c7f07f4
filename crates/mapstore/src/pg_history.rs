//! Where PGs' recorded histories live (decision 0009, point 4): beside the map, one record per
//! PG — a file under `<dir>/pg-history/` on one host, a key `/carmine/<c>/pg/<pool>.<seed>/history`
//! in etcd. A primary appends its interval with a compare-and-swap on the last one before it
//! goes active, so of two primaries of different epochs at most one can activate on a history
//! the other has not seen. Not in the map: it changes per PG, and epochs stay small.

use crate::etcd_client::{Compare, Etcd, Put};
use crate::MapStoreError;
use carmine_pg::{History, Interval};
use carmine_types::PgId;
use std::path::{Path, PathBuf};

/// What a record attempt did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// The interval is recorded.
    Done,
    /// The history was not what the caller saw: here it is; peer again against it.
    Changed(History),
}

pub trait PgHistoryStore: std::fmt::Debug {
    /// The PG's history (empty if none was recorded).
    fn get(&self, pg: PgId) -> Result<History, MapStoreError>;

    /// Replaces the PG's history by what `edit` makes of it (`None`: leave it), as one step
    /// against every other writer: the one place each backend makes it atomic.
    fn change(
        &self,
        pg: PgId,
        edit: &mut dyn FnMut(&History) -> Result<Option<History>, MapStoreError>,
    ) -> Result<Change, MapStoreError>;

    /// Forgets the histories of every PG of `pool` (removed from the map: its id is never
    /// given again, so nothing reads them any more). Returns how many there were.
    fn remove_pool(&self, pool: u32) -> Result<u64, MapStoreError>;

    /// Appends `interval` if the newest recorded interval is still the one of epoch `after`
    /// (`None`: none) and `interval` is newer.
    fn record(
        &self,
        pg: PgId,
        after: Option<u32>,
        interval: Interval,
    ) -> Result<Recorded, MapStoreError> {
        let mut interval = Some(interval);
        let edit = &mut |h: &History| {
            let i = interval.take().expect("edited once");
            appended(pg, h.clone(), after, i).map(Result::ok)
        };
        Ok(match self.change(pg, edit)? {
            Change::Replaced => Recorded::Done,
            // Someone recorded meanwhile: the caller peers again against what is there now.
            Change::Kept(now) => Recorded::Changed(now),
        })
    }

    /// Drops every interval before the newest, if that one was recorded in `from..=epoch`:
    /// the interval of the primary that asks, clean in `epoch`, which began in `from` (within
    /// an interval only its primary records; the map may have moved on since it recorded
    /// without changing the acting set). Once it went active its members hold everything
    /// acknowledged before it, so a later primary needs to hear only from one of them.
    /// Returns whether the history was shortened.
    fn settle(&self, pg: PgId, from: u32, epoch: u32) -> Result<bool, MapStoreError> {
        let edit = &mut |h: &History| Ok(settled(h, from, epoch));
        Ok(matches!(self.change(pg, edit)?, Change::Replaced))
    }
}

/// What [`PgHistoryStore::change`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Replaced,
    /// Left as it is (the edit declined, or another writer changed it first): here it is now.
    Kept(History),
}

/// `h` cut to its newest interval, if that was recorded in `from..=epoch` and there is more
/// before it.
fn settled(h: &History, from: u32, epoch: u32) -> Option<History> {
    match h.intervals.last() {
        Some(last) if (from..=epoch).contains(&last.epoch) && h.intervals.len() > 1 => {
            Some(History {
                intervals: vec![last.clone()],
            })
        }
        _ => None,
    }
}

fn damaged(pg: PgId, source: carmine_pg::HistoryError) -> MapStoreError {
    MapStoreError::DamagedHistory {
        pg: format!("{}.{}", pg.pool, pg.seed),
        source,
    }
}

fn decode(pg: PgId, raw: Option<Vec<u8>>) -> Result<History, MapStoreError> {
    match raw {
        None => Ok(History::default()),
        Some(raw) => History::decode(raw.into()).map_err(|e| damaged(pg, e)),
    }
}

/// Appends to `h` as [`PgHistoryStore::record`] says; `Err` (the history as it is) if it
/// changed.
fn appended(
    pg: PgId,
    mut h: History,
    after: Option<u32>,
    interval: Interval,
) -> Result<Result<History, History>, MapStoreError> {
    let saw = h.clone();
    match h.append(after, interval) {
        Ok(true) => Ok(Ok(h)),
        Ok(false) => Ok(Err(saw)),
        Err(e) => Err(MapStoreError::Invalid(format!(
            "pg {}.{}: {e}",
            pg.pool, pg.seed
        ))),
    }
}

/// One host: a file per PG, changed under one `flock` and replaced by an atomic rename.
#[derive(Clone, Debug)]
pub struct LocalPgHistory {
    dir: PathBuf,
}

impl LocalPgHistory {
    /// The histories of the cluster whose directory is `dir` (kept in `dir/pg-history`).
    pub fn new(dir: &Path) -> Self {
        LocalPgHistory {
            dir: dir.join("pg-history"),
        }
    }

    fn path(&self, pg: PgId) -> PathBuf {
        self.dir.join(format!("{}.{}", pg.pool, pg.seed))
    }

    fn read(&self, pg: PgId) -> Result<Option<Vec<u8>>, MapStoreError> {
        let path = self.path(pg);
        match std::fs::read(&path) {
            Ok(raw) => Ok(Some(raw)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path, e)),
        }
    }
}

fn io(path: &Path, e: std::io::Error) -> MapStoreError {
    MapStoreError::Unavailable(format!("{}: {e}", path.display()))
}

impl PgHistoryStore for LocalPgHistory {
    fn get(&self, pg: PgId) -> Result<History, MapStoreError> {
        decode(pg, self.read(pg)?)
    }

    fn change(
        &self,
        pg: PgId,
        edit: &mut dyn FnMut(&History) -> Result<Option<History>, MapStoreError>,
    ) -> Result<Change, MapStoreError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| io(&self.dir, e))?;
        let _lock = crate::lockfile::lock_exclusive(&self.dir.join(".lock"))?;
        let current = decode(pg, self.read(pg)?)?;
        let Some(next) = edit(&current)? else {
            return Ok(Change::Kept(current));
        };
        crate::lockfile::replace_durably(&self.path(pg), &next.encode())?;
        Ok(Change::Replaced)
    }

    fn remove_pool(&self, pool: u32) -> Result<u64, MapStoreError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io(&self.dir, e)),
        };
        let _lock = crate::lockfile::lock_exclusive(&self.dir.join(".lock"))?;
        let prefix = format!("{pool}.");
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(|e| io(&self.dir, e))?;
            let name = entry.file_name();
            let Some(seed) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            if seed.parse::<u32>().is_err() {
                continue;
            }
            std::fs::remove_file(entry.path()).map_err(|e| io(&entry.path(), e))?;
            removed += 1;
        }
        Ok(removed)
    }
}

/// Several hosts: a key per PG in etcd, changed by a transaction comparing the stored bytes.
#[derive(Clone, Debug)]
pub struct EtcdPgHistory {
    etcd: Etcd,
    cluster: String,
}

impl EtcdPgHistory {
    pub fn new(etcd: Etcd, cluster: &str) -> Self {
        EtcdPgHistory {
            etcd,
            cluster: cluster.to_owned(),
        }
    }
}

impl PgHistoryStore for EtcdPgHistory {
    fn get(&self, pg: PgId) -> Result<History, MapStoreError> {
        decode(
            pg,
            self.etcd
                .get(&crate::keys::pg_history(&self.cluster, pg))?
                .0,
        )
    }

    fn change(
        &self,
        pg: PgId,
        edit: &mut dyn FnMut(&History) -> Result<Option<History>, MapStoreError>,
    ) -> Result<Change, MapStoreError> {
        let key = crate::keys::pg_history(&self.cluster, pg);
        let (raw, _) = self.etcd.get(&key)?;
        let current = decode(pg, raw.clone())?;
        let Some(next) = edit(&current)? else {
            return Ok(Change::Kept(current));
        };
        let compare = match &raw {
            Some(r) => Compare::Value(&key, r),
            None => Compare::Absent(&key),
        };
        let value = next.encode();
        let put = Put::Put {
            key: &key,
            value: &value,
            lease: 0,
        };
        if self.etcd.txn(&[compare], &[put])? {
            return Ok(Change::Replaced);
        }
        Ok(Change::Kept(self.get(pg)?))
    }

    fn remove_pool(&self, pool: u32) -> Result<u64, MapStoreError> {
        self.etcd
            .delete_prefix(&crate::keys::pg_histories_of_pool(&self.cluster, pool))
    }
}
