//! A message between OSDs (a `Peer` frame's payload, decoded by the receiving reactor): decode
//! without panicking; one that decodes survives encode → decode unchanged.
#![no_main]

use bytes::{Bytes, BytesMut};
use carmine_pg::envelope::PeerMessage;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = PeerMessage::decode(Bytes::copy_from_slice(data), 64) else {
        return;
    };
    let mut out = BytesMut::new();
    m.encode(&mut out);
    assert_eq!(
        PeerMessage::decode(out.freeze(), 64).expect("an encoded message decodes"),
        m
    );
});
