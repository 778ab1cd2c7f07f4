//! Metadata deltas: what a journal record says happened. A transaction is translated into
//! deltas once (with data already placed); the same deltas update the in-memory index at
//! runtime and during replay, so the two cannot disagree.

use bytes::{Bytes, BytesMut};
use carmine_types::limits::{ATTR_NAME_LEN_MAX, OBJECT_NAME_LEN_MAX, VALUE_LEN_MAX};
use carmine_types::{CollectionId, DecodeError, Decoder, Encoder, PgId};

use crate::extents::{decode_extent, Extent};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delta {
    CreateCollection(CollectionId),
    RemoveCollection(CollectionId),
    /// Creates the object if missing.
    Touch(CollectionId, String),
    Remove(CollectionId, String),
    SetSize(CollectionId, String, u64),
    /// Maps logical blocks from `lblock` on to the device blocks of `extent`, whose data
    /// must match its checksums. Encoded as *set block* (tag 6) when it is one block long.
    SetExtent {
        cid: CollectionId,
        oid: String,
        lblock: u64,
        extent: Extent,
    },
    /// Unmaps logical blocks `[from, to)` (they read as zeros).
    Punch(CollectionId, String, u64, u64),
    SetAttr(CollectionId, String, String, Bytes),
    RmAttr(CollectionId, String, String),
    OmapSet(CollectionId, String, Vec<(Bytes, Bytes)>),
    OmapRm(CollectionId, String, Vec<Bytes>),
    OmapClear(CollectionId, String),
    OmapHeader(CollectionId, String, Bytes),
    /// Makes `dst`'s size, xattrs and omap a copy of `src`'s (data goes by `SetExtent`).
    CopyMeta(CollectionId, String, String),
}

const KEYS_MAX: usize = 1 << 16;

fn cid(e: &mut Encoder<'_, BytesMut>, c: CollectionId) {
    e.u32(c.pool).u32(c.seed);
}

impl Delta {
    /// Encoded size of a `SetExtent` of `blocks` blocks for an object name of `oid_len` bytes.
    pub fn set_extent_len(oid_len: usize, blocks: usize) -> usize {
        let count = if blocks > 1 { 4 } else { 0 };
        1 + 8 + 4 + oid_len + 8 + 8 + count + 4 * blocks
    }

    /// The objects it changes (a copy's source too): what a replay needs resident.
    pub fn objects(&self) -> impl Iterator<Item = (CollectionId, &str)> {
        let (c, first, second) = match self {
            Delta::CreateCollection(_) | Delta::RemoveCollection(_) => {
                return None.into_iter().flatten()
            }
            Delta::Touch(c, o)
            | Delta::Remove(c, o)
            | Delta::SetSize(c, o, _)
            | Delta::SetExtent { cid: c, oid: o, .. }
            | Delta::Punch(c, o, _, _)
            | Delta::SetAttr(c, o, _, _)
            | Delta::RmAttr(c, o, _)
            | Delta::OmapSet(c, o, _)
            | Delta::OmapRm(c, o, _)
            | Delta::OmapClear(c, o)
            | Delta::OmapHeader(c, o, _) => (*c, o.as_str(), None),
            Delta::CopyMeta(c, s, d) => (*c, s.as_str(), Some(d.as_str())),
        };
        Some(
            [Some((c, first)), second.map(|d| (c, d))]
                .into_iter()
                .flatten(),
        )
        .into_iter()
        .flatten()
    }

    pub fn encode(&self, out: &mut BytesMut) {
        let mut e = Encoder::new(out);
        match self {
            Delta::CreateCollection(c) => {
                e.u8(1);
                cid(&mut e, *c);
            }
            Delta::RemoveCollection(c) => {
                e.u8(2);
                cid(&mut e, *c);
            }
            Delta::Touch(c, o) => {
                e.u8(3);
                cid(&mut e, *c);
                e.str(o);
            }
            Delta::Remove(c, o) => {
                e.u8(4);
                cid(&mut e, *c);
                e.str(o);
            }
            Delta::SetSize(c, o, s) => {
                e.u8(5);
                cid(&mut e, *c);
                e.str(o).u64(*s);
            }
            Delta::SetExtent {
                cid: c,
                oid,
                lblock,
                extent,
            } => {
                let crcs = extent.crcs.as_slice();
                e.u8(if crcs.len() == 1 { 6 } else { 15 });
                cid(&mut e, *c);
                e.str(oid).u64(*lblock).u64(extent.paddr);
                if crcs.len() > 1 {
                    e.u32(crcs.len() as u32);
                }
                for crc in crcs {
                    e.u32(*crc);
                }
            }
            Delta::Punch(c, o, from, to) => {
                e.u8(7);
                cid(&mut e, *c);
                e.str(o).u64(*from).u64(*to);
            }
            Delta::SetAttr(c, o, n, v) => {
                e.u8(8);
                cid(&mut e, *c);
                e.str(o).str(n).bytes(v);
            }
            Delta::RmAttr(c, o, n) => {
                e.u8(9);
                cid(&mut e, *c);
                e.str(o).str(n);
            }
            Delta::OmapSet(c, o, kvs) => {
                e.u8(10);
                cid(&mut e, *c);
                e.str(o).count(kvs.len());
                for (k, v) in kvs {
                    e.bytes(k).bytes(v);
                }
            }
            Delta::OmapRm(c, o, keys) => {
                e.u8(11);
                cid(&mut e, *c);
                e.str(o).count(keys.len());
                for k in keys {
                    e.bytes(k);
                }
            }
            Delta::OmapClear(c, o) => {
                e.u8(12);
                cid(&mut e, *c);
                e.str(o);
            }
            Delta::OmapHeader(c, o, h) => {
                e.u8(13);
                cid(&mut e, *c);
                e.str(o).bytes(h);
            }
            Delta::CopyMeta(c, s, d) => {
                e.u8(14);
                cid(&mut e, *c);
                e.str(s).str(d);
            }
        }
    }

    pub fn decode(d: &mut Decoder) -> Result<Self, DecodeError> {
        let tag = d.u8("delta tag")?;
        let c = PgId {
            pool: d.u32("pool")?,
            seed: d.u32("seed")?,
        };
        let name = |d: &mut Decoder| d.string("object name", OBJECT_NAME_LEN_MAX);
        Ok(match tag {
            1 => Delta::CreateCollection(c),
            2 => Delta::RemoveCollection(c),
            3 => Delta::Touch(c, name(d)?),
            4 => Delta::Remove(c, name(d)?),
            5 => Delta::SetSize(c, name(d)?, d.u64("size")?),
            6 | 15 => {
                let oid = name(d)?;
                let lblock = d.u64("lblock")?;
                let paddr = d.u64("paddr")?;
                let n = match tag {
                    6 => 1,
                    _ => d.u32("extent blocks")? as u64,
                };
                // A one-block extent has one encoding only (set block).
                if tag == 15 && n == 1 {
                    return Err(DecodeError::Invalid {
                        what: "extent blocks",
                        found: n,
                    });
                }
                Delta::SetExtent {
                    cid: c,
                    oid,
                    lblock,
                    extent: decode_extent(d, lblock, paddr, n)?,
                }
            }
            7 => Delta::Punch(c, name(d)?, d.u64("from")?, d.u64("to")?),
            8 => Delta::SetAttr(
                c,
                name(d)?,
                d.string("attr", ATTR_NAME_LEN_MAX)?,
                d.bytes("value", VALUE_LEN_MAX)?,
            ),
            9 => Delta::RmAttr(c, name(d)?, d.string("attr", ATTR_NAME_LEN_MAX)?),
            10 => {
                let o = name(d)?;
                let n = d.count("omap keys", KEYS_MAX)?;
                let mut kvs = Vec::with_capacity(n);
                for _ in 0..n {
                    kvs.push((
                        d.bytes("key", VALUE_LEN_MAX)?,
                        d.bytes("value", VALUE_LEN_MAX)?,
                    ));
                }
                Delta::OmapSet(c, o, kvs)
            }
            11 => {
                let o = name(d)?;
                let n = d.count("omap keys", KEYS_MAX)?;
                let mut keys = Vec::with_capacity(n);
                for _ in 0..n {
                    keys.push(d.bytes("key", VALUE_LEN_MAX)?);
                }
                Delta::OmapRm(c, o, keys)
            }
            12 => Delta::OmapClear(c, name(d)?),
            13 => Delta::OmapHeader(c, name(d)?, d.bytes("header", VALUE_LEN_MAX)?),
            14 => Delta::CopyMeta(c, name(d)?, name(d)?),
            t => {
                return Err(DecodeError::Invalid {
                    what: "delta tag",
                    found: t as u64,
                })
            }
        })
    }
}
