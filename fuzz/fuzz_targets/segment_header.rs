//! A segment's header block: any bytes give a `SegmentHeader` or a `FormatError`. In sealed
//! mode the body gets the magic, a readable version and its crc32c, so the fuzzer reaches the
//! kind check. A header that decodes re-encodes to the bytes it came from (as the current
//! version) and decodes back to itself.
#![no_main]

use carmine_fuzz::{
    mode_and_body, seal_segment_header, BLOCK_VERSION_OFF, SEGMENT_HEADER_BODY_LEN,
};
use carmine_nativestore::fuzzing::{decode_segment_header, FORMAT_VERSION};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (sealed, body) = mode_and_body(data);
    let mut block = body.to_vec();
    if sealed {
        seal_segment_header(&mut block);
    }
    let Ok(h) = decode_segment_header(&block) else {
        return;
    };
    let enc = h.encode();
    assert_eq!(decode_segment_header(&enc).expect("re-encoded header"), h);
    let len = SEGMENT_HEADER_BODY_LEN;
    let mut expect = block[..len].to_vec();
    expect[BLOCK_VERSION_OFF..BLOCK_VERSION_OFF + 4].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    assert_eq!(&enc[..len], &expect[..], "segment header round trip");
});
