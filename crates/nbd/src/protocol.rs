//! NBD wire constants and the pure parts of the protocol (no I/O). Names follow the NBD
//! protocol document.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use thiserror::Error;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = (1 << 31) | 1;
pub const REP_ERR_INVALID: u32 = (1 << 31) | 3;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) | 6;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_BLOCK_SIZE: u16 = 3;

pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TFLAG_SEND_CACHE: u16 = 1 << 10;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;

pub const CMD_FLAG_FUA: u16 = 1 << 0;

pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;

/// Option data longer than this is refused: names are short and info lists tiny.
pub const OPTION_LEN_MAX: u32 = 64 * 1024;
/// Largest READ or WRITE payload accepted (and advertised as the maximum block size).
pub const PAYLOAD_LEN_MAX: u32 = 32 << 20;
pub const REQUEST_HEADER_LEN: usize = 28;
pub const OPTION_HEADER_LEN: usize = 16;

#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtocolError {
    #[error("bad option magic {0:#018x}")]
    BadOptionMagic(u64),
    #[error("bad request magic {0:#010x}")]
    BadRequestMagic(u32),
    #[error("option data of {0} bytes exceeds the limit")]
    OptionTooLong(u32),
    #[error("client did not negotiate fixed newstyle (flags {0:#x})")]
    NotFixedNewstyle(u32),
    #[error("malformed option {option}: {detail}")]
    BadOption { option: u32, detail: &'static str },
    #[error("{what} of {found} bytes, {needed} needed")]
    ShortHeader {
        what: &'static str,
        needed: usize,
        found: usize,
    },
}

fn need(b: &[u8], needed: usize, what: &'static str) -> Result<(), ProtocolError> {
    if b.len() < needed {
        return Err(ProtocolError::ShortHeader {
            what,
            needed,
            found: b.len(),
        });
    }
    Ok(())
}

/// One option sent during negotiation.
#[derive(Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

/// Parses the first [`OPTION_HEADER_LEN`] bytes of `b`.
pub fn parse_option_header(mut b: &[u8]) -> Result<OptionHeader, ProtocolError> {
    need(b, OPTION_HEADER_LEN, "option header")?;
    let magic = b.get_u64();
    if magic != IHAVEOPT {
        return Err(ProtocolError::BadOptionMagic(magic));
    }
    let option = b.get_u32();
    let len = b.get_u32();
    if len > OPTION_LEN_MAX {
        return Err(ProtocolError::OptionTooLong(len));
    }
    Ok(OptionHeader { option, len })
}

/// The export name and requested info types of NBD_OPT_INFO / NBD_OPT_GO.
pub fn parse_info_request(
    option: u32,
    mut data: Bytes,
) -> Result<(String, Vec<u16>), ProtocolError> {
    let bad = |detail| ProtocolError::BadOption { option, detail };
    if data.len() < 4 {
        return Err(bad("too short for the name length"));
    }
    let name_len = data.get_u32() as usize;
    if data.len() < name_len + 2 {
        return Err(bad("name length beyond the option data"));
    }
    let name = String::from_utf8(data.split_to(name_len).to_vec())
        .map_err(|_| bad("name is not UTF-8"))?;
    let n = data.get_u16() as usize;
    if data.len() != 2 * n {
        return Err(bad("info request count does not match the data"));
    }
    let infos = (0..n).map(|_| data.get_u16()).collect();
    Ok((name, infos))
}

pub fn put_option_reply(out: &mut BytesMut, option: u32, reply: u32, data: &[u8]) {
    out.put_u64(REPLY_MAGIC);
    out.put_u32(option);
    out.put_u32(reply);
    out.put_u32(data.len() as u32);
    out.put_slice(data);
}

/// One transmission-phase request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub cmd: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

/// Parses the first [`REQUEST_HEADER_LEN`] bytes of `b`.
pub fn parse_request(mut b: &[u8]) -> Result<Request, ProtocolError> {
    need(b, REQUEST_HEADER_LEN, "request header")?;
    let magic = b.get_u32();
    if magic != REQUEST_MAGIC {
        return Err(ProtocolError::BadRequestMagic(magic));
    }
    Ok(Request {
        flags: b.get_u16(),
        cmd: b.get_u16(),
        cookie: b.get_u64(),
        offset: b.get_u64(),
        len: b.get_u32(),
    })
}

/// A simple reply header; for a successful READ the data follows.
pub fn put_simple_reply(out: &mut BytesMut, error: u32, cookie: u64) {
    out.put_u32(SIMPLE_REPLY_MAGIC);
    out.put_u32(error);
    out.put_u64(cookie);
}

/// A structured reply chunk header; `len` bytes of chunk payload follow.
pub fn put_chunk_header(out: &mut BytesMut, flags: u16, kind: u16, cookie: u64, len: u32) {
    out.put_u32(STRUCTURED_REPLY_MAGIC);
    out.put_u16(flags);
    out.put_u16(kind);
    out.put_u64(cookie);
    out.put_u32(len);
}

/// The final chunk of a READ that succeeded: the data at `offset`, in one piece.
pub fn put_read_chunk(out: &mut BytesMut, cookie: u64, offset: u64, data: &[u8]) {
    put_chunk_header(
        out,
        REPLY_FLAG_DONE,
        REPLY_TYPE_OFFSET_DATA,
        cookie,
        8 + data.len() as u32,
    );
    out.put_u64(offset);
    out.put_slice(data);
}

/// The final chunk of a request that failed with `error` (no message).
pub fn put_error_chunk(out: &mut BytesMut, cookie: u64, error: u32) {
    put_chunk_header(out, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie, 6);
    out.put_u32(error);
    out.put_u16(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_header_parses_big_endian_fields() {
        let mut b = BytesMut::new();
        b.put_u32(REQUEST_MAGIC);
        b.put_u16(CMD_FLAG_FUA);
        b.put_u16(CMD_WRITE);
        b.put_u64(0xdead_beef);
        b.put_u64(4096);
        b.put_u32(512);
        let r = parse_request(&b).unwrap();
        assert_eq!(
            r,
            Request {
                flags: CMD_FLAG_FUA,
                cmd: CMD_WRITE,
                cookie: 0xdead_beef,
                offset: 4096,
                len: 512
            }
        );
    }

    #[test]
    fn read_chunk_has_the_done_flag_offset_and_data() {
        let mut b = BytesMut::new();
        put_read_chunk(&mut b, 7, 4096, b"abcd");
        assert_eq!(&b[..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert_eq!(u16::from_be_bytes([b[4], b[5]]), REPLY_FLAG_DONE);
        assert_eq!(u16::from_be_bytes([b[6], b[7]]), REPLY_TYPE_OFFSET_DATA);
        assert_eq!(u32::from_be_bytes(b[16..20].try_into().unwrap()), 12);
        assert_eq!(u64::from_be_bytes(b[20..28].try_into().unwrap()), 4096);
        assert_eq!(&b[28..], b"abcd");
    }

    #[test]
    fn wrong_magics_are_rejected() {
        assert_eq!(
            parse_request(&[0u8; 28]),
            Err(ProtocolError::BadRequestMagic(0))
        );
        assert_eq!(
            parse_option_header(&[0u8; 16]),
            Err(ProtocolError::BadOptionMagic(0))
        );
    }

    #[test]
    fn short_headers_are_errors_not_panics() {
        assert!(matches!(
            parse_request(&REQUEST_MAGIC.to_be_bytes()),
            Err(ProtocolError::ShortHeader {
                needed: 28,
                found: 4,
                ..
            })
        ));
        assert!(matches!(
            parse_option_header(&IHAVEOPT.to_be_bytes()),
            Err(ProtocolError::ShortHeader {
                needed: 16,
                found: 8,
                ..
            })
        ));
    }

    #[test]
    fn oversized_option_is_rejected_before_reading_it() {
        let mut b = BytesMut::new();
        b.put_u64(IHAVEOPT);
        b.put_u32(OPT_GO);
        b.put_u32(OPTION_LEN_MAX + 1);
        assert_eq!(
            parse_option_header(&b),
            Err(ProtocolError::OptionTooLong(OPTION_LEN_MAX + 1))
        );
    }

    #[test]
    fn info_request_parses_and_bad_lengths_are_errors() {
        let mut b = BytesMut::new();
        b.put_u32(4);
        b.put_slice(b"disk");
        b.put_u16(2);
        b.put_u16(INFO_BLOCK_SIZE);
        b.put_u16(INFO_NAME);
        let (name, infos) = parse_info_request(OPT_GO, b.clone().freeze()).unwrap();
        assert_eq!(
            (name.as_str(), infos),
            ("disk", vec![INFO_BLOCK_SIZE, INFO_NAME])
        );
        let mut short = b.clone();
        short.truncate(9);
        assert!(parse_info_request(OPT_GO, short.freeze()).is_err());
        let mut lying = BytesMut::new();
        lying.put_u32(1000);
        lying.put_slice(b"disk");
        assert!(parse_info_request(OPT_GO, lying.freeze()).is_err());
    }
}
