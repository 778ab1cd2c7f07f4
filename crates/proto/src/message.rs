//! Request and response messages carried in frame payloads.

use crate::frame::{begin_frame, encode_frame, Frame, FrameKind, Opcode, OpenFrame};
use bytes::BufMut;
use bytes::{Bytes, BytesMut};
use carmine_types::limits::{
    ATTR_NAME_LEN_MAX, IO_LEN_MAX, LIST_LIMIT_MAX, OBJECT_NAME_LEN_MAX, OPS_PER_REQUEST_MAX,
    VALUE_LEN_MAX,
};
use carmine_types::{DecodeError, Decoder, Encoder, PoolId};
use thiserror::Error;

/// Most keys or key/value pairs in one omap op.
const OMAP_KEYS_MAX: usize = LIST_LIMIT_MAX as usize;
/// Longest human-readable error message carried in an error reply.
const ERROR_MESSAGE_LEN_MAX: usize = 4096;
/// Largest encoded cluster map.
const MAP_LEN_MAX: usize = 16 * 1024 * 1024;

/// Outcome of a request. Codes are stable on the wire; never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
#[non_exhaustive]
pub enum Status {
    Ok = 0,
    ObjectNotFound = 1,
    PoolNotFound = 2,
    /// The PG is not owned by this OSD reactor in the receiver's map: refresh the map.
    WrongTarget = 3,
    InvalidArgument = 4,
    NoSpace = 5,
    Io = 6,
    Corrupt = 7,
    Exists = 8,
    NotEmpty = 9,
    AttrNotFound = 10,
    /// The request frame was valid but its message could not be decoded.
    Malformed = 11,
    Unsupported = 12,
    Busy = 13,
    Internal = 14,
    CollectionNotFound = 15,
    /// A compare op found another value: the request changed nothing.
    CompareFailed = 16,
    /// The requesting client was fenced (its image lock was broken): it may no longer write.
    Fenced = 17,
    /// The connection did not authenticate (no handshake, a wrong key, a replayed proof):
    /// the server closes it after this reply.
    AuthFailed = 18,
    /// The PG is peering, recovering its history, or has fewer than `min_size` copies up: it
    /// takes no request now. Retry (like an outage) until it is active.
    PgInactive = 19,
}

impl Status {
    pub fn from_u16(v: u16) -> Option<Self> {
        use Status::*;
        Some(match v {
            0 => Ok,
            1 => ObjectNotFound,
            2 => PoolNotFound,
            3 => WrongTarget,
            4 => InvalidArgument,
            5 => NoSpace,
            6 => Io,
            7 => Corrupt,
            8 => Exists,
            9 => NotEmpty,
            10 => AttrNotFound,
            11 => Malformed,
            12 => Unsupported,
            13 => Busy,
            14 => Internal,
            15 => CollectionNotFound,
            16 => CompareFailed,
            17 => Fenced,
            18 => AuthFailed,
            19 => PgInactive,
            _ => return None,
        })
    }
}

/// A message-level decoding failure. The frame was intact, so only this request fails.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ProtoError {
    #[error("malformed {opcode:?} message: {source}")]
    Decode { opcode: Opcode, source: DecodeError },
    #[error("unknown op code {code} at op index {index}")]
    UnknownOp { code: u8, index: usize },
    #[error("unknown status code {code}")]
    UnknownStatus { code: u16 },
    #[error("unknown output tag {tag}")]
    UnknownOutput { tag: u8 },
    #[error("expected a {expected:?} frame")]
    WrongKind { expected: FrameKind },
    #[error(
        "authentication messages come only first on a connection, and only where a key is set"
    )]
    Handshake,
    #[error("messages between OSDs are not requests of a client, and get no reply")]
    Peer,
}

/// One sub-operation on an object. Reads and writes are not mixed in one request: a request of
/// writes becomes one atomic store transaction, a request of reads one consistent read pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OsdOp {
    /// `len == 0` reads to the end of the object.
    Read {
        off: u64,
        len: u32,
    },
    Stat,
    GetXattr {
        name: String,
    },
    GetXattrs,
    OmapGetHeader,
    OmapGetVals {
        keys: Vec<Bytes>,
    },
    OmapList {
        start_after: Option<Bytes>,
        limit: u32,
    },
    /// Creates the object; with `exclusive`, fails with `Exists` if it is already there.
    Create {
        exclusive: bool,
    },
    Write {
        off: u64,
        data: Bytes,
    },
    /// Replaces the whole object's data.
    WriteFull {
        data: Bytes,
    },
    Zero {
        off: u64,
        len: u64,
    },
    Truncate {
        size: u64,
    },
    Remove,
    SetXattr {
        name: String,
        value: Bytes,
    },
    RmXattr {
        name: String,
    },
    OmapSet {
        kvs: Vec<(Bytes, Bytes)>,
    },
    OmapRm {
        keys: Vec<Bytes>,
    },
    OmapClear,
    OmapSetHeader {
        data: Bytes,
    },
    /// Guard: the request applies only if xattr `name` is `value` (`None`: absent), else it
    /// fails with `CompareFailed` and changes nothing. Guards come before the other ops.
    CmpXattr {
        name: String,
        value: Option<Bytes>,
    },
    /// Guard: the request applies only if omap `key` holds `value` (`None`: absent).
    CmpOmap {
        key: Bytes,
        value: Option<Bytes>,
    },
}

const WRITE_OP_FIRST: u8 = 32;

impl OsdOp {
    fn code(&self) -> u8 {
        use OsdOp::*;
        match self {
            Read { .. } => 1,
            Stat => 2,
            GetXattr { .. } => 3,
            GetXattrs => 4,
            OmapGetHeader => 5,
            OmapGetVals { .. } => 6,
            OmapList { .. } => 7,
            Create { .. } => 32,
            Write { .. } => 33,
            WriteFull { .. } => 34,
            Zero { .. } => 35,
            Truncate { .. } => 36,
            Remove => 37,
            SetXattr { .. } => 38,
            RmXattr { .. } => 39,
            OmapSet { .. } => 40,
            OmapRm { .. } => 41,
            OmapClear => 42,
            OmapSetHeader { .. } => 43,
            CmpXattr { .. } => 44,
            CmpOmap { .. } => 45,
        }
    }

    pub fn is_write(&self) -> bool {
        self.code() >= WRITE_OP_FIRST
    }

    /// True if applying this op a second time, right after it was applied once, leaves the
    /// object as the first application did and gets the same reply. A client may then resend
    /// a request whose outcome it does not know (the connection failed after it was sent).
    ///
    /// The rule: reads are idempotent; a write op is idempotent when it *sets* state to values
    /// carried in the op (bytes at an offset, a size, an attribute, omap keys), because setting
    /// again changes nothing. A request of only such ops is idempotent as a whole too: every op
    /// of the second pass sets what the first pass set, in the same order. Not idempotent:
    /// - `Create { exclusive: true }`: the second pass fails with `Exists`, though the first
    ///   created the object.
    /// - `Remove`: the second pass fails with `ObjectNotFound`, though the first removed it.
    /// - Compares: a compare-and-set's second pass finds the value it set, not the expected
    ///   one, and fails though the first succeeded.
    ///
    /// The match is exhaustive on purpose: a new op must decide here.
    pub fn is_idempotent(&self) -> bool {
        use OsdOp::*;
        match self {
            Read { .. }
            | Stat
            | GetXattr { .. }
            | GetXattrs
            | OmapGetHeader
            | OmapGetVals { .. }
            | OmapList { .. } => true,
            Create { exclusive } => !exclusive,
            Write { .. }
            | WriteFull { .. }
            | Zero { .. }
            | Truncate { .. }
            | SetXattr { .. }
            | RmXattr { .. }
            | OmapSet { .. }
            | OmapRm { .. }
            | OmapClear
            | OmapSetHeader { .. } => true,
            Remove | CmpXattr { .. } | CmpOmap { .. } => false,
        }
    }

    pub fn encode(&self, e: &mut Encoder<'_, BytesMut>) {
        use OsdOp::*;
        e.u8(self.code());
        match self {
            Read { off, len } => {
                e.u64(*off).u32(*len);
            }
            Stat | GetXattrs | OmapGetHeader | Remove | OmapClear => {}
            GetXattr { name } | RmXattr { name } => {
                e.str(name);
            }
            OmapGetVals { keys } | OmapRm { keys } => {
                e.count(keys.len());
                keys.iter().for_each(|k| {
                    e.bytes(k);
                });
            }
            OmapList { start_after, limit } => {
                e.bool(start_after.is_some());
                if let Some(k) = start_after {
                    e.bytes(k);
                }
                e.u32(*limit);
            }
            Create { exclusive } => {
                e.bool(*exclusive);
            }
            Write { off, data } => {
                e.u64(*off).bytes(data);
            }
            WriteFull { data } | OmapSetHeader { data } => {
                e.bytes(data);
            }
            Zero { off, len } => {
                e.u64(*off).u64(*len);
            }
            Truncate { size } => {
                e.u64(*size);
            }
            SetXattr { name, value } => {
                e.str(name).bytes(value);
            }
            OmapSet { kvs } => {
                e.count(kvs.len());
                kvs.iter().for_each(|(k, v)| {
                    e.bytes(k).bytes(v);
                });
            }
            CmpXattr { name, value } => {
                e.str(name);
                encode_option(e, value);
            }
            CmpOmap { key, value } => {
                e.bytes(key);
                encode_option(e, value);
            }
        }
    }

    /// One op at `index` of a request: `Ok(Err(code))` for an op code this build does not know.
    pub fn decode(d: &mut Decoder, index: usize) -> Result<Result<Self, u8>, DecodeError> {
        use OsdOp::*;
        let code = d.u8("op code")?;
        let keys = |d: &mut Decoder| -> Result<Vec<Bytes>, DecodeError> {
            let n = d.count("omap key count", OMAP_KEYS_MAX)?;
            (0..n).map(|_| d.bytes("omap key", VALUE_LEN_MAX)).collect()
        };
        let _ = index;
        Ok(Ok(match code {
            1 => Read {
                off: d.u64("read offset")?,
                len: bounded_len(d.u32("read length")?)?,
            },
            2 => Stat,
            3 => GetXattr {
                name: d.string("xattr name", ATTR_NAME_LEN_MAX)?,
            },
            4 => GetXattrs,
            5 => OmapGetHeader,
            6 => OmapGetVals { keys: keys(d)? },
            7 => {
                let start_after = if d.bool("has start")? {
                    Some(d.bytes("omap start", VALUE_LEN_MAX)?)
                } else {
                    None
                };
                OmapList {
                    start_after,
                    limit: d.u32("omap limit")?.min(LIST_LIMIT_MAX),
                }
            }
            32 => Create {
                exclusive: d.bool("exclusive")?,
            },
            33 => Write {
                off: d.u64("write offset")?,
                data: d.bytes("write data", IO_LEN_MAX as usize)?,
            },
            34 => WriteFull {
                data: d.bytes("write data", IO_LEN_MAX as usize)?,
            },
            35 => Zero {
                off: d.u64("zero offset")?,
                len: d.u64("zero length")?,
            },
            36 => Truncate {
                size: d.u64("truncate size")?,
            },
            37 => Remove,
            38 => SetXattr {
                name: d.string("xattr name", ATTR_NAME_LEN_MAX)?,
                value: d.bytes("xattr value", VALUE_LEN_MAX)?,
            },
            39 => RmXattr {
                name: d.string("xattr name", ATTR_NAME_LEN_MAX)?,
            },
            40 => {
                let n = d.count("omap pair count", OMAP_KEYS_MAX)?;
                let kvs = (0..n)
                    .map(|_| {
                        Ok((
                            d.bytes("omap key", VALUE_LEN_MAX)?,
                            d.bytes("omap value", VALUE_LEN_MAX)?,
                        ))
                    })
                    .collect::<Result<_, DecodeError>>()?;
                OmapSet { kvs }
            }
            41 => OmapRm { keys: keys(d)? },
            42 => OmapClear,
            43 => OmapSetHeader {
                data: d.bytes("omap header", VALUE_LEN_MAX)?,
            },
            44 => CmpXattr {
                name: d.string("xattr name", ATTR_NAME_LEN_MAX)?,
                value: decode_option(d, "compared xattr value")?,
            },
            45 => CmpOmap {
                key: d.bytes("omap key", VALUE_LEN_MAX)?,
                value: decode_option(d, "compared omap value")?,
            },
            other => return Ok(Err(other)),
        }))
    }
}

fn encode_option(e: &mut Encoder<'_, BytesMut>, value: &Option<Bytes>) {
    e.bool(value.is_some());
    if let Some(v) = value {
        e.bytes(v);
    }
}

fn decode_option(d: &mut Decoder, what: &'static str) -> Result<Option<Bytes>, DecodeError> {
    Ok(if d.bool(what)? {
        Some(d.bytes(what, VALUE_LEN_MAX)?)
    } else {
        None
    })
}

fn bounded_len(len: u32) -> Result<u32, DecodeError> {
    if len > IO_LEN_MAX {
        return Err(DecodeError::TooLarge {
            what: "read length",
            found: len as u64,
            limit: IO_LEN_MAX as u64,
        });
    }
    Ok(len)
}

/// Operations on one object, addressed to the PG the client's map places it in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRequest {
    pub pool: PoolId,
    pub pg_seed: u32,
    /// The client's map epoch, so the OSD can tell a stale client from a misrouted one.
    pub epoch: u32,
    /// The client instance (random per `Client`, 0: anonymous), so an OSD can refuse the
    /// requests of a fenced client.
    pub client: u64,
    /// The client's number for this request, the same on every retry of it: with `client`,
    /// how a replicated PG recognises a write it already applied (0: none).
    pub tid: u64,
    pub oid: String,
    pub ops: Vec<OsdOp>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Ping {
        payload: Bytes,
    },
    GetMap,
    Object(ObjectRequest),
    /// From now on, refuse every object request of `client` (`Status::Fenced`). Answered once
    /// the fence is durable and no request of that client is still being applied.
    Fence {
        client: u64,
    },
    /// Compare the copies of PG `pool`.`pg_seed` (at its primary, in the client's map
    /// `epoch`); answered with the report once the whole PG was scrubbed.
    Scrub {
        pool: PoolId,
        pg_seed: u32,
        epoch: u32,
        mode: crate::ScrubMode,
    },
    /// At the primary of PG `pool`.`pg_seed` (in the client's map `epoch`), which waits for
    /// objects no reachable copy holds: delete them from its history and go active without
    /// them. The operator's decision that they are lost.
    MarkUnfoundLost {
        pool: PoolId,
        pg_seed: u32,
        epoch: u32,
    },
}

/// What one read op produced. Write ops produce `None`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpOutput {
    None,
    Data(Bytes),
    Stat {
        size: u64,
    },
    Value(Bytes),
    Attrs(Vec<(String, Bytes)>),
    Omap {
        entries: Vec<(Bytes, Bytes)>,
        more: bool,
    },
}

impl OpOutput {
    fn encode(&self, e: &mut Encoder<'_, BytesMut>) {
        match self {
            OpOutput::None => {
                e.u8(0);
            }
            OpOutput::Data(b) => {
                e.u8(1).bytes(b);
            }
            OpOutput::Stat { size } => {
                e.u8(2).u64(*size);
            }
            OpOutput::Value(b) => {
                e.u8(3).bytes(b);
            }
            OpOutput::Attrs(a) => {
                e.u8(4).count(a.len());
                a.iter().for_each(|(k, v)| {
                    e.str(k).bytes(v);
                });
            }
            OpOutput::Omap { entries, more } => {
                e.u8(5).count(entries.len());
                entries.iter().for_each(|(k, v)| {
                    e.bytes(k).bytes(v);
                });
                e.bool(*more);
            }
        }
    }

    fn decode(d: &mut Decoder) -> Result<Result<Self, u8>, DecodeError> {
        Ok(Ok(match d.u8("output tag")? {
            0 => OpOutput::None,
            1 => OpOutput::Data(d.bytes("data", IO_LEN_MAX as usize)?),
            2 => OpOutput::Stat {
                size: d.u64("size")?,
            },
            3 => OpOutput::Value(d.bytes("value", VALUE_LEN_MAX)?),
            4 => {
                let n = d.count("xattr count", OMAP_KEYS_MAX)?;
                let mut a = Vec::with_capacity(n);
                for _ in 0..n {
                    a.push((
                        d.string("xattr name", ATTR_NAME_LEN_MAX)?,
                        d.bytes("xattr value", VALUE_LEN_MAX)?,
                    ));
                }
                OpOutput::Attrs(a)
            }
            5 => {
                let n = d.count("omap count", OMAP_KEYS_MAX)?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push((
                        d.bytes("omap key", VALUE_LEN_MAX)?,
                        d.bytes("omap value", VALUE_LEN_MAX)?,
                    ));
                }
                OpOutput::Omap {
                    entries,
                    more: d.bool("more")?,
                }
            }
            tag => return Ok(Err(tag)),
        }))
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Pong {
        payload: Bytes,
    },
    Map {
        encoded: Bytes,
    },
    Object {
        outputs: Vec<OpOutput>,
    },
    Fenced,
    Scrubbed(crate::ScrubReport),
    /// How many unfound objects the PG gave up.
    MarkedLost {
        objects: u64,
    },
}

/// A failed request: the status, the failing op's index when one op failed, and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorReply {
    pub status: Status,
    pub op_index: Option<u16>,
    pub message: String,
}

impl std::fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.status)?;
        if let Some(i) = self.op_index {
            write!(f, " (op {i})")?;
        }
        write!(f, ": {}", self.message)
    }
}

const NO_OP_INDEX: u16 = u16::MAX;

pub fn encode_request(out: &mut BytesMut, request_id: u64, req: &Request) {
    let opcode = match req {
        Request::Ping { .. } => Opcode::Ping,
        Request::GetMap => Opcode::GetMap,
        Request::Object(_) => Opcode::Object,
        Request::Fence { .. } => Opcode::Fence,
        Request::Scrub { .. } => Opcode::Scrub,
        Request::MarkUnfoundLost { .. } => Opcode::MarkLost,
    };
    encode_frame(out, FrameKind::Request, opcode, request_id, 0, |b| {
        let mut e = Encoder::new(b);
        match req {
            Request::Ping { payload } => {
                e.bytes(payload);
            }
            Request::GetMap => {}
            Request::Object(r) => {
                e.u32(r.pool)
                    .u32(r.pg_seed)
                    .u32(r.epoch)
                    .u64(r.client)
                    .u64(r.tid)
                    .str(&r.oid)
                    .count(r.ops.len());
                r.ops.iter().for_each(|op| op.encode(&mut e));
            }
            Request::Fence { client } => {
                e.u64(*client);
            }
            Request::Scrub {
                pool,
                pg_seed,
                epoch,
                mode,
            } => {
                e.u32(*pool).u32(*pg_seed).u32(*epoch).u8(*mode as u8);
            }
            Request::MarkUnfoundLost {
                pool,
                pg_seed,
                epoch,
            } => {
                e.u32(*pool).u32(*pg_seed).u32(*epoch);
            }
        }
    });
}

pub fn encode_response(out: &mut BytesMut, request_id: u64, resp: &Response) {
    let opcode = match resp {
        Response::Pong { .. } => Opcode::Ping,
        Response::Map { .. } => Opcode::GetMap,
        Response::Object { .. } => Opcode::Object,
        Response::Fenced => Opcode::Fence,
        Response::Scrubbed(_) => Opcode::Scrub,
        Response::MarkedLost { .. } => Opcode::MarkLost,
    };
    encode_frame(
        out,
        FrameKind::Response,
        opcode,
        request_id,
        Status::Ok as u16,
        |b| {
            let mut e = Encoder::new(b);
            match resp {
                Response::Pong { payload } => {
                    e.bytes(payload);
                }
                Response::Map { encoded } => {
                    e.bytes(encoded);
                }
                Response::Object { outputs } => {
                    e.count(outputs.len());
                    outputs.iter().for_each(|o| o.encode(&mut e));
                }
                Response::Fenced => {}
                Response::Scrubbed(r) => r.encode(&mut e),
                Response::MarkedLost { objects } => {
                    e.u64(*objects);
                }
            }
        },
    );
}

/// A successful reply to a single-read request whose data the caller appends straight into the
/// send buffer: the wire bytes are exactly those of `Response::Object { outputs: vec![Data] }`,
/// without the intermediate buffer.
#[must_use = "a data reply must be finished or abandoned"]
pub struct DataReply {
    frame: OpenFrame,
    len_at: usize,
}

/// Starts the reply; append the data to `out`, then call [`DataReply::finish`].
pub fn begin_data_reply(out: &mut BytesMut, request_id: u64) -> DataReply {
    let frame = begin_frame(
        out,
        FrameKind::Response,
        Opcode::Object,
        request_id,
        Status::Ok as u16,
    );
    Encoder::new(out).count(1).u8(1);
    let len_at = out.len();
    out.put_u32_le(0);
    DataReply { frame, len_at }
}

impl DataReply {
    /// Seals the reply: the bytes appended since `begin_data_reply` are the data.
    pub fn finish(self, out: &mut BytesMut) {
        let data_len = out.len() - self.len_at - 4;
        let data_len = u32::try_from(data_len).expect("read data fits u32");
        out[self.len_at..self.len_at + 4].copy_from_slice(&data_len.to_le_bytes());
        self.frame.finish(out);
    }

    /// Drops the unfinished reply, e.g. because the read failed.
    pub fn abandon(self, out: &mut BytesMut) {
        self.frame.abandon(out);
    }
}

pub fn encode_error(out: &mut BytesMut, request_id: u64, opcode: Opcode, err: &ErrorReply) {
    debug_assert!(err.status != Status::Ok);
    let msg = truncate_utf8(&err.message, ERROR_MESSAGE_LEN_MAX);
    encode_frame(
        out,
        FrameKind::Response,
        opcode,
        request_id,
        err.status as u16,
        |b| {
            Encoder::new(b)
                .u16(err.op_index.unwrap_or(NO_OP_INDEX))
                .str(msg);
        },
    );
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Request {
    /// Decodes a request frame's payload. Unknown ops and truncated or trailing bytes are
    /// errors for this request only.
    pub fn decode(frame: &Frame) -> Result<Self, ProtoError> {
        let opcode = frame.header.opcode;
        if frame.header.kind != FrameKind::Request {
            return Err(ProtoError::WrongKind {
                expected: FrameKind::Request,
            });
        }
        let err = |source| ProtoError::Decode { opcode, source };
        let mut d = Decoder::new(frame.payload.clone());
        let req = match opcode {
            Opcode::Ping => Request::Ping {
                payload: d.bytes("ping payload", IO_LEN_MAX as usize).map_err(err)?,
            },
            Opcode::GetMap => Request::GetMap,
            Opcode::Object => {
                let pool = d.u32("pool").map_err(err)?;
                let pg_seed = d.u32("pg").map_err(err)?;
                let epoch = d.u32("epoch").map_err(err)?;
                let client = d.u64("client").map_err(err)?;
                let tid = d.u64("request number").map_err(err)?;
                let oid = d.string("object name", OBJECT_NAME_LEN_MAX).map_err(err)?;
                let n = d.count("op count", OPS_PER_REQUEST_MAX).map_err(err)?;
                let mut ops = Vec::with_capacity(n);
                for index in 0..n {
                    match OsdOp::decode(&mut d, index).map_err(err)? {
                        Ok(op) => ops.push(op),
                        Err(code) => return Err(ProtoError::UnknownOp { code, index }),
                    }
                }
                Request::Object(ObjectRequest {
                    pool,
                    pg_seed,
                    epoch,
                    client,
                    tid,
                    oid,
                    ops,
                })
            }
            // Messages between OSDs are decoded by the OSD's replication layer.
            Opcode::Peer | Opcode::PeerPart => return Err(ProtoError::Peer),
            Opcode::Fence => Request::Fence {
                client: d.u64("fenced client").map_err(err)?,
            },
            Opcode::Scrub => Request::Scrub {
                pool: d.u32("pool").map_err(err)?,
                pg_seed: d.u32("pg").map_err(err)?,
                epoch: d.u32("epoch").map_err(err)?,
                mode: {
                    let m = d.u8("scrub mode").map_err(err)?;
                    crate::ScrubMode::from_u8(m).ok_or_else(|| {
                        err(DecodeError::Invalid {
                            what: "scrub mode",
                            found: m as u64,
                        })
                    })?
                },
            },
            Opcode::MarkLost => Request::MarkUnfoundLost {
                pool: d.u32("pool").map_err(err)?,
                pg_seed: d.u32("pg").map_err(err)?,
                epoch: d.u32("epoch").map_err(err)?,
            },
            Opcode::Auth => return Err(ProtoError::Handshake),
        };
        d.finish("request").map_err(err)?;
        Ok(req)
    }
}

impl Response {
    /// Decodes a response frame: `Ok(Err(_))` is a well-formed error reply from the server.
    pub fn decode(frame: &Frame) -> Result<Result<Self, ErrorReply>, ProtoError> {
        let opcode = frame.header.opcode;
        if frame.header.kind != FrameKind::Response {
            return Err(ProtoError::WrongKind {
                expected: FrameKind::Response,
            });
        }
        let err = |source| ProtoError::Decode { opcode, source };
        let status = Status::from_u16(frame.header.status).ok_or(ProtoError::UnknownStatus {
            code: frame.header.status,
        })?;
        let mut d = Decoder::new(frame.payload.clone());
        if status != Status::Ok {
            let index = d.u16("op index").map_err(err)?;
            let message = d
                .string("error message", ERROR_MESSAGE_LEN_MAX)
                .map_err(err)?;
            d.finish("error reply").map_err(err)?;
            let op_index = (index != NO_OP_INDEX).then_some(index);
            return Ok(Err(ErrorReply {
                status,
                op_index,
                message,
            }));
        }
        let resp = match opcode {
            Opcode::Ping => Response::Pong {
                payload: d.bytes("pong payload", IO_LEN_MAX as usize).map_err(err)?,
            },
            Opcode::GetMap => Response::Map {
                encoded: d.bytes("map", MAP_LEN_MAX).map_err(err)?,
            },
            Opcode::Object => {
                let n = d.count("output count", OPS_PER_REQUEST_MAX).map_err(err)?;
                let mut outputs = Vec::with_capacity(n);
                for _ in 0..n {
                    match OpOutput::decode(&mut d).map_err(err)? {
                        Ok(o) => outputs.push(o),
                        Err(tag) => return Err(ProtoError::UnknownOutput { tag }),
                    }
                }
                Response::Object { outputs }
            }
            Opcode::Fence => Response::Fenced,
            Opcode::Scrub => Response::Scrubbed(crate::ScrubReport::decode(&mut d).map_err(err)?),
            Opcode::MarkLost => Response::MarkedLost {
                objects: d.u64("objects given up").map_err(err)?,
            },
            Opcode::Auth => return Err(ProtoError::Handshake),
            Opcode::Peer | Opcode::PeerPart => return Err(ProtoError::Peer),
        };
        d.finish("response").map_err(err)?;
        Ok(Ok(resp))
    }
}

#[cfg(test)]
mod tests;
