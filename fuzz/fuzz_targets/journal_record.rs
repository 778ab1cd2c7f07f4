//! Journal records as replay reads them from a segment: `parse_record` finds a record with the
//! expected sequence and nonce at the start of an area, or says there is none (`None` ends the
//! journal); the record's metadata then decodes into deltas.
//!
//! Modes (first byte % 3):
//! - 0, raw: the area as given, with the sequence and nonce the header claims;
//! - 1, sealed header: magic, a readable version, `total_blocks` consistent with the lengths
//!   and the header crc32c are fixed up, so the fuzzer reaches the bounds and payload checks;
//! - 2, written: the journal writer's own serializer builds a record of fuzzed metadata and
//!   data blocks, which must parse back to exactly what was written.
#![no_main]

use carmine_fuzz::{seal_record_header, Cursor};
use carmine_nativestore::fuzzing::{
    decode_deltas, decode_record_header, encode_record, parse_record, BLOCK, FORMAT_VERSION,
};
use libfuzzer_sys::fuzz_target;

/// Data blocks per written record: enough to cover the layout, cheap per input.
const DATA_BLOCKS_MAX: u8 = 3;

fn claimed(area: &[u8]) -> (u64, u64) {
    let mut c = Cursor::new(area.get(8..).unwrap_or(&[]));
    (c.u64(), c.u64())
}

fn parse_and_decode(area: &[u8]) {
    let (seq, nonce) = claimed(area);
    let _ = decode_record_header(area);
    if let Some((header, meta, data)) = parse_record(area, seq, nonce) {
        assert_eq!(meta.len(), header.meta_len as usize);
        assert_eq!(data.len(), header.data_blocks as usize * BLOCK);
        assert!(header.total_blocks as usize * BLOCK <= area.len());
        let _ = decode_deltas(&meta);
    }
}

fuzz_target!(|data: &[u8]| {
    let mut c = Cursor::new(data);
    match c.u8() % 3 {
        0 => parse_and_decode(c.rest()),
        1 => {
            let mut area = c.rest().to_vec();
            seal_record_header(&mut area);
            parse_and_decode(&area);
        }
        _ => {
            let (seq, nonce, durable_seq) = (c.u64(), c.u64(), c.u64());
            let shape = c.u8();
            let data_blocks = (shape % (DATA_BLOCKS_MAX + 1)) as usize;
            let meta = c.rest();
            let blocks: Vec<u8> = (0..data_blocks * BLOCK)
                .map(|i| (i / BLOCK) as u8 ^ shape)
                .collect();
            let area = encode_record(seq, nonce, durable_seq, meta, &blocks);
            let (header, parsed_meta, parsed_data) =
                parse_record(&area, seq, nonce).expect("a written record parses");
            assert_eq!(header.seq, seq);
            assert_eq!(header.nonce, nonce);
            assert_eq!(header.durable_seq, durable_seq);
            assert_eq!(header.version, FORMAT_VERSION);
            assert_eq!(header.total_blocks as usize * BLOCK, area.len());
            assert_eq!(parsed_meta, meta);
            assert_eq!(parsed_data, &blocks[..]);
            assert!(parse_record(&area, seq.wrapping_add(1), nonce).is_none());
            assert!(parse_record(&area, seq, nonce ^ 1).is_none());
            assert!(parse_record(&area[..area.len() - 1], seq, nonce).is_none());
            if let Ok(deltas) = decode_deltas(meta) {
                let mut again = bytes::BytesMut::new();
                deltas.iter().for_each(|d| d.encode(&mut again));
                assert_eq!(&again[..], meta, "delta round trip");
            }
        }
    }
});
