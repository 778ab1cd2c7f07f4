//! The balancer: placement exceptions (upmaps) that even out the PGs per OSD which hashing
//! alone leaves uneven, the way Ceph's balancer in upmap mode does.
//!
//! Hashing gives each OSD a share proportional to its weight only on average: 256 PGs over 8
//! equal OSDs land 27..36 on one map (max/mean 1.125). The balancer moves single PGs from the
//! fullest OSD to the emptiest one that may take them, each move an exception in the map, until
//! every OSD is within `max_deviation` PGs of its weighted target. It balances what
//! [`OsdMap::spread`] reports: the first placed OSD of each PG (its primary, which carries
//! the PG's load).

use crate::map::OsdMap;
use carmine_types::{OsdId, PgId};
use std::collections::{BTreeMap, BTreeSet};

/// What a balancing pass did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Balanced {
    /// PGs whose placement the pass changed (each one a PG whose data must move).
    pub moved: usize,
    /// Exceptions dropped because they no longer applied.
    pub cleaned: usize,
}

impl OsdMap {
    /// Drops exceptions that no longer change anything: their pool or PG is gone, the OSD they
    /// replace is no longer placed there, or their target is out. Returns how many were dropped.
    /// Placement is unchanged by this (such exceptions are skipped when applied).
    pub fn clean_upmaps(&mut self) -> usize {
        let mut cleaned = 0;
        let pgs: Vec<PgId> = self.upmaps.keys().copied().collect();
        for pg in pgs {
            let size = match self.pool(pg.pool) {
                Ok(p) if pg.seed < p.pg_num => p.size,
                _ => {
                    cleaned += self.upmaps.remove(&pg).map_or(0, |v| v.len());
                    continue;
                }
            };
            let raw = self.raw_placement(pg, size);
            let items = self.upmaps.remove(&pg).unwrap_or_default();
            let mut placed = raw;
            let mut kept = Vec::with_capacity(items.len());
            for (from, to) in items {
                let usable = self.osd(to).is_some_and(|o| o.in_ && o.weight > 0);
                match placed.iter().position(|c| *c == from) {
                    Some(i) if usable && !placed.contains(&to) => {
                        placed[i] = to;
                        kept.push((from, to));
                    }
                    _ => cleaned += 1,
                }
            }
            if !kept.is_empty() {
                self.upmaps.insert(pg, kept);
            }
        }
        cleaned
    }

    /// Whether placement gives OSD `id` a PG of a one-copy pool: it holds the only copy of
    /// some data, which nothing can carry elsewhere. (Stops at the first such PG.)
    pub fn holds_single_copy(&self, id: OsdId) -> bool {
        self.single_copy_pgs()
            .any(|pg| self.pg_placement(pg, 1).first() == Some(&id))
    }

    /// Keeps the PGs of one-copy pools where `before` placed them, by exceptions, where this
    /// map would place them elsewhere: such a PG's only copy is on the OSD `before` placed it
    /// on, and nothing copies it along (no backfill without a second copy), so moved it would
    /// come up empty and its data would be hidden. A PG is kept only if that OSD can still
    /// take it here (it is in, with a weight); any exception of its own is replaced. Returns
    /// the PGs kept by a new exception; those that could not be kept still move.
    pub fn pin_single_copies(&mut self, before: &OsdMap) -> Vec<PgId> {
        let pgs: Vec<PgId> = self
            .single_copy_pgs()
            .filter(|pg| before.pool(pg.pool).is_ok_and(|b| b.size == 1))
            .collect();
        let mut kept = Vec::new();
        for pg in pgs {
            let was = before.pg_placement(pg, 1);
            let Some(&holder) = was.first() else {
                continue;
            };
            if self.pg_placement(pg, 1) == was
                || !self.osd(holder).is_some_and(|o| o.in_ && o.weight > 0)
            {
                continue;
            }
            let raw = self.raw_placement(pg, 1);
            match raw.first() {
                Some(&from) if from != holder => {
                    self.upmaps.insert(pg, vec![(from, holder)]);
                }
                _ => {
                    self.upmaps.remove(&pg);
                }
            }
            debug_assert_eq!(self.pg_placement(pg, 1), was);
            kept.push(pg);
        }
        kept
    }

    /// Adds exceptions until every OSD that is in holds within `max_deviation` PGs of its
    /// weighted share of primaries, or no single move helps any more, or `max_moves` PGs have
    /// moved. A PG only moves to an OSD that is in, has a weight, is not already placed for it,
    /// and is on a host none of its other copies use (when the PG's copies are on distinct
    /// hosts). Deterministic: the same map balances the same way.
    pub fn balance(&mut self, max_deviation: usize, max_moves: usize) -> Balanced {
        self.balance_keeping(max_deviation, max_moves, false)
    }

    /// [`OsdMap::balance`], with `keep_single_copies`: PGs of one-copy pools count where
    /// they are but are never moved (their only copy cannot be carried along).
    pub fn balance_keeping(
        &mut self,
        max_deviation: usize,
        max_moves: usize,
        keep_single_copies: bool,
    ) -> Balanced {
        let cleaned = self.clean_upmaps();
        let single: BTreeSet<u32> = self
            .pools
            .iter()
            .filter(|p| p.size < 2)
            .map(|p| p.id)
            .collect();
        let eligible: Vec<(OsdId, u32, &str)> = self
            .osds
            .iter()
            .filter(|o| o.in_ && o.weight > 0)
            .map(|o| (o.id, o.weight, o.host.as_str()))
            .collect();
        if eligible.len() < 2 {
            return Balanced { moved: 0, cleaned };
        }
        let host_of: BTreeMap<OsdId, String> = eligible
            .iter()
            .map(|(id, _, h)| (*id, (*h).to_owned()))
            .collect();
        let total_weight: u64 = eligible.iter().map(|(_, w, _)| u64::from(*w)).sum();
        let pgs: Vec<(PgId, u8)> = self
            .all_pgs()
            .map(|pg| (pg, self.pool(pg.pool).map_or(1, |p| p.size)))
            .collect();
        let total = pgs.len() as f64;
        let target: BTreeMap<OsdId, f64> = eligible
            .iter()
            .map(|(id, w, _)| (*id, total * f64::from(*w) / total_weight as f64))
            .collect();
        let mut placement: BTreeMap<PgId, Vec<OsdId>> = pgs
            .iter()
            .map(|(pg, size)| (*pg, self.pg_placement(*pg, *size)))
            .collect();
        let mut count: BTreeMap<OsdId, usize> = target.keys().map(|id| (*id, 0)).collect();
        for osds in placement.values() {
            if let Some(c) = osds.first().and_then(|p| count.get_mut(p)) {
                *c += 1;
            }
        }
        let deviation = |count: &BTreeMap<OsdId, usize>, id: OsdId| count[&id] as f64 - target[&id];
        let mut moved_pgs: BTreeSet<PgId> = BTreeSet::new();
        let limit = max_deviation as f64;
        while moved_pgs.len() < max_moves {
            // Fullest first; among the OSDs that may give, try each until one move helps.
            let mut by_dev: Vec<OsdId> = count.keys().copied().collect();
            by_dev.sort_by(|a, b| {
                deviation(&count, *b)
                    .total_cmp(&deviation(&count, *a))
                    .then(a.cmp(b))
            });
            let fullest = deviation(&count, by_dev[0]);
            let emptiest = deviation(&count, *by_dev.last().expect("two or more"));
            if fullest <= limit && -emptiest <= limit {
                break;
            }
            let mut step = None;
            'search: for &from in &by_dev {
                let from_dev = deviation(&count, from);
                for &to in by_dev.iter().rev() {
                    // A move must shrink the gap between the two by more than it opens it.
                    if from_dev - deviation(&count, to) <= 1.0 {
                        break;
                    }
                    let candidate = placement.iter().find(|(pg, osds)| {
                        osds.first() == Some(&from)
                            && !(keep_single_copies && single.contains(&pg.pool))
                            && !osds.contains(&to)
                            && self.host_allows(osds, to, &host_of)
                            && !moved_pgs.contains(pg)
                    });
                    if let Some((pg, _)) = candidate {
                        step = Some((*pg, from, to));
                        break 'search;
                    }
                }
            }
            let Some((pg, from, to)) = step else {
                break;
            };
            self.add_upmap(pg, from, to);
            let osds = placement.get_mut(&pg).expect("placed");
            osds[0] = to;
            *count.get_mut(&from).expect("eligible") -= 1;
            *count.get_mut(&to).expect("eligible") += 1;
            moved_pgs.insert(pg);
        }
        Balanced {
            moved: moved_pgs.len(),
            cleaned,
        }
    }

    /// Whether `to` may replace the first of `osds` without putting two copies on one host
    /// (only enforced when the copies are on distinct hosts now).
    fn host_allows(&self, osds: &[OsdId], to: OsdId, host_of: &BTreeMap<OsdId, String>) -> bool {
        let host = |id: &OsdId| host_of.get(id).map(String::as_str);
        let others: Vec<Option<&str>> = osds[1..].iter().map(host).collect();
        let distinct_now = osds
            .iter()
            .enumerate()
            .all(|(i, a)| osds[..i].iter().all(|b| host(a) != host(b)));
        !distinct_now || !others.contains(&host(&to))
    }

    /// Records that `to` takes `from`'s place in `pg`, folding into an exception that already
    /// put `from` there (x→from and from→to become x→to; x→x disappears).
    fn add_upmap(&mut self, pg: PgId, from: OsdId, to: OsdId) {
        let items = self.upmaps.entry(pg).or_default();
        if let Some(i) = items.iter().position(|(_, t)| *t == from) {
            if items[i].0 == to {
                items.remove(i);
            } else {
                items[i].1 = to;
            }
        } else {
            items.push((from, to));
        }
        if items.is_empty() {
            self.upmaps.remove(&pg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::{OsdInfo, Pool};
    use crate::WEIGHT_ONE;
    use std::net::SocketAddr;

    fn cluster(osds: u32, hosts: u32, pg_num: u32, size: u8) -> OsdMap {
        OsdMap {
            epoch: 1,
            osds: (0..osds)
                .map(|id| {
                    let addr = SocketAddr::from(([127, 0, 0, 1], 6800 + id as u16));
                    OsdInfo::new(id, &format!("host{}", id % hosts), vec![addr])
                })
                .collect(),
            pools: vec![Pool {
                id: 1,
                name: "rbd".into(),
                pg_num,
                size,
                min_size: 1,
            }],
            upmaps: Default::default(),
            pg_temp: Default::default(),
            pool_max: 1,
            given_copies: Default::default(),
        }
    }

    fn placements(m: &OsdMap) -> Vec<Vec<OsdId>> {
        let size = m.pools[0].size;
        m.all_pgs().map(|pg| m.pg_placement(pg, size)).collect()
    }

    #[test]
    fn balancing_256_pgs_over_8_osds_meets_the_goal_with_few_moves() {
        let mut m = cluster(8, 8, 256, 1);
        let before = m.spread();
        let placed_before = placements(&m);
        let b = m.balance(1, 1000);
        let after = m.spread();
        println!(
            "8 OSDs x 256 PGs: max/mean {:.3} -> {:.3}, {} PGs moved",
            before.max_over_mean(),
            after.max_over_mean(),
            b.moved
        );
        assert!(
            before.max_over_mean() > 1.10,
            "hashing alone already met the goal: {before:?}"
        );
        assert!(after.max_over_mean() <= 1.10, "{after:?}");
        assert!(after.max <= 33 && after.min >= 31, "{after:?}");
        // Only the excess moves: no more PGs than the OSDs held above their share.
        let excess: usize = before
            .per_osd
            .iter()
            .map(|(_, n)| n.saturating_sub(32))
            .sum();
        assert!(
            b.moved <= excess,
            "moved {} for an excess of {excess}",
            b.moved
        );
        let changed = placed_before
            .iter()
            .zip(placements(&m))
            .filter(|(a, b)| **a != *b)
            .count();
        assert_eq!(changed, b.moved);
        // The exceptions travel with the map: a decoded map places the same.
        let decoded = OsdMap::decode(m.encode()).unwrap();
        assert_eq!(decoded.upmaps, m.upmaps);
        assert_eq!(placements(&decoded), placements(&m));
        // A second pass has nothing to do.
        assert_eq!(m.balance(1, 1000).moved, 0);
    }

    #[test]
    fn weights_set_the_share_the_balancer_aims_for() {
        let mut m = cluster(8, 8, 512, 1);
        m.osds[3].weight = 2 * WEIGHT_ONE;
        m.balance(1, 1000);
        let s = m.spread();
        let n = |id| s.per_osd.iter().find(|(o, _)| *o == id).unwrap().1;
        // 512 * 2/9 = 113.8 for osd.3, 56.9 for the others.
        assert!((112..=115).contains(&n(3)), "{s:?}");
        for id in [0, 1, 2, 4, 5, 6, 7] {
            assert!((55..=58).contains(&n(id)), "osd.{id}: {s:?}");
        }
    }

    #[test]
    fn balanced_copies_stay_on_distinct_hosts() {
        let mut m = cluster(12, 6, 256, 3);
        m.balance(1, 1000);
        assert!(!m.upmaps.is_empty());
        for osds in placements(&m) {
            let mut hosts: Vec<&str> = osds
                .iter()
                .map(|id| m.osd(*id).unwrap().host.as_str())
                .collect();
            hosts.sort();
            hosts.dedup();
            assert_eq!(hosts.len(), 3, "{osds:?}");
        }
        assert!(m.spread().max_over_mean() <= 1.10, "{:?}", m.spread());
    }

    #[test]
    fn an_out_osd_loses_its_exceptions_and_only_its_pgs_move() {
        let mut m = cluster(8, 8, 256, 1);
        m.balance(1, 1000);
        let target_of_some = m.upmaps.values().next().unwrap()[0].1;
        let before = placements(&m);
        m.osds[target_of_some as usize].in_ = false;
        m.osds[target_of_some as usize].up = false;
        let after = placements(&m);
        for (a, b) in before.iter().zip(&after) {
            assert!(a == b || a[0] == target_of_some, "{a:?} -> {b:?}");
            assert_ne!(b[0], target_of_some);
        }
        let cleaned = m.clean_upmaps();
        assert!(cleaned > 0);
        assert!(m
            .upmaps
            .values()
            .flatten()
            .all(|(_, t)| *t != target_of_some));
        assert_eq!(placements(&m), after, "cleaning changed placement");
    }

    #[test]
    fn adding_an_osd_to_a_balanced_cluster_moves_about_one_in_n_plus_one() {
        let mut m = cluster(8, 8, 256, 1);
        m.balance(1, 1000);
        let before = placements(&m);
        let addr = SocketAddr::from(([127, 0, 0, 1], 6900));
        m.osds.push(OsdInfo::new(8, "host8", vec![addr]));
        let by_hash = before
            .iter()
            .zip(placements(&m))
            .filter(|(a, b)| **a != *b)
            .count();
        let b = m.balance(1, 1000);
        let total = before
            .iter()
            .zip(placements(&m))
            .filter(|(a, b)| **a != *b)
            .count();
        println!("adding osd.8 to 8: {by_hash} PGs moved by hashing, {total} after balancing");
        // 256/9 = 28.4: hashing moves about that, balancing a few more.
        assert!((18..=40).contains(&by_hash), "{by_hash}");
        assert!(total <= by_hash + b.moved, "{total}");
        assert!(total <= 48, "{total}");
        assert!(m.spread().max_over_mean() <= 1.10, "{:?}", m.spread());
    }

    #[test]
    fn one_copy_pgs_stay_on_the_osd_that_holds_them_when_osds_are_added() {
        let one = cluster(1, 1, 64, 1);
        let mut grown = one.clone();
        for id in 1..3u32 {
            let addr = SocketAddr::from(([127, 0, 0, 1], 6900 + id as u16));
            grown
                .osds
                .push(OsdInfo::new(id, &format!("host{id}"), vec![addr]));
        }
        let moved = one.moved_pgs(&grown);
        assert!(moved > 20, "hashing alone moves about two thirds: {moved}");
        let kept = grown.pin_single_copies(&one);
        assert_eq!(kept.len(), moved);
        assert_eq!(placements(&grown), placements(&one));
        grown.validate().unwrap();
        assert_eq!(OsdMap::decode(grown.encode()).unwrap(), grown);
        // A pool of copies added now spreads over all three.
        grown.pools.push(Pool {
            id: 2,
            name: "rep".into(),
            pg_num: 16,
            size: 3,
            min_size: 2,
        });
        let p = PgId { pool: 2, seed: 0 };
        assert_eq!(grown.pg_placement(p, 3).len(), 3);
        // The holder marked out: its PGs cannot stay (they move, and the caller refuses).
        let mut out = grown.clone();
        out.osds[0].in_ = false;
        out.upmaps.clear();
        assert!(out.pin_single_copies(&grown).is_empty());
        assert!((0..64).all(|seed| {
            let pg = PgId { pool: 1, seed };
            grown.pg_placement(pg, 1) != out.pg_placement(pg, 1)
        }));
    }

    #[test]
    fn folded_exceptions_never_contradict_themselves() {
        let mut m = cluster(4, 4, 8, 1);
        let pg = PgId { pool: 1, seed: 0 };
        let first = m.pg_placement(pg, 1)[0];
        let (a, b) = ((first + 1) % 4, (first + 2) % 4);
        m.add_upmap(pg, first, a);
        m.add_upmap(pg, a, b);
        assert_eq!(m.upmaps[&pg], vec![(first, b)]);
        assert_eq!(m.pg_placement(pg, 1), vec![b]);
        m.add_upmap(pg, b, first);
        assert!(!m.upmaps.contains_key(&pg));
        m.validate().unwrap();
    }

    #[test]
    fn maps_with_impossible_exceptions_are_refused() {
        let mut m = cluster(4, 4, 8, 1);
        m.upmaps.insert(PgId { pool: 1, seed: 8 }, vec![(0, 1)]);
        assert!(OsdMap::decode(m.encode()).is_err(), "a PG beyond pg_num");
        m.upmaps.clear();
        m.upmaps.insert(PgId { pool: 1, seed: 0 }, vec![(2, 2)]);
        assert!(
            OsdMap::decode(m.encode()).is_err(),
            "an OSD replacing itself"
        );
        m.upmaps.clear();
        m.upmaps
            .insert(PgId { pool: 1, seed: 0 }, vec![(1, 2), (3, 2)]);
        assert!(
            OsdMap::decode(m.encode()).is_err(),
            "two OSDs replaced by one"
        );
    }

    #[test]
    fn version_2_to_4_maps_are_still_read_with_min_size_1_no_exceptions_and_no_holds() {
        let m = cluster(3, 3, 16, 1);
        assert_eq!(m.pools.len(), 1);
        assert_eq!(m.pools[0].min_size, 1);
        assert_eq!(OsdMap::decode(m.encode_as(4)).unwrap(), m);
        assert_eq!(OsdMap::decode(m.encode_as(3)).unwrap(), m);
        assert_eq!(OsdMap::decode(m.encode_as(2)).unwrap(), m);
    }
}
