//! One OSD's copy of one PG as an event-driven state machine (decision 0009): it peers when
//! the acting set changes, and while active its primary replicates writes to every acting
//! member and acknowledges a write once all of them have it. Events go in, actions come out;
//! the host (the OSD, or the simulator) delivers messages, records intervals in the map
//! store and answers clients.
//!
//! Objects are tracked by the version of their last write: the host derives an object's bytes
//! from what that write carried, so recovery here moves versions, and the host moves data.
//!
//! Nothing counts as done before it is durable: every change to the member's copy (a write, an
//! activation) is handed to the host as [`Action::Persist`] — one store transaction holding the
//! log entry and the object — and a replica acknowledges, and a primary counts itself, only once
//! the host reports it with [`Event::Persisted`]. A crash loses what was not persisted.
//!
//! Reads are fenced by leases the replicas grant (decision 0009, "read leases"): the active
//! primary serves reads only while every other acting member recently promised, answering its
//! ping, not to help a newer interval go active for a lease duration; a new primary goes active
//! only once the promises its members report have run out. Time is the host's: each event
//! comes with the member's clock (monotone; only its rate need match other members' closely).

use crate::log::{Entry, OpKind, PgLog, ReqId};
use crate::peering::{
    all_answered, answered, choose_authoritative, plan_member, uncovered_intervals, Interval,
    MemberPlan, PeerInfo,
};
use crate::version::{Version, RUN_MAX};
use carmine_types::OsdId;
use std::collections::{BTreeMap, BTreeSet};

mod messages;
mod missing;
mod silence;

pub use messages::{Action, Event, Msg, Persisting};
pub use missing::BACKFILL_LACKS;

/// The share of a lease, in tenths, a primary trusts of its members' promises, and the share
/// (also in tenths) a new primary waits of what a member says its promise has left: together
/// they absorb clock rates up to about 5% apart.
const LEASE_TRUSTED_TENTHS: u64 = 9;
const PROMISE_WAITED_TENTHS: u64 = 11;
/// Pings per lease duration.
const PINGS_PER_LEASE: u64 = 4;

/// Objects an active primary asks a member about per tick, when the member was said to lack
/// some (to learn of recoveries whose reports were lost).
const LACKS_ASKED: usize = 16;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Role {
    /// No map yet, or not in the acting set.
    Stray,
    /// Primary gathering infos.
    Peering {
        heard: BTreeMap<OsdId, Answer>,
    },
    /// Primary waiting for activation acks and the history record.
    Activating {
        acked: BTreeSet<OsdId>,
        recorded: bool,
    },
    Active,
    /// Replica of the current interval.
    Replica,
}

/// A member's answer to a query: info, log, object versions, and the objects it lacks.
type Answer = (PeerInfo, PgLog, BTreeMap<String, Version>, BTreeSet<String>);

/// A write waiting for the acting set.
#[derive(Clone, Debug)]
struct Pending {
    version: Version,
    req: ReqId,
    /// The acting members that have not acknowledged it durable yet.
    waiting: BTreeSet<OsdId>,
    /// Those that hold its log entry durable but lack its object's data (they restarted, or
    /// their store had no room for it, and took the PG's history with the object missing):
    /// they recover it in the background. The write is done once the others number at least
    /// `min_size`, as a write to a degraded PG is.
    lacking: BTreeSet<OsdId>,
    /// When the primary sent it (the member's clock): how long a silent copy held it.
    since: u64,
}

/// One OSD's copy of one PG. `log`, `objects`, `missing` and `les` are its durable state: a
/// host that crashes keeps them (see [`Member::restart`]).
#[derive(Clone, Debug)]
pub struct Member {
    pub osd: OsdId,
    pub log: PgLog,
    /// Each object's version as the PG's history names it.
    pub objects: BTreeMap<String, Version>,
    /// The objects of `objects` this member's store does not hold at that version yet: taken
    /// with a history, recovered in the background (the version is the one it needs).
    pub missing: BTreeMap<String, Version>,
    /// The last epoch in which this member went active with the PG.
    pub les: u32,
    /// The (epoch, primary's run) of the newest activation this copy took (see
    /// [`Version`]): its own as the primary, its primary's as a member. Persisted with the
    /// activation's history, so every acting member holds a run before its first write, and
    /// a primary whose disk is new learns its earlier runs from them. A copy that took none:
    /// (0, 0), epoch 0 being none.
    pub primary_run: (u32, u32),
    /// As the active primary: its run within the epoch, the one its writes' versions name.
    run: u32,
    epoch: u32,
    acting: Vec<OsdId>,
    /// The PG's backfill targets in this epoch (see [`Event::Map`]).
    targets: Vec<OsdId>,
    /// Writes wait for what the targets lack (see [`Member::wait_for_targets`]).
    wait_for_targets: bool,
    /// As a primary: objects a backfill target's copy of was overtaken by a write
    /// ([`Msg::Overtaken`]); writes to them wait for the targets that lack them.
    overtaken: BTreeSet<String>,
    /// As a primary: when each target was last activated, or said it restarted (it was
    /// alive then); its silence counts from no earlier.
    target_since: BTreeMap<OsdId, u64>,
    history: Vec<Interval>,
    min_size: usize,
    role: Role,
    pending: Vec<Pending>,
    /// As a primary: the peering round within the epoch.
    round: u32,
    /// As a member: the (epoch, primary's incarnation, round) of the last activation it took
    /// (a primary restarted within the epoch counts its rounds again from 0).
    activated: (u32, u64, u32),
    /// This member's incarnation: its host's, new at every start, larger than any before.
    incarnation: u64,
    /// The newest incarnation heard from each other OSD (see [`Member::admit`]).
    peer_inc: BTreeMap<OsdId, u64>,
    /// The message [`Member::admit`] let through last was addressed to an earlier
    /// incarnation of this member (consumed by the next message handled).
    to_earlier_run: bool,
    /// The epoch the current interval (this acting set, no epoch missed) began in.
    interval_start: u32,
    /// The epoch in which `history` was last read from the map store (or found changed by a
    /// failed record): a primary activates only on a history read in its own interval.
    history_read: u32,
    /// Persists asked for: the head each one makes durable, and whether it takes a history.
    persist_seq: u64,
    persisting: std::collections::VecDeque<(u64, Version, bool)>,
    /// The newest head known durable, and the last persist completed.
    durable_head: Version,
    persisted: u64,
    /// As a primary: the persist of the history it took at activation.
    activation_persist: u64,
    /// An activation to acknowledge once it is durable: (primary, epoch, round, head,
    /// persist seq).
    activation_ack: Option<(OsdId, u32, u32, Version, u64)>,
    /// As a primary: what each other acting member lacks, as its activation acknowledgement
    /// and later recoveries said (`None`: not told since it was activated again: it may
    /// lack anything).
    peer_missing: BTreeMap<OsdId, Option<BTreeSet<String>>>,
    /// As a primary: the newest head each member acknowledged.
    acked_head: BTreeMap<OsdId, Version>,
    /// As a primary: the round of the activation each member was last sent (a member that
    /// restarted within the interval gets one of its own); its reports count only in it.
    member_round: BTreeMap<OsdId, u32>,
    /// As a primary: the head of the newest activation sent to each member in this epoch
    /// (see `acknowledged_missing`).
    activation_heads: BTreeMap<OsdId, Version>,
    /// As a primary gathering infos: objects no member heard from holds (it waits for more).
    unfound: usize,
    /// As a primary that heard its whole acting set: recorded intervals none of whose
    /// members it heard vouches for (their OSDs are down, or came back empty). It waits.
    uncovered: usize,
    /// Of those, the intervals all of whose members answered (came back empty, or were
    /// declared lost).
    lost_intervals: usize,
    /// The OSDs an operator declared lost, with the epoch of the declaration (from the map).
    lost: BTreeMap<OsdId, u32>,
    /// Members of uncovered intervals that have not answered (see `waiting_on`).
    waiting_on: BTreeSet<OsdId>,
    /// Set by [`Event::GiveUpUnfound`] until this peering activates or the epoch changes:
    /// activation then deletes the unfound objects instead of waiting for them. It outlives
    /// the event because activation may still wait for something else (a member's answer,
    /// promises to run out); it does not outlive the epoch, whose unfound objects the
    /// operator judged.
    give_up_unfound: bool,
    /// As a primary that heard its whole acting set: the run it would activate in is past
    /// [`RUN_MAX`], because of the runs these members (itself perhaps) reported (see
    /// [`Member::runs_used_up_by`]). It waits.
    runs_used_up_by: BTreeSet<OsdId>,
    /// The member's clock, as of the event being handled.
    now: u64,
    /// The read lease's duration in the host's clock (0: no leases; only a PG of one member
    /// then serves reads).
    lease: u64,
    /// The longest lease any member may have granted, in the host's clock: what a peer
    /// reports as still running is waited out at most this long.
    lease_bound: u64,
    /// Read leases this member granted, as a replica: primary (`None`: unknown, granted by an
    /// earlier incarnation of this member) → until when, in this member's clock.
    promises: BTreeMap<Option<OsdId>, u64>,
    /// As the active primary: the newest stamp each other acting member answered with the
    /// lease it granted, when it last pinged, and until when it may serve reads (the earliest
    /// of the stamps plus most of the shorter of its lease and the one granted).
    pongs: BTreeMap<OsdId, (u64, u64)>,
    /// As the active primary: the other acting members whose last pong said their store is
    /// full (see [`Member::full_members`]).
    full_members: BTreeSet<OsdId>,
    /// Whether this member's own store is full, as its host last said: its pongs say so.
    store_full: bool,
    last_ping: Option<u64>,
    readable_until: u64,
    /// When it last went active.
    active_since: u64,
    /// As a primary: when it began peering in this interval (or again after a failed record):
    /// members it waits on since then and has not heard from are silent that long.
    peering_since: u64,
    /// As a replica: when its primary's last ping of this interval came (none yet: the
    /// primary may still be activating, and owes it nothing).
    pinged_at: Option<u64>,
    /// As a primary peering: the leases its members (this one included) said they granted,
    /// by grantee, and until when (this member's clock) each is waited out, and the OSDs that
    /// answered its query in this epoch: leases granted to those fence nothing (see
    /// `wait_out_leases`).
    lease_waits: Vec<(Option<OsdId>, u64)>,
    answered: BTreeSet<OsdId>,
}

impl Member {
    pub fn new(osd: OsdId, log_entries: usize) -> Self {
        Member {
            osd,
            log: PgLog::new(log_entries),
            objects: BTreeMap::new(),
            missing: BTreeMap::new(),
            les: 0,
            primary_run: (0, 0),
            run: 0,
            epoch: 0,
            acting: Vec::new(),
            targets: Vec::new(),
            wait_for_targets: false,
            overtaken: BTreeSet::new(),
            target_since: BTreeMap::new(),
            history: Vec::new(),
            min_size: 1,
            role: Role::Stray,
            pending: Vec::new(),
            round: 0,
            activated: (0, 0, 0),
            incarnation: 0,
            peer_inc: BTreeMap::new(),
            to_earlier_run: false,
            interval_start: 0,
            history_read: 0,
            persist_seq: 0,
            persisting: std::collections::VecDeque::new(),
            durable_head: Version::ZERO,
            persisted: 0,
            activation_persist: 0,
            activation_ack: None,
            peer_missing: BTreeMap::new(),
            acked_head: BTreeMap::new(),
            member_round: BTreeMap::new(),
            activation_heads: BTreeMap::new(),
            unfound: 0,
            uncovered: 0,
            lost_intervals: 0,
            lost: BTreeMap::new(),
            waiting_on: BTreeSet::new(),
            give_up_unfound: false,
            runs_used_up_by: BTreeSet::new(),
            now: 0,
            lease: 0,
            lease_bound: u64::MAX,
            promises: BTreeMap::new(),
            pongs: BTreeMap::new(),
            full_members: BTreeSet::new(),
            store_full: false,
            last_ping: None,
            readable_until: 0,
            active_since: 0,
            peering_since: 0,
            pinged_at: None,
            lease_waits: Vec::new(),
            answered: BTreeSet::new(),
        }
    }

    /// Read leases of `lease` (in the host's clock units). `earlier_until`: until when leases
    /// this member's earlier incarnation may have granted can still run (the host's clock at
    /// its start plus a lease; promises are not persisted). Without a call, no leases are
    /// granted or held, and only a PG of one member serves reads.
    pub fn set_read_lease(&mut self, lease: u64, earlier_until: u64) {
        self.lease = lease;
        if lease > 0 {
            let e = self.promises.entry(None).or_default();
            *e = (*e).max(earlier_until);
        }
    }

    /// The longest lease any OSD may grant (in the host's clock): a reported lease left
    /// beyond it (a bug, or a damaged message) is waited out only this long, so one peer
    /// cannot keep a PG inactive. Without a call, reports are taken as they come.
    pub fn set_lease_bound(&mut self, bound: u64) {
        self.lease_bound = bound;
    }

    /// Whether, as the active primary, it may serve a read now: a newer interval cannot be
    /// active (every other acting member's promise holds, or there is none to hold).
    pub fn readable(&self, now: u64) -> bool {
        self.role == Role::Active && (self.acting.len() == 1 || now < self.readable_until)
    }

    /// As the active primary of more than one member: if its read lease has lapsed, for how
    /// long (since it lapsed, or since it went active if it never held one), and which acting
    /// members have not answered a ping within the lease. Reads wait meanwhile: a lapse longer
    /// than a lease says those members cannot be reached from here.
    pub fn lease_lapsed(&self, now: u64) -> Option<(u64, Vec<OsdId>)> {
        if self.role != Role::Active || self.lease == 0 || self.acting.len() < 2 {
            return None;
        }
        if now < self.readable_until {
            return None;
        }
        let since = self.readable_until.max(self.active_since);
        let silent = self
            .acting
            .iter()
            .filter(|o| **o != self.osd)
            .filter(|o| self.promise_from(**o).is_none_or(|end| end <= now))
            .copied()
            .collect();
        Some((now.saturating_sub(since), silent))
    }

    /// How long the promises granted to anyone but `to` may still run, in this member's
    /// clock, by grantee.
    fn promises_left(&mut self, to: OsdId) -> Vec<(Option<OsdId>, u64)> {
        let now = self.now;
        self.promises.retain(|_, until| *until > now);
        self.promises
            .iter()
            .filter(|(k, _)| **k != Some(to))
            .map(|(k, until)| (*k, until - now))
            .collect()
    }

    /// Whether [`Event::Clock`] at `now` would do anything: a ping is due, or an activation
    /// waits for leases granted to earlier intervals to run out (hosts skip it otherwise).
    pub fn wants_clock(&self, now: u64) -> bool {
        match self.role {
            Role::Active => self.ping_due(now),
            Role::Activating { .. } => true,
            _ => false,
        }
    }

    /// Tells the member whether its store is full (the host looks before handing it a
    /// ping): its answers carry it to the primary.
    pub fn note_store_full(&mut self, full: bool) {
        self.store_full = full;
    }

    /// As the active primary: the other acting members whose store said it is full in its
    /// last answer to a ping. Writes that may grow the PG are refused meanwhile.
    pub fn full_members(&self) -> &BTreeSet<OsdId> {
        static NONE: BTreeSet<OsdId> = BTreeSet::new();
        match self.role {
            Role::Active => &self.full_members,
            _ => &NONE,
        }
    }

    fn ping_due(&self, now: u64) -> bool {
        // Every quarter of the shorter of its own lease and the shortest one its members
        // granted: a member configured with a shorter lease expects pings that often.
        let granted = self.pongs.values().map(|p| p.1).min().unwrap_or(self.lease);
        let every = (self.lease.min(granted) / PINGS_PER_LEASE).max(1);
        self.role == Role::Active
            && self.lease > 0
            && self.acting.len() >= 2
            && self.last_ping.is_none_or(|t| now >= t + every)
    }

    /// As the active primary: pings the other acting members if a ping is due.
    fn ping_if_due(&mut self, out: &mut Vec<Action>) {
        if !self.ping_due(self.now) {
            return;
        }
        self.last_ping = Some(self.now);
        for &o in self.acting.iter().filter(|o| **o != self.osd) {
            out.push(Action::Send {
                to: o,
                msg: Msg::Ping {
                    epoch: self.epoch,
                    stamp: self.now,
                },
            });
        }
    }

    /// How long a primary trusts a promise of `granted`: most of it, and never more than its
    /// own lease (members configured differently grant what they say).
    fn trusted(&self, granted: u64) -> u64 {
        self.lease.min(granted) * LEASE_TRUSTED_TENTHS / 10
    }

    /// Until when, in this primary's clock, member `o`'s last answered ping lets it serve.
    fn promise_from(&self, o: OsdId) -> Option<u64> {
        self.pongs
            .get(&o)
            .map(|&(stamp, granted)| stamp + self.trusted(granted))
    }

    fn on_pong(&mut self, from: OsdId, epoch: u32, stamp: u64, granted: u64, full: bool) {
        // A ping of this interval, sent since it went active (a stamp from another clock —
        // an earlier incarnation's — is ignored).
        if epoch < self.interval_start
            || epoch > self.epoch
            || self.role != Role::Active
            || !self.acting.contains(&from)
            || stamp > self.now
            || stamp < self.active_since
        {
            return;
        }
        let p = self.pongs.entry(from).or_default();
        if stamp >= p.0 {
            *p = (stamp, granted);
            if full {
                self.full_members.insert(from);
            } else {
                self.full_members.remove(&from);
            }
        }
        // None (some member never answered) sorts first: no lease yet.
        let until = self
            .acting
            .iter()
            .filter(|o| **o != self.osd)
            .map(|o| self.promise_from(*o))
            .min()
            .flatten();
        if let Some(until) = until {
            self.readable_until = until;
        }
    }

    /// The member as a host restarts it from what it persisted (`self` being the state as of
    /// its last completed persist): the durable state, nothing in memory.
    pub fn restart(&self) -> Self {
        Member {
            log: self.log.clone(),
            objects: self.objects.clone(),
            missing: self.missing.clone(),
            les: self.les,
            primary_run: self.primary_run,
            durable_head: self.log.head(),
            ..Member::new(self.osd, 1)
        }
    }

    /// This member's incarnation: its host's, new at every start and larger than any earlier
    /// one's (the host's wall clock at its start will do). Messages carry the sender's and the
    /// receiver's incarnation (as the sender knows it); see [`Member::admit`].
    pub fn set_incarnation(&mut self, incarnation: u64) {
        self.incarnation = incarnation;
    }

    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The incarnation of `osd` this member last heard from (0: none yet): what the host
    /// stamps on a message to it as the receiver's.
    pub fn incarnation_of(&self, osd: OsdId) -> u64 {
        self.peer_inc.get(&osd).copied().unwrap_or(0)
    }

    /// Whether `msg` from `from` may be handled. Within one epoch an OSD may restart faster
    /// than the map notices, and what its previous incarnation sent, or was sent, is still on
    /// the way: counting it would mix the two incarnations' rounds and versions. So a message
    /// sent by an incarnation of `from` older than one already heard from is dropped, and so
    /// is an answer addressed to another incarnation of this member (`to_inc`, 0: the sender
    /// did not know): it answers what that one asked. A request addressed to an earlier
    /// incarnation is still handled — its sender learns of the restart from the answer (a
    /// restarted acting member says it is not active) — but for an activation: that one
    /// describes the earlier run's copy and is answered as by a member not active. The host
    /// asks this before it hands the message over as [`Event::Msg`].
    pub fn admit(&mut self, from: OsdId, from_inc: u64, to_inc: u64, msg: &Msg) -> bool {
        let answer = matches!(
            msg,
            Msg::Info { .. }
                | Msg::ActivateAck { .. }
                | Msg::RepAck { .. }
                | Msg::NotActive { .. }
                | Msg::Recovered { .. }
                | Msg::Overtaken { .. }
                | Msg::Pong { .. }
        );
        let to_earlier_run = to_inc != 0 && to_inc != self.incarnation;
        self.to_earlier_run = false;
        if answer && to_earlier_run {
            return false;
        }
        let known = self.peer_inc.entry(from).or_insert(0);
        if from_inc < *known {
            return false;
        }
        *known = from_inc;
        self.to_earlier_run = to_earlier_run;
        true
    }

    /// A member as its host stored it: its log, object versions, the objects it lacks and
    /// last active epoch.
    pub fn restore(
        osd: OsdId,
        log: PgLog,
        objects: BTreeMap<String, Version>,
        missing: BTreeMap<String, Version>,
        les: u32,
        primary_run: (u32, u32),
    ) -> Self {
        Member {
            durable_head: log.head(),
            log,
            objects,
            missing,
            les,
            primary_run,
            ..Member::new(osd, 1)
        }
    }

    /// This (fresh) member takes over its host's persist queue from `old`, whose copy the host
    /// is removing: its persist sequence continues `old`'s, so completions of `old`'s
    /// persists still queued count for nothing here (they would otherwise pass for this
    /// member's own, and let it acknowledge before its writes are durable).
    pub fn succeed(mut self, old: &Member) -> Self {
        self.persist_seq = old.persist_seq;
        self.persisted = old.persist_seq;
        // Peers drop messages of an incarnation older than one they heard (a copy that
        // restarted alone had a newer one than its process).
        self.incarnation = self.incarnation.max(old.incarnation);
        self
    }

    /// Asks the host to persist the copy as it is now.
    fn persist(&mut self, what: Persisting, out: &mut Vec<Action>) -> u64 {
        self.persist_seq += 1;
        let history = matches!(what, Persisting::History { .. });
        self.persisting
            .push_back((self.persist_seq, self.log.head(), history));
        out.push(Action::Persist {
            seq: self.persist_seq,
            what,
        });
        self.persist_seq
    }

    /// The version the next client write gets, if this member is the active primary and
    /// nothing enters before it (a host that applies a conditional write on its own copy
    /// first, with its log entry, asks for it; see [`Event::Write`]).
    pub fn next_version(&self) -> Option<Version> {
        (self.role == Role::Active)
            .then(|| self.log.head().next_in(self.epoch, self.run))
            .flatten()
    }

    /// The epoch in which this member's current interval began (its acting set unchanged
    /// since, with no epoch missed).
    pub fn interval_start(&self) -> u32 {
        self.interval_start
    }

    /// The members the PG needs to take writes, as of the current epoch.
    pub fn min_size(&self) -> usize {
        self.min_size
    }

    /// The acting set of the current epoch, primary first.
    pub fn acting(&self) -> &[OsdId] {
        &self.acting
    }

    /// The PG's recorded history as this member last saw it.
    pub fn history(&self) -> &[Interval] {
        &self.history
    }

    /// Writes in flight (as the active primary).
    pub fn writes_in_flight(&self) -> usize {
        self.pending.len()
    }

    /// The version of the oldest write in flight (as the active primary): writes complete
    /// in version order, so it moves whenever one completes or the interval ends.
    pub fn oldest_in_flight(&self) -> Option<Version> {
        self.pending.first().map(|p| p.version)
    }

    /// Whether a write in flight (as the active primary) may be to an object `touches`
    /// names: true too if the log no longer holds the oldest one (trimmed while it waits).
    pub fn any_in_flight(&self, mut touches: impl FnMut(&str) -> bool) -> bool {
        let Some(oldest) = self.pending.first().map(|p| p.version) else {
            return false;
        };
        if self.log.entries().next().is_none_or(|e| e.version > oldest) {
            return true;
        }
        // Writes in flight are the log's newest entries (those after the oldest one that
        // are already done count too: a cautious answer).
        self.log
            .entries()
            .rev()
            .take_while(|e| e.version >= oldest)
            .any(|e| touches(&e.oid))
    }

    /// The requests of the writes in flight (as the active primary): what a host that gives
    /// up this member answers as refused (its clients retry, and find them by request id).
    pub fn pending_requests(&self) -> impl Iterator<Item = ReqId> + '_ {
        self.pending.iter().map(|p| p.req)
    }

    fn on_persisted(&mut self, seq: u64, out: &mut Vec<Action>) {
        self.persisted = self.persisted.max(seq);
        while self.persisting.front().is_some_and(|(s, _, _)| *s <= seq) {
            let (_, head, _) = self.persisting.pop_front().expect("front");
            self.durable_head = head;
        }
        if let Some((to, epoch, round, head, at)) = self.activation_ack {
            if seq >= at {
                self.activation_ack = None;
                if epoch == self.epoch {
                    out.push(Action::Send {
                        to,
                        msg: Msg::ActivateAck {
                            epoch,
                            round,
                            head,
                            missing: self.missing.keys().cloned().collect(),
                        },
                    });
                }
            }
        }
        match self.role {
            Role::Replica => {
                if let Some(&primary) = self.acting.first() {
                    // Cumulative: everything up to the durable head.
                    out.push(Action::Send {
                        to: primary,
                        msg: Msg::RepAck {
                            epoch: self.epoch,
                            version: self.durable_head,
                        },
                    });
                }
            }
            Role::Activating { .. } => {
                if self.activation_makes_writes() && self.persisted >= self.activation_persist {
                    self.send_activations(out);
                }
                self.record_if_taken(out);
                self.maybe_active()
            }
            Role::Active => {
                let (me, durable) = (self.osd, self.durable_head);
                self.acked_head.insert(me, durable);
                self.count_acked(me);
                self.ack_done(out);
            }
            _ => {}
        }
    }

    pub fn is_active_primary(&self) -> bool {
        self.role == Role::Active
    }

    /// A primary still gathering its members' histories (it may wait for unfound objects).
    pub fn is_peering(&self) -> bool {
        matches!(self.role, Role::Peering { .. })
    }

    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// A replica that took the current interval's activation: it holds every write its
    /// primary acknowledged in this epoch.
    pub fn is_activated_replica(&self) -> bool {
        self.role == Role::Replica && self.activated.0 >= self.interval_start
    }

    /// One line for logs: who, in which epoch and state, with what.
    pub fn describe(&self) -> String {
        let role = match &self.role {
            Role::Stray => "stray".to_string(),
            Role::Peering { heard } => format!(
                "peering, heard {:?}, {} objects unfound, {} intervals unaccounted for{}{}",
                heard.keys().collect::<Vec<_>>(),
                self.unfound,
                self.uncovered,
                if self.history_read < self.interval_start {
                    ", history not read yet"
                } else {
                    ""
                },
                if self.runs_used_up_by.is_empty() {
                    String::new()
                } else {
                    format!(", every run taken (the last by {:?})", self.runs_used_up_by)
                }
            ),
            Role::Activating { acked, recorded } => {
                format!("activating, acked {acked:?}, recorded {recorded}")
            }
            Role::Active => format!(
                "active, {} writes in flight, {} objects degraded, {}",
                self.pending.len(),
                self.degraded(),
                if self.readable(self.now) {
                    "readable"
                } else {
                    "read lease lapsed"
                }
            ),
            Role::Replica => "replica".to_string(),
        };
        format!(
            "osd.{} epoch {} acting {:?}: {role}; head {} les {}, {} missing here",
            self.osd,
            self.epoch,
            self.acting,
            self.log.head(),
            self.les,
            self.missing.len()
        )
    }

    /// Handles `ev` at `now`, the member's clock (monotone).
    pub fn handle(&mut self, now: u64, ev: Event) -> Vec<Action> {
        let mut out = Vec::new();
        self.now = self.now.max(now);
        match ev {
            Event::Map {
                epoch,
                acting,
                targets,
                history,
                min_size,
                lost,
            } => {
                // A map no newer than the one known says nothing (it came late).
                let newer = epoch > self.epoch;
                self.on_map(epoch, acting, history, min_size, lost, &mut out);
                if newer {
                    self.on_targets(targets, &mut out);
                }
            }
            Event::Msg { from, msg } => self.on_msg(from, msg, &mut out),
            Event::Recorded { epoch } => {
                if epoch == self.epoch {
                    if let Role::Activating { recorded, .. } = &mut self.role {
                        *recorded = true;
                    }
                    self.maybe_active();
                }
            }
            Event::RecordFailed { epoch, history } => {
                if epoch == self.epoch && matches!(self.role, Role::Activating { .. }) {
                    self.history = history;
                    self.history_read = epoch;
                    self.round += 1;
                    self.role = Role::Peering {
                        heard: BTreeMap::new(),
                    };
                    self.peering_since = self.now;
                    self.on_tick(&mut out);
                }
            }
            Event::History { epoch, history } => {
                if epoch == self.epoch {
                    let first = self.history_read < self.interval_start;
                    self.history_read = epoch;
                    if let Role::Peering { .. } = self.role {
                        if history != self.history {
                            // Members it has not asked yet: none is silent before it asks.
                            self.peering_since = self.now;
                            self.history = history;
                            self.on_tick(&mut out);
                        } else if first {
                            self.try_activate(&mut out);
                        }
                    }
                }
            }
            Event::Write { req, oid, kind } => self.on_write(req, oid, kind, &mut out),
            Event::Tick => self.on_tick(&mut out),
            // Pings are sent below, after any event.
            Event::Clock => self.maybe_active(),
            Event::Persisted { seq } => self.on_persisted(seq, &mut out),
            Event::Recovered { oid, version } => self.on_recovered(oid, version, &mut out),
            Event::NotStored { oid, version } => self.on_not_stored(oid, version, &mut out),
            Event::GiveUpUnfound => {
                if self.unfound() > 0 || self.lost_intervals() > 0 {
                    self.give_up_unfound = true;
                    self.try_activate(&mut out);
                }
            }
        }
        // At once on activation, and whenever one is due and something happens.
        self.ping_if_due(&mut out);
        out
    }

    fn on_map(
        &mut self,
        epoch: u32,
        acting: Vec<OsdId>,
        history: Option<Vec<Interval>>,
        min_size: usize,
        lost: BTreeMap<OsdId, u32>,
        out: &mut Vec<Action>,
    ) {
        if epoch <= self.epoch {
            return;
        }
        self.lost = lost;
        // The same interval only if no epoch was missed: an OSD cut off for a while may get
        // the same acting set back after other intervals went active without it. A new
        // min_size starts one too: the writes in flight were counted under the old rule, and
        // a PG left with fewer members than the new one asks for must stop taking writes.
        let changed = acting != self.acting || epoch != self.epoch + 1 || min_size != self.min_size;
        if changed {
            self.interval_start = epoch;
            self.pongs.clear();
            self.full_members.clear();
            self.readable_until = 0;
            self.last_ping = None;
            self.pinged_at = None;
        }
        self.epoch = epoch;
        if let Some(history) = history {
            self.history = history;
            self.history_read = epoch;
        }
        self.min_size = min_size;
        self.give_up_unfound = false;
        // Counted again by this epoch's peering.
        self.uncovered = 0;
        self.lost_intervals = 0;
        self.waiting_on.clear();
        self.runs_used_up_by.clear();
        if !changed && matches!(self.role, Role::Active | Role::Replica) {
            // Same interval: writes in flight go on (their replica messages carry the new
            // epoch when sent again).
            return;
        }
        // Writes in flight die with the interval: their clients retry in the next one, where
        // the request id finds them if they survived peering.
        for p in self.pending.drain(..) {
            out.push(Action::Refuse { req: p.req });
        }
        self.acting = acting;
        self.round = 0;
        self.lease_waits.clear();
        self.answered.clear();
        self.role = if self.acting.first() == Some(&self.osd) && self.acting.len() >= min_size {
            Role::Peering {
                heard: BTreeMap::new(),
            }
        } else {
            Role::Stray
        };
        self.peering_since = self.now;
        self.on_tick(out);
    }

    /// Whom the primary must hear from: its acting set and every recorded interval's members.
    fn probe_set(&self) -> BTreeSet<OsdId> {
        let mut s: BTreeSet<OsdId> = self.acting.iter().copied().collect();
        for i in &self.history {
            s.extend(i.acting.iter().copied());
        }
        s
    }

    /// What this member can say of its copy to a primary that peers: only what its disk
    /// holds, since the answer may become the authoritative history (a history naming writes
    /// a crash would lose leaves the members that take it waiting for data nobody holds).
    /// `None` while writes or a history are on their way to the disk: asked again on the
    /// next tick. (Answering a history's arrival with the copy from before it let a member go
    /// on to recover objects to the versions the history named, overwriting what its answer
    /// said it held: tests/answers.rs.)
    fn durable_answer(&self) -> Option<Answer> {
        self.persisting.is_empty().then(|| {
            (
                self.info(),
                self.log.clone(),
                self.objects.clone(),
                self.missing.keys().cloned().collect(),
            )
        })
    }

    fn info(&self) -> PeerInfo {
        PeerInfo {
            osd: self.osd,
            last_epoch_started: self.les,
            head: self.log.head(),
            tail: self.log.tail(),
            primary_run: self.primary_run,
        }
    }

    fn on_tick(&mut self, out: &mut Vec<Action>) {
        let peering = matches!(self.role, Role::Peering { .. });
        let mine = if peering { self.durable_answer() } else { None };
        let probe = if peering {
            self.probe_set()
        } else {
            BTreeSet::new()
        };
        match &mut self.role {
            Role::Peering { heard } => {
                if let Some(mine) = mine {
                    heard.insert(self.osd, mine);
                }
                for o in probe {
                    if !heard.contains_key(&o) {
                        out.push(Action::Send {
                            to: o,
                            msg: Msg::Query { epoch: self.epoch },
                        });
                    }
                }
                self.try_activate(out);
            }
            Role::Activating { recorded, .. } => {
                let recorded = *recorded;
                self.send_activations(out);
                if !recorded {
                    self.record_if_taken(out);
                }
                self.maybe_active();
            }
            Role::Active => {
                // A member activated again and not heard from since: its activation again.
                // One said to lack objects: asked whether it still does (its reports may
                // have been lost, or overtaken by its activation's acknowledgement).
                let me = self.osd;
                let copies: Vec<OsdId> = self.acting.iter().chain(&self.targets).copied().collect();
                for o in copies.into_iter().filter(|o| *o != me) {
                    match self.peer_missing.get(&o) {
                        Some(Some(m)) if m.is_empty() => {}
                        Some(Some(m)) => out.push(Action::Send {
                            to: o,
                            msg: Msg::Lacks {
                                epoch: self.epoch,
                                oids: m.iter().take(LACKS_ASKED).cloned().collect(),
                                urgent: false,
                            },
                        }),
                        _ => out.push(self.activation(o)),
                    }
                }
                // Writes whose replica messages were lost are sent again.
                for p in &self.pending {
                    if let Some(e) = self.log.entries().find(|e| e.version == p.version) {
                        for &o in p.waiting.iter().filter(|o| **o != self.osd) {
                            out.push(Action::Send {
                                to: o,
                                msg: Msg::Rep {
                                    epoch: self.epoch,
                                    entry: e.clone(),
                                },
                            });
                        }
                    }
                }
            }
            Role::Stray | Role::Replica => {}
        }
    }

    /// Sends the activation to every member that has not acknowledged it (again: they are
    /// idempotent, and may have been lost). An activation with writes this primary's run made
    /// (deletes of objects given up) leaves only once the run is durable here: a crash before
    /// that could give the run, and the versions, to other writes.
    fn send_activations(&mut self, out: &mut Vec<Action>) {
        let Role::Activating { acked, .. } = &self.role else {
            return;
        };
        if self.activation_makes_writes() && self.persisted < self.activation_persist {
            return;
        }
        let acked = acked.clone();
        let copies: Vec<OsdId> = self.acting.iter().chain(&self.targets).copied().collect();
        for o in copies.into_iter().filter(|o| !acked.contains(o)) {
            out.push(self.activation(o));
        }
    }

    /// Whether the history this primary activates with ends in writes of its own run: no
    /// history it heard has a write of this run (it is above theirs).
    fn activation_makes_writes(&self) -> bool {
        let head = self.log.head();
        head.epoch == self.epoch && head.run() == self.run
    }

    /// Whether the run of an activation taken in `(epoch, run)` may have made versions of
    /// this epoch. An active primary goes on writing in the epochs that follow its
    /// activation while its interval lasts, so a run ends only where the acting set is known
    /// to have changed or another activation happened: an interval recorded after its epoch
    /// (up to this one: a history read later ends nothing here), or its own interval
    /// recorded with another acting set than this epoch's. (Without the second, every new
    /// interval's run was one above the last, as the current interval is recorded only
    /// after it activates: a PG whose replicas flapped 32,768 times would have run out of
    /// runs.) Epoch 0 is none.
    fn run_may_write_now(&self, (epoch, _): (u32, u32)) -> bool {
        let recorded = |i: &Interval| {
            (i.epoch > epoch && i.epoch <= self.epoch)
                || (i.epoch == epoch && i.acting != self.acting)
        };
        epoch != 0 && epoch <= self.epoch && !self.history.iter().any(recorded)
    }

    /// The authoritative history as this primary holds it, for member `to`.
    fn activation(&mut self, to: OsdId) -> Action {
        let head = self.activation_heads.entry(to).or_default();
        *head = (*head).max(self.log.head());
        Action::Send {
            to,
            msg: Msg::Activate {
                epoch: self.epoch,
                round: self.member_round.get(&to).copied().unwrap_or(self.round),
                run: self.primary_run,
                log: self.log.clone(),
                objects: self
                    .objects
                    .iter()
                    .map(|(k, v)| (k.clone(), Some(*v)))
                    .collect(),
            },
        }
    }

    /// What member `from` lacks, by its acknowledgement of an activation whose log ended at
    /// `head`: the `missing` it lists, and more if it was sent a later activation since (the
    /// same round, writes having gone on meanwhile). Taking that one, it took the entries
    /// after `head` without their data, which this acknowledgement does not list; they count
    /// as lacking until the member says otherwise (`Lacks`, `Recovered`, or the later
    /// acknowledgement). Simulator seed 343 of two copies of three counted a backfill target
    /// full on the older acknowledgement while it lacked an object; an acting member so
    /// counted would count as a copy of data it does not hold.
    fn acknowledged_missing(
        &self,
        from: OsdId,
        head: Version,
        mut missing: BTreeSet<String>,
    ) -> BTreeSet<String> {
        let sent = self.activation_heads.get(&from).copied().unwrap_or(head);
        if sent <= head {
            return missing;
        }
        if self.log.tail() > head {
            // Trimmed past it: any object may have been written since.
            missing.extend(self.objects.keys().cloned());
            return missing;
        }
        for e in self.log.entries() {
            if e.version > head
                && e.version <= sent
                && e.kind == OpKind::Modify
                && self.objects.contains_key(&e.oid)
            {
                missing.insert(e.oid.clone());
            }
        }
        missing
    }

    /// Adds the read leases this member granted earlier intervals' primaries to those its
    /// members reported: the primary goes active once they ran out (`leases_until`).
    fn wait_out_leases(&mut self) {
        let now = self.now;
        for (grantee, left) in self.promises_left(self.osd) {
            self.lease_waits.push((grantee, now.saturating_add(left)));
        }
    }

    /// When this primary may go active: once the read leases its members (this one included)
    /// granted earlier intervals' primaries have run out — but for those granted to an OSD
    /// that answered this epoch's query. That one has taken this epoch's map, which ended its
    /// interval (`on_map` drops its role and its lease): it serves no more reads there, so
    /// its lease no longer fences anything. The planned handover of a PG whose old primary
    /// is still a member (a temporary set released, an OSD back in) then waits for no lease;
    /// a primary cut off or dead is waited out as before.
    fn leases_until(&self) -> u64 {
        self.lease_waits
            .iter()
            .filter(|(g, _)| g.is_none_or(|g| !self.answered.contains(&g)))
            .map(|(_, until)| *until)
            .fold(0, u64::max)
    }

    /// Once every member to probe (acting set, and one of each recorded interval) answered,
    /// and every object of the authoritative history is held by one of them: take that
    /// history, and activate the acting set.
    fn try_activate(&mut self, out: &mut Vec<Action>) {
        let Role::Peering { heard } = &self.role else {
            return;
        };
        // Found again below if it still holds (a history that came since may end the run).
        self.runs_used_up_by.clear();
        // A history from before this interval may lack an interval another primary recorded
        // meanwhile; activating on it would raise the members' last active epochs past
        // intervals it never heard from.
        if !self.acting.iter().all(|o| heard.contains_key(o))
            || self.history_read < self.interval_start
        {
            return;
        }
        let heard_les: BTreeMap<OsdId, u32> = heard
            .iter()
            .map(|(o, a)| (*o, a.0.last_epoch_started))
            .collect();
        let uncovered = uncovered_intervals(&self.history, &heard_les, &self.lost);
        self.uncovered = uncovered.len();
        // Those whose every member answered: no OSD can vouch for them any more.
        self.lost_intervals = uncovered
            .iter()
            .filter(|i| all_answered(i, &heard_les, &self.lost))
            .count();
        self.waiting_on = uncovered
            .iter()
            .flat_map(|i| {
                i.acting
                    .iter()
                    .filter(|o| !answered(**o, i, &heard_les, &self.lost))
                    .copied()
            })
            .collect();
        // The operator gives up only intervals whose every copy answered empty: one with a
        // member not heard from yet waits for it (that OSD may come back with the writes, or
        // hold a read lease as an old primary cut off).
        if self.uncovered > self.lost_intervals || (self.uncovered > 0 && !self.give_up_unfound) {
            return;
        }
        let infos: Vec<PeerInfo> = heard.values().map(|h| h.0).collect();
        let best = choose_authoritative(&infos, self.osd).expect("heard itself");
        let source = infos[best].osd;
        let (_, auth_log, auth_objects, _) = heard[&source].clone();
        // Every object must exist somewhere it can be recovered from: a member that went
        // active with a history and crashed before recovering an object names data it never
        // held. The members of older intervals may hold it; until one answers, the PG waits.
        let holds = |(_, _, objects, missing): &Answer, oid: &String, v: &Version| {
            objects.get(oid) == Some(v) && !missing.contains(oid)
        };
        let unfound: Vec<String> = auth_objects
            .iter()
            .filter(|(o, v)| !heard.values().any(|a| holds(a, o, v)))
            .map(|(o, _)| o.clone())
            .collect();
        self.unfound = unfound.len();
        if !unfound.is_empty() && !self.give_up_unfound {
            return;
        }
        // The run this primary goes active in: above every run that may have made versions
        // of this epoch. Its own earlier run may have (its writes may be in no log it heard),
        // and so may runs it does not know of if its disk is new: every acting member took
        // the activation of each of its runs, durably, before that run's first write
        // (`primary_run` in their answers). And above the runs of the heads of this epoch.
        // Persisted with the history, before the run's first write.
        let heads = heard.values().map(|a| a.0.head);
        let heard_run = heads
            .filter(|h| h.epoch == self.epoch)
            .map(|h| h.run())
            .max();
        let taken = (heard.values().map(|a| a.0.primary_run))
            .chain([self.primary_run])
            .filter(|r| self.run_may_write_now(*r))
            .map(|(_, run)| run)
            .max();
        let run = heard_run.max(taken).map_or(0, |r| r + 1);
        if run > RUN_MAX {
            for (o, a) in heard {
                let head = a.0.head;
                if (head.epoch == self.epoch && head.run() == RUN_MAX)
                    || (a.0.primary_run.1 == RUN_MAX && self.run_may_write_now(a.0.primary_run))
                {
                    self.runs_used_up_by.insert(*o);
                }
            }
            if self.primary_run.1 == RUN_MAX && self.run_may_write_now(self.primary_run) {
                self.runs_used_up_by.insert(self.osd);
            }
            // 65,536 activations of one primary in one interval: it waits rather than reuse
            // a run (checked before anything is reset: an operator's give-up stays for the
            // next try in this epoch).
            return;
        }
        self.uncovered = 0;
        self.lost_intervals = 0;
        self.waiting_on.clear();
        self.give_up_unfound = false;
        self.run = run;
        self.primary_run = (self.epoch, run);
        let mut auth_objects = auth_objects;
        for oid in &unfound {
            auth_objects.remove(oid);
        }
        self.wait_out_leases();
        // The primary takes the authoritative history whole; members get what differs.
        let kept = match plan_member(&auth_log, &self.log) {
            MemberPlan::UpToDate => self.log.head(),
            MemberPlan::Recover { merge, .. } => merge,
            MemberPlan::Backfill => Version::ZERO,
        };
        self.rewound_to(kept);
        self.log.reset_to(&auth_log);
        self.adopt_objects(auth_objects);
        // Given up by the operator: a delete each, in this epoch, so every member that takes
        // the history drops whatever older copy it kept, and a retried write is not
        // mistaken for one of the lost ones.
        for oid in unfound {
            // (A used-up sequence — 2^46 writes — refuses every write anyway.)
            let Some(version) = self.log.head().next_in(self.epoch, self.run) else {
                break;
            };
            let e = Entry {
                version,
                oid,
                kind: OpKind::Delete,
                reqid: None,
            };
            self.apply(&e);
        }
        self.unfound = 0;
        self.les = self.epoch;
        let source = (source != self.osd).then_some(source);
        self.activation_persist = self.persist(Persisting::History { source }, out);
        self.peer_missing.clear();
        self.overtaken.clear();
        self.acked_head.clear();
        self.activation_heads.clear();
        self.member_round = (self.acting.iter().chain(&self.targets))
            .map(|o| (*o, self.round))
            .collect();
        self.role = Role::Activating {
            acked: [self.osd].into(),
            recorded: false,
        };
        // Every member answered its query just now: silence counts from the activation.
        self.peering_since = self.now;
        self.on_tick(out);
    }

    /// Records the interval once every acting member, this one included, holds its history
    /// durably: then a member of a recorded interval that answers a later peering with an
    /// older last active epoch can only have lost its disk (`uncovered_intervals`).
    fn record_if_taken(&self, out: &mut Vec<Action>) {
        if let Role::Activating {
            acked,
            recorded: false,
        } = &self.role
        {
            if self.taken_by_all(acked) {
                out.push(Action::Record {
                    interval: Interval {
                        epoch: self.epoch,
                        acting: self.acting.clone(),
                    },
                    after: self.history.last().map(|i| i.epoch),
                });
            }
        }
    }

    /// Every acting member acknowledged the activation (`acked`), and this one's own copy of
    /// the history is durable too.
    fn taken_by_all(&self, acked: &BTreeSet<OsdId>) -> bool {
        self.acting.iter().all(|o| acked.contains(o)) && self.persisted >= self.activation_persist
    }

    fn maybe_active(&mut self) {
        if let Role::Activating { acked, recorded } = &self.role {
            if *recorded && self.taken_by_all(acked) && self.now >= self.leases_until() {
                self.role = Role::Active;
                self.active_since = self.now;
                // A lease before the first reads, without waiting for the next tick.
                self.last_ping = None;
            }
        }
    }

    fn on_msg(&mut self, from: OsdId, msg: Msg, out: &mut Vec<Action>) {
        if std::mem::take(&mut self.to_earlier_run) {
            if let Msg::Activate { epoch, .. } = msg {
                // Sent to this member's earlier run, restarted within the epoch: its rounds
                // and heads are that run's. Taken, it could roll back writes this run's disk
                // holds that the primary counted, and this run's acknowledgements would be
                // counted against what the earlier run said it lacked (simulator seed 104567
                // of three copies of four). A member not active yet says so, and is
                // activated in a round of its own; one activated since has a newer one.
                if self.role == Role::Stray
                    && epoch == self.epoch
                    && self.acting.first() == Some(&from)
                    && self.copy_of_interval(self.osd)
                {
                    out.push(Action::Send {
                        to: from,
                        msg: Msg::NotActive { epoch },
                    });
                }
                return;
            }
        }
        match msg {
            // A member of the acting set that restarted within the interval says so to what
            // its primary sends it: a write, a ping, or a question about what it lacks (a
            // primary that believes it lacks objects sends it no writes until it answers).
            Msg::Rep { epoch, .. } | Msg::Ping { epoch, .. } | Msg::Lacks { epoch, .. }
                if epoch == self.epoch
                    && self.role == Role::Stray
                    && self.acting.first() == Some(&from)
                    && self.copy_of_interval(self.osd) =>
            {
                out.push(Action::Send {
                    to: from,
                    msg: Msg::NotActive { epoch },
                });
            }
            Msg::Query { epoch } => {
                // Only once this member is in that epoch itself: a member still in an older
                // interval may go on acknowledging writes there (as a primary, or a replica),
                // and an answer given before would leave them out of the history the new
                // primary takes, which would then roll them back. The primary asks again on
                // its ticks until the map reaches this member.
                // And only with what its disk holds (see `durable_answer`).
                // And with how long the leases it granted other primaries still run.
                if epoch == self.epoch && self.acting.first() == Some(&from) {
                    // Its primary peers again (restarted within the interval, say): it owes
                    // pings only once active again.
                    self.pinged_at = None;
                }
                if epoch == self.epoch {
                    if let Some((info, log, objects, missing)) = self.durable_answer() {
                        let promises_left = self.promises_left(from).into_boxed_slice();
                        out.push(Action::Send {
                            to: from,
                            msg: Msg::Info {
                                epoch,
                                info,
                                log,
                                objects,
                                missing,
                                promises_left,
                            },
                        });
                    }
                }
            }
            Msg::Info {
                epoch,
                info,
                log,
                objects,
                missing,
                promises_left,
            } => {
                // A member speaks for itself only: an info naming another OSD (a bug, or a
                // message damaged past its checksum) would be filed under the sender and
                // chosen under the name it gives.
                if epoch == self.epoch && info.osd == from {
                    self.answered.insert(from);
                    if matches!(self.role, Role::Activating { .. }) {
                        // An old primary that answers only now stopped serving reads too.
                        self.maybe_active();
                    }
                    if let Role::Peering { heard } = &mut self.role {
                        // Waited in this member's clock from now, a little longer for rates
                        // (see `leases_until`).
                        for &(grantee, left) in promises_left.iter() {
                            let left = left.min(self.lease_bound);
                            let wait = left.saturating_mul(PROMISE_WAITED_TENTHS) / 10;
                            self.lease_waits
                                .push((grantee, self.now.saturating_add(wait)));
                        }
                        heard.insert(from, (info, log, objects, missing));
                        self.try_activate(out);
                    }
                }
            }
            Msg::Activate {
                epoch,
                round,
                run,
                log,
                objects,
            } => {
                // Only from the primary of this member's current epoch. A repeated or late one
                // of a round already taken must not undo the writes that followed it: it is
                // taken only if it is of a later round, or carries more of the same history.
                if epoch == self.epoch && self.acting.first() == Some(&from) {
                    let this = (epoch, self.incarnation_of(from), round);
                    let newer = this > self.activated
                        || (this == self.activated && log.head() > self.log.head());
                    if newer {
                        self.pinged_at = None;
                        // Writes this member took from the same run of its primary in this
                        // epoch, after the new activation's head: the primary made them after
                        // it built this activation, which they overtook on the way. They are
                        // in the primary's log, and acknowledged to it already; rolling them
                        // back would take back what the primary counts (simulator seed 20743
                        // of three copies of four).
                        let same_run = self.activated.0 == epoch
                            && self.activated.1 == this.1
                            && self.role == Role::Replica;
                        let holds_head =
                            log.head() == self.log.tail() || self.log.contains(log.head());
                        let after: Vec<Entry> = if same_run && holds_head {
                            self.log
                                .entries()
                                .filter(|e| e.version > log.head())
                                .cloned()
                                .collect()
                        } else {
                            Vec::new()
                        };
                        self.take_history(&log, objects);
                        for e in &after {
                            if e.version.follows(self.log.head()) {
                                self.apply(e);
                            }
                        }
                        // Only an acting member vouches for the interval: a backfill target
                        // may be dropped and miss acknowledged writes without the interval
                        // ending, and peering ranks copies by this epoch first.
                        if self.acting.contains(&self.osd) {
                            self.les = epoch;
                        }
                        self.activated = this;
                        // Durable with the history, before the primary's first write of `run`:
                        // the primary may lose its disk and learn its runs from its members.
                        self.primary_run = self.primary_run.max(run);
                        if self.osd != from {
                            self.role = Role::Replica;
                        }
                        let source = (self.osd != from).then_some(from);
                        let seq = self.persist(Persisting::History { source }, out);
                        self.activation_ack = Some((from, epoch, round, log.head(), seq));
                    } else if this == self.activated && self.activation_ack.is_none() {
                        // A repeat of what is durable already: acknowledge it again. Only as
                        // far as it is durable: a resend with the writes since may reach
                        // this member after their own copies, still being persisted
                        // (simulator seed 3897 of two copies of three acknowledged a head
                        // not on disk yet).
                        out.push(Action::Send {
                            to: from,
                            msg: Msg::ActivateAck {
                                epoch,
                                round,
                                head: log.head().min(self.durable_head),
                                missing: self.missing.keys().cloned().collect(),
                            },
                        });
                    }
                }
            }
            Msg::ActivateAck {
                epoch,
                round,
                head,
                missing,
            } => {
                // Only for this round's activation: an acknowledgement from before the
                // member restarted may list fewer missing objects than it lacks now.
                if epoch == self.epoch && self.member_round.get(&from) == Some(&round) {
                    let missing = self.acknowledged_missing(from, head, missing);
                    match &mut self.role {
                        Role::Activating { acked, .. } => {
                            acked.insert(from);
                            self.peer_missing.insert(from, Some(missing));
                            let h = self.acked_head.entry(from).or_default();
                            *h = (*h).max(head);
                            // The last acknowledgement records the interval at once.
                            self.record_if_taken(out);
                        }
                        Role::Active => {
                            // A member caught up: it has every write up to `head`, but the
                            // data only of the objects it does not lack.
                            self.peer_missing.insert(from, Some(missing));
                            let h = self.acked_head.entry(from).or_default();
                            *h = (*h).max(head);
                            self.count_acked(from);
                            self.ack_done(out);
                        }
                        _ => {}
                    }
                    self.maybe_active();
                }
            }
            Msg::Recovered {
                epoch,
                round,
                oid,
                version,
            } => {
                if epoch == self.epoch
                    && self.member_round.get(&from) == Some(&round)
                    && self.copy_of_interval(from)
                    && self.objects.get(&oid).copied() == version
                {
                    if let Some(Some(m)) = self.peer_missing.get_mut(&from) {
                        m.remove(&oid);
                    }
                    if !self.targets.iter().any(|t| self.lacks(*t, &oid)) {
                        self.overtaken.remove(&oid);
                    }
                    if self.role == Role::Active {
                        self.count_acked(from);
                        self.ack_done(out);
                    }
                }
            }
            Msg::Overtaken { epoch, round, oid } => {
                if epoch == self.epoch
                    && self.member_round.get(&from) == Some(&round)
                    && self.targets.contains(&from)
                    && matches!(self.peer_missing.get(&from), Some(Some(m)) if m.contains(&oid))
                {
                    self.overtaken.insert(oid);
                }
            }
            Msg::Lacks {
                epoch,
                oids,
                urgent,
            } => {
                if epoch == self.epoch
                    && self.role == Role::Replica
                    && self.acting.first() == Some(&from)
                {
                    for oid in oids {
                        if !self.missing.contains_key(&oid) {
                            out.push(Action::Send {
                                to: from,
                                msg: Msg::Recovered {
                                    epoch,
                                    round: self.activated.2,
                                    version: self.objects.get(&oid).copied(),
                                    oid,
                                },
                            });
                        } else if urgent {
                            out.push(Action::RecoverFirst { oid });
                        }
                    }
                }
            }
            Msg::Ping { epoch, stamp } => {
                // Granted only by a replica activated in this interval, to its primary, for a
                // ping of this interval (the primary may be an epoch behind or ahead of it
                // within the interval: ahead, this member cannot know the interval goes on).
                if epoch >= self.interval_start
                    && epoch <= self.epoch
                    && self.role == Role::Replica
                    && self.acting.first() == Some(&from)
                    && self.lease > 0
                {
                    let until = self.now.saturating_add(self.lease);
                    self.pinged_at = Some(self.now);
                    let e = self.promises.entry(Some(from)).or_default();
                    *e = (*e).max(until);
                    out.push(Action::Send {
                        to: from,
                        msg: Msg::Pong {
                            epoch,
                            stamp,
                            granted: self.lease,
                            full: self.store_full,
                        },
                    });
                }
            }
            Msg::Pong {
                epoch,
                stamp,
                granted,
                full,
            } => self.on_pong(from, epoch, stamp, granted, full),
            Msg::NotActive { epoch } => {
                // The history of this interval is the primary's: the member takes it whole,
                // in a new round, so that what it said before restarting no longer counts.
                if epoch == self.epoch && self.role == Role::Active && self.copy_of_interval(from) {
                    if self.targets.contains(&from) {
                        self.target_since.insert(from, self.now);
                    }
                    if self.peer_missing.get(&from) != Some(&None) {
                        self.round += 1;
                        self.member_round.insert(from, self.round);
                        self.peer_missing.insert(from, None);
                    }
                    out.push(self.activation(from));
                }
            }
            Msg::Rep { epoch, entry } => {
                // Fenced: a write of another interval's primary is never applied.
                if epoch == self.epoch
                    && self.role == Role::Replica
                    && self.acting.first() == Some(&from)
                {
                    // In order only: a gap (a lost message) waits for the primary to resend.
                    if entry.version.follows(self.log.head()) {
                        self.apply(&entry);
                        self.persist(Persisting::Entry(entry.version), out);
                    } else if self.durable_head >= entry.version {
                        // A resend of what is durable already (the ack was lost).
                        out.push(Action::Send {
                            to: from,
                            msg: Msg::RepAck {
                                epoch,
                                version: self.durable_head,
                            },
                        });
                    }
                }
            }
            Msg::RepAck { epoch, version } => {
                if epoch == self.epoch && self.role == Role::Active {
                    // Cumulative: the member has everything up to `version` durable.
                    let h = self.acked_head.entry(from).or_default();
                    *h = (*h).max(version);
                    self.count_acked(from);
                    self.ack_done(out);
                }
            }
        }
    }

    /// Makes this member's copy the authoritative one described by `log` and `objects`.
    fn take_history(&mut self, log: &PgLog, objects: Vec<(String, Option<Version>)>) {
        match plan_member(log, &self.log) {
            MemberPlan::UpToDate => {}
            MemberPlan::Recover { merge, entries, .. } => {
                self.rewound_to(merge);
                self.log.rewind_to(merge);
                for e in entries {
                    self.log
                        .append(e)
                        .expect("authoritative entries follow the merge point");
                }
            }
            MemberPlan::Backfill => {
                self.rewound_to(Version::ZERO);
                self.log.reset_to(log);
            }
        }
        // The objects as the authoritative copy has them (recovery and backfill in one step:
        // the host moves the data).
        let wanted: BTreeMap<String, Version> = objects
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect();
        self.adopt_objects(wanted);
    }

    /// The log is about to drop its entries after `kept`: they no longer count as durable,
    /// neither on disk nor in a persist in flight (whose head names them). The entries that
    /// take their versions' place are durable only once their own persist completes; a resent
    /// write answered with the old head would count a write this member does not hold.
    fn rewound_to(&mut self, kept: Version) {
        self.durable_head = self.durable_head.min(kept);
        for (_, head, _) in &mut self.persisting {
            *head = (*head).min(kept);
        }
    }

    fn apply(&mut self, e: &Entry) {
        self.log.append(e.clone()).expect("newer than the head");
        match e.kind {
            OpKind::Modify => {
                self.objects.insert(e.oid.clone(), e.version);
                // A write to an object this member lacks (its primary did not know) leaves
                // it lacking, at the new version.
                if let Some(v) = self.missing.get_mut(&e.oid) {
                    *v = e.version;
                }
            }
            OpKind::Delete => {
                self.objects.remove(&e.oid);
                self.missing.remove(&e.oid);
            }
        }
    }

    fn on_write(&mut self, req: ReqId, oid: String, kind: OpKind, out: &mut Vec<Action>) {
        if self.role != Role::Active {
            out.push(Action::Refuse { req });
            return;
        }
        // A retry of a write already made is answered, not applied again; one still in
        // flight is answered when it completes.
        // (Once every acting member holds its object: one that joined since may not yet.)
        // A retried write the operator gave up since (its object unfound, then deleted by a
        // delete the OSD made itself) is made again, below: answered from the log it would
        // be acknowledged with data that is gone.
        let given_up = |e: &Entry| {
            self.log
                .after(e.version)
                .any(|l| l.oid == e.oid && l.kind == OpKind::Delete && l.reqid.is_none())
        };
        if let Some(e) = self.log.find_request(req).filter(|e| !given_up(e)) {
            let (version, oid) = (e.version, e.oid.clone());
            if self.any_lacks(&oid) {
                out.push(Action::Refuse { req });
                out.extend(self.hasten(&oid));
            } else if !self.pending.iter().any(|p| p.version == version) {
                out.push(Action::Ack { req, version });
            }
            return;
        }
        // An object some acting member lacks is recovered there first (the host waits for
        // it before it hands the write over; one that did not is told to retry).
        if self.any_lacks(&oid) {
            out.push(Action::Refuse { req });
            out.extend(self.hasten(&oid));
            return;
        }
        // A used-up sequence (2^46 writes in the PG, years at a million a second) takes no
        // more writes.
        let Some(version) = self.log.head().next_in(self.epoch, self.run) else {
            out.push(Action::Refuse { req });
            return;
        };
        let entry = Entry {
            version,
            oid,
            kind,
            reqid: Some(req),
        };
        self.apply(&entry);
        self.persist(Persisting::Entry(entry.version), out);
        // Every acting member, this one included, and every backfill target (its log entry
        // only, if it lacks the object): done once durable everywhere.
        let waiting: BTreeSet<OsdId> = self.acting.iter().chain(&self.targets).copied().collect();
        for &o in waiting.iter().filter(|o| **o != self.osd) {
            out.push(Action::Send {
                to: o,
                msg: Msg::Rep {
                    epoch: self.epoch,
                    entry: entry.clone(),
                },
            });
        }
        self.pending.push(Pending {
            version: entry.version,
            req,
            waiting,
            lacking: BTreeSet::new(),
            since: self.now,
        });
        self.ack_done(out);
    }

    /// A member of this interval's copies: acting, or a backfill target.
    fn copy_of_interval(&self, o: OsdId) -> bool {
        self.acting.contains(&o) || self.targets.contains(&o)
    }

    /// The backfill targets of a new epoch. A primary that stays active activates the new
    /// ones and stops waiting for those that are no longer targets (gone down, or acting
    /// now: then the interval changed anyway); a target that is no longer one stops taking
    /// the primary's writes.
    fn on_targets(&mut self, targets: Vec<OsdId>, out: &mut Vec<Action>) {
        let targets: Vec<OsdId> = targets
            .into_iter()
            .filter(|o| !self.acting.contains(o))
            .collect();
        if targets == self.targets {
            return;
        }
        let old = std::mem::replace(&mut self.targets, targets);
        self.wait_for_targets = false;
        self.overtaken.clear();
        if self.role == Role::Replica && !self.copy_of_interval(self.osd) {
            self.role = Role::Stray;
        }
        if !matches!(self.role, Role::Active | Role::Activating { .. }) {
            return;
        }
        let dropped: Vec<OsdId> = old
            .iter()
            .copied()
            .filter(|o| !self.copy_of_interval(*o))
            .collect();
        for o in &dropped {
            self.target_since.remove(o);
            self.peer_missing.remove(o);
            self.acked_head.remove(o);
            self.member_round.remove(o);
            self.activation_heads.remove(o);
            for p in &mut self.pending {
                p.waiting.remove(o);
                p.lacking.remove(o);
            }
        }
        for o in self.targets.clone() {
            if !old.contains(&o) {
                self.target_since.insert(o, self.now);
                self.member_round.insert(o, self.round);
                self.peer_missing.insert(o, None);
                self.acked_head.remove(&o);
                out.push(self.activation(o));
            }
        }
        self.ack_done(out);
    }

    /// Acknowledges in version order: a write is done once it and every earlier one are on
    /// every acting member, with their data on `min_size` of them at least.
    fn ack_done(&mut self, out: &mut Vec<Action>) {
        let (acting, min_size) = (&self.acting, self.min_size);
        // Backfill targets count toward neither side: their data is not a copy yet.
        let holders =
            |p: &Pending| acting.len() - acting.iter().filter(|o| p.lacking.contains(o)).count();
        while self
            .pending
            .first()
            .is_some_and(|p| p.waiting.is_empty() && holders(p) >= min_size)
        {
            let p = self.pending.remove(0);
            out.push(Action::Ack {
                req: p.req,
                version: p.version,
            });
        }
    }
}
