//! Arbitrary bytes on a connection: the frame decoder and both message decoders must return
//! frames, ask for more bytes, or fail with a typed error — never panic or loop.
#![no_main]

use bytes::BytesMut;
use carmine_proto::{try_decode_frame, Request, Response};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = try_decode_frame(&mut buf) {
        let _ = Request::decode(&frame);
        let _ = Response::decode(&frame);
    }
});
