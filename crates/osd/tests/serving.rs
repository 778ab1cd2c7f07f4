//! The OSD serving real TCP connections in-process: routing, pipelining, and bad clients.

use bytes::{Bytes, BytesMut};
use carmine_client::{Client, ClientConfig, Connection};
use carmine_cluster::{OsdInfo, OsdMap, Pool};
use carmine_osd::{Osd, OsdConfig, CONNECTIONS_MAX_DEFAULT};
use carmine_proto::{
    encode_frame, FrameKind, ObjectRequest, Opcode, OsdOp, Request, Response, Status,
};
use carmine_types::PgId;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

fn free_addr() -> SocketAddr {
    carmine_testkit::free_addr()
}

fn start(reactors: usize) -> (Osd, OsdMap) {
    start_with(reactors, CONNECTIONS_MAX_DEFAULT)
}

fn start_with(reactors: usize, connections_max: u32) -> (Osd, OsdMap) {
    let map = OsdMap {
        epoch: 1,
        osds: vec![OsdInfo::new(
            0,
            "localhost",
            (0..reactors).map(|_| free_addr()).collect(),
        )],
        pools: vec![Pool {
            id: 1,
            name: "rbd".into(),
            pg_num: 16,
            size: 1,
            min_size: 1,
        }],
        upmaps: Default::default(),
        pg_temp: Default::default(),
        pool_max: 1,
        given_copies: Default::default(),
    };
    let osd = Osd::start(OsdConfig {
        reactor_cpus: vec![None; reactors],
        connections_max,
        ..OsdConfig::in_memory(0, map.clone(), 64 << 20)
    })
    .unwrap();
    (osd, map)
}

fn client(map: &OsdMap) -> impl std::future::Future<Output = Client> {
    let addrs = map.osds[0].reactors.clone();
    async move {
        Client::connect(&addrs, ClientConfig::default())
            .await
            .unwrap()
    }
}

#[test]
fn objects_round_trip_across_reactors_with_pipelining() {
    let (osd, map) = start(2);
    carmine_reactor::block_on(async {
        let c = client(&map).await;
        let writes = (0..200).map(|i| {
            let c = c.clone();
            async move {
                c.write(1, &format!("obj.{i}"), 0, Bytes::from(vec![i as u8; 4096]))
                    .await
                    .unwrap()
            }
        });
        futures::future::join_all(writes).await;
        for i in 0..200 {
            let data = c.read(1, &format!("obj.{i}"), 0, 0).await.unwrap();
            assert_eq!(data, Bytes::from(vec![i as u8; 4096]), "object {i}");
        }
    });
    // Both reactors served some of the objects.
    let served: Vec<usize> = (0..2).map(|r| map.pgs_of_reactor(0, r).len()).collect();
    assert!(served.iter().all(|n| *n > 0), "{served:?}");
    osd.shutdown().unwrap();
}

#[test]
fn unknown_pool_and_missing_object_are_clear_errors() {
    let (osd, map) = start(1);
    carmine_reactor::block_on(async {
        let c = client(&map).await;
        assert!(c
            .pool_id("nope")
            .unwrap_err()
            .to_string()
            .contains("no pool named"));
        let err = c.read(1, "never-written", 0, 0).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::ObjectNotFound));
        // A request naming a pool the OSD does not know, sent around the client's map check.
        let conn = Connection::open(map.osds[0].reactors[0], 4).await.unwrap();
        let req = Request::Object(ObjectRequest {
            pool: 99,
            pg_seed: 0,
            epoch: 1,
            client: 0,
            tid: 0,
            oid: "x".into(),
            ops: vec![OsdOp::Stat],
        });
        let err = conn.call(&req).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::PoolNotFound));
    });
    osd.shutdown().unwrap();
}

#[test]
fn request_for_a_pg_of_another_reactor_is_wrong_target() {
    let (osd, map) = start(2);
    carmine_reactor::block_on(async {
        let pool = &map.pools[0];
        let (oid, pg) = (0..)
            .map(|i| format!("o{i}"))
            .map(|o| (o.clone(), map.object_pg(pool, &o)))
            .find(|(_, pg)| map.pg_primary(*pg).unwrap().1 == 1)
            .unwrap();
        let wrong = map.osds[0].reactors[0];
        let conn = Connection::open(wrong, 4).await.unwrap();
        let req = Request::Object(ObjectRequest {
            pool: 1,
            pg_seed: pg.seed,
            epoch: 1,
            client: 0,
            tid: 0,
            oid,
            ops: vec![OsdOp::Stat],
        });
        assert_eq!(
            conn.call(&req).await.unwrap_err().status(),
            Some(Status::WrongTarget)
        );
        let _ = PgId { pool: 1, seed: 0 };
    });
    osd.shutdown().unwrap();
}

#[test]
fn mixing_reads_and_writes_or_sending_no_ops_is_rejected() {
    let (osd, map) = start(1);
    carmine_reactor::block_on(async {
        let c = client(&map).await;
        let err = c
            .execute(1, "a", vec![OsdOp::Stat, OsdOp::Remove])
            .await
            .unwrap_err();
        assert_eq!(err.status(), Some(Status::InvalidArgument));
        let err = c.execute(1, "a", vec![]).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::InvalidArgument));
    });
    osd.shutdown().unwrap();
}

/// Bytes that are not frames cost the sender its connection and nothing else.
#[test]
fn garbage_frames_close_only_that_connection() {
    let (osd, map) = start(1);
    let addr = map.osds[0].reactors[0];
    let mut bad = TcpStream::connect(addr).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    bad.write_all(&[0xde; 64]).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(
        bad.read(&mut buf).unwrap_or(0),
        0,
        "the OSD should close a connection that sends garbage"
    );

    // A frame with a bad payload checksum is treated the same way.
    let mut frame = BytesMut::new();
    encode_frame(&mut frame, FrameKind::Request, Opcode::Ping, 1, 0, |b| {
        b.extend_from_slice(&[1, 0, 0, 0, 9])
    });
    let last = frame.len() - 1;
    frame[last] ^= 0xff;
    let mut bad = TcpStream::connect(addr).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    bad.write_all(&frame).unwrap();
    assert_eq!(bad.read(&mut buf).unwrap_or(0), 0);

    carmine_reactor::block_on(async {
        let c = client(&map).await;
        c.write(1, "still-serving", 0, Bytes::from_static(b"yes"))
            .await
            .unwrap();
        assert_eq!(&c.read(1, "still-serving", 0, 0).await.unwrap()[..], b"yes");
    });
    osd.shutdown().unwrap();
}

/// A well-framed request whose message does not decode gets `Malformed`; the connection lives on.
#[test]
fn malformed_message_is_answered_and_the_connection_stays_usable() {
    let (osd, map) = start(1);
    let addr = map.osds[0].reactors[0];
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = BytesMut::new();
    encode_frame(&mut out, FrameKind::Request, Opcode::Object, 7, 0, |b| {
        b.extend_from_slice(&[1, 2, 3])
    });
    carmine_proto::encode_request(
        &mut out,
        8,
        &Request::Ping {
            payload: Bytes::from_static(b"hi"),
        },
    );
    s.write_all(&out).unwrap();
    let mut inbuf = BytesMut::new();
    let mut replies = Vec::new();
    while replies.len() < 2 {
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).unwrap();
        assert!(n > 0, "connection closed early");
        inbuf.extend_from_slice(&chunk[..n]);
        while let Some(f) = carmine_proto::try_decode_frame(&mut inbuf).unwrap() {
            replies.push(f);
        }
    }
    assert_eq!(replies[0].header.request_id, 7);
    let err = Response::decode(&replies[0]).unwrap().unwrap_err();
    assert_eq!(err.status, Status::Malformed);
    assert_eq!(
        Response::decode(&replies[1]).unwrap().unwrap(),
        Response::Pong {
            payload: Bytes::from_static(b"hi")
        }
    );
    osd.shutdown().unwrap();
}

/// A client that vanishes halfway through a request leaves the OSD serving everyone else.
#[test]
fn client_disconnecting_mid_request_does_not_disturb_others() {
    let (osd, map) = start(1);
    let addr = map.osds[0].reactors[0];
    for cut in [5usize, 40, 1000] {
        let mut out = BytesMut::new();
        let req = Request::Object(ObjectRequest {
            pool: 1,
            pg_seed: 0,
            epoch: 1,
            client: 0,
            tid: 0,
            oid: "x".into(),
            ops: vec![OsdOp::Write {
                off: 0,
                data: Bytes::from(vec![1u8; 4096]),
            }],
        });
        carmine_proto::encode_request(&mut out, 1, &req);
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&out[..cut]).unwrap();
        drop(s);
    }
    carmine_reactor::block_on(async {
        let c = client(&map).await;
        c.write(1, "after", 0, Bytes::from_static(b"ok"))
            .await
            .unwrap();
        assert_eq!(&c.read(1, "after", 0, 0).await.unwrap()[..], b"ok");
    });
    osd.shutdown().unwrap();
}

#[test]
fn start_fails_clearly_when_the_endpoint_is_taken() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let map = OsdMap {
        epoch: 1,
        osds: vec![OsdInfo::new(
            0,
            "localhost",
            vec![taken.local_addr().unwrap()],
        )],
        pools: vec![Pool {
            id: 1,
            name: "rbd".into(),
            pg_num: 8,
            size: 1,
            min_size: 1,
        }],
        upmaps: Default::default(),
        pg_temp: Default::default(),
        pool_max: 1,
        given_copies: Default::default(),
    };
    let err = Osd::start(OsdConfig::in_memory(0, map, 1 << 20))
        .err()
        .unwrap();
    assert!(err.to_string().contains("cannot listen"), "{err}");
}

#[test]
fn connections_beyond_the_limit_are_refused_and_the_osd_keeps_serving() {
    let (osd, map) = start_with(1, 8);
    let addr = map.osds[0].reactors[0];
    let held: Vec<TcpStream> = (0..12).map(|_| TcpStream::connect(addr).unwrap()).collect();
    // The surplus ones are closed as soon as the reactor accepts them; wait for that.
    for (i, mut s) in held.iter().enumerate().skip(8) {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let r = s.read(&mut [0u8; 1]);
        assert!(
            matches!(r, Ok(0))
                || matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "connection {i} past the limit was not refused: {r:?}"
        );
    }
    // The first eight stay open: reading them just times out.
    for (i, mut s) in held.iter().enumerate().take(8) {
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let r = s.read(&mut [0u8; 1]);
        assert!(
            matches!(&r, Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)),
            "connection {i} within the limit was closed: {r:?}"
        );
    }
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    carmine_reactor::block_on(async {
        let c = client(&map).await;
        c.write(1, "after-flood", 0, Bytes::from_static(b"ok"))
            .await
            .unwrap();
    });
    osd.shutdown().unwrap();
}

#[test]
fn a_reply_too_large_for_a_frame_is_a_clear_error_and_the_connection_lives_on() {
    let (osd, map) = start(1);
    carmine_reactor::block_on(async {
        let c = client(&map).await;
        let data = Bytes::from(vec![7u8; 4 << 20]);
        c.write(1, "big", 0, data.clone()).await.unwrap();
        let addr = map.osds[0].reactors[0];
        let conn = Connection::open(addr, 4).await.unwrap();
        let pg = map.object_pg(map.pool(1).unwrap(), "big");
        // Eight 4 MiB reads in one request: 32 MiB, twice what a frame may carry.
        let req = Request::Object(ObjectRequest {
            pool: 1,
            pg_seed: pg.seed,
            epoch: 1,
            client: 0,
            tid: 0,
            oid: "big".into(),
            ops: vec![
                OsdOp::Read {
                    off: 0,
                    len: 4 << 20
                };
                8
            ],
        });
        let err = conn.call(&req).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::InvalidArgument), "{err}");
        assert!(
            err.to_string().contains("more than a frame carries"),
            "{err}"
        );
        // Same connection, a reasonable request: answered.
        let req = Request::Object(ObjectRequest {
            pool: 1,
            pg_seed: pg.seed,
            epoch: 1,
            client: 0,
            tid: 0,
            oid: "big".into(),
            ops: vec![OsdOp::Read { off: 0, len: 4096 }],
        });
        match conn.call(&req).await.unwrap() {
            Response::Object { outputs } => assert_eq!(outputs.len(), 1),
            other => panic!("unexpected {other:?}"),
        }
    });
    osd.shutdown().unwrap();
}
