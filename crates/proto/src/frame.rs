//! Frame header layout, encoding and incremental decoding.

use bytes::{BufMut, Bytes, BytesMut};
use carmine_types::{crc32c, crc32c_append, limits::IO_LEN_MAX};
use thiserror::Error;

/// "CRMN" read as a little-endian u32.
pub const FRAME_MAGIC: u32 = u32::from_le_bytes(*b"CRMN");
/// 2: object requests carry the client instance; compare ops; fences.
/// 3: object requests carry the client's request number; messages between OSDs (`Peer`).
/// 4: background recovery (Info and ActivateAck name missing objects).
/// 5: read leases granted by replicas (Ping, Pong; Info says how long a promise runs).
/// 6: messages between OSDs carry both ends' incarnations.
/// 7: a recovery report (PG message Recovered) names the version held.
/// 8: a version's counter holds its primary's run within the epoch above the sequence.
/// 9: an activation names its primary's run, and an info the newest run its member took.
/// The check is exact: clients and OSDs of one cluster are upgraded together
/// (docs/format/wire.md, version history).
pub const PROTOCOL_VERSION: u8 = 9;
pub const FRAME_HEADER_LEN: usize = 32;
/// Largest payload: the largest data op plus room for the request's metadata.
pub const FRAME_PAYLOAD_MAX: u32 = IO_LEN_MAX + 256 * 1024;

// Byte offsets inside the header; see docs/format/wire.md.
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 4;
const OFF_KIND: usize = 5;
const OFF_OPCODE: usize = 6;
const OFF_REQUEST_ID: usize = 8;
const OFF_PAYLOAD_LEN: usize = 16;
const OFF_STATUS: usize = 20;
const OFF_FLAGS: usize = 22;
const OFF_PAYLOAD_CRC: usize = 24;
const OFF_HEADER_CRC: usize = 28;
const _: () = assert!(OFF_HEADER_CRC + 4 == FRAME_HEADER_LEN);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    Request = 1,
    Response = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Opcode {
    /// Echo: answers with the same payload. Measures the transport alone.
    Ping = 1,
    /// The cluster map as the OSD knows it.
    GetMap = 2,
    /// Operations on one object of one PG.
    Object = 3,
    /// Refuse a client's requests from now on (its image lock was broken).
    Fence = 4,
    /// The authentication handshake that opens a connection (see `auth`).
    Auth = 5,
    /// A message from one OSD to another about a PG they serve (replication, peering,
    /// recovery). One way: it gets no reply frame; answers are messages of their own.
    Peer = 6,
    /// Compare (and repair) a PG's copies; sent to the PG's primary, answered with a report.
    Scrub = 7,
    /// Give up the objects of a PG that no reachable copy holds (`carmine pg
    /// mark-unfound-lost`); sent to the PG's primary, answered with how many it gave up.
    MarkLost = 8,
    /// A part of a `Peer` message too large for one frame (see `peer_parts`).
    PeerPart = 9,
}

impl Opcode {
    fn from_u16(v: u16) -> Option<Self> {
        match v {
            1 => Some(Self::Ping),
            2 => Some(Self::GetMap),
            3 => Some(Self::Object),
            4 => Some(Self::Fence),
            5 => Some(Self::Auth),
            6 => Some(Self::Peer),
            7 => Some(Self::Scrub),
            8 => Some(Self::MarkLost),
            9 => Some(Self::PeerPart),
            _ => None,
        }
    }
}

/// Why bytes on a connection are not a valid frame. Any of these ends the connection: after
/// a framing error the stream position can no longer be trusted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error("bad frame magic {found:#010x}")]
    BadMagic { found: u32 },
    #[error("unsupported protocol version {found} (this build speaks {PROTOCOL_VERSION})")]
    BadVersion { found: u8 },
    #[error("header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    HeaderChecksum { stored: u32, computed: u32 },
    #[error("payload checksum mismatch on request {request_id}: stored {stored:#010x}, computed {computed:#010x}")]
    PayloadChecksum {
        request_id: u64,
        stored: u32,
        computed: u32,
    },
    #[error("payload of {len} bytes exceeds the limit of {FRAME_PAYLOAD_MAX}")]
    TooLarge { len: u32 },
    #[error("unknown frame kind {found}")]
    BadKind { found: u8 },
    #[error("unknown opcode {found}")]
    BadOpcode { found: u16 },
    #[error("reserved flags {found:#06x} are not zero")]
    BadFlags { found: u16 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub opcode: Opcode,
    pub request_id: u64,
    pub payload_len: u32,
    /// Response status (see `Status`); zero in requests.
    pub status: u16,
}

/// One complete, checksum-verified frame. The payload shares the receive buffer.
#[derive(Clone, Debug)]
pub struct Frame {
    pub header: FrameHeader,
    pub payload: Bytes,
}

fn le_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn le_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4-byte slice"))
}
fn le_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8-byte slice"))
}

/// Validates a header. Only the first `FRAME_HEADER_LEN` bytes of `b` are read.
fn parse_header(b: &[u8]) -> Result<(FrameHeader, u32), FrameError> {
    debug_assert!(b.len() >= FRAME_HEADER_LEN);
    let magic = le_u32(b, OFF_MAGIC);
    if magic != FRAME_MAGIC {
        return Err(FrameError::BadMagic { found: magic });
    }
    let stored = le_u32(b, OFF_HEADER_CRC);
    let computed = crc32c(&b[..OFF_HEADER_CRC]);
    if stored != computed {
        return Err(FrameError::HeaderChecksum { stored, computed });
    }
    let version = b[OFF_VERSION];
    if version != PROTOCOL_VERSION {
        return Err(FrameError::BadVersion { found: version });
    }
    let kind = match b[OFF_KIND] {
        1 => FrameKind::Request,
        2 => FrameKind::Response,
        found => return Err(FrameError::BadKind { found }),
    };
    let raw_opcode = le_u16(b, OFF_OPCODE);
    let opcode = Opcode::from_u16(raw_opcode).ok_or(FrameError::BadOpcode { found: raw_opcode })?;
    let flags = le_u16(b, OFF_FLAGS);
    if flags != 0 {
        return Err(FrameError::BadFlags { found: flags });
    }
    let payload_len = le_u32(b, OFF_PAYLOAD_LEN);
    if payload_len > FRAME_PAYLOAD_MAX {
        return Err(FrameError::TooLarge { len: payload_len });
    }
    let header = FrameHeader {
        kind,
        opcode,
        request_id: le_u64(b, OFF_REQUEST_ID),
        payload_len,
        status: le_u16(b, OFF_STATUS),
    };
    Ok((header, le_u32(b, OFF_PAYLOAD_CRC)))
}

/// The header of the frame at the start of `buf`, validated, once its 32 bytes are there;
/// nothing is consumed or reserved. Lets a receiver refuse a frame by its header (a peer that
/// has not authenticated announcing megabytes) before buffering its payload.
pub fn peek_frame_header(buf: &[u8]) -> Result<Option<FrameHeader>, FrameError> {
    if buf.len() < FRAME_HEADER_LEN {
        return Ok(None);
    }
    parse_header(&buf[..FRAME_HEADER_LEN]).map(|(h, _)| Some(h))
}

/// Takes one complete frame off the front of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed; on return, `buf` has at least enough capacity
/// reserved for the rest of the pending frame, so the caller can read straight into it.
pub fn try_decode_frame(buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
    if buf.len() < FRAME_HEADER_LEN {
        buf.reserve(FRAME_HEADER_LEN - buf.len());
        return Ok(None);
    }
    let (header, payload_crc) = parse_header(&buf[..FRAME_HEADER_LEN])?;
    let total = FRAME_HEADER_LEN + header.payload_len as usize;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    let computed = crc32c(&buf[FRAME_HEADER_LEN..total]);
    if computed != payload_crc {
        return Err(FrameError::PayloadChecksum {
            request_id: header.request_id,
            stored: payload_crc,
            computed,
        });
    }
    let mut frame = buf.split_to(total).freeze();
    let payload = frame.split_off(FRAME_HEADER_LEN);
    Ok(Some(Frame { header, payload }))
}

/// Appends one frame to `out`: a header placeholder, the payload written by `payload`, then the
/// header is filled in with the length and both checksums. No intermediate buffer.
pub fn encode_frame(
    out: &mut BytesMut,
    kind: FrameKind,
    opcode: Opcode,
    request_id: u64,
    status: u16,
    payload: impl FnOnce(&mut BytesMut),
) {
    let frame = begin_frame(out, kind, opcode, request_id, status);
    payload(out);
    frame.finish(out);
}

/// A frame whose header is a placeholder at `start` in its buffer: the payload is appended
/// after it (possibly across `await`s, e.g. by a store reading straight into the send buffer),
/// then [`OpenFrame::finish`] fills in the length and checksums, or
/// [`OpenFrame::abandon`] removes the frame.
#[must_use = "an open frame must be finished or abandoned"]
pub struct OpenFrame {
    start: usize,
}

/// Starts a frame at the end of `out`; see [`OpenFrame`].
pub fn begin_frame(
    out: &mut BytesMut,
    kind: FrameKind,
    opcode: Opcode,
    request_id: u64,
    status: u16,
) -> OpenFrame {
    let start = out.len();
    out.put_bytes(0, FRAME_HEADER_LEN);
    let h = &mut out[start..start + FRAME_HEADER_LEN];
    h[OFF_MAGIC..OFF_MAGIC + 4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    h[OFF_VERSION] = PROTOCOL_VERSION;
    h[OFF_KIND] = kind as u8;
    h[OFF_OPCODE..OFF_OPCODE + 2].copy_from_slice(&(opcode as u16).to_le_bytes());
    h[OFF_REQUEST_ID..OFF_REQUEST_ID + 8].copy_from_slice(&request_id.to_le_bytes());
    h[OFF_STATUS..OFF_STATUS + 2].copy_from_slice(&status.to_le_bytes());
    OpenFrame { start }
}

impl OpenFrame {
    /// Where this frame's payload begins in the buffer.
    pub fn payload_start(&self) -> usize {
        self.start + FRAME_HEADER_LEN
    }

    /// Seals the frame: everything appended to `out` since `begin_frame` is its payload.
    pub fn finish(self, out: &mut BytesMut) {
        let start = self.start;
        let payload_len = out.len() - start - FRAME_HEADER_LEN;
        let payload_len = u32::try_from(payload_len).expect("payload length fits u32");
        debug_assert!(
            payload_len <= FRAME_PAYLOAD_MAX,
            "encoder produced an oversized frame"
        );
        let payload_crc = crc32c(&out[start + FRAME_HEADER_LEN..]);
        let h = &mut out[start..start + FRAME_HEADER_LEN];
        h[OFF_PAYLOAD_LEN..OFF_PAYLOAD_LEN + 4].copy_from_slice(&payload_len.to_le_bytes());
        h[OFF_PAYLOAD_CRC..OFF_PAYLOAD_CRC + 4].copy_from_slice(&payload_crc.to_le_bytes());
        let header_crc = crc32c_append(0, &h[..OFF_HEADER_CRC]);
        h[OFF_HEADER_CRC..].copy_from_slice(&header_crc.to_le_bytes());
    }

    /// Removes the unfinished frame from `out`.
    pub fn abandon(self, out: &mut BytesMut) {
        out.truncate(self.start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_frame(payload: &[u8]) -> BytesMut {
        let mut out = BytesMut::new();
        encode_frame(&mut out, FrameKind::Request, Opcode::Ping, 77, 0, |b| {
            b.put_slice(payload)
        });
        out
    }

    #[test]
    fn frame_round_trips_and_leaves_following_bytes() {
        let mut buf = one_frame(b"hello");
        buf.extend_from_slice(&one_frame(b"second"));
        let f = try_decode_frame(&mut buf).unwrap().unwrap();
        assert_eq!(f.header.request_id, 77);
        assert_eq!(&f.payload[..], b"hello");
        let f2 = try_decode_frame(&mut buf).unwrap().unwrap();
        assert_eq!(&f2.payload[..], b"second");
        assert!(buf.is_empty());
    }

    #[test]
    fn partial_frame_waits_for_more_bytes() {
        let full = one_frame(&[7u8; 100]);
        for cut in [0, 1, 31, 32, 50, full.len() - 1] {
            let mut buf = BytesMut::from(&full[..cut]);
            assert!(
                try_decode_frame(&mut buf).unwrap().is_none(),
                "cut at {cut}"
            );
            assert_eq!(buf.len(), cut);
        }
    }

    #[test]
    fn abandoned_frame_leaves_the_buffer_as_before() {
        let mut out = one_frame(b"kept");
        let before = out.clone();
        let f = begin_frame(&mut out, FrameKind::Response, Opcode::Object, 9, 0);
        out.put_slice(b"partial payload");
        f.abandon(&mut out);
        assert_eq!(out, before);
    }

    #[test]
    fn flipped_payload_bit_fails_the_payload_checksum() {
        let mut buf = one_frame(b"payload");
        let last = buf.len() - 1;
        buf[last] ^= 1;
        assert!(matches!(
            try_decode_frame(&mut buf),
            Err(FrameError::PayloadChecksum { request_id: 77, .. })
        ));
    }

    #[test]
    fn flipped_header_bit_fails_the_header_checksum() {
        let mut buf = one_frame(b"payload");
        buf[OFF_REQUEST_ID] ^= 1;
        assert!(matches!(
            try_decode_frame(&mut buf),
            Err(FrameError::HeaderChecksum { .. })
        ));
    }

    #[test]
    fn wrong_magic_is_rejected() {
        let mut buf = one_frame(b"x");
        buf[0] = b'X';
        assert!(matches!(
            try_decode_frame(&mut buf),
            Err(FrameError::BadMagic { .. })
        ));
    }

    /// Rewrites a header field and fixes up the header checksum, to reach the checks behind it.
    fn patch(buf: &mut BytesMut, off: usize, bytes: &[u8]) {
        buf[off..off + bytes.len()].copy_from_slice(bytes);
        let crc = crc32c(&buf[..OFF_HEADER_CRC]);
        buf[OFF_HEADER_CRC..OFF_HEADER_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn oversized_length_is_rejected_before_buffering() {
        let mut buf = one_frame(b"x");
        patch(
            &mut buf,
            OFF_PAYLOAD_LEN,
            &(FRAME_PAYLOAD_MAX + 1).to_le_bytes(),
        );
        assert!(matches!(
            try_decode_frame(&mut buf),
            Err(FrameError::TooLarge { .. })
        ));
    }

    #[test]
    fn unknown_version_kind_opcode_and_flags_are_rejected() {
        let base = one_frame(b"x");
        let mut b = base.clone();
        let next = PROTOCOL_VERSION + 1;
        patch(&mut b, OFF_VERSION, &[next]);
        assert!(matches!(
            try_decode_frame(&mut b),
            Err(FrameError::BadVersion { found }) if found == next
        ));
        let mut b = base.clone();
        patch(&mut b, OFF_KIND, &[3]);
        assert!(matches!(
            try_decode_frame(&mut b),
            Err(FrameError::BadKind { found: 3 })
        ));
        let mut b = base.clone();
        patch(&mut b, OFF_OPCODE, &999u16.to_le_bytes());
        assert!(matches!(
            try_decode_frame(&mut b),
            Err(FrameError::BadOpcode { found: 999 })
        ));
        let mut b = base;
        patch(&mut b, OFF_FLAGS, &1u16.to_le_bytes());
        assert!(matches!(
            try_decode_frame(&mut b),
            Err(FrameError::BadFlags { found: 1 })
        ));
    }
}
