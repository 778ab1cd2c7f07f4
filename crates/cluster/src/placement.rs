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

/// `log2(x)` for `x ≥ 1` in fixed point with 32 fraction bits: the integer part from the bit
/// length, the fraction bit by bit by squaring the mantissa. Integer arithmetic only, so every
/// client and OSD, on any platform, ranks OSDs identically (Ceph's straw2 uses a fixed-point
/// `crush_ln` for the same reason).
pub(crate) fn log2_q32(x: u64) -> u64 {
    debug_assert!(x > 0);
    let int = 63 - x.leading_zeros() as u64;
    // The mantissa in [1, 2) with 63 fraction bits.
    let mut m = (x as u128) << (63 - int);
    let mut frac = 0u64;
    for bit in (0..32).rev() {
        m = (m * m) >> 63;
        if m >> 64 != 0 {
            m >>= 1;
            frac |= 1 << bit;
        }
    }
    (int << 32) | frac
}

/// Weight 1.0 in the map's 16.16 fixed point.
pub const WEIGHT_ONE: u32 = 0x10000;

/// The weight of an OSD of `bytes` capacity: its size in TiB, as Ceph's CRUSH weights, in
/// 16.16 fixed point (1 GiB is 64/65536); at least the smallest non-zero weight.
pub fn weight_of_capacity(bytes: u64) -> u32 {
    // 2^40 bytes per TiB over 2^16 per unit of weight.
    (bytes >> 24).clamp(1, u32::MAX as u64) as u32
}

/// Straw2's draw for an OSD of `weight` (16.16) given its rendezvous `score`: `ln(u) / weight`
/// with `u` uniform in (0, 1], here `log2(u)` in fixed point. The highest draw wins, and an OSD
/// of twice the weight wins twice as often. Equal weights rank exactly as the scores do.
pub(crate) fn weighted_draw(score: u64, weight: u32) -> i128 {
    debug_assert!(weight > 0);
    let u = (score >> 16) + 1; // 1..=2^48
    let log = log2_q32(u) as i128 - (48i128 << 32); // ≤ 0
    log * WEIGHT_ONE as i128 / weight as i128
}

/// Which of an OSD's `reactors` owns `pg`.
pub fn pg_to_reactor_index(pg: PgId, reactors: u32) -> u32 {
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

    #[test]
    fn fixed_point_log2_is_exact_on_powers_and_close_elsewhere() {
        for k in 0..64 {
            assert_eq!(log2_q32(1u64 << k), (k as u64) << 32);
        }
        for x in [3u64, 5, 1000, 123_456_789, u64::MAX / 3, u64::MAX] {
            let got = log2_q32(x) as f64 / (1u64 << 32) as f64;
            assert!((got - (x as f64).log2()).abs() < 1e-8, "{x}: {got}");
        }
        // Golden values: placement depends on them bit for bit.
        assert_eq!(log2_q32(3), 0x1_95c0_1a39);
        assert_eq!(log2_q32(1_000_000_007), 128_408_152_788);
    }

    #[test]
    fn a_heavier_osd_wins_in_proportion_to_its_weight() {
        // Two OSDs, the second of weight 3: it should win about 3/4 of the draws.
        let mut wins = 0;
        for seed in 0..40_000u32 {
            let pg = PgId { pool: 1, seed };
            let a = weighted_draw(rendezvous_score(pg, 0), WEIGHT_ONE);
            let b = weighted_draw(rendezvous_score(pg, 1), 3 * WEIGHT_ONE);
            if b > a {
                wins += 1;
            }
        }
        let share = wins as f64 / 40_000.0;
        assert!((share - 0.75).abs() < 0.01, "{share}");
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
