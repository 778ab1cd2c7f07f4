//! The checkpoint blob mount loads before replay (`Index::decode`): any bytes give an index
//! or a typed error. An index that decodes has counters that match its content (objects, live
//! blocks in total and per segment: the cleaner trusts them), and — the encoding being
//! canonical — re-encodes to the bytes it came from (an older version: to bytes that then
//! round trip).
//!
//! The blob sits behind a crc32c in the checkpoint slot, so no sealing is needed here: this
//! is the decoder's input as is.
#![no_main]

use carmine_nativestore::fuzzing::{IndexState, CHECKPOINT_VERSION};
use libfuzzer_sys::fuzz_target;

/// A small shard: block addresses in `[2, 2 + 8 × 16)` are valid.
pub const SEGMENTS: u32 = 8;
pub const SEGMENT_BLOCKS: u64 = 16;

fuzz_target!(|data: &[u8]| {
    let Ok(index) = IndexState::decode(data, SEGMENTS, SEGMENT_BLOCKS) else {
        return;
    };
    if let Err(e) = index.check_counts() {
        panic!("decoded index: {e}");
    }
    let again = index.encode();
    if data.starts_with(&CHECKPOINT_VERSION.to_le_bytes()) {
        assert_eq!(&again[..], data, "checkpoint round trip");
    } else {
        // An older version is read and written back in the current one, once and for all.
        let current = IndexState::decode(&again, SEGMENTS, SEGMENT_BLOCKS)
            .expect("a re-encoded checkpoint decodes");
        assert_eq!(current.encode(), again, "re-encoded checkpoint round trip");
    }
});
