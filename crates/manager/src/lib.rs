//! The manager: watches which OSDs are alive and commits the map epochs that say so (issue
//! #11). Several may run; one leads, and only the leader's changes go through. With etcd the
//! leader is elected under a lease and each change is a compare-and-swap on the map guarded by
//! its leader key, so a deposed leader that has not noticed yet cannot commit. With the map in
//! a file (one host) the leader holds a lock the kernel drops when it dies, and OSDs are alive
//! while they hold theirs ([`carmine_mapstore::local_membership`]). The rules are in
//! [`policy`]; this is the loop around them, on a plain thread: it blocks on etcd or the file
//! system, never on a reactor.

mod planes;
pub mod policy;
pub mod reports;

use carmine_mapstore::{EtcdAccess, MapStoreError};
use planes::{Commit, EtcdPlane, LocalPlane, Plane};
use policy::{next_epoch, Policy};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

/// Where the cluster's map and liveness live.
#[derive(Clone, Debug)]
pub enum Backend {
    Etcd {
        endpoints: Vec<String>,
        /// TLS files and credentials for etcd.
        access: EtcdAccess,
        cluster: String,
    },
    /// The map file; registrations and the leader lock sit beside it.
    Local { map: PathBuf },
}

impl Backend {
    pub fn describe(&self) -> String {
        match self {
            Backend::Etcd {
                endpoints, cluster, ..
            } => format!("cluster {cluster} (etcd {})", endpoints.join(",")),
            Backend::Local { map } => format!("the cluster of {}", map.display()),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ManagerConfig {
    pub backend: Backend,
    /// Unique to this process: what its leader key holds.
    pub name: String,
    /// The leader lease's TTL (etcd): how long a dead leader blocks a successor.
    pub lease_ttl: Duration,
    /// How often the leader looks at registrations and the map.
    pub tick: Duration,
    pub policy: Policy,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Runs until `stop` is set, then resigns. Errors from the backend are logged and retried: a
/// manager outlives an etcd outage and resumes when it is back.
pub fn run(cfg: &ManagerConfig, stop: &AtomicBool) -> Result<(), MapStoreError> {
    let mut plane: Box<dyn Plane> = match &cfg.backend {
        Backend::Etcd {
            endpoints,
            access,
            cluster,
        } => Box::new(EtcdPlane::new(endpoints, access, cluster, cfg)?),
        Backend::Local { map } => Box::new(LocalPlane::new(map, &cfg.name)),
    };
    let mut last_error = String::new();
    while !stop.load(Ordering::Relaxed) {
        match step(cfg, plane.as_mut()) {
            Ok(()) => last_error.clear(),
            Err(e) => {
                let e = e.to_string();
                // One line per distinct error, not one per tick.
                if e != last_error {
                    tracing::warn!(manager = cfg.name, "{e}");
                    eprintln!("{}: {e}", cfg.name);
                    last_error = e;
                }
            }
        }
        std::thread::sleep(cfg.tick);
    }
    plane.resign();
    Ok(())
}

/// One tick: lead (or try to), then make the map match who is alive.
fn step(cfg: &ManagerConfig, plane: &mut dyn Plane) -> Result<(), MapStoreError> {
    if !plane.lead()? {
        return Ok(());
    }
    let Some(map) = plane.map()? else {
        return Ok(());
    };
    let alive = plane.alive()?;
    // Reports that cannot be read must not stop the other rules (a dead OSD still goes down).
    let reports = match plane.reports() {
        Ok(r) => carmine_mapstore::failure_reports::current(r, &alive),
        Err(e) => {
            tracing::warn!(manager = cfg.name, "reading failure reports: {e}");
            Default::default()
        }
    };
    let Some(next) = next_epoch(&map, &alive, &reports, unix_now(), &cfg.policy) else {
        return Ok(());
    };
    match plane.commit(&map, &next.map)? {
        Commit::Done => println!(
            "{}: epoch {}: {}",
            cfg.name,
            next.map.epoch,
            next.reasons.join("; ")
        ),
        // Someone else changed the map (an operator's `osd out`): decide again next tick.
        Commit::Conflict => {}
        Commit::Deposed => println!("{}: deposed; no longer leading", cfg.name),
    }
    Ok(())
}
