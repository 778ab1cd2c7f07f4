//! Checkpoints: the records of what changed since the last one go into the metadata tree
//! (`metatree.rs`), its dirty nodes are appended to metadata segments, the device is synced,
//! and a slot names the new root. A checkpoint's cost follows what changed, not the size of
//! the index. Mount walks the tree back into the index (`mount_walk.rs`).
//!
//! Nodes are never written over: a node replaced by a checkpoint stays live in its segment
//! until the slot naming the new root is durable; a metadata segment is freed when none of
//! its nodes is live. When the tree has grown wasteful (underfull nodes, thinly used
//! segments) a checkpoint writes a fresh one into new segments and frees all the old ones.

use crate::device::{AlignedBuf, BlockDevice, BLOCK};
use crate::error::ShardFailure;
use crate::extents::extent_value;
use crate::format::{CheckpointSlot, JournalPos, SegmentHeader, SegmentKind};
use crate::index::Geometry;
use crate::index::Index;
use crate::metatree::{
    chunks, collection_key, extent_key, fresh_tree_blocks, object_key, object_record, MetaTree,
    PIECES_MAX,
};
use crate::segments::SegKind;
use crate::store::{io_error, NativeStore};
use carmine_btree::{Builder, LoadError, Need, Tree, TreeError, GENERATION_MAX};
use carmine_store::Result;
use std::collections::BTreeSet;

/// Tree nodes read at once (mount, and faulting in what a checkpoint changes).
pub(crate) const READS_AT_ONCE: usize = 64;

/// One change to the tree.
enum Op {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
}

impl Op {
    fn key(&self) -> &[u8] {
        match self {
            Op::Put(k, _) | Op::Delete(k) => k,
        }
    }
}

/// The most metadata blocks one device write of a checkpoint carries (1 MiB).
const WRITE_RUN_BLOCKS: usize = 256;

/// A block a checkpoint writes: its bytes, or a tree node placed by
/// [`Tree::place_dirty_at`], encoded only when its piece is written.
enum Pending {
    Bytes(Vec<u8>),
    Node(usize),
}

/// Why a checkpoint failed after it began changing the tree: the shard stops.
fn failure(detail: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(detail.to_string())
}

/// The changes that put the index's dirty records into the tree, marking them clean (and
/// so evictable). Fails, changing nothing that matters (the shard stops), on a dirty object
/// whose body is not resident, which `residency.rs` never allows.
fn take_changes(index: &mut Index) -> std::io::Result<Vec<Op>> {
    index.residency.checkpoint_begins();
    let mut ops = Vec::new();
    for cid in std::mem::take(&mut index.dirty_colls) {
        ops.push(match index.colls.contains_key(&cid) {
            true => Op::Put(collection_key(cid), Vec::new()),
            false => Op::Delete(collection_key(cid)),
        });
    }
    for dead in std::mem::take(&mut index.dead) {
        let id = dead.id;
        ops.extend((0..dead.chunks).map(|i| Op::Delete(object_key(id, i))));
        ops.extend(
            dead.extents
                .into_iter()
                .map(|l| Op::Delete(extent_key(id, l))),
        );
    }
    for (cid, oid) in std::mem::take(&mut index.dirty) {
        // Listed when it became dirty: it may be gone since, or be another object of the
        // same name (listed again itself).
        let Some(o) = index.colls.get_mut(&cid).and_then(|c| c.get_mut(&oid)) else {
            continue;
        };
        if !o.dirty {
            continue;
        }
        let Some(body) = o.body.as_deref_mut() else {
            return Err(failure(format!(
                "{cid}/{oid:?} changed but its body is paged out"
            )));
        };
        // The record when it changed, or when the tree has none of version 2 yet.
        let extents_apart = o.stored_chunks > 0 && o.extent_keys;
        if o.record_dirty || !extents_apart {
            let rec = object_record(cid, &oid, o.size, body);
            let mut n = 0;
            for (i, c) in chunks(&rec).enumerate() {
                ops.push(Op::Put(object_key(o.id, i as u32), c.to_vec()));
                n = i as u32 + 1;
            }
            if n >= PIECES_MAX {
                return Err(failure(format!(
                    "{cid}/{oid:?}: a record of {n} pieces, more than the tree keys"
                )));
            }
            for i in n..o.stored_chunks {
                ops.push(Op::Delete(object_key(o.id, i)));
            }
            o.stored_chunks = n;
            o.record_dirty = false;
        }
        // Only the extents that changed, once the tree keys them; all of them for an object
        // new to the tree or whose record held them (version 1).
        let changed = body.blocks.take_changed();
        if extents_apart {
            for l in changed {
                ops.push(match body.blocks.extent_at(l) {
                    Some(e) => Op::Put(extent_key(o.id, l), extent_value(e)),
                    None => Op::Delete(extent_key(o.id, l)),
                });
            }
        } else {
            let puts = body.blocks.extents();
            ops.extend(puts.map(|(l, e)| Op::Put(extent_key(o.id, l), extent_value(e))));
        }
        o.extent_keys = true;
        index.residency.cleaned(cid, &oid, o);
    }
    sort(&mut ops);
    Ok(ops)
}

/// In key order (each key appears once): records land in id order, so a fresh tree's nodes
/// fill up (splits at a node's end keep it full), and changes near each other share reads.
fn sort(ops: &mut [Op]) {
    ops.sort_unstable_by(|a, b| a.key().cmp(b.key()));
    // One change per key: a tree rewrite merges them into its scan, and a key twice would
    // be a builder error (the shard stops), where applying them in turn let the last win.
    debug_assert!(
        ops.windows(2).all(|w| w[0].key() != w[1].key()),
        "a checkpoint's changes name each key once"
    );
}

/// Merges `changes` (in key order, one per key) into a page of the old tree's entries
/// (consecutive pages of one scan, in key order), handing `push` what the new tree holds
/// there, in key order: a change's new value for its key, nothing for a removed one, new
/// keys where they fall. `last`: the scan's last page, after which every change left goes.
fn merge_page<E>(
    page: &[(Vec<u8>, Vec<u8>)],
    changes: &mut std::iter::Peekable<std::vec::IntoIter<Op>>,
    last: bool,
    push: &mut impl FnMut(&[u8], &[u8]) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    for (k, v) in page {
        // New keys below this entry.
        while let Some(op) = changes.next_if(|op| op.key() < k.as_slice()) {
            if let Op::Put(nk, nv) = op {
                push(&nk, &nv)?;
            }
        }
        match changes.next_if(|op| op.key() == k.as_slice()) {
            Some(Op::Put(_, nv)) => push(k, &nv)?,
            Some(Op::Delete(_)) => {}
            None => push(k, v)?,
        }
    }
    if last {
        for op in changes.by_ref() {
            if let Op::Put(nk, nv) = op {
                push(&nk, &nv)?;
            }
        }
    }
    Ok(())
}

/// The generation of the slot the next checkpoint writes, which its nodes carry: a reader
/// of an older slot refuses a node of a later one found where one of its own used to be.
fn next_generation(st: &crate::store::State) -> u64 {
    (st.slot.generation + 1).min(GENERATION_MAX)
}

/// Notes the tree nodes in memory now in the most a rewrite held.
fn note_held(st: &mut crate::store::State) {
    let held = st.meta.tree.as_ref().map_or(0, |t| t.loaded()) as u64;
    let most = &mut st.stats.tree_rewrite_nodes_held_max;
    *most = (*most).max(held);
}

fn apply_one(tree: &mut Tree, op: &Op) -> std::result::Result<(), TreeError> {
    match op {
        Op::Put(k, v) => tree.insert(k, v).map(drop),
        Op::Delete(k) => tree.remove(k).map(drop),
    }
}

impl<D: BlockDevice> NativeStore<D> {
    /// Writes a checkpoint and retires the journal before it. Called with the apply lock
    /// held, so the index does not change meanwhile.
    pub(crate) async fn checkpoint(&self) -> Result<()> {
        self.drain().await?;
        let per_segment = self.geo.segment_blocks - 1;
        // Check the room before anything changes: a checkpoint that cannot be written is an
        // error for the caller, not a failed shard.
        let fresh = {
            let st = self.st.borrow();
            let meta_segments = st
                .segments
                .iter()
                .filter(|(_, s)| s.kind == SegKind::Checkpoint)
                .count() as u64;
            let free = st.segments.free_count() as u64 * per_segment;
            // The room for a fresh tree, which starts a new segment: an incremental
            // checkpoint that finds more changed nodes than room writes one instead.
            let fresh_needed = fresh_tree_blocks(&st.index);
            if free < fresh_needed {
                return Err(io_error(format!(
                    "no room for a checkpoint: up to {fresh_needed} metadata blocks needed, \
                     {free} free"
                )));
            }
            st.meta
                .wants_fresh_tree(&st.index, meta_segments, per_segment)
        };
        let (ops, pos, new_tree) = {
            let mut st = self.st.borrow_mut();
            let st = &mut *st;
            let pos = JournalPos {
                segment: st.journal.seg,
                segment_seq: st.journal.seg_seq,
                block: (st.journal.wp - self.geo.segment_start(st.journal.seg)) as u32,
                record_seq: st.journal.next_record_seq,
            };
            // The first tree: every record is dirty (a new store, or a blob just read).
            let new_tree = st.meta.tree.is_none();
            if new_tree {
                st.meta.tree = Some(Tree::new());
                st.meta.open = None;
            }
            st.meta.checkpointing = true;
            (take_changes(&mut st.index), pos, new_tree)
        };
        // From here the dirty marks are taken: a failure stops the shard, and so does its
        // future being dropped (by a caller that went away) before it is done.
        let abandoned = Abandoned(&self.st);
        let written = match ops {
            Ok(ops) => {
                self.write_checkpoint(ops, pos, new_tree, fresh && !new_tree)
                    .await
            }
            Err(e) => Err(e),
        };
        let written = match written {
            Ok(w) => w,
            Err(e) => {
                let err = io_error(format!("checkpoint: {e}"));
                self.st.borrow_mut().failed = Some(ShardFailure::Checkpoint(e));
                return Err(err);
            }
        };
        let accounted = self.account_checkpoint(written, pos);
        std::mem::forget(abandoned);
        accounted?;
        self.changed.notify_all();
        Ok(())
    }

    /// Once the slot of a checkpoint is durable: frees what it no longer references (old
    /// nodes, metadata and journal segments) and trims the node cache.
    fn account_checkpoint(&self, written: Written, pos: JournalPos) -> Result<()> {
        let fresh = written.fresh;
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let old = std::mem::replace(&mut st.slot, written.slot);
        for s in old.segments {
            if st.segments.get(s).kind == SegKind::Checkpoint {
                st.segments.release(s);
            }
        }
        let open = st.meta.open.map(|(s, _)| s);
        if fresh {
            for (s, seg) in st.segments.iter().collect::<Vec<_>>() {
                if seg.kind == SegKind::Checkpoint && !written.segments.contains(&s) {
                    st.meta.drop_segment(s);
                    st.segments.release(s);
                }
            }
        }
        for p in written.freed {
            let released = match self.geo.segment_of(p) {
                Some(s) => st.meta.release(s, p).map(|live| (s, live)),
                None => Err(format!("tree node at block {p} lies outside every segment")),
            };
            match released.map(|(s, live)| (s, live, Some(s) == open)) {
                Ok((s, 0, false)) if st.segments.get(s).kind == SegKind::Checkpoint => {
                    st.segments.release(s)
                }
                Ok(_) => {}
                Err(e) => {
                    st.failed = Some(ShardFailure::Checkpoint(failure(&e)));
                    return Err(io_error(format!("checkpoint: {e}")));
                }
            }
        }
        // Journal segments wholly before the checkpoint hold nothing replay needs; those
        // without live data are free now, the rest wait for the cleaner.
        for s in 0..self.geo.segments {
            let seg = st.segments.get(s);
            if seg.kind == SegKind::Journal
                && seg.seq < pos.segment_seq
                && st.index.segment_live[s as usize] == 0
            {
                st.segments.release(s);
            }
        }
        let cache_nodes = self.config.metadata_cache_nodes();
        if let Some(t) = st.meta.tree.as_mut() {
            t.evict_to(cache_nodes);
        }
        // The records just written make their objects' bodies evictable.
        st.index.residency.checkpoint_in_flight = false;
        st.index.evict_to(self.config.object_cache_bytes);
        st.index.compact_clean_queue();
        st.meta.checkpointing = false;
        st.journal.blocks_since_checkpoint = 0;
        st.stats.checkpoints += 1;
        st.stats.checkpoint_blocks += written.blocks;
        st.stats.tree_rewrites += fresh as u64;
        st.stats.tree_rewrites_for_room += written.for_room as u64;
        Ok(())
    }

    /// Applies `ops` (in key order) to the tree in memory, reading ahead the nodes they
    /// reach. `new_tree`: the tree is new, nothing to read.
    async fn apply_ops(&self, ops: &[Op], new_tree: bool) -> std::io::Result<()> {
        let all_loaded = {
            let st = self.st.borrow();
            st.meta.tree.as_ref().map_or(0, |t| t.loaded()) as u64 >= st.meta.nodes
        };
        if !all_loaded && !new_tree {
            self.fault_in(ops).await?;
        }
        // What the reads ahead could not foresee: a removal that empties a leaf sends the
        // keys of its range to a neighbour not read yet. Changes fail before they change
        // anything, so the one that needs a node is tried again once it is loaded.
        for op in ops {
            loop {
                let r = {
                    let mut st = self.st.borrow_mut();
                    apply_one(st.meta.tree.as_mut().expect("a checkpoint has a tree"), op)
                };
                match r {
                    Ok(()) => break,
                    Err(TreeError::Need(n)) => drop(self.load_nodes(&[n]).await?),
                    Err(e) => return Err(failure(format!("metadata tree: {e}"))),
                }
            }
        }
        Ok(())
    }

    /// Applies `ops` to the tree (or, writing it afresh, merges them into the new one),
    /// writes its new nodes, syncs, and writes the slot.
    /// `new_tree`: the tree is new (every record is in `ops`); `compact`: write the tree
    /// afresh, with the changes.
    async fn write_checkpoint(
        &self,
        ops: Vec<Op>,
        pos: JournalPos,
        new_tree: bool,
        mut compact: bool,
    ) -> std::io::Result<Written> {
        // A tree written afresh takes the changes as its scan of the old one goes by: the
        // old tree is read once and never changed, so the pass holds no more than its read
        // ahead, whatever the changes touch.
        let merged = if compact {
            ops
        } else {
            self.apply_ops(&ops, new_tree).await?;
            Vec::new()
        };
        // More changed nodes than room: write the tree afresh (its changes already in),
        // which `checkpoint` made sure fits (`fresh_tree_blocks` is an upper bound).
        let no_room = !new_tree && !compact && {
            let st = self.st.borrow();
            let geo = &self.geo;
            let open_left = st.meta.open.map_or(0, |(s, next)| {
                geo.segment_start(s) + geo.segment_blocks - next
            });
            let free = st.segments.free_count() as u64 * (geo.segment_blocks - 1);
            let dirty = st.meta.tree.as_ref().map_or(0, |t| t.dirty_nodes()) as u64;
            dirty > free + open_left
        };
        compact |= no_room;
        let fresh = new_tree || compact;
        let mut segments = BTreeSet::new();
        let (root, freed, written_blocks) = if compact {
            // Written and placed as it streams; every old node is freed once the slot is.
            let (root, written) = self.write_afresh(&mut segments, merged).await?;
            (root, Vec::new(), written)
        } else {
            let (root, freed, pending) = {
                let mut st_guard = self.st.borrow_mut();
                let st = &mut *st_guard;
                let geo = &self.geo;
                let open_left = st.meta.open.map_or(0, |(s, next)| {
                    geo.segment_start(s) + geo.segment_blocks - next
                });
                let free = st.segments.free_count() as u64 * (geo.segment_blocks - 1);
                let dirty = st.meta.tree.as_ref().map_or(0, |t| t.dirty_nodes()) as u64;
                // A large checkpoint (a quarter segment or more) starts a segment of its own,
                // as a blob did, so that its nodes, replaced together by a later one, free their
                // segment together; appended after older nodes, they would hold that segment
                // (and the next) a checkpoint longer — space the cleaner misses at high fill.
                let own_segment = fresh || (dirty >= (geo.segment_blocks - 1) / 4 && dirty <= free);
                if own_segment {
                    st.meta.open = None;
                }
                if dirty > free + if own_segment { 0 } else { open_left } {
                    return Err(failure(format!(
                        "{dirty} metadata nodes to write, more than the free segments hold"
                    )));
                }
                // Out of `meta` while nodes are placed (placing counts them in `meta`).
                let mut tree = st.meta.tree.take().expect("a checkpoint has a tree");
                let mut headers = Vec::new();
                let (root, freed, nodes) =
                    self.place_nodes(&mut tree, st, &mut headers, &mut segments);
                st.meta.tree = Some(tree);
                let pending: Vec<(u64, Pending)> = (headers.into_iter())
                    .map(|(p, b)| (p, Pending::Bytes(b)))
                    .chain(nodes.into_iter().map(|(p, id)| (p, Pending::Node(id))))
                    .collect();
                (root, freed, pending)
            };
            let written = pending.len() as u64;
            self.write_runs(pending).await?;
            (root, freed, written)
        };
        self.dev.sync().await?;
        let slot = {
            let st = self.st.borrow();
            CheckpointSlot {
                shard: self.shard,
                uuid: self.uuid,
                generation: st.slot.generation + 1,
                journal: pos,
                segment_seq_max: st.segments.seq_max(),
                blob_len: 0,
                blob_crc: 0,
                segments: Vec::new(),
                tree_root: Some(root),
            }
        };
        let mut buf = AlignedBuf::new(BLOCK);
        buf.extend_from_slice(&slot.encode());
        buf.pad_to_block();
        let (res, _) = self
            .dev
            .write_at(buf, self.byte_offset(slot.generation % 2))
            .await;
        res?;
        self.dev.sync().await?;
        Ok(Written {
            fresh,
            for_room: no_room,
            slot,
            segments,
            freed,
            blocks: written_blocks,
        })
    }

    /// Gives `tree`'s dirty nodes places (the headers of the segments opened for them go to
    /// `blocks`; the caller checked the room): the new root, the places no longer
    /// referenced, and the nodes to encode and write (place, node).
    fn place_nodes(
        &self,
        tree: &mut Tree,
        st: &mut crate::store::State,
        blocks: &mut Vec<(u64, Vec<u8>)>,
        segments: &mut BTreeSet<u32>,
    ) -> (u64, Vec<u64>, Vec<(u64, usize)>) {
        let generation = next_generation(st);
        let (meta, segs) = (&mut st.meta, &mut st.segments);
        let mut place = || {
            self.place_node(meta, segs, blocks, segments)
                .expect("room counted")
        };
        let placed = tree.place_dirty_at(generation, &mut place);
        (placed.root, placed.freed, placed.nodes)
    }

    /// A place for one metadata node: the next block of the open metadata segment, or of a
    /// new one (its header goes to `headers`). `None`: no segment is free.
    fn place_node(
        &self,
        meta: &mut MetaTree,
        segs: &mut crate::segments::SegmentTable,
        headers: &mut Vec<(u64, Vec<u8>)>,
        segments: &mut BTreeSet<u32>,
    ) -> Option<u64> {
        let geo = &self.geo;
        let (s, next) = match meta.open {
            Some((s, next)) if next < geo.segment_start(s) + geo.segment_blocks => (s, next),
            _ => {
                let (s, seq) = segs.open(SegKind::Checkpoint)?;
                let header = SegmentHeader {
                    uuid: self.uuid,
                    shard: self.shard,
                    kind: SegmentKind::Checkpoint,
                    seq,
                    nonce: rand::random(),
                };
                headers.push((geo.segment_start(s), header.encode().to_vec()));
                (s, geo.segment_start(s) + 1)
            }
        };
        meta.open = Some((s, next + 1));
        meta.take(s);
        segments.insert(s);
        Some(next)
    }

    /// Writes the tree afresh into new metadata segments, in one pass over the old one (with
    /// this checkpoint's changes) in key order: nodes are built bottom up as the entries
    /// go by (`Builder`), placed and written in batches, while the old tree's nodes are read
    /// ahead a batch at a time and dropped behind the scan. Neither tree is ever whole in
    /// memory. Returns the new root and the nodes written; the new tree replaces the old one
    /// in `meta`, nothing of it loaded.
    async fn write_afresh(
        &self,
        segments: &mut BTreeSet<u32>,
        changes: Vec<Op>,
    ) -> std::io::Result<(u64, u64)> {
        const PAGE: usize = 4096;
        /// Rounds in a row that may read nodes without the scan getting further.
        const STALLS_MAX: u32 = 8;
        let generation = {
            let mut st = self.st.borrow_mut();
            // New nodes go to new segments of their own, freed together later.
            st.meta.open = None;
            next_generation(&st)
        };
        let mut builder = Builder::new(generation);
        // The changes not applied to the old tree, in key order (one per key): merged into
        // the scan's entries as they go by.
        let mut changes = changes.into_iter().peekable();
        let mut from: Vec<u8> = Vec::new();
        let mut stalls = 0;
        let mut written = 0u64;
        // What the node cache holds as the rewrite begins counts too.
        note_held(&mut self.st.borrow_mut());
        let root = loop {
            let mut page = Vec::new();
            let scanned = {
                let st = self.st.borrow();
                let tree = st.meta.tree.as_ref().expect("a checkpoint has a tree");
                tree.range_into(&from, None, PAGE, &mut page)
            };
            let done = matches!(scanned, Ok(())) && page.len() < PAGE;
            if let Some((k, _)) = page.last() {
                from = k.clone();
                from.push(0);
                stalls = 0;
            }
            let mut blocks = Vec::new();
            let root = {
                let mut st = self.st.borrow_mut();
                let st = &mut *st;
                let (meta, segs) = (&mut st.meta, &mut st.segments);
                let mut headers = Vec::new();
                let mut full = false;
                let mut place = || match self.place_node(meta, segs, &mut headers, segments) {
                    Some(p) => p,
                    None => {
                        full = true;
                        0
                    }
                };
                let mut push = |k: &[u8], v: &[u8]| {
                    builder
                        .push(k, v, &mut place, &mut blocks)
                        .map_err(|e| failure(format!("metadata tree afresh: {e}")))
                };
                merge_page(&page, &mut changes, done, &mut push)?;
                let root = done.then(|| {
                    std::mem::replace(&mut builder, Builder::new(generation))
                        .finish(&mut place, &mut blocks)
                });
                if full {
                    return Err(failure(
                        "metadata tree afresh: more nodes than the free segments hold",
                    ));
                }
                blocks.extend(headers);
                root
            };
            // Counted as a checkpoint's blocks always were: segment headers included.
            written += blocks.len() as u64;
            let bytes = blocks.into_iter().map(|(p, b)| (p, Pending::Bytes(b)));
            self.write_runs(bytes.collect()).await?;
            if let Some(root) = root {
                break root;
            }
            match scanned {
                Ok(()) => {}
                Err(TreeError::Need(_)) => {
                    let needs = {
                        let mut st = self.st.borrow_mut();
                        let tree = st.meta.tree.as_mut().expect("a checkpoint has a tree");
                        // What the scan has passed goes (clean nodes stay on the device
                        // until the new slot is durable); nothing ahead of it, such as the
                        // batch just read: dropping by age would take that first when this
                        // checkpoint's dirty nodes alone fill the cache.
                        tree.evict_before(&from);
                        tree.needs_from(&from, READS_AT_ONCE)
                    };
                    stalls += 1;
                    if stalls > STALLS_MAX {
                        return Err(failure(format!(
                            "metadata tree afresh: the scan gets no further than {from:?}"
                        )));
                    }
                    self.load_nodes(&needs).await?;
                    note_held(&mut self.st.borrow_mut());
                }
                Err(e) => return Err(failure(format!("metadata tree: {e}"))),
            }
        };
        // The old tree (and the nodes it held) goes: the new one is read from the device as
        // it is needed. Its nodes are written (not yet synced: the slot's sync does that).
        self.st.borrow_mut().meta.tree = Some(Tree::open_at(root, generation));
        Ok((root, written))
    }

    /// Writes blocks, each run of adjacent ones in one device write.
    async fn write_runs(&self, mut blocks: Vec<(u64, Pending)>) -> std::io::Result<()> {
        blocks.sort_unstable_by_key(|(p, _)| *p);
        let mut i = 0;
        while i < blocks.len() {
            // A run is written a bounded piece at a time, each block dropped once copied: a
            // checkpoint that rewrites most of a large tree must not hold it twice more.
            let mut j = i + 1;
            while j < blocks.len() && j - i < WRITE_RUN_BLOCKS && blocks[j].0 == blocks[j - 1].0 + 1
            {
                j += 1;
            }
            let mut buf = AlignedBuf::new((j - i) * BLOCK);
            {
                let st = self.st.borrow();
                let tree = st.meta.tree.as_ref();
                for (p, b) in &mut blocks[i..j] {
                    match std::mem::replace(b, Pending::Bytes(Vec::new())) {
                        Pending::Bytes(bytes) => buf.extend_from_slice(&bytes),
                        Pending::Node(id) => {
                            // Nothing evicts nodes while a checkpoint is written, and a reader
                            // that attaches a child leaves the parent's block as it was.
                            let block = tree.and_then(|t| t.encode_placed(*p, id));
                            let block = block.ok_or_else(|| {
                                failure(format!("metadata node for block {p} went before written"))
                            })?;
                            buf.extend_from_slice(&block);
                        }
                    }
                    buf.pad_to_block();
                }
            }
            let (res, _) = self.dev.write_at(buf, self.byte_offset(blocks[i].0)).await;
            res?;
            i = j;
        }
        Ok(())
    }

    /// Reads ahead the tree nodes on the way to the keys of `ops` (in key order), many at
    /// a time. Each round walks the keys from the first one not yet reachable and stops
    /// once it has a batch of nodes to read, so every key is looked up a few times at most.
    async fn fault_in(&self, ops: &[Op]) -> std::io::Result<()> {
        let mut first = 0;
        loop {
            let wanted: Vec<Need> = {
                let st = self.st.borrow();
                let tree = st.meta.tree.as_ref().expect("a checkpoint has a tree");
                let mut wanted: Vec<Need> = Vec::new();
                for (i, op) in ops.iter().enumerate().skip(first) {
                    match tree.get(op.key()) {
                        Err(TreeError::Need(n)) => {
                            let known = wanted.iter().any(|w| w.paddr == n.paddr);
                            if !known && wanted.len() == READS_AT_ONCE {
                                break;
                            }
                            if !known {
                                wanted.push(n);
                            }
                        }
                        // Reachable now, and so are all before it: start after it next time.
                        _ if i == first => first += 1,
                        _ => {}
                    }
                }
                wanted
            };
            if wanted.is_empty() {
                return Ok(());
            }
            self.load_nodes(&wanted).await?;
        }
    }

    /// Reads the nodes `wanted` names and hangs them in the tree (a node a reader loaded
    /// meanwhile is not loaded again); returns the children of those it hung.
    async fn load_nodes(&self, wanted: &[Need]) -> std::io::Result<Vec<Need>> {
        let blocks = read_nodes(&self.dev, self.base, &self.geo, wanted).await?;
        let mut st = self.st.borrow_mut();
        let tree = st.meta.tree.as_mut().expect("a checkpoint has a tree");
        let mut children = Vec::new();
        for (n, b) in wanted.iter().zip(&blocks) {
            match tree.load(n, b.full()) {
                Ok(c) => children.extend(c),
                Err(LoadError::NotWanted { .. }) => {}
                Err(e) => return Err(failure(format!("metadata tree: {e}"))),
            }
        }
        Ok(children)
    }
}

/// Stops the shard when dropped: held by a checkpoint from the moment it takes the index's
/// dirty marks until its slot is accounted for. A checkpoint dropped in between (its caller
/// went away) would leave changes marked clean that no tree holds, and the next checkpoint
/// would retire the journal records that still do.
struct Abandoned<'a>(&'a std::cell::RefCell<crate::store::State>);

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        match self.0.try_borrow_mut() {
            Err(_) => tracing::error!(
                "a checkpoint was abandoned half way while the shard state was borrowed: its \
                 changes are in no tree, and the shard could not be stopped"
            ),
            // A checkpoint that failed stopped the shard already.
            Ok(mut st) if st.failed.is_none() => {
                tracing::error!("a checkpoint was abandoned half way: the shard stops");
                st.failed = Some(ShardFailure::Checkpoint(failure(
                    "abandoned half way (its caller went away): the changes it took are in \
                     no tree",
                )));
            }
            _ => {}
        }
    }
}

/// What a written checkpoint left to account for once its slot is durable.
struct Written {
    /// It wrote a fresh tree: every older metadata segment is free once its slot is durable.
    fresh: bool,
    /// It wrote a fresh tree because the changed nodes did not fit the free room.
    for_room: bool,
    slot: CheckpointSlot,
    /// Segments its nodes went to.
    segments: BTreeSet<u32>,
    /// Node places the new tree no longer references.
    freed: Vec<u64>,
    blocks: u64,
}

/// Reads the nodes `wanted` names, all at once; refuses a place outside every segment.
pub(crate) async fn read_nodes<D: BlockDevice>(
    dev: &D,
    base: u64,
    geo: &Geometry,
    wanted: &[Need],
) -> std::io::Result<Vec<AlignedBuf>> {
    for n in wanted {
        if geo
            .segment_of(n.paddr)
            .is_none_or(|s| geo.segment_start(s) == n.paddr)
        {
            return Err(failure(format!(
                "metadata tree node at block {} lies outside every segment",
                n.paddr
            )));
        }
    }
    let reads = wanted.iter().map(|n| async move {
        let (res, buf) = dev
            .read_at(AlignedBuf::new(BLOCK), base + n.paddr * BLOCK as u64)
            .await;
        res.map(|_| buf)
    });
    futures::future::join_all(reads).await.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a map: old entries cut into random pages, changes of every kind (a new value,
    /// a removal, a new key before, between and after the old ones, a removal of a key that
    /// is not there) merged page by page give the map with the changes applied.
    #[test]
    fn merging_changes_into_a_scan_gives_the_changed_tree() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for round in 0..300 {
            let key = |i: u32| format!("k{i:05}").into_bytes();
            let old: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = (0..rng.random_range(0..60))
                .map(|_| {
                    let i = rng.random_range(0..200) * 2;
                    (key(i), vec![1])
                })
                .collect();
            let mut want = old.clone();
            let mut changes: std::collections::BTreeMap<Vec<u8>, Op> = Default::default();
            for _ in 0..rng.random_range(0..40) {
                // Odd keys are never in the old tree: new ones, or removals of nothing.
                let k = key(rng.random_range(0..401));
                let op = match rng.random_range(0..3) {
                    0 => Op::Delete(k.clone()),
                    _ => Op::Put(k.clone(), vec![2, round as u8]),
                };
                match &op {
                    Op::Put(k, v) => want.insert(k.clone(), v.clone()),
                    Op::Delete(k) => want.remove(k),
                };
                // One change per key: the last one stands, as in the model.
                changes.insert(k, op);
            }
            let mut changes = changes
                .into_values()
                .collect::<Vec<_>>()
                .into_iter()
                .peekable();
            let entries: Vec<(Vec<u8>, Vec<u8>)> = old.into_iter().collect();
            let mut got = Vec::new();
            let mut push = |k: &[u8], v: &[u8]| {
                got.push((k.to_vec(), v.to_vec()));
                Ok::<(), ()>(())
            };
            let mut at = 0;
            loop {
                let end = (at + rng.random_range(0..8)).min(entries.len());
                let last = end == entries.len() && rng.random_bool(0.7);
                merge_page(&entries[at..end], &mut changes, last, &mut push).unwrap();
                at = end;
                if last {
                    break;
                }
            }
            let want: Vec<_> = want.into_iter().collect();
            assert_eq!(got, want, "round {round}");
        }
    }
}
