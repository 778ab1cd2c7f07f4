//! Reading paged-out object bodies back from the metadata tree, and pinning the objects a
//! transaction or the cleaner works on (decision 0013, step 3; which bodies are resident is
//! `residency.rs`).
//!
//! A reader needs no lock: it reads the record's nodes, then in one synchronous step checks
//! that the object is still the one it read for, installs the body and uses it, so nothing
//! can page it out in between. Nodes are read without the apply lock, so a checkpoint may
//! run meanwhile; a node read across a checkpoint whose slot became durable is thrown away
//! and read again, since its place may have been freed and reused.
//!
//! The holder of the apply lock pins the objects it will change before reading their
//! bodies back, and they stay resident until its pins end (a guard, so a dropped future
//! ends them too).

use crate::error::ShardFailure;
use crate::extents::{decode_extent_value, ExtentMap, EXTENT_BLOCKS_MAX};
use crate::index::{BlockRef, Body, Onode};
use crate::metatree::{
    decode_object_entries, extent_key, object_end_key, object_key, parse_object_key, piece_fits,
    ObjectEntry, PIECE,
};
use crate::store::{io_error, lookup, NativeStore, State};
use crate::BlockDevice;
use carmine_btree::{walk_node, LoadError, Need, TreeError, Visited, Walked};
use carmine_store::{Op, Result, StoreError, Transaction};
use carmine_types::CollectionId;
use std::cell::RefCell;

/// Rounds in a row a body read may take without getting further before it gives up (a
/// round reads one node; it gets nowhere when a checkpoint or an eviction moved things under
/// it). A record of many leaves takes a round per node on its way, as many as it needs.
pub(crate) const READ_ROUNDS: usize = 4096;

/// Pins of the apply lock's holder; dropping it ends them all.
pub(crate) struct Pins<'a> {
    st: &'a RefCell<State>,
}

impl<'a> Pins<'a> {
    fn new(st: &'a RefCell<State>) -> Self {
        let r = &mut st.borrow_mut().index.residency;
        debug_assert!(!r.pinning, "one pin holder at a time (the apply lock's)");
        // A new epoch: pins of an earlier holder that somehow were not ended do not count.
        r.pin_epoch += 1;
        r.pinning = true;
        Pins { st }
    }
}

impl Drop for Pins<'_> {
    fn drop(&mut self) {
        match self.st.try_borrow_mut() {
            Ok(mut st) => {
                let r = &mut st.index.residency;
                r.pinning = false;
                r.pin_epoch += 1;
            }
            // Never while the state is borrowed (no borrow lives across an await); if it
            // were, the next holder's new epoch still ends these pins.
            Err(_) => tracing::error!("pins ended while the shard state was borrowed"),
        }
    }
}

impl<D: BlockDevice> NativeStore<D> {
    /// Runs `f` on an object and its body, reading the body back first if it is paged out.
    /// Errors as a lookup does for a missing collection or object.
    pub(crate) async fn with_body<R>(
        &self,
        cid: CollectionId,
        oid: &str,
        f: impl FnOnce(&Onode, &Body) -> Result<R>,
    ) -> Result<R> {
        let mut f = Some(f);
        for _ in 0..READ_ROUNDS {
            let paged = {
                let st = self.st.borrow();
                let o = lookup(&st.index, cid, oid)?;
                match o.body() {
                    Some(body) => {
                        o.referenced.set(true);
                        let f = f.take().expect("called once, then returns");
                        return f(o, body);
                    }
                    None => (o.id, o.stored_chunks),
                }
            };
            self.read_body(cid, oid, paged).await?;
        }
        Err(io_error(format!(
            "{cid}/{oid:?}: its metadata kept being paged out before it could be used"
        )))
    }

    /// Reads back the bodies of the objects `txn` names that are paged out, without pinning
    /// them (no lock needed).
    pub(crate) async fn read_back_for(&self, txn: &Transaction) -> Result<()> {
        for (cid, oid) in txn.ops.iter().flat_map(Op::objects).flatten() {
            let paged = {
                let st = self.st.borrow();
                st.index
                    .object(cid, oid)
                    .filter(|o| o.body.is_none())
                    .map(|o| (o.id, o.stored_chunks))
            };
            if let Some(paged) = paged {
                self.read_body(cid, oid, paged).await?;
            }
        }
        Ok(())
    }

    /// Pins the objects `txn` names and reads back those paged out; they stay resident until
    /// the returned guard is dropped. Called with the apply lock held.
    pub(crate) async fn pin_for(&self, txn: &Transaction) -> Result<Pins<'_>> {
        self.pin_objects(|| txn.ops.iter().flat_map(Op::objects).flatten())
            .await
    }

    /// Pins the objects `names` yields (each call yields the same ones) and reads back those
    /// paged out. Called with the apply lock held.
    pub(crate) async fn pin_objects<'n, I>(&self, names: impl Fn() -> I) -> Result<Pins<'_>>
    where
        I: Iterator<Item = (CollectionId, &'n str)>,
    {
        let pins = Pins::new(&self.st);
        // Pinned first, then read: a body read for one cannot push out another. With the
        // apply lock held nothing else changes or removes them, so one pass reads them all
        // and the next finds every one resident.
        for _ in 0..3 {
            let paged: Vec<(CollectionId, String, (u64, u32))> = {
                let mut st = self.st.borrow_mut();
                names()
                    .filter_map(|(cid, oid)| {
                        let id = st.index.pin(cid, oid)?;
                        Some((cid, oid.to_owned(), id))
                    })
                    .collect()
            };
            if paged.is_empty() {
                return Ok(pins);
            }
            for (cid, oid, id) in paged {
                self.read_body(cid, &oid, id).await?;
            }
        }
        Err(io_error(
            "objects of a transaction could not be kept in memory".to_string(),
        ))
    }

    /// Reads the entries of object `cid/oid` (tree id and record pieces `paged`) back from
    /// the tree, its record and then its extents, and installs its body, unless the object
    /// changed meanwhile (removed, replaced, or read back by someone else).
    async fn read_body(&self, cid: CollectionId, oid: &str, paged: (u64, u32)) -> Result<()> {
        let (id, pieces) = paged;
        let (from, to) = (object_key(id, 0), object_end_key(id));
        let installed = self.scan_paged(cid, oid, paged, from, to, |st, entries| {
            install(
                st,
                cid,
                oid,
                id,
                pieces,
                entries,
                self.config.object_cache_bytes,
            )
        });
        installed.await.map(drop)
    }

    /// The mapped blocks `first..=last` of paged-out object `cid/oid` (tree id and record
    /// pieces `paged`), from the extent entries that reach them, without reading the rest of
    /// its body back: a read that misses costs the leaf or two holding its range, not the
    /// whole map. `None` when the object changed meanwhile (the caller looks again).
    pub(crate) async fn paged_blocks(
        &self,
        cid: CollectionId,
        oid: &str,
        paged: (u64, u32),
        first: u64,
        last: u64,
    ) -> Result<Option<Vec<(u64, BlockRef)>>> {
        let id = paged.0;
        // The extent holding `first` starts at most the longest extent before it.
        let from = extent_key(id, first.saturating_sub(EXTENT_BLOCKS_MAX - 1));
        let to = Some(extent_key(id, last.saturating_add(1)));
        let scan = self.scan_paged(cid, oid, paged, from, to, |st, entries| {
            let mut map = ExtentMap::default();
            for (k, v) in entries {
                let Some(ObjectEntry::Extent { id: at, lblock }) = parse_object_key(&k) else {
                    let why = format!("{cid}/{oid:?}: {k:?} is no extent");
                    return Err(metadata_failed(st, why));
                };
                let extent = decode_extent_value(lblock, &v)
                    .map_err(|e| metadata_failed(st, format!("{cid}/{oid:?}: extent: {e}")))?;
                if at != id || !map.push_back(lblock, extent) {
                    let why = format!("{cid}/{oid:?}: extent {lblock} out of place");
                    return Err(metadata_failed(st, why));
                }
            }
            st.stats.paged_block_lookups += 1;
            Ok(map.range(first..last + 1).collect())
        });
        scan.await
    }

    /// Scans the entries of paged-out object `cid/oid` (tree id and record pieces `paged`)
    /// with keys in `[from, to)` (`None`: to the end) and hands them to `then`, in the same
    /// synchronous step as the last check that the object is still paged out as it was;
    /// `None` when it is not (removed, replaced, read back, changed): the caller looks again.
    ///
    /// Entries are gathered across rounds: while the object stays paged out under this id,
    /// cleaned by the same checkpoint, its entries do not change, so those read before a
    /// node was evicted or a checkpoint moved things stay good.
    async fn scan_paged<R>(
        &self,
        cid: CollectionId,
        oid: &str,
        paged: (u64, u32),
        mut from: Vec<u8>,
        to: Option<Vec<u8>>,
        then: impl FnOnce(&mut State, Vec<(Vec<u8>, Vec<u8>)>) -> Result<R>,
    ) -> Result<Option<R>> {
        let (id, pieces) = paged;
        let cleaned_in = self
            .st
            .borrow()
            .index
            .object(cid, oid)
            .map_or(0, |o| o.cleaned_in);
        let below_end = |k: &[u8]| to.as_deref().is_none_or(|t| k < t);
        let mut entries: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut complete = false;
        let mut stuck = 0;
        while stuck < READ_ROUNDS {
            let before = (entries.len(), from.clone());
            let need = {
                let mut st = self.st.borrow_mut();
                let st = &mut *st;
                let still = st.index.object(cid, oid).is_some_and(|o| {
                    o.id == id
                        && o.body.is_none()
                        && o.cleaned_in == cleaned_in
                        && o.stored_chunks == pieces
                });
                if !still {
                    return Ok(None);
                }
                if complete {
                    return then(st, entries).map(Some);
                }
                let Some(tree) = st.meta.tree.as_ref() else {
                    return Err(metadata_failed(
                        st,
                        format!("{cid}/{oid:?} is paged out, but there is no metadata tree"),
                    ));
                };
                let scanned = tree.range_into(&from, to.as_deref(), usize::MAX, &mut entries);
                if let Some((k, _)) = entries.last() {
                    from = k.clone();
                    from.push(0);
                }
                match scanned {
                    Ok(()) => return then(st, entries).map(Some),
                    Err(TreeError::Need(n)) => {
                        // The scan has every entry below the node it needs: go on from
                        // there, so a node read earlier need not stay (or come back).
                        if n.key > from {
                            from.clone_from(&n.key);
                        }
                        let bound = tree.bound_after(&n.key);
                        (n, st.slot.generation, bound)
                    }
                    Err(e) => {
                        return Err(metadata_failed(st, format!("metadata tree: {e}")));
                    }
                }
            };
            match need {
                (n, generation, _) if self.reader_may_grow_tree() => {
                    self.load_for_reader(n, generation).await?
                }
                (n, generation, bound) => {
                    if let Some((leaf, bound)) = self.leaf_for_reader(n, generation, bound).await? {
                        let past = leaf.last().is_some_and(|(k, _)| !below_end(k));
                        let wanted = |k: &[u8]| k >= from.as_slice() && below_end(k);
                        entries.extend(leaf.into_iter().filter(|(k, _)| wanted(k)));
                        match bound {
                            Some(b) if !past && below_end(&b) => from = b,
                            // Nothing in the range lies past this leaf: done, once the
                            // object is checked again (the read awaited).
                            _ => complete = true,
                        }
                    }
                }
            }
            stuck = match (entries.len(), &from) != (before.0, &before.1) || complete {
                true => 0,
                false => stuck + 1,
            };
        }
        Err(io_error(format!(
            "{cid}/{oid:?}: its metadata could not be read back: the tree kept changing \
             under the read"
        )))
    }

    /// Whether a reader may hang the nodes it reads in the tree. Not during a checkpoint
    /// with the node cache full: nothing may be evicted then (`MetaTree::checkpointing`),
    /// and readers would grow the tree by a node or more per body read until it ends.
    fn reader_may_grow_tree(&self) -> bool {
        let st = self.st.borrow();
        let cap = self.config.metadata_cache_nodes();
        !st.meta.checkpointing || st.meta.tree.as_ref().is_none_or(|t| t.loaded() < cap)
    }

    /// The entries of the leaf on the way to `need`'s key, read from `need` down without
    /// hanging anything in the tree, each node checked as a load checks it; `None` when
    /// the tree changed meanwhile (a checkpoint became durable, so places may have been
    /// reused, or someone loaded the node): the caller looks again.
    /// With the entries, the lowest key above the leaf (`None`: the tree's last leaf), from
    /// `bound` (what the loaded nodes above `need` give) and the nodes walked.
    async fn leaf_for_reader(
        &self,
        need: Need,
        generation: u64,
        mut bound: Option<Vec<u8>>,
    ) -> Result<Option<(Vec<(Vec<u8>, Vec<u8>)>, Option<Vec<u8>>)>> {
        let key = need.key.clone();
        let mut need = need;
        let mut above: Option<Walked> = None;
        loop {
            let block = self.read_node_for_reader(&need).await?;
            let mut st = self.st.borrow_mut();
            let st = &mut *st;
            if st.slot.generation != generation {
                return Ok(None);
            }
            let walked = match &above {
                Some(a) => walk_node(&need, block.full(), Some(a.level - 1), a.generation),
                None => match st.meta.tree.as_ref() {
                    Some(tree) => tree.peek(&need, block.full()),
                    None => return Ok(None),
                },
            };
            let walked = match walked {
                Ok(w) => w,
                Err(LoadError::NotWanted { .. }) => return Ok(None),
                Err(e) => return Err(metadata_failed(st, format!("metadata tree: {e}"))),
            };
            if let Some(b) = walked.bound_after(&key) {
                bound = Some(b.to_vec());
            }
            if let Some(child) = walked.toward(&key) {
                need = child.clone();
            } else {
                return match walked.visited {
                    Visited::Leaf(entries) => Ok(Some((entries, bound))),
                    Visited::Inner(_) => {
                        let why = format!("metadata node {} is inner but has no child", need.paddr);
                        Err(metadata_failed(st, why))
                    }
                };
            }
            above = Some(walked);
        }
    }

    /// The block of one node a reader needs, read from the device and counted.
    async fn read_node_for_reader(&self, need: &Need) -> Result<crate::device::AlignedBuf> {
        let mut blocks = crate::checkpoint::read_nodes(
            &self.dev,
            self.base,
            &self.geo,
            std::slice::from_ref(need),
        )
        .await
        .map_err(|e| io_error(format!("reading metadata node {}: {e}", need.paddr)))?;
        self.st.borrow_mut().stats.body_node_reads += 1;
        Ok(blocks.swap_remove(0))
    }

    /// Reads one node a reader needs and hangs it in the tree, unless a checkpoint became
    /// durable since the need was found (its place may have been reused: the caller looks
    /// again) or someone else loaded it first.
    async fn load_for_reader(&self, need: Need, generation: u64) -> Result<()> {
        let block = self.read_node_for_reader(&need).await?;
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        if st.slot.generation != generation {
            return Ok(());
        }
        let cap = self.config.metadata_cache_nodes();
        let trim = !st.meta.checkpointing;
        let Some(tree) = st.meta.tree.as_mut() else {
            return Ok(());
        };
        // Readers load nodes between checkpoints too; trim with some slack, since a trim
        // walks the loaded tree (never during a checkpoint: see `MetaTree::checkpointing`),
        // and before the load, so the node just read is not the one dropped.
        if trim && tree.loaded() > cap + cap / 8 {
            tree.evict_to(cap);
        }
        match tree.load(&need, block.full()) {
            Ok(_) | Err(LoadError::NotWanted { .. }) => {}
            Err(e) => return Err(metadata_failed(st, format!("metadata tree: {e}"))),
        }
        Ok(())
    }
}

/// Installs the body of `cid/oid` read back as `entries`: the `pieces` of its record,
/// then its extents.
fn install(
    st: &mut State,
    cid: CollectionId,
    oid: &str,
    id: u64,
    pieces: u32,
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    object_cache_bytes: u64,
) -> Result<()> {
    let mut record = Vec::with_capacity(pieces as usize * PIECE);
    let mut extents = Vec::new();
    let mut read = 0;
    for (k, v) in entries {
        match parse_object_key(&k) {
            Some(ObjectEntry::Piece { id: at, chunk })
                if at == id && chunk == read && piece_fits(&v, chunk, pieces) =>
            {
                record.extend_from_slice(&v);
                read += 1;
            }
            Some(ObjectEntry::Extent { id: at, lblock }) if at == id && read == pieces => {
                match decode_extent_value(lblock, &v) {
                    Ok(e) => extents.push((lblock, e)),
                    Err(e) => {
                        let why = format!("extent {lblock} of {cid}/{oid:?}: {e}");
                        return Err(metadata_failed(st, why));
                    }
                }
            }
            _ => return Err(piece_missing(st, cid, oid, id, read, pieces)),
        }
    }
    if read != pieces {
        return Err(piece_missing(st, cid, oid, id, read, pieces));
    }
    let stored = match decode_object_entries(record.into(), extents) {
        Ok(r) => r,
        Err(e) => {
            return Err(metadata_failed(
                st,
                format!("the record of {cid}/{oid:?} (tree id {id}): {e}"),
            ))
        }
    };
    let (rcid, roid, size) = (stored.cid, stored.oid.as_str(), stored.size);
    let stub_size = st.index.object(cid, oid).map(|o| o.size);
    if rcid != cid || roid != oid || stub_size.is_some_and(|s| s != size) {
        return Err(metadata_failed(
            st,
            format!(
                "tree id {id} holds the record of {rcid}/{roid:?} of size {size}, not of \
                 {cid}/{oid:?} of size {stub_size:?}"
            ),
        ));
    }
    let extent_keys = stored.extent_keys;
    match st
        .index
        .install_body(cid, oid, id, stored.body, extent_keys, object_cache_bytes)
    {
        Ok(true) => {
            st.stats.body_reads += 1;
            Ok(())
        }
        Ok(false) => Ok(()),
        Err(e) => Err(metadata_failed(st, e)),
    }
}

/// Stops the shard: piece `i` of an object's record is not in the tree, or not as expected.
fn piece_missing(
    st: &mut State,
    cid: CollectionId,
    oid: &str,
    id: u64,
    i: u32,
    pieces: u32,
) -> StoreError {
    metadata_failed(
        st,
        format!(
            "piece {i} of {pieces} of the record of {cid}/{oid:?} (tree id {id}) is missing \
             or misshapen"
        ),
    )
}

/// Stops the shard: the metadata tree and the index disagree.
fn metadata_failed(st: &mut State, detail: String) -> StoreError {
    tracing::error!("native store metadata: {detail}");
    let err = io_error(format!("metadata: {detail}"));
    st.failed.get_or_insert(ShardFailure::Metadata(detail));
    err
}
