//! Replicated PGs on one reactor (decision 0009): the host of `carmine_pg::Member`. It feeds
//! each member the events of its PG — map epochs with the PG's recorded history, messages from
//! the other members, client writes, store completions, ticks — and carries out what the
//! member asks: messages to other OSDs' reactors (`peers`), records in the map store's PG
//! history (`history`, on a worker thread), store transactions (`persist`), and answers to
//! waiting clients (`write`).
//!
//! Everything runs on the reactor's thread; the member is borrowed only inside one
//! synchronous step, never across an await. Pools of one copy do not come here: they are
//! served as before, without a log.

mod access;
mod adopt;
pub(crate) mod history;
mod layout;
pub use layout::check_pg_state;
pub(crate) use purge::remove_state_and_objects;
mod peers;
mod persist;
mod pull;
mod purge;
mod recover;
mod restart;
mod scrub;
mod temps;
mod write;

pub(crate) use access::ReadTurn;
pub(crate) use adopt::UnversionedWrite;
pub(crate) use carmine_pg::envelope::{Body, ObjectCopy, PeerMessage};
pub use recover::{
    RecoveryConfig, BACKFILL_MIN_OBJECTS_DEFAULT, RECOVERY_BUSY_RATE_DEFAULT,
    RECOVERY_MAX_ACTIVE_DEFAULT, RECOVERY_RATE_DEFAULT,
};
pub use scrub::ScrubSchedule;
pub(crate) use scrub::{give_up_unfound, repair_for_read, scrub};
pub(crate) use write::{ready_to_read, write};

use crate::reactor::Shard;
use carmine_cluster::{pg_to_reactor_index, OsdMap};
use carmine_pg::{Action, Event, Member, Msg, OpKind, Persisting, ReqId, Version};
use carmine_proto::OsdOp;
use carmine_store::{ObjectStore, Transaction};
use carmine_types::{OsdId, PgId};
use futures::channel::oneshot;
use history::{Answer, Ask, HistoryClient};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Default for `OsdConfig::read_lease`: short enough that a primary cut off from its copies
/// stops serving reads well before the default etcd TTL (5 s) has it marked down, so a
/// failover waits for nothing more; long enough that pings every quarter of it survive a
/// loaded reactor's pauses.
pub const READ_LEASE_DEFAULT: Duration = Duration::from_secs(2);
/// The longest read lease an OSD may grant (`--read-lease`): a peer that reports a lease
/// running longer (a bug, or a damaged message) is waited out only this long.
pub const READ_LEASE_MAX: Duration = Duration::from_secs(60);
/// Default for `OsdConfig::write_ack_wait`: a member that neither acknowledges a write nor is
/// marked down must not hold its client forever; well past a failover (peer grace, then
/// peering), within a client's default patience (30 s) of retries.
pub const WRITE_ACK_WAIT_DEFAULT: Duration = Duration::from_secs(20);
/// How often members resend what the network may have lost (peering messages, replica
/// writes not yet acknowledged) and PGs waiting on the map store ask again.
const TICK: Duration = Duration::from_millis(100);
/// An active primary needs its ticks only to resend replica writes lost on a broken
/// connection: every this many ticks.
const ACTIVE_TICK_EVERY: u32 = 10;
/// Ticks between looks at a PG's peering listing size (an O(objects) sum): 10 s.
const LISTING_LOOK_EVERY: u32 = 100;
/// A copy of a PG this OSD no longer serves asks whether the PG is clean elsewhere (and the
/// copy may go) every this many ticks.
const STRAY_CHECK_EVERY: u32 = 50;

/// How a client write ended at the primary.
#[derive(Debug)]
pub(crate) enum Outcome {
    Acked(Version),
    /// Not applied here: the PG is not active (peering, or an interval ended under it).
    Refused,
}

/// A change queued for the store, in the order the member asked for it.
pub(crate) enum Job {
    /// One write: its ops, and its log entry with the log's span after it.
    Entry {
        seq: u64,
        entry: carmine_pg::Entry,
        ops: Vec<OsdOp>,
        tail: Version,
        les: u32,
        /// The store lacks the object (it is being recovered): only the log entry is stored.
        lacking: bool,
    },
    /// Remove this OSD's stray copy of the PG (its member already forgot it).
    Purge,
    /// A whole history taken at activation.
    History {
        seq: u64,
        log: carmine_pg::PgLog,
        objects: BTreeMap<String, Version>,
        missing: BTreeMap<String, Version>,
        les: u32,
        /// The member's newest (epoch, run) as primary (see `carmine_pg::Version`).
        primary_run: (u32, u32),
        source: Option<OsdId>,
    },
    /// An object recovered from another member, to store if it is still missing at that
    /// version; `done` hears whether it was.
    Recovered {
        oid: String,
        version: Version,
        copy: ObjectCopy,
        done: oneshot::Sender<Stored>,
    },
}

/// How storing a recovered object ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    Yes,
    /// The member no longer lacks it at that version.
    NotWanted,
    /// The store has no room for it: it stays missing, and recovery tries again later
    /// (removals free room; the store counts as full meanwhile, so writes that grow it are
    /// refused).
    NoRoom,
}

/// One PG's member on this reactor, and what its host keeps beside it.
pub(crate) struct PgReplica {
    pub pg: PgId,
    pub member: RefCell<Member>,
    /// Changes waiting for the store, and whether a task is writing them.
    pub jobs: RefCell<VecDeque<Job>>,
    pub persisting: Cell<bool>,
    /// What the store holds: each object's version (what recovery compares against).
    pub held: RefCell<BTreeMap<String, Version>>,
    /// The log entries stored, oldest first (trimmed with the log, a batch at a time).
    pub log_keys: RefCell<VecDeque<Version>>,
    /// The tail and les the store's PG state record holds, if known (see `layout`).
    pub stored_meta: Cell<Option<(Version, u32)>>,
    /// Conditional writes hold it while they are judged; other writes pass through.
    pub gate: carmine_reactor::FifoLock,
    /// As primary: the ops of writes in flight, for resending them to replicas.
    pub inflight_ops: RefCell<HashMap<Version, Vec<OsdOp>>>,
    /// The epoch a history was asked for, a record is in flight for, or was settled in.
    pub asked: Cell<Option<u32>>,
    pub recording: Cell<Option<u32>>,
    pub settled: Cell<u32>,
    /// The epoch in which this primary asked for its temporary acting set to go (its backfill
    /// targets were full), and the one in which it asked for one (members lacked most of it).
    pub released: Cell<u32>,
    pub temp_asked: Cell<u32>,
    /// The epoch in which the history was last read from the map store.
    pub fetched: Cell<u32>,
    /// As a primary with backfill targets: how their fill goes (see `watch_fills`).
    pub fill: Cell<Option<temps::FillWatch>>,
    /// Why this copy stopped (its store refused a change): it takes no more work.
    pub broken: RefCell<Option<String>>,
    /// The objects a scrub chunk compares now: writes to them wait (see `scrub`).
    pub scrub_fence: RefCell<Option<scrub::Range>>,
    /// The objects with writes that could not enter at once (see `write::InLine`): the
    /// writes to each wait here in order of arrival. Empty in the common case.
    pub lines: RefCell<HashMap<String, Rc<write::Line>>>,
    /// Reads and writes taking turns per object (see `access`).
    pub access: access::Access,
    /// Repairs writing to the store outside the persist queue (see `scrub::install`): a
    /// restart waits for them to end.
    pub rewrites: Cell<u32>,
    /// The workers fetching the objects this copy lacks.
    pub recovery: recover::PgRecovery,
    /// Whether the log said this PG waits for unfound objects.
    unfound_said: Cell<bool>,
    /// The PG's primary found every run of its epoch taken (said once per episode).
    runs_said: Cell<bool>,
    /// Whether the log said this PG's read lease lapsed for long.
    unleased_said: Cell<bool>,
    /// Whether the log said this PG waits for down OSDs.
    down_said: Cell<bool>,
    /// The objects a client waits for: recovered first.
    pub urgent: RefCell<std::collections::BTreeSet<String>>,
    /// The member the last history taken from another was copied from.
    pub last_source: Cell<Option<OsdId>>,
    pub scrub: scrub::ScrubState,
    ticks: Cell<u32>,
    /// As primary, the PG's peering listing in bytes as last looked at (see
    /// `Member::peering_listing_bytes`).
    listing_bytes: Cell<usize>,
}

impl PgReplica {
    /// Whether a scrub chunk holds writes to `oid` back.
    pub fn fenced(&self, oid: &str) -> bool {
        self.scrub_fence
            .borrow()
            .as_ref()
            .is_some_and(|r| scrub::in_range(oid, r))
    }

    /// Nothing in flight and nothing waiting for the store: every write this copy took is
    /// durable (as primary: on every acting member too).
    pub fn is_quiet(&self) -> bool {
        self.member.borrow().writes_in_flight() == 0
            && self.jobs.borrow().is_empty()
            && !self.persisting.get()
    }

    /// `held`: the versions of the objects the store holds; `log_keys`: the log entries it
    /// holds (the member's, and up to a trim batch of older ones).
    fn new(
        pg: PgId,
        member: Member,
        held: BTreeMap<String, Version>,
        log_keys: VecDeque<Version>,
        schedule: &ScrubSchedule,
    ) -> Self {
        PgReplica {
            pg,
            member: RefCell::new(member),
            jobs: RefCell::new(VecDeque::new()),
            persisting: Cell::new(false),
            held: RefCell::new(held),
            log_keys: RefCell::new(log_keys),
            stored_meta: Cell::new(None),
            gate: Default::default(),
            inflight_ops: RefCell::new(HashMap::new()),
            asked: Cell::new(None),
            recording: Cell::new(None),
            settled: Cell::new(0),
            released: Cell::new(0),
            temp_asked: Cell::new(0),
            fetched: Cell::new(0),
            fill: Cell::new(None),
            broken: RefCell::new(None),
            rewrites: Cell::new(0),
            scrub_fence: RefCell::new(None),
            lines: Default::default(),
            access: Default::default(),
            recovery: Default::default(),
            unfound_said: Cell::new(false),
            runs_said: Cell::new(false),
            unleased_said: Cell::new(false),
            down_said: Cell::new(false),
            urgent: RefCell::new(Default::default()),
            last_source: Cell::new(None),
            scrub: scrub::ScrubState::new(schedule),
            ticks: Cell::new(0),
            listing_bytes: Cell::new(0),
        }
    }
}

/// A reactor's replicated PGs.
pub(crate) struct Replication {
    pub osd: OsdId,
    pub log_max: usize,
    peers: peers::Peers,
    pgs: RefCell<HashMap<PgId, Rc<PgReplica>>>,
    waiters: RefCell<HashMap<ReqId, Vec<oneshot::Sender<Outcome>>>>,
    history: Option<HistoryClient>,
    pulls: RefCell<pull::Waiting>,
    scrub_schedule: ScrubSchedule,
    /// Replies to scrub asks and pushes this primary waits for, by token: (member, waiter).
    replies: RefCell<HashMap<u64, (OsdId, oneshot::Sender<Body>)>>,
    next_token: Cell<u64>,
    budget: recover::Budget,
    slots: recover::Slots,
    pace: RefCell<recover::Pace>,
    /// The read lease, and when this reactor started (both in `clock()`'s nanoseconds): a
    /// member's earlier incarnation may have granted leases that run until a lease past that.
    lease_ns: u64,
    /// The longest lease this OSD's earlier runs may have promised under (≥ `lease_ns`).
    prior_lease_ns: u64,
    started_ns: u64,
    /// How long a write waits for its copies before its client hears it is in doubt.
    pub ack_wait: Duration,
    /// Failures of PG copies here, for the pause before each restarts (see `restart`).
    breaks: restart::Breaks,
    /// Since when PGs of this reactor whose backfill targets are full wait to be released.
    filled_since: Cell<Option<Instant>>,
    /// See `RecoveryConfig::backfill_min_objects`.
    backfill_min_objects: usize,
    /// The store's used bytes when it last refused a change for want of room: it counts as
    /// full until a margin below that is free again (see `write::store_full`).
    pub refused_room: Cell<Option<(u64, std::time::Instant)>>,
    /// PGs of pools given copies whose objects are being taken in here (see `adopt`).
    adopting: adopt::Adopting,
    /// Writes of pools of one copy in flight (see `adopt`).
    unversioned: adopt::UnversionedWrites,
    /// Collections of replicated PGs found here empty, with no state, and not placed here:
    /// not looked at again while they are not placed here.
    looked_at: RefCell<std::collections::HashSet<PgId>>,
    /// Looks at the store's collections running (1 before the first: the reactor's start).
    scans: Cell<u32>,
}

/// The members' clock: nanoseconds since this process first read it (monotone).
pub(crate) fn clock() -> u64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// How long members wait on one another (see `OsdConfig`).
pub(crate) struct Waits {
    pub read_lease: Duration,
    pub prior_read_lease: Duration,
    pub ack_wait: Duration,
}

impl Replication {
    pub fn new(
        osd: OsdId,
        key: Option<carmine_proto::auth::AuthKey>,
        history: Option<HistoryClient>,
        scrub_schedule: ScrubSchedule,
        recovery: RecoveryConfig,
        waits: Waits,
    ) -> Self {
        let Waits {
            read_lease,
            prior_read_lease,
            ack_wait,
        } = waits;
        Replication {
            osd,
            log_max: carmine_pg::LOG_ENTRIES_DEFAULT,
            peers: peers::Peers::new(osd, key),
            pgs: RefCell::new(HashMap::new()),
            waiters: RefCell::new(HashMap::new()),
            history,
            pulls: RefCell::new(Default::default()),
            scrub_schedule,
            replies: RefCell::new(HashMap::new()),
            next_token: Cell::new(0),
            budget: recover::Budget::new(recovery),
            slots: recover::Slots::new(recovery),
            pace: RefCell::new(recover::Pace::new()),
            // No longer than peers wait out what they hear of (`Member::set_lease_bound`):
            // a longer one would outlive their wait, and a new primary could serve while
            // the old one still does.
            lease_ns: read_lease.min(READ_LEASE_MAX).as_nanos() as u64,
            prior_lease_ns: prior_read_lease
                .max(read_lease)
                .min(READ_LEASE_MAX)
                .as_nanos() as u64,
            started_ns: clock(),
            ack_wait,
            breaks: Default::default(),
            filled_since: Cell::new(None),
            backfill_min_objects: recovery.backfill_min_objects,
            refused_room: Cell::new(None),
            adopting: RefCell::new(HashMap::new()),
            unversioned: Default::default(),
            looked_at: Default::default(),
            scans: Cell::new(1),
        }
    }

    /// The read lease members hold here.
    pub fn read_lease(&self) -> Duration {
        Duration::from_nanos(self.lease_ns)
    }

    /// A member with nothing stored, holding read leases as this OSD does.
    pub fn new_member(&self) -> Member {
        self.with_lease(Member::new(self.osd, self.log_max))
    }

    /// `m` with this OSD's read lease and this process's incarnation. Promises are not
    /// persisted: those of this OSD's earlier runs are taken to run until the longest lease
    /// they may have used (recorded beside the map) after this reactor started.
    pub fn with_lease(&self, mut m: Member) -> Member {
        m.set_read_lease(self.lease_ns, self.started_ns + self.prior_lease_ns);
        m.set_lease_bound(READ_LEASE_MAX.as_nanos() as u64);
        m.set_incarnation(incarnation());
        m
    }

    /// `m`, a member restarted alone from its store in this process: an incarnation newer
    /// than `after` (its predecessor's), and the leases its predecessor may have granted
    /// taken to run a full prior lease from now.
    fn restarted(&self, mut m: Member, after: u64) -> Member {
        m.set_read_lease(self.lease_ns, clock() + self.prior_lease_ns);
        m.set_lease_bound(READ_LEASE_MAX.as_nanos() as u64);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        m.set_incarnation(now.max(after + 1));
        m
    }

    pub fn pg(&self, pg: PgId) -> Option<Rc<PgReplica>> {
        self.pgs.borrow().get(&pg).cloned()
    }

    /// Counts a write of a pool of one copy, routed in map `epoch`, while the guard lives: a
    /// pool given copies takes its objects in only once those of earlier epochs are done.
    pub fn unversioned_write(&self, epoch: u32) -> UnversionedWrite<'_> {
        self.unversioned.start(epoch)
    }
}

/// Loads the replicated PGs this shard holds, takes the current map, and starts the ticks.
pub(crate) async fn start<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>) -> Result<(), String> {
    let repl = &shard.replication;
    let loaded = layout::load_all(&shard.store, repl.log_max).await?;
    let n = loaded.len();
    for l in loaded {
        let pg = l.pg;
        let (member, held, stored_log) = l.into_member(repl.osd);
        let member = repl.with_lease(member);
        if !member.missing.is_empty() {
            tracing::info!(pg = %pg, objects = member.missing.len(),
                "this copy still lacks objects: it recovers them once peered");
        }
        repl.pgs.borrow_mut().insert(
            pg,
            Rc::new(PgReplica::new(
                pg,
                member,
                held,
                stored_log.into(),
                &repl.scrub_schedule,
            )),
        );
    }
    if n > 0 {
        tracing::info!(pgs = n, "replicated PG copies loaded");
    }
    let scanned = on_map(shard).await;
    repl.scans.set(repl.scans.get() - 1);
    scanned?;
    let weak = Rc::downgrade(shard);
    carmine_reactor::spawn(async move {
        loop {
            carmine_reactor::sleep(TICK).await;
            let Some(shard) = weak.upgrade() else { return };
            tick(&shard);
        }
    })
    .detach();
    carmine_reactor::spawn(scrub::run_schedule(Rc::downgrade(shard))).detach();
    Ok(())
}

/// The PGs of pools with more than one copy that this reactor serves in `map`: those placed
/// on this OSD, or given to it by a temporary acting set, that hash to this reactor.
fn placed_here(map: &OsdMap, osd: OsdId, reactor: u32) -> Vec<(PgId, u8)> {
    let Some(me) = map.osd(osd) else {
        return Vec::new();
    };
    let reactors = me.reactors.len() as u32;
    map.pools
        .iter()
        .filter(|p| p.size > 1)
        .flat_map(|p| (0..p.pg_num).map(move |seed| (PgId { pool: p.id, seed }, p.size)))
        .filter(|(pg, size)| {
            pg_to_reactor_index(*pg, reactors) == reactor
                && (map.pg_placement(*pg, *size).contains(&osd)
                    || map.pg_temp.get(pg).is_some_and(|t| t.contains(&osd)))
        })
        .collect()
}

/// A new map epoch (or the first): every member here learns it. Members that exist learn it
/// before this returns to its first await, so no request sees the reactor's new epoch with a
/// member still in the old one.
pub(crate) async fn on_map<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>) -> Result<(), String> {
    let view = shard.view.borrow().clone();
    let map = &view.map;
    let repl = &shard.replication;
    let all: Vec<Rc<PgReplica>> = repl.pgs.borrow().values().cloned().collect();
    for pgr in all {
        feed_map(shard, &pgr, map);
    }
    let new: Vec<PgId> = placed_here(map, shard.osd, shard.index)
        .into_iter()
        .map(|(pg, _)| pg)
        .filter(|pg| repl.pg(*pg).is_none() && !repl.adopting.borrow().contains_key(pg))
        .collect();
    // Pools of one copy given copies: a copy held here with no member may hold the objects
    // stored while the pool had one. It is taken in (or cleared) before any member starts on
    // it, and until the collections are looked at no peer hears this OSD holds nothing of it.
    let _scan = (!map.given_copies.is_empty()).then(|| adopt::Scan::start(repl));
    if new.is_empty() && map.given_copies.is_empty() {
        return Ok(());
    }
    let existing = shard
        .store
        .list_collections()
        .await
        .map_err(|e| format!("listing PG collections: {e}"))?;
    let given = |pg: &PgId| {
        map.given_copies.contains_key(&pg.pool)
            && map
                .pool(pg.pool)
                .is_ok_and(|p| p.size > 1 && pg.seed < p.pg_num)
    };
    for pg in existing.iter().filter(|pg| {
        given(pg)
            && repl.pg(**pg).is_none()
            && (new.contains(pg) || !repl.looked_at.borrow().contains(pg))
    }) {
        adopt::start(shard, *pg);
    }
    let new: Vec<PgId> = new
        .into_iter()
        .filter(|pg| !(existing.contains(pg) && given(pg)))
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    // A new copy's collection first: its member may store a write as soon as it peers.
    let mut txn = Transaction::new();
    for pg in new.iter().filter(|pg| !existing.contains(pg)) {
        txn.create_collection(*pg);
    }
    if !txn.is_empty() {
        shard
            .store
            .submit(txn)
            .await
            .map_err(|e| format!("creating replicated PG collections: {e}"))?;
    }
    for pg in new {
        if !repl.adopting.borrow().contains_key(&pg) {
            start_member(shard, pg, repl.new_member(), BTreeMap::new(), Vec::new());
        }
    }
    Ok(())
}

/// Starts `pg`'s copy here with `member` (and what its store holds), unless one runs or the
/// pool is gone, and gives it the newest map (another may have come while it was made).
fn start_member<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pg: PgId,
    member: Member,
    held: BTreeMap<String, Version>,
    stored_log: Vec<Version>,
) {
    let repl = &shard.replication;
    if repl.pg(pg).is_some() || shard.view.borrow().map.pool(pg.pool).is_err() {
        return;
    }
    let pgr = Rc::new(PgReplica::new(
        pg,
        member,
        held,
        stored_log.into(),
        &repl.scrub_schedule,
    ));
    repl.pgs.borrow_mut().insert(pg, pgr.clone());
    let map = shard.view.borrow().map.clone();
    feed_map(shard, &pgr, &map);
}

/// Gives `pgr`'s member the epoch of `map` at once (so no write enters an interval that
/// ended), with the PG's history as this member knew it; a primary of a new interval also asks
/// the map store for the history as it is now, and gets it when the answer comes.
fn feed_map<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, pgr: &Rc<PgReplica>, map: &OsdMap) {
    let Ok(pool) = map.pool(pgr.pg.pool) else {
        return;
    };
    let acting = map.pg_osds(pgr.pg, pool.size);
    let targets = map.pg_backfill_targets(pgr.pg, pool.size);
    // The member's notion of one interval: the same acting set and min_size, no epoch missed.
    let (epoch, same) = {
        let m = pgr.member.borrow();
        let same = m.acting() == acting.as_slice() && m.min_size() == pool.min_size as usize;
        (m.epoch(), same)
    };
    if map.epoch <= epoch {
        return;
    }
    if acting.first() == Some(&shard.osd) && !(same && map.epoch == epoch + 1) {
        ask_history(shard, pgr, map.epoch);
    }
    // The member keeps the history it knew; a primary of a new interval activates only once
    // the map store's answer to the ask above came.
    let ev = Event::Map {
        epoch: map.epoch,
        acting,
        targets,
        history: None,
        min_size: pool.min_size as usize,
        lost: map.lost(),
    };
    drive(shard, pgr, ev, None);
}

fn ask_history<S>(shard: &Shard<S>, pgr: &PgReplica, epoch: u32) {
    if pgr.asked.get() == Some(epoch) {
        return;
    }
    let Some(h) = &shard.replication.history else {
        tracing::error!(
            pg = %pgr.pg,
            "this OSD has no map store for PG histories: the PG cannot peer"
        );
        return;
    };
    if h.ask(Ask::Get { pg: pgr.pg, epoch }) {
        pgr.asked.set(Some(epoch));
    }
}

/// An answer of the map store's worker.
pub(crate) fn on_answer<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, answer: Answer) {
    let repl = &shard.replication;
    let pg = match &answer {
        Answer::TempsChanged { asked, made } => {
            tracing::info!(asked, made, "temporary acting sets changed");
            return;
        }
        Answer::TempChangeFailed { pgs, why } => {
            tracing::warn!(?pgs, "changing temporary acting sets: {why}; asking again");
            for pg in pgs {
                if let Some(pgr) = repl.pg(*pg) {
                    pgr.released.set(0);
                    pgr.temp_asked.set(0);
                }
            }
            return;
        }
        Answer::PoolForgotten { pool, removed } => {
            match removed {
                Ok(n) => tracing::info!(
                    pool,
                    histories = n,
                    "PG histories of a removed pool removed"
                ),
                Err(why) => {
                    tracing::warn!(
                        pool,
                        "forgetting the PG histories of a removed pool: {why}; asking again"
                    );
                    crate::removed_pools::forget_failed(shard, *pool);
                }
            }
            return;
        }
        Answer::Got { pg, .. }
        | Answer::Recorded { pg, .. }
        | Answer::Changed { pg, .. }
        | Answer::Settled { pg, .. }
        | Answer::Failed { pg, .. } => *pg,
    };
    let Some(pgr) = repl.pg(pg) else {
        // A copy being taken in asked for its history.
        match answer {
            Answer::Got { history, epoch, .. } => adopt::answered(shard, pg, epoch, Ok(history)),
            Answer::Failed { why, epoch, .. } => adopt::answered(shard, pg, epoch, Err(why)),
            _ => false,
        };
        return;
    };
    match answer {
        Answer::Got { epoch, history, .. } => {
            pgr.asked.set(None);
            pgr.fetched.set(pgr.fetched.get().max(epoch));
            // Only a history read in the map's current epoch can show this copy is no longer
            // needed: one read earlier (the worker was slow) may miss an interval recorded
            // since that holds writes only this copy has.
            if epoch == shard.view.borrow().map.epoch {
                purge::consider(shard, &pgr, &history);
            }
            // (An answer for an older epoch is ignored by the member.)
            drive(shard, &pgr, Event::History { epoch, history }, None);
        }
        Answer::Recorded { epoch, .. } => {
            pgr.recording.set(None);
            drive(shard, &pgr, Event::Recorded { epoch }, None);
        }
        Answer::Changed { epoch, history, .. } => {
            pgr.recording.set(None);
            drive(shard, &pgr, Event::RecordFailed { epoch, history }, None);
        }
        Answer::Settled { .. }
        | Answer::TempsChanged { .. }
        | Answer::TempChangeFailed { .. }
        | Answer::PoolForgotten { .. } => {}
        Answer::Failed { epoch, why, .. } => {
            tracing::warn!(%pg, epoch, "PG history: {why}; asking again");
            pgr.asked.set(None);
            pgr.recording.set(None);
            if pgr.settled.get() == epoch {
                pgr.settled.set(0);
            }
        }
    }
}

/// Every tick: members resend, and PGs still waiting on the map store ask again.
fn tick<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>) {
    let map = shard.view.borrow().map.clone();
    let all: Vec<Rc<PgReplica>> = shard.replication.pgs.borrow().values().cloned().collect();
    let mut states = crate::metrics::PgStates::default();
    let now = clock();
    let mut silent_peers: BTreeMap<OsdId, u64> = BTreeMap::new();
    let mut listing_max = 0;
    for pgr in &all {
        listing_max = listing_max.max(pgr.listing_bytes.get());
        let m = pgr.member.borrow();
        // A copy broken by its store takes no events: its silences say nothing of its peers.
        if pgr.broken.borrow().is_none() {
            for (o, silent) in m.unresponsive(now) {
                let s = silent_peers.entry(o).or_default();
                *s = (*s).max(silent);
            }
        }
        if m.acting().first() == Some(&shard.osd) {
            if m.is_active_primary() {
                states.active += 1;
            } else {
                states.peering += 1;
            }
        }
        // A backfill target's lacks are misplaced copies, not degraded ones: the PG's acting
        // copies are complete.
        if m.targets().contains(&shard.osd) {
            states.misplaced += m.missing.len() as u64;
        } else {
            states.to_recover += m.missing.len() as u64;
        }
        let lost = m.unfound() as u64;
        states.unfound += lost;
        let incomplete = m.lost_intervals();
        states.incomplete += u64::from(incomplete > 0);
        if lost > 0 && !pgr.unfound_said.replace(true) {
            tracing::error!(pg = %pgr.pg, objects = lost, history = ?m.history(),
                "objects of this PG are held by no member heard from: it waits for an OSD \
                 of its recorded intervals that holds them");
        } else if incomplete > 0 && !pgr.unfound_said.replace(true) {
            tracing::error!(pg = %pgr.pg, intervals = incomplete, history = ?m.history(),
                "recorded intervals of this PG are vouched for by none of their members: each \
                 answered with an empty copy (lost disks), so the writes of those intervals \
                 are gone; the PG waits for `carmine pg mark-unfound-lost`");
        } else if lost == 0 && incomplete == 0 {
            pgr.unfound_said.set(false);
        }
        let used_up_by = m.runs_used_up_by();
        if used_up_by.is_empty() {
            pgr.runs_said.set(false);
        } else if !pgr.runs_said.replace(true) {
            tracing::error!(pg = %pgr.pg, osds = ?used_up_by, history = ?m.history(),
                "this PG cannot activate: these members report the last run (65,535) as \
                 one that may still make versions of this epoch, so no run is left for new \
                 ones. It waits while that run may write (see decision 0009, \"Known limits\"); \
                 a member that reports a run no activation took is faulty: stop it, and the PG \
                 peers without it if its other copies vouch for every recorded interval");
        }
        let waiting = m.waiting_on();
        states.down += u64::from(!waiting.is_empty());
        if waiting.is_empty() {
            pgr.down_said.set(false);
        } else if !pgr.down_said.replace(true) {
            tracing::warn!(pg = %pgr.pg, osds = ?waiting, history = ?m.history(),
                "this PG waits for these OSDs: only they may hold writes of its recorded \
                 intervals; start them, or if an OSD's disk is gone for good, declare it \
                 `carmine osd lost`");
        }
        match m.lease_lapsed(now) {
            Some((lapsed, silent)) if lapsed > shard.replication.lease_ns => {
                states.unleased += 1;
                if !pgr.unleased_said.replace(true) {
                    tracing::warn!(pg = %pgr.pg, ?silent, lapsed_ms = lapsed / 1_000_000,
                        "no read lease from these members for longer than a lease: reads and \
                         writes of this PG wait until they answer or the map moves on");
                }
            }
            None if pgr.unleased_said.replace(false) => {
                tracing::info!(pg = %pgr.pg, "read lease held again");
            }
            _ => {}
        }
    }
    shard.metrics.set_pg_states(&states);
    shard
        .metrics
        .set_silent_peers(silent_peers.into_iter().collect());
    shard.metrics.set_pg_listing_max(listing_max as u64);
    temps::watch_fills(&all);
    temps::ask_temps(shard, &all);
    temps::release_filled(shard, &all);
    let (objects, bytes) = shard.metrics.recovered_totals();
    let (bps, ops) = shard.replication.pace.borrow_mut().update(objects, bytes);
    shard.metrics.set_recovery_pace(bps, ops);
    for pgr in all {
        if pgr.broken.borrow().is_some() {
            continue;
        }
        let n = pgr.ticks.get().wrapping_add(1);
        pgr.ticks.set(n);
        if n % LISTING_LOOK_EVERY == 0 {
            let m = pgr.member.borrow();
            let mine = m.acting().first() == Some(&shard.osd);
            pgr.listing_bytes
                .set(if mine { m.peering_listing_bytes() } else { 0 });
        }
        let (behind, active, epoch, primary) = {
            let m = pgr.member.borrow();
            (
                m.epoch() < map.epoch,
                m.is_active_primary(),
                m.epoch(),
                m.acting().first() == Some(&shard.osd),
            )
        };
        let stray = {
            let m = pgr.member.borrow();
            // (A backfill target keeps its copy: no need to ask whether it may go.)
            purge::holds_state(&m)
                && !m.acting().contains(&shard.osd)
                && !m.targets().contains(&shard.osd)
        };
        if behind {
            feed_map(shard, &pgr, &map);
        } else if primary && !active && pgr.fetched.get() < epoch {
            // Peering without the store's history yet (the ask failed, or is queued).
            ask_history(shard, &pgr, epoch);
        } else if stray && n % STRAY_CHECK_EVERY == 0 {
            ask_history(shard, &pgr, epoch);
        }
        if !active || n % ACTIVE_TICK_EVERY == 0 {
            drive(shard, &pgr, Event::Tick, None);
        } else if pgr.member.borrow().wants_clock(clock()) {
            // Pings for the read lease, when due.
            drive(shard, &pgr, Event::Clock, None);
        }
        recover::kick(shard, &pgr);
    }
}

/// Runs one event through `pgr`'s member and carries out its actions. `ops` are the ops of
/// the write the event brings (a client write, or a replica write), if any.
pub(crate) fn drive<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &Rc<PgReplica>,
    ev: Event,
    ops: Option<&[OsdOp]>,
) {
    if pgr.broken.borrow().is_some() {
        return;
    }
    // Reads wait for writes in flight to their object: they look again when some completed.
    let watched = pgr
        .access
        .changed
        .has_waiters()
        .then(|| pgr.member.borrow().oldest_in_flight());
    let actions = pgr.member.borrow_mut().handle(clock(), ev);
    carry_out(shard, pgr, actions, ops);
    let (epoch, from, oldest) = {
        let m = pgr.member.borrow();
        (m.epoch(), m.interval_start(), m.oldest_in_flight())
    };
    if oldest.is_none() {
        pgr.inflight_ops.borrow_mut().clear();
    }
    if watched.is_some_and(|before| before.is_some() && before != oldest) {
        pgr.access.wake_waiters();
    }
    // The recorded history shrinks to this interval once every member holds every object:
    // until then, members of earlier intervals may hold objects no acting member has yet.
    if pgr.settled.get() < epoch && pgr.member.borrow().is_clean() {
        if let Some(h) = &shard.replication.history {
            // The interval was recorded in some epoch from its start on: the map may have
            // moved on since without changing the acting set.
            if h.ask(Ask::Settle {
                pg: pgr.pg,
                from,
                epoch,
            }) {
                pgr.settled.set(epoch);
            }
        }
    }
    recover::kick(shard, pgr);
}

/// Carries out what `pgr`'s member asked for. `ops` are the ops of the write the event that
/// caused them brought, if any.
fn carry_out<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &Rc<PgReplica>,
    actions: Vec<Action>,
    ops: Option<&[OsdOp]>,
) {
    for action in actions {
        match action {
            Action::Send { to, msg } => {
                let ops = match &msg {
                    Msg::Rep { entry, .. } => {
                        match pgr.inflight_ops.borrow().get(&entry.version) {
                            Some(ops) => ops.clone(),
                            None => {
                                // Never send a write without its data.
                                tracing::error!(pg = %pgr.pg, version = %entry.version,
                                    "no ops kept for a replica write: not sent");
                                continue;
                            }
                        }
                    }
                    _ => Vec::new(),
                };
                let (from_inc, to_inc) = {
                    let m = pgr.member.borrow();
                    (m.incarnation(), m.incarnation_of(to))
                };
                send_to(shard, to, from_inc, to_inc, pgr.pg, Body::Pg { msg, ops });
            }
            Action::Record { interval, after } => {
                let epoch = interval.epoch;
                if pgr.recording.get() == Some(epoch) {
                    continue;
                }
                if let Some(h) = &shard.replication.history {
                    if h.ask(Ask::Record {
                        pg: pgr.pg,
                        epoch,
                        after,
                        interval,
                    }) {
                        pgr.recording.set(Some(epoch));
                    }
                }
            }
            Action::Ack { req, version } => {
                pgr.inflight_ops.borrow_mut().remove(&version);
                finish(shard, req, Outcome::Acked(version));
            }
            Action::Refuse { req } => finish(shard, req, Outcome::Refused),
            Action::Persist { seq, what } => queue_persist(shard, pgr, seq, what, ops),
            Action::RecoverFirst { oid } => {
                pgr.urgent.borrow_mut().insert(oid);
            }
        }
    }
}

/// Asks the members that lack `oid` to recover it first (a client waits for it).
pub(crate) fn hasten<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &Rc<PgReplica>,
    oid: &str,
) {
    let actions = pgr.member.borrow_mut().hasten(oid);
    carry_out(shard, pgr, actions, None);
    recover::kick(shard, pgr);
}

fn finish<S>(shard: &Shard<S>, req: ReqId, outcome: Outcome) {
    let Some(waiters) = shard.replication.waiters.borrow_mut().remove(&req) else {
        return;
    };
    let mut outcome = Some(outcome);
    let n = waiters.len();
    for (i, w) in waiters.into_iter().enumerate() {
        // Every retry of one request waits for the same outcome.
        let o = if i + 1 == n {
            outcome.take().expect("once")
        } else {
            match outcome.as_ref().expect("kept for the last") {
                Outcome::Acked(v) => Outcome::Acked(*v),
                Outcome::Refused => Outcome::Refused,
            }
        };
        let _ = w.send(o);
    }
}

fn queue_persist<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &Rc<PgReplica>,
    seq: u64,
    what: Persisting,
    ops: Option<&[OsdOp]>,
) {
    let job = {
        let m = pgr.member.borrow();
        match what {
            Persisting::Entry(v) => {
                let Some(entry) = m.log.entries().rev().find(|e| e.version == v).cloned() else {
                    drop(m);
                    fail(
                        shard,
                        pgr,
                        format!("entry {v} to persist is not in the log"),
                    );
                    return;
                };
                let Some(ops) = ops else {
                    drop(m);
                    fail(
                        shard,
                        pgr,
                        format!("entry {v} to persist came without its ops"),
                    );
                    return;
                };
                Job::Entry {
                    seq,
                    lacking: m.missing.contains_key(&entry.oid),
                    entry,
                    ops: ops.to_vec(),
                    tail: m.log.tail(),
                    les: m.les,
                }
            }
            Persisting::History { source } => Job::History {
                seq,
                log: m.log.clone(),
                objects: m.objects.clone(),
                missing: m.missing.clone(),
                les: m.les,
                primary_run: m.primary_run,
                source,
            },
        }
    };
    queue_job(shard, pgr, job);
}

/// Queues `job` for `pgr`'s persist task, starting it if it is not running.
pub(super) fn queue_job<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &Rc<PgReplica>,
    job: Job,
) {
    if pgr.broken.borrow().is_some() {
        // Dropped: see `fail`.
        return;
    }
    pgr.jobs.borrow_mut().push_back(job);
    if !pgr.persisting.replace(true) {
        let (shard, pgr) = (shard.clone(), pgr.clone());
        carmine_reactor::spawn(async move { persist::run(&shard, &pgr).await }).detach();
    }
}

/// This copy can no longer be trusted to follow its member (its store refused a change): it
/// stops taking work, loudly, refuses the writes it had in flight (their clients retry), and
/// restarts from its store after a pause (see `restart`).
pub(crate) fn fail<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    pgr: &Rc<PgReplica>,
    why: String,
) {
    if pgr.broken.borrow().is_some() {
        return;
    }
    tracing::error!(pg = %pgr.pg, "replicated PG copy stopped: {why}");
    stop(shard, pgr, why);
    shard.metrics.pg_copy_stopped();
    restart::schedule(shard, pgr);
}

/// Stops `pgr` taking work: what it queued is dropped, its writes in flight refused.
fn stop<S: ObjectStore + 'static>(shard: &Rc<Shard<S>>, pgr: &Rc<PgReplica>, why: String) {
    *pgr.broken.borrow_mut() = Some(why);
    // Nothing queued will be stored (the copy restarts from its store, or is removed):
    // dropped, so whoever waits for a recovered object's storing hears it will not be.
    pgr.jobs.borrow_mut().clear();
    let refused: Vec<ReqId> = pgr.member.borrow().pending_requests().collect();
    for req in refused {
        finish(shard, req, Outcome::Refused);
    }
    // Reads and writes waiting on the copy's objects hear it stopped.
    pgr.access.wake_waiters();
}

/// Stops and forgets this reactor's copies of PGs whose pool `map` removed, and returns
/// their PGs once none of them works on the store any more: their objects and state may
/// then be deleted (`crate::removed_pools`). Their clients' writes in flight are refused;
/// retried, they find the pool gone.
pub(crate) async fn retire_removed<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    map: &OsdMap,
) -> Vec<PgId> {
    let gone: Vec<Rc<PgReplica>> = shard
        .replication
        .pgs
        .borrow()
        .values()
        .filter(|p| map.pool_removed(p.pg.pool))
        .cloned()
        .collect();
    for pgr in &gone {
        shard.replication.pgs.borrow_mut().remove(&pgr.pg);
        if pgr.broken.borrow().is_none() {
            stop(shard, pgr, "its pool was removed".into());
        }
    }
    let start = Instant::now();
    let mut said = false;
    for pgr in &gone {
        // A scrub or a repair ends at its next step, a read once answered.
        while restart::busy(pgr) {
            if !said && start.elapsed() > Duration::from_secs(10) {
                tracing::warn!(pg = %pgr.pg, "a copy of a removed pool is still busy after 10 s");
                said = true;
            }
            carmine_reactor::sleep(Duration::from_millis(10)).await;
        }
    }
    gone.iter().map(|p| p.pg).collect()
}

/// Asks the map store's worker to remove the PG histories of removed pool `pool`, after
/// what this reactor asked before (see `history::Ask::ForgetPool`). False if its queue is
/// full: ask again later.
pub(crate) fn forget_pool_histories<S>(shard: &Shard<S>, pool: carmine_types::PoolId) -> bool {
    shard
        .replication
        .history
        .as_ref()
        .is_none_or(|h| h.ask(history::Ask::ForgetPool { pool }))
}

/// Notes a store error: one of room makes the store count as full (see `write::store_full`).
pub(crate) fn note_store_error<S: ObjectStore>(shard: &Shard<S>, e: &carmine_store::StoreError) {
    if e.kind == carmine_store::StoreErrorKind::NoSpace {
        let used = shard.store.statfs().bytes_used;
        let now = std::time::Instant::now();
        shard.replication.refused_room.set(Some((used, now)));
        shard.metrics.set_store_refused_room(true);
    }
}

/// Sends `body` about `pg` to the reactor of OSD `to` that serves it.
pub(crate) fn send<S>(shard: &Shard<S>, to: OsdId, pg: PgId, body: Body) {
    send_to(shard, to, incarnation(), 0, pg, body)
}

/// This process's incarnation: its start on the wall clock, in nanoseconds — larger than any
/// earlier run's (unless the clock was set back by more than the restart took).
pub(crate) fn incarnation() -> u64 {
    static STARTED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *STARTED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            .max(1)
    })
}

/// Sends `body` from the member of incarnation `from_inc` (the process's, unless the copy
/// restarted alone) to `to`, whose incarnation that member knows as `to_inc` (0: unknown).
pub(crate) fn send_to<S>(
    shard: &Shard<S>,
    to: OsdId,
    from_inc: u64,
    to_inc: u64,
    pg: PgId,
    body: Body,
) {
    if to == shard.osd {
        return;
    }
    let addr = {
        let view = shard.view.borrow();
        let Some(o) = view.map.osd(to) else {
            return;
        };
        o.reactors[pg_to_reactor_index(pg, o.reactors.len() as u32) as usize]
    };
    let msg = PeerMessage {
        from: shard.osd,
        from_inc,
        to_inc,
        pg,
        body,
    };
    shard.replication.peers.send(addr, |b| msg.encode(b));
}

/// A `Peer` frame from another OSD (or from whoever `sender` is).
pub(crate) fn on_peer<S: ObjectStore + 'static>(
    shard: &Rc<Shard<S>>,
    payload: bytes::Bytes,
    sender: crate::handler::Sender,
) {
    let repl = &shard.replication;
    let msg = match PeerMessage::decode(payload, repl.log_max) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!("undecodable message from another OSD: {e}");
            return;
        }
    };
    let PeerMessage {
        from,
        from_inc,
        to_inc,
        pg,
        body,
    } = msg;
    if !sender.may_speak_for(from) {
        // Only an OSD speaks for itself: a client (or another OSD) cannot rewrite copies,
        // take part in peering or answer for a member.
        tracing::warn!(
            ?sender,
            from,
            "message for osd.{from} refused from {sender:?}"
        );
        return;
    }
    match body {
        Body::Pg { msg, ops } => match repl.pg(pg) {
            Some(pgr) => {
                // From, or to, an earlier incarnation of an OSD restarted within the epoch.
                if !pgr.member.borrow_mut().admit(from, from_inc, to_inc, &msg) {
                    tracing::debug!(pg = %pg, from, "message of an earlier incarnation dropped");
                    return;
                }
                match msg {
                    // An answer says this copy took the map that ended its interval, and a
                    // new primary then waits out no read lease granted to it
                    // (`Member::leases_until`): so it answers only once no read it took as
                    // the old primary is still running — one in flight could otherwise see a
                    // write of the new interval applied here before that write is done. No
                    // read starts meanwhile (the interval ended); the primary asks again on
                    // its ticks.
                    Msg::Query { .. } if pgr.access.any_reading() => {
                        pgr.access.wake_waiters();
                        return;
                    }
                    Msg::Rep { .. } => shard.metrics.replica_write(),
                    // Its answer tells the primary whether this store has room for writes.
                    Msg::Ping { .. } => pgr
                        .member
                        .borrow_mut()
                        .note_store_full(write::store_full(shard)),
                    _ => {}
                }
                drive(shard, &pgr, Event::Msg { from, msg }, Some(&ops))
            }
            None => {
                // A primary asks every member any recorded interval had: an OSD that holds
                // nothing of the PG says so, with an empty history. Not while it may yet hold
                // objects of the PG's pool from when it had one copy (the primary asks again).
                if let Msg::Query { .. } = msg {
                    if adopt::may_hold(shard, pg) {
                        return;
                    }
                    let mut blank = repl.new_member();
                    // In this reactor's epoch, as any member answers.
                    let map = shard.view.borrow().map.clone();
                    if let Ok(pool) = map.pool(pg.pool) {
                        blank.handle(
                            clock(),
                            Event::Map {
                                epoch: map.epoch,
                                acting: map.pg_osds(pg, pool.size),
                                targets: map.pg_backfill_targets(pg, pool.size),
                                history: None,
                                min_size: pool.min_size as usize,
                                lost: map.lost(),
                            },
                        );
                    }
                    for a in blank.handle(clock(), Event::Msg { from, msg }) {
                        if let Action::Send { to, msg } = a {
                            // The answer goes to the incarnation that asked.
                            let body = Body::Pg { msg, ops: vec![] };
                            send_to(shard, to, blank.incarnation(), from_inc, pg, body);
                        }
                    }
                }
            }
        },
        Body::Pull { oid } => pull::serve(shard, from, pg, oid),
        Body::Pulled { oid, version, copy } => pull::arrived(shard, pg, oid, version, copy),
        Body::ScrubAsk {
            epoch,
            token,
            after,
            upto,
            deep,
        } => scrub::answer(shard, from, pg, epoch, token, (after, upto), deep),
        Body::Push {
            epoch,
            token,
            oid,
            version,
            copy,
        } => scrub::take_push(shard, from, pg, epoch, token, oid, version, copy),
        Body::ScrubMap { token, .. } | Body::Pushed { token, .. } => {
            scrub::reply_arrived(shard, from, token, body)
        }
    }
}

/// The kind of log entry a write makes: a delete if it ends by removing the object.
pub(crate) fn op_kind(ops: &[OsdOp]) -> OpKind {
    match ops.last() {
        Some(OsdOp::Remove) => OpKind::Delete,
        _ => OpKind::Modify,
    }
}
