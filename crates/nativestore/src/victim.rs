//! What the cleaner reads of its victim segment: the records' headers and metadata first,
//! then only the data blocks still live, never the whole segment (32 MiB by default). A
//! record's data sits between its header block and the rest of its metadata, and each data
//! block has its own checksum in the *set extent* delta that placed it, so neither step
//! needs the dead blocks.

use crate::delta::Delta;
use crate::device::{AlignedBuf, BlockDevice, BLOCK};
use crate::extents::Extent;
use crate::format::{RecordHeader, SegmentHeader};
use crate::journal::{overflow_blocks, parse_header, parse_record, record_meta};
use crate::store::{io_error, NativeStore};
use bytes::Bytes;
use carmine_store::Result;
use carmine_types::{CollectionId, Decoder};

/// Blocks read at once while records are small (a few blocks each): their headers sit close
/// together, and one read brings many.
const WINDOW_BLOCKS: u64 = 128;
/// A record at least this long is followed by a header read alone: reading ahead would bring
/// mostly its data or the next one's.
const LARGE_RECORD_BLOCKS: u64 = 16;
/// The longest read of live data blocks; runs of live blocks with gaps of at most
/// `LIVE_GAP_BLOCKS` dead ones between them are read as one.
const LIVE_READ_BLOCKS: u64 = 256;
const LIVE_GAP_BLOCKS: u64 = 4;

/// A *set extent* delta met in a victim's record: where that record's data blocks are.
pub(crate) struct Placed {
    pub rec_start: u64,
    pub data_blocks: u64,
    pub cid: CollectionId,
    pub oid: String,
    pub lblock: u64,
    pub extent: Extent,
}

/// A block of the victim that is still live (its object's map points at it).
pub(crate) struct LiveBlock {
    pub cid: CollectionId,
    pub oid: String,
    pub lblock: u64,
    pub paddr: u64,
    pub crc: u32,
}

/// Reads blocks of one segment through a window, so headers close together cost one read.
struct SegmentReader<'s, D: BlockDevice> {
    store: &'s NativeStore<D>,
    victim: u32,
    /// The segment's first block and its length in blocks.
    start: u64,
    blocks: u64,
    /// The window: its first block (relative to the segment) and its bytes.
    at: u64,
    window: AlignedBuf,
    read_blocks: u64,
}

impl<'s, D: BlockDevice> SegmentReader<'s, D> {
    /// Blocks `from..from + n` of the segment (relative to its start); when the window does
    /// not hold them, it is replaced by a read of `max(n, ahead)` blocks from `from` (less at
    /// the segment's end). `None` past the segment's end.
    async fn get(&mut self, from: u64, n: u64, ahead: u64) -> Result<Option<&[u8]>> {
        if from + n > self.blocks {
            return Ok(None);
        }
        let held = self.window.len() as u64 / BLOCK as u64;
        if from < self.at || from + n > self.at + held {
            let len = n.max(ahead).min(self.blocks - from);
            // A device read fills the buffer's whole capacity: sized exactly, never reused.
            let mut buf = AlignedBuf::new(len as usize * BLOCK);
            buf.set_len(len as usize * BLOCK);
            let off = self.store.byte_offset(self.start + from);
            let (res, buf) = self.store.dev.read_at(buf, off).await;
            self.window = buf;
            self.read_blocks += len;
            if let Err(e) = res {
                self.window.clear();
                return Err(io_error(format!(
                    "cleaner reading segment {} at block {from}: {e}",
                    self.victim
                )));
            }
            self.at = from;
        }
        let lo = (from - self.at) as usize * BLOCK;
        Ok(Some(&self.window.as_slice()[lo..lo + n as usize * BLOCK]))
    }
}

impl<D: BlockDevice> NativeStore<D> {
    /// The *set extent* deltas of every valid record in segment `victim`, read without its
    /// data blocks. Counts the blocks read in `cleaner_read_blocks` and in `cost`.
    pub(crate) async fn victim_records(&self, victim: u32, cost: &mut u64) -> Result<Vec<Placed>> {
        let mut r = SegmentReader {
            store: self,
            victim,
            start: self.geo.segment_start(victim),
            blocks: self.geo.segment_blocks,
            at: 0,
            window: AlignedBuf::new(0),
            read_blocks: 0,
        };
        let result = self.walk_records(&mut r).await;
        self.st.borrow_mut().stats.cleaner_read_blocks += r.read_blocks;
        *cost += r.read_blocks;
        result
    }

    async fn walk_records(&self, r: &mut SegmentReader<'_, D>) -> Result<Vec<Placed>> {
        let victim = r.victim;
        // The segment's header and its first record's: how far to read ahead is decided by
        // the records met.
        let header = r.get(0, 1, 2).await?.map(SegmentHeader::decode);
        let Some(Ok(header)) = header else {
            return Err(io_error(format!(
                "segment {victim} holds live data but its header is unreadable"
            )));
        };
        let mut placed = Vec::new();
        let mut at = 1u64;
        let mut seq = None;
        let mut ahead = 1;
        // Records follow each other with consecutive sequence numbers from the first; the
        // first that does not parse ends the segment's records (as replay reads them).
        while let Some(head) = r.get(at, 1, ahead).await? {
            let Some(h) = parse_header(head, header.nonce) else {
                break;
            };
            let want = *seq.get_or_insert(h.seq);
            if h.seq != want {
                break;
            }
            let total = h.total_blocks as u64;
            let meta = match self.record_meta_at(r, at, &h).await? {
                Some(meta) => meta,
                None => break,
            };
            let mut d = Decoder::new(Bytes::from(meta));
            while d.remaining() > 0 {
                let Ok(delta) = Delta::decode(&mut d) else {
                    break;
                };
                if let Delta::SetExtent {
                    cid,
                    oid,
                    lblock,
                    extent,
                } = delta
                {
                    placed.push(Placed {
                        rec_start: r.start + at,
                        data_blocks: h.data_blocks as u64,
                        cid,
                        oid,
                        lblock,
                        extent,
                    });
                }
            }
            at += total;
            seq = Some(want + 1);
            ahead = if total >= LARGE_RECORD_BLOCKS {
                1
            } else {
                WINDOW_BLOCKS
            };
        }
        Ok(placed)
    }

    /// The metadata of the record whose header `h` is at block `at`, if it is intact.
    async fn record_meta_at(
        &self,
        r: &mut SegmentReader<'_, D>,
        at: u64,
        h: &RecordHeader,
    ) -> Result<Option<Vec<u8>>> {
        let total = h.total_blocks as u64;
        if at + total > r.blocks {
            // It would run past the segment's end: not a record this segment holds.
            return Ok(None);
        }
        if h.version < 2 {
            // Its checksum covers its data as well: read it whole.
            let Some(area) = r.get(at, total, total).await? else {
                return Ok(None);
            };
            return Ok(parse_record(area, h.seq, h.nonce).map(|p| p.meta));
        }
        let over = overflow_blocks(h);
        let head = match r.get(at, 1, 1).await? {
            Some(head) => head.to_vec(),
            None => return Ok(None),
        };
        if over == 0 {
            return Ok(record_meta(h, &head, &[]));
        }
        let Some(overflow) = r.get(at + total - over, over, over).await? else {
            return Ok(None);
        };
        Ok(record_meta(h, &head, overflow))
    }

    /// The data of `live` (sorted by place), read in runs; one `Bytes` per block, in order.
    /// Counts the blocks read in `cleaner_read_blocks` and in `cost`.
    pub(crate) async fn read_live(&self, live: &[LiveBlock], cost: &mut u64) -> Result<Vec<Bytes>> {
        debug_assert!(live.windows(2).all(|w| w[0].paddr <= w[1].paddr));
        let mut out = Vec::with_capacity(live.len());
        let mut read_blocks = 0;
        let mut i = 0;
        while i < live.len() {
            let first = live[i].paddr;
            let mut j = i + 1;
            while j < live.len()
                && live[j].paddr - live[j - 1].paddr <= LIVE_GAP_BLOCKS + 1
                && live[j].paddr - first < LIVE_READ_BLOCKS
            {
                j += 1;
            }
            let len = live[j - 1].paddr - first + 1;
            // Sized exactly: a device read fills the buffer's whole capacity.
            let mut buf = AlignedBuf::new(len as usize * BLOCK);
            buf.set_len(len as usize * BLOCK);
            let (res, buf) = self.dev.read_at(buf, self.byte_offset(first)).await;
            read_blocks += len;
            *cost += len;
            if let Err(e) = res {
                self.st.borrow_mut().stats.cleaner_read_blocks += read_blocks;
                return Err(io_error(format!(
                    "cleaner reading live blocks at {first}: {e}"
                )));
            }
            for b in &live[i..j] {
                let k = (b.paddr - first) as usize * BLOCK;
                out.push(Bytes::copy_from_slice(&buf.as_slice()[k..k + BLOCK]));
            }
            i = j;
        }
        self.st.borrow_mut().stats.cleaner_read_blocks += read_blocks;
        Ok(out)
    }
}
