//! The cluster map: decode and validate without panicking. In sealed mode the body gets a
//! correct trailing crc32c so the fuzzer reaches the field parsing and `validate`. A map that
//! decodes survives encode → decode unchanged and answers placement queries.
#![no_main]

use bytes::Bytes;
use carmine_cluster::OsdMap;
use carmine_fuzz::{mode_and_body, seal_map};
use libfuzzer_sys::fuzz_target;

/// Bounds the placement work per input (pools × seeds × OSDs), so a big map is not a hang.
const POOLS_QUERIED_MAX: usize = 8;
const SEEDS_QUERIED_MAX: u32 = 16;

fuzz_target!(|data: &[u8]| {
    let (sealed, body) = mode_and_body(data);
    let raw = if sealed {
        seal_map(body)
    } else {
        body.to_vec()
    };
    let Ok(map) = OsdMap::decode(Bytes::from(raw)) else {
        return;
    };
    let again = OsdMap::decode(map.encode()).expect("an encoded map decodes");
    assert_eq!(again, map, "map round trip");
    for pool in map.pools.iter().take(POOLS_QUERIED_MAX) {
        for seed in 0..pool.pg_num.min(SEEDS_QUERIED_MAX) {
            let pg = carmine_types::PgId {
                pool: pool.id,
                seed,
            };
            if let Some((osd, reactor)) = map.pg_primary(pg) {
                let info = map.osd(osd).expect("the primary is in the map");
                assert!(info.up && (reactor as usize) < info.reactors.len());
            }
            let acting = map.pg_osds(pg, pool.size);
            assert!(acting.len() <= pool.size as usize);
        }
        let _ = map.object_pg(pool, "rbd_data.1");
    }
});
