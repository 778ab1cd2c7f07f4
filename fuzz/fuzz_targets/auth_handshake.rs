//! The connection handshake's messages (hello, challenge, proof): any bytes decode or give an
//! error, never a panic; what decodes re-encodes to the same bytes. The first byte picks the
//! message.
#![no_main]

use bytes::{Bytes, BytesMut};
use carmine_proto::auth::{decode_proof, encode_proof, Challenge, Hello};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((which, body)) = data.split_first() else {
        return;
    };
    let raw = Bytes::copy_from_slice(body);
    let mut again = BytesMut::new();
    match which % 3 {
        0 => {
            let Ok(h) = Hello::decode(raw) else { return };
            h.encode(&mut again);
        }
        1 => {
            let Ok(c) = Challenge::decode(raw) else {
                return;
            };
            c.encode(&mut again);
        }
        _ => {
            let Ok(p) = decode_proof(raw) else { return };
            encode_proof(&mut again, &p);
        }
    }
    assert_eq!(
        &again[..],
        body,
        "a decoded handshake message re-encodes to its bytes"
    );
});
