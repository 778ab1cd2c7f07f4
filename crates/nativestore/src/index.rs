//! The in-memory metadata of one shard: collections, onodes with their block maps, xattrs and
//! omap, plus per-segment live-block counts for the cleaner. Rebuilt at mount from the newest
//! checkpoint and the journal; changed only through [`Index::apply`].

use crate::delta::Delta;
use crate::error::IndexError;
use bytes::{Bytes, BytesMut};
use carmine_types::limits::{ATTR_NAME_LEN_MAX, OBJECT_NAME_LEN_MAX, VALUE_LEN_MAX};
use carmine_types::{CollectionId, DecodeError, Decoder, Encoder, PgId};
use std::collections::BTreeMap;

/// Where one logical block lives and the checksum its data must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRef {
    pub paddr: u64,
    pub crc: u32,
}

#[derive(Clone, Debug, Default)]
pub struct Onode {
    pub size: u64,
    pub blocks: BTreeMap<u64, BlockRef>,
    pub attrs: BTreeMap<String, Bytes>,
    pub omap_header: Bytes,
    pub omap: BTreeMap<Bytes, Bytes>,
}

pub type Collection = BTreeMap<String, Onode>;

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
        }
    }

    pub fn object(&self, cid: CollectionId, oid: &str) -> Option<&Onode> {
        self.colls.get(&cid)?.get(oid)
    }

    fn object_mut(&mut self, cid: CollectionId, oid: &str) -> Result<&mut Onode, IndexError> {
        self.colls
            .get_mut(&cid)
            .ok_or_else(|| missing("collection", cid, oid))?
            .get_mut(oid)
            .ok_or_else(|| missing("object", cid, oid))
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

    /// Releases mapped blocks. An accounting error leaves the blocks before it released:
    /// the caller stops the shard (at run time) or refuses the mount (at replay).
    fn release_all(
        &mut self,
        blocks: impl IntoIterator<Item = BlockRef>,
    ) -> Result<(), IndexError> {
        for b in blocks {
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
                self.colls.entry(*cid).or_default();
            }
            Delta::RemoveCollection(cid) => match self.colls.get(cid) {
                Some(c) if c.is_empty() => {
                    self.colls.remove(cid);
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
                    coll.insert(oid.clone(), Onode::default());
                    self.objects += 1;
                }
            }
            Delta::Remove(cid, oid) => {
                let onode = self
                    .colls
                    .get_mut(cid)
                    .ok_or_else(|| missing("collection", *cid, oid))?
                    .remove(oid.as_str())
                    .ok_or_else(|| missing("object", *cid, oid))?;
                self.objects -= 1;
                self.release_all(onode.blocks.into_values())?;
            }
            Delta::SetSize(cid, oid, size) => self.object_mut(*cid, oid)?.size = *size,
            Delta::SetBlock {
                cid,
                oid,
                lblock,
                paddr,
                crc,
            } => {
                let new = BlockRef {
                    paddr: *paddr,
                    crc: *crc,
                };
                self.object_mut(*cid, oid)?;
                self.take_block(new)?;
                let old = self.object_mut(*cid, oid)?.blocks.insert(*lblock, new);
                self.release_all(old)?;
            }
            Delta::Punch(cid, oid, from, to) => {
                let onode = self.object_mut(*cid, oid)?;
                if from >= to {
                    return Ok(());
                }
                let tail = onode.blocks.split_off(from);
                let mut tail = tail;
                let mut rest = tail.split_off(to);
                onode.blocks.append(&mut rest);
                self.release_all(tail.into_values())?;
            }
            Delta::SetAttr(cid, oid, name, value) => {
                self.object_mut(*cid, oid)?
                    .attrs
                    .insert(name.clone(), value.clone());
            }
            Delta::RmAttr(cid, oid, name) => {
                self.object_mut(*cid, oid)?.attrs.remove(name);
            }
            Delta::OmapSet(cid, oid, kvs) => {
                let o = self.object_mut(*cid, oid)?;
                for (k, v) in kvs {
                    o.omap.insert(k.clone(), v.clone());
                }
            }
            Delta::OmapRm(cid, oid, keys) => {
                let o = self.object_mut(*cid, oid)?;
                for k in keys {
                    o.omap.remove(k);
                }
            }
            Delta::OmapClear(cid, oid) => {
                let o = self.object_mut(*cid, oid)?;
                o.omap.clear();
                o.omap_header = Bytes::new();
            }
            Delta::OmapHeader(cid, oid, h) => self.object_mut(*cid, oid)?.omap_header = h.clone(),
            Delta::CopyMeta(cid, src, dst) => {
                let s = self
                    .object(*cid, src)
                    .ok_or_else(|| missing("source object", *cid, src))?;
                let (size, attrs, header, omap) = (
                    s.size,
                    s.attrs.clone(),
                    s.omap_header.clone(),
                    s.omap.clone(),
                );
                let d = self.object_mut(*cid, dst)?;
                d.size = size;
                d.attrs = attrs;
                d.omap_header = header;
                d.omap = omap;
            }
        }
        Ok(())
    }

    /// The whole metadata as one blob, for a checkpoint.
    pub fn encode(&self) -> BytesMut {
        let mut out = BytesMut::with_capacity(64 + self.live_blocks as usize * 20);
        let mut e = Encoder::new(&mut out);
        e.u32(CHECKPOINT_VERSION).count(self.colls.len());
        for (cid, coll) in &self.colls {
            e.u32(cid.pool).u32(cid.seed).count(coll.len());
            for (oid, o) in coll {
                e.str(oid).u64(o.size).u64(o.blocks.len() as u64);
                for (l, b) in &o.blocks {
                    e.u64(*l).u64(b.paddr).u32(b.crc);
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
        }
        out
    }

    /// Rebuilds the index from a checkpoint blob, recomputing the live counts.
    ///
    /// Every map's keys must come in strictly increasing order, as `encode` writes them: a
    /// repeated key would be kept once but counted twice (objects, live blocks), and a segment
    /// counted live forever is never cleaned.
    pub fn decode(blob: Bytes, geometry: Geometry) -> Result<Self, DecodeError> {
        let mut d = Decoder::new(blob);
        let version = d.u32("checkpoint version")?;
        if version != CHECKPOINT_VERSION {
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
                let oid = d.string("object name", OBJECT_NAME_LEN_MAX)?;
                after_last(&coll, &oid, "object order")?;
                let mut o = Onode {
                    size: d.u64("size")?,
                    ..Onode::default()
                };
                for _ in 0..d.u64("blocks")? {
                    let l = d.u64("lblock")?;
                    after_last(&o.blocks, &l, "block order")?;
                    let b = BlockRef {
                        paddr: d.u64("paddr")?,
                        crc: d.u32("crc")?,
                    };
                    if index.take_block(b).is_err() {
                        return Err(DecodeError::Invalid {
                            what: "block address",
                            found: b.paddr,
                        });
                    }
                    o.blocks.insert(l, b);
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
                coll.insert(oid, o);
                index.objects += 1;
            }
            index.colls.insert(cid, coll);
        }
        d.finish("checkpoint")?;
        Ok(index)
    }

    /// Metadata bytes held, roughly: for reporting and the checkpoint reserve.
    pub fn approx_bytes(&self) -> u64 {
        self.live_blocks * 48 + self.objects * 256
    }
}

pub(crate) const CHECKPOINT_VERSION: u32 = 1;

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
            let delta = Delta::SetBlock {
                cid: cid(),
                oid: "a".into(),
                lblock,
                paddr,
                crc: 0,
            };
            ix.apply(&delta).unwrap();
        }
        ix
    }

    #[test]
    fn a_release_the_counts_cannot_cover_is_refused_not_floored() {
        // Block 20 lives in segment 1. With its count lost, an overwrite must not leave the
        // segment counted empty (the cleaner would take it for free) but say so.
        let mut ix = index_with(&[(0, 20), (1, 21)]);
        ix.segment_live[1] = 1;
        let overwrite = |paddr| Delta::SetBlock {
            cid: cid(),
            oid: "a".into(),
            lblock: 0,
            paddr,
            crc: 0,
        };
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
        let delta = Delta::SetBlock {
            cid: cid(),
            oid: "a".into(),
            lblock: 0,
            paddr: 1,
            crc: 0,
        };
        assert_eq!(ix.apply(&delta), Err(IndexError::OutsideSegments(1)));
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
        let two = index_with(&[(4, 3), (5, 4)]).encode();
        // Rewrite the second block's logical number (after its oid, size, count and the first
        // block's 20 bytes) to repeat the first's.
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
