//! Journal metadata as replay handles it: deltas decoded back to back, then applied to the
//! index. Each delta that decodes re-encodes to the bytes it came from; applying never panics,
//! a failed apply leaves the index unchanged, the index's counters always match its content,
//! and the index after replay survives a checkpoint round trip.
#![no_main]

use bytes::{Bytes, BytesMut};
use carmine_nativestore::fuzzing::{Delta, IndexState};
use carmine_types::Decoder;
use libfuzzer_sys::fuzz_target;

/// A small shard: block addresses in `[2, 2 + 4 × 8)` are valid.
const SEGMENTS: u32 = 4;
const SEGMENT_BLOCKS: u64 = 8;

fuzz_target!(|data: &[u8]| {
    let mut d = Decoder::new(Bytes::copy_from_slice(data));
    let mut deltas = Vec::new();
    while d.remaining() > 0 {
        let at = data.len() - d.remaining();
        let Ok(delta) = Delta::decode(&mut d) else {
            break;
        };
        let mut enc = BytesMut::new();
        delta.encode(&mut enc);
        let end = data.len() - d.remaining();
        assert_eq!(&enc[..], &data[at..end], "delta round trip");
        deltas.push(delta);
    }

    let mut index = IndexState::new(SEGMENTS, SEGMENT_BLOCKS);
    for delta in &deltas {
        let before = index.encode();
        if index.apply(delta).is_err() {
            assert_eq!(index.encode(), before, "a failed apply changes nothing");
        }
        if let Err(e) = index.check_counts() {
            panic!("after {delta:?}: {e}");
        }
    }
    let blob = index.encode();
    let again = IndexState::decode(&blob, SEGMENTS, SEGMENT_BLOCKS).expect("checkpoint decodes");
    assert_eq!(again.encode(), blob, "checkpoint after replay");
    if let Err(e) = again.check_counts() {
        panic!("checkpoint after replay: {e}");
    }
});
