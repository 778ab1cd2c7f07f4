//! The native store's superblock (device block 0 and its backup): any bytes give a
//! `Superblock` or a `FormatError`. In sealed mode the body gets the magic, a readable
//! version, a shard count in range and the crc32c after the shard table, so the fuzzer reaches
//! the field checks. A superblock that decodes re-encodes to the bytes it came from (as the
//! current version) and decodes back to itself.
#![no_main]

use carmine_fuzz::{mode_and_body, seal_superblock, superblock_body_len, BLOCK_VERSION_OFF};
use carmine_nativestore::fuzzing::{decode_superblock, BLOCK, FORMAT_VERSION};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (sealed, body) = mode_and_body(data);
    let mut block = body.to_vec();
    if sealed {
        seal_superblock(&mut block);
    }
    let Ok(sb) = decode_superblock(&block) else {
        return;
    };
    assert!(!sb.shards.is_empty());
    assert!(sb.segment_size > 0 && (sb.segment_size as usize).is_multiple_of(BLOCK));
    let enc = sb.encode();
    assert_eq!(decode_superblock(&enc).expect("re-encoded superblock"), sb);
    let len = superblock_body_len(sb.shards.len() as u32) + 4;
    assert_eq!(enc.len(), len);
    let mut expect = block[..len].to_vec();
    expect[BLOCK_VERSION_OFF..BLOCK_VERSION_OFF + 4].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    // The crc differs when the version was an older one; compare the fields only.
    assert_eq!(&enc[..len - 4], &expect[..len - 4], "superblock round trip");
});
