//! The volume image header (an xattr of the header object): any bytes give an `ImageInfo` or
//! a `VolumeError::Corrupt`. In sealed mode the body gets its trailing crc32c, so the fuzzer
//! reaches the field checks. The format is canonical: a header that decodes re-encodes to the
//! same bytes.
#![no_main]

use carmine_fuzz::{mode_and_body, seal_volume_header};
use carmine_volume::fuzzing::{decode_header, encode_header};
use carmine_volume::VolumeError;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (sealed, body) = mode_and_body(data);
    let raw = if sealed {
        seal_volume_header(body)
    } else {
        body.to_vec()
    };
    match decode_header(&raw) {
        Ok(info) => {
            assert_eq!(&encode_header(&info)[..], &raw[..], "header round trip");
            assert!(info.object_size.is_power_of_two());
            let _ = info.object_count();
        }
        Err(VolumeError::Corrupt { .. }) => {}
        Err(e) => panic!("a bad header must be reported as corrupt, got {e:?}"),
    }
});
