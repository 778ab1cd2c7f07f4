//! Hash functions behind placement. Changing any of them moves data: they are part of the
//! format and covered by golden-value tests.

use carmine_types::{crc32c, crc32c_append, OsdId, PgId};

/// Ceph's `ceph_stable_mod`: maps `x` into `0..b` such that growing `b` towards the next power
/// of two moves only the values that must move.
pub fn stable_mod(x: u32, b: u32) -> u32 {
    debug_assert!(b > 0);
    let bmask = b.next_power_of_two() - 1;
    if (x & bmask) < b {
        x & bmask
    } else {
        x & (bmask >> 1)
    }
}

/// The PG seed of an object name in a pool of `pg_num` PGs.
pub fn object_to_pg_seed(oid: &str, pg_num: u32) -> u32 {
    stable_mod(crc32c(oid.as_bytes()), pg_num)
}

/// A 64-bit mix (splitmix64 finaliser) so rendezvous scores are well spread even though the
/// inputs differ in few bits.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn pg_hash(pg: PgId) -> u32 {
    crc32c_append(crc32c(&pg.pool.to_le_bytes()), &pg.seed.to_le_bytes())
}

/// Rendezvous score of `osd` for `pg`: the PG goes to the highest-scoring OSDs.
pub(crate) fn rendezvous_score(pg: PgId, osd: OsdId) -> u64 {
    mix64(((pg_hash(pg) as u64) << 32) | osd as u64)
}

/// Which of an OSD's `reactors` owns `pg`.
pub(crate) fn pg_to_reactor_index(pg: PgId, reactors: u32) -> u32 {
    debug_assert!(reactors > 0);
    (mix64(pg_hash(pg) as u64) % reactors as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_mod_matches_ceph_for_non_power_of_two() {
        // b = 12: mask 15; values 12..15 fold onto 4..7.
        assert_eq!(stable_mod(5, 12), 5);
        assert_eq!(stable_mod(13, 12), 5);
        assert_eq!(stable_mod(15, 12), 7);
        assert_eq!(stable_mod(16 + 3, 12), 3);
        for x in 0..10_000 {
            assert!(stable_mod(x, 12) < 12);
        }
    }

    #[test]
    fn growing_pg_num_moves_only_split_objects() {
        // From 8 to 12 PGs an object either stays or moves to seed + 8.
        for i in 0..2000 {
            let oid = format!("obj.{i}");
            let (a, b) = (object_to_pg_seed(&oid, 8), object_to_pg_seed(&oid, 12));
            assert!(a == b || b == a + 8, "{oid}: {a} -> {b}");
        }
    }

    /// Golden values: if these change, existing data would be looked for in the wrong PG.
    #[test]
    fn placement_hashes_are_stable_across_releases() {
        assert_eq!(
            object_to_pg_seed("rbd_directory", 32),
            crc32c(b"rbd_directory") & 31
        );
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0x5692_161d_100b_05e5);
    }
}
