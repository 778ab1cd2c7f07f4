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
use crate::index::{Body, Onode};
use crate::metatree::{decode_record, object_key, piece_fits, PIECE};
use crate::store::{io_error, lookup, NativeStore, State};
use crate::BlockDevice;
use carmine_btree::{walk_node, LoadError, Need, TreeError, Visited, Walked};
use carmine_store::{Op, Result, StoreError, Transaction};
use carmine_types::CollectionId;
use std::cell::RefCell;

/// Rounds in a row a body read may take without getting further before it gives up (a
/// round reads one node; it gets nowhere when a checkpoint or an eviction moved things under
/// it). A record of many leaves takes a round per node on its way, as many as it needs.
const READ_ROUNDS: usize = 4096;

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

    /// Reads the record of object `cid/oid` (tree id and pieces `paged`) back from the tree
    /// and installs its body, unless the object changed meanwhile (removed, replaced, or
    /// read back by someone else).
    async fn read_body(&self, cid: CollectionId, oid: &str, paged: (u64, u32)) -> Result<()> {
        let (id, pieces) = paged;
        // Gathered across rounds: while the object stays paged out under this id, cleaned by
        // the same checkpoint, its record does not change, so pieces read before a node was
        // evicted or a checkpoint moved things stay good. Read back, changed and paged out
        // again meanwhile, it has a newer record: this read stops, and its caller looks again.
        let cleaned_in = self
            .st
            .borrow()
            .index
            .object(cid, oid)
            .map_or(0, |o| o.cleaned_in);
        let mut record = Vec::with_capacity(pieces as usize * PIECE);
        let mut next = 0;
        let mut stuck = 0;
        while stuck < READ_ROUNDS {
            let before = next;
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
                    return Ok(());
                }
                let Some(tree) = st.meta.tree.as_ref() else {
                    return Err(metadata_failed(
                        st,
                        format!("{cid}/{oid:?} is paged out, but there is no metadata tree"),
                    ));
                };
                let mut need = None;
                while next < pieces {
                    let i = next;
                    match tree.get(&object_key(id, i)) {
                        Ok(Some(piece)) if piece_fits(piece, i, pieces) => {
                            record.extend_from_slice(piece);
                            next += 1;
                        }
                        Ok(_) => return Err(piece_missing(st, cid, oid, id, i, pieces)),
                        Err(TreeError::Need(n)) => {
                            need = Some((n, st.slot.generation));
                            break;
                        }
                        Err(e) => {
                            return Err(metadata_failed(st, format!("metadata tree: {e}")));
                        }
                    }
                }
                need
            };
            match need {
                Some((n, generation)) if self.reader_may_grow_tree() => {
                    self.load_for_reader(n, generation).await?
                }
                Some((n, generation)) => {
                    // The piece the lookup stopped at, then those after it in the same leaf.
                    let routed = next;
                    if let Some(leaf) = self.leaf_for_reader(n, generation).await? {
                        let mut st = self.st.borrow_mut();
                        while next < pieces {
                            let key = object_key(id, next);
                            match leaf.binary_search_by(|(k, _)| k.as_slice().cmp(&key)) {
                                Ok(j) if piece_fits(&leaf[j].1, next, pieces) => {
                                    record.extend_from_slice(&leaf[j].1);
                                    next += 1;
                                }
                                // Past this leaf's last key: the next lookup routes on.
                                Err(j) if j == leaf.len() && next > routed => break,
                                _ => {
                                    return Err(piece_missing(&mut st, cid, oid, id, next, pieces))
                                }
                            }
                        }
                    }
                }
                None => return self.install(cid, oid, id, std::mem::take(&mut record)),
            }
            stuck = if next > before { 0 } else { stuck + 1 };
        }
        Err(io_error(format!(
            "{cid}/{oid:?}: its metadata record could not be read back: the tree kept \
             changing under the read"
        )))
    }

    fn install(&self, cid: CollectionId, oid: &str, id: u64, record: Vec<u8>) -> Result<()> {
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let (rcid, roid, size, body) = match decode_record(record.into()) {
            Ok(r) => r,
            Err(e) => {
                return Err(metadata_failed(
                    st,
                    format!("the record of {cid}/{oid:?} (tree id {id}): {e}"),
                ))
            }
        };
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
        match st
            .index
            .install_body(cid, oid, id, body, self.config.object_cache_bytes)
        {
            Ok(true) => {
                st.stats.body_reads += 1;
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => Err(metadata_failed(st, e)),
        }
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
    async fn leaf_for_reader(
        &self,
        need: Need,
        generation: u64,
    ) -> Result<Option<Vec<(Vec<u8>, Vec<u8>)>>> {
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
            if let Some(child) = walked.toward(&key) {
                need = child.clone();
            } else {
                return match walked.visited {
                    Visited::Leaf(entries) => Ok(Some(entries)),
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
