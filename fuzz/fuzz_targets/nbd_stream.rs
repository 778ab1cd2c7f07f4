//! What an NBD client sends, as one byte stream: the client flags, option requests
//! (negotiation) until GO or EXPORT_NAME, then request headers with their WRITE payloads.
//!
//! The server's handshake and request loops read from a socket (`server.rs`), so this target
//! drives the pure parsers they call — `parse_option_header`, `parse_info_request`,
//! `parse_request` — over the stream, in the order and with the framing the server uses.
//! Every export name is taken to exist, so the transmission phase is always reached.
//! A request header that parses re-encodes (per the NBD spec's big-endian layout) to the
//! bytes it came from.
#![no_main]

use bytes::{BufMut, Bytes, BytesMut};
use carmine_nbd::fuzzing::*;
use libfuzzer_sys::fuzz_target;

struct Stream<'a>(&'a [u8]);

impl<'a> Stream<'a> {
    /// The next `n` bytes, or `None` at end of stream (the server sees EOF).
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
}

fn negotiate(s: &mut Stream<'_>) -> Option<()> {
    let flags = u32::from_be_bytes(s.take(4)?.try_into().unwrap());
    if flags & FLAG_C_FIXED_NEWSTYLE == 0 {
        return None;
    }
    loop {
        let raw = s.take(OPTION_HEADER_LEN)?;
        let hdr = parse_option_header(raw).ok()?;
        assert_eq!(&raw[..8], &IHAVEOPT.to_be_bytes());
        assert!(hdr.len <= OPTION_LEN_MAX);
        let data = Bytes::copy_from_slice(s.take(hdr.len as usize)?);
        match hdr.option {
            OPT_EXPORT_NAME => return Some(()),
            OPT_ABORT => return None,
            OPT_INFO | OPT_GO => {
                if let Ok((name, infos)) = parse_info_request(hdr.option, data.clone()) {
                    // name length, name, count, the info types: all of the option's data.
                    assert_eq!(4 + name.len() + 2 + 2 * infos.len(), data.len());
                    if hdr.option == OPT_GO {
                        return Some(());
                    }
                }
            }
            _ => {}
        }
    }
}

fn encode_request(r: &Request) -> BytesMut {
    let mut b = BytesMut::new();
    b.put_u32(REQUEST_MAGIC);
    b.put_u16(r.flags);
    b.put_u16(r.cmd);
    b.put_u64(r.cookie);
    b.put_u64(r.offset);
    b.put_u32(r.len);
    b
}

fn transmit(s: &mut Stream<'_>) -> Option<()> {
    loop {
        let raw = s.take(REQUEST_HEADER_LEN)?;
        let req = parse_request(raw).ok()?;
        assert_eq!(&encode_request(&req)[..], raw, "request header round trip");
        match req.cmd {
            CMD_DISC => return None,
            CMD_WRITE if req.len > PAYLOAD_LEN_MAX => return None,
            CMD_WRITE => {
                s.take(req.len as usize)?;
            }
            _ => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // The parsers also take slices of any length (the server passes exact ones).
    let _ = parse_option_header(data);
    let _ = parse_request(data);
    let _ = parse_info_request(OPT_GO, Bytes::copy_from_slice(data));

    let mut s = Stream(data);
    if negotiate(&mut s).is_some() {
        transmit(&mut s);
    }
});
