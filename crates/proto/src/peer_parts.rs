//! Messages between OSDs larger than a frame, sent as consecutive `PeerPart` frames on one
//! connection and put back together by the receiver (a PG's object listing at peering, an
//! object copy with a large omap at recovery).
//!
//! A part's payload is a 24-byte header — the whole message's length (u64), this part's offset
//! in it (u64), the whole message's CRC-32C (u32), reserved (u32, zero) — then the bytes. One
//! sender writes a message's parts back to back, so the receiver holds at most one message in
//! assembly per connection, and takes parts strictly in order; anything else is a broken
//! stream. The frame CRC guards each part; the message CRC guards the assembly.

use crate::frame::{encode_frame, Frame, FrameKind, Opcode, FRAME_PAYLOAD_MAX};
use bytes::{Bytes, BytesMut};
use carmine_types::crc32c;
use thiserror::Error;

/// The largest message sent in parts: what one connection may make its receiver hold.
pub const PEER_MESSAGE_MAX: usize = 256 << 20;
pub const PART_HEADER_LEN: usize = 24;
/// Bytes of message per part.
pub const PART_DATA_MAX: usize = FRAME_PAYLOAD_MAX as usize - PART_HEADER_LEN;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PartError {
    #[error("message part of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("message of {0} bytes in parts (at most {PEER_MESSAGE_MAX})")]
    TooLarge(u64),
    #[error("message part at {offset} of {len} bytes, expected offset {expected} of a message of {total}")]
    OutOfOrder {
        offset: u64,
        len: usize,
        expected: u64,
        total: u64,
    },
    #[error("message part disagrees with the message's length or checksum from its first part")]
    Inconsistent,
    #[error("reserved bytes of a message part are not zero")]
    Reserved,
    #[error("message assembled from parts fails its checksum: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
}

/// Appends `message` to `out` as `PeerPart` frames. `message` may be at most
/// [`PEER_MESSAGE_MAX`] bytes (the caller checks; larger messages are refused on receipt).
pub fn encode_parts(out: &mut BytesMut, message: &[u8]) {
    encode_parts_sized(out, message, PART_DATA_MAX)
}

/// [`encode_parts`] with parts of at most `part_max` bytes of message each (tests, fuzz seeds).
pub fn encode_parts_sized(out: &mut BytesMut, message: &[u8], part_max: usize) {
    let part_max = part_max.clamp(1, PART_DATA_MAX);
    let total = message.len() as u64;
    let crc = crc32c(message);
    let mut offset = 0usize;
    loop {
        let end = (offset + part_max).min(message.len());
        encode_frame(out, FrameKind::Request, Opcode::PeerPart, 0, 0, |b| {
            b.extend_from_slice(&total.to_le_bytes());
            b.extend_from_slice(&(offset as u64).to_le_bytes());
            b.extend_from_slice(&crc.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
            b.extend_from_slice(&message[offset..end]);
        });
        offset = end;
        if offset >= message.len() {
            return;
        }
    }
}

/// One connection's message in assembly.
#[derive(Default)]
pub struct Assembly {
    buf: BytesMut,
    /// Length and checksum of the message in assembly, from its first part.
    expect: Option<(u64, u32)>,
}

impl Assembly {
    /// Takes one `PeerPart` frame's payload; returns the message once its last part arrived.
    /// After an error the stream can no longer be trusted: the caller drops the connection.
    pub fn take(&mut self, part: &Bytes) -> Result<Option<Bytes>, PartError> {
        if part.len() < PART_HEADER_LEN {
            return Err(PartError::Short(part.len()));
        }
        let u64_at = |at: usize| u64::from_le_bytes(part[at..at + 8].try_into().expect("8"));
        let u32_at = |at: usize| u32::from_le_bytes(part[at..at + 4].try_into().expect("4"));
        let (total, offset, crc) = (u64_at(0), u64_at(8), u32_at(16));
        if u32_at(20) != 0 {
            return Err(PartError::Reserved);
        }
        if total > PEER_MESSAGE_MAX as u64 {
            return Err(PartError::TooLarge(total));
        }
        let data = &part[PART_HEADER_LEN..];
        let expected = self.buf.len() as u64;
        let out_of_order = PartError::OutOfOrder {
            offset,
            len: data.len(),
            expected,
            total,
        };
        if offset != expected || data.is_empty() || offset + data.len() as u64 > total {
            return Err(out_of_order);
        }
        match self.expect {
            None => {
                self.expect = Some((total, crc));
                self.buf.reserve(total as usize);
            }
            Some(e) if e != (total, crc) => return Err(PartError::Inconsistent),
            Some(_) => {}
        }
        self.buf.extend_from_slice(data);
        if (self.buf.len() as u64) < total {
            return Ok(None);
        }
        self.expect = None;
        let message = std::mem::take(&mut self.buf).freeze();
        let computed = crc32c(&message);
        if computed != crc {
            return Err(PartError::Checksum {
                stored: crc,
                computed,
            });
        }
        Ok(Some(message))
    }

    /// Bytes held for a message not complete yet.
    pub fn held(&self) -> usize {
        self.buf.len()
    }
}

/// Feeds `frame` to `assembly` if it is a part: `Ok(Some(frame))` is a frame to handle — the
/// same one, or a `Peer` frame carrying a message just completed; `Ok(None)`: more parts to
/// come.
pub fn assemble(assembly: &mut Assembly, frame: Frame) -> Result<Option<Frame>, PartError> {
    if frame.header.opcode != Opcode::PeerPart {
        return Ok(Some(frame));
    }
    Ok(assembly.take(&frame.payload)?.map(|payload| Frame {
        header: crate::FrameHeader {
            opcode: Opcode::Peer,
            payload_len: payload.len().min(u32::MAX as usize) as u32,
            ..frame.header
        },
        payload,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::try_decode_frame;

    fn message(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    fn parts(msg: &[u8], part_max: usize) -> Vec<Frame> {
        let mut out = BytesMut::new();
        encode_parts_sized(&mut out, msg, part_max);
        let mut frames = Vec::new();
        while let Some(f) = try_decode_frame(&mut out).unwrap() {
            frames.push(f);
        }
        assert!(out.is_empty());
        frames
    }

    #[test]
    fn a_message_larger_than_a_frame_comes_back_whole() {
        let msg = message(PART_DATA_MAX * 2 + 12345);
        let frames = parts(&msg, PART_DATA_MAX);
        assert_eq!(frames.len(), 3);
        let mut a = Assembly::default();
        let mut got = None;
        for (i, f) in frames.into_iter().enumerate() {
            let out = assemble(&mut a, f).unwrap();
            assert_eq!(out.is_some(), i == 2, "part {i}");
            got = out;
        }
        let f = got.unwrap();
        assert_eq!(f.header.opcode, Opcode::Peer);
        assert_eq!(f.payload.len(), msg.len());
        assert_eq!(&f.payload[..], &msg[..]);
        assert_eq!(a.held(), 0);
        // Other frames pass through untouched, and the next message assembles too.
        for f in parts(&message(10), 4) {
            let _ = assemble(&mut a, f).unwrap();
        }
        assert_eq!(a.held(), 0);
    }

    #[test]
    fn parts_out_of_order_missing_or_inconsistent_break_the_stream() {
        let msg = message(100);
        let ps = parts(&msg, 30);
        assert_eq!(ps.len(), 4);
        // A part skipped.
        let mut a = Assembly::default();
        a.take(&ps[0].payload).unwrap();
        assert!(matches!(
            a.take(&ps[2].payload),
            Err(PartError::OutOfOrder { .. })
        ));
        // A part repeated.
        let mut a = Assembly::default();
        a.take(&ps[0].payload).unwrap();
        assert!(a.take(&ps[0].payload).is_err());
        // A part of another message in the middle of one.
        let other = parts(&message(100).iter().map(|b| !b).collect::<Vec<_>>(), 30);
        let mut a = Assembly::default();
        a.take(&ps[0].payload).unwrap();
        assert_eq!(a.take(&other[1].payload), Err(PartError::Inconsistent));
        // A message that does not start at offset 0.
        assert!(Assembly::default().take(&ps[1].payload).is_err());
        // Damage the frame checksum cannot see: the assembled message's checksum does.
        let mut a = Assembly::default();
        let mut last = ps[3].payload.to_vec();
        *last.last_mut().unwrap() ^= 1;
        for p in &ps[..3] {
            a.take(&p.payload).unwrap();
        }
        assert!(matches!(
            a.take(&Bytes::from(last)),
            Err(PartError::Checksum { .. })
        ));
    }

    #[test]
    fn hostile_headers_are_refused_before_anything_is_held() {
        let mut a = Assembly::default();
        let mut p = BytesMut::new();
        p.extend_from_slice(&(PEER_MESSAGE_MAX as u64 + 1).to_le_bytes());
        p.extend_from_slice(&0u64.to_le_bytes());
        p.extend_from_slice(&[0; 8]);
        p.extend_from_slice(b"x");
        assert!(matches!(
            a.take(&p.clone().freeze()),
            Err(PartError::TooLarge(_))
        ));
        // Past its own message's end.
        let mut p = BytesMut::new();
        p.extend_from_slice(&1u64.to_le_bytes());
        p.extend_from_slice(&0u64.to_le_bytes());
        p.extend_from_slice(&[0; 8]);
        p.extend_from_slice(b"xy");
        assert!(a.take(&p.freeze()).is_err());
        assert_eq!(
            a.take(&Bytes::from_static(b"short")),
            Err(PartError::Short(5))
        );
        // Reserved bytes set.
        let mut p = parts(&message(10), 100)[0].payload.to_vec();
        p[20] = 1;
        assert_eq!(a.take(&Bytes::from(p)), Err(PartError::Reserved));
        assert_eq!(a.held(), 0);
    }
}
