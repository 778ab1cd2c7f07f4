//! An OSD's control plane, on plain threads beside the reactors: it watches the map store for
//! newer epochs (handed to the reactors, which switch on their own), and keeps the OSD
//! registered so the managers see it alive: with etcd under a lease it renews (dead once the
//! lease runs out), with a map file under a lock beside it (dead when the process is). Nothing here is on the data path: with etcd unreachable, the reactors go on
//! serving the epoch they have.

use anyhow::{Context, Result};
use carmine_cluster::OsdMap;
use carmine_mapstore::etcd_client::Etcd;
use carmine_mapstore::failure_reports::{publish_etcd, publish_local, FailureReport, REMADE_EVERY};
use carmine_mapstore::local_membership::LocalOsdLock;
use carmine_mapstore::membership::{OsdLease, Registration};
use carmine_mapstore::{EtcdMapStore, LocalMapStore, MapStore, MapStoreError};
use carmine_osd::LeaseClock;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where the OSD's map comes from.
#[derive(Clone)]
pub enum MapSource {
    File(std::path::PathBuf),
    Etcd {
        endpoints: Vec<String>,
        cluster: String,
        access: carmine_mapstore::EtcdAccess,
    },
}

impl MapSource {
    pub fn describe(&self) -> String {
        match self {
            MapSource::File(p) => p.display().to_string(),
            MapSource::Etcd {
                endpoints, cluster, ..
            } => {
                format!("etcd {} (cluster {cluster})", endpoints.join(","))
            }
        }
    }

    /// Where the cluster's PG histories live: beside the map file, or in the same etcd.
    pub fn pg_history(&self) -> Result<carmine_osd::SharedHistoryStore> {
        Ok(match self {
            MapSource::File(p) => {
                let dir = p.parent().unwrap_or(std::path::Path::new("."));
                Arc::new(carmine_mapstore::LocalPgHistory::new(dir))
            }
            MapSource::Etcd {
                endpoints,
                cluster,
                access,
            } => Arc::new(carmine_mapstore::EtcdPgHistory::new(
                Etcd::with_access(endpoints, access)?,
                cluster,
            )),
        })
    }

    /// Where this OSD's longest recent read lease is recorded: beside the map file, or in the
    /// same etcd.
    pub fn read_lease_record(
        &self,
        osd: u32,
    ) -> Result<carmine_mapstore::read_lease::ReadLeaseRecord> {
        use carmine_mapstore::read_lease::ReadLeaseRecord;
        Ok(match self {
            MapSource::File(p) => {
                ReadLeaseRecord::local(p.parent().unwrap_or(std::path::Path::new(".")), osd)
            }
            MapSource::Etcd {
                endpoints,
                cluster,
                access,
            } => ReadLeaseRecord::etcd(Etcd::with_access(endpoints, access)?, cluster, osd),
        })
    }

    pub fn open(&self) -> Result<Box<dyn MapStore + Send>> {
        Ok(match self {
            MapSource::File(p) => Box::new(LocalMapStore::new(p.clone())),
            MapSource::Etcd {
                endpoints,
                cluster,
                access,
            } => Box::new(EtcdMapStore::with_access(endpoints, access, cluster)?),
        })
    }
}

/// Changes temporary acting sets in the map the OSD follows, for its primaries
/// (`carmine_osd::ChangeTemps`): sets them where acting members lack most of a PG, removes
/// them once the backfill targets are full.
pub struct MapTempChanger(pub MapSource);

impl std::fmt::Debug for MapTempChanger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MapTempChanger({})", self.0.describe())
    }
}

impl carmine_osd::ChangeTemps for MapTempChanger {
    fn change(&self, changes: &[carmine_osd::TempChange]) -> Result<usize, String> {
        use carmine_osd::TempChange;
        let store = self.0.open().map_err(|e| format!("{e:#}"))?;
        wait_for_quiet(store.as_ref());
        let mut made = 0;
        carmine_mapstore::update(store.as_ref(), 10, |current| {
            made = 0;
            let Some(map) = current else { return Ok(None) };
            let mut next = map.clone();
            for change in changes {
                made += usize::from(match change {
                    TempChange::Ask { pg, acting, set } => next.ask_temp(*pg, acting, set),
                    TempChange::Release { pg, acting, filled } => {
                        next.release_temp(*pg, acting, filled)
                    }
                });
            }
            if made == 0 {
                return Ok(None);
            }
            next.epoch = map.epoch + 1;
            Ok(Some(next))
        })
        .map_err(|e| e.to_string())?;
        Ok(made)
    }
}

/// How long the map must stay at one epoch before a change of temporary sets goes in, and
/// how long it waits for that at most.
const QUIET: Duration = Duration::from_millis(400);
const QUIET_WAIT_MAX: Duration = Duration::from_secs(2);

/// Waits, a bounded time, until the map has stayed at one epoch for `QUIET` (plus a
/// little, different per process). A reactor that finds the map more than one epoch ahead of
/// the one it knew cannot tell whether a PG's acting set changed in between and peers every
/// PG again, which stalls clients; the OSDs' changes, which tend to come together, are
/// spread out so that each is seen on its own.
fn wait_for_quiet(store: &dyn MapStore) {
    let start = Instant::now();
    let jitter = Duration::from_millis(u64::from(std::process::id() % 7) * 50);
    let epoch = |s: &dyn MapStore| s.get().ok().flatten().map(|m| m.epoch);
    let mut seen = (epoch(store), Instant::now());
    while start.elapsed() < QUIET_WAIT_MAX {
        std::thread::sleep(Duration::from_millis(50));
        let now = epoch(store);
        if now != seen.0 {
            seen = (now, Instant::now());
        } else if seen.1.elapsed() >= QUIET + jitter {
            return;
        }
    }
}

/// How long one wait for a newer map lasts before the watcher checks whether to stop.
const WATCH_SLICE: Duration = Duration::from_secs(2);
/// Pause after a failed read of the map store (etcd down): retried, quietly.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// The control threads of one OSD; stopped by [`Control::stop`].
pub struct Control {
    stop: Arc<AtomicBool>,
    /// Set by the lease keeper when another process took this OSD's registration.
    displaced: Arc<std::sync::OnceLock<String>>,
    maps: mpsc::Receiver<OsdMap>,
    watcher: Option<JoinHandle<()>>,
    keeper: Option<JoinHandle<Option<OsdLease>>>,
    /// With a map file: the registration beside it, held (locked) while the process lives,
    /// and the directory failure reports go to.
    local: Option<(LocalOsdLock, std::path::PathBuf)>,
    /// The failure report as last published: the OSDs reported (for the log) and the hold
    /// seen; the report itself once changed, for the lease keeper to publish (with etcd).
    reported: Mutex<(Vec<u32>, u64, Instant)>,
    report: Arc<PendingReport>,
    reg: Registration,
}

/// A failure report waiting for the lease keeper (etcd), which publishes it under the lease
/// it holds then.
#[derive(Default)]
struct PendingReport {
    /// `Some(None)`: withdraw the report.
    next: Mutex<Option<Option<FailureReport>>>,
}

impl Control {
    /// Starts watching `source` for epochs after `epoch`. With etcd, first registers `reg`
    /// under a lease of `ttl` (waiting up to `ttl` + 2 s for a crashed predecessor's lease to
    /// run out), then keeps it renewed, telling `clock` how long the lease surely holds. With
    /// a map file, registers `reg` beside it under a lock that lasts as long as the process.
    pub fn start(
        source: &MapSource,
        epoch: u32,
        reg: Registration,
        ttl: Duration,
        clock: Option<Arc<LeaseClock>>,
    ) -> Result<Control> {
        let stop = Arc::new(AtomicBool::new(false));
        let displaced = Arc::new(std::sync::OnceLock::new());
        let report = Arc::new(PendingReport::default());
        let mut local = None;
        let keeper = match source {
            MapSource::File(path) => {
                let dir = path.parent().unwrap_or(std::path::Path::new("."));
                let held = LocalOsdLock::register(dir, &reg)
                    .with_context(|| format!("registering osd.{} in {}", reg.osd, dir.display()))?;
                println!("osd.{} registered in {}", reg.osd, held.path().display());
                // A report an earlier run left is not believed (another pid), but is noise.
                let _ = publish_local(dir, reg.osd, None);
                local = Some((held, dir.to_owned()));
                None
            }
            MapSource::Etcd {
                endpoints,
                cluster,
                access,
            } => {
                // Each call may take a quarter of the TTL, so a renewal can fail over to
                // another member before the lease runs out.
                let etcd = Etcd::with_access(endpoints, access)?.with_timeout(ttl / 4);
                let sent = Instant::now();
                let lease =
                    OsdLease::register(&etcd, cluster, &reg, ttl, ttl + Duration::from_secs(2))
                        .with_context(|| format!("registering osd.{} in etcd", reg.osd))?;
                println!(
                    "osd.{} registered in etcd (lease TTL {} s)",
                    reg.osd,
                    ttl.as_secs()
                );
                let maps = source.open()?;
                if let Some(c) = &clock {
                    c.resume_at_epoch(maps.get()?.map_or(0, |m| m.epoch));
                    c.renewed(sent);
                }
                let stop = stop.clone();
                let displaced = displaced.clone();
                let publish = Publisher {
                    etcd,
                    cluster: cluster.clone(),
                    osd: reg.osd,
                    pending: report.clone(),
                    published: None,
                    failing: false,
                };
                Some(
                    std::thread::Builder::new()
                        .name(format!("osd{}-lease", reg.osd))
                        .spawn(move || {
                            keep_registered(lease, maps, clock, publish, &stop, &displaced)
                        })?,
                )
            }
        };
        let (tx, maps) = mpsc::sync_channel(1);
        let store = source.open()?;
        let watcher = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("osd{}-map", reg.osd))
                .spawn(move || watch_maps(store, reg.osd, epoch, tx, &stop))?
        };
        Ok(Control {
            stop,
            displaced,
            maps,
            watcher: Some(watcher),
            keeper,
            local,
            reported: Mutex::new((Vec::new(), 0, Instant::now())),
            report,
            reg,
        })
    }

    /// Reports the OSDs in `silent` (each silent for longer than the peer grace) to the
    /// managers, and the hold of the newest map that holds this OSD down on reports
    /// (`held_seen`, 0: none), if that is a change: at once beside a map file, through the
    /// lease keeper in etcd. Nothing to say withdraws the report.
    pub fn report(&self, silent: BTreeMap<u32, Duration>, held_seen: u64, grace: Duration) {
        let ids: Vec<u32> = silent.keys().copied().collect();
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        // A report standing is made again now and then: the managers believe a silence
        // only if reported after its target's current run started.
        let remake = !ids.is_empty() && reported.2.elapsed() >= REMADE_EVERY;
        if reported.0 == ids && reported.1 == held_seen && !remake {
            return;
        }
        if held_seen != reported.1 {
            println!(
                "osd.{}: held down on peers' failure reports until {held_seen} (Unix time); \
                 telling the managers it runs",
                self.reg.osd
            );
        }
        if ids.is_empty() {
            if !reported.0.is_empty() {
                println!(
                    "osd.{}: every peer answers again; report withdrawn",
                    self.reg.osd
                );
            }
        } else if ids != reported.0 {
            let list: Vec<String> = silent
                .iter()
                .map(|(o, d)| format!("osd.{o} ({:.1} s)", d.as_secs_f64()))
                .collect();
            println!(
                "osd.{}: reporting to the managers that these OSDs do not answer: {}",
                self.reg.osd,
                list.join(", ")
            );
        }
        let report = (!ids.is_empty() || held_seen > 0).then(|| {
            let ms = silent
                .iter()
                .map(|(o, d)| (*o, d.as_millis() as u64))
                .collect();
            FailureReport::new(&self.reg, ms, held_seen, grace)
        });
        match &self.local {
            Some((_, dir)) => {
                if let Err(e) = publish_local(dir, self.reg.osd, report.as_ref()) {
                    // Tried again at the next change; the managers see the old one meanwhile.
                    eprintln!("warning: publishing the failure report: {e}");
                    return;
                }
            }
            None => {
                *self.report.next.lock().unwrap_or_else(|e| e.into_inner()) = Some(report);
            }
        }
        *reported = (ids, held_seen, Instant::now());
    }

    /// Refuses early (before the store is opened or a port bound) an OSD whose id a live
    /// process on this host has registered beside the map file. With etcd the registration
    /// itself waits for a crashed predecessor's lease, so there is nothing to check first.
    pub fn check_not_running(source: &MapSource, osd: u32) -> Result<()> {
        if let MapSource::File(path) = source {
            let dir = path.parent().unwrap_or(std::path::Path::new("."));
            if let Some(h) = carmine_mapstore::local_membership::local_holder(dir, osd)? {
                anyhow::bail!(
                    "osd.{osd} is already running: pid {} on {} holds its registration",
                    h.pid,
                    h.host
                );
            }
        }
        Ok(())
    }

    /// Why this process must stop serving, if another process took its registration over.
    pub fn displaced(&self) -> Option<&str> {
        self.displaced.get().map(String::as_str)
    }

    /// Waits up to `timeout` for newer maps; returns every one that arrived, oldest first
    /// (an epoch skipped makes the reactors peer every PG again).
    pub fn newer_maps(&self, timeout: Duration) -> Vec<OsdMap> {
        let Ok(first) = self.maps.recv_timeout(timeout) else {
            return Vec::new();
        };
        std::iter::once(first).chain(self.maps.try_iter()).collect()
    }

    /// Stops the threads; with etcd, deregisters at once (a clean stop shows as down now,
    /// not after the lease runs out).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(lease) = self.keeper.take().and_then(|k| k.join().ok()).flatten() {
            if let Err(e) = lease.release() {
                eprintln!("warning: deregistering from etcd: {e}");
            }
        }
        // Unlocked: the managers see it go at once.
        if let Some((held, dir)) = self.local.take() {
            let _ = publish_local(&dir, self.reg.osd, None);
            drop(held);
        }
        // The watcher notices within a watch slice; the process does not wait for it.
        drop(self.watcher.take());
    }
}

/// Renews the lease every third of its TTL (every tenth while renewals fail), and keeps
/// `clock` told how long it surely holds. A renewal after the OSD stopped trusting its lease,
/// or one that had to register again, also reads the map epoch etcd holds then: the reactors
/// serve again only from that epoch on.
fn keep_registered(
    mut lease: OsdLease,
    maps: Box<dyn MapStore + Send>,
    clock: Option<Arc<LeaseClock>>,
    mut publish: Publisher,
    stop: &AtomicBool,
    displaced: &std::sync::OnceLock<String>,
) -> Option<OsdLease> {
    let mut failing = false;
    let mut fenced = false;
    while !stop.load(Ordering::Relaxed) {
        if let Some(c) = &clock {
            if c.lapsed() && !fenced {
                fenced = true;
                eprintln!(
                    "the lease was not renewed within {:.0}% of its TTL: serving no client of \
                     single-copy pools until it is (the cluster may mark this OSD down); \
                     replicated PGs go on under the read leases their copies grant",
                    carmine_osd::LEASE_TRUSTED_SHARE * 100.0
                );
            }
        }
        let sent = Instant::now();
        // Registered again: the managers may have seen the key gone and marked this OSD down.
        let mut again = false;
        let renewed = match lease.renew() {
            Ok(true) => {
                if failing {
                    println!("etcd reachable again; registration renewed");
                }
                true
            }
            Ok(false) => {
                println!(
                    "the registration had lapsed (etcd unreachable too long) or its key was \
                     deleted; registered again"
                );
                again = true;
                true
            }
            Err(MapStoreError::Displaced(why)) => {
                // Not renewed again: the clock lapses, and the control thread stops the OSD.
                let _ = displaced.set(why);
                return Some(lease);
            }
            Err(e) => {
                if !failing {
                    eprintln!("renewing the registration: {e}; retrying");
                }
                false
            }
        };
        failing = !renewed;
        if let (true, Some(c)) = (renewed, &clock) {
            if !c.lapsed() && !again {
                c.renewed(sent);
            } else {
                // The cluster may have moved on meanwhile: serve by the epoch it is at now.
                match maps.get() {
                    Ok(m) => {
                        let epoch = m.map_or(0, |m| m.epoch);
                        c.resume_at_epoch(epoch);
                        c.renewed(sent);
                        fenced = false;
                        println!("lease renewed: serving clients again from map epoch {epoch}");
                    }
                    Err(e) => {
                        eprintln!("lease renewed, but reading the map failed: {e}; retrying");
                        failing = true;
                    }
                }
            }
        }
        let every = lease.ttl() / if failing { 10 } else { 3 };
        // Sleep in short steps so a stop is prompt and a new failure report goes out at once.
        let mut slept = Duration::ZERO;
        while slept < every && !stop.load(Ordering::Relaxed) {
            if !failing {
                publish.step(lease.lease_id());
            }
            std::thread::sleep(Duration::from_millis(50));
            slept += Duration::from_millis(50);
        }
    }
    Some(lease)
}

/// Publishes the OSD's failure report in etcd under its lease: when it changes, and again
/// under a new lease after a lapse (the old one took the key with it).
struct Publisher {
    etcd: Etcd,
    cluster: String,
    osd: u32,
    pending: Arc<PendingReport>,
    /// The report in etcd, and the lease it is under.
    published: Option<(Option<FailureReport>, i64)>,
    /// The last attempt failed (said once, not at every retry).
    failing: bool,
}

impl Publisher {
    fn step(&mut self, lease: i64) {
        let newer = self
            .pending
            .next
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let report = match (newer, &self.published) {
            (Some(r), _) => r,
            // Only a report (not its absence) needs publishing again under a new lease.
            (None, Some((Some(r), l))) if *l != lease => Some(r.clone()),
            (None, _) => return,
        };
        match publish_etcd(&self.etcd, &self.cluster, self.osd, lease, report.as_ref()) {
            Ok(()) => {
                self.published = Some((report, lease));
                self.failing = false;
            }
            Err(e) => {
                if !std::mem::replace(&mut self.failing, true) {
                    eprintln!("publishing the failure report: {e}; retrying");
                }
                // Handed back unless a newer one came meanwhile.
                self.pending
                    .next
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_or_insert(report);
            }
        }
    }
}

fn watch_maps(
    store: Box<dyn MapStore + Send>,
    osd: u32,
    mut epoch: u32,
    tx: mpsc::SyncSender<OsdMap>,
    stop: &AtomicBool,
) {
    let mut failing = false;
    while !stop.load(Ordering::Relaxed) {
        match store.wait_newer(epoch, WATCH_SLICE) {
            Ok(Some(map)) => {
                failing = false;
                // An epoch between, replayed, that does not name this OSD (removed, and its
                // id given again since) would stop it: the newest decides instead.
                let map = if map.osd(osd).is_some() {
                    map
                } else {
                    match store.get() {
                        Ok(Some(newest)) if newest.epoch > map.epoch => newest,
                        _ => map,
                    }
                };
                epoch = map.epoch;
                // Every epoch, in order (the channel holds one; this waits for room).
                if tx.send(map).is_err() {
                    return;
                }
            }
            Ok(None) => failing = false,
            Err(e) => {
                if !failing {
                    eprintln!("watching the map: {e}; serving epoch {epoch} meanwhile");
                }
                failing = true;
                std::thread::sleep(RETRY_PAUSE);
            }
        }
    }
}
