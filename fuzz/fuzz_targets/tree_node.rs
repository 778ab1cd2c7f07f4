//! A B+tree node block (the native store's second-generation metadata): any bytes decode to a
//! node or an error, never a panic. In sealed mode the block gets the magic, a readable
//! version and its crc32c, so the fuzzer reaches the entry decoding. A node that decodes
//! re-encodes to a block that decodes and re-encodes to itself.
#![no_main]

use carmine_btree::fuzzing::decode_and_reencode;
use carmine_btree::NODE_SIZE;
use carmine_fuzz::{mode_and_body, seal_at};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (sealed, body) = mode_and_body(data);
    let mut block = body.to_vec();
    if sealed {
        block.resize(NODE_SIZE, 0);
        block[..4].copy_from_slice(b"CRBT");
        block[4..6].copy_from_slice(&1u16.to_le_bytes());
        seal_at(&mut block, NODE_SIZE - 4);
    }
    let Some(enc) = decode_and_reencode(&block) else {
        return;
    };
    assert_eq!(enc.len(), NODE_SIZE);
    assert_eq!(
        decode_and_reencode(&enc).as_deref(),
        Some(&enc[..]),
        "node round trip"
    );
});
