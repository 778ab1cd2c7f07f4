//! Temporary acting sets (Ceph's `pg_temp`, decision 0015): while a copy that placement gives
//! a PG is being filled, the PG is served by OSDs that hold it complete, and the copies that
//! placement wants but that are not acting yet are its backfill targets.

use crate::map::{MapError, OsdMap, REPLICA_SIZE_MAX};
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
    /// it has one with an OSD up, its up set otherwise.
    pub fn pg_osds(&self, pg: PgId, size: u8) -> Vec<OsdId> {
        if let Some(temp) = self.pg_temp.get(&pg) {
            let up: Vec<OsdId> = temp.iter().copied().filter(|id| self.is_up(*id)).collect();
            if !up.is_empty() {
                return up;
            }
        }
        self.pg_up(pg, size)
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
    /// has, and entries that say what placement says anyway. Returns the PGs whose entry went.
    pub fn clean_temps(&mut self) -> Vec<PgId> {
        let mut gone = Vec::new();
        let known: Vec<OsdId> = self.osds.iter().map(|o| o.id).collect();
        let mut temps = std::mem::take(&mut self.pg_temp);
        temps.retain(|pg, osds| {
            osds.retain(|id| known.contains(id));
            let keep = match self.pool(pg.pool) {
                Ok(p) => {
                    pg.seed < p.pg_num
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

    pub(crate) fn validate_temps(&self) -> Result<(), MapError> {
        let invalid = |s: String| Err(MapError::Invalid(s));
        for (pg, osds) in &self.pg_temp {
            match self.pools.iter().find(|p| p.id == pg.pool) {
                Some(p) if pg.seed < p.pg_num => {}
                _ => {
                    return invalid(format!(
                        "a temporary acting set names pg {pg:?}, which no pool has"
                    ))
                }
            }
            if osds.is_empty() || osds.len() > REPLICA_SIZE_MAX as usize {
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
    use crate::{OsdInfo, OsdMap, Pool, MAP_FORMAT_VERSION};
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
        // ... and with none of them up, the up set serves.
        for id in &temp {
            m.osds.iter_mut().find(|o| o.id == *id).unwrap().up = false;
        }
        assert_eq!(m.pg_osds(PG, 3), m.pg_up(PG, 3));
        assert!(m.pg_backfill_targets(PG, 3).is_empty());
    }

    #[test]
    fn temporary_sets_round_trip_and_a_map_without_one_keeps_the_older_format() {
        let mut m = map();
        let plain = m.encode();
        assert!(u16::from_le_bytes([plain[4], plain[5]]) < MAP_FORMAT_VERSION);
        assert!(OsdMap::decode(plain).unwrap().pg_temp.is_empty());

        m.pg_temp.insert(PG, other_set(&m));
        m.pg_temp.insert(PgId { pool: 1, seed: 31 }, vec![2]);
        let enc = m.encode();
        assert_eq!(u16::from_le_bytes([enc[4], enc[5]]), MAP_FORMAT_VERSION);
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
        let mut m = map();
        m.pg_temp.insert(PG, vec![3, 1]);
        m.validate().unwrap();
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
        assert_eq!(m.pg_temp.get(&shrinks), Some(&vec![0]));
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
