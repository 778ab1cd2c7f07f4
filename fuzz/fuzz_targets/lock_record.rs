//! The volume lock record (the `lock` xattr of an image header): any bytes give a `LockInfo`
//! or a `VolumeError::Corrupt`, never a panic. In sealed mode the body gets its trailing
//! crc32c, so the fuzzer reaches the field checks. The format is canonical: a record that
//! decodes re-encodes to the same bytes, so a compare-and-set on it compares like with like.
#![no_main]

use carmine_fuzz::{mode_and_body, seal_volume_header};
use carmine_volume::fuzzing::{decode_lock, encode_lock};
use carmine_volume::VolumeError;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (sealed, body) = mode_and_body(data);
    // Same layout as the image header: body, then CRC-32C of the body.
    let raw = if sealed {
        seal_volume_header(body)
    } else {
        body.to_vec()
    };
    match decode_lock(&raw) {
        Ok(info) => {
            assert_eq!(&encode_lock(&info)[..], &raw[..], "lock record round trip");
            assert!(!info.lease.is_zero());
        }
        Err(VolumeError::Corrupt { .. }) => {}
        Err(e) => panic!("a bad lock record must be reported as corrupt, got {e:?}"),
    }
});
