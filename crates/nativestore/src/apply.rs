//! Turning a transaction into placed data blocks and metadata deltas.
//!
//! Two phases, so a transaction applies wholly or not at all without an undo log:
//! 1. `plan` checks the whole transaction against the current index, simulating only what
//!    decides errors (which collections and objects exist, whether a collection is empty), in
//!    the same order as the memory store, so both reject the same transactions the same way.
//!    It also bounds the blocks and metadata the record will need and lists the old blocks a
//!    partial overwrite or a clone may have to read.
//! 2. `execute` cannot fail short of a bug: it applies each op's deltas to the index at once
//!    (later ops see earlier ones), places new data blocks in the open batch and encodes the
//!    deltas into it.

use crate::cache::BlockMap;
use crate::delta::Delta;
use crate::device::BLOCK;
use crate::error::ShardFailure;
use crate::extents::{Extent, EXTENT_BLOCKS_MAX};
use crate::index::{BlockRef, Index};
use crate::store::{io_error, NativeStore, State, NO_CID};
use crate::BlockDevice;
use bytes::{Bytes, BytesMut};
use carmine_store::checks::{
    check_attr_name, check_compares_lead, check_expect, check_extent, check_io_len, check_oid,
    check_value, compared_value, error, judge_expect,
};
use carmine_store::{Op, Result, StoreErrorKind, Transaction};
use carmine_types::{crc32c, CollectionId};
use std::collections::HashMap;

const B: u64 = BLOCK as u64;
/// Encoded size of a one-block `SetExtent` delta, less the object name: an upper bound per
/// block of a longer one too (see [`Delta::set_extent_len`]).
pub(crate) const SET_BLOCK_BYTES: usize = 1 + 8 + 4 + 8 + 8 + 4;
const DELTA_SLACK: usize = 64;

pub(crate) struct Plan {
    /// Upper bounds for the record.
    pub data_blocks: usize,
    pub meta_bytes: usize,
    /// Blocks that must exist for the store to have room (writes and clones only).
    pub growth_blocks: usize,
    /// Blocks of the current state the execution may read.
    pub preread: Vec<BlockRef>,
}

/// What the simulation tracks: existence overrides on top of the index.
struct Shadow<'a> {
    index: &'a Index,
    colls: HashMap<CollectionId, bool>,
    objects: HashMap<(CollectionId, &'a str), bool>,
    /// Change in object count per collection.
    counts: HashMap<CollectionId, i64>,
}

impl<'a> Shadow<'a> {
    fn coll_exists(&self, cid: CollectionId) -> bool {
        self.colls
            .get(&cid)
            .copied()
            .unwrap_or_else(|| self.index.colls.contains_key(&cid))
    }
    fn require_coll(&self, cid: CollectionId, oid: &str) -> Result<()> {
        if self.coll_exists(cid) {
            Ok(())
        } else {
            Err(error(
                StoreErrorKind::CollectionNotFound,
                cid,
                oid,
                "no such collection",
            ))
        }
    }
    fn exists(&self, cid: CollectionId, oid: &'a str) -> bool {
        // Objects of a collection removed in this transaction were all removed first (it had
        // to be empty), so they carry overrides; nothing else needs the collection's history.
        self.objects
            .get(&(cid, oid))
            .copied()
            .unwrap_or_else(|| self.index.object(cid, oid).is_some())
    }
    fn require(&self, cid: CollectionId, oid: &'a str) -> Result<()> {
        self.require_coll(cid, oid)?;
        if self.exists(cid, oid) {
            Ok(())
        } else {
            Err(error(
                StoreErrorKind::ObjectNotFound,
                cid,
                oid,
                "no such object",
            ))
        }
    }
    fn create(&mut self, cid: CollectionId, oid: &'a str) -> Result<()> {
        self.require_coll(cid, oid)?;
        if !self.exists(cid, oid) {
            self.objects.insert((cid, oid), true);
            *self.counts.entry(cid).or_default() += 1;
        }
        Ok(())
    }
    fn remove(&mut self, cid: CollectionId, oid: &'a str) {
        self.objects.insert((cid, oid), false);
        *self.counts.entry(cid).or_default() -= 1;
    }
    fn len(&self, cid: CollectionId) -> i64 {
        self.index.colls.get(&cid).map_or(0, |c| c.len() as i64)
            + self.counts.get(&cid).copied().unwrap_or(0)
    }
    /// The blocks of an object as they stand before the transaction (if it still is that
    /// object: one removed or replaced in the transaction has none of them).
    fn pre_blocks(&self, cid: CollectionId, oid: &str) -> Option<&'a crate::index::Body> {
        self.index.body_of(cid, oid)
    }
}

fn span(off: u64, len: u64) -> usize {
    if len == 0 {
        0
    } else {
        ((off + len - 1) / B - off / B + 1) as usize
    }
}

/// The edge blocks of `[off, off+len)` that are only partly covered.
fn partial_edges(off: u64, len: u64) -> impl Iterator<Item = u64> {
    let end = off + len;
    let head = (len > 0 && !off.is_multiple_of(B)).then_some(off / B);
    let tail = (len > 0 && !end.is_multiple_of(B)).then(|| (end - 1) / B);
    head.into_iter()
        .chain(tail.filter(move |t| Some(*t) != head))
}

pub(crate) fn plan(index: &Index, txn: &Transaction) -> Result<Plan> {
    let mut sh = Shadow {
        index,
        colls: HashMap::new(),
        objects: HashMap::new(),
        counts: HashMap::new(),
    };
    let mut p = Plan {
        data_blocks: 0,
        meta_bytes: 0,
        growth_blocks: 0,
        preread: Vec::new(),
    };
    let pre_edges = |p: &mut Plan, sh: &Shadow, cid, oid: &str, off, len| {
        if let Some(o) = sh.pre_blocks(cid, oid) {
            for l in partial_edges(off, len) {
                if let Some(b) = o.blocks.get(l) {
                    p.preread.push(b);
                }
            }
        }
    };
    check_compares_lead(txn)?;
    // Its objects were made resident and pinned (`paging.rs`): a body missing now would
    // read as an object without data.
    for (cid, oid) in txn.ops.iter().flat_map(Op::objects).flatten() {
        if index.object(cid, oid).is_some_and(|o| o.body.is_none()) {
            return Err(io_error(format!(
                "internal: {cid}/{oid:?} is paged out while a transaction plans on it"
            )));
        }
    }
    for op in &txn.ops {
        match op {
            // Compares lead the transaction, so the index is still the state they judge.
            Op::Compare { cid, oid, expect } => {
                check_expect(*cid, oid, expect)?;
                sh.require_coll(*cid, oid)?;
                let exists = index.object(*cid, oid).is_some();
                let found = index
                    .body_of(*cid, oid)
                    .and_then(|o| compared_value(expect, |n| o.attrs.get(n), |k| o.omap.get(k)));
                judge_expect(*cid, oid, expect, exists, found)?;
            }
            Op::CreateCollection { cid } => {
                if sh.coll_exists(*cid) {
                    return Err(error(
                        StoreErrorKind::CollectionExists,
                        *cid,
                        "",
                        "collection already exists",
                    ));
                }
                sh.colls.insert(*cid, true);
                // Re-created after a removal here: the index's objects are gone.
                let stale = index.colls.get(cid).map_or(0, |c| c.len() as i64);
                sh.counts.insert(*cid, -stale);
                p.meta_bytes += DELTA_SLACK;
            }
            Op::RemoveCollection { cid } => {
                if !sh.coll_exists(*cid) {
                    return Err(error(
                        StoreErrorKind::CollectionNotFound,
                        *cid,
                        "",
                        "no such collection",
                    ));
                }
                let n = sh.len(*cid);
                if n > 0 {
                    return Err(error(
                        StoreErrorKind::CollectionNotEmpty,
                        *cid,
                        "",
                        format!("collection holds {n} objects"),
                    ));
                }
                sh.colls.insert(*cid, false);
                p.meta_bytes += DELTA_SLACK;
            }
            Op::Touch { cid, oid } => {
                check_oid(*cid, oid)?;
                sh.create(*cid, oid)?;
                p.meta_bytes += DELTA_SLACK + oid.len();
            }
            Op::Write {
                cid,
                oid,
                off,
                data,
            } => {
                check_oid(*cid, oid)?;
                check_io_len(*cid, oid, data.len() as u64)?;
                check_extent(*cid, oid, *off, data.len() as u64)?;
                sh.create(*cid, oid)?;
                let n = span(*off, data.len() as u64);
                p.data_blocks += n;
                p.growth_blocks += n;
                p.meta_bytes += n * (SET_BLOCK_BYTES + oid.len()) + 3 * (DELTA_SLACK + oid.len());
                pre_edges(&mut p, &sh, *cid, oid, *off, data.len() as u64);
            }
            Op::Zero { cid, oid, off, len } => {
                check_oid(*cid, oid)?;
                check_extent(*cid, oid, *off, *len)?;
                sh.create(*cid, oid)?;
                p.data_blocks += 2;
                p.meta_bytes += 2 * (SET_BLOCK_BYTES + oid.len()) + 6 * (DELTA_SLACK + oid.len());
                pre_edges(&mut p, &sh, *cid, oid, *off, *len);
            }
            Op::Truncate { cid, oid, size } => {
                check_oid(*cid, oid)?;
                check_extent(*cid, oid, *size, 0)?;
                sh.create(*cid, oid)?;
                p.data_blocks += 1;
                p.meta_bytes += SET_BLOCK_BYTES + 5 * (DELTA_SLACK + oid.len());
                if let Some(b) = sh
                    .pre_blocks(*cid, oid)
                    .and_then(|o| o.blocks.get(size / B))
                {
                    p.preread.push(b);
                }
            }
            Op::Remove { cid, oid } => {
                check_oid(*cid, oid)?;
                sh.require(*cid, oid)?;
                sh.remove(*cid, oid);
                p.meta_bytes += DELTA_SLACK + oid.len();
            }
            Op::SetAttrs { cid, oid, attrs } => {
                check_oid(*cid, oid)?;
                for (name, value) in attrs {
                    check_attr_name(*cid, oid, name)?;
                    check_value(*cid, oid, "xattr value", value.len())?;
                    p.meta_bytes += DELTA_SLACK + oid.len() + name.len() + value.len();
                }
                sh.create(*cid, oid)?;
                p.meta_bytes += DELTA_SLACK + oid.len();
            }
            Op::RmAttr { cid, oid, name } => {
                check_oid(*cid, oid)?;
                check_attr_name(*cid, oid, name)?;
                sh.require(*cid, oid)?;
                p.meta_bytes += DELTA_SLACK + oid.len() + name.len();
            }
            Op::OmapSetKeys { cid, oid, kvs } => {
                check_oid(*cid, oid)?;
                for (k, v) in kvs {
                    check_value(*cid, oid, "omap key", k.len())?;
                    check_value(*cid, oid, "omap value", v.len())?;
                    p.meta_bytes += 8 + k.len() + v.len();
                }
                sh.create(*cid, oid)?;
                p.meta_bytes += 2 * (DELTA_SLACK + oid.len());
            }
            Op::OmapRmKeys { cid, oid, keys } => {
                check_oid(*cid, oid)?;
                sh.require(*cid, oid)?;
                p.meta_bytes +=
                    DELTA_SLACK + oid.len() + keys.iter().map(|k| 4 + k.len()).sum::<usize>();
            }
            Op::OmapClear { cid, oid } => {
                check_oid(*cid, oid)?;
                sh.require(*cid, oid)?;
                p.meta_bytes += DELTA_SLACK + oid.len();
            }
            Op::OmapSetHeader { cid, oid, header } => {
                check_oid(*cid, oid)?;
                check_value(*cid, oid, "omap header", header.len())?;
                sh.create(*cid, oid)?;
                p.meta_bytes += 2 * (DELTA_SLACK + oid.len()) + header.len();
            }
            Op::Clone { cid, src, dst } => {
                check_oid(*cid, src)?;
                check_oid(*cid, dst)?;
                sh.require(*cid, src)?;
                if src == dst {
                    continue;
                }
                // The source may have grown earlier in this transaction: bound by both.
                let pre = sh.pre_blocks(*cid, src);
                let n = pre.map_or(0, |o| o.blocks.blocks() as usize) + p.data_blocks;
                if let Some(o) = pre {
                    p.preread.extend(o.blocks.iter().map(|(_, b)| b));
                }
                sh.create(*cid, dst)?;
                p.data_blocks += n;
                p.growth_blocks += n;
                p.meta_bytes +=
                    n * (SET_BLOCK_BYTES + dst.len()) + 4 * (DELTA_SLACK + src.len() + dst.len());
            }
            Op::CloneRange {
                cid,
                src,
                dst,
                src_off,
                len,
                dst_off,
            } => {
                check_oid(*cid, src)?;
                check_oid(*cid, dst)?;
                check_extent(*cid, src, *src_off, *len)?;
                check_extent(*cid, dst, *dst_off, *len)?;
                sh.require(*cid, src)?;
                let mut src_blocks = p.data_blocks;
                if *len > 0 {
                    if let Some(o) = sh.pre_blocks(*cid, src) {
                        let r = o.blocks.range(src_off / B..(src_off + len - 1) / B + 1);
                        for (_, b) in r {
                            p.preread.push(b);
                            src_blocks += 1;
                        }
                    }
                    if let Some(o) = sh.pre_blocks(*cid, dst) {
                        let r = o.blocks.range(dst_off / B..(dst_off + len - 1) / B + 1);
                        p.preread.extend(r.map(|(_, b)| b));
                    }
                }
                sh.create(*cid, dst)?;
                // Edges zeroed (two blocks), then each source block lands on at most two
                // destination blocks; a block may be rewritten more than once.
                let n = (2 * src_blocks + 2).min(2 * span(*dst_off, *len) + 4);
                p.data_blocks += n;
                p.growth_blocks += n;
                p.meta_bytes += n * (SET_BLOCK_BYTES + dst.len()) + 6 * (DELTA_SLACK + dst.len());
            }
        }
    }
    Ok(p)
}

/// Data blocks placed for consecutive logical blocks, waiting to be mapped as one extent.
struct Run {
    first: u64,
    paddr: u64,
    n: usize,
    crcs: [u32; EXTENT_BLOCKS_MAX as usize],
}

impl Default for Run {
    fn default() -> Self {
        Self {
            first: 0,
            paddr: 0,
            n: 0,
            crcs: [0; EXTENT_BLOCKS_MAX as usize],
        }
    }
}

/// Executes a planned transaction against the state: see the module comment.
pub(crate) struct Exec<'s, D: BlockDevice> {
    pub device: std::marker::PhantomData<D>,
    pub st: &'s mut State,
    pub pre: &'s BlockMap<Bytes>,
    pub meta: BytesMut,
}

impl<D: BlockDevice> Exec<'_, D> {
    fn emit(&mut self, d: Delta) -> Result<()> {
        self.st
            .index
            .apply(&d)
            .map_err(|e| io_error(format!("internal: delta does not apply: {e}")))?;
        NativeStore::<D>::invalidate_freed(self.st);
        d.encode(&mut self.meta);
        Ok(())
    }

    /// Puts a full block of data in the open batch; returns where it will live. `run` blocks
    /// placed before it wait for the same `SetExtent`. Refuses to let the record outgrow its
    /// segment should the plan's bound ever be wrong.
    fn place(&mut self, data: Bytes, oid: &str, run: usize) -> Result<BlockRef> {
        debug_assert_eq!(data.len(), BLOCK);
        let crc = crc32c(&data);
        // This transaction's deltas so far and the SetExtent about to follow.
        let pending_meta = self.meta.len() + Delta::set_extent_len(oid.len(), run + 1);
        let b = self
            .st
            .journal
            .open
            .as_mut()
            .expect("batch opened before execution");
        if !b.fits(pending_meta, 1) {
            return Err(io_error(
                "internal: transaction outgrew its record estimate",
            ));
        }
        let paddr = b.next_data_block();
        b.data.push(data.clone());
        self.st.cache.add_dirty(paddr, data);
        Ok(BlockRef { paddr, crc })
    }

    fn set_block(&mut self, cid: CollectionId, oid: &str, lblock: u64, data: Bytes) -> Result<()> {
        let mut run = Run::default();
        self.put_block(&mut run, cid, oid, lblock, data)?;
        self.map_run(&mut run, cid, oid)
    }

    /// Places the data of logical block `l`, to be mapped with the blocks before it in `run`
    /// as one extent when they follow each other (else `run` is mapped first).
    fn put_block(
        &mut self,
        run: &mut Run,
        cid: CollectionId,
        oid: &str,
        l: u64,
        data: Bytes,
    ) -> Result<()> {
        if run.n > 0 && (l != run.first + run.n as u64 || run.n as u64 == EXTENT_BLOCKS_MAX) {
            self.map_run(run, cid, oid)?;
        }
        let b = self.place(data, oid, run.n)?;
        if run.n > 0 && b.paddr != run.paddr + run.n as u64 {
            // Never expected (a transaction's blocks go to one batch, in order), but an
            // extent must be contiguous on the device.
            return Err(io_error(
                "internal: a write's blocks were not placed in order",
            ));
        }
        if run.n == 0 {
            (run.first, run.paddr) = (l, b.paddr);
        }
        run.crcs[run.n] = b.crc;
        run.n += 1;
        Ok(())
    }

    /// Maps the blocks gathered in `run` (if any) as one extent.
    fn map_run(&mut self, run: &mut Run, cid: CollectionId, oid: &str) -> Result<()> {
        if run.n == 0 {
            return Ok(());
        }
        let n = std::mem::take(&mut run.n);
        self.emit(Delta::SetExtent {
            cid,
            oid: oid.to_owned(),
            lblock: run.first,
            extent: Extent::new(run.paddr, &run.crcs[..n]),
        })
    }

    /// Current content of a mapped block.
    fn content(&self, b: &BlockRef) -> Result<Bytes> {
        self.st
            .cache
            .get(b.paddr)
            .or_else(|| self.pre.get(&b.paddr))
            .cloned()
            .ok_or_else(|| io_error(format!("internal: block {} was not read ahead", b.paddr)))
    }

    fn block_of(&self, cid: CollectionId, oid: &str, l: u64) -> Option<BlockRef> {
        self.st.index.body_of(cid, oid)?.blocks.get(l)
    }

    fn size_of(&self, cid: CollectionId, oid: &str) -> u64 {
        self.st.index.object(cid, oid).map_or(0, |o| o.size)
    }

    /// Writes `data` at `off`: whole blocks are taken as they are (no copy of the payload),
    /// partial ones merged into the old content.
    fn write_bytes(&mut self, cid: CollectionId, oid: &str, off: u64, data: &Bytes) -> Result<()> {
        let end = off + data.len() as u64;
        let mut pos = off;
        let mut run = Run::default();
        while pos < end {
            let l = pos / B;
            let bstart = l * B;
            let to = end.min(bstart + B);
            let src = data.slice((pos - off) as usize..(to - off) as usize);
            let block = if src.len() == BLOCK {
                src
            } else {
                let mut buf = BytesMut::zeroed(BLOCK);
                if let Some(b) = self.block_of(cid, oid, l) {
                    buf.copy_from_slice(&self.content(&b)?);
                }
                buf[(pos - bstart) as usize..(to - bstart) as usize].copy_from_slice(&src);
                buf.freeze()
            };
            // Old content of a partial block was read above from the map as it stood: the
            // run is mapped after every block is placed.
            self.put_block(&mut run, cid, oid, l, block)?;
            pos = to;
        }
        self.map_run(&mut run, cid, oid)
    }

    /// Zeros `[from, to)`: whole blocks are unmapped, partial ones rewritten (or unmapped when
    /// nothing but zeros is left).
    fn zero_range(&mut self, cid: CollectionId, oid: &str, from: u64, to: u64) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        let first_full = from.div_ceil(B);
        let end_full = to / B;
        if first_full < end_full {
            let mapped = self
                .st
                .index
                .body_of(cid, oid)
                .is_some_and(|o| o.blocks.any_in(first_full..end_full));
            if mapped {
                self.emit(Delta::Punch(cid, oid.to_owned(), first_full, end_full))?;
            }
        }
        for l in partial_edges(from, to - from) {
            let Some(b) = self.block_of(cid, oid, l) else {
                continue;
            };
            let bstart = l * B;
            let mut buf = BytesMut::from(&self.content(&b)?[..]);
            let a = from.max(bstart) - bstart;
            let z = to.min(bstart + B) - bstart;
            buf[a as usize..z as usize].fill(0);
            if buf.iter().all(|&x| x == 0) {
                self.emit(Delta::Punch(cid, oid.to_owned(), l, l + 1))?;
            } else {
                self.set_block(cid, oid, l, buf.freeze())?;
            }
        }
        Ok(())
    }

    fn grow_to(&mut self, cid: CollectionId, oid: &str, end: u64) -> Result<()> {
        if end > self.size_of(cid, oid) {
            self.emit(Delta::SetSize(cid, oid.to_owned(), end))?;
        }
        Ok(())
    }

    fn touch(&mut self, cid: CollectionId, oid: &str) -> Result<()> {
        if self.st.index.object(cid, oid).is_none() {
            self.emit(Delta::Touch(cid, oid.to_owned()))?;
        }
        Ok(())
    }

    pub fn op(&mut self, op: Op) -> Result<()> {
        match op {
            // Judged by `plan`; nothing to record.
            Op::Compare { .. } => Ok(()),
            Op::CreateCollection { cid } => self.emit(Delta::CreateCollection(cid)),
            Op::RemoveCollection { cid } => self.emit(Delta::RemoveCollection(cid)),
            Op::Touch { cid, oid } => self.touch(cid, &oid),
            Op::Write {
                cid,
                oid,
                off,
                data,
            } => {
                self.touch(cid, &oid)?;
                if data.is_empty() {
                    return Ok(());
                }
                self.write_bytes(cid, &oid, off, &data)?;
                self.grow_to(cid, &oid, off + data.len() as u64)
            }
            Op::Zero { cid, oid, off, len } => {
                self.touch(cid, &oid)?;
                if len == 0 {
                    return Ok(());
                }
                self.zero_range(cid, &oid, off, off + len)?;
                self.grow_to(cid, &oid, off + len)
            }
            Op::Truncate { cid, oid, size } => {
                self.touch(cid, &oid)?;
                let old = self.size_of(cid, &oid);
                if size < old {
                    let kept = size.div_ceil(B);
                    let beyond = self
                        .st
                        .index
                        .body_of(cid, &oid)
                        .is_some_and(|o| o.blocks.any_in(kept..u64::MAX));
                    if beyond {
                        self.emit(Delta::Punch(cid, oid.clone(), kept, u64::MAX))?;
                    }
                    self.zero_range(cid, &oid, size, kept * B)?;
                }
                if size != old {
                    self.emit(Delta::SetSize(cid, oid, size))?;
                }
                Ok(())
            }
            Op::Remove { cid, oid } => self.emit(Delta::Remove(cid, oid)),
            Op::SetAttrs { cid, oid, attrs } => {
                self.touch(cid, &oid)?;
                for (name, value) in attrs {
                    self.emit(Delta::SetAttr(cid, oid.clone(), name, value))?;
                }
                Ok(())
            }
            Op::RmAttr { cid, oid, name } => self.emit(Delta::RmAttr(cid, oid, name)),
            Op::OmapSetKeys { cid, oid, kvs } => {
                self.touch(cid, &oid)?;
                self.emit(Delta::OmapSet(cid, oid, kvs))
            }
            Op::OmapRmKeys { cid, oid, keys } => self.emit(Delta::OmapRm(cid, oid, keys)),
            Op::OmapClear { cid, oid } => self.emit(Delta::OmapClear(cid, oid)),
            Op::OmapSetHeader { cid, oid, header } => {
                self.touch(cid, &oid)?;
                self.emit(Delta::OmapHeader(cid, oid, header))
            }
            Op::Clone { cid, src, dst } => {
                if src == dst {
                    return Ok(());
                }
                let blocks: Vec<(u64, BlockRef)> = self
                    .st
                    .index
                    .body_of(cid, &src)
                    .map(|o| o.blocks.iter().collect())
                    .unwrap_or_default();
                let contents = blocks
                    .iter()
                    .map(|(l, b)| Ok((*l, self.content(b)?)))
                    .collect::<Result<Vec<_>>>()?;
                if self.st.index.object(cid, &dst).is_some() {
                    self.emit(Delta::Remove(cid, dst.clone()))?;
                }
                self.emit(Delta::Touch(cid, dst.clone()))?;
                self.emit(Delta::CopyMeta(cid, src, dst.clone()))?;
                let mut run = Run::default();
                for (l, data) in contents {
                    self.put_block(&mut run, cid, &dst, l, data)?;
                }
                self.map_run(&mut run, cid, &dst)
            }
            Op::CloneRange {
                cid,
                src,
                dst,
                src_off,
                len,
                dst_off,
            } => {
                self.touch(cid, &dst)?;
                if len == 0 {
                    return Ok(());
                }
                let src_size = self.size_of(cid, &src);
                let src_end = (src_off + len).min(src_size);
                let mut parts = Vec::new();
                if src_off < src_end {
                    let blocks: Vec<(u64, BlockRef)> = self
                        .st
                        .index
                        .body_of(cid, &src)
                        .map(|o| o.blocks.range(src_off / B..(src_end - 1) / B + 1).collect())
                        .unwrap_or_default();
                    for (l, b) in blocks {
                        let data = self.content(&b)?;
                        let bstart = l * B;
                        let from = src_off.max(bstart);
                        let to = src_end.min(bstart + B);
                        let part = data.slice((from - bstart) as usize..(to - bstart) as usize);
                        parts.push((from - src_off + dst_off, part));
                    }
                }
                self.zero_range(cid, &dst, dst_off, dst_off + len)?;
                for (at, part) in parts {
                    self.write_bytes(cid, &dst, at, &part)?;
                }
                self.grow_to(cid, &dst, dst_off + len)
            }
        }
    }
}

impl<D: BlockDevice> NativeStore<D> {
    /// The whole submit path: room, plan, read-ahead, execute, then wait for the journal.
    pub(crate) async fn submit_txn(&self, txn: Transaction) -> Result<()> {
        self.check_failed()?;
        if txn.is_empty() {
            return self.drain().await;
        }
        // Bodies paged out are read back while the transaction waits for the lock, so that
        // its reads do not hold up the others; under the lock they are pinned (and read
        // again, in the rare case they were paged out meanwhile). The lock is polled first:
        // it takes its place in line at this first poll, so transactions still apply in the
        // order they were submitted.
        let (guard, read_back) = futures::join!(self.apply_lock.lock(), self.read_back_for(&txn));
        read_back?;
        // Metadata counts too: every checkpoint carries all of it, so names, xattrs and
        // omap entries fill a store just as data does.
        let grows = txn.ops.iter().any(|op| {
            matches!(
                op,
                Op::Write { .. }
                    | Op::Clone { .. }
                    | Op::CloneRange { .. }
                    | Op::Touch { .. }
                    | Op::SetAttrs { .. }
                    | Op::OmapSetKeys { .. }
                    | Op::OmapSetHeader { .. }
                    | Op::CreateCollection { .. }
            )
        });
        self.make_room(grows).await?;
        let pins = self.pin_for(&txn).await?;
        let plan = plan(&self.st.borrow().index, &txn)?;
        {
            let st = self.st.borrow();
            let meta_blocks =
                (st.index.encoded_len() + plan.meta_bytes as u64).div_ceil(BLOCK as u64);
            let used = st.index.live_blocks + meta_blocks;
            if grows && used + plan.growth_blocks as u64 > self.capacity_blocks() {
                return Err(error(
                    StoreErrorKind::NoSpace,
                    NO_CID,
                    "",
                    format!(
                        "{} more data blocks and up to {} metadata bytes would pass the \
                         capacity of {} blocks ({} in use for data, {} for metadata)",
                        plan.growth_blocks,
                        plan.meta_bytes,
                        self.capacity_blocks(),
                        st.index.live_blocks,
                        st.index.encoded_len().div_ceil(BLOCK as u64)
                    ),
                ));
            }
        }
        let pre = self.read_ahead(&plan.preread).await?;
        let batch = {
            let mut st = self.st.borrow_mut();
            self.batch_for(&mut st, plan.meta_bytes, plan.data_blocks)?;
            let data_before = st.journal.open.as_ref().map_or(0, |b| b.data.len());
            let mut exec = Exec::<D> {
                device: std::marker::PhantomData,
                st: &mut st,
                pre: &pre,
                // The plan's bound: encoding never regrows the buffer (it did four times
                // for a 4 KiB write's deltas).
                meta: BytesMut::with_capacity(plan.meta_bytes),
            };
            for op in txn.ops {
                if let Err(e) = exec.op(op) {
                    // Only a bug gets here, after part of the transaction changed the index:
                    // stop the shard rather than let memory and disk disagree.
                    let why = ShardFailure::HalfApplied(e.clone());
                    tracing::error!(shard = self.shard, "{why}");
                    exec.st.failed = Some(why);
                    return Err(e);
                }
            }
            let meta = exec.meta;
            st.stats.transactions += 1;
            let b = st.journal.open.as_mut().expect("opened above");
            if !b.fits(meta.len(), 0) {
                let why =
                    ShardFailure::Internal("transaction metadata outgrew its record estimate");
                let err = io_error(why.to_string());
                st.failed = Some(why);
                return Err(err);
            }
            if meta.is_empty() && b.data.len() == data_before {
                // Nothing to record (e.g. cloning an object onto itself); still acknowledged
                // only after everything before it, like any other transaction.
                b.id
            } else {
                b.meta.extend_from_slice(&meta);
                let (id, added) = (b.id, b.data.len() - data_before);
                st.stats.user_bytes_written += (added * BLOCK) as u64;
                id
            }
        };
        drop(pins);
        drop(guard);
        self.wait_durable(batch).await
    }

    /// Collects the blocks a transaction may read: from memory when there, else the device.
    async fn read_ahead(&self, wanted: &[BlockRef]) -> Result<BlockMap<Bytes>> {
        let mut got = BlockMap::default();
        let mut missing = Vec::new();
        {
            let st = self.st.borrow();
            for b in wanted {
                match st.cache.get(b.paddr) {
                    Some(d) => {
                        got.insert(b.paddr, d.clone());
                    }
                    None => missing.push(*b),
                }
            }
        }
        if !missing.is_empty() {
            let read = self
                .read_blocks(&missing)
                .await
                .map_err(|e| self.block_read_failed(NO_CID, "", e))?;
            got.extend(read);
        }
        Ok(got)
    }
}
