//! Verify mode: every 4 KiB block written carries a pattern derived from its block number and
//! a per-block generation, and every read is checked against the generation the volume last
//! acknowledged. Workers claim blocks before touching them (a write excludes everything, reads
//! share), so each read has exactly one right answer even at deep queues.

use bytes::{Bytes, BytesMut};
use std::cell::RefCell;

/// The unit of verification.
pub const BLOCK: u64 = 4096;

/// A block whose last write failed: its content is unknown, so reads of it are not checked.
const UNKNOWN: u32 = u32::MAX;
const WRITING: i16 = -1;

/// Expected contents of one volume. Single-threaded: it lives on the load generator's reactor
/// and is never borrowed across an await.
pub struct Verifier {
    gens: RefCell<Vec<u32>>,
    /// Per block: `WRITING`, or the number of reads in flight.
    state: RefCell<Vec<i16>>,
}

/// Fills `out` (one block) with the pattern of `block` at `generation`. The first two words
/// are the block number and generation in the clear, for diagnosis.
pub fn fill(block: u64, generation: u32, out: &mut [u8]) {
    let seed = block.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((generation as u64) << 1 | 1);
    for (j, word) in out.chunks_exact_mut(8).enumerate() {
        let v = match j {
            0 => block,
            1 => generation as u64,
            _ => seed
                .wrapping_add(j as u64)
                .wrapping_mul(0xBF58_476D_1CE4_E5B9),
        };
        word.copy_from_slice(&v.to_le_bytes());
    }
}

/// `count` blocks from `first`, all at `generation` (the prefill).
pub fn blocks_at(first: u64, count: u64, generation: u32) -> Bytes {
    let mut buf = BytesMut::zeroed((count * BLOCK) as usize);
    for (i, b) in buf.chunks_exact_mut(BLOCK as usize).enumerate() {
        fill(first + i as u64, generation, b);
    }
    buf.freeze()
}

impl Verifier {
    /// A volume of `size` bytes whose every block holds generation 0 (see `blocks_at`).
    pub fn new(size: u64) -> Self {
        let n = size.div_ceil(BLOCK) as usize;
        Verifier {
            gens: RefCell::new(vec![0; n]),
            state: RefCell::new(vec![0; n]),
        }
    }

    /// Claims `count` blocks from `first` for a write (exclusive) or a read (shared).
    pub fn try_claim(&self, first: u64, count: u64, write: bool) -> bool {
        let mut state = self.state.borrow_mut();
        let Some(range) = state.get_mut(first as usize..(first + count) as usize) else {
            return false;
        };
        let free = if write {
            range.iter().all(|&s| s == 0)
        } else {
            range.iter().all(|&s| s != WRITING && s < i16::MAX)
        };
        if free {
            for s in range {
                *s = if write { WRITING } else { *s + 1 };
            }
        }
        free
    }

    /// The data of a write over claimed blocks, and the generations it carries.
    pub fn payload(&self, first: u64, count: u64) -> (Bytes, Vec<u32>) {
        let gens: Vec<u32> = self.gens.borrow()[first as usize..(first + count) as usize]
            .iter()
            .map(|g| {
                if *g == UNKNOWN {
                    1
                } else {
                    g.wrapping_add(1) % UNKNOWN
                }
            })
            .collect();
        let mut buf = BytesMut::zeroed((count * BLOCK) as usize);
        for (i, b) in buf.chunks_exact_mut(BLOCK as usize).enumerate() {
            fill(first + i as u64, gens[i], b);
        }
        (buf.freeze(), gens)
    }

    /// Releases a write's claim; an acknowledged write sets what the blocks must now hold.
    pub fn finish_write(&self, first: u64, gens: &[u32], acknowledged: bool) {
        let mut expected = self.gens.borrow_mut();
        let mut state = self.state.borrow_mut();
        for (i, g) in gens.iter().enumerate() {
            let b = first as usize + i;
            expected[b] = if acknowledged { *g } else { UNKNOWN };
            state[b] = 0;
        }
    }

    pub fn finish_read(&self, first: u64, count: u64) {
        for s in &mut self.state.borrow_mut()[first as usize..(first + count) as usize] {
            *s -= 1;
        }
    }

    /// Whether `data`, read from block `first` on, is what was last acknowledged there.
    pub fn check(&self, first: u64, data: &[u8]) -> Result<(), String> {
        let gens = self.gens.borrow();
        let mut want = vec![0u8; BLOCK as usize];
        for (i, got) in data.chunks(BLOCK as usize).enumerate() {
            let b = first + i as u64;
            let g = gens[b as usize];
            if g == UNKNOWN {
                continue;
            }
            fill(b, g, &mut want);
            if got != &want[..got.len()] {
                let word = |k: usize| {
                    got.get(k * 8..k * 8 + 8)
                        .map_or(0, |w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
                };
                return Err(format!(
                    "block {b} (offset {}): expected generation {g}, found data claiming block {} generation {}",
                    b * BLOCK,
                    word(0),
                    word(1)
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_match_the_last_acknowledged_write_only() {
        let v = Verifier::new(16 * BLOCK);
        assert!(
            v.check(3, &blocks_at(3, 2, 0)).is_ok(),
            "prefill is generation 0"
        );
        assert!(v.try_claim(3, 2, true));
        assert!(
            !v.try_claim(4, 1, false),
            "no read of a block being written"
        );
        assert!(!v.try_claim(2, 2, true));
        let (data, gens) = v.payload(3, 2);
        assert_eq!(gens, [1, 1]);
        v.finish_write(3, &gens, true);
        assert!(v.check(3, &data).is_ok());
        let e = v.check(3, &blocks_at(3, 2, 0)).unwrap_err();
        assert!(e.contains("expected generation 1"), "{e}");
        // Data from the wrong block is caught even at the right generation.
        assert!(v.check(5, &data[..BLOCK as usize]).is_err());
        // Shared reads, then a write once they are done.
        assert!(v.try_claim(3, 1, false) && v.try_claim(3, 1, false));
        assert!(!v.try_claim(3, 1, true));
        v.finish_read(3, 1);
        v.finish_read(3, 1);
        assert!(v.try_claim(3, 1, true));
        // A failed write leaves the block unknown: not checked, not a false alarm.
        let (_, gens) = v.payload(3, 1);
        v.finish_write(3, &gens, false);
        assert!(v.check(3, &[0u8; BLOCK as usize]).is_ok());
        assert!(!v.try_claim(15, 2, true), "claims past the end are refused");
    }
}
