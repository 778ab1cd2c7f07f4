//! Writes the seed corpora: a handful of valid encodings per target, made by the crates' own
//! encoders, in each target's input convention. Run from `fuzz/`:
//! `cargo run --example seeds -- corpus` (the files are committed; rerun after a format change).
//! Every seed is checked to decode before it is written.

use bytes::{Bytes, BytesMut};
use carmine_cluster::{OsdInfo, OsdMap, Pool};
use carmine_nativestore::fuzzing::{
    decode_checkpoint_slot, decode_deltas, decode_segment_header, decode_superblock, encode_record,
    join_tree_entries, parse_record, CheckpointSlot, Delta, Extent, IndexState, JournalPos,
    SegmentHeader, SegmentKind, Superblock, BLOCK,
};
use carmine_proto::{
    encode_error, encode_request, encode_response, ErrorReply, ObjectRequest, OpOutput, Opcode,
    OsdOp, Request, Response, Status, FRAME_HEADER_LEN,
};
use carmine_types::PgId;
use carmine_volume::fuzzing::{decode_header, decode_lock, encode_header, encode_lock};
use carmine_volume::{ImageInfo, LockInfo};
use std::path::{Path, PathBuf};

struct Corpus {
    root: PathBuf,
    written: usize,
}

impl Corpus {
    fn put(&mut self, target: &str, name: &str, bytes: &[u8]) {
        let dir = self.root.join(target);
        std::fs::create_dir_all(&dir).expect("create corpus dir");
        std::fs::write(dir.join(name), bytes).expect("write seed");
        self.written += 1;
    }
    /// A checksummed target's seed in both modes: raw (the whole encoding) and sealed (the
    /// body with the trailing crc left to the target).
    fn put_both(&mut self, target: &str, name: &str, enc: &[u8], crc_at: usize) {
        self.put(target, &format!("{name}.raw"), &[&[0u8][..], enc].concat());
        self.put(
            target,
            &format!("{name}.sealed"),
            &[&[1u8][..], &enc[..crc_at]].concat(),
        );
    }
}

fn cid(pool: u32, seed: u32) -> PgId {
    PgId { pool, seed }
}

fn requests() -> Vec<Request> {
    let object = |ops| {
        Request::Object(ObjectRequest {
            pool: 1,
            pg_seed: 7,
            epoch: 3,
            client: 0x1234_5678_9abc_def1,
            tid: 0,
            oid: "rbd_data.00ff.0000000000000001".into(),
            ops,
        })
    };
    vec![
        Request::Ping {
            payload: Bytes::from_static(b"ping"),
        },
        Request::GetMap,
        Request::Fence {
            client: 0x1234_5678_9abc_def1,
        },
        object(vec![
            OsdOp::CmpXattr {
                name: "lock".into(),
                value: Some(Bytes::from_static(b"holder")),
            },
            OsdOp::CmpOmap {
                key: Bytes::from_static(b"name_a"),
                value: None,
            },
            OsdOp::Create { exclusive: true },
            OsdOp::SetXattr {
                name: "lock".into(),
                value: Bytes::from_static(b"me"),
            },
        ]),
        object(vec![
            OsdOp::Read {
                off: 4096,
                len: 512,
            },
            OsdOp::Stat,
            OsdOp::GetXattr {
                name: "image".into(),
            },
            OsdOp::OmapGetVals {
                keys: vec![Bytes::from_static(b"name_a")],
            },
            OsdOp::OmapList {
                start_after: Some(Bytes::from_static(b"k")),
                limit: 16,
            },
        ]),
        object(vec![
            OsdOp::Create { exclusive: true },
            OsdOp::Write {
                off: 0,
                data: Bytes::from_static(b"hello"),
            },
            OsdOp::SetXattr {
                name: "image".into(),
                value: Bytes::from_static(b"v"),
            },
            OsdOp::OmapSet {
                kvs: vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
            },
            OsdOp::Zero { off: 8, len: 8 },
            OsdOp::Truncate { size: 4 },
            OsdOp::OmapRm {
                keys: vec![Bytes::from_static(b"k")],
            },
            OsdOp::OmapSetHeader {
                data: Bytes::from_static(b"h"),
            },
            OsdOp::OmapClear,
            OsdOp::RmXattr {
                name: "image".into(),
            },
            OsdOp::Remove,
        ]),
        Request::MarkUnfoundLost {
            pool: 1,
            pg_seed: 0x1f,
            epoch: 9,
        },
    ]
}

fn responses() -> Vec<Response> {
    vec![
        Response::MarkedLost { objects: 15 },
        Response::Pong {
            payload: Bytes::from_static(b"ping"),
        },
        Response::Map {
            encoded: map().encode(),
        },
        Response::Fenced,
        Response::Object {
            outputs: vec![
                OpOutput::None,
                OpOutput::Data(Bytes::from_static(b"data")),
                OpOutput::Stat { size: 4096 },
                OpOutput::Value(Bytes::from_static(b"v")),
                OpOutput::Attrs(vec![("image".into(), Bytes::from_static(b"h"))]),
                OpOutput::Omap {
                    entries: vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
                    more: true,
                },
            ],
        },
    ]
}

fn opcode_index(op: Opcode) -> u8 {
    match op {
        Opcode::Ping => 0,
        Opcode::GetMap => 1,
        Opcode::Object => 2,
        Opcode::Fence => 3,
        Opcode::Auth => 4,
        Opcode::Peer | Opcode::PeerPart => 5,
        Opcode::Scrub => 6,
        Opcode::MarkLost => 7,
    }
}

/// A frame as `message_decoder` input: selector, [status], request id, payload.
fn message_input(frame: &[u8], response: bool, opcode: Opcode, status: u16) -> Vec<u8> {
    let mut sel = u8::from(response) | opcode_index(opcode) << 1;
    let mut out = Vec::new();
    if status != 0 {
        sel |= 0x80;
    }
    out.push(sel);
    if status != 0 {
        out.push(status as u8);
    }
    out.extend_from_slice(&42u64.to_le_bytes());
    out.extend_from_slice(&frame[FRAME_HEADER_LEN..]);
    out
}

fn wire(c: &mut Corpus) {
    let mut stream = BytesMut::new();
    for (i, req) in requests().iter().enumerate() {
        let mut b = BytesMut::new();
        encode_request(&mut b, 42, req);
        let opcode = match req {
            Request::Ping { .. } => Opcode::Ping,
            Request::GetMap => Opcode::GetMap,
            Request::Fence { .. } => Opcode::Fence,
            Request::Object(_) => Opcode::Object,
            Request::Scrub { .. } => Opcode::Scrub,
            Request::MarkUnfoundLost { .. } => Opcode::MarkLost,
        };
        c.put("frame_decoder", &format!("request{i}"), &b);
        c.put(
            "message_decoder",
            &format!("request{i}"),
            &message_input(&b, false, opcode, 0),
        );
        stream.extend_from_slice(&b);
    }
    for (i, resp) in responses().iter().enumerate() {
        let mut b = BytesMut::new();
        encode_response(&mut b, 42, resp);
        let opcode = match resp {
            Response::Pong { .. } => Opcode::Ping,
            Response::Map { .. } => Opcode::GetMap,
            Response::Fenced => Opcode::Fence,
            Response::Object { .. } => Opcode::Object,
            Response::Scrubbed(_) => Opcode::Scrub,
            Response::MarkedLost { .. } => Opcode::MarkLost,
        };
        c.put("frame_decoder", &format!("response{i}"), &b);
        c.put(
            "message_decoder",
            &format!("response{i}"),
            &message_input(&b, true, opcode, 0),
        );
        stream.extend_from_slice(&b);
    }
    let mut b = BytesMut::new();
    let reply = ErrorReply {
        status: Status::ObjectNotFound,
        op_index: Some(1),
        message: "no such object".into(),
    };
    encode_error(&mut b, 42, Opcode::Object, &reply);
    c.put("frame_decoder", "error", &b);
    c.put(
        "message_decoder",
        "error",
        &message_input(&b, true, Opcode::Object, Status::ObjectNotFound as u16),
    );
    stream.extend_from_slice(&b);
    c.put("frame_decoder", "stream", &stream);
    // A message between OSDs in three parts, then one in a single part.
    let mut parts = BytesMut::new();
    carmine_proto::peer_parts::encode_parts_sized(&mut parts, &[7u8; 100], 40);
    carmine_proto::peer_parts::encode_parts(&mut parts, b"one part");
    c.put("frame_decoder", "peer_parts", &parts);
}

fn map() -> OsdMap {
    OsdMap {
        epoch: 5,
        osds: (0..3)
            .map(|id| OsdInfo {
                up: id != 1,
                down_since: if id == 1 { 1_790_000_000 } else { 0 },
                held_down_until: if id == 1 { 1_790_000_020 } else { 0 },
                report_markdowns: u16::from(id == 1),
                ..OsdInfo::new(
                    id,
                    "host-a",
                    (0..2)
                        .map(|r| format!("127.0.0.1:{}", 6800 + id * 4 + r).parse().unwrap())
                        .collect(),
                )
            })
            .collect(),
        pools: vec![
            Pool {
                id: 1,
                name: "rbd".into(),
                pg_num: 64,
                size: 2,
                min_size: 1,
            },
            Pool {
                id: 2,
                name: "meta".into(),
                pg_num: 12,
                size: 1,
                min_size: 1,
            },
        ],
        // Placement exceptions, as the balancer writes them.
        upmaps: [
            (PgId { pool: 1, seed: 3 }, vec![(0, 2)]),
            (PgId { pool: 1, seed: 9 }, vec![(2, 0), (1, 2)]),
        ]
        .into_iter()
        .collect(),
        // A temporary acting set (map format 7), as `pg temp` or priming writes it.
        pg_temp: [(PgId { pool: 1, seed: 5 }, vec![2, 0])]
            .into_iter()
            .collect(),
    }
}

fn pg_history(c: &mut Corpus) {
    let mut h = carmine_pg::History::default();
    for (after, epoch, acting) in [
        (None, 3, vec![0, 1, 2]),
        (Some(3), 5, vec![1, 2]),
        (Some(5), 9, vec![2, 3, 0]),
    ] {
        assert!(h
            .append(after, carmine_pg::Interval { epoch, acting })
            .expect("a valid interval"));
    }
    let raw = h.encode();
    carmine_pg::History::decode(raw.clone()).expect("seed history decodes");
    c.put_both("pg_history", "three", &raw, raw.len() - 4);
    let empty = carmine_pg::History::default().encode();
    c.put_both("pg_history", "empty", &empty, empty.len() - 4);
}

fn peer_message(c: &mut Corpus) {
    use carmine_pg::envelope::{Body, ObjectCopy, PeerMessage};
    use carmine_pg::{Entry, Msg, OpKind, PgLog, ReqId, Version};
    let pg = carmine_types::PgId { pool: 1, seed: 3 };
    let mut log = PgLog::new(64);
    for v in 1..=3 {
        log.append(Entry {
            version: Version::new(2, v),
            oid: format!("obj{v}"),
            kind: OpKind::Modify,
            reqid: Some(ReqId { client: 9, tid: v }),
        })
        .expect("in order");
    }
    let seeds = [
        (
            "rep",
            Body::Pg {
                msg: Msg::Rep {
                    epoch: 2,
                    entry: log.entries().next().expect("an entry").clone(),
                },
                ops: vec![OsdOp::Write {
                    off: 0,
                    data: Bytes::from_static(b"data"),
                }],
            },
        ),
        (
            "activate",
            Body::Pg {
                msg: Msg::Activate {
                    epoch: 2,
                    round: 1,
                    run: (2, 1),
                    log: log.clone(),
                    objects: vec![
                        ("obj1".into(), Some(Version::new(2, 1))),
                        ("gone".into(), None),
                    ],
                },
                ops: vec![],
            },
        ),
        (
            "info",
            Body::Pg {
                msg: Msg::Info {
                    epoch: 2,
                    info: carmine_pg::PeerInfo {
                        osd: 1,
                        last_epoch_started: 2,
                        head: log.head(),
                        tail: log.tail(),
                        primary_run: (2, 1),
                    },
                    log: log.clone(),
                    objects: [
                        ("obj1".to_string(), Version::new(2, 1)),
                        ("obj2".to_string(), Version::new(2, 2)),
                    ]
                    .into(),
                    missing: ["obj2".to_string()].into(),
                    promises_left: vec![(Some(1), 1_200_000_000), (None, 5)].into(),
                },
                ops: vec![],
            },
        ),
        (
            "activate_ack",
            Body::Pg {
                msg: Msg::ActivateAck {
                    epoch: 2,
                    round: 1,
                    head: log.head(),
                    missing: ["obj2".to_string(), "obj3".to_string()].into(),
                },
                ops: vec![],
            },
        ),
        (
            "recovered",
            Body::Pg {
                msg: Msg::Recovered {
                    epoch: 2,
                    round: 1,
                    oid: "obj2".into(),
                    version: Some(Version::new(2, 5)),
                },
                ops: vec![],
            },
        ),
        (
            "lacks",
            Body::Pg {
                msg: Msg::Lacks {
                    epoch: 2,
                    oids: vec!["obj2".into(), "obj3".into()],
                    urgent: true,
                },
                ops: vec![],
            },
        ),
        (
            "overtaken",
            Body::Pg {
                msg: Msg::Overtaken {
                    epoch: 2,
                    round: 1,
                    oid: "obj2".into(),
                },
                ops: vec![],
            },
        ),
        (
            "ping",
            Body::Pg {
                msg: Msg::Ping {
                    epoch: 2,
                    stamp: 5_000_000_000,
                },
                ops: vec![],
            },
        ),
        (
            "pong",
            Body::Pg {
                msg: Msg::Pong {
                    epoch: 2,
                    stamp: 5_000_000_000,
                    granted: 2_000_000_000,
                    full: true,
                },
                ops: vec![],
            },
        ),
        ("pull", Body::Pull { oid: "obj1".into() }),
        (
            "pulled",
            Body::Pulled {
                oid: "obj1".into(),
                version: Version::new(2, 1),
                copy: Some(ObjectCopy {
                    data: Bytes::from_static(b"data"),
                    attrs: vec![("a".into(), Bytes::from_static(b"v"))],
                    omap_header: Bytes::new(),
                    omap: vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
                }),
            },
        ),
    ];
    for (name, body) in seeds {
        let mut out = BytesMut::new();
        PeerMessage {
            from: 1,
            from_inc: 1_700_000_000_000_000_000,
            to_inc: 0,
            pg,
            body,
        }
        .encode(&mut out);
        PeerMessage::decode(out.clone().freeze(), 64).expect("seed message decodes");
        c.put("peer_message", name, &out);
    }
}

fn cluster_and_volume(c: &mut Corpus) {
    let m = map().encode();
    OsdMap::decode(m.clone()).expect("seed map decodes");
    c.put_both("map_decoder", "map", &m, m.len() - 4);
    let mut v6 = map();
    v6.osds[0].reactors = vec!["[::1]:6800".parse().unwrap()];
    let m = v6.encode();
    c.put_both("map_decoder", "map_v6", &m, m.len() - 4);
    // Format 1 (still read): per OSD only id, up and the reactors.
    let mut v1 = Vec::new();
    v1.extend_from_slice(b"CMAP");
    v1.extend_from_slice(&1u16.to_le_bytes());
    v1.extend_from_slice(&4u32.to_le_bytes());
    v1.extend_from_slice(&2u32.to_le_bytes());
    for (id, up) in [(0u32, 1u8), (1, 0)] {
        v1.extend_from_slice(&id.to_le_bytes());
        v1.push(up);
        v1.extend_from_slice(&1u32.to_le_bytes());
        let addr = format!("127.0.0.1:{}", 6800 + id);
        v1.extend_from_slice(&(addr.len() as u32).to_le_bytes());
        v1.extend_from_slice(addr.as_bytes());
    }
    v1.extend_from_slice(&1u32.to_le_bytes());
    v1.extend_from_slice(&1u32.to_le_bytes());
    v1.extend_from_slice(&3u32.to_le_bytes());
    v1.extend_from_slice(b"rbd");
    v1.extend_from_slice(&32u32.to_le_bytes());
    v1.push(1);
    let crc = carmine_types::crc32c(&v1);
    v1.extend_from_slice(&crc.to_le_bytes());
    OsdMap::decode(v1.clone().into()).expect("the format-1 seed decodes");
    c.put_both("map_decoder", "map_format1", &v1, v1.len() - 4);

    for (i, (size, object_size)) in [(10u64 << 30, 4u64 << 20), (1, 4096), (1 << 50, 16 << 20)]
        .into_iter()
        .enumerate()
    {
        let info = ImageInfo {
            name: "vm-disk".into(),
            id: "00ff00ff00ff00ff".into(),
            size,
            object_size,
            features: 0,
        };
        let h = encode_header(&info);
        assert_eq!(decode_header(&h).expect("seed header decodes"), info);
        c.put_both("volume_header", &format!("header{i}"), &h, h.len() - 4);
    }
    for (i, lease_ms) in [100u64, 10_000, 3_600_000].into_iter().enumerate() {
        let info = LockInfo {
            owner: 0x1234_5678_9abc_def1,
            renewals: i as u64 * 1000,
            lease: std::time::Duration::from_millis(lease_ms),
            holder: "carmine nbd serve on 127.0.0.1:10809 (pid 42)".into(),
        };
        let l = encode_lock(&info);
        assert_eq!(decode_lock(&l).expect("seed lock decodes"), info);
        c.put_both("lock_record", &format!("lock{i}"), &l, l.len() - 4);
    }
}

fn nbd(c: &mut Corpus) {
    // Constants from the NBD protocol document.
    const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
    const REQUEST_MAGIC: u32 = 0x2560_9513;
    fn option(out: &mut Vec<u8>, option: u32, data: &[u8]) {
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&option.to_be_bytes());
        out.extend_from_slice(&(data.len() as u32).to_be_bytes());
        out.extend_from_slice(data);
    }
    fn info_request(name: &str, infos: &[u16]) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
        infos
            .iter()
            .for_each(|i| d.extend_from_slice(&i.to_be_bytes()));
        d
    }
    fn request(out: &mut Vec<u8>, flags: u16, cmd: u16, offset: u64, len: u32) {
        out.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
        out.extend_from_slice(&cmd.to_be_bytes());
        out.extend_from_slice(&0xc0ffee_u64.to_be_bytes());
        out.extend_from_slice(&offset.to_be_bytes());
        out.extend_from_slice(&len.to_be_bytes());
    }
    fn transmission(out: &mut Vec<u8>) {
        request(out, 0, 0, 0, 4096); // READ
        request(out, 1, 1, 4096, 8); // WRITE, FUA
        out.extend_from_slice(b"8 bytes!");
        request(out, 0, 3, 0, 0); // FLUSH
        request(out, 0, 4, 0, 4096); // TRIM
        request(out, 0, 6, 0, 4096); // WRITE_ZEROES
        request(out, 0, 5, 0, 4096); // CACHE
        request(out, 0, 2, 0, 0); // DISC
    }
    let flags = 3u32.to_be_bytes(); // FIXED_NEWSTYLE | NO_ZEROES

    let mut s = flags.to_vec();
    option(&mut s, 8, &[]); // STRUCTURED_REPLY
    option(&mut s, 3, &[]); // LIST
    option(&mut s, 6, &info_request("disk", &[3, 1])); // INFO
    option(&mut s, 7, &info_request("disk", &[3])); // GO
    transmission(&mut s);
    c.put("nbd_stream", "go", &s);

    let mut s = flags.to_vec();
    option(&mut s, 1, b"disk"); // EXPORT_NAME
    transmission(&mut s);
    c.put("nbd_stream", "export_name", &s);

    let mut s = flags.to_vec();
    option(&mut s, 99, b"unknown");
    option(&mut s, 2, &[]); // ABORT
    c.put("nbd_stream", "abort", &s);
}

fn store_blocks(c: &mut Corpus) {
    for (i, shards) in [1u32, 2, 64].into_iter().enumerate() {
        let sb = Superblock::layout(64 << 30, shards, 1 << 20, 0x1234_5678_9abc_def0 << i)
            .expect("seed layout");
        let enc = sb.encode();
        assert_eq!(
            decode_superblock(&enc).expect("seed superblock decodes"),
            sb
        );
        c.put_both(
            "superblock",
            &format!("shards{shards}"),
            &enc,
            enc.len() - 4,
        );
    }

    for (i, segments) in [vec![], vec![1, 2, 9], (0..100).collect()]
        .into_iter()
        .enumerate()
    {
        let slot = CheckpointSlot {
            shard: i as u32,
            uuid: u128::MAX - 5,
            generation: 9,
            journal: JournalPos {
                segment: 4,
                segment_seq: 77,
                block: 12,
                record_seq: 1000,
            },
            segment_seq_max: 80,
            blob_len: 12345,
            blob_crc: 0xabcdef,
            segments,
            tree_root: None,
        };
        let enc = slot.encode();
        assert_eq!(
            decode_checkpoint_slot(&enc).expect("seed slot decodes"),
            slot
        );
        c.put_both("checkpoint_slot", &format!("slot{i}"), &enc, enc.len() - 4);
        if i == 0 {
            let tree = CheckpointSlot {
                blob_len: 0,
                blob_crc: 0,
                tree_root: Some(4242),
                ..slot
            };
            let enc = tree.encode();
            assert_eq!(
                decode_checkpoint_slot(&enc).expect("seed slot decodes"),
                tree
            );
            c.put_both("checkpoint_slot", "tree", &enc, enc.len() - 4);
        }
    }

    for (i, kind) in [SegmentKind::Journal, SegmentKind::Checkpoint]
        .into_iter()
        .enumerate()
    {
        let h = SegmentHeader {
            uuid: 42 << 70,
            shard: 1,
            kind,
            seq: 5 + i as u64,
            nonce: 0x5eed,
        };
        let enc = h.encode();
        assert_eq!(decode_segment_header(&enc).expect("seed header decodes"), h);
        c.put_both("segment_header", &format!("kind{i}"), &enc, enc.len() - 4);
    }
}

/// Deltas that build one object with blocks inside the targets' small shards (block 2 on).
fn deltas() -> Vec<Delta> {
    let (c, o) = (cid(1, 7), "obj".to_string());
    vec![
        Delta::CreateCollection(c),
        Delta::Touch(c, o.clone()),
        Delta::SetSize(c, o.clone(), 3 * 4096),
        Delta::SetExtent {
            cid: c,
            oid: o.clone(),
            lblock: 0,
            extent: Extent::new(3, &[0xdead]),
        },
        Delta::SetExtent {
            cid: c,
            oid: o.clone(),
            lblock: 2,
            extent: Extent::new(11, &[0xbeef, 0xf00d, 0xcafe]),
        },
        Delta::SetAttr(c, o.clone(), "image".into(), Bytes::from_static(b"hdr")),
        Delta::OmapSet(
            c,
            o.clone(),
            vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
        ),
        Delta::OmapHeader(c, o.clone(), Bytes::from_static(b"h")),
        Delta::Touch(c, "copy".into()),
        Delta::CopyMeta(c, o.clone(), "copy".into()),
        Delta::Punch(c, o.clone(), 1, 3),
        Delta::RmAttr(c, "copy".into(), "image".into()),
        Delta::OmapRm(c, "copy".into(), vec![Bytes::from_static(b"k")]),
        Delta::OmapClear(c, "copy".into()),
        Delta::Remove(c, "copy".into()),
        Delta::CreateCollection(cid(2, 0)),
        Delta::RemoveCollection(cid(2, 0)),
    ]
}

fn encode_deltas(ds: &[Delta]) -> Vec<u8> {
    let mut b = BytesMut::new();
    ds.iter().for_each(|d| d.encode(&mut b));
    b.to_vec()
}

fn journal(c: &mut Corpus) {
    let ds = deltas();
    let meta = encode_deltas(&ds);
    assert_eq!(decode_deltas(&meta).expect("seed deltas decode"), ds);
    c.put("journal_deltas", "all_kinds", &meta);
    c.put("journal_deltas", "one_object", &encode_deltas(&ds[..5]));

    // Checkpoints of the index those deltas build, for the targets' two geometries.
    for (name, segments, segment_blocks) in [("small", 8, 16), ("tiny", 4, 8)] {
        let mut index = IndexState::new(segments, segment_blocks);
        for d in &ds[..ds.len() - 2] {
            index.apply(d).expect("seed delta applies");
        }
        let blob = index.encode();
        IndexState::decode(&blob, segments, segment_blocks).expect("seed checkpoint decodes");
        c.put("checkpoint_index", name, &blob);
    }
    c.put(
        "checkpoint_index",
        "empty",
        &IndexState::new(8, 16).encode(),
    );
    // The same index as metadata tree records (format 4 checkpoints).
    let mut index = IndexState::new(8, 16);
    for d in &ds[..ds.len() - 2] {
        index.apply(d).expect("seed delta applies");
    }
    let entries = index.tree_entries();
    let again = IndexState::from_tree_entries(&entries, 8, 16).expect("seed records load");
    assert_eq!(again.tree_entries(), entries);
    c.put("metadata_records", "small", &join_tree_entries(&entries));
    // A version 1 blob (format 1 and 2 stores: one entry per block), as those builds wrote it.
    let mut v1 = Vec::new();
    v1.extend_from_slice(&1u32.to_le_bytes()); // version
    v1.extend_from_slice(&1u32.to_le_bytes()); // collections
    v1.extend_from_slice(&[1, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0]); // pool 1, seed 7, 1 object
    v1.extend_from_slice(&[3, 0, 0, 0]);
    v1.extend_from_slice(b"obj");
    v1.extend_from_slice(&(3u64 * 4096).to_le_bytes());
    v1.extend_from_slice(&2u64.to_le_bytes()); // blocks
    for (l, paddr, crc) in [(0u64, 3u64, 0xdeadu32), (1, 4, 0xbeef)] {
        v1.extend_from_slice(&l.to_le_bytes());
        v1.extend_from_slice(&paddr.to_le_bytes());
        v1.extend_from_slice(&crc.to_le_bytes());
    }
    v1.extend_from_slice(&[0; 4 + 4 + 8]); // no xattrs, no omap header, no omap
    IndexState::decode(&v1, 8, 16).expect("the version 1 seed decodes");
    c.put("checkpoint_index", "version1", &v1);

    // Records: written-mode inputs, and the written bytes as raw and sealed-header inputs.
    let big_meta = encode_deltas(
        &(0..120)
            .map(|i| Delta::Touch(cid(1, 7), format!("object-with-a-long-name-{i:04}")))
            .collect::<Vec<_>>(),
    );
    assert!(big_meta.len() > BLOCK, "spills past the header block");
    for (i, (meta, data_blocks)) in [(&meta, 0u8), (&meta, 2), (&big_meta, 1)]
        .into_iter()
        .enumerate()
    {
        let (seq, nonce, durable) = (100 + i as u64, 0x5eed, 99);
        let mut written = vec![2u8];
        for v in [seq, nonce, durable] {
            written.extend_from_slice(&v.to_le_bytes());
        }
        written.push(data_blocks);
        written.extend_from_slice(meta);
        c.put("journal_record", &format!("written{i}"), &written);

        let blocks: Vec<u8> = (0..data_blocks as usize * BLOCK)
            .map(|k| (k / BLOCK) as u8 ^ data_blocks)
            .collect();
        let area = encode_record(seq, nonce, durable, meta, &blocks);
        assert!(
            parse_record(&area, seq, nonce).is_some(),
            "seed record parses"
        );
        if i < 2 {
            c.put(
                "journal_record",
                &format!("raw{i}"),
                &[&[0u8][..], &area].concat(),
            );
            c.put(
                "journal_record",
                &format!("sealed{i}"),
                &[&[1u8][..], &area].concat(),
            );
        }
    }
}

fn auth(c: &mut Corpus) {
    use carmine_proto::auth::{encode_proof, Challenge, Hello};
    let mut b = bytes::BytesMut::from(&[0u8][..]);
    Hello {
        nonce: [7; 32],
        entity: "client.admin".into(),
    }
    .encode(&mut b);
    c.put("auth_handshake", "hello", &b);
    let mut b = bytes::BytesMut::from(&[1u8][..]);
    Challenge {
        nonce: [1; 32],
        proof: [2; 32],
    }
    .encode(&mut b);
    c.put("auth_handshake", "challenge", &b);
    let mut b = bytes::BytesMut::from(&[2u8][..]);
    encode_proof(&mut b, &[9; 32]);
    c.put("auth_handshake", "proof", &b);
}

/// B+tree nodes: a full leaf, an empty leaf, an inner node.
fn tree_nodes(c: &mut Corpus) {
    for (i, block) in carmine_btree::fuzzing::sample_nodes().iter().enumerate() {
        assert!(carmine_btree::fuzzing::decode_and_reencode(block).is_some());
        c.put_both("tree_node", &format!("node{i}"), block, block.len() - 4);
    }
}

/// Event sequences for `pg_member` (see its target): osd.0 as a primary of two, and as a
/// replica that takes an activation, writes and pings.
fn pg_member(c: &mut Corpus) {
    use carmine_pg::{wire, Entry, Msg, OpKind, PgLog, ReqId, Version};
    let msg = |out: &mut Vec<u8>, from: u8, m: &Msg| {
        out.extend([9, from, 0x11]);
        let mut b = BytesMut::new();
        wire::encode_msg(&mut b, m);
        out.extend_from_slice(&b);
    };
    // Map epoch 1, acting [0, 1], an empty history, min_size 1; its persists and record; a
    // tick, two writes, their persists, and osd.1's acknowledgement.
    let mut primary = vec![0, 1, 0x03, 0x40, 3, 3, 7, 1, 1];
    for tid in 1..=2u8 {
        primary.extend([4, tid, tid, 3]);
    }
    msg(
        &mut primary,
        1,
        &Msg::RepAck {
            epoch: 1,
            version: Version::new(1, 2),
        },
    );
    primary.extend([1, 2]);
    c.put("pg_member", "primary", &primary);

    // Map epoch 1, acting [1, 0]: osd.1 activates osd.0, sends a write and pings.
    let entry = |v: u64| Entry {
        version: Version::new(1, v),
        oid: format!("o{v}"),
        kind: OpKind::Modify,
        reqid: Some(ReqId { client: 1, tid: v }),
    };
    let mut log = PgLog::new(16);
    log.append(entry(1)).expect("in order");
    let mut replica = vec![0, 1, 0x13, 0x40];
    msg(&mut replica, 1, &Msg::Query { epoch: 1 });
    msg(
        &mut replica,
        1,
        &Msg::Activate {
            epoch: 1,
            round: 0,
            run: (1, 0),
            log,
            objects: vec![("o1".into(), Some(Version::new(1, 1)))],
        },
    );
    replica.extend([3, 5, 1, 5, 3]);
    msg(
        &mut replica,
        1,
        &Msg::Rep {
            epoch: 1,
            entry: entry(2),
        },
    );
    replica.push(3);
    msg(&mut replica, 1, &Msg::Ping { epoch: 1, stamp: 7 });
    msg(
        &mut replica,
        1,
        &Msg::Lacks {
            epoch: 1,
            oids: vec!["o1".into()],
            urgent: true,
        },
    );
    c.put("pg_member", "replica", &replica);
}

/// A PG state object's omap pairs in the `pg_state` target's input convention.
fn pg_state(c: &mut Corpus) {
    use carmine_pg::{wire, Entry, OpKind, ReqId, Version};
    fn version(v: Version) -> Vec<u8> {
        [&v.epoch.to_be_bytes()[..], &v.v.to_be_bytes()[..]].concat()
    }
    fn pair(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
        out.push(key.len() as u8);
        out.extend_from_slice(key);
        out.extend_from_slice(&(value.len() as u16).to_le_bytes());
        out.extend_from_slice(value);
    }
    let head = Version::in_run(3, 1, 12);
    let mut state = Vec::new();
    let meta = [
        &[3u8][..],
        &version(Version::new(2, 9)),
        &version(Version::new(3, 11)),
        &3u32.to_be_bytes(),
    ]
    .concat();
    pair(&mut state, b"m", &meta);
    for (v, oid) in [
        (Version::new(3, 10), "o1"),
        (Version::new(3, 11), "o2"),
        (head, "o1"),
    ] {
        let mut b = BytesMut::new();
        wire::encode_entry(
            &mut carmine_types::Encoder::new(&mut b),
            &Entry {
                version: v,
                oid: oid.into(),
                kind: OpKind::Modify,
                reqid: Some(ReqId {
                    client: 5,
                    tid: v.seq(),
                }),
            },
        );
        pair(&mut state, &[&b"l"[..], &version(v)].concat(), &b);
    }
    pair(&mut state, b"oo1", &version(head));
    pair(&mut state, b"oo2", &version(Version::new(2, 7)));
    pair(&mut state, b"no2", &version(Version::new(3, 11)));
    pair(
        &mut state,
        b"r",
        &[&[1u8][..], &3u32.to_be_bytes(), &1u32.to_be_bytes()].concat(),
    );
    let decode = |input: &[u8]| {
        let mut pairs = std::collections::BTreeMap::new();
        let mut rest = input;
        while !rest.is_empty() {
            let k = rest[0] as usize;
            let key = Bytes::copy_from_slice(&rest[1..1 + k]);
            let vlen = u16::from_le_bytes([rest[1 + k], rest[2 + k]]) as usize;
            let value = Bytes::copy_from_slice(&rest[3 + k..3 + k + vlen]);
            pairs.insert(key, value);
            rest = &rest[3 + k + vlen..];
        }
        pairs.into_iter().collect::<Vec<_>>()
    };
    assert_eq!(
        carmine_osd::check_pg_state(&decode(&state)),
        Ok((Version::new(2, 9), head))
    );
    c.put("pg_state", "state", &state);
    // A store written before runs: no run record.
    let mut before_runs = Vec::new();
    pair(&mut before_runs, b"m", &meta);
    carmine_osd::check_pg_state(&decode(&before_runs)).expect("an empty log loads");
    c.put("pg_state", "before_runs", &before_runs);
}

fn main() {
    let root = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"));
    let mut c = Corpus { root, written: 0 };
    wire(&mut c);
    cluster_and_volume(&mut c);
    pg_history(&mut c);
    peer_message(&mut c);
    pg_member(&mut c);
    pg_state(&mut c);
    nbd(&mut c);
    store_blocks(&mut c);
    journal(&mut c);
    auth(&mut c);
    tree_nodes(&mut c);
    println!("wrote {} seeds under {}", c.written, c.root.display());
}
