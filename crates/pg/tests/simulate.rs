//! The deterministic simulator (decision 0009, point 8), first cut: one PG of size 3 and
//! min_size 2 on four OSDs, all on one thread from one seed. A simulated manager marks OSDs
//! down and up (new epochs, new acting sets); OSDs crash (keeping their durable state) and
//! come back with what their disks hold (a write in flight at the crash may or may not have
//! landed); the network delays, reorders and drops messages and cuts an OSD off while the map
//! still says it is up; a client with a map that lags behind writes and retries. After every
//! step: when a member is the active primary, its history holds every acknowledged write (or
//! a newer one of the same object), and an object its store still lacks is held by some disk;
//! when a write is acknowledged, every acting member's disk holds its data. Members recover
//! what they lack in the background by pulling it from a member whose store holds it, and
//! hear of objects their own store holds at the version needed after all (as the host tells
//! them once a history is durable). At the
//! end, with everything healed, the PG must be active and clean, and every acting member must
//! hold exactly the primary's objects.
//!
//! Each OSD has its own clock, running up to 3% faster or slower than the others, and members
//! hold read leases in it. A reader whose map lags even more than the writer's reads from
//! whichever OSD it believes primary, and reaches it even when it is cut off from the others
//! (a client on its side of a partition): every read an OSD serves must return the newest
//! acknowledged version of the object, or a newer one.
//!
//! On odd seeds the manager also keeps temporary acting sets (decision 0015), as the map
//! does: where the placement of a new epoch puts a copy on an OSD the old acting set did not
//! have, the old copies still up serve while the new ones fill as backfill targets; an
//! active primary whose members lack most of the PG asks for the others to serve
//! (`Member::wants_temp`); and a primary whose targets are full asks for its set to go.
//! Once on such a seed, an OSD that crashes comes back with an empty disk (a replaced disk,
//! or a memory store), when its disk holds nothing the others do not.
//! The checks above hold throughout (a target becomes acting, and primary, only once full),
//! and once healed every set has gone.
//!
//! `CARMINE_SIM_SEEDS` sets how many seeds run (CI: 2000, about 10 s a shape), from
//! `CARMINE_SIM_FIRST_SEED` (0); `CARMINE_SIM_SEED` replays one.

use carmine_pg::{Action, Entry, Event, Interval, Member, Msg, OpKind, ReqId, Version};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};

/// A cluster's shape: OSDs, the pool's size and min_size, and the order placement tries the
/// OSDs in (as hashing gives for one PG).
#[derive(Clone, Copy)]
struct Shape {
    osds: u32,
    size: usize,
    min_size: usize,
    order: &'static [u32],
}

/// Three copies of four OSDs: every new acting set keeps another member of the old one.
const THREE_OF_FOUR: Shape = Shape {
    osds: 4,
    size: 3,
    min_size: 2,
    order: &[2, 0, 3, 1],
};
/// Two copies of three, one enough to serve: a new primary may be the only member of the old
/// interval it hears, itself (its own promises count), or one that just restarted.
const TWO_OF_THREE: Shape = Shape {
    osds: 3,
    size: 2,
    min_size: 1,
    order: &[2, 0, 1],
};
/// Three copies of five, one enough to serve: placement moves copies among more OSDs, an
/// interval may be served by a copy alone, and a primary may hear only members that never
/// held the data it needs.
const THREE_OF_FIVE_MIN_ONE: Shape = Shape {
    osds: 5,
    size: 3,
    min_size: 1,
    order: &[3, 1, 4, 0, 2],
};
const STEPS: u64 = 3000;
const OBJECTS: u32 = 8;
/// The read lease, in clock units (a tick is about 1,000 of them): each seed takes one of
/// these. Leases longer than the manager takes to mark a cut-off OSD down are the ones where
/// a new interval goes active while the old primary still holds its lease.
const LEASES: [u64; 3] = [30_000, 100_000, 250_000];

struct Sim {
    shape: Shape,
    rng: StdRng,
    now: u64,
    members: Vec<Member>,
    /// What each OSD's disk holds: the member as of its last completed persist, and that
    /// persist's (incarnation, sequence): a disk never goes back to an older one.
    disks: Vec<Member>,
    disk_at: Vec<(u64, u64)>,
    /// What each OSD's store holds: each object's version (for one the disk's state names as
    /// missing, the version it holds instead, if any), as the host's `held` map.
    stores: Vec<BTreeMap<String, Version>>,
    /// Every version seen in a log (in memory or on disk) so far on this seed, and the write
    /// it named then, at which OSD.
    named: std::collections::HashMap<Version, (u32, Entry)>,
    /// Persists in flight: (done at, sequence) → (osd, incarnation, member seq, snapshot).
    persists: BTreeMap<(u64, u64), (u32, u64, u64, Member)>,
    /// Bumped at each crash: persists of an earlier incarnation are not reported to it.
    incarnation: Vec<u64>,
    /// Whether each OSD's process runs.
    running: Vec<bool>,
    /// Whether the map says it is up.
    up_in_map: Vec<bool>,
    /// An OSD cut off from the network (still running).
    cut: Option<u32>,
    epoch: u32,
    acting: Vec<u32>,
    history: Vec<Interval>,
    /// In flight: (deliver at, sequence) → a message.
    net: BTreeMap<(u64, u64), InFlight>,
    seq: u64,
    /// The client's view of the map: (epoch, primary), lagging behind.
    client_view: (u32, Option<u32>),
    /// Requests not answered yet: id → (object, last sent at).
    outstanding: BTreeMap<u64, (String, u64)>,
    next_req: u64,
    /// Newest acknowledged version per object.
    acked: BTreeMap<String, Version>,
    acks: u64,
    log: Vec<String>,
    /// Invariants broken inside a step (reported by `check`).
    violations: Vec<String>,
    /// Log every delivered message (when replaying one seed).
    trace: bool,
    /// Pulls in flight: (done at, sequence) → (puller, incarnation, object, version).
    pulls: BTreeMap<(u64, u64), (u32, u64, String, Version)>,
    /// Objects each OSD was asked to recover first.
    urgent: Vec<BTreeSet<String>>,
    recovered: u64,
    /// Each OSD's clock rate: clock units per tick (1,000 ± 3%).
    rate: Vec<u64>,
    /// The reader's view of the map: (epoch, primary), lagging more than the writer's.
    reader_view: (u32, Option<u32>),
    /// Reads served, and those a primary held back for its lease.
    lease: u64,
    /// Answers of the map store due on the next step.
    answers: Vec<(u32, Event)>,
    /// Histories read from the map store, as a host asks for one with a new map: delivered
    /// at (tick, sequence) to the OSD, read when asked (the store may change meanwhile).
    history_reads: BTreeMap<(u64, u64), (u32, Event)>,
    /// Crashed OSDs may restart at once, in the same epoch, with messages of their previous
    /// incarnation still on the way (`CARMINE_SIM_QUICK_RESTARTS=0` turns it off). Without
    /// incarnations on messages, seed 1918 had a replica apply a dead primary's write after
    /// the restarted primary had queried it.
    quick_restarts: bool,
    /// Everything runs and is reachable, and no message is lost (the end of a seed).
    healed: bool,
    reads: u64,
    /// The newest version of each object a read returned: a later read never returns an
    /// older one (what a reader saw must not vanish), unless the operator gave it up.
    seen: BTreeMap<String, Version>,
    lease_waits: u64,
    /// Times the operator gave up a waiting primary's unfound objects.
    given_up: u64,
    /// Objects given up, with the epoch of the give-up.
    given_up_in: BTreeMap<String, u32>,
    /// A give-up not yet settled: (primary, epoch, objects it counted unfound).
    pending_give_up: Option<(u32, u32, usize)>,
    /// Temporary acting sets on this seed (odd ones).
    temps: bool,
    /// The PG's temporary acting set, if any, and the backfill targets it leaves.
    temp: Option<Vec<u32>>,
    targets: Vec<u32>,
    /// The placement of the current epoch: the up set.
    placed: Vec<u32>,
    /// The least a member must lack for its primary to ask it out (`--backfill-min-objects`).
    min_lacks: usize,
    /// The epoch the primary last asked in: it asks once per epoch, as the host does.
    asked_in: u32,
    /// Whether a replica, and a primary, already came back with an empty disk on this seed.
    disk_lost: [bool; 2],
    /// Sets primed by a placement change, asked for by a primary, and released once full.
    temp_counts: TempCounts,
}

/// Temporary acting sets primed, asked for and released.
#[derive(Clone, Copy, Default)]
struct TempCounts {
    primed: u64,
    asked: u64,
    released: u64,
    disks_lost: u64,
    /// Of which the primary's.
    primary_disks_lost: u64,
}

/// A message on its way: (from, to, (the sender's incarnation, the receiver's as the sender
/// knows it), message).
type InFlight = (u32, u32, (u64, u64), Msg);

impl Sim {
    fn new(seed: u64, shape: Shape) -> Self {
        let n = shape.osds;
        let mut s = Sim {
            shape,
            rng: StdRng::seed_from_u64(seed),
            now: 0,
            members: (0..n)
                .map(|o| {
                    let mut m = Member::new(o, 64);
                    m.set_incarnation(1);
                    m
                })
                .collect(),
            disks: (0..n).map(|o| Member::new(o, 64)).collect(),
            disk_at: vec![(0, 0); n as usize],
            stores: vec![BTreeMap::new(); n as usize],
            persists: BTreeMap::new(),
            incarnation: vec![0; n as usize],
            running: vec![true; n as usize],
            up_in_map: vec![true; n as usize],
            cut: None,
            epoch: 0,
            acting: Vec::new(),
            history: Vec::new(),
            net: BTreeMap::new(),
            seq: 0,
            client_view: (0, None),
            outstanding: BTreeMap::new(),
            next_req: 1,
            acked: BTreeMap::new(),
            named: std::collections::HashMap::new(),
            acks: 0,
            log: Vec::new(),
            violations: Vec::new(),
            trace: std::env::var("CARMINE_SIM_SEED").is_ok(),
            pulls: BTreeMap::new(),
            urgent: vec![BTreeSet::new(); n as usize],
            recovered: 0,
            rate: Vec::new(),
            reader_view: (0, None),
            lease: 0,
            answers: Vec::new(),
            history_reads: BTreeMap::new(),
            quick_restarts: std::env::var("CARMINE_SIM_QUICK_RESTARTS").map_or(true, |v| v != "0"),
            healed: false,
            reads: 0,
            seen: BTreeMap::new(),
            lease_waits: 0,
            given_up: 0,
            given_up_in: BTreeMap::new(),
            pending_give_up: None,
            temps: seed % 2 == 1,
            temp: None,
            targets: Vec::new(),
            placed: Vec::new(),
            min_lacks: 1 + (seed / 2 % 4) as usize,
            asked_in: 0,
            disk_lost: [false; 2],
            temp_counts: TempCounts::default(),
        };
        s.rate = (0..n).map(|_| s.rng.random_range(970..=1030)).collect();
        s.lease = LEASES[s.rng.random_range(0..LEASES.len())];
        for m in &mut s.members {
            m.set_read_lease(s.lease, s.lease);
        }
        s.new_epoch();
        s
    }

    /// The acting set placement gives: the first `size` OSDs up in the map, in one fixed order
    /// (as hashing gives for one PG).
    fn placement(&self) -> Vec<u32> {
        self.shape
            .order
            .iter()
            .copied()
            .filter(|o| self.up_in_map[*o as usize])
            .take(self.shape.size)
            .collect()
    }

    fn new_epoch(&mut self) {
        self.epoch += 1;
        let placed = self.placement();
        if self.temps && placed != self.placed {
            // `OsdMap::prime_temps`: the old acting set's copies still up serve while the
            // new ones fill, if they are at least min_size.
            let serving: Vec<u32> = self
                .acting
                .iter()
                .copied()
                .filter(|o| self.up_in_map[*o as usize])
                .collect();
            let primes =
                serving.len() >= self.shape.min_size && placed.iter().any(|o| !serving.contains(o));
            self.temp = primes.then_some(serving);
            self.temp_counts.primed += u64::from(primes);
        }
        self.placed = placed;
        // `OsdMap::clean_temps`: a set that says what placement says goes, and so does one
        // the map does not follow (fewer than min_size of it up, the up set has enough).
        if self.temp.as_ref() == Some(&self.placed) {
            self.temp = None;
        }
        (self.acting, self.targets) = self.serving();
        if let Some(t) = &self.temp {
            if t.iter()
                .filter(|o| self.up_in_map[**o as usize])
                .ne(self.acting.iter())
            {
                self.temp = None;
            }
        }
        self.log.push(format!(
            "t{} epoch {} acting {:?} targets {:?}",
            self.now, self.epoch, self.acting, self.targets
        ));
    }

    /// The acting set and backfill targets the map gives (`OsdMap::pg_osds`): the up
    /// members of the temporary set if there is one with an OSD up, unless they are fewer
    /// than min_size and the up set is not; otherwise the up set. Targets are the members of
    /// the up set that are not acting.
    fn serving(&self) -> (Vec<u32>, Vec<u32>) {
        let min_size = self.shape.min_size;
        let acting = match &self.temp {
            Some(t) => {
                let up: Vec<u32> = t
                    .iter()
                    .copied()
                    .filter(|o| self.up_in_map[*o as usize])
                    .collect();
                if !up.is_empty() && (up.len() >= min_size || self.placed.len() < min_size) {
                    up
                } else {
                    self.placed.clone()
                }
            }
            None => self.placed.clone(),
        };
        let targets = self
            .placed
            .iter()
            .copied()
            .filter(|o| !acting.contains(o))
            .collect();
        (acting, targets)
    }

    /// Whether OSD `o`'s disk may be lost without losing what is acknowledged or keeping the
    /// PG from going active: the current epoch's primary is active and clean, `o` is an
    /// acting member, and every object its store holds, at that version, and every
    /// acknowledged write, another OSD's store holds too.
    /// - Another member's copy: with no write in flight, and no request outstanding in a
    ///   log: retried, it may be answered from the log as done, on the word of a copy the
    ///   primary does not know is gone yet (in any system, a disk lost after its copy was
    ///   counted is a loss the primary cannot know of at once).
    /// - The primary's copy (a memory store restarted at once peers in the same epoch with
    ///   nothing): only if another acting member's disk took this interval's activation (one
    ///   alone with its data gone leaves the interval to the operator's word; the targets
    ///   that hold everything do not vouch for it). Its writes on their way may go with it:
    ///   a version of its store no other copy's log names was never acknowledged, and the
    ///   next run must not give it to another write (decision 0009, "Runs its members
    ///   took").
    fn may_lose_disk(&self, o: u32) -> bool {
        let Some(&p) = self.acting.first() else {
            return false;
        };
        let m = &self.members[p as usize];
        let elsewhere = |oid: &String, v: Version| {
            (0..self.shape.osds).any(|s| s != o && self.stores[s as usize].get(oid) == Some(&v))
        };
        let primary = o == p;
        let vouched =
            || (self.acting.iter()).any(|a| *a != o && self.disks[*a as usize].les >= m.les);
        let named_elsewhere = |v: Version| {
            (0..self.shape.osds as usize)
                .filter(|s| *s != o as usize)
                .flat_map(|s| [&self.members[s], &self.disks[s]])
                .any(|c| c.log.entries().any(|e| e.version == v))
        };
        self.running[p as usize]
            && self.acting.contains(&o)
            && (!primary || vouched())
            && m.epoch() == self.epoch
            && m.is_clean()
            && (primary || m.writes_in_flight() == 0)
            && (primary || self.outstanding.keys().all(|tid| !self.logged(*tid)))
            && self.stores[o as usize]
                .iter()
                .all(|(k, v)| elsewhere(k, *v) || (primary && !named_elsewhere(*v)))
            && self.acked.iter().all(|(k, v)| elsewhere(k, *v))
    }

    /// Whether any member's log, or any disk's, holds an entry of client request `tid`.
    fn logged(&self, tid: u64) -> bool {
        self.members
            .iter()
            .chain(&self.disks)
            .flat_map(|m| m.log.entries())
            .any(|e| e.reqid.is_some_and(|r| r.tid == tid))
    }

    /// The temporary sets' worker and the map: now and then the current epoch's active
    /// primary has its set released once its targets are full (`OsdMap::release_temp`), or
    /// asks for the members that lack most of the PG to fill as targets while the others
    /// serve (`Member::wants_temp`, `OsdMap::ask_temp`), once per epoch. Each change is a new
    /// epoch.
    fn change_temps(&mut self) {
        let Some(&p) = self.acting.first() else {
            return;
        };
        let m = &self.members[p as usize];
        if !self.temps
            || !self.running[p as usize]
            || self.cut == Some(p)
            || m.epoch() != self.epoch
            || !self.rng.random_bool(0.2)
        {
            return;
        }
        let as_seen = m.acting() == self.acting.as_slice();
        if self.temp.is_some()
            && !self.targets.is_empty()
            && m.targets_filled()
            && as_seen
            && self.targets.iter().all(|t| m.targets().contains(t))
        {
            self.log.push(format!(
                "t{} osd.{p} filled {:?}: the temporary set goes",
                self.now, self.targets
            ));
            // No target the PG counts as full lacks an object: its store holds each at the
            // primary's version, or a write of it is in flight.
            for &t in &self.targets {
                for (oid, v) in &m.objects {
                    let held = self.stores[t as usize].get(oid);
                    if held != Some(v) && !m.any_in_flight(|o| o == oid) {
                        self.violations.push(format!(
                            "t{}: osd.{p} counts its target osd.{t} full, but its store has \
                             {oid} at {held:?}, not {v}",
                            self.now
                        ));
                    }
                }
            }
            self.temp = None;
            self.temp_counts.released += 1;
            self.new_epoch();
            return;
        }
        if self.asked_in >= self.epoch {
            return;
        }
        let Some(set) = m.wants_temp(self.min_lacks) else {
            return;
        };
        self.asked_in = self.epoch;
        let valid = as_seen
            && set.len() >= self.shape.min_size
            && set.len() < self.acting.len()
            && set
                .iter()
                .all(|o| self.acting.contains(o) && self.up_in_map[*o as usize]);
        if !valid {
            return;
        }
        let before = self.temp.replace(set.clone());
        if self.serving().0 != set {
            self.temp = before;
            return;
        }
        self.log.push(format!(
            "t{} osd.{p} asks for {set:?} to serve while the others fill",
            self.now
        ));
        self.temp_counts.asked += 1;
        self.new_epoch();
    }

    /// Maps reach each OSD on its own time, and never across a cut: an old primary may go on
    /// in an old epoch while a new interval starts.
    fn spread_map(&mut self) {
        for o in 0..self.shape.osds {
            let behind = self.members[o as usize].epoch() < self.epoch;
            if behind
                && self.running[o as usize]
                && self.cut != Some(o)
                && self.rng.random_bool(0.3)
            {
                self.deliver_map(o);
            }
        }
    }

    /// The map comes with the history read from the store at once, or (as the OSD does it)
    /// without one: the member keeps the history it knew, maybe none after a restart, and the
    /// store's answer comes a few ticks later.
    fn deliver_map(&mut self, o: u32) {
        let read_with_map = self.rng.random_bool(0.5);
        let ev = Event::Map {
            epoch: self.epoch,
            acting: self.acting.clone(),
            targets: self.targets.clone(),
            history: read_with_map.then(|| self.history.clone()),
            min_size: self.shape.min_size,
            lost: Default::default(),
        };
        if !read_with_map {
            let at = self.now + self.rng.random_range(1..6);
            self.seq += 1;
            let answer = Event::History {
                epoch: self.epoch,
                history: self.history.clone(),
            };
            self.history_reads.insert((at, self.seq), (o, answer));
        }
        self.run(o, ev);
    }

    /// A persist reaches the disk; an older one completing late changes nothing (a journal
    /// applies in order).
    fn land(&mut self, o: u32, inc: u64, seq: u64, snapshot: Member) {
        if (inc, seq) > self.disk_at[o as usize] {
            self.disk_at[o as usize] = (inc, seq);
            let old = &self.stores[o as usize];
            self.stores[o as usize] = snapshot
                .objects
                .iter()
                .filter_map(|(k, v)| {
                    if snapshot.missing.contains_key(k) {
                        old.get(k).map(|held| (k.clone(), *held))
                    } else {
                        Some((k.clone(), *v))
                    }
                })
                .collect();
            self.disks[o as usize] = snapshot;
        }
    }

    /// OSD `o`'s clock.
    fn clock(&self, o: u32) -> u64 {
        self.now * self.rate[o as usize]
    }

    fn reachable(&self, a: u32, b: u32) -> bool {
        self.running[a as usize]
            && self.running[b as usize]
            && (a == b || (self.cut != Some(a) && self.cut != Some(b)))
    }

    fn run(&mut self, o: u32, ev: Event) {
        if !self.running[o as usize] {
            return;
        }
        let now = self.clock(o);
        let actions = self.members[o as usize].handle(now, ev);
        for a in actions {
            match a {
                Action::Send { to, msg } => {
                    // An answer to a query describes the member's disk: a history taken as
                    // authoritative from writes that were still in memory is gone after a
                    // crash, and members that take it wait forever for data nobody has.
                    if let Msg::Info {
                        log,
                        objects,
                        missing,
                        ..
                    } = &msg
                    {
                        let disk = &self.disks[o as usize];
                        let disk_missing: BTreeSet<String> = disk.missing.keys().cloned().collect();
                        if log.head() != disk.log.head()
                            || *objects != disk.objects
                            || *missing != disk_missing
                        {
                            self.violations.push(format!(
                                "t{}: osd.{o} answers a query with head {} while its disk has {} \
                                 (missing {missing:?} / {disk_missing:?}, objects {objects:?} / {:?})",
                                self.now,
                                log.head(),
                                disk.log.head(),
                                disk.objects
                            ));
                        }
                    }
                    // Healed, the network loses nothing: the settled checks judge the protocol,
                    // not a streak of losses (seeds 69746 and 75187 lost six of eight pings
                    // and pongs to one OSD in a row, a false "silent" report).
                    if self.healed || !self.rng.random_bool(0.05) {
                        let at = self.now + self.rng.random_range(1..8);
                        self.seq += 1;
                        // Stamped as the host does: the sender's incarnation, and the
                        // receiver's as the sender knows it.
                        let member = &self.members[o as usize];
                        let incs = (member.incarnation(), member.incarnation_of(to));
                        self.net.insert((at, self.seq), (o, to, incs, msg));
                    }
                }
                Action::Record { interval, after } => {
                    let last = self.history.last().map(|i| i.epoch);
                    if last == after && interval.epoch > last.unwrap_or(0) {
                        self.log
                            .push(format!("t{} osd.{o} records {:?}", self.now, interval));
                        let epoch = interval.epoch;
                        self.history.push(interval);
                        self.run(o, Event::Recorded { epoch });
                    } else {
                        // Answered on the next step, as a map store answers later: a primary
                        // behind the recorded history retries until its map catches up.
                        // One record in flight per OSD, as the host keeps it.
                        let epoch = interval.epoch;
                        let history = self.history.clone();
                        if !self.answers.iter().any(|(a, _)| *a == o) {
                            self.answers
                                .push((o, Event::RecordFailed { epoch, history }));
                        }
                    }
                }
                Action::Ack { req, version } => {
                    if let Some((oid, _)) = self.outstanding.get(&req.tid).cloned() {
                        // On every acting member's disk (or overwritten since), and data
                        // and all on min_size of them at least: a member that restarted
                        // with the write in flight may hold its log entry only, and recover
                        // the object in the background.
                        let acting = self.members[o as usize].acting().to_vec();
                        let mut with_data = 0;
                        for &m in &acting {
                            let disk = &self.disks[m as usize];
                            let held = disk.objects.get(&oid).copied();
                            let lacks = disk.missing.contains_key(&oid);
                            if held < Some(version) {
                                self.violations.push(format!(
                                    "t{}: osd.{o} acknowledges {oid} {version} but osd.{m}'s \
                                     disk has {held:?}",
                                    self.now
                                ));
                            }
                            with_data += usize::from(!(held == Some(version) && lacks));
                        }
                        if with_data < self.shape.min_size {
                            self.violations.push(format!(
                                "t{}: osd.{o} acknowledges {oid} {version} with its data on \
                                 {with_data} of {acting:?}",
                                self.now
                            ));
                        }
                    }
                    if let Some((oid, _)) = self.outstanding.remove(&req.tid) {
                        self.log
                            .push(format!("t{} osd.{o} acks {oid} {version}", self.now));
                        let v = self.acked.entry(oid).or_default();
                        *v = (*v).max(version);
                        self.acks += 1;
                    }
                }
                Action::Refuse { .. } => {}
                Action::RecoverFirst { oid } => {
                    self.urgent[o as usize].insert(oid);
                }
                Action::Persist { seq, .. } => {
                    let at = self.now + self.rng.random_range(1..4);
                    self.seq += 1;
                    let snapshot = self.members[o as usize].clone();
                    let inc = self.incarnation[o as usize];
                    self.persists
                        .insert((at, self.seq), (o, inc, seq, snapshot));
                }
            }
        }
    }

    /// OSD `o`'s store holds `oid` at `version`, durably: the disk's state, and the states on
    /// their way to it, say so.
    fn store_holds(&mut self, o: u32, oid: &str, version: Version) {
        self.stores[o as usize].insert(oid.to_string(), version);
        Self::stored(&mut self.disks[o as usize], oid, version);
        for p in self.persists.values_mut().filter(|p| p.0 == o) {
            Self::stored(&mut p.3, oid, version);
        }
    }

    /// A disk's state once its store holds `oid` at `version`.
    fn stored(disk: &mut Member, oid: &str, version: Version) {
        if disk.missing.get(oid) == Some(&version) {
            disk.missing.remove(oid);
        } else if let Some(&v) = disk.objects.get(oid) {
            if v != version {
                // Its state names another version than the store now holds.
                disk.missing.insert(oid.to_string(), v);
            }
        }
    }

    /// Objects a member lacks that its store holds at the very version needed (a history
    /// named a version this copy had, but as missing): the member hears they are held, as the
    /// host tells it once the history is durable.
    fn already_held(&mut self) {
        for o in 0..self.shape.osds {
            let i = o as usize;
            if !self.running[i] {
                continue;
            }
            let Some(missing) = self.members[i].recoverable() else {
                continue;
            };
            let found: Vec<(String, Version)> = missing
                .iter()
                .filter(|(k, v)| self.stores[i].get(*k) == Some(*v))
                .map(|(k, v)| (k.clone(), *v))
                .collect();
            for (oid, version) in found {
                self.store_holds(o, &oid, version);
                self.run(o, Event::Recovered { oid, version });
            }
        }
    }

    /// Members pull what they lack from a member whose store holds it, urgent objects first.
    fn recover(&mut self) {
        self.already_held();
        for o in 0..self.shape.osds {
            let i = o as usize;
            if !self.running[i] || self.cut == Some(o) || !self.rng.random_bool(0.3) {
                continue;
            }
            let Some(missing) = self.members[i].recoverable() else {
                continue;
            };
            let missing: Vec<(String, Version)> =
                missing.iter().map(|(k, v)| (k.clone(), *v)).collect();
            let pick = missing
                .iter()
                .find(|(k, _)| self.urgent[i].contains(k))
                .cloned()
                .unwrap_or_else(|| missing[self.rng.random_range(0..missing.len())].clone());
            let (oid, v) = pick;
            if self.pulls.values().any(|p| p.0 == o && p.2 == oid) {
                continue;
            }
            let source = (0..self.shape.osds).find(|&s| {
                s != o && self.reachable(o, s) && self.stores[s as usize].get(&oid) == Some(&v)
            });
            if let Some(source) = source {
                if self.trace {
                    self.log.push(format!(
                        "t{} osd.{o} pulls {oid} {v} from osd.{source}",
                        self.now
                    ));
                }
                let at = self.now + self.rng.random_range(1..6);
                self.seq += 1;
                let inc = self.incarnation[i];
                self.pulls.insert((at, self.seq), (o, inc, oid, v));
            }
        }
        let done: Vec<(u64, u64)> = self
            .pulls
            .range(..(self.now + 1, 0))
            .map(|(k, _)| *k)
            .collect();
        for k in done {
            let (o, inc, oid, version) = self.pulls.remove(&k).expect("due");
            let i = o as usize;
            if inc != self.incarnation[i] || !self.running[i] {
                continue;
            }
            // Stored only if the member still lacks that very version, as the host does it
            // (`store_recovered`): a history taken meanwhile may want another (seed 8223 of
            // three copies of four stored a version rolled back while it was fetched).
            if self.members[i].missing.get(&oid) != Some(&version) {
                // Not stored; a backfill target overtaken by a write says so.
                self.run(o, Event::NotStored { oid, version });
                continue;
            }
            // The store holds it durably before the member hears: the disk, and the states
            // on their way to it, say so.
            self.store_holds(o, &oid, version);
            self.urgent[i].remove(&oid);
            self.recovered += 1;
            if self.trace {
                self.log
                    .push(format!("t{} osd.{o} recovered {oid} {version}", self.now));
            }
            self.run(o, Event::Recovered { oid, version });
        }
    }

    fn client(&mut self) {
        // The client's map lags: it learns the current epoch now and then.
        if self.rng.random_bool(0.2) {
            self.client_view = (self.epoch, self.acting.first().copied());
        }
        let Some(primary) = self.client_view.1 else {
            return;
        };
        if self.outstanding.len() < 4 && self.rng.random_bool(0.3) {
            let tid = self.next_req;
            self.next_req += 1;
            let oid = format!("o{}", self.rng.random_range(0..OBJECTS));
            self.outstanding.insert(tid, (oid, 0));
        }
        // Send what is new, and retry what has waited long (same request id).
        let due: Vec<(u64, String)> = self
            .outstanding
            .iter()
            .filter(|(_, (_, sent))| *sent == 0 || self.now - sent > 40)
            .map(|(t, (o, _))| (*t, o.clone()))
            .collect();
        for (tid, oid) in due {
            self.outstanding.get_mut(&tid).expect("outstanding").1 = self.now;
            if self.cut == Some(primary) {
                continue; // the client cannot reach it either
            }
            let req = ReqId { client: 1, tid };
            self.run(
                primary,
                Event::Write {
                    req,
                    oid,
                    kind: OpKind::Modify,
                },
            );
        }
    }

    /// The reader reads one object from the OSD it believes primary, which serves it only
    /// while it holds its read lease (it may be cut off from everyone else, the reader not).
    fn read(&mut self) {
        // Like a real client, it stays with the OSD it knows until that refuses it, and
        // otherwise learns of new maps only now and then.
        if self.rng.random_bool(0.005) {
            self.reader_view = (self.epoch, self.acting.first().copied());
        }
        let Some(o) = self.reader_view.1 else {
            self.reader_view = (self.epoch, self.acting.first().copied());
            return;
        };
        if !self.rng.random_bool(0.4) {
            return;
        }
        let oid = format!("o{}", self.rng.random_range(0..OBJECTS));
        let m = &self.members[o as usize];
        if !self.running[o as usize] || !m.is_active_primary() {
            self.reader_view = (self.epoch, self.acting.first().copied());
            return;
        }
        if m.missing.contains_key(&oid) {
            return; // waits for recovery
        }
        if m.any_in_flight(|o| o == oid) {
            return; // waits for the write to be on every acting member (it may yet vanish)
        }
        if !m.readable(self.clock(o)) {
            self.lease_waits += 1;
            return;
        }
        self.reads += 1;
        let served = m.objects.get(&oid).copied();
        let acked = self.acked.get(&oid).copied();
        if served < acked {
            self.violations.push(format!(
                "t{}: osd.{o} (epoch {}, current {}) serves a read of {oid} at {served:?}, \
                 but {acked:?} was acknowledged",
                self.now,
                m.epoch(),
                self.epoch
            ));
        }
        if let Some(seen) = self.seen.get(&oid).copied() {
            if served < Some(seen) {
                self.violations.push(format!(
                    "t{}: osd.{o} (epoch {}, current {}) serves a read of {oid} at {served:?}, \
                     but an earlier read returned {seen}",
                    self.now,
                    m.epoch(),
                    self.epoch
                ));
            }
        }
        let before_give_up = self.given_up_in.get(&oid).is_some_and(|e| m.epoch() < *e);
        if let (Some(v), false) = (served, before_give_up) {
            let s = self.seen.entry(oid).or_insert(v);
            *s = (*s).max(v);
        }
    }

    /// The operator's `carmine pg mark-unfound-lost` on primary `o`: the PG may go active
    /// without the objects no member it heard holds, deleting them in its own epoch. Their
    /// acknowledged writes are given up, and only theirs: it may drop no more objects than
    /// it counted unfound, and every other acknowledged write stays checked.
    fn give_up(&mut self, o: u32) {
        let unfound = self.members[o as usize].unfound();
        self.log.push(format!(
            "t{} operator gives up osd.{o}'s {unfound} unfound objects",
            self.now
        ));
        self.given_up += 1;
        // The member's epoch, not the simulator's: its map may lag, and it gives up in the
        // peering of the epoch it is in.
        self.pending_give_up = Some((o, self.members[o as usize].epoch(), unfound));
        self.run(o, Event::GiveUpUnfound);
        self.settle_give_up();
    }

    /// Once the primary that was told to give up leaves peering in that epoch (it may first
    /// wait for other things), the acknowledged writes of the objects it deleted are given
    /// up; a crash or a new epoch cancels the give-up.
    fn settle_give_up(&mut self) {
        let Some((o, epoch, unfound)) = self.pending_give_up else {
            return;
        };
        let m = &self.members[o as usize];
        if !self.running[o as usize] || m.epoch() != epoch {
            self.pending_give_up = None;
            return;
        }
        if m.is_peering() {
            return;
        }
        self.pending_give_up = None;
        let dropped: Vec<String> = self
            .acked
            .iter()
            .filter(|(oid, v)| m.objects.get(*oid) < Some(*v))
            .map(|(oid, _)| oid.clone())
            .collect();
        if dropped.len() > unfound {
            self.violations.push(format!(
                "t{}: osd.{o} counted {unfound} unfound objects but giving them up dropped \
                 acknowledged writes of {dropped:?}",
                self.now
            ));
        }
        for oid in dropped {
            self.log
                .push(format!("t{} {oid} given up by the operator", self.now));
            self.acked.remove(&oid);
        }
        // What a reader saw of the objects given up (unacknowledged writes included) is gone.
        // An old primary may still serve them on its lease until the new one activates: what
        // it reads from before the give-up's epoch is the world before it.
        let objects = &self.members[o as usize].objects;
        for (oid, v) in &self.seen {
            if objects.get(oid) < Some(v) {
                self.given_up_in.insert(oid.clone(), epoch);
            }
        }
        self.seen.retain(|oid, v| objects.get(oid) >= Some(v));
    }

    /// OSD `o` crashes; `lose_disk`: it comes back with an empty disk.
    fn crash(&mut self, o: u32, lose_disk: bool) {
        self.log.push(format!("t{} osd.{o} crashes", self.now));
        self.running[o as usize] = false;
        self.incarnation[o as usize] += 1;
        // What was being written may or may not have reached the disk.
        let torn: Vec<(u64, u64)> = self
            .persists
            .iter()
            .filter(|(_, p)| p.0 == o)
            .map(|(k, _)| *k)
            .collect();
        for k in torn {
            let (_, inc, seq, snapshot) = self.persists.remove(&k).expect("listed");
            if self.rng.random_bool(0.5) {
                self.land(o, inc, seq, snapshot);
            }
        }
        if lose_disk {
            self.log
                .push(format!("t{} osd.{o} lost its disk", self.now));
            let primary = self.acting.first() == Some(&o);
            self.disk_lost[usize::from(primary)] = true;
            self.temp_counts.disks_lost += 1;
            if primary {
                self.temp_counts.primary_disks_lost += 1;
            }
            self.disks[o as usize] = Member::new(o, 64);
            self.stores[o as usize].clear();
        }
        if self.trace {
            let disk = &self.disks[o as usize];
            self.log.push(format!(
                "t{} osd.{o}'s disk: head {}, missing {:?}; store {:?}",
                self.now,
                disk.log.head(),
                disk.missing,
                self.stores[o as usize]
            ));
        }
        self.members[o as usize] = self.disks[o as usize].restart();
        if self.trace {
            let m = self.members[o as usize].describe();
            self.log
                .push(format!("t{} osd.{o} restarts as: {m}", self.now));
        }
        // Its host's start: an incarnation newer than any before.
        self.members[o as usize].set_incarnation(self.incarnation[o as usize] + 1);
        // Leases granted before the crash run at most a lease past it.
        let until = self.clock(o) + self.lease;
        self.members[o as usize].set_read_lease(self.lease, until);
        self.urgent[o as usize].clear();
        // A process supervisor may start it again at once, before the map notices
        if self.quick_restarts && self.rng.random_bool(0.3) {
            self.log
                .push(format!("t{} osd.{o} restarts at once", self.now));
            self.running[o as usize] = true;
            self.deliver_map(o);
        }
    }

    fn faults(&mut self) {
        // On a seed with temporary sets, once for a replica and once for a primary (whose
        // copy may go far more often): an acting member whose disk holds nothing the others
        // lack loses it (a replaced disk, or a memory store restarted).
        let all_lost = self.disk_lost.iter().all(|l| *l);
        if self.temps && !all_lost && !self.acting.is_empty() && self.rng.random_bool(0.02) {
            let o = self.acting[self.rng.random_range(0..self.acting.len())];
            let primary = self.acting.first() == Some(&o);
            if !self.disk_lost[usize::from(primary)]
                && self.running[o as usize]
                && self.may_lose_disk(o)
            {
                self.crash(o, true);
            }
        }
        // Now and then the operator gives up on a primary that waits for unfound objects
        // (a draw only then, so seeds without unfound objects run as before).
        if let Some(&p) = self.acting.first() {
            if self.running[p as usize]
                && self.members[p as usize].unfound() > 0
                && self.rng.random_bool(0.05)
            {
                self.give_up(p);
            }
        }
        let r: f64 = self.rng.random();
        if r < 0.004 {
            // Crash an OSD: the manager notices (down in a new epoch) a little later.
            let o = self.rng.random_range(0..self.shape.osds);
            if self.running[o as usize] {
                self.crash(o, false);
            }
        } else if r < 0.008 {
            // Restart a crashed OSD; the manager marks it up a little later.
            let o = self.rng.random_range(0..self.shape.osds);
            if !self.running[o as usize] {
                self.log.push(format!("t{} osd.{o} restarts", self.now));
                self.running[o as usize] = true;
                self.deliver_map(o);
            }
        } else if r < 0.010 {
            // Cut an OSD off (it keeps running and the map keeps it up for a while).
            if self.cut.is_none() {
                let o = self.rng.random_range(0..self.shape.osds);
                self.log.push(format!("t{} osd.{o} cut off", self.now));
                self.cut = Some(o);
            }
        } else if r < 0.013 {
            if let Some(o) = self.cut.take() {
                self.log.push(format!("t{} osd.{o} reconnected", self.now));
            }
        } else if r < 0.03 {
            // The manager: the map follows who runs and is reachable (leases).
            let seen: Vec<bool> = (0..self.shape.osds)
                .map(|o| self.running[o as usize] && self.cut != Some(o))
                .collect();
            if seen != self.up_in_map {
                self.up_in_map = seen;
                self.new_epoch();
            }
        }
    }

    /// One tick: faults (unless healed), maps, messages due, member ticks, the client.
    fn step(&mut self, faults: bool) {
        self.settle_give_up();
        self.now += 1;
        if faults {
            self.faults();
        } else {
            self.client_view = (self.epoch, self.acting.first().copied());
        }
        self.spread_map();
        for (o, ev) in std::mem::take(&mut self.answers) {
            self.run(o, ev);
        }
        while let Some(entry) = self.history_reads.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let (o, ev) = entry.remove();
            if self.running[o as usize] {
                self.run(o, ev);
            }
        }
        // Complete the persists that are due.
        let done: Vec<(u64, u64)> = self
            .persists
            .range(..(self.now + 1, 0))
            .map(|(k, _)| *k)
            .collect();
        for k in done {
            let (o, inc, seq, snapshot) = self.persists.remove(&k).expect("due");
            if inc == self.incarnation[o as usize] {
                self.land(o, inc, seq, snapshot);
                self.run(o, Event::Persisted { seq });
            }
        }
        // Deliver what is due.
        let due: Vec<(u64, u64)> = self
            .net
            .range(..(self.now + 1, 0))
            .map(|(k, _)| *k)
            .collect();
        for k in due {
            let (from, to, (from_inc, to_inc), msg) = self.net.remove(&k).expect("due");
            if self.reachable(from, to)
                && self.members[to as usize].admit(from, from_inc, to_inc, &msg)
            {
                if self.trace {
                    let what = match &msg {
                        Msg::Rep { epoch, entry } => format!("Rep {epoch} {}", entry.version),
                        Msg::RepAck { epoch, version } => format!("RepAck {epoch} {version}"),
                        Msg::Activate {
                            epoch,
                            round,
                            run,
                            log,
                            ..
                        } => {
                            let head = log.head();
                            let run = run.1;
                            format!("Activate {epoch} round {round} run {run} head {head}")
                        }
                        Msg::Info { epoch, info, .. } => format!("Info {epoch} {info:?}"),
                        other => format!("{other:?}"),
                    };
                    self.log.push(format!("t{} {from}->{to} {what}", self.now));
                }
                self.run(to, Event::Msg { from, msg });
            }
        }
        let ev = if self.now.is_multiple_of(5) {
            Event::Tick
        } else {
            Event::Clock
        };
        for o in 0..self.shape.osds {
            self.run(o, ev.clone());
        }
        self.recover();
        self.client();
        self.read();
        self.change_temps();
    }

    /// The active primary of the current epoch holds every acknowledged write, and no
    /// invariant broke during the step.
    fn check(&mut self) -> Result<(), String> {
        if let Some(v) = self.violations.first() {
            return Err(v.clone());
        }
        // Peering takes a version to name one write among the logs it compares
        // (`plan_member`): no two writes may ever get one version, even if the first was
        // rolled back everywhere before the second was made (a primary restarted within its
        // epoch goes active in a later run, whose versions differ from all its earlier
        // runs'). Logs grow at their newest entries: those are recorded, to keep it cheap.
        for (i, m) in self.members.iter().chain(&self.disks).enumerate() {
            if i < self.members.len() && !self.running[m.osd as usize] {
                continue;
            }
            for e in m.log.entries().rev().take(8) {
                match self.named.get(&e.version) {
                    Some((osd, first)) if first != e => {
                        return Err(format!(
                            "t{}: two writes have version {}: {first:?} at osd.{osd}, and \
                             {e:?} at osd.{}",
                            self.now, e.version, m.osd
                        ));
                    }
                    Some(_) => {}
                    None => {
                        self.named.insert(e.version, (m.osd, e.clone()));
                    }
                }
            }
        }
        for m in &self.members {
            if !self.running[m.osd as usize] || !m.is_active_primary() || m.epoch() != self.epoch {
                continue;
            }
            for (oid, v) in &self.acked {
                if let Some(need) = m.missing.get(oid) {
                    let somewhere = self.stores.iter().any(|s| s.get(oid) == Some(need));
                    if !somewhere {
                        return Err(format!(
                            "t{}: osd.{} is the active primary and lacks {oid} {need}, \
                             which no disk holds",
                            self.now, m.osd
                        ));
                    }
                }
                match m.objects.get(oid) {
                    Some(have) if have >= v => {}
                    other => {
                        return Err(format!(
                            "t{}: osd.{} is the active primary of epoch {} but {oid} is {other:?}, \
                             acknowledged {v}",
                            self.now, m.osd, self.epoch
                        ))
                    }
                }
            }
        }
        Ok(())
    }
}

/// What one seed did: acknowledged writes, objects recovered, reads served, reads held
/// back for a lease, unfound objects given up by the operator, temporary sets.
type Counts = (u64, u64, u64, u64, u64, TempCounts);

fn run_seed(seed: u64, shape: Shape) -> Result<Counts, String> {
    let mut sim = Sim::new(seed, shape);
    let fail = |sim: &Sim, e: String| {
        let verbose = std::env::var("CARMINE_SIM_SEED").is_ok();
        let tail: Vec<&String> = sim
            .log
            .iter()
            .rev()
            .filter(|l| verbose || !l.contains(" acks "))
            .take(if verbose { 3000 } else { 40 })
            .collect();
        let tail: Vec<&String> = tail.into_iter().rev().collect();
        let states: Vec<String> = sim
            .members
            .iter()
            .map(|m| format!("{}; lacks {:?}", m.describe(), m.missing))
            .collect();
        Err(format!(
            "seed {seed}: {e}\nmembers: {states:#?}\nlast events:\n{tail:#?}"
        ))
    };
    for _ in 0..STEPS {
        sim.step(true);
        sim.settle_give_up();
        if let Err(e) = sim.check() {
            return fail(&sim, e);
        }
    }
    // Heal: everything runs and is reachable, nothing is lost; the map follows; let it settle.
    sim.cut = None;
    sim.healed = true;
    for o in 0..sim.shape.osds {
        if !sim.running[o as usize] {
            sim.running[o as usize] = true;
            sim.deliver_map(o);
        }
    }
    sim.up_in_map = vec![true; sim.shape.osds as usize];
    sim.new_epoch();
    let before = sim.acks;
    for tick in 0..600 {
        sim.step(false);
        sim.settle_give_up();
        if let Err(e) = sim.check() {
            return fail(&sim, e);
        }
        // Settled and healed, nobody may say a peer has been silent for two leases (the
        // least peer grace an OSD reports after): that would be a false failure report.
        if tick >= 300 {
            for o in 0..sim.shape.osds {
                let now = sim.clock(o);
                let silent = sim.members[o as usize].unresponsive(now);
                if let Some((peer, d)) = silent.iter().find(|(_, d)| *d >= 2 * sim.lease) {
                    return fail(
                        &sim,
                        format!(
                            "healed and settled, but osd.{o} says osd.{peer} has been silent \
                             for {d} (lease {})",
                            sim.lease
                        ),
                    );
                }
            }
        }
    }
    let primary = sim.acting[0];
    let p = &sim.members[primary as usize];
    if !p.is_active_primary() {
        return fail(
            &sim,
            format!("healed for 600 ticks, but osd.{primary} is not active"),
        );
    }
    if sim.acks == before {
        let states: Vec<String> = sim.members.iter().map(|m| m.describe()).collect();
        return fail(
            &sim,
            format!(
                "healed, but no write was acknowledged; outstanding {:?}; {states:#?}",
                sim.outstanding
            ),
        );
    }
    if !p.is_clean() {
        return fail(
            &sim,
            format!("healed for 600 ticks, but osd.{primary} is not clean"),
        );
    }
    if sim.temp.is_some() || !p.targets().is_empty() {
        return fail(
            &sim,
            format!(
                "healed for 600 ticks, but the temporary set {:?} is still there (targets \
                 {:?}, {} objects misplaced)",
                sim.temp,
                p.targets(),
                p.misplaced()
            ),
        );
    }
    for &o in &sim.acting {
        let m = &sim.members[o as usize];
        if !m.missing.is_empty() {
            return fail(&sim, format!("healed, but osd.{o} still lacks objects"));
        }
        if m.objects != p.objects && sim.outstanding.is_empty() {
            return fail(
                &sim,
                format!("osd.{o} differs from the primary osd.{primary} once quiet"),
            );
        }
    }
    Ok((
        sim.acks,
        sim.recovered,
        sim.reads,
        sim.lease_waits,
        sim.given_up,
        sim.temp_counts,
    ))
}

/// Runs the seeds `CARMINE_SIM_SEEDS` says (2000 by default), or the one
/// `CARMINE_SIM_SEED` names, of one shape.
fn run_seeds(shape: Shape) {
    if let Ok(seed) = std::env::var("CARMINE_SIM_SEED") {
        let seed: u64 = seed.parse().expect("CARMINE_SIM_SEED is a number");
        run_seed(seed, shape).unwrap_or_else(|e| panic!("{e}"));
        return;
    }
    let seeds: u64 = std::env::var("CARMINE_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    // A long search goes on from where the last one stopped.
    let first: u64 = std::env::var("CARMINE_SIM_FIRST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (mut acks, mut recovered, mut reads, mut waits, mut given_up) = (0, 0, 0, 0, 0);
    let mut temps = TempCounts::default();
    for seed in first..first + seeds {
        let (a, r, rd, w, g, t) = run_seed(seed, shape).unwrap_or_else(|e| panic!("{e}"));
        acks += a;
        recovered += r;
        reads += rd;
        waits += w;
        given_up += g;
        temps.primed += t.primed;
        temps.asked += t.asked;
        temps.released += t.released;
        temps.disks_lost += t.disks_lost;
        temps.primary_disks_lost += t.primary_disks_lost;
    }
    println!(
        "{seeds} seeds: {acks} acknowledged writes, {recovered} objects recovered, \
         {reads} reads served, {waits} held back for a lease, {given_up} give-ups of \
         unfound objects; temporary acting sets: {} primed, {} asked for, {} released; {} \
         disks lost, {} of them a primary's",
        temps.primed, temps.asked, temps.released, temps.disks_lost, temps.primary_disks_lost
    );
    assert!(
        seeds < 10
            || (temps.primed > seeds
                && temps.asked > seeds / 20
                && temps.released > seeds
                && temps.disks_lost - temps.primary_disks_lost > seeds / 20
                && temps.primary_disks_lost > seeds / 50),
        "the simulation hardly used temporary acting sets: {} primed, {} asked for, {} released",
        temps.primed,
        temps.asked,
        temps.released
    );
    assert!(
        reads > seeds * 50,
        "the simulation hardly read anything: {reads}"
    );
    assert!(
        recovered > seeds,
        "the simulation hardly recovered anything in the background: {recovered}"
    );
    assert!(
        acks > seeds * 50,
        "the simulation hardly wrote anything: {acks}"
    );
}

#[test]
fn no_acknowledged_write_is_lost_under_crashes_partitions_and_lost_messages() {
    run_seeds(THREE_OF_FOUR);
}

#[test]
fn two_copies_of_three_lose_nothing_and_serve_no_stale_read_either() {
    run_seeds(TWO_OF_THREE);
}

#[test]
fn three_copies_of_five_serving_on_one_lose_nothing() {
    run_seeds(THREE_OF_FIVE_MIN_ONE);
}
