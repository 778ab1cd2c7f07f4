use super::*;
use crate::frame::try_decode_frame;
use proptest::prelude::*;

fn arb_bytes(max: usize) -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

fn arb_op() -> impl Strategy<Value = OsdOp> {
    prop_oneof![
        (any::<u64>(), 0..IO_LEN_MAX).prop_map(|(off, len)| OsdOp::Read { off, len }),
        Just(OsdOp::Stat),
        "[a-z]{0,8}".prop_map(|name| OsdOp::GetXattr { name }),
        Just(OsdOp::GetXattrs),
        Just(OsdOp::OmapGetHeader),
        proptest::collection::vec(arb_bytes(8), 0..4).prop_map(|keys| OsdOp::OmapGetVals { keys }),
        (proptest::option::of(arb_bytes(8)), 0..LIST_LIMIT_MAX)
            .prop_map(|(start_after, limit)| OsdOp::OmapList { start_after, limit }),
        any::<bool>().prop_map(|exclusive| OsdOp::Create { exclusive }),
        (any::<u64>(), arb_bytes(64)).prop_map(|(off, data)| OsdOp::Write { off, data }),
        arb_bytes(64).prop_map(|data| OsdOp::WriteFull { data }),
        (any::<u64>(), any::<u64>()).prop_map(|(off, len)| OsdOp::Zero { off, len }),
        any::<u64>().prop_map(|size| OsdOp::Truncate { size }),
        Just(OsdOp::Remove),
        ("[a-z]{1,8}", arb_bytes(16)).prop_map(|(name, value)| OsdOp::SetXattr { name, value }),
        "[a-z]{1,8}".prop_map(|name| OsdOp::RmXattr { name }),
        proptest::collection::vec((arb_bytes(8), arb_bytes(8)), 0..4)
            .prop_map(|kvs| OsdOp::OmapSet { kvs }),
        proptest::collection::vec(arb_bytes(8), 0..4).prop_map(|keys| OsdOp::OmapRm { keys }),
        Just(OsdOp::OmapClear),
        arb_bytes(16).prop_map(|data| OsdOp::OmapSetHeader { data }),
        ("[a-z]{1,8}", proptest::option::of(arb_bytes(16)))
            .prop_map(|(name, value)| OsdOp::CmpXattr { name, value }),
        (arb_bytes(8), proptest::option::of(arb_bytes(16)))
            .prop_map(|(key, value)| OsdOp::CmpOmap { key, value }),
    ]
}

fn arb_request() -> impl Strategy<Value = Request> {
    prop_oneof![
        arb_bytes(64).prop_map(|payload| Request::Ping { payload }),
        Just(Request::GetMap),
        any::<u64>().prop_map(|client| Request::Fence { client }),
        (any::<u32>(), any::<u32>(), any::<u32>(), 0u8..3).prop_map(
            |(pool, pg_seed, epoch, mode)| Request::Scrub {
                pool,
                pg_seed,
                epoch,
                mode: crate::ScrubMode::from_u8(mode).unwrap(),
            }
        ),
        (
            (any::<u32>(), any::<u32>(), any::<u32>(), any::<u64>()),
            "[a-z0-9._]{1,40}",
            proptest::collection::vec(arb_op(), 0..6)
        )
            .prop_map(
                |((pool, pg_seed, epoch, client), oid, ops)| Request::Object(ObjectRequest {
                    pool,
                    pg_seed,
                    epoch,
                    client,
                    tid: 0,
                    oid,
                    ops
                })
            ),
    ]
}

fn arb_output() -> impl Strategy<Value = OpOutput> {
    prop_oneof![
        Just(OpOutput::None),
        arb_bytes(64).prop_map(OpOutput::Data),
        any::<u64>().prop_map(|size| OpOutput::Stat { size }),
        arb_bytes(16).prop_map(OpOutput::Value),
        proptest::collection::vec(("[a-z]{1,6}", arb_bytes(8)), 0..3).prop_map(OpOutput::Attrs),
        (
            proptest::collection::vec((arb_bytes(6), arb_bytes(6)), 0..3),
            any::<bool>()
        )
            .prop_map(|(entries, more)| OpOutput::Omap { entries, more }),
    ]
}

fn decode_one(buf: &mut BytesMut) -> Frame {
    try_decode_frame(buf)
        .expect("valid frame")
        .expect("complete frame")
}

proptest! {
    #[test]
    fn every_request_round_trips(req in arb_request(), id in any::<u64>()) {
        let mut buf = BytesMut::new();
        encode_request(&mut buf, id, &req);
        let frame = decode_one(&mut buf);
        prop_assert_eq!(frame.header.request_id, id);
        prop_assert_eq!(Request::decode(&frame).unwrap(), req);
    }

    #[test]
    fn every_response_round_trips(outputs in proptest::collection::vec(arb_output(), 0..5), id in any::<u64>()) {
        let resp = Response::Object { outputs };
        let mut buf = BytesMut::new();
        encode_response(&mut buf, id, &resp);
        let frame = decode_one(&mut buf);
        prop_assert_eq!(Response::decode(&frame).unwrap().unwrap(), resp);
    }

    /// Garbage inside a correctly checksummed frame must give a typed error, never a panic.
    #[test]
    fn random_payloads_never_panic_the_message_decoders(payload in proptest::collection::vec(any::<u8>(), 0..256), op in 1u16..8, status in 0u16..20) {
        for kind in [FrameKind::Request, FrameKind::Response] {
            let mut buf = BytesMut::new();
            let opcode = match op { 1 => Opcode::Ping, 2 => Opcode::GetMap, _ => Opcode::Object };
            encode_frame(&mut buf, kind, opcode, 1, status, |b| b.extend_from_slice(&payload));
            let frame = decode_one(&mut buf);
            let _ = Request::decode(&frame);
            let _ = Response::decode(&frame);
        }
    }

    /// Arbitrary bytes on a connection: the frame decoder returns frames, waits, or errors.
    #[test]
    fn random_streams_never_panic_the_frame_decoder(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut buf = BytesMut::from(&data[..]);
        while let Ok(Some(_)) = try_decode_frame(&mut buf) {}
    }
}

#[test]
fn error_reply_round_trips_with_op_index() {
    let mut buf = BytesMut::new();
    let reply = ErrorReply {
        status: Status::ObjectNotFound,
        op_index: Some(2),
        message: "no such object".into(),
    };
    encode_error(&mut buf, 9, Opcode::Object, &reply);
    let frame = decode_one(&mut buf);
    assert_eq!(Response::decode(&frame).unwrap(), Err(reply));
}

#[test]
fn unknown_op_code_is_reported_with_its_index() {
    let mut buf = BytesMut::new();
    encode_frame(&mut buf, FrameKind::Request, Opcode::Object, 1, 0, |b| {
        let mut e = Encoder::new(b);
        e.u32(1).u32(0).u32(1).u64(7).u64(1).str("obj").count(2);
        e.u8(2); // Stat
        e.u8(200); // unknown
    });
    let frame = decode_one(&mut buf);
    assert_eq!(
        Request::decode(&frame),
        Err(ProtoError::UnknownOp {
            code: 200,
            index: 1
        })
    );
}

#[test]
fn trailing_bytes_after_a_request_are_malformed() {
    let mut buf = BytesMut::new();
    encode_frame(&mut buf, FrameKind::Request, Opcode::GetMap, 1, 0, |b| {
        b.extend_from_slice(b"junk")
    });
    let frame = decode_one(&mut buf);
    assert!(matches!(
        Request::decode(&frame),
        Err(ProtoError::Decode { .. })
    ));
}

#[test]
fn hostile_op_count_is_rejected_without_allocating() {
    let mut buf = BytesMut::new();
    encode_frame(&mut buf, FrameKind::Request, Opcode::Object, 1, 0, |b| {
        Encoder::new(b)
            .u32(1)
            .u32(0)
            .u32(1)
            .u64(7)
            .u64(1)
            .str("obj")
            .u32(u32::MAX);
    });
    let frame = decode_one(&mut buf);
    assert!(matches!(
        Request::decode(&frame),
        Err(ProtoError::Decode {
            source: DecodeError::TooLarge { .. },
            ..
        })
    ));
}

#[test]
fn write_data_shares_the_receive_buffer() {
    let mut buf = BytesMut::new();
    let data = Bytes::from(vec![5u8; 4096]);
    let req = Request::Object(ObjectRequest {
        pool: 1,
        pg_seed: 0,
        epoch: 1,
        client: 0,
        tid: 0,
        oid: "o".into(),
        ops: vec![OsdOp::Write { off: 0, data }],
    });
    encode_request(&mut buf, 1, &req);
    let frame = decode_one(&mut buf);
    let Request::Object(r) = Request::decode(&frame).unwrap() else {
        panic!("not an object request")
    };
    let OsdOp::Write { data, .. } = &r.ops[0] else {
        panic!("not a write")
    };
    let payload_range =
        frame.payload.as_ptr() as usize..frame.payload.as_ptr() as usize + frame.payload.len();
    assert!(
        payload_range.contains(&(data.as_ptr() as usize)),
        "write data was copied"
    );
}

#[test]
fn data_reply_is_byte_identical_to_an_object_response() {
    let data = Bytes::from((0..5000u32).map(|i| i as u8).collect::<Vec<u8>>());
    let mut a = BytesMut::new();
    encode_response(
        &mut a,
        42,
        &Response::Object {
            outputs: vec![OpOutput::Data(data.clone())],
        },
    );
    let mut b = BytesMut::from(&b"earlier bytes"[..]);
    let reply = begin_data_reply(&mut b, 42);
    b.extend_from_slice(&data);
    reply.finish(&mut b);
    assert_eq!(&b[13..], &a[..]);
}

#[test]
fn scrub_reports_round_trip_and_truncations_are_errors() {
    let report = crate::ScrubReport {
        epoch: 12,
        acting: vec![2, 0, 1],
        mode: crate::ScrubMode::Repair,
        objects: 40,
        bytes: 40 << 22,
        findings_total: 3,
        findings: vec![
            crate::ScrubFinding {
                oid: "rbd_data.1.0".into(),
                osd: 1,
                what: "data checksum differs".into(),
                repaired: true,
            },
            crate::ScrubFinding {
                oid: "rbd_data.1.7".into(),
                osd: 0,
                what: "missing".into(),
                repaired: false,
            },
        ],
    };
    assert_eq!(report.unrepaired(), 2);
    let resp = Response::Scrubbed(report);
    let mut buf = BytesMut::new();
    encode_response(&mut buf, 5, &resp);
    let frame = decode_one(&mut buf);
    assert_eq!(Response::decode(&frame).unwrap().unwrap(), resp);
    for cut in 0..frame.payload.len() {
        let mut f = frame.clone();
        f.payload = frame.payload.slice(..cut);
        assert!(Response::decode(&f).is_err(), "cut at {cut}");
    }
}
