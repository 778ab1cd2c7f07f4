//! A shard's checkpoint slot: any bytes give a `CheckpointSlot` or a `FormatError`. In sealed
//! mode the body gets the magic, a readable version, a segment count in range and the crc32c
//! after the segment list (and the tree root, from format 4). A slot that decodes re-encodes to the bytes it came from (as the
//! current version) and decodes back to itself.
#![no_main]

use carmine_fuzz::{mode_and_body, seal_checkpoint_slot, slot_body_len, BLOCK_VERSION_OFF};
use carmine_nativestore::fuzzing::{decode_checkpoint_slot, CKPT_SEGMENTS_MAX, FORMAT_VERSION};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (sealed, body) = mode_and_body(data);
    let mut block = body.to_vec();
    if sealed {
        seal_checkpoint_slot(&mut block);
    }
    let Ok(slot) = decode_checkpoint_slot(&block) else {
        return;
    };
    assert!(slot.segments.len() <= CKPT_SEGMENTS_MAX);
    let enc = slot.encode();
    assert_eq!(decode_checkpoint_slot(&enc).expect("re-encoded slot"), slot);
    let n = slot.segments.len();
    let version = u32::from_le_bytes(
        block[BLOCK_VERSION_OFF..BLOCK_VERSION_OFF + 4]
            .try_into()
            .unwrap(),
    );
    let len = slot_body_len(n, FORMAT_VERSION) + 4;
    assert_eq!(enc.len(), len);
    let mut expect = block[..slot_body_len(n, version)].to_vec();
    expect[BLOCK_VERSION_OFF..BLOCK_VERSION_OFF + 4].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    if version < 4 {
        // An older slot names a blob: written again, its tree root says "none".
        expect.extend_from_slice(&u64::MAX.to_le_bytes());
    }
    assert_eq!(&enc[..len - 4], &expect[..], "slot round trip");
});
