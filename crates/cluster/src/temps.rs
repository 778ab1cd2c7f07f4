//! Temporary acting sets (Ceph's `pg_temp`, decision 0015): while a copy that placement gives
//! a PG is being filled, the PG is served by OSDs that hold it complete, and the copies that
//! placement wants but that are not acting yet are its backfill targets.

use crate::map::{MapError, OsdMap};
use carmine_types::{OsdId, PgId};
use std::collections::BTreeMap;

/// A PG's temporary acting set, primary first, in place of its placement.
pub type PgTemps = BTreeMap<PgId, Vec<OsdId>>;

impl OsdMap {
    /// The up set of a PG: the up members of its placement, primary first.
    pub fn pg_up(&self, pg: PgId, size: u8) -> Vec<OsdId> {
        self.pg_placement(pg, size)
            .into_iter()
            .filter(|id| self.is_up(*id))
            .collect()
    }

    /// The acting set of a PG, primary first: the up members of its temporary acting set if
    /// it has one with an OSD up, its up set otherwise — and the up set too when the set's
    /// up members are fewer than the pool's `min_size` and the up set has enough (the PG
    /// serves, recovering from whoever holds the data, rather than wait on a set that lost
    /// its copies). A pool of one copy never follows a set: its only copy is where placement
    /// put it.
    pub fn pg_osds(&self, pg: PgId, size: u8) -> Vec<OsdId> {
        let up_set = self.pg_up(pg, size);
        if size < 2 {
            return up_set;
        }
        if let Some(temp) = self.pg_temp.get(&pg) {
            let up: Vec<OsdId> = temp.iter().copied().filter(|id| self.is_up(*id)).collect();
            let min_size = self.pool(pg.pool).map_or(1, |p| p.min_size) as usize;
            if !up.is_empty() && (up.len() >= min_size || up_set.len() < min_size) {
                return up;
            }
        }
        up_set
    }

    /// The members of a PG's up set that are not acting: the copies being filled while a
    /// temporary acting set serves it. Empty without one.
    pub fn pg_backfill_targets(&self, pg: PgId, size: u8) -> Vec<OsdId> {
        let acting = self.pg_osds(pg, size);
        self.pg_up(pg, size)
            .into_iter()
            .filter(|id| !acting.contains(id))
            .collect()
    }

    /// Removes what no longer means anything: OSDs that left the map, entries of PGs no pool
    /// has, entries that say what placement says anyway, and entries the map no longer
    /// follows — fewer than `min_size` of their OSDs up while the up set has enough, so the
    /// PG serves from its up set and the set's copies fall behind; kept, the set would take
    /// the PG back to them when they come up. Returns the PGs whose entry went.
    pub fn clean_temps(&mut self) -> Vec<PgId> {
        let unfollowed: Vec<PgId> = self
            .pg_temp
            .iter()
            .filter(|(pg, osds)| {
                self.pool(pg.pool).is_ok_and(|p| {
                    let up: Vec<OsdId> =
                        osds.iter().copied().filter(|id| self.is_up(*id)).collect();
                    p.size > 1 && pg.seed < p.pg_num && self.pg_osds(**pg, p.size) != up
                })
            })
            .map(|(pg, _)| *pg)
            .collect();
        let mut gone = Vec::new();
        let known: Vec<OsdId> = self.osds.iter().map(|o| o.id).collect();
        let mut temps = std::mem::take(&mut self.pg_temp);
        temps.retain(|pg, osds| {
            osds.retain(|id| known.contains(id));
            let keep = !unfollowed.contains(pg)
                && match self.pool(pg.pool) {
                    Ok(p) => {
                        p.size > 1
                            && osds.len() <= p.size as usize
                            && pg.seed < p.pg_num
                            && !osds.is_empty()
                            && *osds != self.pg_placement(*pg, p.size)
                    }
                    Err(_) => false,
                };
            if !keep {
                gone.push(*pg);
            }
            keep
        });
        self.pg_temp = temps;
        gone
    }

    /// Keeps complete copies serving where this map moves PGs that `before` placed
    /// elsewhere (Ceph's pg_temp priming; decision 0015): a PG of a pool with more than one
    /// copy whose placement changed, and places copies on OSDs its acting set in `before`
    /// did not have, is served by that acting set (its OSDs still up, in its order) while the
    /// new copies are filled as backfill targets (from when their OSD is up: one just added
    /// is down until it starts), if those are at least `min_size`; otherwise it goes to its
    /// up set. PGs whose placement did not change keep what they have. Returns how many PGs
    /// have a temporary acting set now.
    pub fn prime_temps(&mut self, before: &OsdMap) -> usize {
        let pgs: Vec<(PgId, u8, u8)> = self
            .pools
            .iter()
            .filter(|p| p.size > 1)
            .flat_map(|p| {
                (0..p.pg_num).map(move |seed| (PgId { pool: p.id, seed }, p.size, p.min_size))
            })
            .collect();
        for (pg, size, min_size) in pgs {
            // (`before` may keep fewer copies of the pool: `pool set --size`.)
            let Ok(old_size) = before.pool(pg.pool).map(|p| p.size) else {
                continue;
            };
            // (A pool of one copy given copies: its holder serves while they fill.)
            if before.pg_placement(pg, old_size) == self.pg_placement(pg, size) {
                continue;
            }
            let mut serving: Vec<OsdId> = before
                .pg_osds(pg, old_size)
                .into_iter()
                .filter(|id| self.is_up(*id))
                .collect();
            let placed = self.pg_placement(pg, size);
            // Fewer copies now (`pool set --size`): the set keeps those placement keeps,
            // then the first others, up to the new size.
            while serving.len() > size as usize {
                match serving.iter().rposition(|id| !placed.contains(id)) {
                    Some(i) => {
                        serving.remove(i);
                    }
                    None => serving.truncate(size as usize),
                }
            }
            if serving.len() >= min_size as usize && placed.iter().any(|id| !serving.contains(id)) {
                self.pg_temp.insert(pg, serving);
            } else {
                self.pg_temp.remove(&pg);
            }
        }
        self.clean_temps();
        self.pg_temp.len()
    }

    /// Removes `pg`'s temporary acting set once its primary filled the backfill targets
    /// `filled` while serving from `acting`: only if the map still serves the PG from that set
    /// and every backfill target it has now is one of those filled (a target added since is
    /// not full yet). True if it was removed.
    pub fn release_temp(&mut self, pg: PgId, acting: &[OsdId], filled: &[OsdId]) -> bool {
        let Ok(size) = self.pool(pg.pool).map(|p| p.size) else {
            return false;
        };
        if !self.pg_temp.contains_key(&pg)
            || self.pg_osds(pg, size) != acting
            || !self
                .pg_backfill_targets(pg, size)
                .iter()
                .all(|t| filled.contains(t))
        {
            return false;
        }
        self.pg_temp.remove(&pg);
        true
    }

    /// Serves `pg` from `set` while the other members of `acting` fill as backfill targets,
    /// as its primary asked on finding them lacking most of the PG (decision 0015, step 2 for
    /// a copy back empty on its own placement; `Member::wants_temp`): only if the map still
    /// serves the PG from `acting` (what the primary saw), `set` is a part of it of at least
    /// `min_size` OSDs, all up, and the PG then acts on `set` exactly. True if it was set.
    pub fn ask_temp(&mut self, pg: PgId, acting: &[OsdId], set: &[OsdId]) -> bool {
        let Ok((size, min_size)) = self.pool(pg.pool).map(|p| (p.size, p.min_size)) else {
            return false;
        };
        if size < 2
            || set.len() < min_size as usize
            || set.len() >= acting.len()
            || !set.iter().all(|id| acting.contains(id) && self.is_up(*id))
            || self.pg_osds(pg, size) != acting
        {
            return false;
        }
        let before = self.pg_temp.insert(pg, set.to_vec());
        if self.pg_osds(pg, size) != set {
            match before {
                Some(b) => self.pg_temp.insert(pg, b),
                None => self.pg_temp.remove(&pg),
            };
            return false;
        }
        true
    }

    pub(crate) fn validate_temps(&self) -> Result<(), MapError> {
        let invalid = |s: String| Err(MapError::Invalid(s));
        for (pg, osds) in &self.pg_temp {
            let size = match self.pools.iter().find(|p| p.id == pg.pool) {
                Some(p) if pg.seed < p.pg_num => p.size,
                _ => {
                    return invalid(format!(
                        "a temporary acting set names pg {pg:?}, which no pool has"
                    ))
                }
            };
            if size < 2 {
                // Its one copy is where placement put it: served elsewhere, the PG would
                // answer without its data.
                return invalid(format!(
                    "pg {pg:?} of a single-copy pool has a temporary acting set"
                ));
            }
            if osds.is_empty() || osds.len() > size as usize {
                return invalid(format!(
                    "pg {pg:?} has a temporary acting set of {} OSDs",
                    osds.len()
                ));
            }
            for (i, id) in osds.iter().enumerate() {
                if osds[..i].contains(id) {
                    return invalid(format!(
                        "pg {pg:?}'s temporary acting set names osd.{id} twice"
                    ));
                }
                if self.osd(*id).is_none() {
                    return invalid(format!(
                        "pg {pg:?}'s temporary acting set names osd.{id}, which the map does not have"
                    ));
                }
            }
        }
        Ok(())
    }

    fn is_up(&self, id: OsdId) -> bool {
        self.osd(id).is_some_and(|o| o.up)
    }
}

#[cfg(test)]
mod tests {
    use crate::{OsdInfo, OsdMap, Pool};
    use carmine_types::PgId;

    /// Four OSDs on four hosts, one pool of 32 PGs with three copies.
    fn map() -> OsdMap {
        let mut m = OsdMap::single_osd(vec!["127.0.0.1:6800".parse().unwrap()], 32);
        m.osds = (0..4)
            .map(|id| {
                let addr = format!("127.0.0.1:{}", 6800 + id).parse().unwrap();
                OsdInfo::new(id, &format!("h{id}"), vec![addr])
            })
            .collect();
        m.pools[0] = Pool {
            size: 3,
            min_size: 2,
            ..m.pools[0].clone()
        };
        m
    }

    const PG: PgId = PgId { pool: 1, seed: 7 };

    /// A temporary set of the three OSDs placement does not put first, in an order of its own.
    fn other_set(m: &OsdMap) -> Vec<u32> {
        let up = m.pg_up(PG, 3);
        let missing = (0..4).find(|id| !up.contains(id)).unwrap();
        vec![up[2], missing, up[0]]
    }

    #[test]
    fn a_temporary_set_is_acting_while_one_of_its_osds_is_up() {
        let mut m = map();
        let up = m.pg_up(PG, 3);
        assert_eq!(m.pg_osds(PG, 3), up);
        assert!(m.pg_backfill_targets(PG, 3).is_empty());

        let temp = other_set(&m);
        m.pg_temp.insert(PG, temp.clone());
        assert_eq!(m.pg_osds(PG, 3), temp);
        assert_eq!(m.pg_primary(PG).unwrap().0, temp[0]);
        assert_eq!(m.pg_up(PG, 3), up, "the up set stays placement's");
        assert_eq!(m.pg_backfill_targets(PG, 3), vec![up[1]]);
        // Other PGs are not touched.
        let other = PgId { pool: 1, seed: 8 };
        assert_eq!(m.pg_osds(other, 3), m.pg_up(other, 3));

        // Its down members drop out of it, in order ...
        m.osds.iter_mut().find(|o| o.id == temp[0]).unwrap().up = false;
        assert_eq!(m.pg_osds(PG, 3), temp[1..].to_vec());
        // ... and with fewer of them up than min_size (2), the up set serves if it has enough.
        m.osds.iter_mut().find(|o| o.id == temp[1]).unwrap().up = false;
        let up_now = m.pg_up(PG, 3);
        assert!(up_now.len() >= 2, "{up_now:?}");
        assert_eq!(m.pg_osds(PG, 3), up_now);
        assert!(m.pg_backfill_targets(PG, 3).is_empty());
        // Such a set is no longer followed: cleaning drops it, so that the PG does not go
        // back to copies that fell behind when their OSDs come up again.
        let mut cleaned = m.clone();
        assert_eq!(cleaned.clean_temps(), vec![PG]);
        for id in &temp {
            cleaned.osds.iter_mut().find(|o| o.id == *id).unwrap().up = true;
        }
        assert_eq!(cleaned.pg_osds(PG, 3), cleaned.pg_up(PG, 3));
        // With the up set short too, what the set has left serves (it holds the data), and
        // the set stays.
        let mut short = m.clone();
        for id in up_now.iter().filter(|id| **id != temp[2]) {
            short.osds.iter_mut().find(|o| o.id == *id).unwrap().up = false;
        }
        assert_eq!(short.pg_osds(PG, 3), vec![temp[2]]);
        assert!(short.clean_temps().is_empty());
        assert_eq!(short.pg_temp.get(&PG), Some(&temp));
        for id in &temp {
            m.osds.iter_mut().find(|o| o.id == *id).unwrap().up = false;
        }
        assert_eq!(m.pg_osds(PG, 3), m.pg_up(PG, 3));
    }

    #[test]
    fn temporary_sets_round_trip_and_a_map_without_one_keeps_the_older_format() {
        let mut m = map();
        let plain = m.encode();
        assert!(u16::from_le_bytes([plain[4], plain[5]]) < 7);
        assert!(OsdMap::decode(plain).unwrap().pg_temp.is_empty());

        m.pg_temp.insert(PG, other_set(&m));
        m.pg_temp.insert(PgId { pool: 1, seed: 31 }, vec![2]);
        let enc = m.encode();
        assert_eq!(u16::from_le_bytes([enc[4], enc[5]]), 7, "format 7");
        assert_eq!(OsdMap::decode(enc).unwrap(), m);
    }

    #[test]
    fn a_temporary_set_must_name_known_osds_once_and_a_pg_that_exists() {
        let bad = |seed: u32, osds: Vec<u32>| {
            let mut m = map();
            m.pg_temp.insert(PgId { pool: 1, seed }, osds);
            let err = m.validate().unwrap_err().to_string();
            // A decoder meets the same check: such a map is refused, not served.
            assert!(OsdMap::decode(m.encode()).is_err());
            err
        };
        assert!(bad(7, vec![1, 9]).contains("osd.9, which the map does not have"));
        assert!(bad(7, vec![1, 2, 1]).contains("names osd.1 twice"));
        assert!(bad(7, vec![]).contains("of 0 OSDs"));
        assert!(bad(32, vec![1]).contains("which no pool has"));
        assert!(bad(7, vec![0, 1, 2, 3]).contains("of 4 OSDs"));
        let mut single = map();
        single.pools[0].size = 1;
        single.pools[0].min_size = 1;
        single.pg_temp.insert(PG, vec![3]);
        let err = single.validate().unwrap_err().to_string();
        assert!(err.contains("single-copy pool"), "{err}");
        single.pg_temp.clear();
        assert_eq!(single.pg_osds(PG, 1), single.pg_up(PG, 1));
        let mut m = map();
        m.pg_temp.insert(PG, vec![3, 1]);
        m.validate().unwrap();
    }

    #[test]
    fn a_set_is_released_only_as_its_primary_saw_it_with_every_target_filled() {
        let mut m = map();
        let temp = other_set(&m);
        m.pg_temp.insert(PG, temp.clone());
        let target = m.pg_backfill_targets(PG, 3);
        // Another acting set, or a target not filled: kept.
        assert!(!m.release_temp(PG, &temp[..2], &target));
        assert!(!m.release_temp(PG, &temp, &[]));
        assert!(!m.release_temp(PgId { pool: 1, seed: 8 }, &temp, &target));
        assert!(m.release_temp(PG, &temp, &target));
        assert!(!m.pg_temp.contains_key(&PG));
        assert!(
            !m.release_temp(PG, &temp, &target),
            "nothing left to release"
        );
    }

    #[test]
    fn a_primary_may_ask_its_pg_onto_part_of_the_acting_set_it_serves_from() {
        let mut m = map();
        let up = m.pg_up(PG, 3);
        // What the primary saw must still be so, and the set a part of it of min_size up.
        assert!(!m.ask_temp(PG, &up[..2], &up[..2]));
        assert!(!m.ask_temp(PG, &up, &up[..1]), "below min_size");
        assert!(!m.ask_temp(PG, &up, &up), "not a part");
        let other = (0..4).find(|id| !up.contains(id)).unwrap();
        assert!(
            !m.ask_temp(PG, &up, &[up[0], other]),
            "not of the acting set"
        );
        let mut down = m.clone();
        down.osds.iter_mut().find(|o| o.id == up[1]).unwrap().up = false;
        assert!(!down.ask_temp(PG, &up, &[up[0], up[1]]));
        let mut single = m.clone();
        single.pools[0].size = 1;
        single.pools[0].min_size = 1;
        assert!(!single.ask_temp(PG, &up[..1], &up[..1]));

        // osd up[1] came back empty: the others serve, it fills as a backfill target.
        let set = [up[0], up[2]];
        assert!(m.ask_temp(PG, &up, &set));
        assert_eq!(m.pg_osds(PG, 3), set);
        assert_eq!(m.pg_backfill_targets(PG, 3), vec![up[1]]);
        m.validate().unwrap();
        // Asked again from the old acting set (a late ask): nothing changes.
        assert!(!m.ask_temp(PG, &up, &set));
        // Once it is full, the set goes as any other.
        assert!(m.release_temp(PG, &set, &[up[1]]));
        assert_eq!(m.pg_osds(PG, 3), up);
    }

    #[test]
    fn a_new_osd_is_filled_while_the_copies_it_replaces_serve() {
        let mut before = map();
        before.osds.retain(|o| o.id != 3);
        before.epoch = 5;
        let mut after = before.clone();
        // Added down (it starts later): its PGs keep their copies serving, no target yet.
        after.osds.push(OsdInfo {
            up: false,
            ..OsdInfo::new(3, "h3", vec!["127.0.0.1:6803".parse().unwrap()])
        });
        assert!(after.prime_temps(&before) > 0);
        for pg in after.all_pgs() {
            assert_eq!(after.pg_osds(pg, 3), before.pg_osds(pg, 3), "pg {pg}");
            assert!(after.pg_backfill_targets(pg, 3).is_empty());
        }
        // Up: a target of every PG placed on it. (Marking up moves no placement.)
        after.osds.iter_mut().find(|o| o.id == 3).unwrap().up = true;
        let primed = after.pg_temp.clone();
        after.prime_temps(&after.clone());
        assert_eq!(after.pg_temp, primed);
        let mut moved = 0;
        for pg in after.all_pgs() {
            let acting = after.pg_osds(pg, 3);
            assert_eq!(
                acting,
                before.pg_osds(pg, 3),
                "pg {pg}: the same copies serve"
            );
            let targets = after.pg_backfill_targets(pg, 3);
            if after.pg_up(pg, 3).contains(&3) {
                moved += 1;
                assert_eq!(targets, vec![3], "pg {pg}");
            } else {
                assert!(targets.is_empty() && !after.pg_temp.contains_key(&pg));
            }
        }
        assert!(moved > 0 && moved == after.pg_temp.len(), "{moved}");
        after.validate().unwrap();

        // A PG whose old copies are down but for one (below min_size 2) goes to its up set.
        let pg = *after.pg_temp.keys().next().unwrap();
        let mut again = after.clone();
        let old = before.pg_osds(pg, 3);
        for id in &old[1..] {
            again.osds.iter_mut().find(|o| o.id == *id).unwrap().up = false;
        }
        again.osds.iter_mut().find(|o| o.id == 3).unwrap().in_ = false;
        let mut primed = again.clone();
        primed.prime_temps(&after);
        assert_ne!(primed.pg_placement(pg, 3), after.pg_placement(pg, 3));
        assert!(
            !primed.pg_temp.contains_key(&pg),
            "{:?}",
            primed.pg_temp.get(&pg)
        );

        // Single-copy pools are never primed (their one copy does not replicate).
        let mut one = before.clone();
        one.pools[0].size = 1;
        one.pools[0].min_size = 1;
        let mut one_after = after.clone();
        one_after.pg_temp.clear();
        one_after.pools = one.pools.clone();
        assert_eq!(one_after.prime_temps(&one), 0);
    }

    #[test]
    fn cleaning_drops_what_no_longer_means_anything() {
        let mut m = map();
        let same = PgId { pool: 1, seed: 1 };
        m.pg_temp.insert(same, m.pg_placement(same, 3));
        assert_eq!(m.clean_temps(), vec![same]);
        let shrinks = PgId { pool: 1, seed: 2 };
        m.pg_temp.insert(shrinks, vec![3, 0]);
        let only_gone = PgId { pool: 1, seed: 3 };
        m.pg_temp.insert(only_gone, vec![3]);
        m.pg_temp.insert(PG, other_set(&m));
        let kept = m.pg_temp[&PG].clone();

        // osd.3 leaves the map; placement of the PGs that had it changes too.
        m.osds.retain(|o| o.id != 3);
        let gone = m.clean_temps();
        assert!(gone.contains(&only_gone), "{gone:?}");
        // What is left of `shrinks`, osd.0 alone, is fewer than min_size (2) while the up
        // set has enough: the map no longer follows it.
        assert!(gone.contains(&shrinks), "{gone:?}");
        let want: Vec<u32> = kept.into_iter().filter(|id| *id != 3).collect();
        if want == m.pg_placement(PG, 3) || want.is_empty() {
            assert!(!m.pg_temp.contains_key(&PG));
        } else {
            assert_eq!(m.pg_temp[&PG], want);
        }
        m.validate().unwrap();

        // A pool that shrank or went takes its PGs' entries with it.
        m.pools[0].pg_num = 2;
        m.clean_temps();
        assert!(m.pg_temp.keys().all(|pg| pg.seed < 2), "{:?}", m.pg_temp);
        m.pools.clear();
        m.clean_temps();
        assert!(m.pg_temp.is_empty());
    }
}
