//! Recovery in the background (decision 0009, point 7): a PG copy goes active as soon as
//! every member has taken the authoritative history, and each member then fetches the objects
//! its store lacks ([`Member::missing`](carmine_pg::Member)) one at a time, from a member that
//! holds them, behind client I/O: at a configured rate per reactor, a lower one while clients
//! are active on the reactor, except the objects a client waits for, which go first and are
//! not held back by either rate.
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
use std::cell::Cell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Default for [`RecoveryConfig::rate`]: bytes per second per reactor.
pub const RECOVERY_RATE_DEFAULT: u64 = 128 << 20;
/// Default for [`RecoveryConfig::busy_rate`]: an eighth of the idle rate.
pub const RECOVERY_BUSY_RATE_DEFAULT: u64 = 16 << 20;
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
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        RecoveryConfig {
            rate: Some(RECOVERY_RATE_DEFAULT),
            busy_rate: Some(RECOVERY_BUSY_RATE_DEFAULT),
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

/// Starts `pgr`'s recovery task if its member lacks objects it may fetch now and none runs.
pub(crate) fn kick<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, pgr: &Rc<PgReplica>) {
    if pgr.recovering.get() || pgr.broken.borrow().is_some() {
        return;
    }
    if pgr.member.borrow().recoverable().is_none() {
        return;
    }
    pgr.recovering.set(true);
    let (shard, pgr) = (shard.clone(), pgr.clone());
    carmine_reactor::spawn(async move {
        run(&shard, &pgr).await;
        pgr.recovering.set(false);
        // Work may have come while the task was ending.
        kick(&shard, &pgr);
    })
    .detach();
}

/// The next object to fetch: one a client waits for, else the first after `after` in name
/// order (wrapping around), skipping those no member sent lately.
fn next(
    pgr: &PgReplica,
    after: &Option<String>,
    failed: &BTreeSet<String>,
) -> Option<(String, Version, bool)> {
    let m = pgr.member.borrow();
    let missing = m.recoverable()?;
    let mut urgent = pgr.urgent.borrow_mut();
    urgent.retain(|o| missing.contains_key(o));
    if let Some(o) = urgent.iter().next() {
        return Some((o.clone(), missing[o], true));
    }
    let start = after.as_deref().unwrap_or("");
    let pick = missing
        .range::<str, _>((std::ops::Bound::Excluded(start), std::ops::Bound::Unbounded))
        .chain(missing.iter())
        .find(|(o, _)| !failed.contains(*o));
    match pick {
        Some((o, v)) => Some((o.clone(), *v, false)),
        // Every one failed lately: try them all again.
        None => missing.iter().next().map(|(o, v)| (o.clone(), *v, false)),
    }
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

async fn run<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, pgr: &Rc<PgReplica>) {
    let pg = pgr.pg;
    let mut after: Option<String> = None;
    let mut failed: BTreeSet<String> = BTreeSet::new();
    let mut complained: BTreeSet<String> = BTreeSet::new();
    let started = Instant::now();
    let mut count = 0u64;
    loop {
        if pgr.broken.borrow().is_some() {
            return;
        }
        let Some((oid, version, urgent)) = next(pgr, &after, &failed) else {
            if count > 0 {
                tracing::info!(%pg, objects = count, secs = started.elapsed().as_secs_f64(),
                    "recovered in the background");
            }
            return;
        };
        if !urgent {
            shard
                .replication
                .budget
                .ready(
                    || shard.metrics.client_ops(),
                    || !pgr.urgent.borrow().is_empty(),
                )
                .await;
            if !pgr.urgent.borrow().is_empty() {
                continue;
            }
        }
        let reserved = if urgent { 0 } else { RESERVED };
        shard.replication.budget.spend(reserved);
        let mut got = None;
        for from in candidates(shard, pgr) {
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
                if complained.insert(oid.clone()) {
                    tracing::warn!(%pg, oid, %version,
                        "no member sent this object at its version yet: asking again");
                }
                failed.insert(oid.clone());
                after = Some(oid);
                carmine_reactor::sleep(RETRY_PAUSE).await;
            }
            continue;
        };
        failed.remove(&oid);
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
        // One object at a time per PG: its copy is in memory until stored.
        match rx.await {
            Ok(Stored::Yes) => {
                shard.metrics.recovered(bytes);
                count += 1;
            }
            Ok(Stored::NoRoom) => {
                failed.insert(oid.clone());
                carmine_reactor::sleep(NO_ROOM_PAUSE).await;
            }
            Ok(Stored::NotWanted) | Err(_) => {}
        }
        after = Some(oid);
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
        });
        assert_eq!(same.rate_now(7), Some(100 << 20));
        let unlimited = Budget::new(RecoveryConfig {
            rate: None,
            busy_rate: Some(10 << 20),
        });
        assert_eq!(unlimited.rate_now(0), None);
        assert_eq!(unlimited.rate_now(1), Some(10 << 20));
        // A busy rate above the rate is the rate: never faster while clients are busy.
        let slow = Budget::new(RecoveryConfig {
            rate: Some(2 << 20),
            busy_rate: Some(16 << 20),
        });
        assert_eq!(slow.rate_now(1), Some(2 << 20));
    }

    #[test]
    fn tokens_earned_while_idle_do_not_carry_into_a_busy_spell() {
        let b = Budget::new(RecoveryConfig {
            rate: Some(100 << 20),
            busy_rate: Some(10 << 20),
        });
        // A full idle second's budget, then clients arrive: at most a busy second's worth
        // may be spent before recovery waits.
        let rate = b.rate_now(5).unwrap();
        b.refill(rate);
        assert!(b.tokens.get() <= 10 << 20, "{}", b.tokens.get());
    }
}
