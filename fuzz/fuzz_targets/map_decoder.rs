//! Arbitrary bytes as a cluster map: decode and validate without panicking.
#![no_main]

use carmine_cluster::OsdMap;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(map) = OsdMap::decode(bytes::Bytes::copy_from_slice(data)) {
        // A map that decodes must survive placement queries.
        for pool in &map.pools {
            for seed in 0..pool.pg_num.min(64) {
                let pg = carmine_types::PgId { pool: pool.id, seed };
                let _ = map.pg_primary(pg);
            }
        }
    }
});
