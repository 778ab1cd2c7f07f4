//! The native store's superblock (device block 0 and its backup): any bytes give a
//! `Superblock` or a `FormatError`. In sealed mode the body gets the magic, a readable
//! version, a shard count in range and the crc32c after the shard table, so the fuzzer reaches
//! the field checks. A superblock that decodes re-encodes to the bytes it came from (its
//! version included: a store keeps its format until upgraded) and decodes back to itself.
#![no_main]

use carmine_fuzz::{mode_and_body, seal_superblock, superblock_body_len};
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
    assert_eq!(&enc[..], &block[..len], "superblock round trip");
    assert!(sb.version <= FORMAT_VERSION);
});
