//! Per-reactor counters and their Prometheus text exposition.
//!
//! Each reactor owns one [`ReactorMetrics`] and is its only writer: relaxed atomic adds, no
//! lock, no allocation per request. A plain thread (never a reactor) serves
//! `GET /metrics` on the OSD's `--metrics` address and reads them with relaxed loads.

use carmine_reactor::ReactorLoad;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Upper bounds (seconds) of the request latency buckets: 25 µs to 1 s, roughly ×2–2.5 apart.
pub const LATENCY_BUCKETS: [f64; 14] = [
    25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3,
    1.0,
];
const LATENCY_BUCKETS_NS: [u64; 14] = [
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    1_000_000_000,
];

/// What a request was, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    Read = 0,
    Write = 1,
    /// Ping, map, fence.
    Other = 2,
}

const KINDS: [(&str, OpKind); 3] = [
    ("read", OpKind::Read),
    ("write", OpKind::Write),
    ("other", OpKind::Other),
];

#[derive(Default)]
struct KindCounters {
    ops: AtomicU64,
    failed: AtomicU64,
    latency_ns_sum: AtomicU64,
    /// Non-cumulative: bucket `i` counts requests in (bound[i-1], bound[i]]; the last one
    /// counts those above every bound.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
}

/// A reactor's replicated PGs by state, counted each tick.
#[derive(Debug, Default)]
pub(crate) struct PgStates {
    /// PGs it is primary of, active or still peering.
    pub active: u64,
    pub peering: u64,
    /// Of the peering ones: those no copy can complete (lost disks).
    pub incomplete: u64,
    /// Of the peering ones: those that wait for down OSDs of their recorded intervals.
    pub down: u64,
    /// Objects its copies still have to fetch, and those no member heard from holds.
    pub to_recover: u64,
    pub unfound: u64,
    /// Objects its copies that are backfill targets still have to fetch (decision 0015).
    pub misplaced: u64,
    /// Active PGs whose primary went longer than a lease without hearing every copy.
    pub unleased: u64,
}

/// One reactor's counters.
#[derive(Default)]
pub struct ReactorMetrics {
    kinds: [KindCounters; 3],
    bytes_received: AtomicU64,
    bytes_sent: AtomicU64,
    connections: AtomicU64,
    connections_refused: AtomicU64,
    auth_refused: AtomicU64,
    epoch: AtomicU32,
    pgs: AtomicU64,
    /// Why the store shard failed, once it did (it stays failed until the OSD restarts).
    store_failure: std::sync::OnceLock<String>,
    store_capacity: AtomicU64,
    store_used: AtomicU64,
    store_objects: AtomicU64,
    pgs_inconsistent: AtomicU64,
    scrubs: AtomicU64,
    deep_scrubs: AtomicU64,
    scrub_findings: AtomicU64,
    read_repairs: AtomicU64,
    lease_refusals: AtomicU64,
    read_lease_waits: AtomicU64,
    replica_writes: AtomicU64,
    read_lease_refusals: AtomicU64,
    writes_refused_full: AtomicU64,
    pg_copies_stopped: AtomicU64,
    write_ack_timeouts: AtomicU64,
    store_refused_room: AtomicU64,
    writes_held_by_scrub: AtomicU64,
    reads_held_by_writes: AtomicU64,
    writes_held_by_reads: AtomicU64,
    pgs_active: AtomicU64,
    pgs_peering: AtomicU64,
    objects_to_recover: AtomicU64,
    objects_misplaced: AtomicU64,
    objects_unfound: AtomicU64,
    pgs_unleased: AtomicU64,
    pgs_incomplete: AtomicU64,
    pgs_down: AtomicU64,
    recovered_objects: AtomicU64,
    recovered_bytes: AtomicU64,
    /// Objects being fetched and stored by recovery right now, and the most at once so far.
    recoveries_active: AtomicU64,
    recoveries_active_most: AtomicU64,
    /// Recovery's pace over the last seconds: bytes/s, and thousandths of objects/s.
    recovery_bytes_per_sec: AtomicU64,
    recovery_milli_objects_per_sec: AtomicU64,
    /// Other OSDs this reactor's PGs wait on without hearing from them, and for how long
    /// (ns): set once per replication tick, read by the control thread for failure reports.
    silent_peers: std::sync::Mutex<Vec<(carmine_types::OsdId, u64)>>,
    /// The largest peering listing (bytes) of the PGs this reactor is primary of.
    pg_listing_max: AtomicU64,
    /// What the store shard counts about itself (`ObjectStore::counters`): set once a second
    /// with the space figures, read by the metrics thread.
    store_counters: std::sync::Mutex<Vec<carmine_store::StoreCounter>>,
}

/// Adds to a counter that only its reactor writes: a plain load and store rather than a
/// locked read-modify-write, six of which a request would otherwise pay. Readers see every
/// value whole; no update is lost because there is one writer.
fn add(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

impl ReactorMetrics {
    pub(crate) fn request(&self, kind: OpKind, ok: bool, latency: Duration, rx: usize, tx: usize) {
        let k = &self.kinds[kind as usize];
        add(&k.ops, 1);
        if !ok {
            add(&k.failed, 1);
        }
        let ns = latency.as_nanos().min(u64::MAX as u128) as u64;
        add(&k.latency_ns_sum, ns);
        let b = LATENCY_BUCKETS_NS.partition_point(|bound| *bound < ns);
        add(&k.buckets[b], 1);
        add(&self.bytes_received, rx as u64);
        add(&self.bytes_sent, tx as u64);
    }

    /// Client reads and writes so far, replica writes included (recovery yields while this
    /// moves).
    pub(crate) fn client_ops(&self) -> u64 {
        load(&self.kinds[OpKind::Read as usize].ops)
            + load(&self.kinds[OpKind::Write as usize].ops)
            + load(&self.replica_writes)
    }

    pub(crate) fn replica_write(&self) {
        add(&self.replica_writes, 1);
    }

    pub(crate) fn set_connections(&self, n: u64) {
        self.connections.store(n, Ordering::Relaxed);
    }

    pub(crate) fn refused_connection(&self) {
        add(&self.connections_refused, 1);
    }

    pub(crate) fn refused_auth(&self) {
        add(&self.auth_refused, 1);
    }

    /// The map epoch the reactor serves now.
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::Relaxed)
    }

    pub(crate) fn set_view(&self, epoch: u32, pgs: usize) {
        self.epoch.store(epoch, Ordering::Relaxed);
        self.pgs.store(pgs as u64, Ordering::Relaxed);
    }

    /// The store shard failed, for `why`: for the control thread, which stops the OSD.
    pub(crate) fn note_store_failure(&self, why: String) {
        let _ = self.store_failure.set(why);
    }

    /// Why this reactor's store shard failed, if it did.
    pub fn store_failure(&self) -> Option<&str> {
        self.store_failure.get().map(String::as_str)
    }

    /// A scrub of one PG ended with `findings` bad copies, `unrepaired` of them left so.
    pub(crate) fn scrubbed(&self, deep: bool, findings: u64) {
        add(
            if deep {
                &self.deep_scrubs
            } else {
                &self.scrubs
            },
            1,
        );
        add(&self.scrub_findings, findings);
    }

    pub(crate) fn set_pgs_inconsistent(&self, n: u64) {
        self.pgs_inconsistent.store(n, Ordering::Relaxed);
    }

    /// The replicated PGs this reactor is primary of, by state, and the objects its copies
    /// still have to fetch (refreshed every tick).
    pub(crate) fn set_pg_states(&self, states: &PgStates) {
        self.pgs_unleased.store(states.unleased, Ordering::Relaxed);
        self.pgs_active.store(states.active, Ordering::Relaxed);
        self.pgs_peering.store(states.peering, Ordering::Relaxed);
        self.pgs_incomplete
            .store(states.incomplete, Ordering::Relaxed);
        self.pgs_down.store(states.down, Ordering::Relaxed);
        self.objects_to_recover
            .store(states.to_recover, Ordering::Relaxed);
        self.objects_misplaced
            .store(states.misplaced, Ordering::Relaxed);
        self.objects_unfound
            .store(states.unfound, Ordering::Relaxed);
    }

    pub(crate) fn set_pg_listing_max(&self, bytes: u64) {
        self.pg_listing_max.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn set_silent_peers(&self, peers: Vec<(carmine_types::OsdId, u64)>) {
        *self.silent_peers.lock().unwrap_or_else(|e| e.into_inner()) = peers;
    }

    /// See [`ReactorMetrics::set_silent_peers`].
    pub fn silent_peers(&self) -> Vec<(carmine_types::OsdId, u64)> {
        self.silent_peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn recovered(&self, bytes: u64) {
        add(&self.recovered_objects, 1);
        add(&self.recovered_bytes, bytes);
    }

    /// Objects and data bytes recovered so far.
    pub(crate) fn recovered_totals(&self) -> (u64, u64) {
        (
            self.recovered_objects.load(Ordering::Relaxed),
            self.recovered_bytes.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn recovery_started(&self) {
        let now = self.recoveries_active.fetch_add(1, Ordering::Relaxed) + 1;
        self.recoveries_active_most
            .fetch_max(now, Ordering::Relaxed);
    }

    pub(crate) fn recovery_ended(&self) {
        self.recoveries_active.fetch_sub(1, Ordering::Relaxed);
    }

    pub(crate) fn set_recovery_pace(&self, bytes_per_sec: f64, objects_per_sec: f64) {
        self.recovery_bytes_per_sec
            .store(bytes_per_sec as u64, Ordering::Relaxed);
        self.recovery_milli_objects_per_sec
            .store((objects_per_sec * 1000.0) as u64, Ordering::Relaxed);
    }

    pub(crate) fn lease_refused(&self) {
        add(&self.lease_refusals, 1);
    }

    pub(crate) fn read_lease_waited(&self) {
        add(&self.read_lease_waits, 1);
    }

    pub(crate) fn write_refused_full(&self) {
        add(&self.writes_refused_full, 1);
    }

    /// Writes to replicated PGs refused because this OSD's store is full.
    pub fn writes_refused_full(&self) -> u64 {
        self.writes_refused_full.load(Ordering::Relaxed)
    }

    pub(crate) fn set_store_refused_room(&self, refused: bool) {
        self.store_refused_room
            .store(u64::from(refused), Ordering::Relaxed);
    }

    /// Whether the store counts as full because it refused a change for want of room.
    pub fn store_refused_room(&self) -> bool {
        self.store_refused_room.load(Ordering::Relaxed) != 0
    }

    pub(crate) fn write_held_by_scrub(&self) {
        add(&self.writes_held_by_scrub, 1);
    }

    /// Client writes that waited for a scrub chunk comparing their object.
    pub fn writes_held_by_scrub(&self) -> u64 {
        self.writes_held_by_scrub.load(Ordering::Relaxed)
    }

    pub(crate) fn read_held_by_write(&self) {
        add(&self.reads_held_by_writes, 1);
    }

    /// Client reads of replicated PGs that waited for a write in flight to their object.
    pub fn reads_held_by_writes(&self) -> u64 {
        self.reads_held_by_writes.load(Ordering::Relaxed)
    }

    pub(crate) fn write_held_by_reads(&self) {
        add(&self.writes_held_by_reads, 1);
    }

    /// Client writes to replicated PGs that waited for the reads of their object that came
    /// before them.
    pub fn writes_held_by_reads(&self) -> u64 {
        self.writes_held_by_reads.load(Ordering::Relaxed)
    }

    pub(crate) fn write_ack_timed_out(&self) {
        add(&self.write_ack_timeouts, 1);
    }

    /// Replicated writes answered "in doubt" because their copies did not all acknowledge
    /// them within the ack wait.
    pub fn write_ack_timeouts(&self) -> u64 {
        self.write_ack_timeouts.load(Ordering::Relaxed)
    }

    pub(crate) fn pg_copy_stopped(&self) {
        add(&self.pg_copies_stopped, 1);
    }

    /// PG copies that stopped because the store refused a change (each restarts alone).
    pub fn pg_copies_stopped(&self) -> u64 {
        self.pg_copies_stopped.load(Ordering::Relaxed)
    }

    pub(crate) fn read_lease_refused(&self) {
        add(&self.read_lease_refusals, 1);
    }

    pub(crate) fn read_repaired(&self) {
        add(&self.read_repairs, 1);
    }

    pub(crate) fn set_store_counters(&self, counters: Vec<carmine_store::StoreCounter>) {
        if let Ok(mut c) = self.store_counters.lock() {
            *c = counters;
        }
    }

    pub(crate) fn set_statfs(&self, s: carmine_store::StoreStatfs) {
        self.store_capacity.store(s.bytes_total, Ordering::Relaxed);
        self.store_used.store(s.bytes_used, Ordering::Relaxed);
        self.store_objects.store(s.objects, Ordering::Relaxed);
    }

    /// PGs this reactor is primary of whose last scrub left a bad copy (for tests and tools).
    pub fn pgs_inconsistent(&self) -> u64 {
        self.pgs_inconsistent.load(Ordering::Relaxed)
    }

    /// Objects this reactor's PG copies lack, as of the last tick (for tests and tools).
    pub fn objects_to_recover(&self) -> u64 {
        self.objects_to_recover.load(Ordering::Relaxed)
    }

    /// Objects the PGs this reactor is primary of cannot find, as of the last tick (for tests
    /// and tools).
    pub fn objects_unfound(&self) -> u64 {
        self.objects_unfound.load(Ordering::Relaxed)
    }

    /// PGs this reactor is primary of that wait as incomplete (for tests and tools).
    pub fn pgs_incomplete(&self) -> u64 {
        self.pgs_incomplete.load(Ordering::Relaxed)
    }

    /// PGs this reactor is primary of that wait for down OSDs (for tests and tools).
    pub fn pgs_down(&self) -> u64 {
        self.pgs_down.load(Ordering::Relaxed)
    }

    /// Objects this reactor's PG copies fetched from other members (for tests and tools).
    pub fn recovered_objects(&self) -> u64 {
        self.recovered_objects.load(Ordering::Relaxed)
    }

    /// Objects this reactor is recovering right now (for tests and tools).
    pub fn recoveries_active(&self) -> u64 {
        self.recoveries_active.load(Ordering::Relaxed)
    }

    /// The most objects this reactor recovered at once so far (for tests and tools).
    pub fn recoveries_active_most(&self) -> u64 {
        self.recoveries_active_most.load(Ordering::Relaxed)
    }

    /// Deep scrubs completed as primary (for tests and tools).
    pub fn deep_scrubs(&self) -> u64 {
        self.deep_scrubs.load(Ordering::Relaxed)
    }

    /// Requests of `kind` counted so far (for tests and tools).
    pub fn ops(&self, kind: &str) -> u64 {
        KINDS.iter().find(|(n, _)| *n == kind).map_or(0, |(_, k)| {
            self.kinds[*k as usize].ops.load(Ordering::Relaxed)
        })
    }
}

/// One reactor as the exposition sees it.
pub struct ReactorSource {
    pub index: usize,
    pub metrics: Arc<ReactorMetrics>,
    pub load: Arc<ReactorLoad>,
}

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// The Prometheus text format (version 0.0.4) of an OSD's reactors.
pub fn render(osd: u32, reactors: &[ReactorSource]) -> String {
    use std::fmt::Write as _;
    let mut t = String::with_capacity(8192);
    let _ = writeln!(
        t,
        "# HELP carmine_osd_up 1 while the OSD process serves.\n# TYPE carmine_osd_up gauge"
    );
    let _ = writeln!(t, "carmine_osd_up{{osd=\"{osd}\"}} 1");
    let per_reactor = |t: &mut String,
                       name: &str,
                       kind: &str,
                       help: &str,
                       value: &dyn Fn(&ReactorSource) -> String| {
        let _ = writeln!(t, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for r in reactors {
            let _ = writeln!(
                t,
                "{name}{{osd=\"{osd}\",reactor=\"{}\"}} {}",
                r.index,
                value(r)
            );
        }
    };
    per_reactor(
        &mut t,
        "carmine_osd_map_epoch",
        "gauge",
        "The map epoch the reactor serves by.",
        &|r| r.metrics.epoch.load(Ordering::Relaxed).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_pgs",
        "gauge",
        "PGs whose primary is the reactor in its map epoch.",
        &|r| load(&r.metrics.pgs).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_connections",
        "gauge",
        "Open client connections.",
        &|r| load(&r.metrics.connections).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_connections_refused_total",
        "counter",
        "Connections refused at the per-reactor limit.",
        &|r| load(&r.metrics.connections_refused).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_auth_failures_total",
        "counter",
        "Connections closed because they did not authenticate.",
        &|r| load(&r.metrics.auth_refused).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_received_bytes_total",
        "counter",
        "Request frame bytes received.",
        &|r| load(&r.metrics.bytes_received).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_sent_bytes_total",
        "counter",
        "Reply frame bytes sent.",
        &|r| load(&r.metrics.bytes_sent).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_store_failed",
        "gauge",
        "1 once the reactor's store shard has failed (it then refuses every request).",
        &|r| (r.metrics.store_failure().is_some() as u8).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_pgs_active",
        "gauge",
        "Replicated PGs this reactor is the active primary of.",
        &|r| load(&r.metrics.pgs_active).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_pgs_peering",
        "gauge",
        "Replicated PGs this reactor is primary of that are not active yet (peering, or \
         waiting for their members to take the history).",
        &|r| load(&r.metrics.pgs_peering).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_objects_to_recover",
        "gauge",
        "Objects this reactor's PG copies still have to fetch from another member.",
        &|r| load(&r.metrics.objects_to_recover).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_objects_misplaced",
        "gauge",
        "Objects this reactor's copies that are backfill targets (copies being filled while a \
         temporary acting set serves their PG) still have to fetch.",
        &|r| load(&r.metrics.objects_misplaced).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_recoveries_active",
        "gauge",
        "Objects this reactor's PG copies are fetching and storing right now (at most \
         `--recovery-max-active`, more only while clients wait for objects no worker has).",
        &|r| load(&r.metrics.recoveries_active).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_objects_unfound",
        "gauge",
        "Objects that PGs this reactor is primary of need and no member it heard from holds: \
         the PG waits, peering, for an OSD that does.",
        &|r| load(&r.metrics.objects_unfound).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_pgs_incomplete",
        "gauge",
        "PGs this reactor is primary of that wait as incomplete: every member of some recorded \
         interval answered with an empty copy (lost disks), so none vouches for its writes.",
        &|r| load(&r.metrics.pgs_incomplete).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_pgs_down",
        "gauge",
        "PGs this reactor is primary of that wait, peering, for OSDs of their recorded \
         intervals that are down: only those may hold the intervals' writes (start them, or \
         declare one whose disk is gone `carmine osd lost`).",
        &|r| load(&r.metrics.pgs_down).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_pgs_read_lease_lapsed",
        "gauge",
        "Active PGs this reactor is primary of that have gone longer than a read lease \
         without hearing all their copies (reads and writes wait: a link between OSDs is slow \
         or broken).",
        &|r| load(&r.metrics.pgs_unleased).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_pg_peering_listing_bytes_max",
        "gauge",
        "The largest object list and log, in bytes, that a PG this reactor is primary of sends \
         in one peering message (looked at every 10 s). A PG whose list outgrows a frame's \
         payload cannot peer.",
        &|r| load(&r.metrics.pg_listing_max).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_peer_silence_longest_seconds",
        "gauge",
        "The longest any other OSD that this reactor's PGs wait on has gone without answering \
         (0: every one answers); past the OSD's --peer-grace it is reported to the managers \
         as a failure.",
        &|r| {
            let longest = r.metrics.silent_peers().iter().map(|p| p.1).max();
            format!("{:.3}", longest.unwrap_or(0) as f64 / 1e9)
        },
    );
    per_reactor(
        &mut t,
        "carmine_osd_recovered_objects_total",
        "counter",
        "Objects this reactor's PG copies fetched from other members (recovery, backfill).",
        &|r| load(&r.metrics.recovered_objects).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_recovered_bytes_total",
        "counter",
        "Data bytes of the objects fetched from other members.",
        &|r| load(&r.metrics.recovered_bytes).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_recovery_bytes_per_second",
        "gauge",
        "Data bytes fetched from other members per second, over the last ten seconds.",
        &|r| load(&r.metrics.recovery_bytes_per_sec).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_recovery_objects_per_second",
        "gauge",
        "Objects fetched from other members per second, over the last ten seconds.",
        &|r| {
            format!(
                "{:.3}",
                load(&r.metrics.recovery_milli_objects_per_sec) as f64 / 1000.0
            )
        },
    );
    per_reactor(
        &mut t,
        "carmine_osd_pgs_inconsistent",
        "gauge",
        "PGs this reactor is primary of whose last scrub left a bad copy unrepaired.",
        &|r| load(&r.metrics.pgs_inconsistent).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_scrubs_total",
        "counter",
        "Light scrubs of PGs completed as their primary.",
        &|r| load(&r.metrics.scrubs).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_deep_scrubs_total",
        "counter",
        "Deep scrubs (and repairs) of PGs completed as their primary.",
        &|r| load(&r.metrics.deep_scrubs).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_scrub_findings_total",
        "counter",
        "Bad copies of objects that scrubs found.",
        &|r| load(&r.metrics.scrub_findings).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_read_repairs_total",
        "counter",
        "Reads that met a bad local copy and rewrote it from another member before answering.",
        &|r| load(&r.metrics.read_repairs).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_lease_refusals_total",
        "counter",
        "Client requests to PGs of one copy refused because the OSD's lease in etcd may have \
         run out.",
        &|r| load(&r.metrics.lease_refusals).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_replica_writes_total",
        "counter",
        "Writes of replicated PGs received from their primary, as a replica.",
        &|r| load(&r.metrics.replica_writes).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_read_lease_waits_total",
        "counter",
        "Reads of replicated PGs that waited for the primary's read lease to be renewed.",
        &|r| load(&r.metrics.read_lease_waits).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_read_lease_refusals_total",
        "counter",
        "Reads of replicated PGs refused because the read lease the other copies grant was not \
         renewed in time (the primary may be cut off from them).",
        &|r| load(&r.metrics.read_lease_refusals).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_writes_refused_full_total",
        "counter",
        "Writes to replicated PGs this reactor refused with NoSpace because its store is 95% \
         full (removals still go through).",
        &|r| load(&r.metrics.writes_refused_full).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_pg_copy_restarts_total",
        "counter",
        "Replicated PG copies on this reactor that stopped because the store refused a change \
         (no room, a device error) and restart from the store alone after a pause.",
        &|r| load(&r.metrics.pg_copies_stopped).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_writes_held_by_scrub_total",
        "counter",
        "Client writes to replicated PGs that waited while a scrub chunk compared their object \
         (writes to the PG's other objects go on).",
        &|r| load(&r.metrics.writes_held_by_scrub).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_reads_held_by_writes_total",
        "counter",
        "Client reads of replicated PGs that waited for a write in flight to their object to be \
         acknowledged (until then it could still vanish with this OSD).",
        &|r| load(&r.metrics.reads_held_by_writes).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_writes_held_by_reads_total",
        "counter",
        "Client writes to replicated PGs that waited for the reads of their object that came \
         before them (reads that come after a waiting write wait for it in turn).",
        &|r| load(&r.metrics.writes_held_by_reads).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_store_refused_room",
        "gauge",
        "1 while the reactor's store counts as full because it refused a change for want of \
         room (until 5% of it is free below that point, or a minute passed), whatever its fill \
         ratio says.",
        &|r| load(&r.metrics.store_refused_room).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_write_ack_timeouts_total",
        "counter",
        "Replicated writes answered 'in doubt, retry' because their copies had not all \
         acknowledged them in time (`OsdConfig::write_ack_wait`: a member neither answering nor \
         marked down).",
        &|r| load(&r.metrics.write_ack_timeouts).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_store_capacity_bytes",
        "gauge",
        "Capacity of the reactor's store shard (refreshed every second).",
        &|r| load(&r.metrics.store_capacity).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_store_used_bytes",
        "gauge",
        "Bytes the reactor's store shard holds (refreshed every second).",
        &|r| load(&r.metrics.store_used).to_string(),
    );
    per_reactor(
        &mut t,
        "carmine_osd_store_objects",
        "gauge",
        "Objects in the reactor's store shard (refreshed every second).",
        &|r| load(&r.metrics.store_objects).to_string(),
    );
    let secs = |ns: u64| format!("{:.9}", ns as f64 / 1e9);
    per_reactor(
        &mut t,
        "carmine_osd_reactor_busy_seconds_total",
        "counter",
        "Time the reactor loop was awake (outside its kernel wait): running tasks, or polling \
         for work (carmine_osd_reactor_polled_seconds_total).",
        &|r| secs(r.load.snapshot().busy_ns),
    );
    per_reactor(
        &mut t,
        "carmine_osd_reactor_idle_seconds_total",
        "counter",
        "Time the reactor loop spent in its kernel wait.",
        &|r| secs(r.load.snapshot().idle_ns),
    );
    per_reactor(
        &mut t,
        "carmine_osd_reactor_cpu_seconds_total",
        "counter",
        "On-CPU time of the reactor thread, user and kernel.",
        &|r| secs(r.load.snapshot().cpu_ns),
    );
    per_reactor(
        &mut t,
        "carmine_osd_reactor_polled_seconds_total",
        "counter",
        "Time in the turns of idle polls that found no work (--idle-poll-us).",
        &|r| secs(r.load.snapshot().polled_ns),
    );
    for (family, help) in [
        ("carmine_osd_requests_total", "Requests answered, by kind."),
        (
            "carmine_osd_request_failures_total",
            "Requests answered with an error, by kind.",
        ),
    ] {
        let _ = writeln!(t, "# HELP {family} {help}\n# TYPE {family} counter");
        for r in reactors {
            for (name, kind) in KINDS {
                let k = &r.metrics.kinds[kind as usize];
                let v = if family.ends_with("failures_total") {
                    load(&k.failed)
                } else {
                    load(&k.ops)
                };
                let _ = writeln!(
                    t,
                    "{family}{{osd=\"{osd}\",reactor=\"{}\",kind=\"{name}\"}} {v}",
                    r.index
                );
            }
        }
    }
    let h = "carmine_osd_request_latency_seconds";
    let _ = writeln!(
        t,
        "# HELP {h} Time from a request's decoding to its reply's encoding in the reactor.\n# TYPE {h} histogram"
    );
    for r in reactors {
        for (name, kind) in KINDS {
            let k = &r.metrics.kinds[kind as usize];
            let labels = format!("osd=\"{osd}\",reactor=\"{}\",kind=\"{name}\"", r.index);
            let mut cumulative = 0;
            for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
                cumulative += load(&k.buckets[i]);
                let _ = writeln!(t, "{h}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
            }
            cumulative += load(&k.buckets[LATENCY_BUCKETS.len()]);
            let _ = writeln!(t, "{h}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
            let _ = writeln!(t, "{h}_sum{{{labels}}} {}", secs(load(&k.latency_ns_sum)));
            let _ = writeln!(t, "{h}_count{{{labels}}} {cumulative}");
        }
    }
    render_store_counters(&mut t, osd, reactors);
    t
}

/// The store's own counters, by the names the first reactor's store gives (every reactor of
/// an OSD runs the same kind of store).
fn render_store_counters(t: &mut String, osd: u32, reactors: &[ReactorSource]) {
    use std::fmt::Write as _;
    let each: Vec<Vec<carmine_store::StoreCounter>> = reactors
        .iter()
        .map(|r| {
            r.metrics
                .store_counters
                .lock()
                .map_or(Vec::new(), |c| c.clone())
        })
        .collect();
    let Some(first) = each.first() else {
        return;
    };
    for c in first {
        let name = format!("carmine_{}", c.name);
        let kind = if c.gauge { "gauge" } else { "counter" };
        let _ = writeln!(t, "# HELP {name} {}\n# TYPE {name} {kind}", c.help);
        for (r, counters) in reactors.iter().zip(&each) {
            if let Some(v) = counters.iter().find(|v| v.name == c.name) {
                let _ = writeln!(
                    t,
                    "{name}{{osd=\"{osd}\",reactor=\"{}\"}} {}",
                    r.index, v.value
                );
            }
        }
    }
}

/// A serving metrics endpoint; dropping it stops the thread.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    join: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept with a connection of our own.
        let _ = std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

/// How long one scrape may take to send its request line before it is dropped.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

/// Serves `GET /metrics` on `addr` from a plain thread, one scrape at a time.
pub fn serve_metrics(
    addr: SocketAddr,
    osd: u32,
    reactors: Vec<ReactorSource>,
) -> std::io::Result<MetricsServer> {
    let listener = TcpListener::bind(addr)?;
    let addr = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let join = std::thread::Builder::new()
        .name(format!("osd{osd}-metrics"))
        .spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(SCRAPE_TIMEOUT));
                let _ = conn.set_write_timeout(Some(SCRAPE_TIMEOUT));
                let mut line = String::new();
                let mut reader = BufReader::new(&conn);
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                // Headers up to the blank line; their content does not matter here.
                let mut header = String::new();
                while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                    header.clear();
                }
                let path = line.split_whitespace().nth(1).unwrap_or("");
                let (status, body) = if line.starts_with("GET ") && path == "/metrics" {
                    ("200 OK", render(osd, &reactors))
                } else {
                    ("404 Not Found", "only GET /metrics is served here\n".into())
                };
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        })?;
    Ok(MetricsServer {
        addr,
        stop,
        join: Some(join),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_land_in_their_buckets_and_render_cumulatively() {
        let m = Arc::new(ReactorMetrics::default());
        m.request(OpKind::Read, true, Duration::from_micros(20), 100, 4200);
        m.request(OpKind::Read, true, Duration::from_micros(25), 100, 4200);
        m.request(OpKind::Read, false, Duration::from_micros(700), 100, 50);
        m.request(OpKind::Write, true, Duration::from_secs(3), 4200, 30);
        m.set_view(7, 12);
        let text = render(
            3,
            &[ReactorSource {
                index: 0,
                metrics: m.clone(),
                load: Arc::new(ReactorLoad::default()),
            }],
        );
        let has = |line: &str| assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        has(
            r#"carmine_osd_request_latency_seconds_bucket{osd="3",reactor="0",kind="read",le="0.000025"} 2"#,
        );
        has(
            r#"carmine_osd_request_latency_seconds_bucket{osd="3",reactor="0",kind="read",le="0.0005"} 2"#,
        );
        has(
            r#"carmine_osd_request_latency_seconds_bucket{osd="3",reactor="0",kind="read",le="0.001"} 3"#,
        );
        has(
            r#"carmine_osd_request_latency_seconds_bucket{osd="3",reactor="0",kind="write",le="1"} 0"#,
        );
        has(
            r#"carmine_osd_request_latency_seconds_bucket{osd="3",reactor="0",kind="write",le="+Inf"} 1"#,
        );
        has(r#"carmine_osd_request_latency_seconds_count{osd="3",reactor="0",kind="read"} 3"#);
        has(r#"carmine_osd_request_failures_total{osd="3",reactor="0",kind="read"} 1"#);
        has(r#"carmine_osd_requests_total{osd="3",reactor="0",kind="write"} 1"#);
        has(r#"carmine_osd_received_bytes_total{osd="3",reactor="0"} 4500"#);
        has(r#"carmine_osd_sent_bytes_total{osd="3",reactor="0"} 8480"#);
        has(r#"carmine_osd_map_epoch{osd="3",reactor="0"} 7"#);
        has(r#"carmine_osd_pgs{osd="3",reactor="0"} 12"#);
        assert_eq!(m.ops("read"), 3);
    }
}
