//! An object's block map as extents: runs of logical blocks that sit contiguously on the
//! device, each block with its own CRC-32C (so a torn or rotten block costs that block, and a
//! partial read still checks what it reads). A 64 KiB write is one entry, not sixteen; a read
//! of contiguous data finds its device run in one lookup.

use carmine_types::{DecodeError, Decoder};
use std::collections::BTreeMap;
use std::ops::Range;

/// Longest extent: a write is split into extents of at most this many blocks, and joining
/// neighbours stops here, so joining copies a bounded checksum array and one extent is one
/// device read of at most 1 MiB.
pub const EXTENT_BLOCKS_MAX: u64 = 256;

/// Where one logical block lives and the checksum its data must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRef {
    pub paddr: u64,
    pub crc: u32,
}

/// The checksums of an extent's blocks; a one-block extent (random 4 KiB writes) keeps its
/// checksum inline, so it costs no allocation and no more memory than a single block map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Crcs {
    One(u32),
    Many(Box<[u32]>),
}

impl Crcs {
    /// `crcs` must not be empty.
    pub fn from_slice(crcs: &[u32]) -> Self {
        match crcs {
            [one] => Crcs::One(*one),
            _ => {
                assert!(!crcs.is_empty(), "an extent has at least one block");
                Crcs::Many(crcs.into())
            }
        }
    }

    pub fn as_slice(&self) -> &[u32] {
        match self {
            Crcs::One(c) => std::slice::from_ref(c),
            Crcs::Many(b) => b,
        }
    }
}

/// `crcs.len()` blocks from device block `paddr` on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    pub paddr: u64,
    pub crcs: Crcs,
}

impl Extent {
    pub fn new(paddr: u64, crcs: &[u32]) -> Self {
        Self {
            paddr,
            crcs: Crcs::from_slice(crcs),
        }
    }

    pub fn one(b: BlockRef) -> Self {
        Self {
            paddr: b.paddr,
            crcs: Crcs::One(b.crc),
        }
    }

    pub fn block_count(&self) -> u64 {
        self.crcs.as_slice().len() as u64
    }

    /// Block `i` of the extent.
    pub fn block(&self, i: u64) -> BlockRef {
        BlockRef {
            paddr: self.paddr + i,
            crc: self.crcs.as_slice()[i as usize],
        }
    }

    pub fn blocks(&self) -> impl Iterator<Item = BlockRef> + '_ {
        (0..self.block_count()).map(|i| self.block(i))
    }

    /// Blocks `[from, to)` of the extent.
    fn sub(&self, from: u64, to: u64) -> Extent {
        Extent::new(
            self.paddr + from,
            &self.crcs.as_slice()[from as usize..to as usize],
        )
    }

    /// Whether `next` continues this extent on the device and the two fit in one.
    fn joins(&self, next: &Extent) -> bool {
        self.paddr + self.block_count() == next.paddr
            && self.block_count() + next.block_count() <= EXTENT_BLOCKS_MAX
    }

    fn join(self, next: Extent) -> Extent {
        let mut crcs = Vec::with_capacity((self.block_count() + next.block_count()) as usize);
        crcs.extend_from_slice(self.crcs.as_slice());
        crcs.extend_from_slice(next.crcs.as_slice());
        Extent::new(self.paddr, &crcs)
    }
}

/// Reads the checksums of an extent of `n` blocks mapping logical block `lblock` to device
/// block `paddr` (from a delta or a checkpoint). Refuses a count outside
/// `1..=EXTENT_BLOCKS_MAX` and an extent past the end of either address space, so nothing
/// downstream has to fear an overflow or a huge allocation.
pub(crate) fn decode_extent(
    d: &mut Decoder,
    lblock: u64,
    paddr: u64,
    n: u64,
) -> Result<Extent, DecodeError> {
    if !(1..=EXTENT_BLOCKS_MAX).contains(&n)
        || lblock.checked_add(n).is_none()
        || paddr.checked_add(n).is_none()
    {
        return Err(DecodeError::Invalid {
            what: "extent blocks",
            found: n,
        });
    }
    let mut crcs = [0u32; EXTENT_BLOCKS_MAX as usize];
    for crc in &mut crcs[..n as usize] {
        *crc = d.u32("crc")?;
    }
    Ok(Extent::new(paddr, &crcs[..n as usize]))
}

/// An extent as the metadata tree holds it (format 5; the key gives its first logical
/// block): u64 device block, then one u32 CRC-32C per block, so the length gives the count.
pub(crate) fn extent_value(e: &Extent) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + 4 * e.block_count() as usize);
    v.extend_from_slice(&e.paddr.to_le_bytes());
    for crc in e.crcs.as_slice() {
        v.extend_from_slice(&crc.to_le_bytes());
    }
    v
}

/// Reads [`extent_value`] back for the extent starting at logical block `lblock`.
pub(crate) fn decode_extent_value(lblock: u64, value: &[u8]) -> Result<Extent, DecodeError> {
    if value.len() < 12 || !(value.len() - 8).is_multiple_of(4) {
        return Err(DecodeError::Invalid {
            what: "extent value length",
            found: value.len() as u64,
        });
    }
    let mut d = Decoder::new(bytes::Bytes::copy_from_slice(value));
    let paddr = d.u64("paddr")?;
    let e = decode_extent(&mut d, lblock, paddr, (value.len() as u64 - 8) / 4)?;
    d.finish("extent value")?;
    Ok(e)
}

/// Logical block → extent starting there; extents never overlap.
#[derive(Clone, Debug, Default)]
pub struct ExtentMap {
    map: BTreeMap<u64, Extent>,
    blocks: u64,
    /// First blocks of the extents put, changed or removed since [`ExtentMap::take_changed`]
    /// last ran: the metadata tree keys an extent by its first block, so these are the only
    /// keys a checkpoint has to put or delete (a superset: a key changed and changed back is
    /// put again). Appended to, and sorted and deduplicated whenever it doubles, so a block
    /// rewritten over and over costs no more than twice its entry, at 8 bytes an entry (a
    /// set took three times that).
    changed: Vec<u64>,
    /// Entries of `changed` when it was last deduplicated.
    changed_deduped: usize,
}

/// Two maps are equal when they map the same; what changed since the last checkpoint is
/// bookkeeping.
impl PartialEq for ExtentMap {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl Eq for ExtentMap {}

impl ExtentMap {
    /// Blocks mapped.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    pub fn extent_count(&self) -> usize {
        self.map.len()
    }

    /// The extent holding logical block `l`, with its first logical block.
    fn covering(&self, l: u64) -> Option<(u64, &Extent)> {
        // Bounded below by the longest extent, so both ends of the range share one descent.
        let (&s, e) = self
            .map
            .range(l.saturating_sub(EXTENT_BLOCKS_MAX - 1)..=l)
            .next_back()?;
        (l - s < e.block_count()).then_some((s, e))
    }

    pub fn get(&self, l: u64) -> Option<BlockRef> {
        let (s, e) = self.covering(l)?;
        Some(e.block(l - s))
    }

    /// The mapped blocks of `r`, in logical order.
    pub fn range(&self, r: Range<u64>) -> impl Iterator<Item = (u64, BlockRef)> + '_ {
        let (start, end) = (r.start, r.end);
        let first = self.covering(start).map_or(start, |(s, _)| s);
        self.map
            .range(first..end.max(first))
            .flat_map(move |(&s, e)| {
                let lo = s.max(start);
                let hi = (s + e.block_count()).min(end);
                (lo..hi).map(move |l| (l, e.block(l - s)))
            })
    }

    /// Whether any block of `r` is mapped.
    pub fn any_in(&self, r: Range<u64>) -> bool {
        self.range(r).next().is_some()
    }

    /// Every mapped block, in logical order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, BlockRef)> + '_ {
        self.map
            .iter()
            .flat_map(|(&s, e)| (0..e.block_count()).map(move |i| (s + i, e.block(i))))
    }

    pub fn extents(&self) -> impl Iterator<Item = (u64, &Extent)> {
        self.map.iter().map(|(s, e)| (*s, e))
    }

    /// The first blocks of the extents changed since the last call, in order, each once.
    pub fn take_changed(&mut self) -> Vec<u64> {
        let mut changed = std::mem::take(&mut self.changed);
        self.changed_deduped = 0;
        changed.sort_unstable();
        changed.dedup();
        changed
    }

    fn note_changed(&mut self, l: u64) {
        self.changed.push(l);
        if self.changed.len() >= 2 * self.changed_deduped.max(32) {
            self.changed.sort_unstable();
            self.changed.dedup();
            self.changed_deduped = self.changed.len();
        }
    }

    /// The extent starting at `l`, if one does.
    pub fn extent_at(&self, l: u64) -> Option<&Extent> {
        self.map.get(&l)
    }

    fn put(&mut self, l: u64, ext: Extent) {
        self.note_changed(l);
        self.map.insert(l, ext);
    }

    fn take(&mut self, l: u64) -> Extent {
        self.note_changed(l);
        self.map.remove(&l).expect("an extent starts there")
    }

    /// Cuts the extent holding `at` (if one straddles it) in two.
    fn split_at(&mut self, at: u64) {
        let Some((s, e)) = self.covering(at) else {
            return;
        };
        if s == at {
            return;
        }
        let (left, right) = (e.sub(0, at - s), e.sub(at - s, e.block_count()));
        self.put(s, left);
        self.put(at, right);
    }

    /// Unmaps `[from, to)`; the blocks unmapped are appended to `released`.
    pub fn punch(&mut self, from: u64, to: u64, released: &mut Vec<BlockRef>) {
        if from >= to {
            return;
        }
        // The common case (a random overwrite inside a longer extent): cut that one extent
        // once, without splitting it twice first.
        if let Some((s, e)) = self.covering(from) {
            let end = s + e.block_count();
            if to <= end {
                let e = self.take(s);
                released.extend((from - s..to - s).map(|i| e.block(i)));
                self.blocks -= to - from;
                if s < from {
                    self.put(s, e.sub(0, from - s));
                }
                if to < end {
                    self.put(to, e.sub(to - s, end - s));
                }
                return;
            }
        }
        self.split_at(from);
        self.split_at(to);
        while let Some((&s, _)) = self.map.range(from..to).next() {
            let e = self.take(s);
            self.blocks -= e.block_count();
            released.extend(e.blocks());
        }
    }

    /// Maps `[l, l + n)` to `ext` of `n` blocks; what was mapped there is appended to
    /// `released`. Joins the extent before it when `ext` continues it both logically and on
    /// the device (writes that go forward; one that continues backwards is left apart —
    /// joining only saves entries, and looking both ways costs every random write a lookup).
    pub fn set(&mut self, l: u64, ext: Extent, released: &mut Vec<BlockRef>) {
        let n = ext.block_count();
        self.blocks += n;
        // An overwrite of exactly one extent (random writes over a fragmented map) swaps it
        // in place, and one descent finds both it and the extent before it.
        let mut near = self.map.range_mut(l.saturating_sub(EXTENT_BLOCKS_MAX)..=l);
        if let Some((&s, cur)) = near.next_back() {
            if s == l && cur.block_count() == n {
                let old = std::mem::replace(cur, ext);
                let joins = near
                    .next_back()
                    .is_some_and(|(&ps, pe)| ps + pe.block_count() == l && pe.joins(cur));
                released.extend(old.blocks());
                self.blocks -= n;
                self.note_changed(l);
                if joins {
                    self.join_before(l);
                }
                return;
            }
        }
        self.punch(l, l + n, released);
        self.put(l, ext);
        self.join_before(l);
    }

    /// Joins the extent at `l` to the one before it if it continues it.
    fn join_before(&mut self, l: u64) {
        let Some((&ps, pe)) = self
            .map
            .range(l.saturating_sub(EXTENT_BLOCKS_MAX)..l)
            .next_back()
        else {
            return;
        };
        if ps + pe.block_count() != l || !self.map.get(&l).is_some_and(|e| pe.joins(e)) {
            return;
        }
        let pe = self.take(ps);
        let e = self.take(l);
        self.put(ps, pe.join(e));
    }

    /// Appends an extent after every mapped block, as it is (loading a checkpoint, which
    /// then re-encodes to the same bytes; not a change); `false` if it does not come after
    /// them.
    pub fn push_back(&mut self, l: u64, ext: Extent) -> bool {
        if let Some((&s, e)) = self.map.last_key_value() {
            if l < s + e.block_count() {
                return false;
            }
        }
        self.blocks += ext.block_count();
        self.map.insert(l, ext);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Set { l: u64, n: u64, paddr: u64 },
        Punch { from: u64, to: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..64u64, 1..20u64, 0..3u64).prop_map(|(l, n, p)| Op::Set {
                l,
                n,
                // Often right after the previous extent on the device, so joins happen.
                paddr: p * 1000 + l
            }),
            (0..70u64, 0..70u64).prop_map(|(from, to)| Op::Punch { from, to }),
        ]
    }

    fn crc_of(paddr: u64) -> u32 {
        (paddr as u32).wrapping_mul(2_654_435_761)
    }

    /// Puts into `stored` (extents by first block, as the metadata tree keys them) what
    /// changed in `map`, as a checkpoint does.
    fn sync_stored(stored: &mut BTreeMap<u64, Extent>, map: &mut ExtentMap) {
        for l in map.take_changed() {
            match map.extent_at(l) {
                Some(e) => stored.insert(l, e.clone()),
                None => stored.remove(&l),
            };
        }
    }

    #[test]
    fn extent_values_round_trip_and_refuse_bad_lengths() {
        let e = Extent::new(77, &(0..EXTENT_BLOCKS_MAX as u32).collect::<Vec<_>>());
        let v = extent_value(&e);
        assert!(v.len() <= carmine_btree::VALUE_MAX);
        assert_eq!(decode_extent_value(3, &v).unwrap(), e);
        assert_eq!(
            decode_extent_value(3, &v[..12]).unwrap(),
            Extent::new(77, &[0])
        );
        for bad in [&v[..8], &v[..13], &v[..0]] {
            assert!(decode_extent_value(3, bad).is_err());
        }
        let mut long = v.clone();
        long.extend_from_slice(&[0; 4]);
        assert!(decode_extent_value(3, &long).is_err(), "257 blocks");
        assert!(
            decode_extent_value(u64::MAX, &v).is_err(),
            "past the address space"
        );
    }

    proptest! {
        /// The map behaves as a plain block map, releases exactly what it unmaps, keeps
        /// extents disjoint and bounded, and answers range queries like the model.
        #[test]
        fn behaves_like_a_block_map(ops in proptest::collection::vec(op(), 1..60)) {
            let mut map = ExtentMap::default();
            let mut model: BTreeMap<u64, BlockRef> = BTreeMap::new();
            let mut stored: BTreeMap<u64, Extent> = BTreeMap::new();
            let last = ops.len() - 1;
            for (i, op) in ops.into_iter().enumerate() {
                let mut released = Vec::new();
                let mut expect = Vec::new();
                match op {
                    Op::Set { l, n, paddr } => {
                        let crcs: Vec<u32> = (0..n).map(|i| crc_of(paddr + i)).collect();
                        map.set(l, Extent::new(paddr, &crcs), &mut released);
                        for i in 0..n {
                            let b = BlockRef { paddr: paddr + i, crc: crc_of(paddr + i) };
                            expect.extend(model.insert(l + i, b));
                        }
                    }
                    Op::Punch { from, to } => {
                        map.punch(from, to, &mut released);
                        if from < to {
                            let keys: Vec<u64> = model.range(from..to).map(|(k, _)| *k).collect();
                            for k in keys {
                                expect.push(model.remove(&k).unwrap());
                            }
                        }
                    }
                }
                released.sort_by_key(|b| b.paddr);
                expect.sort_by_key(|b| b.paddr);
                prop_assert_eq!(released, expect);
                // What a checkpoint does with the changed keys, now and then: the copy
                // keyed by first block then holds exactly the map's extents.
                if i % 3 == 0 || i == last {
                    sync_stored(&mut stored, &mut map);
                    let now: Vec<(u64, Extent)> =
                        map.extents().map(|(l, e)| (l, e.clone())).collect();
                    let copy: Vec<(u64, Extent)> = stored.clone().into_iter().collect();
                    prop_assert_eq!(copy, now);
                }
                let all: Vec<(u64, BlockRef)> = map.iter().collect();
                let want: Vec<(u64, BlockRef)> = model.iter().map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(all, want);
                prop_assert_eq!(map.blocks(), model.len() as u64);
                let mut end = 0;
                for (s, e) in map.extents() {
                    prop_assert!(s >= end, "extents overlap at {}", s);
                    prop_assert!(e.block_count() >= 1 && e.block_count() <= EXTENT_BLOCKS_MAX);
                    end = s + e.block_count();
                }
                for (a, b) in [(0, 5), (3, 40), (17, 18), (30, 90), (9, 2)] {
                    let got: Vec<_> = map.range(a..b).collect();
                    let want: Vec<_> = if a < b {
                        model.range(a..b).map(|(k, v)| (*k, *v)).collect()
                    } else {
                        Vec::new()
                    };
                    prop_assert_eq!(got, want);
                    prop_assert_eq!(map.get(a), model.get(&a).copied());
                }
            }
        }
    }

    #[test]
    fn sequential_blocks_become_one_extent() {
        let mut map = ExtentMap::default();
        for l in 0..16 {
            map.set(l, Extent::new(100 + l, &[l as u32]), &mut Vec::new());
        }
        assert_eq!(map.extent_count(), 1);
        assert_eq!(map.blocks(), 16);
        // Not contiguous on the device: a second extent.
        map.set(16, Extent::new(500, &[0]), &mut Vec::new());
        assert_eq!(map.extent_count(), 2);
        // A one-block overwrite in the middle cuts the first in three.
        let mut released = Vec::new();
        map.set(5, Extent::new(900, &[7]), &mut released);
        assert_eq!(released, vec![BlockRef { paddr: 105, crc: 5 }]);
        assert_eq!(map.extent_count(), 4);
    }

    #[test]
    fn joining_stops_at_the_longest_extent() {
        let mut map = ExtentMap::default();
        for l in 0..EXTENT_BLOCKS_MAX + 3 {
            map.set(l, Extent::new(l, &[0]), &mut Vec::new());
        }
        assert_eq!(map.extent_count(), 2);
        assert!(!map.push_back(EXTENT_BLOCKS_MAX, Extent::new(0, &[0])));
    }
}
