//! What the manager decides, as a pure function of the map, who is registered, and the time:
//! the next epoch, or nothing. No I/O here, so every rule is tested directly.

use carmine_cluster::{OsdInfo, OsdMap};
use carmine_mapstore::failure_reports::FailureReport;
use carmine_mapstore::membership::Registration;
use std::collections::BTreeMap;
use std::time::Duration;

/// The manager's rules.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// How long an OSD may stay down before it is marked out and its PGs move elsewhere.
    pub down_out_grace: Duration,
    /// How long an OSD marked down on its peers' reports stays down the first time; each
    /// further time in a row holds it twice as long (see [`crate::reports`]).
    pub report_hold: Duration,
}

/// Default for [`Policy::down_out_grace`]: Ceph's `mon_osd_down_out_interval`.
pub const DOWN_OUT_GRACE_DEFAULT: Duration = Duration::from_secs(600);
/// Default for [`Policy::report_hold`].
pub const REPORT_HOLD_DEFAULT: Duration = Duration::from_secs(20);

/// A change and why it was made.
#[derive(Debug, PartialEq, Eq)]
pub struct NextEpoch {
    pub map: OsdMap,
    pub reasons: Vec<String>,
}

/// The map that should follow `map` given the OSDs registered now (`alive`), their failure
/// reports (`reports`, of their current runs) at Unix time `now`, or `None` if it is right as
/// it is:
/// - a registered OSD marked down is marked up (and in again, if it was marked out
///   automatically rather than by an operator) — unless its peers' reports hold it down;
/// - an OSD up and registered that its peers report they cannot hear from is marked down
///   and held down for a while ([`crate::reports`]: one per epoch);
/// - an OSD marked up that is not registered (its lease ran out, or it stopped) is marked
///   down, stamped with `now`;
/// - an OSD down and in for `down_out_grace` is marked out, automatically — unless it holds
///   a PG of a pool that keeps a single copy: nothing can copy that PG along, so it would come
///   back empty on other OSDs, and what it then accepts would be hidden once the OSD is back.
///   It waits for the OSD instead. (The one-copy PGs of other OSDs stay where they are.)
pub fn next_epoch(
    map: &OsdMap,
    alive: &BTreeMap<u32, Registration>,
    reports: &BTreeMap<u32, FailureReport>,
    now: u64,
    policy: &Policy,
) -> Option<NextEpoch> {
    let mut next = map.clone();
    let mut reasons = Vec::new();
    for o in &mut next.osds {
        let registered = alive.contains_key(&o.id);
        let held = registered && held(o, reports, now);
        let out_due = !o.up
            && o.in_
            && o.down_since != 0
            && now.saturating_sub(o.down_since) >= policy.down_out_grace.as_secs()
            // (Last: only an OSD otherwise due out pays for the search.)
            && !map.holds_single_copy(o.id);
        match alive.get(&o.id) {
            // Held down on its peers' reports (see `held`): stays down, registered or not.
            Some(reg) if !o.up && !held => {
                o.up = true;
                o.down_since = 0;
                let mut why = format!("osd.{} up (pid {} on {})", o.id, reg.pid, reg.host);
                if o.auto_out {
                    o.auto_out = false;
                    o.in_ = true;
                    why.push_str(", in again");
                }
                if reg.reactors != o.reactors {
                    tracing::warn!(
                        "osd.{} registered endpoints {:?}, the map has {:?}",
                        o.id,
                        reg.reactors,
                        o.reactors
                    );
                }
                reasons.push(why);
            }
            None if o.up => {
                o.up = false;
                o.down_since = now;
                reasons.push(format!("osd.{} down (no live registration)", o.id));
            }
            // Down without a stamp (a map of format 1): its grace period starts now, not at
            // the epoch of 1970.
            None if o.down_since == 0 => {
                o.down_since = now;
                reasons.push(format!("osd.{} down, grace period from now", o.id));
            }
            // Down (dead, or held: a hung OSD keeps its registration, not its wits) for the
            // grace period.
            _ if out_due => {
                o.in_ = false;
                o.auto_out = true;
                reasons.push(format!(
                    "osd.{} out ({} for {} s, grace {} s)",
                    o.id,
                    if held {
                        "held down on failure reports"
                    } else {
                        "down"
                    },
                    now.saturating_sub(o.down_since),
                    policy.down_out_grace.as_secs()
                ));
            }
            _ => {}
        }
    }
    if let Some(why) =
        crate::reports::mark_down_reported(map, &mut next, alive, reports, now, policy)
    {
        reasons.push(why);
    }
    if reasons.is_empty() {
        return None;
    }
    // PGs moved by an OSD marked out (or in again) are served by their complete copies while
    // the new ones are filled (decision 0015). One-copy PGs stay on their holders: holders
    // are never marked out here, and an OSD that goes out or comes back in changes only
    // their raw placement.
    next.pin_single_copies(map);
    next.prime_temps(map);
    next.epoch = map.epoch + 1;
    Some(NextEpoch { map: next, reasons })
}

/// Whether `o`, marked down on its peers' reports, stays down: its hold runs, or it has not
/// said yet that it took the map holding it.
fn held(o: &OsdInfo, reports: &BTreeMap<u32, FailureReport>, now: u64) -> bool {
    o.down_on_reports()
        && (now < o.held_down_until
            || reports
                .get(&o.id)
                .is_none_or(|r| r.held_seen < o.held_down_until))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use carmine_cluster::{OsdInfo, Pool};

    /// `n` OSDs on one host, a pool of two copies.
    pub(crate) fn map(n: u32) -> OsdMap {
        OsdMap {
            epoch: 5,
            osds: (0..n)
                .map(|id| {
                    OsdInfo::new(
                        id,
                        "h",
                        vec![format!("127.0.0.1:{}", 7000 + id).parse().unwrap()],
                    )
                })
                .collect(),
            pools: vec![Pool {
                id: 1,
                name: "rbd".into(),
                pg_num: 16,
                size: 2,
                min_size: 1,
            }],
            upmaps: Default::default(),
            pg_temp: Default::default(),
            pool_max: 1,
            given_copies: Default::default(),
        }
    }

    /// Registrations of `ids`, as their runs would make them (pid 100 + id).
    pub(crate) fn alive(m: &OsdMap, ids: &[u32]) -> BTreeMap<u32, Registration> {
        ids.iter()
            .map(|&id| {
                let o = m.osd(id).unwrap();
                (
                    id,
                    Registration {
                        osd: id,
                        host: "h".into(),
                        pid: 100 + id,
                        reactors: o.reactors.clone(),
                        started: 1,
                        capacity: 0,
                        pid_ns: 0,
                        boot_id: String::new(),
                    },
                )
            })
            .collect()
    }

    pub(crate) const P: Policy = Policy {
        down_out_grace: Duration::from_secs(600),
        report_hold: REPORT_HOLD_DEFAULT,
    };

    const NO_REPORTS: &BTreeMap<u32, FailureReport> = &BTreeMap::new();

    #[test]
    fn nothing_changes_while_every_osd_is_registered() {
        let m = map(3);
        assert_eq!(
            next_epoch(&m, &alive(&m, &[0, 1, 2]), NO_REPORTS, 1000, &P),
            None
        );
    }

    #[test]
    fn an_unregistered_osd_goes_down_in_the_next_epoch_and_stays_in() {
        let m = map(3);
        let n = next_epoch(&m, &alive(&m, &[0, 2]), NO_REPORTS, 1000, &P).unwrap();
        assert_eq!(n.map.epoch, 6);
        let o = n.map.osd(1).unwrap();
        assert!(!o.up && o.in_ && !o.auto_out);
        assert_eq!(o.down_since, 1000);
        assert_eq!(n.reasons, vec!["osd.1 down (no live registration)"]);
        // Nothing else moved.
        assert!(n.map.osd(0).unwrap().up && n.map.osd(2).unwrap().up);
        // Within the grace period: no further change.
        assert_eq!(
            next_epoch(&n.map, &alive(&m, &[0, 2]), NO_REPORTS, 1599, &P),
            None
        );
    }

    #[test]
    fn after_the_grace_period_a_down_osd_is_marked_out_and_back_in_when_it_returns() {
        let m = map(2);
        let down = next_epoch(&m, &alive(&m, &[0]), NO_REPORTS, 1000, &P)
            .unwrap()
            .map;
        let out = next_epoch(&down, &alive(&m, &[0]), NO_REPORTS, 1600, &P).unwrap();
        let o = out.map.osd(1).unwrap();
        assert!(!o.up && !o.in_ && o.auto_out);
        assert_eq!(out.map.epoch, down.epoch + 1);
        assert!(out.reasons[0].starts_with("osd.1 out (down for 600 s"));
        // Its PGs moved to osd.0.
        for seed in 0..16 {
            let pg = carmine_types::PgId { pool: 1, seed };
            assert_eq!(out.map.pg_primary(pg).unwrap().0, 0);
        }
        let back = next_epoch(&out.map, &alive(&m, &[0, 1]), NO_REPORTS, 1700, &P).unwrap();
        let o = back.map.osd(1).unwrap();
        assert!(o.up && o.in_ && !o.auto_out && o.down_since == 0);
        assert_eq!(back.reasons, vec!["osd.1 up (pid 101 on h), in again"]);
    }

    #[test]
    fn an_osd_back_in_moves_no_pg_of_a_pool_made_with_one_copy_while_it_was_out() {
        let m = map(3);
        let down = next_epoch(&m, &alive(&m, &[0, 1]), NO_REPORTS, 1000, &P)
            .unwrap()
            .map;
        let mut out = next_epoch(&down, &alive(&m, &[0, 1]), NO_REPORTS, 1600, &P)
            .unwrap()
            .map;
        assert!(!out.osd(2).unwrap().in_);
        out.pools.push(Pool {
            id: 2,
            name: "one".into(),
            pg_num: 32,
            size: 1,
            min_size: 1,
        });
        let back = next_epoch(&out, &alive(&m, &[0, 1, 2]), NO_REPORTS, 1700, &P).unwrap();
        assert!(back.map.osd(2).unwrap().in_);
        for seed in 0..32 {
            let pg = carmine_types::PgId { pool: 2, seed };
            assert_eq!(back.map.pg_placement(pg, 1), out.pg_placement(pg, 1));
        }
    }

    #[test]
    fn a_down_osd_without_a_stamp_gets_one_and_a_full_grace_period() {
        let mut m = map(2);
        m.osds[1].up = false; // as a format-1 map decodes: down, in, down_since 0
        let n = next_epoch(&m, &alive(&m, &[0]), NO_REPORTS, 5000, &P).unwrap();
        let o = n.map.osd(1).unwrap();
        assert!(o.in_ && o.down_since == 5000, "{o:?}");
        assert_eq!(
            next_epoch(&n.map, &alive(&m, &[0]), NO_REPORTS, 5599, &P),
            None
        );
        assert!(
            !next_epoch(&n.map, &alive(&m, &[0]), NO_REPORTS, 5600, &P)
                .unwrap()
                .map
                .osd(1)
                .unwrap()
                .in_
        );
    }

    #[test]
    fn a_down_osd_without_one_copy_pgs_is_marked_out_beside_a_one_copy_pool() {
        // A cluster grown from osd.0: its one-copy pool lives there alone.
        let mut m = map(3);
        m.pools.push(Pool {
            id: 2,
            name: "one".into(),
            pg_num: 16,
            size: 1,
            min_size: 1,
        });
        let mut on_0 = m.clone();
        on_0.osds.truncate(1);
        m.pin_single_copies(&on_0);
        let down = next_epoch(&m, &alive(&m, &[0, 1]), NO_REPORTS, 1000, &P)
            .unwrap()
            .map;
        let out = next_epoch(&down, &alive(&m, &[0, 1]), NO_REPORTS, 1600, &P).unwrap();
        assert!(!out.map.osd(2).unwrap().in_, "{:?}", out.reasons);
        for seed in 0..16 {
            let pg = carmine_types::PgId { pool: 2, seed };
            assert_eq!(out.map.pg_placement(pg, 1), vec![0]);
        }
        // osd.0, which holds them, waits however long it is down.
        let down = next_epoch(&m, &alive(&m, &[1, 2]), NO_REPORTS, 1000, &P)
            .unwrap()
            .map;
        assert_eq!(
            next_epoch(&down, &alive(&m, &[1, 2]), NO_REPORTS, 1000 + 86_400, &P),
            None
        );
    }

    #[test]
    fn a_down_osd_holding_a_one_copy_pg_is_never_marked_out() {
        let mut m = map(2);
        m.pools[0].size = 1;
        let down = next_epoch(&m, &alive(&m, &[0]), NO_REPORTS, 1000, &P)
            .unwrap()
            .map;
        assert_eq!(
            next_epoch(&down, &alive(&m, &[0]), NO_REPORTS, 1000 + 86_400, &P),
            None
        );
        assert!(down.osd(1).unwrap().in_);
    }

    #[test]
    fn an_osd_an_operator_marked_out_stays_out_when_it_comes_back() {
        let m = map(2);
        let mut down = next_epoch(&m, &alive(&m, &[0]), NO_REPORTS, 1000, &P)
            .unwrap()
            .map;
        down.osds[1].in_ = false; // `carmine osd out 1`
        let back = next_epoch(&down, &alive(&m, &[0, 1]), NO_REPORTS, 1100, &P).unwrap();
        let o = back.map.osd(1).unwrap();
        assert!(o.up && !o.in_);
        assert_eq!(back.reasons, vec!["osd.1 up (pid 101 on h)"]);
    }

    #[test]
    fn an_osd_that_returns_within_the_grace_period_is_up_and_never_out() {
        let m = map(2);
        let down = next_epoch(&m, &alive(&m, &[0]), NO_REPORTS, 1000, &P)
            .unwrap()
            .map;
        let back = next_epoch(&down, &alive(&m, &[0, 1]), NO_REPORTS, 1010, &P)
            .unwrap()
            .map;
        assert_eq!(back.osd(1), m.osd(1));
        assert_eq!(back.epoch, m.epoch + 2);
    }
}
