//! The missing set (decision 0009, background recovery): which objects a member's store
//! lacks, what a primary knows of its members' lacks, and what waits for them: a write is
//! counted on a member only once it holds the write's object, a write to an object some
//! acting member lacks waits, and the PG is clean only once nobody lacks anything.

use super::{Action, Member, Msg, Role};
use crate::version::Version;
use carmine_types::OsdId;
use std::collections::{BTreeMap, BTreeSet};

/// A member lacking this many of a PG's objects (or half of them) is filled as a backfill
/// target rather than recovered as an acting member (see [`Member::wants_temp`]): Ceph's
/// `osd_async_recovery_min_cost` is of the same order.
pub const BACKFILL_LACKS: usize = 100;

impl Member {
    /// True if `member`'s store may lack `oid` (as this primary knows).
    pub(super) fn lacks(&self, member: OsdId, oid: &str) -> bool {
        if member == self.osd {
            return self.missing.contains_key(oid);
        }
        match self.peer_missing.get(&member) {
            Some(Some(m)) => m.contains(oid),
            // Not told: it may lack anything.
            _ => true,
        }
    }

    /// Counts the writes `member` has durable (up to the head it acknowledged): with their
    /// object's data, or as a log entry whose object it lacks and recovers (see
    /// `Pending::lacking`).
    pub(super) fn count_acked(&mut self, member: OsdId) {
        let head = self
            .acked_head
            .get(&member)
            .copied()
            .unwrap_or(Version::ZERO);
        // Field by field, so that nothing is allocated per acknowledgement.
        let (pending, log) = (&mut self.pending, &self.log);
        let (own, peer) = if member == self.osd {
            (Some(&self.missing).filter(|m| !m.is_empty()), None)
        } else {
            match self.peer_missing.get(&member) {
                Some(Some(m)) => (None, Some(m).filter(|m| !m.is_empty())),
                // Not told: it may lack anything.
                _ => return,
            }
        };
        let lacks = |oid: &str| {
            own.is_some_and(|m| m.contains_key(oid)) || peer.is_some_and(|m| m.contains(oid))
        };
        let some_lacking = own.is_some() || peer.is_some();
        for p in pending.iter_mut().filter(|p| p.version <= head) {
            let lacks = some_lacking
                && log
                    .entries()
                    .rev()
                    .find(|e| e.version == p.version)
                    // (Writes in flight are the log's newest entries.)
                    .is_none_or(|e| lacks(&e.oid));
            if !lacks {
                p.waiting.remove(&member);
                p.lacking.remove(&member);
            } else if p.waiting.remove(&member) {
                p.lacking.insert(member);
            }
        }
    }

    /// True if some acting member (this one included) lacks `oid`, or a backfill target
    /// while writes wait for the targets; see [`Member::lacking`].
    pub fn any_lacks(&self, oid: &str) -> bool {
        self.role == Role::Active
            && (self.acting.iter().any(|m| self.lacks(*m, oid))
                || self.targets.iter().any(|t| self.straggles(*t, oid)))
    }

    /// The acting members (this one included) whose store lacks `oid`: a write to it must
    /// wait until they recovered it (its ops may change part of the object only), and so must
    /// a read at this primary if it is among them. While writes wait for the targets (see
    /// [`Member::wait_for_targets`]), the backfill targets said to lack it, too.
    pub fn lacking(&self, oid: &str) -> Vec<OsdId> {
        if self.role != Role::Active {
            return Vec::new();
        }
        let acting = self.acting.iter().filter(|m| self.lacks(**m, oid));
        let targets = self.targets.iter().filter(|t| self.straggles(**t, oid));
        acting.chain(targets).copied().collect()
    }

    /// A backfill target said to lack `oid`, while writes wait for the targets, or for
    /// that object (a target's copy of it was overtaken).
    fn straggles(&self, target: OsdId, oid: &str) -> bool {
        (self.wait_for_targets || self.overtaken.contains(oid))
            && matches!(self.peer_missing.get(&target), Some(Some(m)) if m.contains(oid))
    }

    /// Makes writes to the objects the backfill targets still lack wait until they recovered
    /// them, as for an acting member (until the targets change). The host turns it on for
    /// the last few objects of a fill that stopped making progress: an object written faster
    /// than a target can copy it is never caught up with in the background (each copy is
    /// overtaken by the next write, which the target takes as a log entry only), and its PG
    /// would stay on its temporary acting set for good.
    pub fn wait_for_targets(&mut self) {
        self.wait_for_targets = true;
    }

    /// Whether writes wait for the backfill targets' lacking objects.
    pub fn waits_for_targets(&self) -> bool {
        self.wait_for_targets
    }

    /// Asks the members that lack `oid` to recover it first (a client waits for it).
    pub fn hasten(&mut self, oid: &str) -> Vec<Action> {
        let mut out = Vec::new();
        for m in self.lacking(oid) {
            if m == self.osd {
                out.push(Action::RecoverFirst { oid: oid.into() });
            } else {
                out.push(Action::Send {
                    to: m,
                    msg: Msg::Lacks {
                        epoch: self.epoch,
                        oids: vec![oid.into()],
                        urgent: true,
                    },
                });
            }
        }
        out
    }

    /// As a primary gathering infos: objects of the authoritative history that no member it
    /// heard holds (it waits for a member that does).
    pub fn unfound(&self) -> usize {
        match self.role {
            Role::Peering { .. } => self.unfound,
            _ => 0,
        }
    }

    /// As a peering primary that heard its whole acting set: the recorded intervals no member
    /// can vouch for though every member of each answered — their copies came back empty
    /// (lost disks), so only the operator's give-up lets the PG go on without their writes.
    /// (An interval with a member not heard from yet waits for it, give-up or not.)
    pub fn lost_intervals(&self) -> usize {
        match self.role {
            Role::Peering { .. } => self.lost_intervals,
            _ => 0,
        }
    }

    /// As a peering primary that heard its whole acting set: the members of recorded
    /// intervals no one vouches for that have not answered (Ceph's PG state "down"). The PG
    /// waits for one of them to come back; if an OSD's disk is gone for good, the operator
    /// declares it lost (`osd lost`), and the interval counts as answered.
    pub fn waiting_on(&self) -> &BTreeSet<OsdId> {
        static NONE: BTreeSet<OsdId> = BTreeSet::new();
        match self.role {
            Role::Peering { .. } => &self.waiting_on,
            _ => &NONE,
        }
    }

    /// As a peering primary that heard its whole acting set: the members (itself perhaps)
    /// that report the last run, 65,535 ([`RUN_MAX`]), as one that may still make versions
    /// of this epoch — a head of this epoch in that run, or a record of that run's activation
    /// that may still write — so that the next activation would have no run left. Empty
    /// otherwise. The PG waits: for a head, until the epoch changes; for a record of epoch
    /// `e`, until an interval after `e` is recorded or the one recorded at `e` had another
    /// acting set than the PG has now — for good if a faulty member reports a run no
    /// activation took, as long as its answer is heard (stopping that OSD lets the PG peer
    /// without it, if its other copies vouch for every recorded interval). A correct cluster
    /// gets here only after 65,535 activations in one interval.
    ///
    /// [`RUN_MAX`]: crate::version::RUN_MAX
    pub fn runs_used_up_by(&self) -> &BTreeSet<OsdId> {
        static NONE: BTreeSet<OsdId> = BTreeSet::new();
        match self.role {
            Role::Peering { .. } => &self.runs_used_up_by,
            _ => &NONE,
        }
    }

    /// The PG's backfill targets as this member knows them (see [`Event::Map`]).
    ///
    /// [`Event::Map`]: super::Event::Map
    pub fn targets(&self) -> &[OsdId] {
        &self.targets
    }

    /// As the active primary: every backfill target took this interval's history and holds
    /// every object (as it last said), so the PG may move to its up set, where each of them
    /// is a complete copy (decision 0015, step 4). False without targets.
    ///
    /// A target must also have acknowledged the head of the newest activation sent to it: it
    /// answers `Lacks` with `Recovered` for an object it does not know it lacks, so an
    /// activation lost on the way would otherwise leave the objects written before it looking
    /// held (`acknowledged_missing`).
    pub fn targets_filled(&self) -> bool {
        self.role == Role::Active
            && !self.targets.is_empty()
            && self.targets.iter().all(|m| {
                matches!(self.peer_missing.get(m), Some(Some(s)) if s.is_empty())
                    && self.acked_head.get(m) >= self.activation_heads.get(m)
            })
    }

    /// As the active primary: the temporary acting set this PG should be served by while
    /// acting members that lack most of it are filled as backfill targets (decision 0015,
    /// step 2 for a copy back empty on its own placement), or `None`. A member lacking at
    /// least `min_lacks` objects and half the PG's, or `BACKFILL_LACKS`, came back empty or
    /// was gone long: acting, it would hold nearly every write to wait for its object's copy;
    /// as a target it takes writes and fills in the background while the others serve. The
    /// set is the other acting members, in order, if they are at least `min_size`. Asked only
    /// once every member said what it lacks.
    pub fn wants_temp(&self, min_lacks: usize) -> Option<Vec<OsdId>> {
        if !self.is_active_primary() {
            return None;
        }
        let objects = self.objects.len();
        let mut keep = Vec::with_capacity(self.acting.len());
        for &m in &self.acting {
            let lacks = if m == self.osd {
                self.missing.len()
            } else {
                match self.peer_missing.get(&m) {
                    Some(Some(s)) => s.len(),
                    _ => return None,
                }
            };
            if lacks < min_lacks.max(1) || (lacks * 2 < objects && lacks < BACKFILL_LACKS) {
                keep.push(m);
            }
        }
        (keep.len() < self.acting.len() && keep.len() >= self.min_size).then_some(keep)
    }

    /// Objects the backfill targets still lack in all, as this primary knows (a target not
    /// told counts as lacking every object): Ceph's "misplaced".
    pub fn misplaced(&self) -> usize {
        self.targets
            .iter()
            .map(|m| match self.peer_missing.get(m) {
                Some(Some(s)) => s.len(),
                _ => self.objects.len(),
            })
            .sum()
    }

    /// Active, and every acting member holds every object: nothing is degraded, and the PG's
    /// recorded history may shrink to this interval.
    pub fn is_clean(&self) -> bool {
        self.role == Role::Active
            && self.missing.is_empty()
            && self
                .acting
                .iter()
                .filter(|m| **m != self.osd)
                .all(|m| matches!(self.peer_missing.get(m), Some(Some(s)) if s.is_empty()))
    }

    /// Objects the acting members lack in all, as this primary knows (members not told count
    /// as lacking every object).
    pub fn degraded(&self) -> usize {
        let mut n = self.missing.len();
        for m in self.acting.iter().filter(|m| **m != self.osd) {
            n += match self.peer_missing.get(m) {
                Some(Some(s)) => s.len(),
                _ => self.objects.len(),
            };
        }
        n
    }

    /// What the host may recover now: the missing objects, once the history that named them
    /// is durable (a recovery must not land before the history it completes).
    pub fn recoverable(&self) -> Option<&BTreeMap<String, Version>> {
        // (Asked after every event a PG handles: the common answer, nothing missing, first.)
        if self.missing.is_empty() {
            return None;
        }
        let taking = self.persisting.iter().any(|(_, _, history)| *history);
        (!taking).then_some(&self.missing)
    }

    pub(super) fn on_recovered(&mut self, oid: String, version: Version, out: &mut Vec<Action>) {
        if self.missing.get(&oid) != Some(&version) {
            return;
        }
        self.missing.remove(&oid);
        match self.role {
            Role::Replica => {
                if let Some(&primary) = self.acting.first() {
                    out.push(Action::Send {
                        to: primary,
                        msg: Msg::Recovered {
                            epoch: self.epoch,
                            round: self.activated.2,
                            oid,
                            version: Some(version),
                        },
                    });
                }
            }
            Role::Active => {
                let me = self.osd;
                self.count_acked(me);
                self.ack_done(out);
            }
            _ => {}
        }
    }

    /// The host fetched `oid` at `version` and did not store it. A backfill target that now
    /// needs a later version took a write to it as a log entry while it copied it: it tells
    /// its primary, which makes the next writes to the object wait for it. Otherwise an object
    /// written faster than a copy lands is never caught up with (the host's stall watch,
    /// `wait_for_targets`, would end it only after ten seconds with nothing else left).
    pub(super) fn on_not_stored(&mut self, oid: String, version: Version, out: &mut Vec<Action>) {
        let target = self.role == Role::Replica && !self.acting.contains(&self.osd);
        let overtaken = self.missing.get(&oid).is_some_and(|need| *need > version);
        if let (true, true, Some(&primary)) = (target, overtaken, self.acting.first()) {
            out.push(Action::Send {
                to: primary,
                msg: Msg::Overtaken {
                    epoch: self.epoch,
                    round: self.activated.2,
                    oid,
                },
            });
        }
    }

    /// Takes `wanted` as the objects' versions; those this member's store does not hold at
    /// that version become missing.
    pub(super) fn adopt_objects(&mut self, wanted: BTreeMap<String, Version>) {
        let held = |o: &String| {
            self.objects
                .get(o)
                .filter(|_| !self.missing.contains_key(o))
                .copied()
        };
        let missing: BTreeMap<String, Version> = wanted
            .iter()
            .filter(|(o, v)| held(o) != Some(**v))
            .map(|(o, v)| (o.clone(), *v))
            .collect();
        self.missing = missing;
        self.objects = wanted;
    }
}
