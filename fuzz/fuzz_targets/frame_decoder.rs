//! Arbitrary bytes on a connection: the frame decoder, both message decoders and the assembly
//! of messages sent in parts must return frames, ask for more bytes, or fail with a typed
//! error — never panic or loop. A frame that decodes re-encodes to exactly the bytes it was
//! decoded from (the header has no slack); an assembled message never exceeds its bound.
#![no_main]

use bytes::BytesMut;
use carmine_proto::peer_parts::{assemble, Assembly, PEER_MESSAGE_MAX};
use carmine_proto::{encode_frame, try_decode_frame, Request, Response, FRAME_HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    let mut at = 0;
    let mut parts = Assembly::default();
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
        match assemble(&mut parts, frame) {
            Ok(Some(f)) => assert!(f.payload.len() <= PEER_MESSAGE_MAX),
            Ok(None) => assert!(parts.held() <= PEER_MESSAGE_MAX),
            // A broken stream: the receiver drops the connection (and its assembly).
            Err(_) => parts = Assembly::default(),
        }
    }
});
