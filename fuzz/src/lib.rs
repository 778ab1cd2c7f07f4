//! Shared by the fuzz targets and the seed generator (`examples/seeds.rs`): how a target
//! reads its input, and how a fuzzed body is sealed into a block or frame whose magic and
//! checksum are right, so the fuzzer gets past the checksum to the decoder's field checks.
//!
//! Input convention of the targets with a checksum: the first byte picks the mode (bit 0 set:
//! seal the rest before decoding; clear: decode the rest as it is), the rest is the body.

use carmine_nativestore::fuzzing::{
    RecordHeader, CKPT_SEGMENTS_MAX, FORMAT_VERSION, FORMAT_VERSION_MIN, RECORD_HEADER_LEN,
    RECORD_MAGIC, SEGMENT_MAGIC, SHARDS_MAX, SLOT_MAGIC, SUPER_MAGIC,
};
use carmine_types::crc32c;

/// Reads fixed-width values off the front of the fuzzer's input; past the end, zeros.
pub struct Cursor<'a> {
    data: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.data.len());
        out[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        out
    }
    pub fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    pub fn rest(self) -> &'a [u8] {
        self.data
    }
}

/// The first byte of a checksummed target's input, and the body after it.
pub fn mode_and_body(data: &[u8]) -> (bool, &[u8]) {
    match data.split_first() {
        Some((mode, body)) => (mode & 1 == 1, body),
        None => (false, data),
    }
}

/// Puts `crc32c(block[..body_len])` at `body_len`, growing the block with zeros if needed.
pub fn seal_at(block: &mut Vec<u8>, body_len: usize) {
    if block.len() < body_len + 4 {
        block.resize(body_len + 4, 0);
    }
    let crc = crc32c(&block[..body_len]);
    block[body_len..body_len + 4].copy_from_slice(&crc.to_le_bytes());
}

fn set_magic(block: &mut Vec<u8>, magic: &[u8]) {
    if block.len() < magic.len() {
        block.resize(magic.len(), 0);
    }
    block[..magic.len()].copy_from_slice(magic);
}

fn le_u32_at(block: &[u8], off: usize) -> u32 {
    let mut b = [0u8; 4];
    let end = block.len().min(off + 4);
    if off < end {
        b[..end - off].copy_from_slice(&block[off..end]);
    }
    u32::from_le_bytes(b)
}

fn set_u32_at(block: &mut Vec<u8>, off: usize, v: u32) {
    if block.len() < off + 4 {
        block.resize(off + 4, 0);
    }
    block[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Byte offset of the format version in the native store's blocks (after the 8-byte magic).
pub const BLOCK_VERSION_OFF: usize = 8;

/// A format version this build reads, unless the fuzzed version's top bit is set (then the
/// fuzzed value stays, to keep the version check covered).
fn fix_version(block: &mut Vec<u8>, off: usize) {
    let raw = le_u32_at(block, off);
    if raw & (1 << 31) == 0 {
        set_u32_at(
            block,
            off,
            FORMAT_VERSION_MIN + raw % (FORMAT_VERSION - FORMAT_VERSION_MIN + 1),
        );
    }
}

/// Superblock: magic, a shard count in range most of the time (out of range when the fuzzed
/// count's top bit is set, to keep that check covered), crc after the shard table.
pub fn seal_superblock(block: &mut Vec<u8>) {
    const SHARDS_OFF: usize = 36;
    set_magic(block, SUPER_MAGIC);
    fix_version(block, BLOCK_VERSION_OFF);
    let raw = le_u32_at(block, SHARDS_OFF);
    let shards = if raw & (1 << 31) != 0 {
        raw
    } else {
        raw % (SHARDS_MAX + 1)
    };
    set_u32_at(block, SHARDS_OFF, shards);
    if (1..=SHARDS_MAX).contains(&shards) {
        seal_at(block, superblock_body_len(shards));
    }
}

pub fn superblock_body_len(shards: u32) -> usize {
    40 + shards as usize * 12
}

/// Checkpoint slot: magic, a segment count mostly in range, crc after the segment list.
pub fn seal_checkpoint_slot(block: &mut Vec<u8>) {
    const COUNT_OFF: usize = 12;
    set_magic(block, SLOT_MAGIC);
    fix_version(block, BLOCK_VERSION_OFF);
    let raw = le_u32_at(block, COUNT_OFF);
    let n = if raw & (1 << 31) != 0 {
        raw
    } else {
        raw % (CKPT_SEGMENTS_MAX as u32 + 1)
    };
    set_u32_at(block, COUNT_OFF, n);
    if n as usize <= CKPT_SEGMENTS_MAX {
        let version = le_u32_at(block, BLOCK_VERSION_OFF);
        seal_at(block, slot_body_len(n as usize, version));
    }
}

pub fn slot_body_len(segments: usize, version: u32) -> usize {
    // magic, version, count, shard, uuid, generation, journal position (segment, segment
    // seq, block, record seq), segment seq max, blob len, blob crc, then the segments, and
    // from format 4 on the tree root.
    let tree_root = if version >= 4 { 8 } else { 0 };
    8 + 4 + 4 + 4 + 16 + 8 + 4 + 8 + 4 + 8 + 8 + 8 + 4 + 4 * segments + tree_root
}

/// Segment header: magic and crc over its fixed body.
pub fn seal_segment_header(block: &mut Vec<u8>) {
    set_magic(block, SEGMENT_MAGIC);
    fix_version(block, BLOCK_VERSION_OFF);
    seal_at(block, SEGMENT_HEADER_BODY_LEN);
}

/// magic, version, uuid, shard, kind, seq, nonce.
pub const SEGMENT_HEADER_BODY_LEN: usize = 8 + 4 + 16 + 4 + 1 + 8 + 8;

/// Record header at the start of `area`: magic, and — unless the fuzzed byte at offset 4's
/// top bit says otherwise — a version in range and a `total_blocks` consistent with the
/// metadata and data lengths; then the header crc.
pub fn seal_record_header(area: &mut Vec<u8>) {
    const VERSION_OFF: usize = 4;
    const META_LEN_OFF: usize = 24;
    const DATA_BLOCKS_OFF: usize = 28;
    const TOTAL_BLOCKS_OFF: usize = 32;
    if area.len() < RECORD_HEADER_LEN {
        area.resize(RECORD_HEADER_LEN, 0);
    }
    area[..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    if area[VERSION_OFF + 3] & 0x80 == 0 {
        fix_version(area, VERSION_OFF);
        let meta_len = le_u32_at(area, META_LEN_OFF) as usize;
        let data_blocks = le_u32_at(area, DATA_BLOCKS_OFF) as usize;
        let total = RecordHeader::blocks_for(meta_len, data_blocks);
        set_u32_at(area, TOTAL_BLOCKS_OFF, total.min(u32::MAX as usize) as u32);
    }
    seal_at(area, RECORD_HEADER_LEN - 4);
}

/// Image header: crc32c of everything before the last four bytes.
pub fn seal_volume_header(body: &[u8]) -> Vec<u8> {
    let mut raw = body.to_vec();
    seal_at(&mut raw, body.len());
    raw
}

/// Cluster map: the same layout as the image header, a crc32c after the body.
pub fn seal_map(body: &[u8]) -> Vec<u8> {
    seal_volume_header(body)
}
