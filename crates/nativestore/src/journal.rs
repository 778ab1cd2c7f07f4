//! Group commit. Transactions append their data blocks and metadata deltas to the open batch;
//! a batch becomes one journal record, written with one device write. Whoever waits for
//! durability while no write is in flight becomes the writer ("leader") and writes every
//! batch gathered so far, then syncs once; the others wait and are all woken. So the batch
//! grows exactly while the device is busy — no timer, no background task, any executor.

use crate::device::{AlignedBuf, BLOCK};
use crate::format::{RecordHeader, SegmentHeader, FORMAT_VERSION, INLINE_META, RECORD_HEADER_LEN};
use bytes::{Bytes, BytesMut};
use carmine_types::crc32c_append;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::task::{Poll, Waker};

/// Wakes every task waiting for "something changed" (a write completed, space was freed).
#[derive(Default)]
pub struct Notify {
    generation: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
}

impl Notify {
    pub fn generation(&self) -> u64 {
        self.generation.get()
    }
    pub fn notify_all(&self) {
        self.generation.set(self.generation.get() + 1);
        let wakers = std::mem::take(&mut *self.wakers.borrow_mut());
        for w in wakers {
            w.wake();
        }
    }
    /// Waits until `notify_all` is called after `seen` was read.
    pub async fn wait(&self, seen: u64) {
        std::future::poll_fn(|cx| {
            if self.generation.get() != seen {
                Poll::Ready(())
            } else {
                self.wakers.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// One future journal record being filled.
pub struct Batch {
    pub id: u64,
    /// Device block (shard-relative) of the record header.
    pub start: u64,
    /// Set when this record opens its segment: the header is written in the same I/O.
    pub segment_header: Option<SegmentHeader>,
    pub record_seq: u64,
    pub nonce: u64,
    pub meta: BytesMut,
    pub data: Vec<Bytes>,
    /// Blocks the record may grow to without leaving its segment.
    pub room: u64,
}

impl Batch {
    pub fn blocks(&self) -> u64 {
        RecordHeader::blocks_for(self.meta.len(), self.data.len()) as u64
    }
    pub fn fits(&self, extra_meta: usize, extra_data: usize) -> bool {
        RecordHeader::blocks_for(self.meta.len() + extra_meta, self.data.len() + extra_data) as u64
            <= self.room
    }
    /// Device block the next data block will land on.
    pub fn next_data_block(&self) -> u64 {
        self.start + 1 + self.data.len() as u64
    }
    /// The device blocks its data blocks go to.
    pub fn data_blocks(&self) -> impl Iterator<Item = u64> {
        let first = self.start + 1;
        first..first + self.data.len() as u64
    }

    /// The bytes to write and the device block to write them at. `durable_seq` is the
    /// highest record known durable now: replay uses it to tell a torn tail from damage.
    pub fn serialize(&self, durable_seq: u64) -> (AlignedBuf, u64) {
        let blocks = self.blocks() as usize;
        let lead = usize::from(self.segment_header.is_some());
        // The metadata only: every data block has its own checksum in its SetExtent delta,
        // so one bad data block costs that block, not the record and all after it.
        let mut header = [0u8; RECORD_HEADER_LEN];
        RecordHeader {
            seq: self.record_seq,
            nonce: self.nonce,
            meta_len: self.meta.len() as u32,
            data_blocks: self.data.len() as u32,
            total_blocks: blocks as u32,
            payload_crc: crc32c_append(0, &self.meta),
            version: FORMAT_VERSION,
            durable_seq,
        }
        .encode_into(&mut header);
        let inline = self.meta.len().min(INLINE_META);
        // Segment header block, record header block (header and inline metadata), data
        // blocks, overflow metadata: in device order, each byte written once.
        let buf = AlignedBuf::assemble((blocks + lead) * BLOCK, |out| {
            if let Some(h) = &self.segment_header {
                out.put(&h.encode());
                out.zeros_to(BLOCK);
            }
            out.put(&header);
            out.put(&self.meta[..inline]);
            out.zeros_to((lead + 1) * BLOCK);
            for d in &self.data {
                assert_eq!(d.len(), BLOCK, "a record's data block is a whole block");
                out.put(d);
            }
            out.put(&self.meta[inline..]);
        });
        let at = self.start - lead as u64;
        (buf, at)
    }
}

/// Where the journal stands: the segment it appends to, the batches being gathered and
/// written, and how far they are durable. Batches get increasing ids; those gathered but not
/// taken by a writer are `open` and `sealed`; a writer takes them all; a batch counts as
/// durable only once it and every batch before it are written and synced.
pub(crate) struct JournalState {
    /// The segment being appended to, its sequence and nonce.
    pub seg: u32,
    pub seg_seq: u64,
    pub nonce: u64,
    /// Its header still has to go out with the first record.
    pub seg_header_pending: bool,
    /// Next free block (shard-relative).
    pub wp: u64,
    pub next_record_seq: u64,
    pub open: Option<Batch>,
    pub sealed: VecDeque<Batch>,
    /// The id of the newest batch gathered.
    pub next_batch: u64,
    pub durable_batch: u64,
    /// Highest batch handed to a writer.
    pub taken_batch: u64,
    pub writes_in_flight: u32,
    /// Batch ranges written and synced but not yet contiguous with `durable_batch`, with the
    /// record sequence of the last batch of each.
    pub written: Vec<(u64, u64, u64)>,
    /// The record sequence of `durable_batch` (0: none yet).
    pub durable_record_seq: u64,
    /// The highest batch anyone waits for; the committer writes up to it.
    pub wanted_batch: u64,
    /// A shard-owned committer task is running (`background`): waiters leave journal
    /// writes to it instead of writing themselves.
    pub committer: bool,
    pub blocks_since_checkpoint: u64,
}

impl JournalState {
    /// The journal as mount leaves it: everything replayed is on the device, the next record
    /// is `next_record_seq`, and no segment is open yet (`roll_segment` opens one).
    pub fn after_replay(seg: u32, seg_seq: u64, next_record_seq: u64) -> Self {
        Self {
            seg,
            seg_seq,
            nonce: 0,
            seg_header_pending: false,
            wp: 0,
            next_record_seq,
            open: None,
            sealed: VecDeque::new(),
            next_batch: 0,
            durable_batch: 0,
            taken_batch: 0,
            writes_in_flight: 0,
            written: Vec::new(),
            durable_record_seq: next_record_seq - 1,
            wanted_batch: 0,
            committer: false,
            blocks_since_checkpoint: 0,
        }
    }

    /// A writer wrote and synced `batches` (taken together, in id order): advances the
    /// durable mark over every range now contiguous with it.
    pub fn published(&mut self, batches: &[Batch]) {
        let (Some(first), Some(last)) = (batches.first(), batches.last()) else {
            return;
        };
        self.blocks_since_checkpoint += batches.iter().map(Batch::blocks).sum::<u64>();
        self.written.push((first.id, last.id, last.record_seq));
        while let Some(i) = self
            .written
            .iter()
            .position(|&(first, _, _)| first == self.durable_batch + 1)
        {
            let (_, last, seq) = self.written.swap_remove(i);
            self.durable_batch = last;
            self.durable_record_seq = seq;
        }
        self.check_accounting();
    }

    /// What acknowledging a write relies on: nothing counts as durable that was not handed
    /// to a writer, nothing handed to a writer that was not gathered, and record sequences
    /// agree. A violation is a bug that could acknowledge a write before it is on the
    /// device, so it stops the process rather than go on.
    pub fn check_accounting(&self) {
        assert!(
            self.durable_batch <= self.taken_batch && self.taken_batch <= self.next_batch,
            "journal accounting: durable batch {} <= taken {} <= gathered {} does not hold",
            self.durable_batch,
            self.taken_batch,
            self.next_batch
        );
        assert!(
            self.durable_record_seq < self.next_record_seq,
            "journal accounting: durable record {} is not below the next record {}",
            self.durable_record_seq,
            self.next_record_seq
        );
        assert!(
            self.written
                .iter()
                .all(|&(first, last, _)| first > self.durable_batch + 1 && first <= last),
            "journal accounting: written ranges {:?} overlap the durable batch {}",
            self.written,
            self.durable_batch
        );
    }
}

/// A record read back from the device.
pub struct ParsedRecord<'a> {
    pub header: RecordHeader,
    pub meta: Vec<u8>,
    /// The data blocks, in order, as stored.
    pub data: &'a [u8],
}

/// Parses the record at the start of `area` (block-aligned bytes read from a segment), or
/// `None` when there is no valid record with this sequence number and nonce there. A valid
/// record's metadata is intact; its data blocks are for the caller to check one by one.
pub fn parse_record(area: &[u8], seq: u64, nonce: u64) -> Option<ParsedRecord<'_>> {
    let header = parse_header(area, nonce)?;
    if header.seq != seq {
        return None;
    }
    let total = header.total_blocks as usize * BLOCK;
    if total > area.len() {
        return None;
    }
    let data_len = header.data_blocks as usize * BLOCK;
    let meta = gather_meta(&header, &area[..BLOCK], &area[BLOCK + data_len..total]);
    let data = &area[BLOCK..BLOCK + data_len];
    let crc = match header.version {
        1 => crc32c_append(crc32c_append(0, &meta), data),
        _ => crc32c_append(0, &meta),
    };
    (crc == header.payload_crc).then_some(ParsedRecord { header, meta, data })
}

/// The metadata of a record whose checksum covers only its metadata (version 2 on), from its
/// first block `head` and the blocks after its data, `overflow`, which its header counts;
/// `None` if it fails that checksum. The data blocks are not needed: each has its own.
pub fn record_meta(header: &RecordHeader, head: &[u8], overflow: &[u8]) -> Option<Vec<u8>> {
    if header.version < 2 {
        return None;
    }
    let meta = gather_meta(header, head, overflow);
    (crc32c_append(0, &meta) == header.payload_crc).then_some(meta)
}

/// The blocks after a record's data that hold the rest of its metadata.
pub fn overflow_blocks(header: &RecordHeader) -> u64 {
    (header.meta_len as usize)
        .saturating_sub(INLINE_META)
        .div_ceil(BLOCK) as u64
}

/// A record's metadata: what its first block holds inline, then the rest from `overflow`.
/// The header was decoded from `head`, and `overflow` holds its overflow blocks, so the
/// lengths are in range.
fn gather_meta(header: &RecordHeader, head: &[u8], overflow: &[u8]) -> Vec<u8> {
    let meta_len = header.meta_len as usize;
    let inline = meta_len.min(INLINE_META);
    let mut meta = Vec::with_capacity(meta_len);
    meta.extend_from_slice(&head[RECORD_HEADER_LEN..RECORD_HEADER_LEN + inline]);
    meta.extend_from_slice(&overflow[..meta_len - inline]);
    meta
}

/// The record header at the start of `area` if there is a valid one of this segment opening
/// (`nonce`), whatever its sequence.
pub fn parse_header(area: &[u8], nonce: u64) -> Option<RecordHeader> {
    if area.len() < BLOCK {
        return None;
    }
    RecordHeader::decode(&area[..BLOCK]).filter(|h| h.nonce == nonce)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::SegmentKind;

    /// The record as it was built before `AlignedBuf::assemble`: a zeroed buffer, each part
    /// copied to its place.
    fn reference(b: &Batch, durable_seq: u64) -> Vec<u8> {
        let lead = usize::from(b.segment_header.is_some());
        let mut out = vec![0u8; (b.blocks() as usize + lead) * BLOCK];
        if let Some(h) = &b.segment_header {
            let enc = h.encode();
            out[..enc.len()].copy_from_slice(&enc);
        }
        let rec = &mut out[lead * BLOCK..];
        let inline = b.meta.len().min(INLINE_META);
        rec[RECORD_HEADER_LEN..RECORD_HEADER_LEN + inline].copy_from_slice(&b.meta[..inline]);
        for (i, d) in b.data.iter().enumerate() {
            rec[(1 + i) * BLOCK..(2 + i) * BLOCK].copy_from_slice(d);
        }
        let ostart = (1 + b.data.len()) * BLOCK;
        rec[ostart..ostart + b.meta.len() - inline].copy_from_slice(&b.meta[inline..]);
        RecordHeader {
            seq: b.record_seq,
            nonce: b.nonce,
            meta_len: b.meta.len() as u32,
            data_blocks: b.data.len() as u32,
            total_blocks: b.blocks() as u32,
            payload_crc: crc32c_append(0, &b.meta),
            version: FORMAT_VERSION,
            durable_seq,
        }
        .encode_into(rec);
        out
    }

    fn batch(meta_len: usize, data_blocks: usize, opens_segment: bool) -> Batch {
        Batch {
            id: 1,
            start: 10,
            segment_header: opens_segment.then_some(SegmentHeader {
                uuid: 7,
                shard: 0,
                kind: SegmentKind::Journal,
                seq: 3,
                nonce: 99,
            }),
            record_seq: 42,
            nonce: 99,
            meta: (0..meta_len).map(|i| (i % 251) as u8 + 1).collect(),
            data: (0..data_blocks)
                .map(|i| Bytes::from(vec![0xa0 + i as u8; BLOCK]))
                .collect(),
            room: 1 << 20,
        }
    }

    #[test]
    fn a_record_is_laid_out_as_its_format_says_and_parses_back() {
        for opens_segment in [false, true] {
            for meta_len in [
                0,
                1,
                INLINE_META - 1,
                INLINE_META,
                INLINE_META + 1,
                3 * BLOCK + 5,
            ] {
                for data_blocks in [0, 1, 16] {
                    let b = batch(meta_len, data_blocks, opens_segment);
                    let (buf, at) = b.serialize(41);
                    let lead = usize::from(opens_segment);
                    assert_eq!(at, b.start - lead as u64);
                    assert_eq!(
                        buf.as_slice(),
                        &reference(&b, 41)[..],
                        "meta {meta_len}, {data_blocks} data blocks, segment header \
                         {opens_segment}"
                    );
                    let parsed =
                        parse_record(&buf.as_slice()[lead * BLOCK..], 42, 99).expect("parses back");
                    assert_eq!(parsed.meta, &b.meta[..]);
                    assert_eq!(parsed.data.len(), data_blocks * BLOCK);
                    assert_eq!(parsed.header.durable_seq, 41);
                }
            }
        }
    }
}
