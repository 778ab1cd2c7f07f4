//! Arbitrary bytes on a connection: the frame decoder and both message decoders must return
//! frames, ask for more bytes, or fail with a typed error — never panic or loop. A frame that
//! decodes re-encodes to exactly the bytes it was decoded from (the header has no slack).
#![no_main]

use bytes::BytesMut;
use carmine_proto::{encode_frame, try_decode_frame, Request, Response, FRAME_HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    let mut at = 0;
    while let Ok(Some(frame)) = try_decode_frame(&mut buf) {
        let len = FRAME_HEADER_LEN + frame.payload.len();
        assert_eq!(
            buf.len(),
            data.len() - at - len,
            "a frame consumes its own bytes"
        );
        let h = frame.header;
        let mut again = BytesMut::new();
        encode_frame(&mut again, h.kind, h.opcode, h.request_id, h.status, |b| {
            b.extend_from_slice(&frame.payload)
        });
        assert_eq!(&again[..], &data[at..at + len], "frame round trip");
        at += len;
        let _ = Request::decode(&frame);
        let _ = Response::decode(&frame);
    }
});
