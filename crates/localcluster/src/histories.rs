//! The PGs' recorded histories of a cluster (decision 0009), as operator commands read them.

use crate::read_cluster_file;
use anyhow::{Context, Result};
use carmine_cluster::OsdMap;
use carmine_mapstore::PgHistoryStore;
use carmine_types::PgId;
use std::path::Path;

/// The PG histories of the cluster in `dir` (files beside its map, or keys in its etcd).
pub fn pg_histories(dir: &Path) -> Result<Box<dyn PgHistoryStore>> {
    Ok(match read_cluster_file(dir)?.and_then(|f| f.etcd) {
        Some(e) => Box::new(carmine_mapstore::EtcdPgHistory::new(
            e.client()?,
            &e.cluster,
        )),
        None => Box::new(carmine_mapstore::LocalPgHistory::new(dir)),
    })
}

/// The PGs of `map` whose recorded history names `osd` in some interval: they are not clean
/// without it yet, and may need its copy. Pools of one copy keep no history (one `pool set`
/// left when it could not give the pool copies means nothing, and is not read).
pub fn pgs_naming(map: &OsdMap, histories: &dyn PgHistoryStore, osd: u32) -> Result<Vec<PgId>> {
    let mut naming = Vec::new();
    let replicated = map
        .pools
        .iter()
        .filter(|p| p.size > 1)
        .flat_map(|p| p.pgs());
    for pg in replicated {
        let h = histories
            .get(pg)
            .with_context(|| format!("reading the history of pg {pg}"))?;
        if h.intervals.iter().any(|i| i.acting.contains(&osd)) {
            naming.push(pg);
        }
    }
    Ok(naming)
}

#[cfg(test)]
mod tests {
    use super::*;
    use carmine_pg::Interval;

    #[test]
    fn the_pgs_whose_history_names_an_osd_are_found() {
        let dir = std::env::temp_dir().join(format!("carmine-naming-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let histories = carmine_mapstore::LocalPgHistory::new(&dir);
        let mut map = OsdMap::single_osd(vec!["127.0.0.1:1".parse().unwrap()], 4);
        map.pools[0].size = 2;
        let pg = |seed| PgId { pool: 1, seed };
        let at = |epoch, acting: &[u32]| Interval {
            epoch,
            acting: acting.to_vec(),
        };
        histories.record(pg(1), None, at(2, &[0, 1])).unwrap();
        histories.record(pg(1), Some(2), at(3, &[0])).unwrap();
        histories.record(pg(3), None, at(2, &[0, 2])).unwrap();
        assert_eq!(pgs_naming(&map, &histories, 1).unwrap(), [pg(1)]);
        assert_eq!(pgs_naming(&map, &histories, 0).unwrap(), [pg(1), pg(3)]);
        assert!(pgs_naming(&map, &histories, 5).unwrap().is_empty());
        // A pool of one copy: what its histories say is not read (`pool set` left them).
        map.pools[0].size = 1;
        assert!(pgs_naming(&map, &histories, 0).unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
