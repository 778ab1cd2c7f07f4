//! A verifiable data pattern: every 8-byte word depends on the seed and its absolute image
//! offset, so a block written to the wrong place, torn, or stale is detected on read.

pub fn fill(buf: &mut [u8], image_off: u64, seed: u64) {
    debug_assert!(image_off.is_multiple_of(8) && buf.len().is_multiple_of(8));
    for (i, word) in buf.chunks_exact_mut(8).enumerate() {
        word.copy_from_slice(&value(seed, image_off + 8 * i as u64).to_le_bytes());
    }
}

/// The first offset (relative to `buf`) where `buf` differs from the pattern.
pub fn first_mismatch(buf: &[u8], image_off: u64, seed: u64) -> Option<u64> {
    buf.chunks_exact(8).enumerate().find_map(|(i, w)| {
        let expect = value(seed, image_off + 8 * i as u64).to_le_bytes();
        (w != expect).then_some(8 * i as u64)
    })
}

fn value(seed: u64, off: u64) -> u64 {
    let mut z = seed ^ off.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_detects_a_misplaced_block() {
        let mut a = vec![0u8; 4096];
        fill(&mut a, 8192, 1);
        assert_eq!(first_mismatch(&a, 8192, 1), None);
        assert_eq!(first_mismatch(&a, 4096, 1), Some(0));
        assert_eq!(first_mismatch(&a, 8192, 2), Some(0));
    }
}
