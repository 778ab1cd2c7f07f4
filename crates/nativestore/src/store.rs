//! `NativeStore`: one shard of the log-structured store, and its `ObjectStore` face.
//!
//! State lives in one `RefCell` owned by the shard's reactor; it is never borrowed across an
//! await. Transactions are serialised by `apply_lock` only while they are translated into
//! deltas (which may need old blocks read for a partial overwrite); they wait for durability
//! outside it, which is what lets many of them share one journal write.

use crate::cache::{BlockCache, BlockMap};
use crate::device::{AlignedBuf, BlockDevice, BLOCK};
use crate::error::{BlockReadError, ShardFailure};
use crate::format::{CheckpointSlot, SegmentHeader, SegmentKind};
use crate::index::{BlockRef, Geometry, Index};
use crate::journal::{Batch, JournalState, Notify};
use crate::segments::{SegKind, SegmentTable};
use bytes::{Bytes, BytesMut};
use carmine_store::checks::{
    check_attr_name, check_extent, check_io_len, check_list_limit, check_oid, error,
};
use carmine_store::{
    ObjectStat, ObjectStore, Page, Result, StoreCounter, StoreError, StoreErrorKind, StoreStatfs,
    Transaction,
};
use carmine_types::{crc32c, CollectionId};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Bound;

/// Tunables of one shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeConfig {
    /// Clean data blocks kept in memory for reads and partial overwrites.
    pub cache_bytes: u64,
    /// Data accepted but not yet on the device; beyond it new transactions wait.
    pub dirty_bytes_max: u64,
    /// Journal blocks between checkpoints; 0 picks a quarter of the shard, at most 4 GiB.
    /// The background also checkpoints once changed object bodies pass
    /// `dirty_metadata_bytes` (and a segment of journal was written since the last one).
    pub checkpoint_interval_blocks: u64,
    /// The cleaner starts when free segments fall below this share of all segments.
    pub clean_start_pct: u32,
    /// Writers wait for the cleaner below this share.
    pub throttle_pct: u32,
    /// Journal writes (each a write of one or more records and a sync) in flight at once.
    pub journal_writes_max: u32,
    /// Metadata tree nodes kept in memory between checkpoints.
    pub metadata_cache_bytes: u64,
    /// Object bodies (extent maps, xattrs, omap) kept in memory, counted as the bytes their
    /// records take: clean ones beyond it are paged out after a checkpoint and read back
    /// from the metadata tree when used. Dirty ones stay until the next checkpoint, whatever
    /// the budget (decision 0013, second amendment), or until they pass
    /// `dirty_metadata_bytes`.
    pub object_cache_bytes: u64,
    /// Object bodies changed since the last checkpoint, counted as `object_cache_bytes`
    /// counts them, past which the background writes a checkpoint early (so they may be
    /// paged out). Above the object cache: an early checkpoint pages bodies out that the
    /// next writes read back whole, which cost random writes 45% with an 8 MiB cache
    /// (BENCHMARKS.md, 2026-11-28); this bounds memory on volumes far wider than the cache.
    pub dirty_metadata_bytes: u64,
    /// While clients do I/O, the background cleaner's reads and writes are paced to this many
    /// bytes per second (0: not paced). Writers that clean because space is short (below
    /// `throttle_pct`) never are: client I/O comes first until space is tight.
    pub cleaner_busy_rate_bytes: u64,
}

/// Default for [`NativeConfig::cleaner_busy_rate_bytes`]: no pacing. At 128 MiB/s the
/// background fell behind sustained random writes at high fill, writers cleaned in their own
/// path instead, and their p99.9 latency more than doubled (BENCHMARKS.md, 2026-11-27
/// evening); pacing is for loads whose writes are light next to their reads.
pub const CLEANER_BUSY_RATE_DEFAULT: u64 = 0;

/// The longest default checkpoint interval: 4 GiB of journal.
const INTERVAL_MAX_BLOCKS: u64 = (4 << 30) / crate::BLOCK as u64;

impl NativeConfig {
    /// The metadata cache in tree nodes.
    pub(crate) fn metadata_cache_nodes(&self) -> usize {
        (self.metadata_cache_bytes / crate::BLOCK as u64) as usize
    }
}

impl Default for NativeConfig {
    fn default() -> Self {
        Self {
            cache_bytes: 64 << 20,
            dirty_bytes_max: 32 << 20,
            checkpoint_interval_blocks: 0,
            clean_start_pct: 15,
            throttle_pct: 10,
            journal_writes_max: 1,
            metadata_cache_bytes: 64 << 20,
            object_cache_bytes: 64 << 20,
            dirty_metadata_bytes: 256 << 20,
            cleaner_busy_rate_bytes: CLEANER_BUSY_RATE_DEFAULT,
        }
    }
}

/// Counters a shard keeps about itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NativeStats {
    pub records: u64,
    pub device_writes: u64,
    pub device_bytes_written: u64,
    /// Metadata (delta) bytes in the records written: the map's share of the journal.
    pub journal_meta_bytes: u64,
    pub user_bytes_written: u64,
    /// Transactions applied to the index and queued for the journal (acknowledged once
    /// their batch is durable).
    pub transactions: u64,
    pub checkpoints: u64,
    /// Metadata blocks (tree nodes and segment headers) the checkpoints wrote.
    pub checkpoint_blocks: u64,
    /// Checkpoints that wrote a fresh metadata tree (the first one, and those that found
    /// the tree wasteful).
    pub tree_rewrites: u64,
    /// Of those, the ones written because the checkpoint's changed nodes did not fit the
    /// free room (the store is nearly full, and its tree wasteful).
    pub tree_rewrites_for_room: u64,
    /// The most tree nodes a rewrite held in memory at once (since the shard started): its
    /// read ahead and what the scan has not passed yet, not the tree.
    pub tree_rewrite_nodes_held_max: u64,
    /// Now: nodes of the newest checkpoint's tree, and segments holding metadata.
    pub metadata_nodes: u64,
    /// Now: nodes of the tree held in memory (the node cache, and dirty nodes).
    pub metadata_nodes_loaded: u64,
    pub metadata_segments: u64,
    pub segments_cleaned: u64,
    /// Victims the cleaner gave up on because it could not find every live block in them
    /// (kept, not freed: never a loss, but a sign the maps and the counts disagree).
    pub segments_kept: u64,
    pub blocks_relocated: u64,
    /// Blocks the cleaner read from its victims: record headers and metadata, and live data.
    pub cleaner_read_blocks: u64,
    /// Time the background cleaner paused to keep to its rate while clients did I/O, and the
    /// blocks (read and moved) of the passes it paced.
    pub cleaner_paused_ns: u64,
    pub cleaner_paced_blocks: u64,
    /// Segments the background task's cleaner freed (the rest were freed by writers).
    pub segments_cleaned_background: u64,
    pub checksum_errors: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Object bodies read back from the metadata tree, and the tree nodes read for them
    /// (and for `paged_block_lookups`).
    pub body_reads: u64,
    pub body_node_reads: u64,
    /// Reads of a paged-out object that looked up only the extents of their range.
    pub paged_block_lookups: u64,
    /// Now: object bodies paged out, and the record bytes of those resident.
    pub bodies_paged_out: u64,
    pub body_resident_bytes: u64,
    /// Time spent in journal writes and in their syncs, as the shard saw it (submission to
    /// completion), in nanoseconds.
    pub journal_write_ns: u64,
    pub journal_sync_ns: u64,
}

impl NativeStats {
    /// The stats as metrics (`carmine_native_…`).
    pub fn counters(&self) -> Vec<StoreCounter> {
        let total = |name, help, v: u64| StoreCounter {
            name,
            gauge: false,
            help,
            value: v as f64,
        };
        let gauge = |name, help, v: u64| StoreCounter {
            name,
            gauge: true,
            help,
            value: v as f64,
        };
        let secs = |name, help, ns: u64| StoreCounter {
            name,
            gauge: false,
            help,
            value: ns as f64 / 1e9,
        };
        vec![
            total(
                "native_transactions_total",
                "Transactions the native store shard applied.",
                self.transactions,
            ),
            total(
                "native_journal_records_total",
                "Journal records written (a group commit each).",
                self.records,
            ),
            total(
                "native_device_writes_total",
                "Journal writes to the device.",
                self.device_writes,
            ),
            total(
                "native_device_written_bytes_total",
                "Bytes the journal wrote to the device.",
                self.device_bytes_written,
            ),
            total(
                "native_user_written_bytes_total",
                "Data bytes of the transactions (device_written / this: write amplification).",
                self.user_bytes_written,
            ),
            total(
                "native_journal_metadata_bytes_total",
                "Metadata (delta) bytes in the journal records.",
                self.journal_meta_bytes,
            ),
            secs(
                "native_journal_write_seconds_total",
                "Time journal writes took, submission to completion.",
                self.journal_write_ns,
            ),
            secs(
                "native_journal_sync_seconds_total",
                "Time journal syncs took, submission to completion.",
                self.journal_sync_ns,
            ),
            total(
                "native_checkpoints_total",
                "Checkpoints written.",
                self.checkpoints,
            ),
            total(
                "native_checkpoint_blocks_total",
                "Metadata blocks (tree nodes, segment headers) the checkpoints wrote.",
                self.checkpoint_blocks,
            ),
            total(
                "native_tree_rewrites_total",
                "Checkpoints that wrote the metadata tree afresh.",
                self.tree_rewrites,
            ),
            total(
                "native_tree_rewrites_for_room_total",
                "Metadata tree rewrites made because the changed nodes did not fit the free room.",
                self.tree_rewrites_for_room,
            ),
            gauge(
                "native_tree_rewrite_nodes_held_max",
                "The most metadata tree nodes a rewrite held in memory at once.",
                self.tree_rewrite_nodes_held_max,
            ),
            gauge(
                "native_metadata_nodes",
                "Nodes of the newest checkpoint's metadata tree.",
                self.metadata_nodes,
            ),
            gauge(
                "native_metadata_nodes_loaded",
                "Nodes of the metadata tree held in memory (cached and dirty).",
                self.metadata_nodes_loaded,
            ),
            gauge(
                "native_metadata_segments",
                "Segments holding metadata tree nodes.",
                self.metadata_segments,
            ),
            total(
                "native_segments_cleaned_total",
                "Segments the cleaner freed.",
                self.segments_cleaned,
            ),
            total(
                "native_segments_kept_total",
                "Victim segments the cleaner kept because it could not find every live block \
                 in them (never a loss; a sign the maps and the counts disagree).",
                self.segments_kept,
            ),
            total(
                "native_blocks_relocated_total",
                "Live blocks the cleaner moved.",
                self.blocks_relocated,
            ),
            total(
                "native_cleaner_read_blocks_total",
                "Blocks the cleaner read from its victims (record headers and metadata, then \
                 only the live data blocks).",
                self.cleaner_read_blocks,
            ),
            total(
                "native_segments_cleaned_background_total",
                "Segments the shard's background task freed (the rest of those cleaned were \
                 freed by writers that found space short).",
                self.segments_cleaned_background,
            ),
            total(
                "native_cleaner_paced_blocks_total",
                "Blocks read and moved by background cleaning passes that were then paced.",
                self.cleaner_paced_blocks,
            ),
            secs(
                "native_cleaner_paused_seconds_total",
                "Time the background cleaner paused to keep to its rate while clients did I/O.",
                self.cleaner_paused_ns,
            ),
            total(
                "native_checksum_errors_total",
                "Blocks that failed their checksum when read or moved.",
                self.checksum_errors,
            ),
            total(
                "native_cache_hits_total",
                "Block reads served from the block cache.",
                self.cache_hits,
            ),
            total(
                "native_cache_misses_total",
                "Block reads that went to the device.",
                self.cache_misses,
            ),
            total(
                "native_body_reads_total",
                "Object bodies (extent maps, xattrs, omap) read back from the metadata tree.",
                self.body_reads,
            ),
            total(
                "native_paged_block_lookups_total",
                "Reads of paged-out objects that looked up only their range's extents in the \
                 metadata tree.",
                self.paged_block_lookups,
            ),
            total(
                "native_body_node_reads_total",
                "Metadata tree nodes read to read bodies back.",
                self.body_node_reads,
            ),
            gauge(
                "native_bodies_paged_out",
                "Objects whose body is not in memory.",
                self.bodies_paged_out,
            ),
            gauge(
                "native_body_resident_bytes",
                "Record bytes of the object bodies in memory (what --object-cache bounds, \
                 besides the dirty ones).",
                self.body_resident_bytes,
            ),
        ]
    }
}

/// Everything of a shard that changes, owned by its reactor. Each part keeps its own
/// invariants; `State` only holds them together so one borrow covers a transaction.
pub(crate) struct State {
    pub index: Index,
    pub segments: SegmentTable,
    pub journal: JournalState,
    pub cache: BlockCache,
    /// The checkpoint the next mount would load.
    pub slot: CheckpointSlot,
    /// The checkpoint's metadata tree and where its nodes live.
    pub meta: crate::metatree::MetaTree,
    pub failed: Option<ShardFailure>,
    pub stats: NativeStats,
}

impl<D: BlockDevice> NativeStore<D> {
    fn client_op(&self) {
        self.client_ops.set(self.client_ops.get() + 1);
    }
}

/// One shard of the native store on device `D`.
///
/// Run [`NativeStore::run_background`] (the `ObjectStore::background` task) beside the
/// callers, as the OSD does: checkpoints and cleaning then happen there. Without it, or when
/// it falls behind, a submit runs them inline, and a submit future dropped half way through
/// an inline checkpoint stops the shard (every later call fails; a remount finds every
/// acknowledged write) rather than leave the index and the tree disagreeing.
pub struct NativeStore<D: BlockDevice> {
    pub(crate) dev: D,
    pub(crate) shard: u32,
    pub(crate) uuid: u128,
    /// Byte offset of the shard on the device.
    pub(crate) base: u64,
    pub(crate) geo: Geometry,
    pub(crate) config: NativeConfig,
    /// Segments kept back from user data for the cleaner and checkpoints.
    pub(crate) reserve_segments: u32,
    pub(crate) apply_lock: carmine_reactor::FifoLock,
    pub(crate) st: RefCell<State>,
    pub(crate) changed: Notify,
    /// Wakes the committer: a waiter wants a batch no writer has taken.
    pub(crate) commit_wanted: Notify,
    /// Calls into the store from outside (reads, writes, lookups, listings): the background
    /// cleaner is paced while they come in.
    pub(crate) client_ops: std::cell::Cell<u64>,
}

/// A journal write of one record shorter than this (in blocks) is made durable by the write
/// itself rather than a separate sync (decision 0012).
const LONE_RECORD_DURABLE_BLOCKS: u64 = 8;

/// Errors that concern no collection in particular.
pub(crate) const NO_CID: CollectionId = carmine_types::PgId { pool: 0, seed: 0 };

pub(crate) fn io_error(detail: impl Into<String>) -> StoreError {
    error(StoreErrorKind::Io, NO_CID, "", detail)
}

impl<D: BlockDevice> NativeStore<D> {
    pub fn stats(&self) -> NativeStats {
        let st = self.st.borrow();
        NativeStats {
            metadata_nodes: st.meta.nodes,
            metadata_nodes_loaded: st.meta.tree.as_ref().map_or(0, |t| t.loaded() as u64),
            metadata_segments: st
                .segments
                .iter()
                .filter(|(_, s)| s.kind == SegKind::Checkpoint)
                .count() as u64,
            bodies_paged_out: st.index.residency.paged_out,
            body_resident_bytes: st.index.residency.resident_bytes,
            ..st.stats
        }
    }

    /// Why the shard stopped accepting work (a failed journal write or sync, a failed
    /// checkpoint), or `None` while it is healthy. A failed shard answers every request with
    /// an I/O error until it is remounted.
    pub fn failure(&self) -> Option<String> {
        self.st.borrow().failed.as_ref().map(|f| f.to_string())
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// Segments free, and in total.
    pub fn segments_free(&self) -> (u32, u32) {
        (
            self.st.borrow().segments.free_count() as u32,
            self.geo.segments,
        )
    }

    /// The fewest free segments user writes leave (room for a checkpoint and a cleaning
    /// pass); a mount cleans back to it.
    pub fn segments_reserved(&self) -> u64 {
        self.reserve_floor()
    }

    pub(crate) fn byte_offset(&self, block: u64) -> u64 {
        self.base + block * BLOCK as u64
    }

    pub(crate) fn check_failed(&self) -> Result<()> {
        match &self.st.borrow().failed {
            Some(why) => Err(io_error(format!("store shard failed earlier: {why}"))),
            None => Ok(()),
        }
    }

    /// Blocks user data may occupy: everything but the reserve, less one header block per
    /// segment.
    pub(crate) fn capacity_blocks(&self) -> u64 {
        (self.geo.segments - self.reserve_segments) as u64 * (self.geo.segment_blocks - 1)
    }

    pub(crate) fn checkpoint_interval(&self) -> u64 {
        match self.config.checkpoint_interval_blocks {
            // A quarter of the shard, rare enough that rewriting the leaves a stretch of
            // random writes touches costs little per I/O, but at most `INTERVAL_MAX_BLOCKS`:
            // what a mount after a crash replays (and holds) must not grow with the device.
            // The cleaner forces an earlier one when the space is needed.
            0 => (self.geo.segments as u64 * self.geo.segment_blocks / 4)
                .clamp(16, INTERVAL_MAX_BLOCKS),
            n => n,
        }
    }

    /// Whether the background should write a checkpoint now: the journal grew by the
    /// interval, or the object bodies that changed since the last one — which stay in memory
    /// until a checkpoint writes them — passed `dirty_metadata_bytes`, and the journal grew by a
    /// segment since (a floor, so a working set wider than the cache does not checkpoint
    /// after every few writes).
    pub(crate) fn checkpoint_due(&self) -> bool {
        let st = self.st.borrow();
        let since = st.journal.blocks_since_checkpoint;
        since >= self.checkpoint_interval()
            || (st.index.residency.dirty_bytes > self.config.dirty_metadata_bytes
                && since >= self.geo.segment_blocks)
    }

    /// Starts writing into a fresh segment (its header goes out with the first record).
    pub(crate) fn roll_segment(&self, st: &mut State) -> Result<()> {
        let (seg, seq) = st.segments.open(SegKind::Journal).ok_or_else(|| {
            error(
                StoreErrorKind::NoSpace,
                NO_CID,
                "",
                "no free segment for the journal",
            )
        })?;
        st.journal.seg = seg;
        st.journal.seg_seq = seq;
        st.journal.nonce = rand::random();
        st.journal.seg_header_pending = true;
        st.journal.wp = self.geo.segment_start(seg) + 1;
        Ok(())
    }

    /// Makes sure the open batch can take `meta` more metadata bytes and `data` more blocks,
    /// sealing it and opening another (in a new segment if need be) when it cannot.
    pub(crate) fn batch_for(&self, st: &mut State, meta: usize, data: usize) -> Result<()> {
        if let Some(b) = &st.journal.open {
            if b.fits(meta, data) {
                return Ok(());
            }
            let b = st.journal.open.take().expect("checked");
            st.journal.wp = b.start + b.blocks();
            st.journal.sealed.push_back(b);
        }
        let seg_end = self.geo.segment_start(st.journal.seg) + self.geo.segment_blocks;
        let need = crate::format::RecordHeader::blocks_for(meta, data) as u64;
        if st.journal.wp + need > seg_end {
            self.roll_segment(st)?;
        }
        let seg_end = self.geo.segment_start(st.journal.seg) + self.geo.segment_blocks;
        if st.journal.wp + need > seg_end {
            return Err(error(
                StoreErrorKind::InvalidArgument,
                NO_CID,
                "",
                format!(
                    "a transaction of {need} blocks does not fit in a segment of {}",
                    self.geo.segment_blocks
                ),
            ));
        }
        let segment_header =
            std::mem::take(&mut st.journal.seg_header_pending).then_some(SegmentHeader {
                uuid: self.uuid,
                shard: self.shard,
                kind: SegmentKind::Journal,
                seq: st.journal.seg_seq,
                nonce: st.journal.nonce,
            });
        st.journal.next_batch += 1;
        st.journal.next_record_seq += 1;
        st.journal.open = Some(Batch {
            id: st.journal.next_batch,
            start: st.journal.wp,
            segment_header,
            record_seq: st.journal.next_record_seq - 1,
            nonce: st.journal.nonce,
            meta: BytesMut::new(),
            data: Vec::new(),
            room: seg_end - st.journal.wp,
        });
        Ok(())
    }

    /// Waits until batch `id` is durable. With a committer running (the OSD's case) the
    /// journal writes are its job, so no client's future ever owns a write other clients
    /// wait for. Without one (offline tools, tests driving the store directly) the waiter
    /// writes itself, and a waiter dropped mid-write hands its batches back.
    pub(crate) async fn wait_durable(&self, id: u64) -> Result<()> {
        loop {
            let seen = self.changed.generation();
            let write = {
                let mut st = self.st.borrow_mut();
                if st.journal.durable_batch >= id {
                    return Ok(());
                }
                if let Some(why) = &st.failed {
                    return Err(io_error(format!("journal write failed: {why}")));
                }
                let writable = id > st.journal.taken_batch
                    && st.journal.writes_in_flight < self.config.journal_writes_max.max(1);
                if st.journal.committer {
                    if id > st.journal.wanted_batch {
                        st.journal.wanted_batch = id;
                        if writable {
                            self.commit_wanted.notify_all();
                        }
                    }
                    false
                } else {
                    writable
                }
            };
            if write {
                self.write_out().await;
            } else {
                self.changed.wait(seen).await;
            }
        }
    }

    /// The shard's committer: writes the batches waiters want, `journal_writes_max` writes
    /// at a time, until the shard fails. Run only from the shard's own task (`background`).
    pub(crate) async fn run_committer(&self) {
        use futures::stream::{FuturesUnordered, StreamExt};
        struct Running<'a>(&'a RefCell<State>);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.borrow_mut().journal.committer = false;
            }
        }
        self.st.borrow_mut().journal.committer = true;
        let _running = Running(&self.st);
        let mut writes = FuturesUnordered::new();
        loop {
            let seen = self.commit_wanted.generation();
            let start = {
                let st = self.st.borrow();
                if st.failed.is_some() && writes.is_empty() {
                    break;
                }
                st.failed.is_none()
                    && st.journal.wanted_batch > st.journal.taken_batch
                    && st.journal.writes_in_flight < self.config.journal_writes_max.max(1)
            };
            if start {
                // Counted in flight before the first await, so the next check sees it.
                writes.push(self.write_out());
                continue;
            }
            if writes.is_empty() {
                self.commit_wanted.wait(seen).await;
            } else {
                let wanted = std::pin::pin!(self.commit_wanted.wait(seen));
                futures::future::select(wanted, writes.next()).await;
            }
        }
        drop(_running);
        // Waiters that were leaving the work to us must see the failure.
        self.changed.notify_all();
    }

    /// Everything submitted so far is durable when this returns.
    pub(crate) async fn drain(&self) -> Result<()> {
        let last = {
            let st = self.st.borrow();
            st.journal
                .open
                .as_ref()
                .map_or(st.journal.next_batch, |b| b.id)
        };
        self.wait_durable(last).await
    }

    /// Takes every gathered batch for one journal write, counted in flight from here on.
    /// The returned guard owns them until the write is published; dropped before that (its
    /// future cancelled), it hands them back so the next writer writes them again.
    fn take_batches(&self) -> TakenWrite<'_, D> {
        let mut st = self.st.borrow_mut();
        st.journal.writes_in_flight += 1;
        if let Some(b) = st.journal.open.take() {
            st.journal.wp = b.start + b.blocks();
            st.journal.sealed.push_back(b);
        }
        let batches: Vec<Batch> = st.journal.sealed.drain(..).collect();
        if let Some(last) = batches.last() {
            st.journal.taken_batch = last.id;
        }
        TakenWrite {
            store: self,
            durable_seq: st.journal.durable_record_seq,
            batches,
            done: false,
        }
    }

    /// The leader's job: write every gathered batch, sync once, publish. Several leaders may
    /// be in flight; a batch counts as durable only once every batch before it is, so the
    /// acknowledged transactions are always a prefix of the journal — which is what replay,
    /// stopping at the first missing record, recovers.
    fn write_out(&self) -> impl std::future::Future<Output = ()> + '_ {
        let taken = self.take_batches();
        self.write_taken(taken)
    }

    async fn write_taken(&self, mut taken: TakenWrite<'_, D>) {
        let mut result = Ok(());
        let mut bytes = 0;
        let started = std::time::Instant::now();
        // One small record alone (a queue depth of about one) goes out as one durable write
        // (O_DSYNC on a file device) instead of a write and then a sync: one I/O instead of
        // two (decision 0012). Every earlier journal write was synced, so nothing else
        // needs this one's flush.
        let lone =
            taken.batches.len() == 1 && taken.batches[0].blocks() < LONE_RECORD_DURABLE_BLOCKS;
        for b in &taken.batches {
            let (buf, at) = b.serialize(taken.durable_seq);
            bytes += buf.len() as u64;
            let (res, _) = if lone {
                self.dev.write_durable_at(buf, self.byte_offset(at)).await
            } else {
                self.dev.write_at(buf, self.byte_offset(at)).await
            };
            if let Err(source) = res {
                result = Err(ShardFailure::JournalWrite {
                    record: b.record_seq,
                    offset: self.byte_offset(at),
                    source,
                });
                break;
            }
        }
        let written = std::time::Instant::now();
        if result.is_ok() && !taken.batches.is_empty() && !lone {
            if let Err(e) = self.dev.sync().await {
                result = Err(ShardFailure::JournalSync(e));
            }
        }
        taken.done = true;
        let batches = std::mem::take(&mut taken.batches);
        {
            let mut st = self.st.borrow_mut();
            st.stats.journal_write_ns += (written - started).as_nanos() as u64;
            st.stats.journal_sync_ns += written.elapsed().as_nanos() as u64;
            st.journal.writes_in_flight = st
                .journal
                .writes_in_flight
                .checked_sub(1)
                .expect("a journal write ends only after it was counted in flight");
            match result {
                Err(why) => {
                    tracing::error!(shard = self.shard, "native store failed: {why}");
                    st.failed = Some(why);
                }
                Ok(()) => {
                    for b in &batches {
                        st.cache.batch_written(b.data_blocks());
                        st.stats.records += 1;
                        st.stats.journal_meta_bytes += b.meta.len() as u64;
                    }
                    st.journal.published(&batches);
                    st.stats.device_writes += batches.len() as u64;
                    st.stats.device_bytes_written += bytes;
                }
            }
        }
        self.changed.notify_all();
    }

    /// Forgets blocks the index no longer maps.
    pub(crate) fn invalidate_freed(st: &mut State) {
        let State { index, cache, .. } = st;
        for p in index.take_freed() {
            cache.invalidate(p);
        }
    }

    /// Reads device blocks `paddrs` (any order), verifying each against its checksum.
    pub(crate) async fn read_blocks(
        &self,
        wanted: &[BlockRef],
    ) -> std::result::Result<BlockMap<Bytes>, BlockReadError> {
        let mut out = BlockMap::with_capacity_and_hasher(wanted.len(), Default::default());
        let mut sorted: Vec<BlockRef> = wanted.to_vec();
        sorted.sort_by_key(|b| b.paddr);
        sorted.dedup_by_key(|b| b.paddr);
        let mut i = 0;
        while i < sorted.len() {
            let mut j = i + 1;
            while j < sorted.len() && sorted[j].paddr == sorted[j - 1].paddr + 1 && j - i < 256 {
                j += 1;
            }
            let run = &sorted[i..j];
            let buf = AlignedBuf::new(run.len() * BLOCK);
            let offset = self.byte_offset(run[0].paddr);
            let (res, buf) = self.dev.read_at(buf, offset).await;
            res.map_err(|source| BlockReadError::Io { offset, source })?;
            for (k, b) in run.iter().enumerate() {
                let data = &buf.full()[k * BLOCK..(k + 1) * BLOCK];
                if crc32c(data) != b.crc {
                    return Err(BlockReadError::Checksum(b.paddr));
                }
                out.insert(b.paddr, Bytes::copy_from_slice(data));
            }
            i = j;
        }
        Ok(out)
    }

    /// Reads the logical blocks `wanted` (in logical order) straight from the device into
    /// their place in `dst` (a read starting at byte `off`): one device read per run of blocks
    /// contiguous both logically and on the device, each block checked against its checksum.
    async fn read_blocks_into(
        &self,
        wanted: &[(u64, BlockRef)],
        dst: &mut [u8],
        off: u64,
    ) -> std::result::Result<(), BlockReadError> {
        let mut i = 0;
        while i < wanted.len() {
            let mut j = i + 1;
            while j < wanted.len()
                && wanted[j].1.paddr == wanted[j - 1].1.paddr + 1
                && wanted[j].0 == wanted[j - 1].0 + 1
                && j - i < 256
            {
                j += 1;
            }
            let run = &wanted[i..j];
            let buf = AlignedBuf::new(run.len() * BLOCK);
            let offset = self.byte_offset(run[0].1.paddr);
            let (res, buf) = self.dev.read_at(buf, offset).await;
            res.map_err(|source| BlockReadError::Io { offset, source })?;
            for (k, (l, b)) in run.iter().enumerate() {
                let data = &buf.full()[k * BLOCK..(k + 1) * BLOCK];
                if crc32c(data) != b.crc {
                    return Err(BlockReadError::Checksum(b.paddr));
                }
                copy_block_part(dst, off, *l, data);
            }
            i = j;
        }
        Ok(())
    }

    /// The current block map of `[first, last]` of an object, or its lookup error.
    /// A paged-out object's body is not read back for it: the extent entries of the range
    /// are looked up in the tree (its size stays in memory).
    async fn object_blocks(
        &self,
        cid: CollectionId,
        oid: &str,
        off: u64,
        len: u64,
    ) -> Result<(u64, Vec<(u64, BlockRef)>)> {
        for _ in 0..crate::paging::READ_ROUNDS {
            let (n, first, last, paged) = {
                let st = self.st.borrow();
                let obj = lookup(&st.index, cid, oid)?;
                let end = if len == 0 {
                    obj.size
                } else {
                    (off + len).min(obj.size)
                };
                if off >= end {
                    return Ok((0, Vec::new()));
                }
                check_io_len(cid, oid, end - off)?;
                let first = off / BLOCK as u64;
                let last = (end - 1) / BLOCK as u64;
                if let Some(body) = obj.body() {
                    obj.referenced.set(true);
                    return Ok((end - off, body.blocks.range(first..last + 1).collect()));
                }
                // A record of version 1 holds its extents: read it back whole.
                let paged = obj.extent_keys.then_some((obj.id, obj.stored_chunks));
                (end - off, first, last, paged)
            };
            match paged {
                Some(paged) => {
                    let found = self.paged_blocks(cid, oid, paged, first, last).await?;
                    if let Some(blocks) = found {
                        return Ok((n, blocks));
                    }
                }
                // Read back, it is found resident next round.
                None => self.with_body(cid, oid, |_, _| Ok(())).await?,
            }
        }
        // Each round above ends early only when the object changed while its extents were
        // looked up (a write read it back, a checkpoint or the cleaner moved it).
        Err(io_error(format!(
            "{cid}/{oid:?}: its extents changed under {} lookups in a row",
            crate::paging::READ_ROUNDS
        )))
    }

    /// `read` into `out`: holes are zeros; cached and unwritten blocks come from memory, the
    /// rest from the device, checksums verified.
    async fn read_object_into(
        &self,
        cid: CollectionId,
        oid: &str,
        off: u64,
        len: u64,
        out: &mut BytesMut,
    ) -> Result<usize> {
        check_oid(cid, oid)?;
        check_extent(cid, oid, off, len)?;
        check_io_len(cid, oid, len)?;
        self.check_failed()?;
        for attempt in 0.. {
            let (n, blocks) = self.object_blocks(cid, oid, off, len).await?;
            if n == 0 {
                return Ok(0);
            }
            let n = n as usize;
            let start = out.len();
            out.resize(start + n, 0);
            let dst = &mut out[start..];
            let mut missing = Vec::new();
            {
                let mut st = self.st.borrow_mut();
                for (l, b) in &blocks {
                    let hit = st.cache.get(b.paddr).cloned();
                    match hit {
                        Some(data) => {
                            st.stats.cache_hits += 1;
                            copy_block_part(dst, off, *l, &data);
                        }
                        None => {
                            st.stats.cache_misses += 1;
                            missing.push((*l, *b));
                        }
                    }
                }
            }
            if missing.is_empty() {
                return Ok(n);
            }
            match self.read_blocks_into(&missing, dst, off).await {
                // Blocks read from the device do not go into the cache: for reads spread over
                // more data than the cache holds that would only churn it (measured: a copy, a
                // hash insert and an eviction per read). The cache keeps what was written.
                Ok(()) => return Ok(n),
                Err(e) => {
                    out.truncate(start);
                    // A block moved (overwritten, or relocated by the cleaner) while we read
                    // it: read again from the new map. Otherwise the device really is wrong.
                    let (_, now) = self.object_blocks(cid, oid, off, len).await?;
                    if now != blocks && attempt < 8 {
                        continue;
                    }
                    return Err(self.block_read_failed(cid, oid, e));
                }
            }
        }
        unreachable!("the loop returns")
    }

    pub(crate) fn block_read_failed(
        &self,
        cid: CollectionId,
        oid: &str,
        e: BlockReadError,
    ) -> StoreError {
        match e {
            e @ BlockReadError::Io { .. } => error(StoreErrorKind::Io, cid, oid, e.to_string()),
            BlockReadError::Checksum(paddr) => {
                self.st.borrow_mut().stats.checksum_errors += 1;
                tracing::error!(
                    shard = self.shard,
                    %cid,
                    oid,
                    paddr,
                    "checksum mismatch reading block: data not returned"
                );
                error(
                    StoreErrorKind::Corrupt,
                    cid,
                    oid,
                    format!(
                        "checksum mismatch in device block {paddr} of shard {}",
                        self.shard
                    ),
                )
            }
        }
    }
}

/// Batches taken by one journal write. See [`NativeStore::take_batches`].
struct TakenWrite<'a, D: BlockDevice> {
    store: &'a NativeStore<D>,
    durable_seq: u64,
    batches: Vec<Batch>,
    done: bool,
}

impl<D: BlockDevice> Drop for TakenWrite<'_, D> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Cancelled mid-write: the batches go back to the front of the queue, unchanged, so
        // the next writer puts the same bytes at the same place (a write of ours still in
        // the kernel, if any, writes those same bytes).
        let store = self.store;
        let mut st = store.st.borrow_mut();
        st.journal.writes_in_flight -= 1;
        if let Some(first) = self.batches.first() {
            st.journal.taken_batch = st.journal.taken_batch.min(first.id - 1);
        }
        for b in self.batches.drain(..).rev() {
            st.journal.sealed.push_front(b);
        }
        drop(st);
        store.commit_wanted.notify_all();
        store.changed.notify_all();
    }
}

/// Copies the part of logical block `l` that falls in the read starting at `off` into `dst`.
fn copy_block_part(dst: &mut [u8], off: u64, l: u64, data: &[u8]) {
    let bstart = l * BLOCK as u64;
    let from = off.max(bstart);
    let to = (off + dst.len() as u64).min(bstart + BLOCK as u64);
    if from >= to {
        return;
    }
    let src = &data[(from - bstart) as usize..(to - bstart) as usize];
    dst[(from - off) as usize..(to - off) as usize].copy_from_slice(src);
}

pub(crate) fn lookup<'a>(
    index: &'a Index,
    cid: CollectionId,
    oid: &str,
) -> Result<&'a crate::index::Onode> {
    let coll = index.colls.get(&cid).ok_or_else(|| {
        error(
            StoreErrorKind::CollectionNotFound,
            cid,
            oid,
            "no such collection",
        )
    })?;
    coll.get(oid)
        .ok_or_else(|| error(StoreErrorKind::ObjectNotFound, cid, oid, "no such object"))
}

impl<D: BlockDevice> ObjectStore for NativeStore<D> {
    async fn submit(&self, txn: Transaction) -> Result<()> {
        self.client_op();
        self.submit_txn(txn).await
    }

    async fn read(&self, cid: CollectionId, oid: &str, off: u64, len: u64) -> Result<Bytes> {
        self.client_op();
        let mut out = BytesMut::new();
        self.read_object_into(cid, oid, off, len, &mut out).await?;
        Ok(out.freeze())
    }

    async fn read_into(
        &self,
        cid: CollectionId,
        oid: &str,
        off: u64,
        len: u64,
        out: &mut BytesMut,
    ) -> Result<usize> {
        self.client_op();
        self.read_object_into(cid, oid, off, len, out).await
    }

    async fn readv(
        &self,
        cid: CollectionId,
        oid: &str,
        extents: &[(u64, u64)],
    ) -> Result<Vec<Bytes>> {
        self.client_op();
        check_oid(cid, oid)?;
        for &(off, len) in extents {
            check_extent(cid, oid, off, len)?;
            check_io_len(cid, oid, len)?;
        }
        lookup(&self.st.borrow().index, cid, oid)?;
        let mut out = Vec::with_capacity(extents.len());
        for &(off, len) in extents {
            out.push(self.read(cid, oid, off, len).await?);
        }
        Ok(out)
    }

    async fn stat(&self, cid: CollectionId, oid: &str) -> Result<ObjectStat> {
        self.client_op();
        check_oid(cid, oid)?;
        let st = self.st.borrow();
        Ok(ObjectStat {
            size: lookup(&st.index, cid, oid)?.size,
        })
    }

    async fn getattr(&self, cid: CollectionId, oid: &str, name: &str) -> Result<Bytes> {
        self.client_op();
        check_oid(cid, oid)?;
        check_attr_name(cid, oid, name)?;
        self.with_body(cid, oid, |_, o| {
            o.attrs.get(name).cloned().ok_or_else(|| {
                error(
                    StoreErrorKind::AttrNotFound,
                    cid,
                    oid,
                    format!("no xattr {name:?}"),
                )
            })
        })
        .await
    }

    async fn getattrs(&self, cid: CollectionId, oid: &str) -> Result<BTreeMap<String, Bytes>> {
        self.client_op();
        check_oid(cid, oid)?;
        self.with_body(cid, oid, |_, o| Ok(o.attrs.clone())).await
    }

    async fn omap_get_header(&self, cid: CollectionId, oid: &str) -> Result<Bytes> {
        self.client_op();
        check_oid(cid, oid)?;
        self.with_body(cid, oid, |_, o| Ok(o.omap_header.clone()))
            .await
    }

    async fn omap_get_values(
        &self,
        cid: CollectionId,
        oid: &str,
        keys: &[Bytes],
    ) -> Result<BTreeMap<Bytes, Bytes>> {
        self.client_op();
        check_oid(cid, oid)?;
        self.with_body(cid, oid, |_, o| {
            Ok(keys
                .iter()
                .filter_map(|k| o.omap.get(k).map(|v| (k.clone(), v.clone())))
                .collect())
        })
        .await
    }

    async fn omap_iterate(
        &self,
        cid: CollectionId,
        oid: &str,
        start_after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Page<(Bytes, Bytes), Bytes>> {
        self.client_op();
        check_oid(cid, oid)?;
        let limit = check_list_limit(cid, oid, limit)?;
        self.with_body(cid, oid, |_, o| {
            let lower = start_after.map_or(Bound::Unbounded, Bound::Excluded);
            let iter = o
                .omap
                .range::<[u8], _>((lower, Bound::Unbounded))
                .map(|(k, v)| (k.clone(), v.clone()));
            Ok(Page::take_from(iter, limit, |(k, _)| k.clone()))
        })
        .await
    }

    async fn list_objects(
        &self,
        cid: CollectionId,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<Page<String, String>> {
        self.client_op();
        let limit = check_list_limit(cid, "", limit)?;
        let st = self.st.borrow();
        let coll = st.index.colls.get(&cid).ok_or_else(|| {
            error(
                StoreErrorKind::CollectionNotFound,
                cid,
                "",
                "no such collection",
            )
        })?;
        let lower = start_after.map_or(Bound::Unbounded, Bound::Excluded);
        let iter = coll
            .range::<str, _>((lower, Bound::Unbounded))
            .map(|(k, _)| k.clone());
        Ok(Page::take_from(iter, limit, String::clone))
    }

    async fn list_collections(&self) -> Result<Vec<CollectionId>> {
        self.client_op();
        Ok(self.st.borrow().index.colls.keys().copied().collect())
    }

    async fn collection_exists(&self, cid: CollectionId) -> Result<bool> {
        self.client_op();
        Ok(self.st.borrow().index.colls.contains_key(&cid))
    }

    async fn flush(&self) -> Result<()> {
        self.check_failed()?;
        self.drain().await
    }

    async fn background(&self) {
        self.run_background().await
    }

    fn failure(&self) -> Option<String> {
        NativeStore::failure(self)
    }

    fn report(&self) {
        let s = self.stats();
        let per = |ns: u64| ns as f64 / s.device_writes.max(1) as f64 / 1000.0;
        tracing::info!(
            shard = self.shard,
            records = s.records,
            device_writes = s.device_writes,
            write_us = per(s.journal_write_ns),
            sync_us = per(s.journal_sync_ns),
            "native store shard: {s:?}"
        );
    }

    fn counters(&self) -> Vec<StoreCounter> {
        self.stats().counters()
    }

    fn statfs(&self) -> StoreStatfs {
        let st = self.st.borrow();
        StoreStatfs {
            bytes_total: self.capacity_blocks() * BLOCK as u64,
            // Metadata is charged as its checkpoint takes it.
            bytes_used: st.index.live_blocks * BLOCK as u64 + st.index.encoded_len(),
            objects: st.index.objects,
        }
    }
}
