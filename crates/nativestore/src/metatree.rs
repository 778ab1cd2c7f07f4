//! The index as a checkpoint stores it from format 4 on: records in a copy-on-write B+tree of
//! 4 KiB nodes (`carmine-btree`, decision 0013), and the accounting of where those nodes
//! live. Pure code: `checkpoint.rs` does the I/O.
//!
//! Keys (big-endian, so the tree's byte order is the numeric order):
//! - `'C' pool seed` → empty: a collection;
//! - `'O' id chunk` → the `chunk`-th piece (at most [`PIECE`] bytes) of the record of the
//!   object with tree id `id`: record version, collection, then the object as a blob
//!   checkpoint writes it (name, size, xattrs, omap; from format 5, record version 2, with
//!   no extents);
//! - `'O' id 0xFF lblock` → one extent of that object starting at logical block `lblock`
//!   (format 5): its device block and one checksum per block ([`extent_value`]). The tag
//!   byte sorts above every piece number's first one, so an object's extents follow its
//!   record, and a checkpoint puts or deletes only the extents that changed, not the map.
//!
//! An object's key is its id, not its name: names may be longer than a tree key, and the id
//! keeps every piece of one record adjacent. Ids are handed out in increasing order, so new
//! objects are appended at the tree's right edge, where splits leave full nodes.

use crate::extents::{decode_extent_value, extent_value, Extent, EXTENT_BLOCKS_MAX};
use crate::index::{decode_object, encode_onode, Body, Geometry, Index, CHECKPOINT_VERSION};
use bytes::{Bytes, BytesMut};
use carmine_btree::{Tree, NODE_SIZE, VALUE_MAX};
use carmine_types::{CollectionId, DecodeError, Decoder, Encoder, PgId};

const KIND_COLLECTION: u8 = b'C';
const KIND_OBJECT: u8 = b'O';
/// After the id in an extent's key: above the first byte of every piece number.
const EXTENT_TAG: u8 = 0xFF;
/// Pieces a record may take: below this, a piece number's first byte is zero.
pub(crate) const PIECES_MAX: u32 = 1 << 24;
/// Version of an object record (the blob layout of its object is checkpoint version 2).
/// Version 2 lists no extents: they are entries of their own. Version 1 (formats 4 and
/// older) lists them, and is still read; its object's next checkpoint writes version 2.
const RECORD_VERSION: u16 = 2;
const RECORD_VERSION_INLINE_EXTENTS: u16 = 1;
/// Bytes a node gives its entries.
const NODE_ROOM: u64 = NODE_SIZE as u64 - 20;

pub(crate) fn collection_key(cid: CollectionId) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(KIND_COLLECTION);
    k.extend_from_slice(&cid.pool.to_be_bytes());
    k.extend_from_slice(&cid.seed.to_be_bytes());
    k
}

pub(crate) fn object_key(id: u64, chunk: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(13);
    k.push(KIND_OBJECT);
    k.extend_from_slice(&id.to_be_bytes());
    k.extend_from_slice(&chunk.to_be_bytes());
    k
}

/// The key of the extent of object `id` that starts at logical block `lblock`.
pub(crate) fn extent_key(id: u64, lblock: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(18);
    k.push(KIND_OBJECT);
    k.extend_from_slice(&id.to_be_bytes());
    k.push(EXTENT_TAG);
    k.extend_from_slice(&lblock.to_be_bytes());
    k
}

/// The lowest key above every entry of object `id` (`None`: the end of the tree).
pub(crate) fn object_end_key(id: u64) -> Option<Vec<u8>> {
    let next = id.checked_add(1)?;
    let mut k = Vec::with_capacity(9);
    k.push(KIND_OBJECT);
    k.extend_from_slice(&next.to_be_bytes());
    Some(k)
}

/// An object's record, whole (version 2: without its extents).
pub(crate) fn object_record(cid: CollectionId, oid: &str, size: u64, body: &Body) -> BytesMut {
    let mut b = BytesMut::new();
    let mut e = Encoder::new(&mut b);
    e.u16(RECORD_VERSION).u32(cid.pool).u32(cid.seed);
    encode_onode(&mut e, oid, size, body, false);
    b
}

/// Every tree entry of an object with tree id `id`: its record's pieces, then its extents.
pub(crate) fn object_entries(
    cid: CollectionId,
    oid: &str,
    id: u64,
    size: u64,
    body: &Body,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let rec = object_record(cid, oid, size, body);
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = chunks(&rec)
        .enumerate()
        .map(|(i, c)| (object_key(id, i as u32), c.to_vec()))
        .collect();
    out.extend(
        body.blocks
            .extents()
            .map(|(l, e)| (extent_key(id, l), extent_value(e))),
    );
    out
}

/// An object read back from the tree: its collection, name, size and body, and whether its
/// extents are entries of their own (a record of version 2).
pub(crate) struct StoredObject {
    pub cid: CollectionId,
    pub oid: String,
    pub size: u64,
    pub body: Body,
    pub extent_keys: bool,
}

/// Reads a whole record and the extents that follow it in the tree (in key order).
pub(crate) fn decode_object_entries(
    record: Bytes,
    extents: Vec<(u64, Extent)>,
) -> Result<StoredObject, DecodeError> {
    let mut d = Decoder::new(record);
    let version = d.u16("object record version")?;
    if version != RECORD_VERSION && version != RECORD_VERSION_INLINE_EXTENTS {
        return Err(invalid("object record version", version as u64));
    }
    let cid = PgId {
        pool: d.u32("pool")?,
        seed: d.u32("seed")?,
    };
    let (oid, size, mut body) = decode_object(&mut d, CHECKPOINT_VERSION)?;
    d.finish("object record")?;
    let extent_keys = version == RECORD_VERSION;
    if extent_keys && body.blocks.extent_count() > 0 {
        return Err(invalid(
            "extents in a record of version 2",
            body.blocks.blocks(),
        ));
    }
    if !extent_keys && !extents.is_empty() {
        return Err(invalid(
            "extent entries of a record of version 1",
            extents.len() as u64,
        ));
    }
    for (l, e) in extents {
        if !body.blocks.push_back(l, e) {
            return Err(invalid("extent order", l));
        }
    }
    Ok(StoredObject {
        cid,
        oid,
        size,
        body,
        extent_keys,
    })
}

/// An entry of an object in the tree, by its key.
pub(crate) enum ObjectEntry {
    Piece { id: u64, chunk: u32 },
    Extent { id: u64, lblock: u64 },
}

/// What an object key names; `None` for a key that is not an object's.
pub(crate) fn parse_object_key(key: &[u8]) -> Option<ObjectEntry> {
    if key.first() != Some(&KIND_OBJECT) {
        return None;
    }
    let id = u64::from_be_bytes(key.get(1..9)?.try_into().ok()?);
    match key.len() {
        13 => Some(ObjectEntry::Piece {
            id,
            chunk: u32::from_be_bytes(key[9..13].try_into().ok()?),
        }),
        18 if key[9] == EXTENT_TAG => Some(ObjectEntry::Extent {
            id,
            lblock: u64::from_be_bytes(key[10..18].try_into().ok()?),
        }),
        _ => None,
    }
}

/// Whether `piece`, the `i`-th of `n`, is as `chunks` cuts a record: full but the last,
/// never empty.
pub(crate) fn piece_fits(piece: &[u8], i: u32, n: u32) -> bool {
    !piece.is_empty() && piece.len() <= PIECE && (i + 1 == n || piece.len() == PIECE)
}

/// Bytes of a record piece: four pieces with their keys and entry headers fill a node
/// exactly, so nodes of large records are full, not three quarters full.
pub(crate) const PIECE: usize = NODE_ROOM as usize / 4 - OBJECT_KEY_LEN - 4;
const OBJECT_KEY_LEN: usize = 13;
const _: () = assert!(PIECE <= VALUE_MAX && 4 * (PIECE + OBJECT_KEY_LEN + 4) == NODE_ROOM as usize);

/// The pieces a record is stored in.
pub(crate) fn chunks(record: &[u8]) -> impl Iterator<Item = &[u8]> {
    record.chunks(PIECE)
}

/// Tree bytes the index's records take: the records, plus a key and an entry header per
/// piece, plus a key per collection, plus what an extent's entry takes beyond the 20 bytes
/// (logical block, device block, count) the encoded length counts for it: a key, an entry
/// header and a device block, 30 in all.
fn tree_bytes(index: &Index) -> u64 {
    let pieces = index.encoded_len().div_ceil(PIECE as u64) + index.objects;
    index.encoded_len()
        + index.objects * 10
        + pieces * (OBJECT_KEY_LEN as u64 + 4)
        + index.extent_count() * (EXTENT_ENTRY_FIXED - 20)
        + index.colls.len() as u64 * 13
}

/// Bytes of an extent's entry besides its checksums: key, entry header, device block.
const EXTENT_ENTRY_FIXED: u64 = 18 + 4 + 8;

/// At most the nodes a tree of the index takes when written afresh. Its records go in in key
/// order, so each leaf but the last is split only when the next entry does not fit: it keeps
/// more than a node's room less the largest entry (the longest extent's). Inner nodes hold
/// entries of 23 bytes (a piece's key) or 28 (an extent's) and fill the same way: one per
/// ~145 nodes below at least, plus a root chain.
pub(crate) fn fresh_tree_blocks(index: &Index) -> u64 {
    let leaves = tree_bytes(index).div_ceil(NODE_ROOM - LARGEST_ENTRY) + 1;
    leaves + leaves / 64 + 4
}

/// The largest leaf entry: the longest extent's (a full piece with its key and the two
/// length fields takes less).
const LARGEST_ENTRY: u64 = EXTENT_ENTRY_FIXED + 4 * EXTENT_BLOCKS_MAX;
const _: () = assert!(LARGEST_ENTRY >= (PIECE + OBJECT_KEY_LEN + 4) as u64);
const _: () = assert!(8 + 4 * EXTENT_BLOCKS_MAX as usize <= VALUE_MAX);

/// Where the tree's nodes live: the loaded tree, live nodes per segment, and the metadata
/// segment new nodes are appended to.
pub(crate) struct MetaTree {
    /// `None` until the first tree checkpoint (a new store, or one whose checkpoint is a
    /// blob of format 3): that one writes every record.
    pub tree: Option<Tree>,
    /// Live nodes per segment.
    live: Vec<u32>,
    /// Live nodes in all.
    pub nodes: u64,
    /// The metadata segment nodes go to next, and its next free block.
    pub open: Option<(u32, u64)>,
    /// A checkpoint is between changing the tree and its slot becoming durable: nodes it
    /// placed may not be on the device yet, so none may be evicted (and read again).
    pub checkpointing: bool,
}

impl MetaTree {
    pub fn without_tree(segments: u32) -> Self {
        Self {
            tree: None,
            live: vec![0; segments as usize],
            nodes: 0,
            open: None,
            checkpointing: false,
        }
    }

    /// Counts a node a mount found at `paddr`. Fails on one outside every segment or in a
    /// segment's header block (the walk refuses a node reached twice).
    pub fn count_found(&mut self, geo: &Geometry, paddr: u64) -> Result<(), String> {
        let s = geo
            .segment_of(paddr)
            .filter(|&s| paddr != geo.segment_start(s))
            .ok_or_else(|| format!("tree node at block {paddr} lies outside every segment"))?;
        self.take(s);
        Ok(())
    }

    pub fn live_in(&self, segment: u32) -> u32 {
        self.live[segment as usize]
    }

    /// Counts a node written at `paddr` of `segment`.
    pub fn take(&mut self, segment: u32) {
        self.live[segment as usize] += 1;
        self.nodes += 1;
    }

    /// Uncounts a node no durable checkpoint references any more; returns its segment's
    /// live count after.
    pub fn release(&mut self, segment: u32, paddr: u64) -> Result<u32, String> {
        let live = &mut self.live[segment as usize];
        *live = live.checked_sub(1).ok_or_else(|| {
            format!("tree node at block {paddr} freed from segment {segment}, which counts none")
        })?;
        self.nodes -= 1;
        Ok(*live)
    }

    /// Forgets every node of `segment` (a fresh tree was written elsewhere).
    pub fn drop_segment(&mut self, segment: u32) {
        self.nodes -= self.live[segment as usize] as u64;
        self.live[segment as usize] = 0;
    }

    /// Whether the next checkpoint should write a fresh tree: there is none yet, or the one
    /// there has grown past twice a fresh one (deletions leave nodes underfull), or its live
    /// nodes are spread thin over `meta_segments` segments of `per_segment` node blocks.
    pub fn wants_fresh_tree(&self, index: &Index, meta_segments: u64, per_segment: u64) -> bool {
        let fresh = fresh_tree_blocks(index);
        self.tree.is_none()
            || self.nodes > 2 * fresh
            || meta_segments * per_segment > 2 * fresh + 2 * per_segment
    }
}

/// Objects by collection and name (the journal's, which a replay changes).
pub(crate) type Names = std::collections::BTreeMap<CollectionId, std::collections::HashSet<String>>;

/// Rebuilds an index from the tree's entries, given in key order.
pub(crate) struct Loader {
    index: Index,
    /// The object whose entries are being gathered.
    object: Option<Gathered>,
    /// Record bytes of bodies kept in memory as they load; those past it are paged out at
    /// once (their live blocks counted first), so a load holds the cache's worth, whatever
    /// the store's size.
    budget: u64,
    kept: u64,
    /// Objects whose bodies stay whatever the budget: the journal replay changes them.
    needed: Names,
    last_key: Option<Vec<u8>>,
}

/// The entries of one object read so far.
struct Gathered {
    id: u64,
    pieces: u32,
    record: Vec<u8>,
    extents: Vec<(u64, Extent)>,
}

fn invalid(what: &'static str, found: u64) -> DecodeError {
    DecodeError::Invalid { what, found }
}

impl Loader {
    /// A loader that keeps every body.
    pub fn new(geometry: Geometry) -> Self {
        Self::paging(geometry, u64::MAX, Names::new())
    }

    /// A loader that keeps `budget` record bytes of bodies and those of `needed`.
    pub fn paging(geometry: Geometry, budget: u64, needed: Names) -> Self {
        Self {
            index: Index::new(geometry),
            object: None,
            budget,
            kept: 0,
            needed,
            last_key: None,
        }
    }

    pub fn push(&mut self, key: &[u8], value: &[u8]) -> Result<(), DecodeError> {
        // A tree's entries come in strictly increasing order: a key repeated or out of place
        // (a damaged or crafted tree) could give two objects one tree id.
        if self.last_key.as_deref().is_some_and(|last| last >= key) {
            return Err(invalid("metadata tree key order", key.len() as u64));
        }
        self.last_key = Some(key.to_vec());
        match (key.first(), key.len()) {
            (Some(&KIND_COLLECTION), 9) => {
                if self.object.is_some() || self.index.objects > 0 {
                    return Err(invalid("collection key after objects", 0));
                }
                let cid = PgId {
                    pool: u32::from_be_bytes(key[1..5].try_into().unwrap()),
                    seed: u32::from_be_bytes(key[5..9].try_into().unwrap()),
                };
                if !value.is_empty() {
                    return Err(invalid("collection value length", value.len() as u64));
                }
                self.index.insert_collection(cid);
                Ok(())
            }
            (Some(&KIND_OBJECT), _) => match parse_object_key(key) {
                Some(ObjectEntry::Piece { id, chunk }) => self.push_piece(id, chunk, value),
                Some(ObjectEntry::Extent { id, lblock }) => match &mut self.object {
                    Some(g) if g.id == id => {
                        g.extents
                            .push((lblock, decode_extent_value(lblock, value)?));
                        Ok(())
                    }
                    _ => Err(invalid("extent without its object's record", id)),
                },
                None => Err(invalid("metadata tree key", key.len() as u64)),
            },
            _ => Err(invalid("metadata tree key", key.len() as u64)),
        }
    }

    fn push_piece(&mut self, id: u64, chunk: u32, value: &[u8]) -> Result<(), DecodeError> {
        // Pieces are as `chunks` cuts them: full but the last, never empty.
        if value.is_empty() || value.len() > PIECE {
            return Err(invalid("object record piece length", value.len() as u64));
        }
        if chunk >= PIECES_MAX {
            return Err(invalid("object record piece", chunk as u64));
        }
        match &mut self.object {
            Some(g) if g.id == id && g.pieces == chunk && g.extents.is_empty() => {
                if g.record.len() != chunk as usize * PIECE {
                    return Err(invalid("object record piece length", chunk as u64));
                }
                g.record.extend_from_slice(value);
                g.pieces += 1;
                return Ok(());
            }
            _ if chunk != 0 => return Err(invalid("object record piece", chunk as u64)),
            _ => {}
        }
        self.finish_object()?;
        self.object = Some(Gathered {
            id,
            pieces: 1,
            record: value.to_vec(),
            extents: Vec::new(),
        });
        Ok(())
    }

    fn finish_object(&mut self) -> Result<(), DecodeError> {
        let Some(g) = self.object.take() else {
            return Ok(());
        };
        let (id, pieces) = (g.id, g.pieces);
        let StoredObject {
            cid,
            oid,
            size,
            body,
            extent_keys,
        } = decode_object_entries(Bytes::from(g.record), g.extents)?;
        let mut o = self.index.count_loaded(&oid, size, body)?;
        let needed = self
            .needed
            .get(&cid)
            .is_some_and(|names| names.contains(&oid));
        if !needed {
            match self.kept.checked_add(o.encoded) {
                Some(k) if k <= self.budget => self.kept = k,
                // Its record is in the tree (it was just read from there): clean, and read
                // back from there when used.
                _ => o.body = None,
            }
        }
        self.index
            .insert_loaded(cid, oid, o, id, pieces, extent_keys)
    }

    pub fn finish(mut self) -> Result<Index, DecodeError> {
        self.finish_object()?;
        self.index.finish_load();
        Ok(self.index)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::delta::Delta;
    use crate::extents::Extent;

    pub(crate) const GEO: Geometry = Geometry {
        first_block: 2,
        segment_blocks: 64,
        segments: 8,
    };

    /// Puts every record of `ix` in a fresh tree, then reads the tree back.
    fn round_trip(ix: &Index) -> Index {
        let mut t = Tree::new();
        for cid in ix.colls.keys() {
            t.insert(&collection_key(*cid), &[]).unwrap();
        }
        for (cid, coll) in &ix.colls {
            for (oid, o) in coll {
                for (k, v) in object_entries(*cid, oid, o.id, o.size, o.body().unwrap()) {
                    t.insert(&k, &v).unwrap();
                }
            }
        }
        let mut loader = Loader::new(GEO);
        for (k, v) in t.range(b"", None, usize::MAX).unwrap() {
            loader.push(&k, &v).unwrap();
        }
        loader.finish().unwrap()
    }

    #[test]
    fn records_round_trip_through_the_tree_with_their_live_counts() {
        let cid = PgId { pool: 2, seed: 9 };
        let mut ix = Index::new(GEO);
        ix.apply(&Delta::CreateCollection(cid)).unwrap();
        ix.apply(&Delta::CreateCollection(PgId { pool: 3, seed: 0 }))
            .unwrap();
        // A name longer than a tree key, and an omap larger than a tree value.
        let long = "n".repeat(1000);
        for oid in ["a", long.as_str()] {
            ix.apply(&Delta::Touch(cid, oid.into())).unwrap();
        }
        ix.apply(&Delta::SetExtent {
            cid,
            oid: long.clone(),
            lblock: 5,
            extent: Extent::new(70, &[1, 2, 3]),
        })
        .unwrap();
        let kvs = (0..40u32)
            .map(|i| {
                (
                    Bytes::from(format!("key{i}")),
                    Bytes::from(vec![i as u8; 300]),
                )
            })
            .collect();
        ix.apply(&Delta::OmapSet(cid, "a".into(), kvs)).unwrap();
        let back = round_trip(&ix);
        assert_eq!(back.objects, 2);
        assert_eq!(back.colls.len(), 2);
        assert_eq!(back.live_blocks, 3);
        assert_eq!(back.segment_live, ix.segment_live);
        assert_eq!(back.encoded_len(), ix.encoded_len());
        assert_eq!(back.body_of(cid, "a").unwrap().omap.len(), 40);
        let a = back.object(cid, "a").unwrap();
        assert!(a.stored_chunks > 1, "the omap takes several pieces");
        assert!(!a.dirty);
        assert_eq!(back.body_of(cid, &long).unwrap().blocks.blocks(), 3);
        assert_eq!(back.next_id, ix.next_id);
    }

    #[test]
    fn a_missing_piece_or_a_stray_key_is_refused() {
        let mut l = Loader::new(GEO);
        l.push(&collection_key(PgId { pool: 1, seed: 1 }), &[])
            .unwrap();
        assert!(l.push(&object_key(4, 1), b"x").is_err(), "piece 0 missing");
        // A piece cut short before another, or longer than a piece, is not what we write.
        assert!(l.push(&object_key(5, 0), b"short").is_ok());
        assert!(l.push(&object_key(5, 1), b"x").is_err());
        assert!(Loader::new(GEO)
            .push(&object_key(6, 0), &[0; PIECE + 1])
            .is_err());
        assert!(Loader::new(GEO).push(b"Zzz", b"").is_err());
        // A record cut short fails to decode.
        let mut l = Loader::new(GEO);
        l.push(&collection_key(PgId { pool: 1, seed: 1 }), &[])
            .unwrap();
        l.push(&object_key(4, 0), &[1, 0, 1, 0]).unwrap();
        assert!(l.finish().is_err());
    }

    /// The bound holds for every record size, including those that leave the most room
    /// unused per leaf (a record one byte longer than a piece).
    #[test]
    fn a_fresh_tree_never_takes_more_than_its_bound() {
        let cid = PgId { pool: 1, seed: 1 };
        for pad in (600..1200).step_by(3).chain([2000, 2950, 3000, 3050, 5000]) {
            let mut ix = Index::new(GEO);
            ix.apply(&Delta::CreateCollection(cid)).unwrap();
            for i in 0..300 {
                let oid = format!("object-{i:05}");
                ix.apply(&Delta::Touch(cid, oid.clone())).unwrap();
                let v = Bytes::from(vec![7u8; pad]);
                ix.apply(&Delta::SetAttr(cid, oid, "pad".into(), v))
                    .unwrap();
            }
            let mut t = Tree::new();
            let mut entries: Vec<(Vec<u8>, Vec<u8>)> = vec![(collection_key(cid), Vec::new())];
            for (oid, o) in &ix.colls[&cid] {
                entries.extend(object_entries(cid, oid, o.id, o.size, o.body().unwrap()));
            }
            entries.sort();
            for (k, v) in &entries {
                t.insert(k, v).unwrap();
            }
            let written = t.flush(&mut || 1).writes.len() as u64;
            let bound = fresh_tree_blocks(&ix);
            assert!(
                written <= bound,
                "xattr of {pad} bytes: {written} nodes, bound {bound}"
            );
            // A tree written afresh by the streaming builder keeps the same bound.
            let mut b = carmine_btree::Builder::new(1);
            let mut out = Vec::new();
            for (k, v) in &entries {
                b.push(k, v, &mut || 1, &mut out).unwrap();
            }
            b.finish(&mut || 1, &mut out);
            let built = out.len() as u64;
            assert!(
                built <= bound,
                "xattr of {pad} bytes: {built} nodes built, bound {bound}"
            );
        }
    }

    #[test]
    fn a_fresh_tree_is_due_when_the_tree_wastes_space() {
        let mut ix = Index::new(GEO);
        ix.apply(&Delta::CreateCollection(PgId { pool: 1, seed: 1 }))
            .unwrap();
        let mut m = MetaTree::without_tree(GEO.segments);
        assert!(m.wants_fresh_tree(&ix, 0, 63), "no tree yet");
        m.tree = Some(Tree::new());
        m.take(1);
        assert!(!m.wants_fresh_tree(&ix, 1, 63));
        for _ in 0..2 * fresh_tree_blocks(&ix) {
            m.take(1);
        }
        assert!(m.wants_fresh_tree(&ix, 1, 63), "too many nodes");
        let mut m = MetaTree::without_tree(GEO.segments);
        m.tree = Some(Tree::new());
        m.take(1);
        assert!(m.wants_fresh_tree(&ix, 4, 63), "live nodes spread thin");
    }
}
