//! The shard's segment table: what each segment holds (nothing, journal records, or a
//! checkpoint), the free list, and the sequence numbers segments are opened with.

use std::collections::BTreeSet;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SegKind {
    Free,
    Journal,
    Checkpoint,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Seg {
    pub kind: SegKind,
    pub seq: u64,
}

/// A sequence no real segment gets: marks a journal segment the cleaner must leave alone.
const SEQ_KEPT: u64 = u64::MAX;

pub(crate) struct SegmentTable {
    segs: Vec<Seg>,
    free: BTreeSet<u32>,
    /// The highest sequence handed out; sequences only grow, across mounts too.
    seq_max: u64,
}

impl SegmentTable {
    /// The table as mount found it. `segs[i]` of kind `Free` are the free list.
    pub fn new(segs: Vec<Seg>, seq_max: u64) -> Self {
        let free = segs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.kind == SegKind::Free)
            .map(|(i, _)| i as u32)
            .collect();
        Self {
            segs,
            free,
            seq_max,
        }
    }

    pub fn get(&self, s: u32) -> Seg {
        self.segs[s as usize]
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, Seg)> + '_ {
        self.segs.iter().enumerate().map(|(i, s)| (i as u32, *s))
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    pub fn seq_max(&self) -> u64 {
        self.seq_max
    }

    /// Takes the lowest free segment for `kind` with a new sequence: `(segment, sequence)`.
    pub fn open(&mut self, kind: SegKind) -> Option<(u32, u64)> {
        debug_assert_ne!(kind, SegKind::Free);
        let s = self.free.pop_first()?;
        self.seq_max += 1;
        self.segs[s as usize] = Seg {
            kind,
            seq: self.seq_max,
        };
        Some((s, self.seq_max))
    }

    pub fn release(&mut self, s: u32) {
        self.segs[s as usize] = Seg {
            kind: SegKind::Free,
            seq: 0,
        };
        self.free.insert(s);
    }

    /// Keeps journal segment `s` out of the cleaner's reach for good (it holds live blocks
    /// the cleaner could not all find; freeing it could lose them).
    pub fn keep(&mut self, s: u32) {
        self.segs[s as usize].seq = SEQ_KEPT;
    }

    pub fn is_kept(&self, s: u32) -> bool {
        self.segs[s as usize].seq == SEQ_KEPT
    }
}
