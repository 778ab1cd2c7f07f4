//! Checkpoints: the records of what changed since the last one go into the metadata tree
//! (`metatree.rs`), its dirty nodes are appended to metadata segments, the device is synced,
//! and a slot names the new root. A checkpoint's cost follows what changed, not the size of
//! the index. Mount walks the tree back into the index.
//!
//! Nodes are never written over: a node replaced by a checkpoint stays live in its segment
//! until the slot naming the new root is durable; a metadata segment is freed when none of
//! its nodes is live. When the tree has grown wasteful (underfull nodes, thinly used
//! segments) a checkpoint writes a fresh one into new segments and frees all the old ones.

use crate::device::{AlignedBuf, BlockDevice, BLOCK};
use crate::error::ShardFailure;
use crate::format::{CheckpointSlot, JournalPos, SegmentHeader, SegmentKind};
use crate::index::Geometry;
use crate::index::Index;
use crate::metatree::{
    chunks, collection_key, fresh_tree_blocks, object_key, object_record, Loader, MetaTree,
};
use crate::segments::SegKind;
use crate::store::{io_error, NativeStore};
use carmine_btree::{LoadError, Need, Tree, TreeError, Visited, GENERATION_MAX};
use carmine_store::Result;
use std::collections::BTreeSet;
use std::collections::VecDeque;

/// Tree nodes read at once (mount, and faulting in what a checkpoint changes).
const READS_AT_ONCE: usize = 64;

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
    for (id, n) in std::mem::take(&mut index.dead) {
        ops.extend((0..n).map(|i| Op::Delete(object_key(id, i))));
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
        let Some(body) = o.body() else {
            return Err(failure(format!(
                "{cid}/{oid:?} changed but its body is paged out"
            )));
        };
        let rec = object_record(cid, &oid, o.size, body);
        let mut n = 0;
        for (i, c) in chunks(&rec).enumerate() {
            ops.push(Op::Put(object_key(o.id, i as u32), c.to_vec()));
            n = i as u32 + 1;
        }
        for i in n..o.stored_chunks {
            ops.push(Op::Delete(object_key(o.id, i)));
        }
        o.stored_chunks = n;
        index.residency.cleaned(cid, &oid, o);
    }
    sort(&mut ops);
    Ok(ops)
}

/// A tree with `old`'s entries, written afresh: in key order, so its nodes are full (splits
/// at a node's end keep the left one full). `old` must be wholly loaded.
fn compacted(old: &Tree) -> std::io::Result<Tree> {
    let mut t = Tree::new();
    let entries = old
        .range(b"", None, usize::MAX)
        .map_err(|e| failure(format!("metadata tree: {e}")))?;
    for (k, v) in entries {
        t.insert(&k, &v)
            .map_err(|e| failure(format!("metadata tree: {e}")))?;
    }
    Ok(t)
}

/// In key order (each key appears once): records land in id order, so a fresh tree's nodes
/// fill up (splits at a node's end keep it full), and changes near each other share reads.
fn sort(ops: &mut [Op]) {
    ops.sort_unstable_by(|a, b| a.key().cmp(b.key()));
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
        let cache_nodes = (self.config.metadata_cache_bytes / BLOCK as u64) as usize;
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
        Ok(())
    }

    /// Applies `ops` to the tree, writes its dirty nodes, syncs, and writes the slot.
    /// `new_tree`: the tree is new (every record is in `ops`); `compact`: write the tree
    /// afresh after the changes.
    async fn write_checkpoint(
        &self,
        ops: Vec<Op>,
        pos: JournalPos,
        new_tree: bool,
        mut compact: bool,
    ) -> std::io::Result<Written> {
        // A tree written afresh is built from the whole old one: load it first, and the
        // changes then find every node they reach.
        if compact {
            self.load_whole_tree().await?;
        }
        let all_loaded = {
            let st = self.st.borrow();
            st.meta.tree.as_ref().map_or(0, |t| t.loaded()) as u64 >= st.meta.nodes
        };
        if !all_loaded && !new_tree && !compact {
            self.fault_in(&ops).await?;
        }
        // What the reads ahead could not foresee: a removal that empties a leaf sends the
        // keys of its range to a neighbour not read yet. Changes fail before they change
        // anything, so the one that needs a node is tried again once it is loaded.
        for op in &ops {
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
        // More changed nodes than room: write the tree afresh, which `checkpoint` made sure
        // fits (`fresh_tree_blocks` is an upper bound).
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
        if no_room {
            compact = true;
            self.load_whole_tree().await?;
        }
        if compact {
            let mut st = self.st.borrow_mut();
            let fresh = compacted(st.meta.tree.as_ref().expect("a checkpoint has a tree"))?;
            st.meta.tree = Some(fresh);
            // New nodes go to new segments; every old one is freed once the slot is.
            st.meta.open = None;
        }
        let fresh = new_tree || compact;
        let mut blocks: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut segments = BTreeSet::new();
        let (root, freed) = {
            let mut st = self.st.borrow_mut();
            let st = &mut *st;
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
            let placed = self.place_nodes(&mut tree, st, &mut blocks, &mut segments);
            st.meta.tree = Some(tree);
            placed
        };
        let written_blocks = blocks.len() as u64;
        self.write_runs(blocks).await?;
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
            slot,
            segments,
            freed,
            blocks: written_blocks,
        })
    }

    /// Gives `tree`'s dirty nodes places (appending them to `blocks`, with the headers of
    /// the segments opened for them; the caller checked the room): the new root and the
    /// places no longer referenced.
    fn place_nodes(
        &self,
        tree: &mut Tree,
        st: &mut crate::store::State,
        blocks: &mut Vec<(u64, Vec<u8>)>,
        segments: &mut BTreeSet<u32>,
    ) -> (u64, Vec<u64>) {
        // Nodes carry the generation of the slot that will name them: a reader of an older
        // slot refuses a node of a later one found where one of its own used to be.
        let generation = (st.slot.generation + 1).min(GENERATION_MAX);
        let geo = &self.geo;
        let (meta, segs) = (&mut st.meta, &mut st.segments);
        let mut place = || {
            let (s, next) = match meta.open {
                Some((s, next)) if next < geo.segment_start(s) + geo.segment_blocks => (s, next),
                _ => {
                    let (s, seq) = segs.open(SegKind::Checkpoint).expect("room counted");
                    let header = SegmentHeader {
                        uuid: self.uuid,
                        shard: self.shard,
                        kind: SegmentKind::Checkpoint,
                        seq,
                        nonce: rand::random(),
                    };
                    blocks.push((geo.segment_start(s), header.encode().to_vec()));
                    (s, geo.segment_start(s) + 1)
                }
            };
            meta.open = Some((s, next + 1));
            meta.take(s);
            segments.insert(s);
            next
        };
        let flushed = tree.flush_at(generation, &mut place);
        blocks.extend(flushed.writes);
        (flushed.root, flushed.freed)
    }

    /// Writes blocks, each run of adjacent ones in one device write.
    async fn write_runs(&self, mut blocks: Vec<(u64, Vec<u8>)>) -> std::io::Result<()> {
        blocks.sort_unstable_by_key(|(p, _)| *p);
        let mut i = 0;
        while i < blocks.len() {
            let mut j = i + 1;
            while j < blocks.len() && blocks[j].0 == blocks[j - 1].0 + 1 {
                j += 1;
            }
            let mut buf = AlignedBuf::new((j - i) * BLOCK);
            for (_, b) in &blocks[i..j] {
                buf.extend_from_slice(b);
                buf.pad_to_block();
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

    /// Loads every node of the tree that is not in memory, a subtree at a time, many reads
    /// at once (a tree written afresh is built from the whole old one).
    async fn load_whole_tree(&self) -> std::io::Result<()> {
        const PAGE: usize = 4096;
        let mut from: Vec<u8> = Vec::new();
        loop {
            let page = {
                let st = self.st.borrow();
                let tree = st.meta.tree.as_ref().expect("a checkpoint has a tree");
                tree.range(&from, None, PAGE)
            };
            match page {
                Ok(page) if page.len() < PAGE => return Ok(()),
                Ok(page) => {
                    // The smallest key after the page's last.
                    from = page.last().expect("a full page").0.clone();
                    from.push(0);
                }
                Err(TreeError::Need(n)) => {
                    let mut queue = VecDeque::from([n]);
                    while !queue.is_empty() {
                        let batch: Vec<Need> =
                            queue.drain(..queue.len().min(READS_AT_ONCE)).collect();
                        queue.extend(self.load_nodes(&batch).await?);
                    }
                }
                Err(e) => return Err(failure(format!("metadata tree: {e}"))),
            }
        }
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

/// Mount: reads the whole tree whose root is at `root` (named by the slot of `generation`)
/// and rebuilds the index from it, holding no more than its inner nodes, `bodies` record
/// bytes of object bodies, and the bodies of `needed` (which the journal replay changes).
/// Level by level, a batch of nodes at a time: inner nodes are kept (trimmed to
/// `cache_nodes` at the end), leaves are read once, in key order, and dropped.
/// Errors say what is wrong with the tree (the caller refuses the mount).
pub(crate) async fn load_tree<D: BlockDevice>(
    dev: &D,
    base: u64,
    geo: Geometry,
    (root, generation): (u64, u64),
    cache_nodes: usize,
    bodies: u64,
    needed: crate::metatree::Names,
) -> std::result::Result<(Index, MetaTree), String> {
    let mut tree = Tree::open_at(root, generation);
    let mut queue = std::collections::VecDeque::from([Need {
        paddr: root,
        key: Vec::new(),
    }]);
    let mut loader = Loader::paging(geo, bodies, needed);
    // A node reached twice (crafted pointers) is refused before it is read again: a tree
    // whose nodes all point to one child would otherwise grow without bound in memory.
    let mut seen = std::collections::HashSet::new();
    let mut paddrs = Vec::new();
    while !queue.is_empty() {
        let batch: Vec<Need> = queue.drain(..queue.len().min(READS_AT_ONCE)).collect();
        for n in &batch {
            if !seen.insert(n.paddr) {
                return Err(format!("tree node at block {} is reached twice", n.paddr));
            }
            paddrs.push(n.paddr);
        }
        let blocks = read_nodes(dev, base, &geo, &batch)
            .await
            .map_err(|e| e.to_string())?;
        for (n, b) in batch.iter().zip(&blocks) {
            match tree.visit(n, b.full()).map_err(|e| e.to_string())? {
                Visited::Inner(children) => queue.extend(children),
                // Every leaf is at level 0, below every inner node: the queue reaches the
                // leaves once every inner node is in, and then in key order.
                Visited::Leaf(entries) => {
                    for (k, v) in &entries {
                        loader
                            .push(k, v)
                            .map_err(|e| format!("metadata tree: {e}"))?;
                    }
                }
            }
        }
    }
    let index = loader.finish().map_err(|e| format!("metadata tree: {e}"))?;
    let mut meta = MetaTree::loaded(tree, &geo, &paddrs)?;
    if let Some(t) = meta.tree.as_mut() {
        t.evict_to(cache_nodes);
    }
    Ok((index, meta))
}
