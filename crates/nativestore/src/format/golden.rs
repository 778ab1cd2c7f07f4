//! Holds `docs/format/native-store.md` to the encoders: every table and field list the format
//! document gives is parsed here and checked, byte by byte, against what the code writes. A
//! field added, moved or resized on one side only fails this test, so the document a reader
//! (or a recovery tool) relies on cannot drift from the disk.

use super::*;
use crate::delta::Delta;
use crate::extents::Extent;
use crate::index::CHECKPOINT_VERSION;
use carmine_types::PgId;

const DOC: &str = include_str!("../../../../docs/format/native-store.md");

/// The text of the section whose heading starts with `heading`, up to the next `## `.
fn section(heading: &str) -> &'static str {
    let start = DOC
        .find(&format!("\n## {heading}"))
        .unwrap_or_else(|| panic!("the format document has no section {heading:?}"));
    let body = &DOC[start + 1..];
    let end = body[3..].find("\n## ").map_or(body.len(), |e| e + 3);
    &body[..end]
}

/// The rows of the first table in `text` (header and separator skipped), cells trimmed.
fn table(text: &str) -> Vec<Vec<String>> {
    let rows: Vec<Vec<String>> = text
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect();
    assert!(rows.len() > 2, "a table with rows is expected in:\n{text}");
    rows[2..].to_vec()
}

/// Evaluates an offset or size the document writes as a sum of terms, each a number,
/// `n`, or a number times `n` (`12n`, `12·n`).
fn eval(expr: &str, n: usize) -> usize {
    expr.replace(['·', ' '], "")
        .split('+')
        .map(|term| match term.strip_suffix('n') {
            Some("") => n,
            Some(k) => k.parse::<usize>().expect("a number before n") * n,
            None => term
                .parse()
                .unwrap_or_else(|_| panic!("offset term {term:?}")),
        })
        .sum()
}

fn le32(v: u32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}
fn le64(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}
fn uuid(v: u128) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// Checks an `offset | size | field` table against `encoded`: the rows tile the structure
/// from byte 0 to its end, and each row's bytes are what `expect` says that field holds.
fn check_offset_table(
    what: &str,
    rows: &[Vec<String>],
    n: usize,
    encoded: &[u8],
    expect: impl Fn(&str, usize) -> Vec<u8>,
) {
    let mut at = 0;
    for row in rows {
        let (off, size, field) = (eval(&row[0], n), eval(&row[1], n), row[2].as_str());
        assert_eq!(
            off, at,
            "{what}: {field:?} starts at {off}, the row before ends at {at}"
        );
        let got = &encoded[off..off + size];
        let want = expect(field, off);
        assert_eq!(
            got,
            &want[..],
            "{what}: the document's {field:?} ({size} bytes at {off})"
        );
        at = off + size;
    }
    assert_eq!(at, encoded.len(), "{what}: the document's table ends early");
}

#[test]
fn superblock_table_matches_the_encoder() {
    let sb = Superblock::layout(
        1 << 30,
        3,
        1 << 20,
        0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10,
    )
    .unwrap();
    let enc = sb.encode();
    check_offset_table(
        "superblock",
        &table(section("Superblock")),
        sb.shards.len(),
        &enc,
        |field, off| match field {
            f if f.starts_with("magic") => {
                assert!(f.contains("CRMNSTOR"));
                SUPER_MAGIC.to_vec()
            }
            f if f.starts_with("format version") => le32(FORMAT_VERSION),
            f if f.starts_with("block size") => le32(BLOCK as u32),
            f if f.starts_with("segment size") => le32(sb.segment_size),
            f if f.starts_with("uuid") => uuid(sb.uuid),
            f if f.starts_with("shard count") => le32(sb.shards.len() as u32),
            f if f.starts_with("per shard") => sb
                .shards
                .iter()
                .flat_map(|s| [le64(s.base), le32(s.segments)].concat())
                .collect(),
            f if f.starts_with("CRC-32C") => le32(crc32c(&enc[..off])),
            f => panic!("superblock: the test does not know the document's field {f:?}"),
        },
    );
}

#[test]
fn record_header_table_matches_the_encoder() {
    let h = RecordHeader {
        seq: 0x1111_2222_3333,
        nonce: 0x4444_5555_6666_7777,
        meta_len: 5000,
        data_blocks: 3,
        total_blocks: RecordHeader::blocks_for(5000, 3) as u32,
        payload_crc: 0xdead_beef,
        version: FORMAT_VERSION,
        durable_seq: 0x1111_2222_3332,
    };
    let mut block = vec![0xaa; BLOCK];
    h.encode_into(&mut block);
    let enc = &block[..RECORD_HEADER_LEN];
    let text = section("Journal records");
    assert!(
        text.contains(&format!("record header ({RECORD_HEADER_LEN} bytes)"))
            && text.contains(&format!("first {INLINE_META} bytes of metadata")),
        "the document's record block 0 layout"
    );
    let rows = table(&text[text.find("Record header (").unwrap()..]);
    check_offset_table("record header", &rows, 0, enc, |field, off| match field {
        f if f.starts_with("magic") => {
            assert!(f.contains("CREC"));
            RECORD_MAGIC.to_le_bytes().to_vec()
        }
        f if f.starts_with("version") => le32(h.version),
        f if f.starts_with("record sequence") => le64(h.seq),
        f if f.starts_with("segment nonce") => le64(h.nonce),
        f if f.starts_with("metadata length") => le32(h.meta_len),
        f if f.starts_with("data blocks") => le32(h.data_blocks),
        f if f.starts_with("total blocks") => le32(h.total_blocks),
        f if f.starts_with("payload CRC-32C") => le32(h.payload_crc),
        f if f.contains("durable mark") => le64(h.durable_seq),
        f if f.starts_with("reserved") => vec![0; 12],
        f if f.starts_with("CRC-32C") => le32(crc32c(&enc[..off])),
        f => panic!("record header: the test does not know the document's field {f:?}"),
    });
}

/// Sizes of the comma-separated types of a `field | type` row (`u32, u64`, `16 bytes`,
/// `` `m` × u32 ``).
fn type_sizes(ty: &str, m: usize) -> Vec<usize> {
    ty.split(", ")
        .map(|t| {
            let t = t.split(" (").next().unwrap().trim();
            if let Some(per) = t.strip_prefix("`m` × ") {
                return m * type_sizes(per, m)[0];
            }
            match t {
                "u8" => 1,
                "u32" => 4,
                "u64" => 8,
                t => t
                    .strip_suffix(" bytes")
                    .and_then(|k| k.parse().ok())
                    .unwrap_or_else(|| panic!("type {t:?}")),
            }
        })
        .collect()
}

#[test]
fn checkpoint_slot_table_matches_the_encoder() {
    let slot = CheckpointSlot {
        shard: 5,
        uuid: 0xfeed_0000_0000_0000_0000_0000_0000_beef,
        generation: 77,
        journal: JournalPos {
            segment: 9,
            segment_seq: 1234,
            block: 17,
            record_seq: 99_999,
        },
        segment_seq_max: 1300,
        blob_len: 8 << 20,
        blob_crc: 0x1234_5678,
        segments: vec![3, 4, 11],
        tree_root: Some(0x0123_4567_89ab),
    };
    let enc = slot.encode();
    let m = slot.segments.len();
    let mut at = 0;
    for row in table(section("Checkpoint slot")) {
        let (field, ty) = (row[0].as_str(), row[1].as_str());
        let values: Vec<Vec<u8>> = match field {
            f if f.starts_with("magic") => vec![SLOT_MAGIC.to_vec()],
            "version" => vec![le32(FORMAT_VERSION)],
            f if f.starts_with("number of checkpoint segments") => vec![le32(m as u32)],
            "shard" => vec![le32(slot.shard)],
            "uuid" => vec![uuid(slot.uuid)],
            "generation" => vec![le64(slot.generation)],
            f if f.starts_with("journal start") => vec![
                le32(slot.journal.segment),
                le64(slot.journal.segment_seq),
                le32(slot.journal.block),
                le64(slot.journal.record_seq),
            ],
            f if f.starts_with("highest segment sequence") => vec![le64(slot.segment_seq_max)],
            f if f.starts_with("blob length") => vec![le64(slot.blob_len), le32(slot.blob_crc)],
            "checkpoint segments" => vec![slot.segments.iter().flat_map(|s| le32(*s)).collect()],
            f if f.starts_with("tree root") => vec![le64(slot.tree_root.unwrap())],
            f if f.starts_with("CRC-32C") => vec![le32(crc32c(&enc[..at]))],
            f => panic!("checkpoint slot: the test does not know the document's field {f:?}"),
        };
        let sizes = type_sizes(ty, m);
        assert_eq!(
            sizes.len(),
            values.len(),
            "checkpoint slot: {field:?} is {ty:?}"
        );
        for (size, want) in sizes.into_iter().zip(values) {
            assert_eq!(
                &enc[at..at + size],
                &want[..],
                "checkpoint slot: {field:?} ({size} bytes at {at})"
            );
            at += size;
        }
    }
    assert_eq!(
        at,
        enc.len(),
        "checkpoint slot: the document's table ends early"
    );
    assert!(
        section("Checkpoint slot").contains(&format!("(at most {CKPT_SEGMENTS_MAX})")),
        "the document's limit on checkpoint segments"
    );
}

/// Splits a field list on `, ` outside parentheses.
fn fields(list: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in list.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(list[start..].trim());
    out
}

#[test]
fn segment_header_field_list_matches_the_encoder() {
    let h = SegmentHeader {
        uuid: 0x0a0b_0c0d_0e0f_1011_1213_1415_1617_1819,
        shard: 7,
        kind: SegmentKind::Checkpoint,
        seq: 4242,
        nonce: 0x5555_6666_7777_8888,
    };
    let enc = h.encode();
    let text = section("Segment header");
    let start = text
        .find("`CRMNSEGH`")
        .expect("the segment header's field list");
    let para = text[start..].replace('\n', " ");
    let list = &para[..para.find('.').expect("the list ends with a full stop")];
    let mut at = 0;
    for f in fields(list) {
        let want: Vec<u8> = match f {
            "`CRMNSEGH`" => SEGMENT_MAGIC.to_vec(),
            "version u32" => le32(FORMAT_VERSION),
            "uuid (16)" => uuid(h.uuid),
            "shard u32" => le32(h.shard),
            f if f.starts_with("kind u8") => {
                assert!(f.contains("1 journal") && f.contains("2 checkpoint"));
                assert_eq!(
                    (SegmentKind::Journal as u8, SegmentKind::Checkpoint as u8),
                    (1, 2)
                );
                vec![h.kind as u8]
            }
            "sequence u64" => le64(h.seq),
            "nonce u64" => le64(h.nonce),
            "CRC-32C" => le32(crc32c(&enc[..at])),
            f => panic!("segment header: the test does not know the document's field {f:?}"),
        };
        assert_eq!(
            &enc[at..at + want.len()],
            &want[..],
            "segment header: {f:?} at {at}"
        );
        at += want.len();
    }
    assert_eq!(
        at,
        enc.len(),
        "segment header: the document's list ends early"
    );
}

#[test]
fn delta_table_matches_the_encoder() {
    let c = PgId { pool: 3, seed: 9 };
    let o = || "obj".to_string();
    let s = o;
    let b = || Bytes::from_static(b"val");
    // Every string and byte string is 3 bytes long, every list has 2 entries: the document's
    // field list then gives the encoded length.
    let deltas = [
        Delta::CreateCollection(c),
        Delta::RemoveCollection(c),
        Delta::Touch(c, o()),
        Delta::Remove(c, o()),
        Delta::SetSize(c, o(), 7),
        Delta::SetExtent {
            cid: c,
            oid: o(),
            lblock: 1,
            extent: Extent::new(2, &[3]),
        },
        Delta::Punch(c, o(), 1, 2),
        Delta::SetAttr(c, o(), s(), b()),
        Delta::RmAttr(c, o(), s()),
        Delta::OmapSet(c, o(), vec![(b(), b()), (b(), b())]),
        Delta::OmapRm(c, o(), vec![b(), b()]),
        Delta::OmapClear(c, o()),
        Delta::OmapHeader(c, o(), b()),
        Delta::CopyMeta(c, o(), s()),
        Delta::SetExtent {
            cid: c,
            oid: o(),
            lblock: 1,
            extent: Extent::new(2, &[3, 4]),
        },
    ];
    let text = section("Journal records");
    let rows = table(&text[text.find("| tag |").expect("the delta table")..]);
    assert_eq!(rows.len(), deltas.len(), "one row per delta kind");
    fn len_of(field: &str) -> usize {
        let ty = field.split(' ').next().unwrap();
        match ty {
            "str" | "bytes" => 4 + 3,
            "u32" => 4,
            "u64" => 8,
            t => panic!("field type {t:?}"),
        }
    }
    for (row, delta) in rows.iter().zip(&deltas) {
        let mut enc = BytesMut::new();
        delta.encode(&mut enc);
        let tag: u8 = row[0].parse().expect("a tag number");
        assert_eq!(
            enc[0], tag,
            "the document's tag of {:?} ({delta:?})",
            row[1]
        );
        assert_eq!(&enc[1..9], &[le32(c.pool), le32(c.seed)].concat()[..]);
        let mut want = 9;
        if row[2] != "—" {
            for f in fields(&row[2]) {
                want += match f.split_once(" × (") {
                    Some((_, inner)) => {
                        2 * fields(inner.trim_end_matches(')'))
                            .into_iter()
                            .map(len_of)
                            .sum::<usize>()
                    }
                    None if f.starts_with("n × ") => 2 * len_of(&f["n × ".len()..]),
                    None => len_of(f),
                };
            }
        }
        assert_eq!(enc.len(), want, "tag {tag} ({}): {:?}", row[1], row[2]);
    }
}

#[test]
fn checkpoint_blob_grammar_names_the_encoder_version() {
    let text = section("Checkpoint segments: the blob");
    assert!(
        text.contains(&format!("u32 version ({CHECKPOINT_VERSION})")),
        "the document's checkpoint blob version"
    );
    let intro = &DOC[..DOC.find("\n## ").unwrap()];
    assert!(
        intro.starts_with(&format!(
            "# Native store on-disk format (version {FORMAT_VERSION})"
        )),
        "the document's title names the format version"
    );
}

#[test]
fn metadata_tree_node_and_key_tables_match_the_encoder() {
    let mut t = carmine_btree::Tree::new();
    t.insert(b"key-a", b"value-a").unwrap();
    t.insert(b"key-b", b"").unwrap();
    let generation = 0x1234_5678_9abc;
    let node = t.flush_at(generation, &mut || 9).writes.remove(0).1;
    let text = section("Checkpoint segments: the metadata tree");
    let mut rows = table(text).into_iter();
    let mut at = 0;
    for row in rows.by_ref() {
        let (off, size, field) = (row[0].as_str(), row[1].as_str(), row[2].as_str());
        let off: usize = off
            .parse()
            .unwrap_or_else(|_| panic!("node offset {off:?}"));
        if size == "…" {
            // The entries: a leaf's are (key length, value length, key, value).
            assert!(field.contains("u16 key length, u16 value length, key, value"));
            let mut e = Vec::new();
            for (k, v) in [(&b"key-a"[..], &b"value-a"[..]), (b"key-b", b"")] {
                e.extend_from_slice(&(k.len() as u16).to_le_bytes());
                e.extend_from_slice(&(v.len() as u16).to_le_bytes());
                e.extend_from_slice(k);
                e.extend_from_slice(v);
            }
            assert_eq!(&node[off..off + e.len()], &e[..], "node entries");
            at = node.len() - 4;
            continue;
        }
        let size: usize = size.parse().unwrap();
        assert_eq!(
            off, at,
            "node: {field:?} starts at {off}, the row before ends at {at}"
        );
        let want: Vec<u8> = match field {
            f if f.starts_with("magic") => b"CRBT".to_vec(),
            f if f.starts_with("node format version") => vec![1, 0],
            f if f.starts_with("level") => vec![0],
            f if f.starts_with("reserved") => vec![0; size],
            f if f.starts_with("entries") => vec![2, 0],
            f if f.starts_with("generation") => generation.to_le_bytes()[..6].to_vec(),
            f if f.starts_with("CRC-32C") => le32(crc32c(&node[..off])),
            f => panic!("node: the test does not know the document's field {f:?}"),
        };
        assert_eq!(&node[off..off + size], &want[..], "node: {field:?}");
        at = off + size;
    }
    assert_eq!(at, node.len(), "node: the document's table ends early");
    // The keys table follows: its first column spells each key's fields.
    let keys = table(&text[text.find("| key | value |").unwrap()..]);
    let cid = carmine_types::PgId {
        pool: 0x0102_0304,
        seed: 0x0506_0708,
    };
    let ckey = crate::metatree::collection_key(cid);
    assert!(keys[0][0].starts_with("`C`, u32 pool, u32 seed"));
    assert_eq!(ckey, [b'C', 1, 2, 3, 4, 5, 6, 7, 8]);
    assert!(keys[1][0].starts_with("`O`, u64 object id, u32 piece"));
    let okey = crate::metatree::object_key(0x1122_3344_5566_7788, 0x99aa_bbcc);
    assert_eq!(
        okey,
        [b'O', 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc]
    );
    assert!(keys[2][0].starts_with("`O`, u64 object id, u8 0xFF, u64 logical block"));
    let ekey = crate::metatree::extent_key(0x1122_3344_5566_7788, 0x0102_0304_0506_0708);
    assert_eq!(
        ekey,
        [b'O', 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xff, 1, 2, 3, 4, 5, 6, 7, 8]
    );
    assert!(keys[2][1].contains("u64 device block, then `n` × u32 CRC-32C"));
    let e = crate::extents::Extent::new(0x0a0b, &[0x11, 0x22]);
    let v = crate::extents::extent_value(&e);
    assert_eq!(v, [le64(0x0a0b), le32(0x11), le32(0x22)].concat());
    assert!(text.contains("u16 record version (2)"));
    let rec = crate::metatree::object_record(cid, "o", 0, &crate::index::Body::default());
    assert_eq!(&rec[..2], &[2, 0], "record version");
}
