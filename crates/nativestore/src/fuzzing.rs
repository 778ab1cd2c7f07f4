//! Entry points for the fuzz targets in `fuzz/`: thin wrappers around the crate-private
//! decoders of everything read back from a device, so each can be driven with hostile bytes.
//! Not a supported API (hidden from the docs); nothing here does I/O.
//!
//! The decoders' contract is the one mount relies on: any bytes give a value or a typed
//! error (`None` for the journal's "no record here") — never a panic, an unbounded
//! allocation or a hang.

use crate::format::SHARD_HEADER_BLOCKS;
use crate::index::{Geometry, Index};
use crate::journal::Batch;
use crate::metatree::{collection_key, object_entries, Loader};
use bytes::{Bytes, BytesMut};
use carmine_types::DecodeError;

pub use crate::delta::Delta;
pub use crate::device::BLOCK;
pub use crate::extents::Extent;
pub use crate::format::{
    CheckpointSlot, FormatError, JournalPos, RecordHeader, SegmentHeader, SegmentKind, Superblock,
    CKPT_SEGMENTS_MAX, FORMAT_VERSION, FORMAT_VERSION_MIN, INLINE_META, RECORD_HEADER_LEN,
    RECORD_MAGIC, SEGMENT_MAGIC, SHARDS_MAX, SLOT_MAGIC, SUPER_MAGIC,
};
pub use crate::index::CHECKPOINT_VERSION;

/// Block 0 of the device (and its backup copy).
pub fn decode_superblock(block: &[u8]) -> Result<Superblock, FormatError> {
    Superblock::decode(block)
}

/// Block 0 or 1 of a shard.
pub fn decode_checkpoint_slot(block: &[u8]) -> Result<CheckpointSlot, FormatError> {
    CheckpointSlot::decode(block)
}

/// Block 0 of a segment.
pub fn decode_segment_header(block: &[u8]) -> Result<SegmentHeader, FormatError> {
    SegmentHeader::decode(block)
}

/// The first block of a journal record; `None` marks the end of the journal.
pub fn decode_record_header(block: &[u8]) -> Option<RecordHeader> {
    RecordHeader::decode(block)
}

/// A record parsed from the start of `area`, as replay sees it: the header, the whole metadata
/// and the data blocks.
pub fn parse_record(area: &[u8], seq: u64, nonce: u64) -> Option<(RecordHeader, Vec<u8>, &[u8])> {
    crate::journal::parse_record(area, seq, nonce).map(|r| (r.header, r.meta, r.data))
}

/// The bytes the journal writer produces for one record of `meta` and `data` (whole blocks).
///
/// # Panics
/// If `data` is not a whole number of blocks: a caller bug, not a decoder input.
pub fn encode_record(seq: u64, nonce: u64, durable_seq: u64, meta: &[u8], data: &[u8]) -> Vec<u8> {
    assert!(
        data.len().is_multiple_of(BLOCK),
        "data must be whole blocks"
    );
    let batch = Batch {
        id: 0,
        start: 0,
        segment_header: None,
        record_seq: seq,
        nonce,
        meta: BytesMut::from(meta),
        data: data
            .chunks_exact(BLOCK)
            .map(Bytes::copy_from_slice)
            .collect(),
        room: u64::MAX,
    };
    let (buf, _) = batch.serialize(durable_seq);
    buf.full().to_vec()
}

/// Decodes a record's metadata into deltas the way replay does: deltas back to back, to the
/// last byte.
pub fn decode_deltas(meta: &[u8]) -> Result<Vec<Delta>, DecodeError> {
    crate::mount::decode_deltas(meta.to_vec())
}

/// One shard's metadata index, for decoding checkpoint blobs and replaying deltas onto them.
pub struct IndexState(Index);

impl IndexState {
    /// An empty index over `segments` segments of `segment_blocks` blocks, laid out as mount
    /// lays out a shard.
    pub fn new(segments: u32, segment_blocks: u64) -> Self {
        Self(Index::new(geometry(segments, segment_blocks)))
    }

    /// Decodes a checkpoint blob (the bytes a checkpoint slot's crc covers).
    pub fn decode(blob: &[u8], segments: u32, segment_blocks: u64) -> Result<Self, DecodeError> {
        Index::decode(
            Bytes::copy_from_slice(blob),
            geometry(segments, segment_blocks),
        )
        .map(Self)
    }

    pub fn encode(&self) -> BytesMut {
        self.0.encode()
    }

    /// Rebuilds an index from metadata tree entries (key, value), in the order given: what
    /// mount does with a format 4 checkpoint's tree.
    pub fn from_tree_entries(
        entries: &[(Vec<u8>, Vec<u8>)],
        segments: u32,
        segment_blocks: u64,
    ) -> Result<Self, DecodeError> {
        let mut loader = Loader::new(geometry(segments, segment_blocks));
        for (k, v) in entries {
            loader.push(k, v)?;
        }
        loader.finish().map(Self)
    }

    /// The metadata tree entries of every record, in key order (what a fresh tree holds).
    pub fn tree_entries(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for (cid, coll) in &self.0.colls {
            out.push((collection_key(*cid), Vec::new()));
            for (oid, o) in coll {
                let body = o.body().expect("the fuzzed index is wholly resident");
                out.extend(object_entries(*cid, oid, o.id, o.size, body));
            }
        }
        out.sort();
        out
    }

    /// Whether every object's record is of the current version (its extents in entries of
    /// their own), as [`IndexState::tree_entries`] writes them.
    pub fn records_current(&self) -> bool {
        self.0.colls.values().flatten().all(|(_, o)| o.extent_keys)
    }

    pub fn apply(&mut self, delta: &Delta) -> Result<(), String> {
        self.0.apply(delta).map_err(|e| e.to_string())
    }

    /// Checks the counters the cleaner and the stats trust against the content: objects,
    /// live blocks in total and per segment.
    pub fn check_counts(&self) -> Result<(), String> {
        let ix = &self.0;
        let objects: u64 = ix.colls.values().map(|c| c.len() as u64).sum();
        if objects != ix.objects {
            return Err(format!("{} objects counted, {objects} held", ix.objects));
        }
        let blocks: u64 = ix
            .colls
            .values()
            .flat_map(|c| c.values())
            .filter_map(|o| o.body())
            .map(|o| o.blocks.blocks())
            .sum();
        if blocks != ix.live_blocks {
            return Err(format!(
                "{} live blocks counted, {blocks} mapped",
                ix.live_blocks
            ));
        }
        let extents: u64 = ix
            .colls
            .values()
            .flat_map(|c| c.values())
            .filter_map(|o| o.body())
            .map(|o| o.blocks.extent_count() as u64)
            .sum();
        if extents != ix.extent_count() {
            return Err(format!(
                "{} extents counted, {extents} mapped",
                ix.extent_count()
            ));
        }
        for o in ix
            .colls
            .values()
            .flat_map(|c| c.values())
            .filter_map(|o| o.body())
        {
            if o.meta_bytes != o.recount_meta() {
                return Err(format!(
                    "an object's metadata counted {} bytes, {} held",
                    o.meta_bytes,
                    o.recount_meta()
                ));
            }
        }
        let encoded = ix.encode().len() as u64;
        if ix.encoded_len() != encoded || ix.recount_encoded() != encoded {
            return Err(format!(
                "checkpoint length kept {}, recounted {}, encoded {encoded}",
                ix.encoded_len(),
                ix.recount_encoded()
            ));
        }
        let per_segment: u64 = ix.segment_live.iter().map(|&n| n as u64).sum();
        if per_segment != ix.live_blocks {
            return Err(format!(
                "{} live blocks counted, {per_segment} over the segments",
                ix.live_blocks
            ));
        }
        Ok(())
    }
}

fn geometry(segments: u32, segment_blocks: u64) -> Geometry {
    Geometry {
        first_block: SHARD_HEADER_BLOCKS,
        segment_blocks,
        segments,
    }
}

/// The fuzz input of the metadata records target: entries as `u8 key length, key, u16 value
/// length (little-endian), value`, up to the first one cut short.
pub fn split_tree_entries(mut data: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let Some((&klen, rest)) = data.split_first() else {
            return out;
        };
        let klen = klen as usize;
        if rest.len() < klen + 2 {
            return out;
        }
        let (key, rest) = rest.split_at(klen);
        let vlen = u16::from_le_bytes([rest[0], rest[1]]) as usize;
        let rest = &rest[2..];
        if rest.len() < vlen {
            return out;
        }
        out.push((key.to_vec(), rest[..vlen].to_vec()));
        data = &rest[vlen..];
    }
}

/// The inverse of [`split_tree_entries`] (keys of at most 255 bytes).
pub fn join_tree_entries(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in entries {
        out.push(k.len() as u8);
        out.extend_from_slice(k);
        out.extend_from_slice(&(v.len() as u16).to_le_bytes());
        out.extend_from_slice(v);
    }
    out
}
