//! Little-endian, fixed-width encoding helpers. Lengths are always explicit `u32`/`u16`
//! (never `usize`), so a format means the same thing on every platform.

use bytes::{BufMut, Bytes};
use thiserror::Error;

/// Why a byte sequence could not be decoded. Carries enough context to log the failure.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DecodeError {
    #[error("truncated: needed {needed} bytes for {what}, {available} available")]
    Truncated {
        what: &'static str,
        needed: usize,
        available: usize,
    },
    #[error("{what} is {found}, larger than the limit {limit}")]
    TooLarge {
        what: &'static str,
        found: u64,
        limit: u64,
    },
    #[error("invalid {what}: {found}")]
    Invalid { what: &'static str, found: u64 },
    #[error("{what} is not valid UTF-8")]
    NotUtf8 { what: &'static str },
    #[error("{count} trailing bytes after {what}")]
    Trailing { what: &'static str, count: usize },
}

/// Appends encoded values to a buffer.
pub struct Encoder<'a, B: BufMut> {
    buf: &'a mut B,
}

impl<'a, B: BufMut> Encoder<'a, B> {
    pub fn new(buf: &'a mut B) -> Self {
        Self { buf }
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.put_u8(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.put_u16_le(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.put_u32_le(v);
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.put_u64_le(v);
        self
    }
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }
    /// A byte string with a u32 length prefix.
    ///
    /// # Panics
    /// If `v` is longer than `u32::MAX`: callers bound their data far below that.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        let len = u32::try_from(v.len()).expect("encoded byte string longer than u32::MAX");
        self.u32(len);
        self.buf.put_slice(v);
        self
    }
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
    /// A u32 count; the caller then encodes that many items.
    pub fn count(&mut self, n: usize) -> &mut Self {
        let n = u32::try_from(n).expect("encoded count larger than u32::MAX");
        self.u32(n)
    }
}

/// Reads encoded values from a [`Bytes`] without copying byte strings: they are returned as
/// slices sharing the input's allocation.
pub struct Decoder {
    buf: Bytes,
    pos: usize,
}

impl Decoder {
    pub fn new(buf: Bytes) -> Self {
        Self { buf, pos: 0 }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&[u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated {
                what,
                needed: n,
                available: self.remaining(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }
    pub fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    pub fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    pub fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    pub fn bool(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(DecodeError::Invalid {
                what,
                found: v as u64,
            }),
        }
    }
    /// A u32-prefixed byte string of at most `limit` bytes, shared with the input buffer.
    pub fn bytes(&mut self, what: &'static str, limit: usize) -> Result<Bytes, DecodeError> {
        let len = self.u32(what)? as usize;
        if len > limit {
            return Err(DecodeError::TooLarge {
                what,
                found: len as u64,
                limit: limit as u64,
            });
        }
        if self.remaining() < len {
            return Err(DecodeError::Truncated {
                what,
                needed: len,
                available: self.remaining(),
            });
        }
        let out = self.buf.slice(self.pos..self.pos + len);
        self.pos += len;
        Ok(out)
    }
    pub fn string(&mut self, what: &'static str, limit: usize) -> Result<String, DecodeError> {
        let b = self.bytes(what, limit)?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError::NotUtf8 { what })
    }
    /// A u32 count of items, bounded by `limit` so a hostile count cannot drive a huge
    /// allocation before the items themselves are found missing.
    pub fn count(&mut self, what: &'static str, limit: usize) -> Result<usize, DecodeError> {
        let n = self.u32(what)? as usize;
        if n > limit {
            return Err(DecodeError::TooLarge {
                what,
                found: n as u64,
                limit: limit as u64,
            });
        }
        Ok(n)
    }
    /// Fails unless every byte was consumed: trailing garbage means a format mismatch.
    pub fn finish(&self, what: &'static str) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(DecodeError::Trailing { what, count }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn values_round_trip_in_order() {
        let mut v = Vec::new();
        Encoder::new(&mut v)
            .u8(7)
            .u16(0xbeef)
            .u32(42)
            .u64(u64::MAX)
            .bool(true)
            .str("pg")
            .bytes(b"xyz");
        let mut d = Decoder::new(Bytes::from(v));
        assert_eq!(d.u8("a").unwrap(), 7);
        assert_eq!(d.u16("b").unwrap(), 0xbeef);
        assert_eq!(d.u32("c").unwrap(), 42);
        assert_eq!(d.u64("d").unwrap(), u64::MAX);
        assert!(d.bool("e").unwrap());
        assert_eq!(d.string("f", 10).unwrap(), "pg");
        assert_eq!(&d.bytes("g", 10).unwrap()[..], b"xyz");
        d.finish("all").unwrap();
    }

    #[test]
    fn byte_string_longer_than_limit_is_rejected_before_reading_it() {
        let mut v = Vec::new();
        Encoder::new(&mut v).bytes(&[0u8; 100]);
        let err = Decoder::new(Bytes::from(v)).bytes("value", 99).unwrap_err();
        assert!(matches!(
            err,
            DecodeError::TooLarge {
                found: 100,
                limit: 99,
                ..
            }
        ));
    }

    #[test]
    fn truncated_input_is_an_error_not_a_panic() {
        let mut d = Decoder::new(Bytes::from_static(&[1, 2, 3]));
        assert!(matches!(
            d.u32("x"),
            Err(DecodeError::Truncated {
                needed: 4,
                available: 3,
                ..
            })
        ));
        let mut d = Decoder::new(Bytes::from_static(&[9, 0, 0, 0, 1]));
        assert!(matches!(
            d.bytes("x", 100),
            Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn bool_other_than_zero_or_one_is_invalid() {
        assert!(Decoder::new(Bytes::from_static(&[2])).bool("flag").is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_the_decoder(data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut d = Decoder::new(Bytes::from(data));
            let _ = d.u16("a");
            let _ = d.bytes("b", 16);
            let _ = d.count("c", 8);
            let _ = d.string("d", 8);
        }
    }
}
