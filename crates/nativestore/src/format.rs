//! On-disk structures: superblock, checkpoint slots, segment headers, record headers.
//! Every one has a magic, a format version and a crc32c; `docs/format/native-store.md`
//! describes the layout byte by byte.

use crate::device::BLOCK;
use bytes::{Bytes, BytesMut};
use carmine_types::{crc32c, Decoder, Encoder};

/// Version 5: the metadata tree keys each extent on its own, after its object's record (record
/// version 2), so a checkpoint writes the extents that changed, not whole block maps; the
/// records of version 1 that format 4 wrote are still read, and rewritten when their object
/// next changes.
/// Version 4: a checkpoint is a copy-on-write B+tree of the index's records (the slot names
/// its root), written incrementally; version 3 checkpoints (one blob) are still read, and the
/// first checkpoint after mount turns one into a tree.
/// Version 3: block maps are extents (the *set extent* delta, checkpoint version 2).
/// Version 2: a backup superblock at [`SUPER_BACKUP_OFFSET`]; records carry the durable mark
/// and their checksum covers the metadata only (each data block is checked by the checksum
/// its delta holds). Stores of versions 1 and 2 are read, and written only once upgraded
/// (`carmine store upgrade`): an older build must never meet records it cannot read.
pub const FORMAT_VERSION: u32 = 5;
/// The oldest version this build still reads.
pub const FORMAT_VERSION_MIN: u32 = 1;
pub const SUPER_MAGIC: &[u8; 8] = b"CRMNSTOR";
pub const SLOT_MAGIC: &[u8; 8] = b"CRMNCKPT";
pub const SEGMENT_MAGIC: &[u8; 8] = b"CRMNSEGH";
pub const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"CREC");
/// Shards start on this boundary; the first one after the superblock area.
pub const SHARD_ALIGN: u64 = 1 << 20;
/// The backup copy of the superblock: the last block of the superblock area, as far from
/// block 0 as the area allows, so one damaged region rarely takes both.
pub const SUPER_BACKUP_OFFSET: u64 = SHARD_ALIGN - BLOCK as u64;
/// Blocks at the start of a shard before its first segment: checkpoint slots A and B.
pub const SHARD_HEADER_BLOCKS: u64 = 2;
pub const SHARDS_MAX: u32 = 64;
/// Fewest segments a shard can work with: journal, checkpoint, cleaner reserve.
pub const SEGMENTS_MIN: u32 = 8;
/// Bytes of a record's metadata that fit in its header block.
pub const RECORD_HEADER_LEN: usize = 64;
pub const INLINE_META: usize = BLOCK - RECORD_HEADER_LEN;
/// Checkpoint segments one slot can list.
pub const CKPT_SEGMENTS_MAX: usize = 900;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("bad magic: not a Carmine native store ({0})")]
    Magic(&'static str),
    #[error(
        "unsupported format version {found} (this build reads {FORMAT_VERSION_MIN} to \
         {FORMAT_VERSION}); use a newer carmine"
    )]
    Version { found: u32 },
    #[error("checksum mismatch in {0}")]
    Checksum(&'static str),
    #[error("malformed {0}: {1}")]
    Malformed(&'static str, String),
}

fn decode_err(what: &'static str) -> impl Fn(carmine_types::DecodeError) -> FormatError {
    move |e| FormatError::Malformed(what, e.to_string())
}

/// Appends the crc32c of everything in `buf` so far.
fn seal(buf: &mut BytesMut) {
    let crc = crc32c(buf);
    Encoder::new(buf).u32(crc);
}

/// Checks magic, then the crc32c that follows `body_len` bytes, then the version; returns a
/// decoder positioned after the magic.
fn open_block(
    block: &[u8],
    magic: &[u8; 8],
    what: &'static str,
    body_len: usize,
) -> Result<Decoder, FormatError> {
    if block.len() < body_len + 4 || &block[..8] != magic {
        return Err(FormatError::Magic(what));
    }
    let stored = u32::from_le_bytes(block[body_len..body_len + 4].try_into().unwrap());
    if crc32c(&block[..body_len]) != stored {
        return Err(FormatError::Checksum(what));
    }
    let mut d = Decoder::new(Bytes::copy_from_slice(&block[8..body_len]));
    let version = d.u32("version").map_err(decode_err(what))?;
    if !(FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&version) {
        return Err(FormatError::Version { found: version });
    }
    Ok(d)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    /// Byte offset of the shard on the device.
    pub base: u64,
    pub segments: u32,
}

/// Block 0 of the device: the geometry every shard is mounted with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The format the store is written in (a store older than this build's is mounted
    /// read-only until upgraded).
    pub version: u32,
    pub uuid: u128,
    pub segment_size: u32,
    pub shards: Vec<ShardLayout>,
}

impl Superblock {
    /// Splits a device of `device_size` bytes into `shards` equal partitions of whole segments.
    pub fn layout(
        device_size: u64,
        shards: u32,
        segment_size: u32,
        uuid: u128,
    ) -> Result<Self, String> {
        if shards == 0 || shards > SHARDS_MAX {
            return Err(format!("{shards} shards: must be 1..={SHARDS_MAX}"));
        }
        if !(segment_size as usize).is_multiple_of(BLOCK) || (segment_size as usize) < 16 * BLOCK {
            return Err(format!(
                "segment size {segment_size} must be a multiple of {BLOCK} and at least {}",
                16 * BLOCK
            ));
        }
        let usable = device_size.saturating_sub(SHARD_ALIGN);
        let per_shard = usable / shards as u64 / SHARD_ALIGN * SHARD_ALIGN;
        let header = SHARD_HEADER_BLOCKS * BLOCK as u64;
        let segments = per_shard.saturating_sub(header) / segment_size as u64;
        if segments < SEGMENTS_MIN as u64 {
            return Err(format!(
                "a {device_size}-byte device gives each of {shards} shards {segments} segments \
                 of {segment_size} bytes; at least {SEGMENTS_MIN} are needed"
            ));
        }
        let segments = segments.min(u32::MAX as u64) as u32;
        let shards = (0..shards as u64)
            .map(|i| ShardLayout {
                base: SHARD_ALIGN + i * per_shard,
                segments,
            })
            .collect();
        Ok(Self {
            version: FORMAT_VERSION,
            uuid,
            segment_size,
            shards,
        })
    }

    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(BLOCK);
        b.extend_from_slice(SUPER_MAGIC);
        let mut e = Encoder::new(&mut b);
        e.u32(self.version)
            .u32(BLOCK as u32)
            .u32(self.segment_size)
            .u64(self.uuid as u64)
            .u64((self.uuid >> 64) as u64)
            .u32(self.shards.len() as u32);
        for s in &self.shards {
            e.u64(s.base).u32(s.segments);
        }
        seal(&mut b);
        b.freeze()
    }

    pub fn decode(block: &[u8]) -> Result<Self, FormatError> {
        const WHAT: &str = "superblock";
        if block.len() < 40 || &block[..8] != SUPER_MAGIC {
            return Err(FormatError::Magic(WHAT));
        }
        let shards = u32::from_le_bytes(block[36..40].try_into().unwrap());
        if shards == 0 || shards > SHARDS_MAX {
            return Err(FormatError::Malformed(WHAT, format!("{shards} shards")));
        }
        let body_len = 40 + shards as usize * 12;
        let mut d = open_block(block, SUPER_MAGIC, WHAT, body_len)?;
        let err = decode_err(WHAT);
        let block_size = d.u32("block size").map_err(&err)?;
        if block_size as usize != BLOCK {
            return Err(FormatError::Malformed(
                WHAT,
                format!("block size {block_size}"),
            ));
        }
        let segment_size = d.u32("segment size").map_err(&err)?;
        let lo = d.u64("uuid").map_err(&err)? as u128;
        let hi = d.u64("uuid").map_err(&err)? as u128;
        d.u32("shards").map_err(&err)?;
        let mut layouts = Vec::with_capacity(shards as usize);
        for _ in 0..shards {
            layouts.push(ShardLayout {
                base: d.u64("shard base").map_err(&err)?,
                segments: d.u32("shard segments").map_err(&err)?,
            });
        }
        if !(segment_size as usize).is_multiple_of(BLOCK) || segment_size == 0 {
            return Err(FormatError::Malformed(
                WHAT,
                format!("segment size {segment_size}"),
            ));
        }
        Ok(Self {
            version: u32::from_le_bytes(block[8..12].try_into().unwrap()),
            uuid: lo | hi << 64,
            segment_size,
            shards: layouts,
        })
    }
}

/// Where journal replay starts: the first record not covered by a checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct JournalPos {
    pub segment: u32,
    pub segment_seq: u64,
    /// Block within the segment.
    pub block: u32,
    pub record_seq: u64,
}

/// A checkpoint slot (two per shard, written alternately): names the newest checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointSlot {
    pub shard: u32,
    pub uuid: u128,
    pub generation: u64,
    pub journal: JournalPos,
    /// The highest segment sequence ever handed out, so new ones keep increasing.
    pub segment_seq_max: u64,
    pub blob_len: u64,
    pub blob_crc: u32,
    /// Segments holding the checkpoint blob, in order (data from block 1 of each).
    pub segments: Vec<u32>,
    /// The root node of the checkpoint's metadata tree (format 4; then there is no blob),
    /// as a block of the shard.
    pub tree_root: Option<u64>,
}

/// A slot's `tree_root` field when the checkpoint is a blob.
const NO_TREE: u64 = u64::MAX;

impl CheckpointSlot {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(BLOCK);
        b.extend_from_slice(SLOT_MAGIC);
        let mut e = Encoder::new(&mut b);
        e.u32(FORMAT_VERSION)
            .u32(self.segments.len() as u32)
            .u32(self.shard)
            .u64(self.uuid as u64)
            .u64((self.uuid >> 64) as u64)
            .u64(self.generation)
            .u32(self.journal.segment)
            .u64(self.journal.segment_seq)
            .u32(self.journal.block)
            .u64(self.journal.record_seq)
            .u64(self.segment_seq_max)
            .u64(self.blob_len)
            .u32(self.blob_crc);
        for s in &self.segments {
            e.u32(*s);
        }
        e.u64(self.tree_root.unwrap_or(NO_TREE));
        seal(&mut b);
        b.freeze()
    }

    pub fn decode(block: &[u8]) -> Result<Self, FormatError> {
        const WHAT: &str = "checkpoint slot";
        if block.len() < 16 || &block[..8] != SLOT_MAGIC {
            return Err(FormatError::Magic(WHAT));
        }
        let n = u32::from_le_bytes(block[12..16].try_into().unwrap()) as usize;
        if n > CKPT_SEGMENTS_MAX {
            return Err(FormatError::Malformed(WHAT, format!("{n} segments")));
        }
        // Slots of format 4 on end with the tree root.
        let version = u32::from_le_bytes(block[8..12].try_into().unwrap());
        let root_len = if version >= 4 { 8 } else { 0 };
        let body_len = 8 + 4 + 4 + 4 + 16 + 8 + 4 + 8 + 4 + 8 + 8 + 8 + 4 + 4 * n + root_len;
        let mut d = open_block(block, SLOT_MAGIC, WHAT, body_len)?;
        let err = decode_err(WHAT);
        d.u32("count").map_err(&err)?;
        let shard = d.u32("shard").map_err(&err)?;
        let lo = d.u64("uuid").map_err(&err)? as u128;
        let hi = d.u64("uuid").map_err(&err)? as u128;
        let generation = d.u64("generation").map_err(&err)?;
        let journal = JournalPos {
            segment: d.u32("journal segment").map_err(&err)?,
            segment_seq: d.u64("journal segment seq").map_err(&err)?,
            block: d.u32("journal block").map_err(&err)?,
            record_seq: d.u64("journal record seq").map_err(&err)?,
        };
        let segment_seq_max = d.u64("segment seq max").map_err(&err)?;
        let blob_len = d.u64("blob len").map_err(&err)?;
        let blob_crc = d.u32("blob crc").map_err(&err)?;
        let segments = (0..n)
            .map(|_| d.u32("segment").map_err(&err))
            .collect::<Result<_, _>>()?;
        let tree_root = match root_len {
            0 => None,
            _ => Some(d.u64("tree root").map_err(&err)?).filter(|&r| r != NO_TREE),
        };
        Ok(Self {
            shard,
            uuid: lo | hi << 64,
            generation,
            journal,
            segment_seq_max,
            blob_len,
            blob_crc,
            segments,
            tree_root,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentKind {
    Journal = 1,
    Checkpoint = 2,
}

/// Block 0 of every written segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub uuid: u128,
    pub shard: u32,
    pub kind: SegmentKind,
    pub seq: u64,
    /// Random per opening: records carry it, so records left from an earlier use of the
    /// segment are recognised as stale.
    pub nonce: u64,
}

const SEGMENT_HEADER_BODY: usize = 8 + 4 + 16 + 4 + 1 + 8 + 8;

impl SegmentHeader {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(64);
        b.extend_from_slice(SEGMENT_MAGIC);
        Encoder::new(&mut b)
            .u32(FORMAT_VERSION)
            .u64(self.uuid as u64)
            .u64((self.uuid >> 64) as u64)
            .u32(self.shard)
            .u8(self.kind as u8)
            .u64(self.seq)
            .u64(self.nonce);
        seal(&mut b);
        b.freeze()
    }

    pub fn decode(block: &[u8]) -> Result<Self, FormatError> {
        const WHAT: &str = "segment header";
        let mut d = open_block(block, SEGMENT_MAGIC, WHAT, SEGMENT_HEADER_BODY)?;
        let err = decode_err(WHAT);
        let lo = d.u64("uuid").map_err(&err)? as u128;
        let hi = d.u64("uuid").map_err(&err)? as u128;
        let shard = d.u32("shard").map_err(&err)?;
        let kind = match d.u8("kind").map_err(&err)? {
            1 => SegmentKind::Journal,
            2 => SegmentKind::Checkpoint,
            k => return Err(FormatError::Malformed(WHAT, format!("segment kind {k}"))),
        };
        Ok(Self {
            uuid: lo | hi << 64,
            shard,
            kind,
            seq: d.u64("seq").map_err(&err)?,
            nonce: d.u64("nonce").map_err(&err)?,
        })
    }
}

/// The fixed part at the start of a journal record. The record is `total_blocks` long:
/// this header and up to `INLINE_META` bytes of metadata in its first block, then
/// `data_blocks` data blocks, then the rest of the metadata, padded to a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub seq: u64,
    pub nonce: u64,
    pub meta_len: u32,
    pub data_blocks: u32,
    pub total_blocks: u32,
    /// Version 2: crc32c over the metadata bytes. Version 1: over the metadata, then every
    /// data block.
    pub payload_crc: u32,
    /// Format version the record was written with.
    pub version: u32,
    /// Version 2: the highest record sequence known durable when this record was built
    /// (0: none). A damaged record at or below a later record's mark was acknowledged, so
    /// replay must not end there.
    pub durable_seq: u64,
}

impl RecordHeader {
    pub fn blocks_for(meta_len: usize, data_blocks: usize) -> usize {
        1 + data_blocks + meta_len.saturating_sub(INLINE_META).div_ceil(BLOCK)
    }

    pub fn encode_into(&self, out: &mut [u8]) {
        let mut b = BytesMut::with_capacity(RECORD_HEADER_LEN);
        Encoder::new(&mut b)
            .u32(RECORD_MAGIC)
            .u32(self.version)
            .u64(self.seq)
            .u64(self.nonce)
            .u32(self.meta_len)
            .u32(self.data_blocks)
            .u32(self.total_blocks)
            .u32(self.payload_crc)
            .u64(self.durable_seq);
        b.resize(RECORD_HEADER_LEN - 4, 0);
        seal(&mut b);
        out[..RECORD_HEADER_LEN].copy_from_slice(&b);
    }

    /// `None` when the block does not hold a valid record header (end of the journal).
    pub fn decode(block: &[u8]) -> Option<Self> {
        if block.len() < RECORD_HEADER_LEN || block[..4] != RECORD_MAGIC.to_le_bytes() {
            return None;
        }
        let body = &block[..RECORD_HEADER_LEN - 4];
        let stored = u32::from_le_bytes(
            block[RECORD_HEADER_LEN - 4..RECORD_HEADER_LEN]
                .try_into()
                .ok()?,
        );
        if crc32c(body) != stored {
            return None;
        }
        let mut d = Decoder::new(Bytes::copy_from_slice(body));
        if d.u32("magic").ok()? != RECORD_MAGIC {
            return None;
        }
        let version = d.u32("version").ok()?;
        if !(FORMAT_VERSION_MIN..=FORMAT_VERSION).contains(&version) {
            return None;
        }
        let mut h = Self {
            seq: d.u64("seq").ok()?,
            nonce: d.u64("nonce").ok()?,
            meta_len: d.u32("meta len").ok()?,
            data_blocks: d.u32("data blocks").ok()?,
            total_blocks: d.u32("total blocks").ok()?,
            payload_crc: d.u32("payload crc").ok()?,
            version,
            durable_seq: 0,
        };
        if version >= 2 {
            h.durable_seq = d.u64("durable seq").ok()?;
        }
        let expect = Self::blocks_for(h.meta_len as usize, h.data_blocks as usize);
        (expect == h.total_blocks as usize).then_some(h)
    }
}

#[cfg(test)]
mod golden;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trips_and_rejects_damage() {
        let sb = Superblock::layout(1 << 30, 2, 1 << 20, 0xfeed_beef).unwrap();
        assert_eq!(sb.shards.len(), 2);
        assert!(sb.shards[1].base >= sb.shards[0].base + sb.shards[0].segments as u64 * (1 << 20));
        let enc = sb.encode();
        assert_eq!(Superblock::decode(&enc).unwrap(), sb);
        let mut bad = enc.to_vec();
        bad[20] ^= 1;
        assert_eq!(
            Superblock::decode(&bad),
            Err(FormatError::Checksum("superblock"))
        );
        let mut bad = enc.to_vec();
        bad[0] = b'X';
        assert!(matches!(
            Superblock::decode(&bad),
            Err(FormatError::Magic(_))
        ));
        assert!(Superblock::decode(&[0u8; 4096]).is_err());
        assert!(Superblock::layout(4 << 20, 1, 1 << 20, 1).is_err());
    }

    #[test]
    fn superblock_with_a_future_version_is_refused() {
        let sb = Superblock::layout(1 << 30, 1, 1 << 20, 7).unwrap();
        let mut enc = sb.encode().to_vec();
        enc[8] = FORMAT_VERSION as u8 + 1;
        let body = enc.len() - 4;
        let crc = crc32c(&enc[..body]);
        enc[body..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            Superblock::decode(&enc),
            Err(FormatError::Version {
                found: FORMAT_VERSION + 1
            })
        );
    }

    #[test]
    fn slot_segment_and_record_headers_round_trip() {
        let slot = CheckpointSlot {
            shard: 3,
            uuid: u128::MAX - 5,
            generation: 9,
            journal: JournalPos {
                segment: 4,
                segment_seq: 77,
                block: 12,
                record_seq: 1000,
            },
            segment_seq_max: 80,
            blob_len: 12345,
            blob_crc: 0xabcdef,
            segments: vec![1, 2, 9],
            tree_root: None,
        };
        assert_eq!(CheckpointSlot::decode(&slot.encode()).unwrap(), slot);
        let tree = CheckpointSlot {
            segments: vec![],
            blob_len: 0,
            blob_crc: 0,
            tree_root: Some(4242),
            ..slot
        };
        assert_eq!(CheckpointSlot::decode(&tree.encode()).unwrap(), tree);
        let sh = SegmentHeader {
            uuid: 42,
            shard: 1,
            kind: SegmentKind::Journal,
            seq: 5,
            nonce: 99,
        };
        assert_eq!(SegmentHeader::decode(&sh.encode()).unwrap(), sh);
        let rh = RecordHeader {
            seq: 8,
            nonce: 99,
            meta_len: 5000,
            data_blocks: 3,
            total_blocks: RecordHeader::blocks_for(5000, 3) as u32,
            payload_crc: 1,
            version: FORMAT_VERSION,
            durable_seq: 7,
        };
        let mut block = vec![0u8; BLOCK];
        rh.encode_into(&mut block);
        assert_eq!(RecordHeader::decode(&block), Some(rh));
        block[9] ^= 4;
        assert_eq!(RecordHeader::decode(&block), None);
        assert_eq!(RecordHeader::decode(&[0u8; BLOCK]), None);
    }
}
