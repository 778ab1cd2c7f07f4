//! The records mount reads from a checkpoint's metadata tree (`metatree::Loader`): any
//! entries give an index or a typed error. An index that loads has counters that match its
//! content, and entries given in key order — as the tree gives them — come back as the same
//! entries when the index is written again (records of version 1, which hold their extents,
//! come back as version 2 and extent entries, which then round trip).
#![no_main]

use carmine_nativestore::fuzzing::{split_tree_entries, IndexState};
use libfuzzer_sys::fuzz_target;

/// A small shard: block addresses in `[2, 2 + 8 × 16)` are valid.
const SEGMENTS: u32 = 8;
const SEGMENT_BLOCKS: u64 = 16;

fuzz_target!(|data: &[u8]| {
    let entries = split_tree_entries(data);
    let Ok(index) = IndexState::from_tree_entries(&entries, SEGMENTS, SEGMENT_BLOCKS) else {
        return;
    };
    if let Err(e) = index.check_counts() {
        panic!("loaded index: {e}");
    }
    if entries.windows(2).all(|w| w[0].0 < w[1].0) {
        let written = index.tree_entries();
        if index.records_current() {
            assert_eq!(written, entries, "records round trip");
        } else {
            let again = IndexState::from_tree_entries(&written, SEGMENTS, SEGMENT_BLOCKS)
                .expect("records written again load");
            assert_eq!(again.tree_entries(), written, "rewritten records round trip");
        }
    }
});
