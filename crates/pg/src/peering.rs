//! What peering decides, given what the members report: whose history is authoritative, what
//! each member must drop and fetch, and whether every interval that may hold acknowledged
//! writes has been heard from (decision 0009, points 4 and 5).

use crate::log::{Entry, PgLog};
use crate::version::Version;
use carmine_types::OsdId;
use std::collections::{BTreeMap, BTreeSet};

/// What a member tells the primary about its copy of the PG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    pub osd: OsdId,
    /// The epoch of the last interval in which this member went active with the PG: its log
    /// holds everything acknowledged up to then.
    pub last_epoch_started: u32,
    pub head: Version,
    pub tail: Version,
    /// The (epoch, primary's run) of the newest activation this member took (see
    /// `Member::primary_run`).
    pub primary_run: (u32, u32),
}

/// An interval that went active: the epoch it started in and its acting set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interval {
    pub epoch: u32,
    pub acting: Vec<OsdId>,
}

/// The member whose log is authoritative, as an index into `infos`: the newest last-active
/// epoch first (its log holds everything acknowledged before it went active), then the newest
/// head, then the longest log (the oldest tail), then the current primary, then the lowest id.
/// `None` if `infos` is empty.
pub fn choose_authoritative(infos: &[PeerInfo], primary: OsdId) -> Option<usize> {
    infos
        .iter()
        .enumerate()
        .max_by(|(_, a), (_, b)| {
            a.last_epoch_started
                .cmp(&b.last_epoch_started)
                .then(a.head.cmp(&b.head))
                .then(b.tail.cmp(&a.tail))
                .then((a.osd == primary).cmp(&(b.osd == primary)))
                .then(b.osd.cmp(&a.osd))
        })
        .map(|(i, _)| i)
}

/// The recorded intervals no member heard from can vouch for: while any is left, the PG may
/// not go active (it could miss writes that interval acknowledged); it waits for one of its
/// members. `heard` maps each member heard to its last active epoch; `lost` each OSD an
/// operator declared lost to the epoch it was declared in.
///
/// An interval is recorded only once every member of it took its history durably, so:
/// - a member of the interval vouches for it if its copy went active in it or later; one
///   that answers with an older last active epoch lost its disk and knows nothing of what
///   the interval wrote;
/// - an interval all of whose members answered (see [`answered`]) is also accounted for when
///   a member heard went active after it: that later history holds every write the interval
///   acknowledged, and with every member of it heard, none is left in the dark serving reads
///   on a lease.
///
/// (Vouching by a later last active epoch alone, without hearing the interval's members,
/// let a new primary go active while an unheard member's read lease still ran: simulator
/// seed 1549 of two copies of three served a stale read.)
pub fn uncovered_intervals<'a>(
    history: &'a [Interval],
    heard: &BTreeMap<OsdId, u32>,
    lost: &BTreeMap<OsdId, u32>,
) -> Vec<&'a Interval> {
    let newest = heard.values().copied().max().unwrap_or(0);
    history
        .iter()
        .filter(|i| {
            let vouched = i
                .acting
                .iter()
                .any(|o| heard.get(o).is_some_and(|les| *les >= i.epoch));
            // Every member answered (none lost in the dark), and a later history holds it.
            let superseded = all_answered(i, heard, lost) && newest > i.epoch;
            !(vouched || superseded)
        })
        .collect()
}

/// Whether member `osd` of `interval` has answered for it: it was heard, or an operator
/// declared it lost after the interval began (`osd lost`: its disk is gone for good, so its
/// copy of the interval is as empty as one that came back blank; an OSD must be down to be
/// declared lost, and so holds no read lease once its last one ran out). Declared lost
/// before the interval, it served that interval after coming back, and must answer itself.
pub fn answered(
    osd: OsdId,
    interval: &Interval,
    heard: &BTreeMap<OsdId, u32>,
    lost: &BTreeMap<OsdId, u32>,
) -> bool {
    heard.contains_key(&osd) || lost.get(&osd).is_some_and(|at| *at > interval.epoch)
}

/// Whether every member of `interval` answered for it.
pub fn all_answered(
    interval: &Interval,
    heard: &BTreeMap<OsdId, u32>,
    lost: &BTreeMap<OsdId, u32>,
) -> bool {
    interval
        .acting
        .iter()
        .all(|o| answered(*o, interval, heard, lost))
}

/// What a member must fetch for an object it lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Need {
    pub oid: String,
    /// The authoritative version of the object (its newest entry in the authoritative log),
    /// or `None` if the log does not say: then the object as the authoritative member holds it.
    pub version: Option<Version>,
}

/// What brings a member's copy to the authoritative history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberPlan {
    /// It has exactly the authoritative history.
    UpToDate,
    /// Rewind to `merge` (dropping `divergent` entries, which were never acknowledged), append
    /// the authoritative entries after `merge`, and fetch `missing` objects.
    Recover {
        merge: Version,
        divergent: Vec<Entry>,
        entries: Vec<Entry>,
        missing: Vec<Need>,
    },
    /// The logs do not overlap enough to tell what differs: copy the whole PG, then take the
    /// authoritative log.
    Backfill,
}

/// The plan that makes `member`'s copy match `auth`'s. A version names one write cluster-wide
/// (a primary's active epoch is unique to it), so two logs agree on every version they both
/// hold; the newest version in both is where they part ("merge point").
pub fn plan_member(auth: &PgLog, member: &PgLog) -> MemberPlan {
    if member.head() < auth.tail() {
        return MemberPlan::Backfill;
    }
    let mut merge = None;
    let mut divergent = Vec::new();
    for e in member.entries().rev() {
        if e.version > auth.head() {
            divergent.push(e.clone());
        } else if auth.contains(e.version) {
            merge = Some(e.version);
            break;
        } else if e.version <= auth.tail() {
            // Older than what the authoritative log remembers: cannot tell.
            return MemberPlan::Backfill;
        } else {
            divergent.push(e.clone());
        }
    }
    let merge = match merge {
        Some(m) => m,
        // Everything the member logged diverged (or it logged nothing): they part at the
        // member's tail, if that is in the authoritative history.
        None => {
            let t = member.tail();
            if t == auth.tail() || auth.contains(t) {
                t
            } else {
                return MemberPlan::Backfill;
            }
        }
    };
    divergent.reverse();
    let entries: Vec<Entry> = auth.after(merge).cloned().collect();
    if divergent.is_empty() && entries.is_empty() {
        return MemberPlan::UpToDate;
    }
    let mut oids: BTreeSet<&str> = BTreeSet::new();
    for e in entries.iter().chain(&divergent) {
        oids.insert(&e.oid);
    }
    let missing = oids
        .into_iter()
        .map(|oid| Need {
            oid: oid.to_owned(),
            version: auth
                .entries()
                .rev()
                .find(|e| e.oid == oid && e.version > merge)
                .map(|e| e.version),
        })
        .collect();
    MemberPlan::Recover {
        merge,
        divergent,
        entries,
        missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::OpKind;

    fn e(epoch: u32, v: u64, oid: &str) -> Entry {
        Entry {
            version: Version::new(epoch, v),
            oid: oid.into(),
            kind: OpKind::Modify,
            reqid: None,
        }
    }

    fn log(entries: &[Entry]) -> PgLog {
        let mut l = PgLog::new(100);
        for x in entries {
            l.append(x.clone()).unwrap();
        }
        l
    }

    fn info(osd: OsdId, les: u32, head: (u32, u64)) -> PeerInfo {
        PeerInfo {
            osd,
            last_epoch_started: les,
            head: Version::new(head.0, head.1),
            tail: Version::ZERO,
            primary_run: (0, 0),
        }
    }

    #[test]
    fn the_last_active_interval_wins_over_a_longer_older_history() {
        // osd.0 holds writes of epoch 1 never acknowledged; osd.1 went active in epoch 2.
        let infos = [info(0, 1, (1, 5)), info(1, 2, (1, 3)), info(2, 2, (1, 3))];
        assert_eq!(
            choose_authoritative(&infos, 2),
            Some(2),
            "ties go to the primary"
        );
        assert_eq!(
            choose_authoritative(&infos, 0),
            Some(1),
            "then to the lowest id"
        );
        let infos = [info(0, 2, (2, 4)), info(1, 2, (1, 3))];
        assert_eq!(
            choose_authoritative(&infos, 1),
            Some(0),
            "then the newest head"
        );
        assert_eq!(choose_authoritative(&[], 0), None);
    }

    #[test]
    fn a_member_behind_fetches_the_objects_of_the_entries_it_lacks() {
        let auth = log(&[e(1, 1, "a"), e(1, 2, "b"), e(1, 3, "a")]);
        let member = log(&[e(1, 1, "a")]);
        let MemberPlan::Recover {
            merge,
            divergent,
            entries,
            missing,
        } = plan_member(&auth, &member)
        else {
            panic!()
        };
        assert_eq!(merge, Version::new(1, 1));
        assert!(divergent.is_empty());
        assert_eq!(entries.len(), 2);
        let want: Vec<(String, Option<Version>)> =
            missing.into_iter().map(|n| (n.oid, n.version)).collect();
        assert_eq!(
            want,
            vec![
                ("a".into(), Some(Version::new(1, 3))),
                ("b".into(), Some(Version::new(1, 2)))
            ]
        );
        assert_eq!(plan_member(&auth, &auth.clone()), MemberPlan::UpToDate);
    }

    #[test]
    fn unacknowledged_entries_of_an_old_primary_are_rolled_back() {
        // Epoch 1 wrote 1..3 and reached the others up to 1; epoch 2 continued from there.
        let auth = log(&[e(1, 1, "a"), e(2, 2, "c")]);
        let old = log(&[e(1, 1, "a"), e(1, 2, "b"), e(1, 3, "a")]);
        let MemberPlan::Recover {
            merge,
            divergent,
            entries,
            missing,
        } = plan_member(&auth, &old)
        else {
            panic!()
        };
        assert_eq!(merge, Version::new(1, 1));
        assert_eq!(divergent.len(), 2);
        assert_eq!(entries, vec![e(2, 2, "c")]);
        let oids: Vec<&str> = missing.iter().map(|n| n.oid.as_str()).collect();
        assert_eq!(oids, vec!["a", "b", "c"]);
        // "a" and "b" have no authoritative entry after the merge point: as the auth holds them.
        assert_eq!(missing[0].version, None);
    }

    #[test]
    fn logs_that_do_not_overlap_mean_backfill() {
        let mut auth = PgLog::new(2);
        for v in 1..=5 {
            auth.append(e(1, v, "a")).unwrap();
        }
        let member = log(&[e(1, 1, "a"), e(1, 2, "a")]);
        assert_eq!(plan_member(&auth, &member), MemberPlan::Backfill);
        assert_eq!(plan_member(&auth, &PgLog::new(10)), MemberPlan::Backfill);
    }

    fn iv(epoch: u32, acting: &[OsdId]) -> Interval {
        Interval {
            epoch,
            acting: acting.to_vec(),
        }
    }

    #[test]
    fn an_interval_nobody_was_heard_from_blocks_activation() {
        let none = BTreeMap::new();
        let history = vec![iv(3, &[0, 1]), iv(5, &[2])];
        let heard: BTreeMap<OsdId, u32> = [(0, 3), (3, 0)].into();
        let left = uncovered_intervals(&history, &heard, &none);
        assert_eq!(left, vec![&history[1]]);
        assert!(uncovered_intervals(&history, &[(1, 3), (2, 5)].into(), &none).is_empty());
    }

    #[test]
    fn a_member_that_lost_its_disk_vouches_for_no_interval_it_was_in() {
        let none = BTreeMap::new();
        let history = vec![iv(3, &[0, 1]), iv(5, &[1, 2])];
        // osd.1 and osd.2 came back empty (last active epoch 0): they vouch for neither
        // interval, though they were in both.
        let heard: BTreeMap<OsdId, u32> = [(1, 0), (2, 0)].into();
        assert_eq!(uncovered_intervals(&history, &heard, &none).len(), 2);
        // osd.0 kept its copy of epoch 3: the second interval is still unaccounted for.
        let heard: BTreeMap<OsdId, u32> = [(0, 3), (1, 0), (2, 0)].into();
        assert_eq!(
            uncovered_intervals(&history, &heard, &none),
            vec![&history[1]]
        );
        // osd.3 went active in 7, after both: with every member of the first interval heard,
        // its later history accounts for it; the second waits for osd.1 or osd.2.
        let heard: BTreeMap<OsdId, u32> = [(0, 0), (1, 0), (3, 7)].into();
        assert_eq!(
            uncovered_intervals(&history, &heard, &none),
            vec![&history[1]]
        );
        let heard: BTreeMap<OsdId, u32> = [(0, 0), (1, 0), (2, 0), (3, 7)].into();
        assert!(uncovered_intervals(&history, &heard, &none).is_empty());
    }

    #[test]
    fn an_osd_declared_lost_answers_for_the_intervals_before_it_was_declared() {
        let history = vec![iv(3, &[0, 1]), iv(5, &[1, 2])];
        // osd.0 came back empty; osd.1 never came back: the first interval waits for it.
        let heard: BTreeMap<OsdId, u32> = [(0, 0), (2, 5)].into();
        let none = BTreeMap::new();
        assert_eq!(
            uncovered_intervals(&history, &heard, &none),
            vec![&history[0]]
        );
        assert!(!all_answered(&history[0], &heard, &none));
        // Declared lost in epoch 8: every member of the first interval has answered, and
        // osd.2 went active after it, so that later history holds its writes.
        let lost: BTreeMap<OsdId, u32> = [(1, 8)].into();
        assert!(all_answered(&history[0], &heard, &lost));
        assert!(uncovered_intervals(&history, &heard, &lost).is_empty());
        // Without a later history, the interval stays unaccounted for, though answered: a
        // loss for the operator to give up, never silently passed.
        let heard: BTreeMap<OsdId, u32> = [(0, 0), (2, 0)].into();
        let left = uncovered_intervals(&history, &heard, &lost);
        assert_eq!(left, vec![&history[0], &history[1]]);
        assert!(all_answered(&history[0], &heard, &lost));
        assert!(all_answered(&history[1], &heard, &lost));
        // Declared lost before an interval it served after coming back: it must answer for
        // that one itself.
        let early: BTreeMap<OsdId, u32> = [(1, 4)].into();
        assert!(all_answered(&history[0], &heard, &early));
        assert!(!all_answered(&history[1], &[(2, 0)].into(), &early));
    }
}
