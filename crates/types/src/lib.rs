//! Carmine's vocabulary: identifiers, limits, checksums and the little-endian codec that every
//! on-wire and on-disk structure is built from. No I/O lives here.
//!
//! The codec never trusts its input: every read is bounds-checked and returns a typed
//! [`DecodeError`] instead of panicking, because these bytes come from the network or a disk.

pub mod codec;
pub mod ids;
pub mod limits;

pub use codec::{DecodeError, Decoder, Encoder};
pub use ids::{CollectionId, OsdId, PgId, PoolId};

/// CRC-32C (Castagnoli), hardware accelerated where the CPU has it. The one checksum used by
/// every Carmine format.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Continues a CRC-32C over more bytes, so a header and a payload can be covered in one value.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}
