//! Messages past the frame checksums: the fuzzed body becomes the payload of a frame with a
//! correct header, length and crc (built by the protocol's own encoder), so every input
//! reaches `Request::decode` / `Response::decode`. A message that decodes survives a
//! re-encode and decode unchanged, and re-encodes to the same bytes except where the decoder
//! clamps a field (an omap listing limit above `LIST_LIMIT_MAX`).
#![no_main]

use bytes::BytesMut;
use carmine_fuzz::Cursor;
use carmine_proto::{
    encode_error, encode_frame, encode_request, encode_response, try_decode_frame, Frame,
    FrameKind, Opcode, OsdOp, ProtoError, Request, Response,
};
use carmine_types::limits::LIST_LIMIT_MAX;
use libfuzzer_sys::fuzz_target;

fn one_frame(bytes: &mut BytesMut) -> Frame {
    let frame = try_decode_frame(bytes)
        .expect("an encoded frame is valid")
        .expect("an encoded frame is complete");
    assert!(bytes.is_empty(), "one frame, nothing after it");
    frame
}

fn clamped(req: &Request) -> bool {
    matches!(req, Request::Object(r) if r.ops.iter().any(
        |op| matches!(op, OsdOp::OmapList { limit, .. } if *limit == LIST_LIMIT_MAX)))
}

fuzz_target!(|data: &[u8]| {
    let mut c = Cursor::new(data);
    let sel = c.u8();
    let kind = if sel & 1 == 0 {
        FrameKind::Request
    } else {
        FrameKind::Response
    };
    let opcode = [
        Opcode::Ping,
        Opcode::GetMap,
        Opcode::Object,
        Opcode::Fence,
        Opcode::Auth,
        Opcode::Peer,
        Opcode::Scrub,
        Opcode::MarkLost,
    ][(sel as usize >> 1) % 8];
    // Mostly OK; error replies and unknown status codes otherwise.
    let status = if sel & 0x80 == 0 { 0 } else { c.u8() as u16 };
    let request_id = c.u64();
    let payload = c.rest();

    let mut buf = BytesMut::new();
    encode_frame(&mut buf, kind, opcode, request_id, status, |b| {
        b.extend_from_slice(payload)
    });
    let frame = one_frame(&mut buf);
    assert_eq!(&frame.payload[..], payload);

    match kind {
        FrameKind::Request => {
            assert!(matches!(
                Response::decode(&frame),
                Err(ProtoError::WrongKind { .. })
            ));
            let Ok(req) = Request::decode(&frame) else {
                return;
            };
            let mut out = BytesMut::new();
            encode_request(&mut out, request_id, &req);
            let again = one_frame(&mut out);
            assert_eq!(again.header.opcode, opcode);
            assert_eq!(Request::decode(&again).expect("re-encoded request"), req);
            if !clamped(&req) {
                assert_eq!(again.payload, frame.payload, "request byte round trip");
            }
        }
        FrameKind::Response => {
            assert!(matches!(
                Request::decode(&frame),
                Err(ProtoError::WrongKind { .. })
            ));
            let mut out = BytesMut::new();
            match Response::decode(&frame) {
                Err(_) => return,
                Ok(Ok(resp)) => encode_response(&mut out, request_id, &resp),
                Ok(Err(reply)) => encode_error(&mut out, request_id, opcode, &reply),
            }
            let again = one_frame(&mut out);
            assert_eq!(again.header.opcode, opcode);
            assert_eq!(again.header.status, status);
            assert_eq!(
                Response::decode(&again).expect("re-encoded response"),
                Response::decode(&frame).expect("decoded before")
            );
            assert_eq!(again.payload, frame.payload, "response byte round trip");
        }
    }
});
