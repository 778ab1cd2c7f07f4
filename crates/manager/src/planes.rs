//! The two places a manager works against: etcd (several hosts) and a cluster directory (one
//! host). Each answers who is alive, lets one manager lead, and commits epochs only while it
//! leads.

use crate::ManagerConfig;
use carmine_cluster::OsdMap;
use carmine_mapstore::etcd_client::Etcd;
use carmine_mapstore::failure_reports::{etcd_reports, local_reports, FailureReport};
use carmine_mapstore::local_membership::{local_registered, LocalLeadership};
use carmine_mapstore::membership::{registered, Leadership, Registration};
use carmine_mapstore::{EtcdAccess, EtcdMapStore, LocalMapStore, MapStore, MapStoreError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub(crate) enum Commit {
    Done,
    /// The map changed meanwhile.
    Conflict,
    /// Another manager leads now; nothing was written.
    Deposed,
}

pub(crate) trait Plane {
    /// Campaigns, or renews the leadership held; true while this manager leads.
    fn lead(&mut self) -> Result<bool, MapStoreError>;
    fn map(&self) -> Result<Option<OsdMap>, MapStoreError>;
    fn alive(&self) -> Result<BTreeMap<u32, Registration>, MapStoreError>;
    /// The failure reports published, by reporter (of any run: the caller keeps the
    /// current ones).
    fn reports(&self) -> Result<BTreeMap<u32, FailureReport>, MapStoreError>;
    /// Replaces `map` with `next`, only while leading.
    fn commit(&mut self, map: &OsdMap, next: &OsdMap) -> Result<Commit, MapStoreError>;
    /// Steps down, so another manager takes over at once.
    fn resign(&mut self);
}

pub(crate) struct EtcdPlane {
    store: EtcdMapStore,
    etcd: Etcd,
    cluster: String,
    name: String,
    ttl: Duration,
    leading: Option<(Leadership, Instant)>,
}

impl EtcdPlane {
    pub fn new(
        endpoints: &[String],
        access: &EtcdAccess,
        cluster: &str,
        cfg: &ManagerConfig,
    ) -> Result<Self, MapStoreError> {
        let store = EtcdMapStore::with_access(endpoints, access, cluster)?;
        // Leadership calls may take a quarter of the TTL each: a renewal fails over to
        // another etcd member before the lease runs out.
        let etcd = store.etcd().clone().with_timeout(cfg.lease_ttl / 4);
        Ok(EtcdPlane {
            store,
            etcd,
            cluster: cluster.to_owned(),
            name: cfg.name.clone(),
            ttl: cfg.lease_ttl,
            leading: None,
        })
    }
}

impl Plane for EtcdPlane {
    fn lead(&mut self) -> Result<bool, MapStoreError> {
        match &mut self.leading {
            None => {
                // The lease's clock starts at the grant, before the campaign's transaction.
                let granted = Instant::now();
                let Some(l) =
                    Leadership::campaign(&self.etcd, &self.cluster, &self.name, self.ttl)?
                else {
                    return Ok(false);
                };
                println!("{}: leading cluster {}", self.name, self.cluster);
                self.leading = Some((l, granted));
            }
            Some((l, renewed)) if renewed.elapsed() >= self.ttl / 3 => {
                if !l.renew()? {
                    println!("{}: lost the leadership (lease expired)", self.name);
                    self.leading = None;
                    return Ok(false);
                }
                *renewed = Instant::now();
            }
            Some(_) => {}
        }
        Ok(true)
    }

    fn map(&self) -> Result<Option<OsdMap>, MapStoreError> {
        self.store.get()
    }

    fn alive(&self) -> Result<BTreeMap<u32, Registration>, MapStoreError> {
        registered(&self.etcd, &self.cluster)
    }

    fn reports(&self) -> Result<BTreeMap<u32, FailureReport>, MapStoreError> {
        etcd_reports(&self.etcd, &self.cluster)
    }

    fn commit(&mut self, map: &OsdMap, next: &OsdMap) -> Result<Commit, MapStoreError> {
        let Some((l, _)) = self.leading.as_ref() else {
            return Ok(Commit::Deposed);
        };
        match self.store.swap_guarded(Some(map), next, &[l.guard()]) {
            Ok(()) => Ok(Commit::Done),
            Err(MapStoreError::Conflict { .. }) => Ok(Commit::Conflict),
            Err(MapStoreError::Deposed) => {
                self.leading = None;
                Ok(Commit::Deposed)
            }
            Err(e) => Err(e),
        }
    }

    fn resign(&mut self) {
        if let Some((l, _)) = self.leading.take() {
            match l.resign() {
                Ok(()) => println!("{}: resigned", self.name),
                // The lease runs out on its own; a successor waits at most one TTL.
                Err(e) => eprintln!("{}: resigning: {e}", self.name),
            }
        }
    }
}

/// One host: the map file, the registrations beside it, the leader lock. A leader holds its
/// lock until it exits, so it is never deposed while alive.
pub(crate) struct LocalPlane {
    store: LocalMapStore,
    dir: PathBuf,
    name: String,
    leading: Option<LocalLeadership>,
}

impl LocalPlane {
    pub fn new(map: &Path, name: &str) -> Self {
        LocalPlane {
            store: LocalMapStore::new(map.to_owned()),
            dir: map.parent().unwrap_or(Path::new(".")).to_owned(),
            name: name.to_owned(),
            leading: None,
        }
    }
}

impl Plane for LocalPlane {
    fn lead(&mut self) -> Result<bool, MapStoreError> {
        if self.leading.is_none() {
            self.leading = LocalLeadership::campaign(&self.dir, &self.name)?;
            if self.leading.is_some() {
                println!(
                    "{}: leading the cluster in {}",
                    self.name,
                    self.dir.display()
                );
            }
        }
        Ok(self.leading.is_some())
    }

    fn map(&self) -> Result<Option<OsdMap>, MapStoreError> {
        self.store.get()
    }

    fn alive(&self) -> Result<BTreeMap<u32, Registration>, MapStoreError> {
        local_registered(&self.dir)
    }

    fn reports(&self) -> Result<BTreeMap<u32, FailureReport>, MapStoreError> {
        local_reports(&self.dir)
    }

    fn commit(&mut self, map: &OsdMap, next: &OsdMap) -> Result<Commit, MapStoreError> {
        match self.store.swap(Some(map), next) {
            Ok(()) => Ok(Commit::Done),
            Err(MapStoreError::Conflict { .. }) => Ok(Commit::Conflict),
            Err(e) => Err(e),
        }
    }

    fn resign(&mut self) {
        if self.leading.take().is_some() {
            println!("{}: resigned", self.name);
        }
    }
}
