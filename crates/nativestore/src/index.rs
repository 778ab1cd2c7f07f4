//! The in-memory metadata of one shard: collections, onodes with their block maps, xattrs and
//! omap, plus per-segment live-block counts for the cleaner. Rebuilt at mount from the newest
//! checkpoint and the journal; changed only through [`Index::apply`].

use crate::delta::Delta;
use crate::error::IndexError;
pub use crate::extents::BlockRef;
use crate::extents::{self, Extent, ExtentMap};
use bytes::{Bytes, BytesMut};
use carmine_types::limits::{ATTR_NAME_LEN_MAX, OBJECT_NAME_LEN_MAX, VALUE_LEN_MAX};
use carmine_types::{CollectionId, DecodeError, Decoder, Encoder, PgId};
use std::collections::BTreeMap;

/// What an object maps and holds: the part of an onode that may be paged out.
#[derive(Clone, Debug, Default)]
pub struct Body {
    pub blocks: ExtentMap,
    pub attrs: BTreeMap<String, Bytes>,
    pub omap_header: Bytes,
    pub omap: BTreeMap<Bytes, Bytes>,
    /// Checkpoint bytes of the xattrs, the omap header and the omap entries, kept by `apply`.
    pub meta_bytes: u64,
}

#[derive(Clone, Debug)]
pub struct Onode {
    pub size: u64,
    /// Its key in the metadata tree: handed out in increasing order, never that of a record
    /// the tree holds (see `metatree.rs`).
    pub id: u64,
    /// Chunks its record takes in the tree as of the last checkpoint (0: none yet).
    pub stored_chunks: u32,
    /// Its extents are in the tree under keys of their own (a record of version 2), not in
    /// its record (version 1, written before format 5): a checkpoint then puts only the
    /// extents that changed (see `metatree.rs`).
    pub extent_keys: bool,
    /// Its record (size, xattrs, omap) changed since the last checkpoint; an object whose
    /// extents alone changed keeps the record the tree holds.
    pub record_dirty: bool,
    /// Changed since the last checkpoint put it in the tree — its record, its extents or
    /// both (it is then listed in [`Index::dirty`]).
    pub dirty: bool,
    /// What a checkpoint takes for it, name included: kept while the body is paged out.
    pub(crate) encoded: u64,
    /// `None` while paged out: only a clean object whose record the tree holds may be
    /// (`residency.rs`), and it is read back from that record before anything uses it.
    pub body: Option<Box<Body>>,
    /// Listed in the index's clean queue (the eviction order).
    pub(crate) queued: bool,
    /// Used since the clean queue last passed it: it gets another round before eviction.
    pub(crate) referenced: std::cell::Cell<bool>,
    /// The pin epoch it was last pinned in (`residency.rs`).
    pub(crate) pinned_at: u64,
    /// The checkpoint that last put its record in the tree (`Residency::checkpoint`).
    pub(crate) cleaned_in: u64,
}

impl Onode {
    /// A new, empty object (resident; the caller marks it dirty) with tree id `id`.
    fn new(name: &str, id: u64) -> Self {
        Self::resident(name, id, 0, Body::default())
    }

    /// An object read from a checkpoint, resident (its caller sets its tree id).
    pub(crate) fn loaded(name: &str, size: u64, body: Body) -> Self {
        Self::resident(name, 0, size, body)
    }

    fn resident(name: &str, id: u64, size: u64, body: Body) -> Self {
        Onode {
            size,
            id,
            stored_chunks: 0,
            extent_keys: false,
            record_dirty: false,
            dirty: false,
            encoded: body.encoded_len(name),
            body: Some(Box::new(body)),
            queued: false,
            referenced: Default::default(),
            pinned_at: u64::MAX,
            cleaned_in: 0,
        }
    }

    /// The body, when resident.
    pub fn body(&self) -> Option<&Body> {
        self.body.as_deref()
    }
}

/// Checkpoint bytes of an object besides its name, extents and metadata: name length, size,
/// extent count, xattr count, omap header length, omap entry count.
const ONODE_FIXED: u64 = 4 + 8 + 8 + 4 + 4 + 8;
/// Checkpoint bytes of a collection's header: pool, seed, object count.
const COLL_FIXED: u64 = 12;
/// Checkpoint bytes before the first collection: version and collection count.
const BLOB_FIXED: u64 = 8;

/// Checkpoint bytes of one xattr or omap entry (two length-prefixed byte strings).
fn entry_len(key: usize, value: usize) -> u64 {
    8 + key as u64 + value as u64
}

impl Body {
    /// What the object takes in a checkpoint, name included.
    pub(crate) fn encoded_len(&self, name: &str) -> u64 {
        name.len() as u64
            + ONODE_FIXED
            + self.meta_bytes
            + 20 * self.blocks.extent_count() as u64
            + 4 * self.blocks.blocks()
    }

    /// `meta_bytes` counted afresh.
    pub fn recount_meta(&self) -> u64 {
        self.omap_header.len() as u64
            + self
                .attrs
                .iter()
                .map(|(k, v)| entry_len(k.len(), v.len()))
                .sum::<u64>()
            + self
                .omap
                .iter()
                .map(|(k, v)| entry_len(k.len(), v.len()))
                .sum::<u64>()
    }
}

pub type Collection = BTreeMap<String, Onode>;

/// The tree entries a removed object leaves for the next checkpoint to delete.
#[derive(Clone, Debug)]
pub struct DeadObject {
    pub id: u64,
    /// Pieces of its record.
    pub chunks: u32,
    /// First blocks of the extent keys it may have (its extents when removed, and those
    /// changed since the last checkpoint); none for a record that holds its extents.
    pub extents: Vec<u64>,
}

/// Maps device blocks to segments.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    /// Blocks before segment 0 in the shard.
    pub first_block: u64,
    pub segment_blocks: u64,
    pub segments: u32,
}

impl Geometry {
    pub fn segment_of(&self, paddr: u64) -> Option<u32> {
        let rel = paddr.checked_sub(self.first_block)?;
        let seg = rel / self.segment_blocks;
        (seg < self.segments as u64).then_some(seg as u32)
    }
    pub fn segment_start(&self, seg: u32) -> u64 {
        self.first_block + seg as u64 * self.segment_blocks
    }
}

pub struct Index {
    pub colls: BTreeMap<CollectionId, Collection>,
    pub objects: u64,
    pub live_blocks: u64,
    pub segment_live: Vec<u32>,
    geometry: Geometry,
    /// Device blocks unmapped by `apply` since the last `take_freed`, for cache invalidation.
    freed: Vec<u64>,
    /// Blocks an apply unmapped, before their release is accounted.
    released: Vec<BlockRef>,
    /// The length `encode` would give now, kept by `apply`.
    encoded: u64,
    /// Extents of every object, resident or not.
    extents: u64,
    /// The next object's tree id.
    pub next_id: u64,
    /// Objects changed since the last checkpoint (each listed once, when it became dirty; it
    /// may be gone since).
    pub dirty: Vec<(CollectionId, String)>,
    /// Tree entries of objects removed since the last checkpoint.
    pub dead: Vec<DeadObject>,
    /// Collections created or removed since the last checkpoint.
    pub dirty_colls: std::collections::BTreeSet<CollectionId>,
    /// Which bodies are resident, and which may be paged out (`residency.rs`).
    pub(crate) residency: crate::residency::Residency,
}

/// What a change touches of an object: its record or its extents (each stored apart).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Record,
    Extents,
}

/// Notes that `o` changed, listing it for the next checkpoint the first time.
fn mark_dirty(
    o: &mut Onode,
    cid: CollectionId,
    oid: &str,
    dirty: &mut Vec<(CollectionId, String)>,
    residency: &mut crate::residency::Residency,
) {
    if !o.dirty {
        o.dirty = true;
        residency.dirty_bytes += o.encoded;
        dirty.push((cid, oid.to_owned()));
    }
}

/// The body of `o`, which every change needs resident: a transaction makes its objects
/// resident (and keeps them so) before it applies, and a mount loads the bodies of the
/// objects its replay changes.
fn body_mut<'a>(
    o: &'a mut Onode,
    cid: CollectionId,
    oid: &str,
) -> Result<&'a mut Body, IndexError> {
    o.body.as_deref_mut().ok_or_else(|| IndexError::PagedOut {
        cid,
        oid: oid.to_owned(),
    })
}

/// An object of `colls` (a free function, so the index's other fields stay borrowable).
fn object_in<'a>(
    colls: &'a mut BTreeMap<CollectionId, Collection>,
    cid: CollectionId,
    oid: &str,
) -> Result<&'a mut Onode, IndexError> {
    colls
        .get_mut(&cid)
        .ok_or_else(|| missing("collection", cid, oid))?
        .get_mut(oid)
        .ok_or_else(|| missing("object", cid, oid))
}

fn missing(what: &'static str, cid: CollectionId, oid: &str) -> IndexError {
    IndexError::Missing {
        what,
        cid,
        oid: oid.to_owned(),
    }
}

impl Index {
    pub fn new(geometry: Geometry) -> Self {
        Self {
            colls: BTreeMap::new(),
            objects: 0,
            live_blocks: 0,
            segment_live: vec![0; geometry.segments as usize],
            geometry,
            freed: Vec::new(),
            released: Vec::new(),
            encoded: BLOB_FIXED,
            extents: 0,
            next_id: 1,
            dirty: Vec::new(),
            dead: Vec::new(),
            dirty_colls: Default::default(),
            residency: Default::default(),
        }
    }

    pub fn object(&self, cid: CollectionId, oid: &str) -> Option<&Onode> {
        self.colls.get(&cid)?.get(oid)
    }

    /// The body of an object, if it exists and is resident.
    pub fn body_of(&self, cid: CollectionId, oid: &str) -> Option<&Body> {
        self.object(cid, oid)?.body()
    }

    /// The object, marked changed.
    fn object_mut(&mut self, cid: CollectionId, oid: &str) -> Result<&mut Onode, IndexError> {
        let o = object_in(&mut self.colls, cid, oid)?;
        body_mut(o, cid, oid)?;
        mark_dirty(o, cid, oid, &mut self.dirty, &mut self.residency);
        Ok(o)
    }

    /// Runs `change` on an object's body (with the list unmapped blocks go to), keeping the
    /// checkpoint length in step with what it changes.
    fn change_object<R>(
        &mut self,
        cid: CollectionId,
        oid: &str,
        part: Part,
        change: impl FnOnce(&mut Body, &mut Vec<BlockRef>) -> R,
    ) -> Result<R, IndexError> {
        let o = object_in(&mut self.colls, cid, oid)?;
        body_mut(o, cid, oid)?;
        mark_dirty(o, cid, oid, &mut self.dirty, &mut self.residency);
        o.record_dirty |= part == Part::Record;
        let body = o.body.as_deref_mut().expect("checked above");
        let extents_before = body.blocks.extent_count() as u64;
        let r = change(body, &mut self.released);
        self.extents = self.extents - extents_before + body.blocks.extent_count() as u64;
        let after = body.encoded_len(oid);
        let before = std::mem::replace(&mut o.encoded, after);
        self.encoded = self.encoded - before + after;
        self.residency.resized(before, after);
        Ok(r)
    }

    /// Bytes a checkpoint of the index takes now: what the checkpoint reserve and the
    /// capacity charge for metadata.
    pub fn encoded_len(&self) -> u64 {
        self.encoded
    }

    /// Extents mapped, in all objects (each is an entry of the metadata tree).
    pub fn extent_count(&self) -> u64 {
        self.extents
    }

    /// `encoded_len` counted afresh, from the content.
    pub fn recount_encoded(&self) -> u64 {
        BLOB_FIXED
            + self
                .colls
                .values()
                .map(|c| COLL_FIXED + c.values().map(|o| o.encoded).sum::<u64>())
                .sum::<u64>()
    }

    /// Counts the blocks of `e` live, all or (if one lies outside every segment) none.
    fn take_extent(&mut self, e: &Extent) -> Result<(), IndexError> {
        for b in e.blocks() {
            self.geometry
                .segment_of(b.paddr)
                .ok_or(IndexError::OutsideSegments(b.paddr))?;
        }
        for b in e.blocks() {
            self.take_block(b)?;
        }
        Ok(())
    }

    fn take_block(&mut self, b: BlockRef) -> Result<(), IndexError> {
        let seg = self
            .geometry
            .segment_of(b.paddr)
            .ok_or(IndexError::OutsideSegments(b.paddr))?;
        let live = &mut self.segment_live[seg as usize];
        *live = live
            .checked_add(1)
            .ok_or_else(|| IndexError::Accounting(format!("segment {seg} live count overflow")))?;
        self.live_blocks += 1;
        Ok(())
    }

    fn release_block(
        segment_live: &mut [u32],
        live_blocks: &mut u64,
        freed: &mut Vec<u64>,
        geometry: &Geometry,
        b: BlockRef,
    ) -> Result<(), IndexError> {
        // Every mapped block was counted when it was mapped (`take_block`): a count that
        // would go below zero means the counts and the maps disagree, and a segment counted
        // empty while it holds live data would be handed to the cleaner as free.
        let seg = geometry
            .segment_of(b.paddr)
            .ok_or(IndexError::OutsideSegments(b.paddr))?;
        let live = &mut segment_live[seg as usize];
        *live = live.checked_sub(1).ok_or_else(|| {
            IndexError::Accounting(format!(
                "block {} released from segment {seg}, which counts no live block",
                b.paddr
            ))
        })?;
        *live_blocks = live_blocks.checked_sub(1).ok_or_else(|| {
            IndexError::Accounting(format!("block {} released with no live block", b.paddr))
        })?;
        freed.push(b.paddr);
        Ok(())
    }

    /// Releases the blocks an apply unmapped (in `released`). An accounting error leaves the
    /// blocks before it released: the caller stops the shard (at run time) or refuses the
    /// mount (at replay).
    fn release_unmapped(&mut self) -> Result<(), IndexError> {
        for b in self.released.drain(..) {
            Self::release_block(
                &mut self.segment_live,
                &mut self.live_blocks,
                &mut self.freed,
                &self.geometry,
                b,
            )?;
        }
        Ok(())
    }

    /// Device blocks that went out of use since the last call.
    pub fn take_freed(&mut self) -> std::vec::Drain<'_, u64> {
        self.freed.drain(..)
    }

    /// Applies one delta. Fails only on a delta that does not fit the state (a bug at run
    /// time, a damaged journal at replay), without a partial change unless the space
    /// accounting itself is broken.
    pub fn apply(&mut self, delta: &Delta) -> Result<(), IndexError> {
        match delta {
            Delta::CreateCollection(cid) => {
                if let std::collections::btree_map::Entry::Vacant(e) = self.colls.entry(*cid) {
                    e.insert(Collection::new());
                    self.encoded += COLL_FIXED;
                    self.dirty_colls.insert(*cid);
                }
            }
            Delta::RemoveCollection(cid) => match self.colls.get(cid) {
                Some(c) if c.is_empty() => {
                    self.colls.remove(cid);
                    self.encoded -= COLL_FIXED;
                    self.dirty_colls.insert(*cid);
                }
                Some(_) => return Err(IndexError::CollectionNotEmpty(*cid)),
                None => return Err(missing("collection", *cid, "")),
            },
            Delta::Touch(cid, oid) => {
                let coll = self
                    .colls
                    .get_mut(cid)
                    .ok_or_else(|| missing("collection", *cid, oid))?;
                if !coll.contains_key(oid.as_str()) {
                    let mut o = Onode::new(oid, self.next_id);
                    self.next_id += 1;
                    self.residency.resident_bytes += o.encoded;
                    mark_dirty(&mut o, *cid, oid, &mut self.dirty, &mut self.residency);
                    o.record_dirty = true;
                    self.encoded += o.encoded;
                    coll.insert(oid.clone(), o);
                    self.objects += 1;
                }
            }
            Delta::Remove(cid, oid) => {
                let coll = self
                    .colls
                    .get_mut(cid)
                    .ok_or_else(|| missing("collection", *cid, oid))?;
                // Its blocks must be released, so its map must be there.
                body_mut(
                    coll.get_mut(oid.as_str())
                        .ok_or_else(|| missing("object", *cid, oid))?,
                    *cid,
                    oid,
                )?;
                let onode = coll.remove(oid.as_str()).expect("looked up above");
                self.objects -= 1;
                self.encoded -= onode.encoded;
                self.residency.removed(&onode);
                let mut body = onode.body.expect("checked above");
                self.extents -= body.blocks.extent_count() as u64;
                if onode.stored_chunks > 0 {
                    let extents = match onode.extent_keys {
                        true => {
                            let mut keys = body.blocks.take_changed();
                            keys.extend(body.blocks.extents().map(|(l, _)| l));
                            keys.sort_unstable();
                            keys.dedup();
                            keys
                        }
                        false => Vec::new(),
                    };
                    self.dead.push(DeadObject {
                        id: onode.id,
                        chunks: onode.stored_chunks,
                        extents,
                    });
                }
                self.released.extend(body.blocks.iter().map(|(_, b)| b));
                self.release_unmapped()?;
            }
            Delta::SetSize(cid, oid, size) => {
                let o = self.object_mut(*cid, oid)?;
                o.size = *size;
                o.record_dirty = true;
            }
            Delta::SetExtent {
                cid,
                oid,
                lblock,
                extent,
            } => {
                self.object_mut(*cid, oid)?;
                self.take_extent(extent)?;
                self.change_object(*cid, oid, Part::Extents, |o, released| {
                    o.blocks.set(*lblock, extent.clone(), released)
                })?;
                self.release_unmapped()?;
            }
            Delta::Punch(cid, oid, from, to) => {
                self.change_object(*cid, oid, Part::Extents, |o, released| {
                    o.blocks.punch(*from, *to, released)
                })?;
                self.release_unmapped()?;
            }
            Delta::SetAttr(cid, oid, name, value) => {
                self.change_object(*cid, oid, Part::Record, |o, _| {
                    if let Some(old) = o.attrs.insert(name.clone(), value.clone()) {
                        o.meta_bytes -= entry_len(name.len(), old.len());
                    }
                    o.meta_bytes += entry_len(name.len(), value.len());
                })?;
            }
            Delta::RmAttr(cid, oid, name) => {
                self.change_object(*cid, oid, Part::Record, |o, _| {
                    if let Some(old) = o.attrs.remove(name) {
                        o.meta_bytes -= entry_len(name.len(), old.len());
                    }
                })?;
            }
            Delta::OmapSet(cid, oid, kvs) => {
                self.change_object(*cid, oid, Part::Record, |o, _| {
                    for (k, v) in kvs {
                        if let Some(old) = o.omap.insert(k.clone(), v.clone()) {
                            o.meta_bytes -= entry_len(k.len(), old.len());
                        }
                        o.meta_bytes += entry_len(k.len(), v.len());
                    }
                })?;
            }
            Delta::OmapRm(cid, oid, keys) => {
                self.change_object(*cid, oid, Part::Record, |o, _| {
                    for k in keys {
                        if let Some(old) = o.omap.remove(k) {
                            o.meta_bytes -= entry_len(k.len(), old.len());
                        }
                    }
                })?;
            }
            Delta::OmapClear(cid, oid) => {
                self.change_object(*cid, oid, Part::Record, |o, _| {
                    o.omap.clear();
                    o.omap_header = Bytes::new();
                    o.meta_bytes = o.recount_meta();
                })?;
            }
            Delta::OmapHeader(cid, oid, h) => {
                self.change_object(*cid, oid, Part::Record, |o, _| {
                    o.meta_bytes = o.meta_bytes - o.omap_header.len() as u64 + h.len() as u64;
                    o.omap_header = h.clone();
                })?;
            }
            Delta::CopyMeta(cid, src, dst) => {
                let o = self
                    .object(*cid, src)
                    .ok_or_else(|| missing("source object", *cid, src))?;
                let size = o.size;
                let s = o.body().ok_or_else(|| IndexError::PagedOut {
                    cid: *cid,
                    oid: src.clone(),
                })?;
                let (attrs, header, omap, meta_bytes) = (
                    s.attrs.clone(),
                    s.omap_header.clone(),
                    s.omap.clone(),
                    s.meta_bytes,
                );
                let d = self.object_mut(*cid, dst)?;
                d.size = size;
                d.record_dirty = true;
                self.change_object(*cid, dst, Part::Record, |d, _| {
                    d.attrs = attrs;
                    d.omap_header = header;
                    d.omap = omap;
                    d.meta_bytes = meta_bytes;
                })?;
            }
        }
        Ok(())
    }

    /// The whole metadata as one blob (the checkpoint of formats 1 to 3; tests and fuzzing
    /// only). Every body must be resident.
    pub fn encode(&self) -> BytesMut {
        let mut out = BytesMut::with_capacity(64 + self.live_blocks as usize * 8);
        let mut e = Encoder::new(&mut out);
        e.u32(CHECKPOINT_VERSION).count(self.colls.len());
        for (cid, coll) in &self.colls {
            e.u32(cid.pool).u32(cid.seed).count(coll.len());
            for (oid, o) in coll {
                let body = o.body().expect("a blob is encoded from a resident index");
                encode_onode(&mut e, oid, o.size, body, true);
            }
        }
        out
    }

    /// Reads one object as [`encode_onode`] wrote it (a checkpoint of `version`), counting
    /// its blocks live.
    pub(crate) fn decode_onode(
        &mut self,
        d: &mut Decoder,
        version: u32,
    ) -> Result<(String, Onode), DecodeError> {
        let (oid, size, body) = decode_object(d, version)?;
        let o = self.count_loaded(&oid, size, body)?;
        Ok((oid, o))
    }

    /// An object read from a checkpoint, its blocks counted live.
    pub(crate) fn count_loaded(
        &mut self,
        oid: &str,
        size: u64,
        body: Body,
    ) -> Result<Onode, DecodeError> {
        for (_, x) in body.blocks.extents() {
            if self.take_extent(x).is_err() {
                return Err(DecodeError::Invalid {
                    what: "block address",
                    found: x.paddr,
                });
            }
        }
        self.extents += body.blocks.extent_count() as u64;
        Ok(Onode::loaded(oid, size, body))
    }

    /// Adds an object read from a checkpoint, with its tree id; fails on a name already
    /// there (its blocks would be counted twice) or a collection that is not.
    pub(crate) fn insert_loaded(
        &mut self,
        cid: CollectionId,
        oid: String,
        mut o: Onode,
        id: u64,
        stored_chunks: u32,
        extent_keys: bool,
    ) -> Result<(), DecodeError> {
        let coll = self.colls.get_mut(&cid).ok_or(DecodeError::Invalid {
            what: "object's collection",
            found: (cid.pool as u64) << 32 | cid.seed as u64,
        })?;
        // The next id must exist: the largest one is refused, not wrapped to zero.
        let next = id.checked_add(1).ok_or(DecodeError::Invalid {
            what: "object id",
            found: id,
        })?;
        o.id = id;
        o.stored_chunks = stored_chunks;
        o.extent_keys = extent_keys;
        if coll.contains_key(&oid) {
            return Err(DecodeError::Invalid {
                what: "repeated object",
                found: id,
            });
        }
        coll.insert(oid, o);
        self.objects += 1;
        self.next_id = self.next_id.max(next);
        Ok(())
    }

    /// Adds an empty collection read from a checkpoint.
    pub(crate) fn insert_collection(&mut self, cid: CollectionId) {
        self.colls.insert(cid, Collection::new());
    }

    /// After loading a checkpoint: the kept checkpoint length, from the content.
    pub(crate) fn finish_load(&mut self) {
        self.encoded = self.recount_encoded();
        self.residency = crate::residency::Residency::recount(&mut self.colls);
    }

    /// Rebuilds the index from a checkpoint blob, recomputing the live counts.
    ///
    /// Every map's keys must come in strictly increasing order, as `encode` writes them: a
    /// repeated key would be kept once but counted twice (objects, live blocks), and a segment
    /// counted live forever is never cleaned.
    pub fn decode(blob: Bytes, geometry: Geometry) -> Result<Self, DecodeError> {
        let mut d = Decoder::new(blob);
        let version = d.u32("checkpoint version")?;
        if !(1..=CHECKPOINT_VERSION).contains(&version) {
            return Err(DecodeError::Invalid {
                what: "checkpoint version",
                found: version as u64,
            });
        }
        let mut index = Index::new(geometry);
        let big = usize::MAX >> 1;
        for _ in 0..d.count("collections", big)? {
            let cid = PgId {
                pool: d.u32("pool")?,
                seed: d.u32("seed")?,
            };
            after_last(&index.colls, &cid, "collection order")?;
            let mut coll = Collection::new();
            for _ in 0..d.count("objects", big)? {
                let (oid, mut o) = index.decode_onode(&mut d, version)?;
                after_last(&coll, &oid, "object order")?;
                // Not in the metadata tree yet: the next checkpoint puts it there.
                o.id = index.next_id;
                index.next_id += 1;
                o.dirty = true;
                index.dirty.push((cid, oid.clone()));
                coll.insert(oid, o);
                index.objects += 1;
            }
            index.colls.insert(cid, coll);
            index.dirty_colls.insert(cid);
        }
        d.finish("checkpoint")?;
        index.finish_load();
        Ok(index)
    }
}

/// Reads one object as [`encode_onode`] wrote it (a checkpoint of `version`): its name, size
/// and body. Counts nothing: see [`Index::decode_onode`].
pub(crate) fn decode_object(
    d: &mut Decoder,
    version: u32,
) -> Result<(String, u64, Body), DecodeError> {
    let big = usize::MAX >> 1;
    let oid = d.string("object name", OBJECT_NAME_LEN_MAX)?;
    let size = d.u64("size")?;
    let mut o = Body::default();
    for _ in 0..d.u64(if version == 1 { "blocks" } else { "extents" })? {
        let (l, x) = decode_map_entry(d, version)?;
        if !o.blocks.push_back(l, x) {
            return Err(DecodeError::Invalid {
                what: "block order",
                found: o.blocks.blocks(),
            });
        }
    }
    for _ in 0..d.count("xattrs", big)? {
        let k = d.string("xattr name", ATTR_NAME_LEN_MAX)?;
        after_last(&o.attrs, &k, "xattr order")?;
        o.attrs.insert(k, d.bytes("xattr", VALUE_LEN_MAX)?);
    }
    o.omap_header = d.bytes("omap header", VALUE_LEN_MAX)?;
    for _ in 0..d.u64("omap entries")? {
        let k = d.bytes("omap key", VALUE_LEN_MAX)?;
        after_last(&o.omap, &k, "omap key order")?;
        o.omap.insert(k, d.bytes("omap value", VALUE_LEN_MAX)?);
    }
    o.meta_bytes = o.recount_meta();
    Ok((oid, size, o))
}

/// One object of a checkpoint: its name, size, extents, xattrs and omap.
/// `with_extents`: false for a tree record of version 2, which lists no extents (each is an
/// entry of the tree of its own).
pub(crate) fn encode_onode<B: bytes::BufMut>(
    e: &mut Encoder<'_, B>,
    oid: &str,
    size: u64,
    o: &Body,
    with_extents: bool,
) {
    e.str(oid).u64(size);
    match with_extents {
        true => e.u64(o.blocks.extent_count() as u64),
        false => e.u64(0),
    };
    for (l, x) in o.blocks.extents().filter(|_| with_extents) {
        e.u64(l).u64(x.paddr).u32(x.block_count() as u32);
        for crc in x.crcs.as_slice() {
            e.u32(*crc);
        }
    }
    e.count(o.attrs.len());
    for (k, v) in &o.attrs {
        e.str(k).bytes(v);
    }
    e.bytes(&o.omap_header).u64(o.omap.len() as u64);
    for (k, v) in &o.omap {
        e.bytes(k).bytes(v);
    }
}

/// Version 2: block maps as extents (a logical block, a device block, a count and one
/// checksum per block). Version 1 (one entry per block) is still read.
pub const CHECKPOINT_VERSION: u32 = 2;

/// One block-map entry of a checkpoint: a block (version 1) or an extent.
fn decode_map_entry(d: &mut Decoder, version: u32) -> Result<(u64, Extent), DecodeError> {
    let l = d.u64("lblock")?;
    let paddr = d.u64("paddr")?;
    let n = match version {
        1 => 1,
        _ => d.u32("extent blocks")? as u64,
    };
    Ok((l, extents::decode_extent(d, l, paddr, n)?))
}

/// Fails unless `key` sorts after every key already in `map` (checkpoint keys are written in
/// order); `found` is the number of entries before it.
fn after_last<K: Ord, V>(
    map: &BTreeMap<K, V>,
    key: &K,
    what: &'static str,
) -> Result<(), DecodeError> {
    match map.last_key_value() {
        Some((last, _)) if last >= key => Err(DecodeError::Invalid {
            what,
            found: map.len() as u64,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEO: Geometry = Geometry {
        first_block: 2,
        segment_blocks: 16,
        segments: 8,
    };

    fn cid() -> CollectionId {
        PgId { pool: 1, seed: 7 }
    }

    fn index_with(blocks: &[(u64, u64)]) -> Index {
        let mut ix = Index::new(GEO);
        ix.apply(&Delta::CreateCollection(cid())).unwrap();
        ix.apply(&Delta::Touch(cid(), "a".into())).unwrap();
        for &(lblock, paddr) in blocks {
            ix.apply(&set_block(lblock, paddr)).unwrap();
        }
        ix
    }

    fn set_block(lblock: u64, paddr: u64) -> Delta {
        Delta::SetExtent {
            cid: cid(),
            oid: "a".into(),
            lblock,
            extent: Extent::new(paddr, &[0]),
        }
    }

    #[test]
    fn a_release_the_counts_cannot_cover_is_refused_not_floored() {
        // Block 20 lives in segment 1. With its count lost, an overwrite must not leave the
        // segment counted empty (the cleaner would take it for free) but say so.
        let mut ix = index_with(&[(0, 20), (1, 21)]);
        ix.segment_live[1] = 1;
        let overwrite = |paddr| set_block(0, paddr);
        ix.apply(&overwrite(40)).unwrap();
        assert_eq!(ix.segment_live[1], 0);
        let err = ix
            .apply(&Delta::Punch(cid(), "a".into(), 1, 2))
            .unwrap_err();
        assert!(matches!(err, IndexError::Accounting(_)), "{err}");
        let mut ix = index_with(&[(0, 20)]);
        ix.live_blocks = 0;
        let err = ix.apply(&Delta::Remove(cid(), "a".into())).unwrap_err();
        assert!(matches!(err, IndexError::Accounting(_)), "{err}");
    }

    #[test]
    fn a_block_outside_every_segment_is_refused() {
        let mut ix = index_with(&[]);
        assert_eq!(
            ix.apply(&set_block(0, 1)),
            Err(IndexError::OutsideSegments(1))
        );
        // An extent partly outside: nothing of it is counted.
        let delta = Delta::SetExtent {
            cid: cid(),
            oid: "a".into(),
            lblock: 0,
            extent: Extent::new(GEO.segment_start(GEO.segments) - 1, &[0, 0]),
        };
        assert!(matches!(
            ix.apply(&delta),
            Err(IndexError::OutsideSegments(_))
        ));
        assert_eq!(ix.live_blocks, 0);
    }

    #[test]
    fn checkpoint_round_trips_with_its_live_counts() {
        let ix = index_with(&[(0, 3), (5, 20)]);
        let back = Index::decode(ix.encode().freeze(), GEO).unwrap();
        assert_eq!(back.encode(), ix.encode());
        assert_eq!((back.objects, back.live_blocks), (1, 2));
        assert_eq!(back.segment_live[0] + back.segment_live[1], 2);
    }

    /// Issue #10: the checkpoint_index fuzz target's counter check caught it — a block listed
    /// twice was counted live twice, so its segment could never be cleaned.
    #[test]
    fn checkpoint_with_a_repeated_block_is_rejected() {
        let one = index_with(&[(4, 3)]).encode();
        // Not contiguous on the device, so two extents.
        let two = index_with(&[(4, 3), (5, 10)]).encode();
        // Rewrite the second extent's logical block (where `one` has its xattr count, omap
        // header and omap count) to repeat the first's.
        let mut blob = two.to_vec();
        let second = one.len() - 4 - 4 - 8;
        assert_eq!(blob[second..second + 8], 5u64.to_le_bytes());
        blob[second..second + 8].copy_from_slice(&4u64.to_le_bytes());
        assert!(matches!(
            Index::decode(Bytes::from(blob), GEO),
            Err(DecodeError::Invalid {
                what: "block order",
                ..
            })
        ));
    }

    /// The checkpoint length is kept by every kind of delta, to the byte: the checkpoint
    /// reserve and the capacity charge metadata by it.
    #[test]
    fn the_kept_checkpoint_length_is_the_encoded_one_after_every_delta() {
        let b = |s: &'static str| Bytes::from_static(s.as_bytes());
        let (c, a) = (cid(), || "a".to_string());
        let deltas = vec![
            Delta::CreateCollection(c),
            Delta::CreateCollection(c),
            Delta::Touch(c, a()),
            Delta::Touch(c, a()),
            set_block(0, 3),
            set_block(1, 4),
            Delta::SetExtent {
                cid: c,
                oid: a(),
                lblock: 5,
                extent: Extent::new(20, &[1, 2, 3]),
            },
            Delta::Punch(c, a(), 6, 7),
            Delta::SetAttr(c, a(), "x".into(), b("value")),
            Delta::SetAttr(c, a(), "x".into(), b("longer value")),
            Delta::SetAttr(c, a(), "y".into(), b("")),
            Delta::RmAttr(c, a(), "y".into()),
            Delta::RmAttr(c, a(), "absent".into()),
            Delta::OmapSet(c, a(), vec![(b("k1"), b("v1")), (b("k2"), b("v22"))]),
            Delta::OmapSet(c, a(), vec![(b("k1"), b("replaced"))]),
            Delta::OmapRm(c, a(), vec![b("k2"), b("absent")]),
            Delta::OmapHeader(c, a(), b("header")),
            Delta::Touch(c, "bee".into()),
            Delta::CopyMeta(c, a(), "bee".into()),
            Delta::OmapClear(c, a()),
            Delta::SetSize(c, a(), 1 << 20),
            Delta::Remove(c, "bee".into()),
            Delta::Remove(c, a()),
            Delta::RemoveCollection(c),
        ];
        let mut ix = Index::new(GEO);
        for d in &deltas {
            ix.apply(d).unwrap();
            let encoded = ix.encode().len() as u64;
            assert_eq!(ix.encoded_len(), encoded, "after {d:?}");
            assert_eq!(ix.recount_encoded(), encoded, "after {d:?}");
            let extents: usize = ix
                .colls
                .values()
                .flat_map(|c| c.values())
                .map(|o| o.body().unwrap().blocks.extent_count())
                .sum();
            assert_eq!(ix.extent_count(), extents as u64, "after {d:?}");
        }
        assert_eq!(ix.encoded_len(), BLOB_FIXED);
    }

    #[test]
    fn version_1_checkpoints_are_read() {
        let mut v1 = BytesMut::new();
        let mut e = Encoder::new(&mut v1);
        e.u32(1).count(1).u32(cid().pool).u32(cid().seed).count(1);
        e.str("a").u64(3 * 4096).u64(3);
        for (l, paddr) in [(0u64, 7u64), (1, 8), (2, 30)] {
            e.u64(l).u64(paddr).u32(l as u32 + 100);
        }
        e.count(0).bytes(b"").u64(0);
        let ix = Index::decode(v1.freeze(), GEO).unwrap();
        let o = ix.body_of(cid(), "a").unwrap();
        assert_eq!(o.blocks.extent_count(), 3);
        assert_eq!(o.blocks.get(1), Some(BlockRef { paddr: 8, crc: 101 }));
        assert_eq!(
            o.blocks.get(2),
            Some(BlockRef {
                paddr: 30,
                crc: 102
            })
        );
        assert_eq!(ix.live_blocks, 3);
        // Written back in the current version, it reads the same.
        let back = Index::decode(ix.encode().freeze(), GEO).unwrap();
        assert_eq!(back.body_of(cid(), "a").unwrap().blocks, o.blocks);
    }

    #[test]
    fn checkpoint_with_a_repeated_object_is_rejected() {
        let mut ix = index_with(&[]);
        ix.apply(&Delta::Touch(cid(), "b".into())).unwrap();
        let mut blob = ix.encode().to_vec();
        // The second object's name follows the first onode; "b" → "a".
        let at = blob.iter().rposition(|&c| c == b'b').unwrap();
        blob[at] = b'a';
        assert!(matches!(
            Index::decode(Bytes::from(blob), GEO),
            Err(DecodeError::Invalid {
                what: "object order",
                ..
            })
        ));
    }
}
