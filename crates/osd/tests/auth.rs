//! Authentication on an OSD with a cluster key: only peers that prove they hold the key get
//! a request read, a client never talks to an OSD that cannot prove it holds the key, and a
//! recorded handshake is worth nothing on another connection.

use bytes::{Bytes, BytesMut};
use carmine_client::{Client, ClientConfig, ClientError, Connection};
use carmine_cluster::OsdMap;
use carmine_osd::{Osd, OsdConfig};
use carmine_proto::auth::{decode_proof, encode_proof, AuthKey, Challenge, Hello};
use carmine_proto::{
    encode_frame, encode_request, try_decode_frame, Frame, FrameKind, Opcode, Request, Response,
    Status,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

fn key(b: u8) -> AuthKey {
    AuthKey::from_bytes([b; 32])
}

fn start(auth: Option<AuthKey>) -> (Osd, SocketAddr) {
    let addr = carmine_testkit::free_addr();
    let osd = Osd::start(OsdConfig {
        auth_key: auth,
        ..OsdConfig::in_memory(0, OsdMap::single_osd(vec![addr], 8), 64 << 20)
    })
    .unwrap();
    (osd, addr)
}

fn with_key(k: Option<AuthKey>) -> ClientConfig {
    ClientConfig {
        key: k,
        retry_timeout: std::time::Duration::ZERO,
        ..ClientConfig::default()
    }
}

/// A peer speaking frames over a plain socket, to do what a real client would not.
struct Raw {
    s: TcpStream,
    rbuf: BytesMut,
}

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        Raw {
            s,
            rbuf: BytesMut::new(),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    /// The next frame, or `None` once the server closed the connection.
    fn recv(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) = try_decode_frame(&mut self.rbuf).unwrap() {
                return Some(f);
            }
            let mut buf = [0u8; 4096];
            match self.s.read(&mut buf) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.rbuf.extend_from_slice(&buf[..n]),
            }
        }
    }

    fn closed(&mut self) -> bool {
        self.recv().is_none()
    }
}

fn auth_frame(id: u64, body: impl FnOnce(&mut BytesMut)) -> BytesMut {
    let mut out = BytesMut::new();
    encode_frame(&mut out, FrameKind::Request, Opcode::Auth, id, 0, body);
    out
}

fn hello_frame(nonce: [u8; 32]) -> (Hello, BytesMut) {
    let h = Hello {
        nonce,
        entity: "client.admin".into(),
    };
    let f = auth_frame(1, |b| h.encode(b));
    (h, f)
}

fn error_status(f: &Frame) -> (Status, String) {
    match Response::decode(f).unwrap() {
        Err(e) => (e.status, e.message),
        Ok(r) => panic!("expected an error, got {r:?}"),
    }
}

#[test]
fn a_client_with_the_key_works_and_one_without_is_refused_before_any_request() {
    let (osd, addr) = start(Some(key(1)));
    carmine_reactor::block_on(async {
        let c = Client::connect(&[addr], with_key(Some(key(1))))
            .await
            .unwrap();
        c.write(1, "o", 0, Bytes::from_static(b"secret"))
            .await
            .unwrap();
        assert_eq!(c.read(1, "o", 0, 0).await.unwrap(), &b"secret"[..]);

        // No key: its first request is answered AuthFailed, and nothing is read after it.
        let conn = Connection::open(addr, 4).await.unwrap();
        let err = conn.call(&Request::GetMap).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::AuthFailed), "{err}");
        assert!(err.to_string().contains("authentication required"), "{err}");
        assert!(conn.call(&Request::GetMap).await.is_err(), "still open");

        // A wrong key: the client finds out first (the OSD's proof does not match).
        match Client::connect(&[addr], with_key(Some(key(2)))).await {
            Err(ClientError::Auth { detail, .. }) => {
                assert!(
                    detail.contains("does not match the cluster key"),
                    "{detail}"
                )
            }
            other => panic!("a wrong key must fail the handshake: {:?}", other.err()),
        }
    });
    osd.shutdown().unwrap();
}

#[test]
fn a_wrong_proof_and_a_replayed_handshake_are_refused_by_the_osd() {
    let (osd, addr) = start(Some(key(1)));
    // A peer with the wrong key, that does not care about the OSD's proof.
    let mut raw = Raw::connect(addr);
    let (hello, frame) = hello_frame([3; 32]);
    raw.send(&frame);
    let ch = Challenge::decode(raw.recv().unwrap().payload).unwrap();
    let wrong = key(2).client_proof(&hello.nonce, &ch.nonce, &hello.entity);
    raw.send(&auth_frame(2, |b| encode_proof(b, &wrong)));
    let (status, msg) = error_status(&raw.recv().unwrap());
    assert_eq!(status, Status::AuthFailed);
    assert!(msg.contains("wrong key"), "{msg}");
    assert!(raw.closed());

    // A genuine handshake, recorded...
    let mut raw = Raw::connect(addr);
    let (hello, hello_bytes) = hello_frame([4; 32]);
    raw.send(&hello_bytes);
    let ch = Challenge::decode(raw.recv().unwrap().payload).unwrap();
    assert!(key(1).verify(true, &hello.nonce, &ch.nonce, &hello.entity, &ch.proof));
    let proof = key(1).client_proof(&hello.nonce, &ch.nonce, &hello.entity);
    let proof_bytes = auth_frame(2, |b| encode_proof(b, &proof));
    assert_eq!(
        decode_proof(proof_bytes.clone().freeze().slice(32..)).unwrap(),
        proof
    );
    raw.send(&proof_bytes);
    let done = raw.recv().unwrap();
    assert_eq!(done.header.status, 0, "the genuine handshake passes");
    let mut req = BytesMut::new();
    encode_request(&mut req, 7, &Request::GetMap);
    raw.send(&req);
    assert!(matches!(
        Response::decode(&raw.recv().unwrap()).unwrap(),
        Ok(Response::Map { .. })
    ));

    // ...and replayed byte for byte on a new connection: the OSD's new nonce makes the old
    // proof worthless.
    let mut replay = Raw::connect(addr);
    replay.send(&hello_bytes);
    let ch2 = Challenge::decode(replay.recv().unwrap().payload).unwrap();
    assert_ne!(ch2.nonce, ch.nonce, "every connection gets a fresh nonce");
    replay.send(&proof_bytes);
    let (status, _) = error_status(&replay.recv().unwrap());
    assert_eq!(status, Status::AuthFailed);
    assert!(replay.closed());

    // A request header announcing a large write, without a handshake: refused by its header,
    // at once, without waiting for (or buffering) the payload it announces.
    let mut big = Raw::connect(addr);
    let mut frame = BytesMut::new();
    encode_request(
        &mut frame,
        9,
        &Request::Object(carmine_proto::ObjectRequest {
            pool: 1,
            pg_seed: 0,
            epoch: 1,
            client: 0,
            tid: 0,
            oid: "o".into(),
            ops: vec![carmine_proto::OsdOp::Write {
                off: 0,
                data: Bytes::from(vec![0u8; 1 << 20]),
            }],
        }),
    );
    big.send(&frame[..4096]);
    let f = big.recv().expect("an answer before the payload arrived");
    assert_eq!(f.header.request_id, 9);
    let (status, msg) = error_status(&f);
    assert_eq!(status, Status::AuthFailed);
    assert!(msg.contains("authentication required"), "{msg}");
    assert!(big.closed());

    // Garbage instead of a handshake: one error, then closed.
    let mut junk = Raw::connect(addr);
    junk.send(&auth_frame(1, |b| b.extend_from_slice(b"not a hello")));
    let (status, _) = error_status(&junk.recv().unwrap());
    assert_eq!(status, Status::AuthFailed);
    assert!(junk.closed());
    osd.shutdown().unwrap();
}

#[test]
fn a_client_with_a_key_refuses_an_osd_without_one() {
    let (osd, addr) = start(None);
    carmine_reactor::block_on(async {
        match Client::connect(&[addr], with_key(Some(key(1)))).await {
            Err(ClientError::Auth { detail, .. }) => {
                assert!(detail.contains("authentication messages"), "{detail}")
            }
            other => panic!(
                "must refuse an OSD that cannot prove the key: {:?}",
                other.err()
            ),
        }
        // Without a key both sides are as before.
        let c = Client::connect(&[addr], with_key(None)).await.unwrap();
        c.write(1, "o", 0, Bytes::from_static(b"x")).await.unwrap();
    });
    osd.shutdown().unwrap();
}

#[test]
fn silent_peers_cannot_hold_more_than_a_few_handshake_slots() {
    let (osd, addr) = start(Some(key(1)));
    // 64 peers connect and say nothing.
    let silent: Vec<Raw> = (0..64).map(|_| Raw::connect(addr)).collect();
    std::thread::sleep(std::time::Duration::from_millis(200));
    // The next one is closed at once, not kept for the handshake's timeout.
    let started = std::time::Instant::now();
    let mut extra = Raw::connect(addr);
    extra.send(&hello_frame([5; 32]).1);
    assert!(extra.closed());
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    // Once they go, a client with the key gets in.
    drop(silent);
    std::thread::sleep(std::time::Duration::from_millis(200));
    carmine_reactor::block_on(async {
        let c = Client::connect(&[addr], with_key(Some(key(1))))
            .await
            .unwrap();
        c.write(1, "o", 0, Bytes::from_static(b"in")).await.unwrap();
    });
    osd.shutdown().unwrap();
}

#[test]
fn requests_to_an_osd_with_another_key_fail_as_authentication_errors_at_once() {
    // osd.0 has the client's key, osd.1 another one (a misconfigured OSD).
    let addrs: Vec<SocketAddr> = (0..2).map(|_| carmine_testkit::free_addr()).collect();
    let map = OsdMap {
        epoch: 1,
        osds: (0..2)
            .map(|id| {
                carmine_cluster::OsdInfo::new(id, &format!("h{id}"), vec![addrs[id as usize]])
            })
            .collect(),
        pools: vec![carmine_cluster::Pool {
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
    let osds: Vec<Osd> = (0..2)
        .map(|id| {
            Osd::start(OsdConfig {
                auth_key: Some(key(1 + id as u8)),
                ..OsdConfig::in_memory(id, map.clone(), 64 << 20)
            })
            .unwrap()
        })
        .collect();
    let on_osd1: Vec<String> = (0..)
        .map(|i| format!("o{i}"))
        .filter(|o| {
            let pg = map.object_pg(&map.pools[0], o);
            map.pg_primary(pg).unwrap().0 == 1
        })
        .take(8)
        .collect();
    carmine_reactor::block_on(async {
        let cfg = ClientConfig {
            key: Some(key(1)),
            retry_timeout: std::time::Duration::from_secs(30),
            ..ClientConfig::default()
        };
        let c = Client::connect(&addrs[..1], cfg).await.unwrap();
        let started = std::time::Instant::now();
        let results = futures::future::join_all(
            on_osd1
                .iter()
                .map(|o| c.write(1, o, 0, Bytes::from_static(b"x"))),
        )
        .await;
        for r in results {
            assert!(matches!(r, Err(ClientError::Auth { .. })), "{r:?}");
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "retried as if the OSD were down: {:?}",
            started.elapsed()
        );
    });
    for o in osds {
        o.shutdown().unwrap();
    }
}
