//! A PG's durable state as an OSD loads it at start (the omap pairs of its state object):
//! any set of pairs decodes to a state or is refused with an error, never a panic, and a
//! state that loads has a log whose tail is not past its head.
//!
//! Input: pairs `u8 key length, key, u16 value length (little-endian), value` until the
//! input ends; they are sorted by key, as the store's omap keeps them (a later duplicate
//! wins).
#![no_main]

use bytes::Bytes;
use carmine_fuzz::Cursor;
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;

fuzz_target!(|data: &[u8]| {
    let mut pairs = BTreeMap::new();
    let mut rest = data;
    while !rest.is_empty() {
        let mut c = Cursor::new(rest);
        let klen = c.u8() as usize;
        let body = c.rest();
        let key = &body[..klen.min(body.len())];
        let mut c = Cursor::new(&body[key.len()..]);
        let vlen = c.u16() as usize;
        let body = c.rest();
        let value = &body[..vlen.min(body.len())];
        pairs.insert(Bytes::copy_from_slice(key), Bytes::copy_from_slice(value));
        rest = &body[value.len()..];
    }
    let pairs: Vec<(Bytes, Bytes)> = pairs.into_iter().collect();
    if let Ok((tail, head)) = carmine_osd::check_pg_state(&pairs) {
        assert!(tail <= head);
    }
});
