//! Recovery in the background (decision 0009, point 7): a PG copy goes active as soon as
//! every member has taken the authoritative history, and each member then fetches the objects
//! its store lacks ([`Member::missing`](carmine_pg::Member)) from a member that holds them,
//! behind client I/O: at a configured rate per reactor, a lower one while clients are active
//! on the reactor, except the objects a client waits for, which go first and are not held
//! back by either rate. Workers fetch one object each at a time; a reactor runs at most
//! `max_active` of them over all its PGs, so a few PGs still recover with overlapping
//! fetches and many never hold more than that many copies in memory — and as many again for
//! objects clients wait for, which are fetched side by side.
//!
//! A fetched object is stored through the PG's persist queue ([`Job::Recovered`]), in order
//! with the copy's other changes, and in one transaction with the record saying it is no
//! longer missing; only then does the member hear [`Event::Recovered`].

use super::{pull, queue_job, Job, PgReplica, Stored};
use crate::reactor::Shard;
use carmine_pg::Version;
use carmine_store::ObjectStore;
use carmine_types::OsdId;
use futures::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Default for [`RecoveryConfig::rate`]: bytes per second per reactor.
pub const RECOVERY_RATE_DEFAULT: u64 = 128 << 20;
/// Default for [`RecoveryConfig::busy_rate`]: an eighth of the idle rate.
pub const RECOVERY_BUSY_RATE_DEFAULT: u64 = 16 << 20;
/// Default for [`RecoveryConfig::max_active`].
pub const RECOVERY_MAX_ACTIVE_DEFAULT: usize = 4;
/// Default for [`RecoveryConfig::backfill_min_objects`]. A temporary acting set costs a
/// primary change for about a third of the PGs each way (to the set, and back once the
/// targets are full), each waiting out the old primary's read leases (~2 s of near-stalled
/// writes), and a slower fill (at the background rate, where clients' misses were fetched
/// at once): it pays only when clients would wait longer for the objects they touch. A
/// 1 GiB volume over 64 PGs (4 objects of 4 MiB each) refills on demand in ~5 s on the
/// test VM, about when a set would come; 4 GiB (16 each) did far better with sets
/// (BENCHMARKS 2026-11-29).
pub const BACKFILL_MIN_OBJECTS_DEFAULT: usize = 8;
/// A reactor counts as busy with clients for this long after a client request came in.
const BUSY_WINDOW: Duration = Duration::from_millis(100);
/// Pause before asking again for an object no member sent.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// The pause after a store had no room for a recovered object (room comes back only when
/// clients remove objects).
const NO_ROOM_PAUSE: Duration = Duration::from_secs(1);
/// How long a recovery held back by the rate sleeps before it looks for urgent objects.
const READY_SLICE: Duration = Duration::from_millis(10);
/// What a copy takes from the budget before its size is known (a volume object's size), so
/// that the PGs of a reactor do not all start copying on the same second's budget; the
/// difference is settled once the object arrives.
const RESERVED: i64 = 4 << 20;

/// How fast replicated PGs recover in the background.
#[derive(Clone, Copy, Debug)]
pub struct RecoveryConfig {
    /// Bytes per second each reactor copies for recovery, objects a client waits for aside.
    /// `None`: as fast as the members send.
    pub rate: Option<u64>,
    /// The same while clients are active on the reactor (a read or write of theirs came in
    /// the last 100 ms): client I/O first, recovery still moving. `None`: `rate`; never more
    /// than `rate`.
    pub busy_rate: Option<u64>,
    /// Objects each reactor recovers at once, all its PGs together (one PG may use them
    /// all): fetches overlap with each other and with the stores of those already fetched.
    /// Objects clients wait for may take as many again.
    pub max_active: usize,
    /// Objects an acting member must lack of a PG (and at least half of them) for its
    /// primary to ask for a temporary acting set that leaves it out while it fills as a
    /// backfill target (decision 0015; `Member::wants_temp`).
    pub backfill_min_objects: usize,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            rate: Some(RECOVERY_RATE_DEFAULT),
            busy_rate: Some(RECOVERY_BUSY_RATE_DEFAULT),
            max_active: RECOVERY_MAX_ACTIVE_DEFAULT,
            backfill_min_objects: BACKFILL_MIN_OBJECTS_DEFAULT,
        }
    }
}

/// A reactor's recovery budget: a token bucket of one second's worth of bytes, which a copy
/// overdraws and then waits out. Its rate is the busy one while clients are active.
pub(crate) struct Budget {
    rate: Option<u64>,
    busy_rate: Option<u64>,
    /// Bytes available (negative: owed) as of `at`.
    tokens: Cell<i64>,
    at: Cell<Instant>,
    /// The reactor's client request count when last looked at, and when it last moved.
    client_ops: Cell<u64>,
    busy_at: Cell<Option<Instant>>,
}

impl Budget {
    pub fn new(cfg: RecoveryConfig) -> Self {
        let rate = cfg.rate.filter(|r| *r > 0);
        Budget {
            rate,
            // Never faster while busy than while idle.
            busy_rate: match (cfg.busy_rate.filter(|r| *r > 0), rate) {
                (Some(b), Some(r)) => Some(b.min(r)),
                (b, r) => b.or(r),
            },
            tokens: Cell::new(cfg.rate.unwrap_or(0) as i64),
            at: Cell::new(Instant::now()),
            client_ops: Cell::new(0),
            busy_at: Cell::new(None),
        }
    }

    /// The rate now, given the reactor's count of client requests so far.
    fn rate_now(&self, client_ops: u64) -> Option<u64> {
        if self.client_ops.replace(client_ops) != client_ops {
            self.busy_at.set(Some(Instant::now()));
        }
        let busy = self
            .busy_at
            .get()
            .is_some_and(|t| t.elapsed() < BUSY_WINDOW);
        if busy {
            self.busy_rate
        } else {
            self.rate
        }
    }

    fn refill(&self, rate: u64) {
        let now = Instant::now();
        let earned = now.duration_since(self.at.get()).as_secs_f64() * rate as f64;
        self.at.set(now);
        let t = (self.tokens.get() as f64 + earned).min(rate as f64);
        self.tokens.set(t as i64);
    }

    /// Waits until the budget is not in debt, or `interrupt` says something more pressing
    /// came (it is asked every [`READY_SLICE`]). `client_ops`: the reactor's count of client
    /// requests so far (whether it moves says whether clients are active).
    async fn ready(&self, client_ops: impl Fn() -> u64, interrupt: impl Fn() -> bool) {
        loop {
            let Some(rate) = self.rate_now(client_ops()) else {
                return;
            };
            self.refill(rate);
            let t = self.tokens.get();
            if t >= 0 || interrupt() {
                return;
            }
            let wait = Duration::from_secs_f64((-t) as f64 / rate as f64);
            carmine_reactor::sleep(wait.clamp(Duration::from_millis(1), READY_SLICE)).await;
        }
    }

    /// Takes `bytes` from the budget (negative: gives them back).
    fn spend(&self, bytes: i64) {
        if let Some(rate) = self.rate.max(self.busy_rate) {
            self.refill(rate);
            self.tokens.set(self.tokens.get() - bytes);
        }
    }
}

/// Recovery's pace over a sliding window of about ten seconds, from the recovery counters
/// sampled once a second.
pub(crate) struct Pace {
    /// (when, objects, bytes), oldest first.
    samples: std::collections::VecDeque<(Instant, u64, u64)>,
}

/// The window [`Pace`] averages over, in one-second samples.
const PACE_SAMPLES: usize = 11;

impl Pace {
    pub fn new() -> Self {
        Pace {
            samples: std::collections::VecDeque::with_capacity(PACE_SAMPLES + 1),
        }
    }

    /// Takes the counters' values now; answers (bytes/s, objects/s) over the window.
    pub fn update(&mut self, objects: u64, bytes: u64) -> (f64, f64) {
        let now = Instant::now();
        if self
            .samples
            .back()
            .is_none_or(|(t, _, _)| now.duration_since(*t) >= Duration::from_secs(1))
        {
            self.samples.push_back((now, objects, bytes));
            if self.samples.len() > PACE_SAMPLES {
                self.samples.pop_front();
            }
        }
        let Some(&(t0, o0, b0)) = self.samples.front() else {
            return (0.0, 0.0);
        };
        let secs = now.duration_since(t0).as_secs_f64();
        if secs < 0.5 {
            return (0.0, 0.0);
        }
        (
            bytes.saturating_sub(b0) as f64 / secs,
            objects.saturating_sub(o0) as f64 / secs,
        )
    }
}

/// A PG copy's recovery: its workers, the objects they fetch now, and where the background
/// pass stands.
#[derive(Default)]
pub(crate) struct PgRecovery {
    /// Worker tasks running for this PG.
    workers: Cell<usize>,
    /// Objects a worker is fetching or storing now: no other worker takes them.
    in_flight: RefCell<BTreeSet<String>>,
    /// Objects no member sent lately: tried again after the others.
    failed: RefCell<BTreeSet<String>>,
    /// Objects the log already said no member sent.
    complained: RefCell<BTreeSet<String>>,
    /// The last object taken in name order.
    after: RefCell<Option<String>>,
    /// Objects recovered since the first worker of this pass started, and when it did.
    count: Cell<u64>,
    started: Cell<Option<Instant>>,
}

/// A reactor's recovery slots: how many objects its PGs may be recovering at once, all PGs
/// together (twice `max` at most, the second half only for objects clients wait for). Each is
/// a copy in memory until stored, so the bound is on memory as much as on the load recovery
/// puts on the members and the device.
pub(crate) struct Slots {
    max: usize,
    active: Cell<usize>,
    /// A PG found no free slot: kick every PG when one frees.
    starved: Cell<bool>,
}

impl Slots {
    pub fn new(cfg: RecoveryConfig) -> Self {
        Slots {
            max: cfg.max_active.max(1),
            active: Cell::new(0),
            starved: Cell::new(false),
        }
    }
}

/// Starts workers for `pgr`'s recovery while its member lacks objects no worker has taken,
/// and the reactor has free slots. Objects a client waits for get a worker each even past the
/// bound, up to as many again: a client rarely waits for other PGs' background copies, or for
/// another client's object. (Not those no member sent lately: they are tried again like the
/// others, by one worker after a pause, off the rate.)
pub(crate) fn kick<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, pgr: &Rc<PgReplica>) {
    if pgr.broken.borrow().is_some() {
        return;
    }
    let slots = &shard.replication.slots;
    loop {
        let rec = &pgr.recovery;
        let (untaken, lacks, urgent_untaken) = {
            let m = pgr.member.borrow();
            let Some(missing) = m.recoverable() else {
                return;
            };
            let busy = rec.in_flight.borrow();
            let failed = rec.failed.borrow();
            // Objects no member sent lately are tried again by one worker of the PG at a
            // time (see `run`), not by as many as the slots allow. (The one retrying holds
            // one that is both: counted once.)
            let both = busy.iter().filter(|o| failed.contains(*o)).count();
            let untaken = missing
                .len()
                .saturating_sub(busy.len() + failed.len() - both);
            let urgent = pgr
                .urgent
                .borrow()
                .iter()
                .filter(|o| missing.contains_key(*o) && !busy.contains(*o) && !failed.contains(*o))
                .count();
            (untaken, !missing.is_empty(), urgent)
        };
        let workers = rec.workers.get();
        let wanted = match untaken {
            0 if lacks && workers == 0 => 1,
            n => n,
        };
        // Workers that are between two objects take the untaken ones.
        let idle = workers - rec.in_flight.borrow().len().min(workers);
        if wanted <= idle {
            return;
        }
        // Each idle worker takes an object a client waits for first (`next`); past the
        // bound, a copy in memory each, up to as many again as the bound.
        let bypass = urgent_untaken > idle && slots.active.get() < 2 * slots.max;
        if slots.active.get() >= slots.max && !bypass {
            // Only a PG with no worker waits for a slot: one that has some goes on with them.
            if workers == 0 {
                slots.starved.set(true);
            }
            return;
        }
        spawn_worker(shard, pgr);
    }
}

fn spawn_worker<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, pgr: &Rc<PgReplica>) {
    let slots = &shard.replication.slots;
    slots.active.set(slots.active.get() + 1);
    let rec = &pgr.recovery;
    rec.workers.set(rec.workers.get() + 1);
    if rec.started.get().is_none() {
        rec.started.set(Some(Instant::now()));
        rec.count.set(0);
    }
    let (shard, pgr) = (shard.clone(), pgr.clone());
    carmine_reactor::spawn(async move {
        // Counted out however the worker ends, dropped with its reactor included.
        let worker = Worker {
            shard: &shard,
            pgr: &pgr,
        };
        run(&shard, &pgr).await;
        drop(worker);
        // Work may have come while the worker was ending, in a PG that waits for a slot
        // (first: the slot is theirs) or here. (Not from the guard: a worker dropped with
        // its reactor starts nothing.)
        let slots = &shard.replication.slots;
        if slots.starved.replace(false) {
            let pgs: Vec<_> = shard.replication.pgs.borrow().values().cloned().collect();
            for other in pgs.iter().filter(|o| !Rc::ptr_eq(o, &pgr)) {
                kick(&shard, other);
            }
        }
        kick(&shard, &pgr);
    })
    .detach();
}

/// A running worker: gives its slot back however it ends.
struct Worker<'a, S: ObjectStore + 'static> {
    shard: &'a Rc<Shard<S>>,
    pgr: &'a Rc<PgReplica>,
}

impl<S: ObjectStore + 'static> Drop for Worker<'_, S> {
    fn drop(&mut self) {
        let (shard, pgr) = (self.shard, self.pgr);
        let slots = &shard.replication.slots;
        slots.active.set(slots.active.get() - 1);
        let rec = &pgr.recovery;
        rec.workers.set(rec.workers.get() - 1);
        if rec.workers.get() == 0 {
            // Forget what no longer lacks (a new history, a write that brought it).
            if let Ok(m) = pgr.member.try_borrow() {
                let missing = m.recoverable();
                let lacks = |o: &String| missing.is_some_and(|mm| mm.contains_key(o));
                rec.failed.borrow_mut().retain(|o| lacks(o));
                rec.complained.borrow_mut().retain(|o| lacks(o));
            }
            if let Some(started) = rec.started.take() {
                if rec.count.get() > 0 {
                    tracing::info!(pg = %pgr.pg, objects = rec.count.get(),
                        secs = started.elapsed().as_secs_f64(), "recovered in the background");
                }
            }
        }
    }
}

/// An object being fetched and stored: counted in the reactor's gauge while it lives.
struct Fetching<'a> {
    metrics: &'a crate::metrics::ReactorMetrics,
}

impl<'a> Fetching<'a> {
    fn new<S>(shard: &'a Shard<S>) -> Self {
        shard.metrics.recovery_started();
        Fetching {
            metrics: &shard.metrics,
        }
    }
}

impl Drop for Fetching<'_> {
    fn drop(&mut self) {
        self.metrics.recovery_ended();
    }
}

/// An object a worker took: no other worker takes it until this is dropped.
struct Taken<'a> {
    rec: &'a PgRecovery,
    oid: String,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.rec.in_flight.borrow_mut().remove(&self.oid);
    }
}

/// Whether a client waits for an object of `pgr` that no worker fetches yet.
fn urgent_untaken(pgr: &PgReplica) -> bool {
    let m = pgr.member.borrow();
    let Some(missing) = m.recoverable() else {
        return false;
    };
    let busy = pgr.recovery.in_flight.borrow();
    let failed = pgr.recovery.failed.borrow();
    pgr.urgent
        .borrow()
        .iter()
        .any(|o| missing.contains_key(o) && !busy.contains(o) && !failed.contains(o))
}

/// Takes the next object to fetch: one a client waits for, else the first after the last one
/// taken in name order (wrapping around), skipping those no member sent lately (unless only
/// they are left: then those a client waits for first), and always those another worker
/// has. Also says whether a client waits for it (it then goes off the rate).
fn next(pgr: &PgReplica) -> Option<(Taken<'_>, Version, bool)> {
    let m = pgr.member.borrow();
    let missing = m.recoverable()?;
    let rec = &pgr.recovery;
    let mut urgent = pgr.urgent.borrow_mut();
    urgent.retain(|o| missing.contains_key(o));
    let (oid, version, in_order) = {
        let busy = rec.in_flight.borrow();
        let failed = rec.failed.borrow();
        let free = |o: &String| !busy.contains(o);
        if let Some(o) = urgent.iter().find(|o| free(o) && !failed.contains(*o)) {
            (o.clone(), missing[o], false)
        } else {
            let after = rec.after.borrow();
            let start = after.as_deref().unwrap_or("");
            let pick = missing
                .range::<str, _>((std::ops::Bound::Excluded(start), std::ops::Bound::Unbounded))
                .chain(missing.iter())
                .find(|(o, _)| free(o) && !failed.contains(*o))
                // Every one left failed lately: try them again.
                .or_else(|| {
                    urgent
                        .iter()
                        .find(|o| free(o))
                        .and_then(|o| missing.get_key_value(o))
                })
                .or_else(|| missing.iter().find(|(o, _)| free(o)))?;
            (pick.0.clone(), *pick.1, true)
        }
    };
    if in_order {
        *rec.after.borrow_mut() = Some(oid.clone());
    }
    let is_urgent = urgent.contains(&oid);
    rec.in_flight.borrow_mut().insert(oid.clone());
    Some((Taken { rec, oid }, version, is_urgent))
}

/// Who may hold the objects: the primary, the member whose history won, the others of the
/// acting set, then every member of the recorded intervals (one of them held each object
/// when the history was chosen).
fn candidates<S>(shard: &Shard<S>, pgr: &PgReplica) -> Vec<OsdId> {
    let m = pgr.member.borrow();
    let mut c: Vec<OsdId> = Vec::new();
    let from_history = m.history().iter().flat_map(|i| i.acting.iter().copied());
    for o in m
        .acting()
        .iter()
        .copied()
        .take(1)
        .chain(pgr.last_source.get())
        .chain(m.acting().iter().copied())
        .chain(from_history)
    {
        if o != shard.osd && !c.contains(&o) {
            c.push(o);
        }
    }
    c
}

/// One worker: takes objects one after the other until none is left untaken.
async fn run<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, pgr: &Rc<PgReplica>) {
    let pg = pgr.pg;
    let rec = &pgr.recovery;
    let slots = &shard.replication.slots;
    loop {
        if pgr.broken.borrow().is_some() {
            return;
        }
        // Past the bound (a worker started for a client's object): only while a client
        // waits for one no worker has.
        if slots.active.get() > slots.max && !urgent_untaken(pgr) {
            return;
        }
        let Some((taken, version, urgent)) = next(pgr) else {
            return;
        };
        let oid = taken.oid.clone();
        let wanted_now = || pgr.urgent.borrow().contains(&oid);
        let mut urgent = urgent;
        if !urgent {
            shard
                .replication
                .budget
                .ready(
                    || shard.metrics.client_ops(),
                    || urgent_untaken(pgr) || wanted_now(),
                )
                .await;
            // A client came to wait for this very object: it goes now, off the budget.
            urgent = wanted_now();
            if !urgent && urgent_untaken(pgr) {
                // Put this one back and take the object a client waits for.
                continue;
            }
        }
        let reserved = if urgent { 0 } else { RESERVED };
        shard.replication.budget.spend(reserved);
        let fetching = Fetching::new(shard);
        let mut got = None;
        for from in candidates(shard, pgr) {
            if pgr.broken.borrow().is_some() {
                return;
            }
            // Only a copy of that very version: a member may be recovering it itself.
            if let Some((held, Some(copy))) = pull::fetch(shard, pg, from, &oid).await {
                if held == version {
                    got = Some(copy);
                    break;
                }
            }
            // Stop early if the object is no longer wanted (a new history came).
            if pgr.member.borrow().missing.get(&oid) != Some(&version) {
                break;
            }
        }
        let Some(copy) = got else {
            shard.replication.budget.spend(-reserved);
            if pgr.member.borrow().missing.get(&oid) == Some(&version) {
                if rec.complained.borrow_mut().insert(oid.clone()) {
                    tracing::warn!(%pg, oid, %version,
                        "no member sent this object at its version yet: asking again");
                }
                rec.failed.borrow_mut().insert(oid);
                drop(fetching);
                // One worker of a PG tries again what no member sent, after a pause; it
                // gives its slot to a PG that waits for one rather than keep it for objects
                // that may not come for long.
                if rec.workers.get() > 1 || slots.starved.get() {
                    return;
                }
                carmine_reactor::sleep(RETRY_PAUSE).await;
            }
            continue;
        };
        rec.failed.borrow_mut().remove(&oid);
        let bytes = copy.data.len() as u64;
        // The rate holds back the background only: a client waits for an urgent object.
        if !urgent {
            shard.replication.budget.spend(bytes as i64 - reserved);
        }
        let (tx, rx) = oneshot::channel();
        queue_job(
            shard,
            pgr,
            Job::Recovered {
                oid: oid.clone(),
                version,
                copy,
                done: tx,
            },
        );
        // The object stays taken until stored: its copy is in memory until then.
        match rx.await {
            Ok(Stored::Yes) => {
                shard.metrics.recovered(bytes);
                rec.count.set(rec.count.get() + 1);
            }
            Ok(Stored::NoRoom) => {
                rec.failed.borrow_mut().insert(oid);
                drop(fetching);
                carmine_reactor::sleep(NO_ROOM_PAUSE).await;
            }
            Ok(Stored::NotWanted) | Err(_) => {}
        }
        drop(taken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_runs_at_the_busy_rate_while_client_requests_come_in_and_at_the_rate_after() {
        let b = Budget::new(RecoveryConfig {
            rate: Some(100 << 20),
            busy_rate: Some(10 << 20),
            ..Default::default()
        });
        assert_eq!(b.rate_now(0), Some(100 << 20), "no client request yet");
        assert_eq!(b.rate_now(3), Some(10 << 20), "requests came in");
        assert_eq!(b.rate_now(3), Some(10 << 20), "within the busy window");
        std::thread::sleep(BUSY_WINDOW + Duration::from_millis(20));
        assert_eq!(b.rate_now(3), Some(100 << 20), "quiet for the busy window");
        // Without a busy rate, the rate holds throughout; without a rate, there is no limit
        // while idle.
        let same = Budget::new(RecoveryConfig {
            rate: Some(100 << 20),
            busy_rate: None,
            ..Default::default()
        });
        assert_eq!(same.rate_now(7), Some(100 << 20));
        let unlimited = Budget::new(RecoveryConfig {
            rate: None,
            busy_rate: Some(10 << 20),
            ..Default::default()
        });
        assert_eq!(unlimited.rate_now(0), None);
        assert_eq!(unlimited.rate_now(1), Some(10 << 20));
        // A busy rate above the rate is the rate: never faster while clients are busy.
        let slow = Budget::new(RecoveryConfig {
            rate: Some(2 << 20),
            busy_rate: Some(16 << 20),
            ..Default::default()
        });
        assert_eq!(slow.rate_now(1), Some(2 << 20));
    }

    #[test]
    fn tokens_earned_while_idle_do_not_carry_into_a_busy_spell() {
        let b = Budget::new(RecoveryConfig {
            rate: Some(100 << 20),
            busy_rate: Some(10 << 20),
            ..Default::default()
        });
        // A full idle second's budget, then clients arrive: at most a busy second's worth
        // may be spent before recovery waits.
        let rate = b.rate_now(5).unwrap();
        b.refill(rate);
        assert!(b.tokens.get() <= 10 << 20, "{}", b.tokens.get());
    }
}
