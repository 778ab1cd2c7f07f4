//! The manager: watches which OSDs are alive and commits the map epochs that say so (issue
//! #11). Several may run; one leads, elected through etcd, and only the leader's changes go
//! through (each is a compare-and-swap on the map guarded by its leader key, so a deposed
//! leader that has not noticed yet cannot commit). The rules are in [`policy`]; this is the
//! loop around them, on a plain thread: it blocks on etcd, never on a reactor.

pub mod policy;

use carmine_mapstore::membership::{registered, Leadership};
use carmine_mapstore::{EtcdMapStore, MapStore, MapStoreError};
use policy::{next_epoch, Policy};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

#[derive(Clone, Debug)]
pub struct ManagerConfig {
    pub endpoints: Vec<String>,
    /// TLS files and credentials for etcd.
    pub access: carmine_mapstore::EtcdAccess,
    pub cluster: String,
    /// Unique to this process: what its leader key holds.
    pub name: String,
    /// The leader lease's TTL: how long a dead leader blocks a successor.
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

/// Runs until `stop` is set, then resigns. Errors from etcd are logged and retried: a
/// manager outlives an etcd outage and resumes when it is back.
pub fn run(cfg: &ManagerConfig, stop: &AtomicBool) -> Result<(), MapStoreError> {
    let store = EtcdMapStore::with_access(&cfg.endpoints, &cfg.access, &cfg.cluster)?;
    // Leadership calls may take a quarter of the TTL each: a renewal fails over to another
    // etcd member before the lease runs out.
    let etcd = store.etcd().clone().with_timeout(cfg.lease_ttl / 4);
    let mut leading: Option<(Leadership, Instant)> = None;
    let mut last_error = String::new();
    while !stop.load(Ordering::Relaxed) {
        let res = step(cfg, &store, &etcd, &mut leading);
        match res {
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
    if let Some((l, _)) = leading {
        match l.resign() {
            Ok(()) => println!("{}: resigned", cfg.name),
            // The lease runs out on its own; a successor waits at most one TTL.
            Err(e) => eprintln!("{}: resigning: {e}", cfg.name),
        }
    }
    Ok(())
}

/// One tick: lead (or try to), then make the map match who is alive.
fn step(
    cfg: &ManagerConfig,
    store: &EtcdMapStore,
    etcd: &carmine_mapstore::etcd_client::Etcd,
    leading: &mut Option<(Leadership, Instant)>,
) -> Result<(), MapStoreError> {
    match leading {
        None => {
            // The lease's clock starts at the grant, before the campaign's transaction.
            let granted = Instant::now();
            let Some(l) = Leadership::campaign(etcd, &cfg.cluster, &cfg.name, cfg.lease_ttl)?
            else {
                return Ok(());
            };
            println!("{}: leading cluster {}", cfg.name, cfg.cluster);
            *leading = Some((l, granted));
        }
        Some((l, renewed)) if renewed.elapsed() >= cfg.lease_ttl / 3 => {
            if !l.renew()? {
                println!("{}: lost the leadership (lease expired)", cfg.name);
                *leading = None;
                return Ok(());
            }
            *renewed = Instant::now();
        }
        Some(_) => {}
    }
    let Some((l, _)) = leading.as_ref() else {
        return Ok(());
    };
    let Some(map) = store.get()? else {
        return Ok(());
    };
    let alive = registered(etcd, &cfg.cluster)?;
    let Some(next) = next_epoch(&map, &alive, unix_now(), &cfg.policy) else {
        return Ok(());
    };
    match store.swap_guarded(Some(&map), &next.map, &[l.guard()]) {
        Ok(()) => {
            println!(
                "{}: epoch {}: {}",
                cfg.name,
                next.map.epoch,
                next.reasons.join("; ")
            );
            Ok(())
        }
        // Someone else changed the map (an operator's `osd out`): decide again next tick.
        Err(MapStoreError::Conflict { .. }) => Ok(()),
        Err(MapStoreError::Deposed) => {
            println!("{}: deposed; no longer leading", cfg.name);
            *leading = None;
            Ok(())
        }
        Err(e) => Err(e),
    }
}
