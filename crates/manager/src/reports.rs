//! Judging failure reports (decision 0014): which OSD to mark down when OSDs that are all
//! registered say they cannot hear from one another. Pure, like the rest of the policy.
//!
//! Each report names a *broken link* between its reporter and a target, both up. One is
//! enough to stall every PG that needs both ends: its writes wait for the silent member, its
//! reads for a read lease the member no longer grants. The managers cannot tell which end is
//! at fault, only count: the OSD on most broken links goes down (an OSD that hangs, or whose
//! network is cut, is on a link with every peer that shares a PG with it; a single cut link
//! between two healthy OSDs is one link, and either end will do), then one marked down on
//! reports lately (so that a link cut for good takes the same end down each time), then the
//! one most reported, then the higher id. One OSD per epoch: its PGs peer without it, the reports about it stop
//! counting (it is down), and what remains is judged again at the next tick.
//!
//! A marked-down OSD is held down for [`crate::policy::Policy::report_hold`] even though it
//! is registered, then marked up once its report says it took the map that holds it (an OSD
//! that hangs keeps its registration but cannot say so: it stays down, and is marked out
//! after the down grace like a dead one); if it is reported again soon after (within
//! [`FLAP_WINDOW`] of the end of its last hold), the hold doubles, up to [`HOLD_MAX`] —
//! Ceph's flap damping, which keeps a link that breaks again and again from making an epoch
//! per second. Never more than half the OSDs that are in are down by reports' doing: a
//! manager that would go further is more likely hearing from the broken side.

use crate::policy::Policy;
use carmine_cluster::OsdMap;
use carmine_mapstore::failure_reports::FailureReport;
use carmine_mapstore::membership::Registration;
use std::collections::{BTreeMap, BTreeSet};

/// A mark down on reports within this long after the end of the previous hold counts as
/// one more in a row.
pub const FLAP_WINDOW_SECS: u64 = 600;
pub const FLAP_WINDOW: std::time::Duration = std::time::Duration::from_secs(FLAP_WINDOW_SECS);
/// The longest hold, however often an OSD was reported.
pub const HOLD_MAX: std::time::Duration = std::time::Duration::from_secs(3600);

/// Marks down in `next` the OSD the reports single out, if any, and says why.
pub(crate) fn mark_down_reported(
    map: &OsdMap,
    next: &mut OsdMap,
    alive: &BTreeMap<u32, Registration>,
    reports: &BTreeMap<u32, FailureReport>,
    now: u64,
    policy: &Policy,
) -> Option<String> {
    // Up before this epoch and still: one marked up in it has not had its PGs peer with it
    // yet, so reports about it are older than its return.
    let up = |id: u32| {
        map.osd(id).is_some_and(|o| o.up)
            && next.osd(id).is_some_and(|o| o.up)
            && alive.contains_key(&id)
    };
    // Broken links between two OSDs up and registered, and who reported whom.
    let mut links: BTreeSet<(u32, u32)> = BTreeSet::new();
    let mut reporters: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    // A silence reported before its target's current run started is about an earlier run
    // (one restarted within its lease, never seen down): not a broken link.
    let of_current_run =
        |r: &FailureReport, t: u32| alive.get(&t).is_some_and(|reg| r.about_run_of(reg, now));
    for r in reports.values() {
        for &t in r.silent_ms.keys() {
            if t != r.reporter && up(r.reporter) && up(t) && of_current_run(r, t) {
                links.insert((r.reporter.min(t), r.reporter.max(t)));
                reporters.entry(t).or_default().insert(r.reporter);
            }
        }
    }
    if links.is_empty() {
        return None;
    }
    let mut degree: BTreeMap<u32, usize> = BTreeMap::new();
    for &(a, b) in &links {
        *degree.entry(a).or_default() += 1;
        *degree.entry(b).or_default() += 1;
    }
    let reported = |id: u32| reporters.get(&id).map_or(0, |r| r.len());
    // Marked down on reports lately: of a link cut for good, the same end each time (its
    // holds grow), not the one whose report happened to come first.
    let lately = |id: u32| {
        next.osd(id).is_some_and(|o| {
            o.held_down_until > 0 && now < o.held_down_until.saturating_add(FLAP_WINDOW_SECS)
        })
    };
    let victim = *degree
        .iter()
        .max_by_key(|(id, d)| (**d, lately(**id), reported(**id), **id))
        .expect("a link has two ends")
        .0;
    let in_ = next.osds.iter().filter(|o| o.in_).count();
    let up_after = next
        .osds
        .iter()
        .filter(|o| o.up && o.in_ && o.id != victim)
        .count();
    if up_after * 2 < in_ {
        tracing::warn!(
            osd = victim,
            "peers report osd.{victim} unreachable, but marking it down would leave {up_after} \
             of {in_} OSDs up: left up"
        );
        return None;
    }
    let o = next
        .osds
        .iter_mut()
        .find(|o| o.id == victim)
        .expect("the victim is in the map");
    let in_a_row =
        o.held_down_until > 0 && now < o.held_down_until.saturating_add(FLAP_WINDOW_SECS);
    o.report_markdowns = if in_a_row {
        o.report_markdowns.saturating_add(1)
    } else {
        1
    };
    let hold = policy
        .report_hold
        .saturating_mul(1 << (o.report_markdowns - 1).min(16))
        .min(HOLD_MAX);
    o.up = false;
    o.down_since = now;
    // Past every earlier hold, whatever this manager's clock says against its predecessor's:
    // an OSD's `held_seen` (at most an earlier hold) must not already cover the new one.
    o.held_down_until = now
        .saturating_add(hold.as_secs().max(1))
        .max(o.held_down_until.saturating_add(1));
    let by: Vec<String> = reporters
        .get(&victim)
        .into_iter()
        .flatten()
        .map(|r| format!("osd.{r}"))
        .collect();
    let cannot_hear: Vec<String> = links
        .iter()
        .filter_map(|&(a, b)| match (a == victim, b == victim) {
            (true, _) => Some(b),
            (_, true) => Some(a),
            _ => None,
        })
        .filter(|p| !reporters.get(&victim).is_some_and(|r| r.contains(p)))
        .map(|p| format!("osd.{p}"))
        .collect();
    let mut why = format!("osd.{victim} down on failure reports");
    if !by.is_empty() {
        why.push_str(&format!(" (unreachable from {})", by.join(", ")));
    }
    if !cannot_hear.is_empty() {
        why.push_str(&format!(" (it cannot hear {})", cannot_hear.join(", ")));
    }
    why.push_str(&format!(
        ", held down {} s (time {} in a row)",
        hold.as_secs().max(1),
        o.report_markdowns
    ));
    Some(why)
}

#[cfg(test)]
mod tests {
    use crate::policy::tests::P;
    use crate::policy::{next_epoch, Policy};
    use carmine_cluster::OsdMap;
    use carmine_mapstore::failure_reports::FailureReport;
    use carmine_mapstore::membership::Registration;
    use std::collections::BTreeMap;
    use std::time::Duration;

    /// `n` OSDs, a pool of three copies (two needed), all registered.
    fn map(n: u32) -> OsdMap {
        let mut m = crate::policy::tests::map(n);
        m.pools[0].size = 3;
        m.pools[0].min_size = 2;
        m
    }

    fn alive(n: u32) -> BTreeMap<u32, Registration> {
        crate::policy::tests::alive(&map(n), &(0..n).collect::<Vec<_>>())
    }

    /// Reports: reporter → the OSDs it cannot hear from.
    fn reports(pairs: &[(u32, &[u32])]) -> BTreeMap<u32, FailureReport> {
        pairs
            .iter()
            .map(|&(r, ts)| {
                (
                    r,
                    FailureReport {
                        reporter: r,
                        pid: 100 + r,
                        started: 1,
                        silent_ms: ts.iter().map(|t| (*t, 12_000)).collect(),
                        held_seen: 0,
                        made: 0,
                        grace_ms: 0,
                    },
                )
            })
            .collect()
    }

    /// The report of an OSD that took the map holding it down until `held`.
    fn seen(osd: u32, held: u64) -> BTreeMap<u32, FailureReport> {
        let mut r = reports(&[(osd, &[])]);
        r.get_mut(&osd).unwrap().held_seen = held;
        r
    }

    fn downs(m: &OsdMap) -> Vec<u32> {
        m.osds.iter().filter(|o| !o.up).map(|o| o.id).collect()
    }

    #[test]
    fn an_osd_its_peers_cannot_hear_goes_down_while_registered_and_up_again_after_the_hold() {
        let m = map(3);
        // osd.1 hangs: both others report it.
        let r = reports(&[(0, &[1]), (2, &[1])]);
        let n = next_epoch(&m, &alive(3), &r, 1000, &P).unwrap();
        assert_eq!(downs(&n.map), vec![1]);
        let o = n.map.osd(1).unwrap();
        assert_eq!(
            (o.down_since, o.held_down_until, o.report_markdowns),
            (1000, 1020, 1)
        );
        assert!(o.in_);
        assert_eq!(
            n.reasons,
            vec!["osd.1 down on failure reports (unreachable from osd.0, osd.2), held down 20 s (time 1 in a row)"]
        );
        // Registered all along, it stays down for the hold (the reports about a down OSD no
        // longer count), and after it until it shows it took the map that holds it (a hung
        // OSD cannot); then it comes back up.
        assert_eq!(next_epoch(&n.map, &alive(3), &r, 1019, &P), None);
        assert_eq!(
            next_epoch(&n.map, &alive(3), &BTreeMap::new(), 1500, &P),
            None
        );
        // Never heard from, it is marked out after the grace period like a dead OSD.
        let out = next_epoch(&n.map, &alive(3), &BTreeMap::new(), 1600, &P).unwrap();
        let o = out.map.osd(1).unwrap();
        assert!(!o.up && !o.in_ && o.auto_out, "{o:?}");
        // Reports about it still in (older than its return) do not take it down in the
        // epoch that brings it back: its PGs have not peered with it yet.
        let mut with_old = r.clone();
        with_old.extend(seen(1, 1020));
        let back = next_epoch(&n.map, &alive(3), &with_old, 1020, &P).unwrap();
        assert_eq!(downs(&back.map), Vec::<u32>::new());
        assert_eq!(back.map.osd(1).unwrap().held_down_until, 1020);
    }

    #[test]
    fn a_silence_reported_before_its_target_restarted_is_not_believed_until_reported_again() {
        let m = map(3);
        // osd.1 restarted at time 100 within its lease (never seen down); osd.0 and osd.2
        // (peer grace 10 s) reported it silent for 12 s at 99, before: its earlier run.
        let mut alive = alive(3);
        alive.get_mut(&1).unwrap().started = 100;
        let mut r = reports(&[(0, &[1]), (2, &[1])]);
        let made = |r: &mut BTreeMap<u32, FailureReport>, at: u64| {
            for rep in r.values_mut() {
                rep.made = at;
                rep.grace_ms = 10_000;
            }
        };
        made(&mut r, 99);
        assert_eq!(next_epoch(&m, &alive, &r, 101, &P), None);
        // Made in the second it started: still maybe before it.
        made(&mut r, 100);
        assert_eq!(next_epoch(&m, &alive, &r, 101, &P), None);
        // Made again 2 s later, still silent: but the new run has not been silent for the
        // grace yet (the reporter counts from the earlier run's last answer).
        made(&mut r, 102);
        assert_eq!(next_epoch(&m, &alive, &r, 102, &P), None);
        // Silent for the grace since it started: a broken link with its current run.
        made(&mut r, 110);
        let n = next_epoch(&m, &alive, &r, 110, &P).unwrap();
        assert_eq!(downs(&n.map), vec![1]);
        // Reports of OSDs older than the field (made 0) are believed as before.
        made(&mut r, 0);
        let n = next_epoch(&m, &alive, &r, 102, &P).unwrap();
        assert_eq!(downs(&n.map), vec![1]);
        // Clocks that disagree by more than the skew allowed: believed as before, rather
        // than ignored for as long as they disagree. The target's clock ahead:
        made(&mut r, 99);
        let mut ahead = alive.clone();
        ahead.get_mut(&1).unwrap().started = 1_000;
        let n = next_epoch(&m, &ahead, &r, 101, &P).unwrap();
        assert_eq!(downs(&n.map), vec![1]);
        // The reporters' clocks behind (a report re-made every 2 s, dated long ago):
        made(&mut r, 50);
        let n = next_epoch(&m, &alive, &r, 101, &P).unwrap();
        assert_eq!(downs(&n.map), vec![1]);
    }

    #[test]
    fn an_osd_reported_again_soon_is_held_twice_as_long_each_time_and_later_from_the_start() {
        let mut m = map(3);
        let r = reports(&[(0, &[1]), (2, &[1])]);
        let mut now = 1000;
        for (time, hold) in [(1, 20), (2, 40), (3, 80), (4, 160)] {
            let n = next_epoch(&m, &alive(3), &r, now, &P).unwrap();
            let o = n.map.osd(1).unwrap();
            assert_eq!((o.report_markdowns, o.held_down_until - now), (time, hold));
            now += hold;
            m = next_epoch(&n.map, &alive(3), &seen(1, now), now, &P)
                .unwrap()
                .map;
            assert!(m.osd(1).unwrap().up);
            now += 30;
        }
        // Long after the last hold: from the start again.
        now += super::FLAP_WINDOW_SECS;
        let n = next_epoch(&m, &alive(3), &r, now, &P).unwrap();
        let o = n.map.osd(1).unwrap();
        assert_eq!((o.report_markdowns, o.held_down_until - now), (1, 20));
    }

    #[test]
    fn a_new_hold_ends_after_every_earlier_one_even_from_a_manager_whose_clock_is_behind() {
        let mut m = map(3);
        m.osds[1].held_down_until = 5000; // set by a predecessor whose clock ran ahead
        m.osds[1].report_markdowns = 1;
        let r = reports(&[(0, &[1]), (2, &[1])]);
        let n = next_epoch(&m, &alive(3), &r, 1000, &P).unwrap();
        let o = n.map.osd(1).unwrap();
        assert!(!o.up && o.held_down_until > 5000, "{o:?}");
        // The OSD's word on the earlier hold does not bring it back (a long grace: not out
        // yet either).
        let patient = Policy {
            down_out_grace: Duration::from_secs(86_400),
            ..P
        };
        assert_eq!(
            next_epoch(&n.map, &alive(3), &seen(1, 5000), 5002, &patient),
            None
        );
    }

    #[test]
    fn of_a_cut_link_between_two_osds_one_end_goes_down_and_one_per_epoch() {
        let m = map(3);
        // 0 and 2 cannot hear each other; 1 hears both.
        let r = reports(&[(0, &[2]), (2, &[0])]);
        let n = next_epoch(&m, &alive(3), &r, 1000, &P).unwrap();
        assert_eq!(downs(&n.map), vec![2], "{:?}", n.reasons);
        // With the higher id down, the reports of the link no longer count.
        assert_eq!(next_epoch(&n.map, &alive(3), &r, 1001, &P), None);
        // One reporter and no report back: the silent one goes.
        let r = reports(&[(2, &[0])]);
        assert_eq!(
            downs(&next_epoch(&m, &alive(3), &r, 1000, &P).unwrap().map),
            vec![0]
        );
        // Unless the reporter was marked down on reports lately: the link is still cut, and
        // the same end goes again.
        let back = next_epoch(&n.map, &alive(3), &seen(2, 1020), 1020, &P)
            .unwrap()
            .map;
        let again = next_epoch(&back, &alive(3), &r, 1030, &P).unwrap();
        assert_eq!(downs(&again.map), vec![2], "{:?}", again.reasons);
        assert_eq!(again.map.osd(2).unwrap().report_markdowns, 2);
    }

    #[test]
    fn an_osd_that_hears_nobody_goes_down_not_the_peers_it_names() {
        let m = map(4);
        // osd.3's network is broken: it reports everyone, and only osd.0 noticed it so far.
        let r = reports(&[(3, &[0, 1, 2]), (0, &[3])]);
        let n = next_epoch(&m, &alive(4), &r, 1000, &P).unwrap();
        assert_eq!(downs(&n.map), vec![3]);
        assert_eq!(
            n.reasons,
            vec!["osd.3 down on failure reports (unreachable from osd.0) (it cannot hear osd.1, osd.2), held down 20 s (time 1 in a row)"]
        );
        assert_eq!(next_epoch(&n.map, &alive(4), &r, 1001, &P), None);
    }

    #[test]
    fn reports_never_take_down_more_than_half_of_the_osds_that_are_in() {
        let mut m = map(4);
        m.osds[3].up = false;
        m.osds[3].down_since = 900;
        let mut a = alive(4);
        a.remove(&3);
        // 2 of 4 up after osd.0 goes: allowed.
        let r = reports(&[(1, &[0]), (2, &[0])]);
        let n = next_epoch(&m, &a, &r, 1000, &P).unwrap();
        assert_eq!(downs(&n.map), vec![0, 3]);
        // A third would leave 1 of 4: refused.
        let r = reports(&[(2, &[1])]);
        assert_eq!(next_epoch(&n.map, &a, &r, 1001, &P), None);
    }

    #[test]
    fn reports_by_or_about_osds_that_are_down_or_unregistered_do_not_count() {
        let mut m = map(3);
        m.osds[2].up = false;
        m.osds[2].down_since = 900;
        let mut a = alive(3);
        a.remove(&2);
        let r = reports(&[(2, &[0, 1]), (0, &[2])]);
        assert_eq!(next_epoch(&m, &a, &r, 1000, &P), None);
        // Up in the map but unregistered: it goes down for that, not for the reports.
        let m = map(3);
        let n = next_epoch(&m, &a, &r, 1000, &P).unwrap();
        assert_eq!(n.reasons, vec!["osd.2 down (no live registration)"]);
        assert_eq!(n.map.osd(2).unwrap().held_down_until, 0);
    }
}
