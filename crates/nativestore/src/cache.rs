//! The shard's block cache: data accepted but not yet on the device ("dirty", bounded by
//! back-pressure, never evicted), and clean copies of written blocks kept for reads and
//! partial overwrites under a byte budget, evicted first in, first out.

use crate::device::BLOCK;
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes device block numbers with one multiply. They are assigned by the store, never
/// chosen by a client, so SipHash's resistance to crafted keys buys nothing here; it cost
/// ~9% of the OSD core on 64 KiB writes (five map operations per block written).
#[derive(Clone, Copy, Default)]
pub(crate) struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }

    fn write_u64(&mut self, n: u64) {
        // An odd constant: a bijection on the low bits (the bucket) that also fills the top
        // bits (hashbrown's tag) for consecutive block numbers.
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by device block number.
pub(crate) type BlockMap<V> = HashMap<u64, V, BuildHasherDefault<BlockHasher>>;

pub(crate) struct BlockCache {
    dirty: BlockMap<Bytes>,
    dirty_bytes: u64,
    clean: BlockMap<Bytes>,
    /// Insertion order of `clean`; may hold keys invalidated since (trimmed now and then).
    fifo: VecDeque<u64>,
    clean_blocks_max: usize,
}

impl BlockCache {
    pub fn new(clean_bytes_max: u64) -> Self {
        Self {
            dirty: BlockMap::default(),
            dirty_bytes: 0,
            clean: BlockMap::default(),
            fifo: VecDeque::new(),
            clean_blocks_max: (clean_bytes_max / BLOCK as u64) as usize,
        }
    }

    /// The data of device block `paddr`, if it is in memory (dirty or clean).
    pub fn get(&self, paddr: u64) -> Option<&Bytes> {
        self.dirty.get(&paddr).or_else(|| self.clean.get(&paddr))
    }

    /// Data placed at `paddr` (a fresh place: the journal never writes one twice) in a batch
    /// not yet written.
    pub fn add_dirty(&mut self, paddr: u64, data: Bytes) {
        debug_assert_eq!(data.len(), BLOCK);
        let before = self.dirty.insert(paddr, data);
        assert!(
            before.is_none(),
            "block {paddr} placed twice before it was written"
        );
        self.dirty_bytes += BLOCK as u64;
    }

    /// A block placed at `paddr` that fails its checksum (the cleaner moves such a block as
    /// it is). It counts as dirty until its batch is written, but is never kept: served from
    /// memory, no checksum would stand between it and a read or a partial overwrite, which
    /// would then return or rewrite damaged data as good. Read from the device, it fails
    /// its checksum there.
    pub fn add_dirty_unreadable(&mut self, paddr: u64) {
        assert!(
            !self.dirty.contains_key(&paddr),
            "block {paddr} placed twice before it was written"
        );
        self.dirty_bytes += BLOCK as u64;
    }

    /// Bytes in batches not yet on the device (invalidated blocks included: their batch
    /// still carries them until it is written).
    pub fn dirty_bytes(&self) -> u64 {
        self.dirty_bytes
    }

    /// A batch of `blocks` data blocks is on the device now: its blocks stop counting as
    /// dirty, and those still mapped stay as clean copies.
    pub fn batch_written(&mut self, blocks: impl Iterator<Item = u64>) {
        for paddr in blocks {
            self.dirty_bytes = self
                .dirty_bytes
                .checked_sub(BLOCK as u64)
                .expect("dirty bytes count every block of a batch not yet written");
            if let Some(data) = self.dirty.remove(&paddr) {
                self.insert_clean(paddr, data);
            }
        }
    }

    /// Keeps a clean copy of `paddr`, evicting the oldest beyond the budget.
    pub fn insert_clean(&mut self, paddr: u64, data: Bytes) {
        let limit = self.clean_blocks_max;
        if limit == 0 {
            return;
        }
        // Blocks written by clients are slices of the network receive buffers they came in;
        // kept as they are, one cached 4 KiB block would keep its whole (256 KiB or larger)
        // buffer alive, and the cache budget would bound nothing. Cache a copy of its own.
        let data = Bytes::copy_from_slice(&data);
        if self.clean.insert(paddr, data).is_none() {
            self.fifo.push_back(paddr);
        }
        while self.clean.len() > limit {
            match self.fifo.pop_front() {
                Some(p) => {
                    self.clean.remove(&p);
                }
                None => break,
            }
        }
        if self.fifo.len() > 2 * limit + 1024 {
            let clean = &self.clean;
            self.fifo.retain(|p| clean.contains_key(p));
        }
    }

    /// Forgets a block the index no longer maps. A dirty one still goes to the device with
    /// its batch (the record holds it), and counts as dirty until then, but is not kept.
    pub fn invalidate(&mut self, paddr: u64) {
        self.dirty.remove(&paddr);
        self.clean.remove(&paddr);
    }
}
