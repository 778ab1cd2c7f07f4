//! A PG's recorded history: decode without panicking (sealed mode appends a correct crc32c so
//! the fuzzer reaches the fields); one that decodes survives encode → decode unchanged, and
//! appending to it keeps it decodable.
#![no_main]

use bytes::Bytes;
use carmine_fuzz::{mode_and_body, seal_map};
use carmine_pg::{History, Interval};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (sealed, body) = mode_and_body(data);
    let raw = if sealed {
        seal_map(body)
    } else {
        body.to_vec()
    };
    let Ok(mut h) = History::decode(Bytes::from(raw)) else {
        return;
    };
    assert_eq!(
        History::decode(h.encode()).expect("an encoded history decodes"),
        h
    );
    let next = h.last_epoch().map_or(1, |e| e.saturating_add(1));
    if h.append(
        h.last_epoch(),
        Interval {
            epoch: next,
            acting: vec![0, 1],
        },
    )
    .unwrap_or(false)
    {
        assert_eq!(History::decode(h.encode()).expect("still decodes"), h);
    }
});
