//! What members of a PG send each other, what happens to a member, and what it asks its
//! host to do.

use crate::log::{Entry, OpKind, PgLog, ReqId};
use crate::peering::{Interval, PeerInfo};
use crate::version::Version;
use carmine_types::OsdId;
use std::collections::{BTreeMap, BTreeSet};

/// What members of a PG send each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// The primary of `epoch` asks for a member's history.
    Query {
        epoch: u32,
    },
    /// A member's answer: its info, log and object versions, and which of those objects its
    /// store does not hold yet (it took a history and is still recovering them).
    Info {
        epoch: u32,
        info: PeerInfo,
        log: PgLog,
        objects: BTreeMap<String, Version>,
        missing: BTreeSet<String>,
        /// How long, in the member's clock, the read leases it granted other primaries may
        /// still run, by primary (`None`: granted by an earlier run of this member, to whom
        /// it does not know): the new primary goes active only after those run out, but for
        /// the leases of primaries it heard from in its own epoch, which have stopped serving
        /// (see [`Msg::Ping`]).
        promises_left: Box<[(Option<OsdId>, u64)]>,
    },
    /// The authoritative history for the member: its log becomes `log`, and the objects
    /// listed take the given versions (`None`: removed). `round` counts the primary's peering
    /// rounds within the epoch (it peers again if the history changed under it); an active
    /// primary also sends one to catch up a member that restarted within the interval.
    Activate {
        epoch: u32,
        round: u32,
        /// The primary's run (see [`Version`]) and the epoch it went active in, which the
        /// member records with the history (the activation's epoch, not this message's: an
        /// active primary activates a member again in later epochs of its interval).
        run: (u32, u32),
        log: PgLog,
        objects: Vec<(String, Option<Version>)>,
    },
    /// The member took the activation of `round` and has the history up to `head` durable;
    /// its store still lacks the objects `missing` (it recovers them in the background).
    ActivateAck {
        epoch: u32,
        round: u32,
        head: Version,
        missing: BTreeSet<String>,
    },
    /// A write to apply (replica operation).
    Rep {
        epoch: u32,
        entry: Entry,
    },
    RepAck {
        epoch: u32,
        version: Version,
    },
    /// A member of the acting set that has not been activated in this epoch (it restarted
    /// within the interval, faster than the map noticed): the primary peers again.
    NotActive {
        epoch: u32,
    },
    /// The member's store now holds `oid` at `version` (`None`: holds no such object), with
    /// its data, in the history of activation `round`. The primary clears the object from
    /// what the member lacks only if that is its own version: a report that was overtaken by
    /// a newer write the member took as a log entry only must not count that write as held
    /// (simulator seed 89223 of three copies of four).
    Recovered {
        epoch: u32,
        round: u32,
        oid: String,
        version: Option<Version>,
    },
    /// A backfill target's copy of `oid`, fetched for the history of activation `round`, was
    /// already older than the version it needs when it came: a write it took as a log entry
    /// only overtook it. The primary makes writes to `oid` wait for the target to hold it
    /// (see [`Member::lacking`](crate::Member::lacking)), or it may never catch up.
    Overtaken {
        epoch: u32,
        round: u32,
        oid: String,
    },
    /// The active primary asks for a read lease (sent every quarter lease). `stamp` is the
    /// primary's clock when sent, echoed back in [`Msg::Pong`].
    Ping {
        epoch: u32,
        stamp: u64,
    },
    /// A replica of the primary's interval grants the lease: it promises not to help a newer
    /// interval go active before `granted` has passed, in its own clock, since it received the
    /// ping. The primary serves reads until the earliest of its members' last answered stamps
    /// plus most of the shorter of `granted` and its own lease.
    Pong {
        epoch: u32,
        stamp: u64,
        /// The lease promised, in the replica's clock.
        granted: u64,
        /// The replica's store is full: the primary refuses writes that may grow the PG
        /// (the replica would have to refuse one that has a version, which stops its copy).
        full: bool,
    },
    /// The primary believes the member lacks these objects: the member answers `Recovered`
    /// for those it holds, and with `urgent` (a client waits) recovers the others first.
    Lacks {
        epoch: u32,
        oids: Vec<String>,
        urgent: bool,
    },
}

/// What happens to a member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A new map epoch: the PG's acting set in it (primary first; empty: no OSD serves it),
    /// the pool's `min_size`, and the intervals recorded in its history if the host read them
    /// from the map store in this epoch (`None`: the member keeps the history it knew, and a
    /// primary of a new interval waits for [`Event::History`] before it activates). `lost`:
    /// the OSDs an operator declared lost, each with the epoch it was declared in (their
    /// copies of earlier intervals are given up as gone: `peering::answered`).
    ///
    /// `targets`: the PG's backfill targets (decision 0015), copies being filled while a
    /// temporary acting set serves it: the primary activates them and sends them every write,
    /// waits for their log entries but never for their data, and does not count them toward
    /// `min_size`; they recover what they lack in the background.
    Map {
        epoch: u32,
        acting: Vec<OsdId>,
        targets: Vec<OsdId>,
        history: Option<Vec<Interval>>,
        min_size: usize,
        lost: BTreeMap<OsdId, u32>,
    },
    Msg {
        from: OsdId,
        msg: Msg,
    },
    /// The map store recorded this member's interval (it may go active).
    Recorded {
        epoch: u32,
    },
    /// The history changed since this member read it (another primary recorded an interval):
    /// peer again against `history`.
    RecordFailed {
        epoch: u32,
        history: Vec<Interval>,
    },
    /// The PG's recorded history as the map store has it now, read in `epoch`: a primary
    /// still gathering infos probes by it from then on, and activates only on a history read
    /// in its interval. (Activation raises its members' last active epoch before the record's
    /// compare-and-swap could catch a stale history, and a raised epoch vouches for the
    /// intervals before it: `uncovered_intervals`.)
    History {
        epoch: u32,
        history: Vec<Interval>,
    },
    /// A client write to the PG (on the primary).
    Write {
        req: ReqId,
        oid: String,
        kind: OpKind,
    },
    /// Time passes: peering messages are sent again (the network may have lost them), and
    /// what [`Event::Clock`] does.
    Tick,
    /// Time passes, lightly: an active primary pings its members if a ping is due, and an
    /// activating one goes active once the read leases granted to earlier intervals ran out.
    Clock,
    /// The host made the member's state as of [`Action::Persist`] `seq` durable.
    Persisted {
        seq: u64,
    },
    /// The host's store now holds `oid` at `version`, durably (it copied the object from a
    /// member that had it): the object is no longer missing here if that is the version the
    /// member's history names.
    Recovered {
        oid: String,
        version: Version,
    },
    /// The host fetched `oid` at `version` and did not store it: the member no longer lacks
    /// that version (a later write overtook the copy, or the history changed).
    NotStored {
        oid: String,
        version: Version,
    },
    /// The operator gives up the objects no reachable member holds (`carmine pg
    /// mark-unfound-lost`): a primary that waits only for them deletes them from the
    /// authoritative history, in its own epoch, and goes active without them.
    GiveUpUnfound,
}

// Most actions are sends (a replicated write is one per replica): boxing the message would
// add an allocation to each, to shrink the rare others.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Send {
        to: OsdId,
        msg: Msg,
    },
    /// Append `interval` to the PG's history if its last interval is still the one of epoch
    /// `after` (a compare-and-swap in the map store; `None`: the history was empty); the host
    /// answers with [`Event::Recorded`] or [`Event::RecordFailed`].
    Record {
        interval: Interval,
        after: Option<u32>,
    },
    /// The write of `req` is acknowledged at `version`.
    Ack {
        req: ReqId,
        version: Version,
    },
    /// The write of `req` is refused: this member is not the active primary (retry after the
    /// next map).
    Refuse {
        req: ReqId,
    },
    /// Recover `oid` (one of [`Member::missing`]) before the others: a client waits for it.
    RecoverFirst {
        oid: String,
    },
    /// Make the member's copy as it is now durable (its log and the objects it changed since
    /// the last persist, in one transaction); answer with [`Event::Persisted`].
    Persist {
        seq: u64,
        what: Persisting,
    },
}

/// What a persist makes durable, for a host that stores more than versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persisting {
    /// One write: the log's newest entry (its data came with the request or the replica
    /// message).
    Entry(Version),
    /// A whole history taken at activation: the log, `objects` and `missing` as they are
    /// now. The missing objects are recovered afterwards, in the background, and reported
    /// with [`Event::Recovered`]; `source` is the member whose history won (`None`: this
    /// member), the first to ask for them.
    History { source: Option<OsdId> },
}
