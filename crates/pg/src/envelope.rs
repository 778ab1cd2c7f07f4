//! What one OSD reactor sends another about a PG (the payload of a `Peer` frame): the PG
//! protocol's messages (`carmine_pg::Msg`, with the ops of a replicated write), and the
//! object copies recovery pulls. Layout in docs/format/wire.md ("Messages between OSDs").

use crate::scrub::{decode_scrub_map, encode_scrub_map, ScrubMap};
use crate::wire::{decode_msg, decode_version, encode_msg, encode_version};
use crate::{Msg, Version};
use bytes::{Bytes, BytesMut};
use carmine_proto::OsdOp;
use carmine_types::limits::{IO_LEN_MAX, OBJECT_NAME_LEN_MAX, OPS_PER_REQUEST_MAX};
use carmine_types::{DecodeError, Decoder, Encoder, OsdId, PgId};

const KIND_PG: u8 = 1;
const KIND_PULL: u8 = 2;
const KIND_PULLED: u8 = 3;
const KIND_SCRUB_ASK: u8 = 4;
const KIND_SCRUB_MAP: u8 = 5;
const KIND_PUSH: u8 = 6;
const KIND_PUSHED: u8 = 7;
/// The longest reason a member gives for refusing a scrub or a push.
const REASON_LEN_MAX: usize = 1024;
/// Attributes and omap entries one object copy may carry.
const ATTRS_MAX: usize = 1 << 16;
const ATTR_LEN_MAX: usize = carmine_types::limits::ATTR_NAME_LEN_MAX;
const OMAP_MAX: usize = 1 << 20;
const KEY_LEN_MAX: usize = 64 * 1024;

/// An object as recovery copies it: everything a client can have written to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectCopy {
    pub data: Bytes,
    pub attrs: Vec<(String, Bytes)>,
    pub omap_header: Bytes,
    pub omap: Vec<(Bytes, Bytes)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A message of the PG protocol; a replicated write (`Msg::Rep`) carries its ops.
    Pg { msg: Msg, ops: Vec<OsdOp> },
    /// Asks for the whole of object `oid` (recovery).
    Pull { oid: String },
    /// The answer: the object as the sender has it at `version` (`None`: it has no such
    /// object; `version` is then the sender's last known one, or zero).
    Pulled {
        oid: String,
        version: Version,
        copy: Option<ObjectCopy>,
    },
    /// The primary of `epoch` asks for the member's report of the PG's objects named after
    /// `after` up to and including `upto` (`None`: from the start, to the end), with checksums
    /// if `deep`. The primary holds back writes to the PG until every member answered.
    ScrubAsk {
        epoch: u32,
        token: u64,
        after: Option<String>,
        upto: Option<String>,
        deep: bool,
    },
    /// The answer, or why the member cannot give it (not in that interval).
    ScrubMap {
        token: u64,
        map: Result<ScrubMap, String>,
    },
    /// Repair: the member's copy of `oid` becomes `copy` at `version` (`None`: it goes).
    Push {
        epoch: u32,
        token: u64,
        oid: String,
        version: Version,
        copy: Option<ObjectCopy>,
    },
    /// The push is durable, or why it is not.
    Pushed {
        token: u64,
        result: Result<(), String>,
    },
}

fn encode_opt_str<B: bytes::BufMut>(e: &mut Encoder<'_, B>, s: &Option<String>) {
    match s {
        None => e.u8(0),
        Some(s) => e.u8(1).str(s),
    };
}

fn decode_opt_str(d: &mut Decoder, what: &'static str) -> Result<Option<String>, DecodeError> {
    Ok(match d.bool(what)? {
        false => None,
        true => Some(d.string(what, OBJECT_NAME_LEN_MAX)?),
    })
}

fn encode_reason<B: bytes::BufMut>(e: &mut Encoder<'_, B>, r: &Result<(), String>) {
    match r {
        Ok(()) => e.u8(0),
        Err(why) => {
            let mut end = why.len().min(REASON_LEN_MAX);
            while !why.is_char_boundary(end) {
                end -= 1;
            }
            e.u8(1).str(&why[..end])
        }
    };
}

fn decode_reason(d: &mut Decoder) -> Result<Result<(), String>, DecodeError> {
    Ok(match d.bool("refused")? {
        false => Ok(()),
        true => Err(d.string("reason", REASON_LEN_MAX)?),
    })
}

fn encode_copy<B: bytes::BufMut>(e: &mut Encoder<'_, B>, copy: &Option<ObjectCopy>) {
    match copy {
        None => {
            e.u8(0);
        }
        Some(c) => {
            e.u8(1).bytes(&c.data).count(c.attrs.len());
            for (k, v) in &c.attrs {
                e.str(k).bytes(v);
            }
            e.bytes(&c.omap_header).count(c.omap.len());
            for (k, v) in &c.omap {
                e.bytes(k).bytes(v);
            }
        }
    }
}

fn decode_copy(d: &mut Decoder) -> Result<Option<ObjectCopy>, DecodeError> {
    if !d.bool("object present")? {
        return Ok(None);
    }
    let data = d.bytes("object data", IO_LEN_MAX as usize)?;
    let n = d.count("attribute count", ATTRS_MAX)?;
    let mut attrs = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        attrs.push((
            d.string("attribute name", ATTR_LEN_MAX)?,
            d.bytes("attribute value", IO_LEN_MAX as usize)?,
        ));
    }
    let omap_header = d.bytes("omap header", IO_LEN_MAX as usize)?;
    let n = d.count("omap count", OMAP_MAX)?;
    let mut omap = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        omap.push((
            d.bytes("omap key", KEY_LEN_MAX)?,
            d.bytes("omap value", IO_LEN_MAX as usize)?,
        ));
    }
    Ok(Some(ObjectCopy {
        data,
        attrs,
        omap_header,
        omap,
    }))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerMessage {
    pub from: OsdId,
    /// The sender's incarnation, and the receiver's as the sender knows it (0: unknown); see
    /// `Member::admit`.
    pub from_inc: u64,
    pub to_inc: u64,
    pub pg: PgId,
    pub body: Body,
}

impl PeerMessage {
    pub fn encode(&self, out: &mut BytesMut) {
        Encoder::new(out)
            .u32(self.from)
            .u64(self.from_inc)
            .u64(self.to_inc)
            .u32(self.pg.pool)
            .u32(self.pg.seed);
        match &self.body {
            Body::Pg { msg, ops } => {
                Encoder::new(out).u8(KIND_PG);
                encode_msg(out, msg);
                let mut e = Encoder::new(out);
                e.count(ops.len());
                ops.iter().for_each(|op| op.encode(&mut e));
            }
            Body::Pull { oid } => {
                Encoder::new(out).u8(KIND_PULL).str(oid);
            }
            Body::Pulled { oid, version, copy } => {
                let mut e = Encoder::new(out);
                e.u8(KIND_PULLED).str(oid);
                encode_version(&mut e, *version);
                encode_copy(&mut e, copy);
            }
            Body::ScrubAsk {
                epoch,
                token,
                after,
                upto,
                deep,
            } => {
                let mut e = Encoder::new(out);
                e.u8(KIND_SCRUB_ASK).u32(*epoch).u64(*token);
                encode_opt_str(&mut e, after);
                encode_opt_str(&mut e, upto);
                e.bool(*deep);
            }
            Body::ScrubMap { token, map } => {
                let mut e = Encoder::new(out);
                e.u8(KIND_SCRUB_MAP).u64(*token);
                match map {
                    Ok(m) => {
                        e.u8(0);
                        encode_scrub_map(&mut e, m);
                    }
                    Err(why) => encode_reason(&mut e, &Err(why.clone())),
                }
            }
            Body::Push {
                epoch,
                token,
                oid,
                version,
                copy,
            } => {
                let mut e = Encoder::new(out);
                e.u8(KIND_PUSH).u32(*epoch).u64(*token).str(oid);
                encode_version(&mut e, *version);
                encode_copy(&mut e, copy);
            }
            Body::Pushed { token, result } => {
                let mut e = Encoder::new(out);
                e.u8(KIND_PUSHED).u64(*token);
                encode_reason(&mut e, result);
            }
        }
    }

    /// `log_max`: the bound of the logs the receiver keeps.
    pub fn decode(payload: Bytes, log_max: usize) -> Result<Self, DecodeError> {
        let mut d = Decoder::new(payload);
        let from = d.u32("sender")?;
        let from_inc = d.u64("sender incarnation")?;
        let to_inc = d.u64("receiver incarnation")?;
        let pg = PgId {
            pool: d.u32("pool")?,
            seed: d.u32("pg")?,
        };
        let body = match d.u8("peer message kind")? {
            KIND_PG => {
                let msg = decode_msg(&mut d, log_max)?;
                let n = d.count("op count", OPS_PER_REQUEST_MAX)?;
                let mut ops = Vec::with_capacity(n);
                for index in 0..n {
                    match OsdOp::decode(&mut d, index)? {
                        Ok(op) if op.is_write() => ops.push(op),
                        Ok(_) | Err(_) => {
                            return Err(DecodeError::Invalid {
                                what: "replicated op",
                                found: index as u64,
                            })
                        }
                    }
                }
                Body::Pg { msg, ops }
            }
            KIND_PULL => Body::Pull {
                oid: d.string("object name", OBJECT_NAME_LEN_MAX)?,
            },
            KIND_PULLED => Body::Pulled {
                oid: d.string("object name", OBJECT_NAME_LEN_MAX)?,
                version: decode_version(&mut d)?,
                copy: decode_copy(&mut d)?,
            },
            KIND_SCRUB_ASK => Body::ScrubAsk {
                epoch: d.u32("epoch")?,
                token: d.u64("scrub token")?,
                after: decode_opt_str(&mut d, "scrub range start")?,
                upto: decode_opt_str(&mut d, "scrub range end")?,
                deep: d.bool("deep scrub")?,
            },
            KIND_SCRUB_MAP => {
                let token = d.u64("scrub token")?;
                let map = match decode_reason(&mut d)? {
                    Ok(()) => Ok(decode_scrub_map(&mut d)?),
                    Err(why) => Err(why),
                };
                Body::ScrubMap { token, map }
            }
            KIND_PUSH => Body::Push {
                epoch: d.u32("epoch")?,
                token: d.u64("push token")?,
                oid: d.string("object name", OBJECT_NAME_LEN_MAX)?,
                version: decode_version(&mut d)?,
                copy: decode_copy(&mut d)?,
            },
            KIND_PUSHED => Body::Pushed {
                token: d.u64("push token")?,
                result: decode_reason(&mut d)?,
            },
            k => {
                return Err(DecodeError::Invalid {
                    what: "peer message kind",
                    found: k as u64,
                })
            }
        };
        d.finish("peer message")?;
        Ok(PeerMessage {
            from,
            from_inc,
            to_inc,
            pg,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(m: &PeerMessage) {
        let mut b = BytesMut::new();
        m.encode(&mut b);
        let full = b.freeze();
        assert_eq!(&PeerMessage::decode(full.clone(), 100).unwrap(), m);
        for cut in 0..full.len() {
            assert!(PeerMessage::decode(full.slice(..cut), 100).is_err());
        }
    }

    #[test]
    fn peer_messages_round_trip_and_truncations_are_errors() {
        let pg = PgId { pool: 3, seed: 7 };
        round_trip(&PeerMessage {
            from: 2,
            from_inc: 7,
            to_inc: 2,
            pg,
            body: Body::Pg {
                msg: Msg::RepAck {
                    epoch: 4,
                    version: Version::new(4, 9),
                },
                ops: vec![OsdOp::Write {
                    off: 4096,
                    data: Bytes::from_static(b"abc"),
                }],
            },
        });
        round_trip(&PeerMessage {
            from: 1,
            from_inc: 7,
            to_inc: 1,
            pg,
            body: Body::Pull { oid: "obj".into() },
        });
        round_trip(&PeerMessage {
            from: 1,
            from_inc: 7,
            to_inc: 1,
            pg,
            body: Body::Pulled {
                oid: "obj".into(),
                version: Version::new(2, 3),
                copy: Some(ObjectCopy {
                    data: Bytes::from_static(b"data"),
                    attrs: vec![("lock".into(), Bytes::from_static(b"x"))],
                    omap_header: Bytes::from_static(b"h"),
                    omap: vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
                }),
            },
        });
        round_trip(&PeerMessage {
            from: 1,
            from_inc: 7,
            to_inc: 1,
            pg,
            body: Body::ScrubAsk {
                epoch: 9,
                token: 3,
                after: Some("a".into()),
                upto: None,
                deep: true,
            },
        });
        round_trip(&PeerMessage {
            from: 1,
            from_inc: 7,
            to_inc: 1,
            pg,
            body: Body::ScrubMap {
                token: 3,
                map: Ok(crate::scrub::ScrubMap {
                    objects: vec![crate::scrub::ScrubObject {
                        oid: "b".into(),
                        version: Version::new(9, 1),
                        size: 4096,
                        digest: None,
                        error: Some("Corrupt".into()),
                    }],
                    truncated: false,
                }),
            },
        });
        round_trip(&PeerMessage {
            from: 1,
            from_inc: 7,
            to_inc: 1,
            pg,
            body: Body::ScrubMap {
                token: 4,
                map: Err("not in epoch 9".into()),
            },
        });
        round_trip(&PeerMessage {
            from: 0,
            from_inc: 7,
            to_inc: 0,
            pg,
            body: Body::Push {
                epoch: 9,
                token: 5,
                oid: "b".into(),
                version: Version::new(9, 1),
                copy: Some(ObjectCopy::default()),
            },
        });
        round_trip(&PeerMessage {
            from: 2,
            from_inc: 7,
            to_inc: 2,
            pg,
            body: Body::Pushed {
                token: 5,
                result: Err("no space".into()),
            },
        });
        round_trip(&PeerMessage {
            from: 1,
            from_inc: 7,
            to_inc: 1,
            pg,
            body: Body::Pulled {
                oid: "gone".into(),
                version: Version::ZERO,
                copy: None,
            },
        });
    }

    #[test]
    fn a_replicated_read_op_is_refused() {
        let mut b = BytesMut::new();
        PeerMessage {
            from: 0,
            from_inc: 7,
            to_inc: 0,
            pg: PgId { pool: 1, seed: 0 },
            body: Body::Pg {
                msg: Msg::Query { epoch: 1 },
                ops: vec![OsdOp::Stat],
            },
        }
        .encode(&mut b);
        assert!(PeerMessage::decode(b.freeze(), 10).is_err());
    }
}
