//! The client against a scripted fake OSD: what it resends after a lost connection and what it
//! does not, how long it waits for an unreachable OSD, map refreshes on `WrongTarget`, fences,
//! and the client instance it sends.

use bytes::{Bytes, BytesMut};
use carmine_client::{Client, ClientConfig, ClientError};
use carmine_cluster::OsdMap;
use carmine_proto::{
    encode_error, encode_response, try_decode_frame, ErrorReply, OpOutput, OsdOp, Request,
    Response, Status,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the fake OSD does with one object or fence request.
enum Action {
    Reply(Response),
    Error(Status),
    /// Close the connection without answering: the request is in doubt.
    Hangup,
    /// Never answer anything again on this connection, and keep it open: a hung or
    /// partitioned OSD, as TCP sees it.
    Silent,
}

type Script = dyn Fn(&Request, usize) -> Action + Send + Sync;

/// Accepts connections forever on its own thread; answers `GetMap` with a one-reactor map of
/// itself and every other request as the script says. `seen` logs every request but `GetMap`.
struct FakeOsd {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Request>>>,
    /// The encoded map it answers `GetMap` with.
    map: Arc<Mutex<Bytes>>,
}

impl FakeOsd {
    fn start(script: impl Fn(&Request, usize) -> Action + Send + Sync + 'static) -> FakeOsd {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let map = Arc::new(Mutex::new(OsdMap::single_osd(vec![addr], 8).encode()));
        let seen: Arc<Mutex<Vec<Request>>> = Arc::default();
        let script: Arc<Script> = Arc::new(script);
        let log = seen.clone();
        let served = map.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let (map, log, script) = (served.clone(), log.clone(), script.clone());
                std::thread::spawn(move || serve(conn, map, log, &*script));
            }
        });
        FakeOsd { addr, seen, map }
    }

    fn set_map(&self, map: &OsdMap) {
        *self.map.lock().unwrap() = map.encode();
    }

    fn seen(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(
    mut conn: std::net::TcpStream,
    map: Arc<Mutex<Bytes>>,
    log: Arc<Mutex<Vec<Request>>>,
    script: &Script,
) {
    let mut buf = BytesMut::new();
    let mut chunk = [0u8; 64 << 10];
    loop {
        while let Some(frame) = try_decode_frame(&mut buf).expect("the client sends valid frames") {
            let id = frame.header.request_id;
            let req = Request::decode(&frame).expect("the client sends valid requests");
            let mut out = BytesMut::new();
            if matches!(req, Request::GetMap) {
                encode_response(
                    &mut out,
                    id,
                    &Response::Map {
                        encoded: map.lock().unwrap().clone(),
                    },
                );
            } else {
                let n = {
                    let mut l = log.lock().unwrap();
                    l.push(req.clone());
                    l.len() - 1
                };
                match script(&req, n) {
                    Action::Reply(r) => encode_response(&mut out, id, &r),
                    Action::Error(status) => encode_error(
                        &mut out,
                        id,
                        frame.header.opcode,
                        &ErrorReply {
                            status,
                            op_index: None,
                            message: "scripted".into(),
                        },
                    ),
                    Action::Hangup => return,
                    Action::Silent => {
                        while conn.read(&mut chunk).is_ok_and(|n| n > 0) {}
                        return;
                    }
                }
            }
            if conn.write_all(&out).is_err() {
                return;
            }
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn ok_object(n: usize) -> Response {
    Response::Object {
        outputs: vec![OpOutput::None; n],
    }
}

fn cfg(retry_timeout: Duration) -> ClientConfig {
    ClientConfig {
        retry_timeout,
        retry_backoff_min: Duration::from_millis(5),
        retry_backoff_max: Duration::from_millis(50),
        ..ClientConfig::default()
    }
}

fn object_ops(req: &Request) -> usize {
    match req {
        Request::Object(r) => r.ops.len(),
        _ => 0,
    }
}

#[test]
fn an_idempotent_write_cut_off_is_resent_on_a_new_connection() {
    // The first request is swallowed by a dying connection; the next one is answered.
    let osd = FakeOsd::start(|req, n| match n {
        0 => Action::Hangup,
        _ => Action::Reply(ok_object(object_ops(req))),
    });
    carmine_reactor::block_on(async {
        let c = Client::connect(&[osd.addr], cfg(Duration::from_secs(5)))
            .await
            .unwrap();
        c.write(1, "obj", 0, Bytes::from_static(b"data"))
            .await
            .unwrap();
    });
    let seen = osd.seen();
    assert_eq!(seen.len(), 2, "sent once, resent once");
    assert_eq!(seen[0], seen[1], "the resend is the same request");
}

#[test]
fn an_exclusive_create_in_doubt_goes_back_to_the_caller_unsent_twice() {
    let osd = FakeOsd::start(|_, _| Action::Hangup);
    carmine_reactor::block_on(async {
        let c = Client::connect(&[osd.addr], cfg(Duration::from_secs(5)))
            .await
            .unwrap();
        let err = c
            .execute(
                1,
                "obj",
                vec![
                    OsdOp::Create { exclusive: true },
                    OsdOp::WriteFull {
                        data: Bytes::from_static(b"x"),
                    },
                ],
            )
            .await
            .unwrap_err();
        assert!(err.in_doubt(), "{err}");
        // A compare-and-set is not resent either: its second pass would fail on its own
        // first pass's change.
        let err = c
            .execute(
                1,
                "obj",
                vec![
                    OsdOp::CmpXattr {
                        name: "lock".into(),
                        value: None,
                    },
                    OsdOp::SetXattr {
                        name: "lock".into(),
                        value: Bytes::from_static(b"me"),
                    },
                ],
            )
            .await
            .unwrap_err();
        assert!(err.in_doubt(), "{err}");
    });
    assert_eq!(osd.seen().len(), 2, "each sent exactly once");
}

#[test]
fn an_unreachable_osd_is_retried_until_the_retry_timeout_then_reported() {
    carmine_reactor::block_on(async {
        // Nobody listens there: connecting fails instead of hanging.
        let dead: SocketAddr = carmine_testkit::free_addr();
        let lonely = Client::connect(&[dead], cfg(Duration::from_millis(400))).await;
        assert!(lonely.is_err(), "connected to a closed port");
    });
    // The first request is answered, then every connection hangs up on its request, as an
    // OSD that keeps crashing would.
    let osd = FakeOsd::start(|_, n| {
        if n == 0 {
            Action::Reply(ok_object(1))
        } else {
            Action::Hangup
        }
    });
    carmine_reactor::block_on(async {
        let c = Client::connect(&[osd.addr], cfg(Duration::from_millis(400)))
            .await
            .unwrap();
        c.write(1, "obj", 0, Bytes::from_static(b"x"))
            .await
            .unwrap();
        let t = Instant::now();
        let err = c.read(1, "obj", 0, 1).await.unwrap_err();
        let waited = t.elapsed();
        assert!(
            matches!(err, ClientError::Unavailable { .. }),
            "expected Unavailable, got {err}"
        );
        assert!(
            waited >= Duration::from_millis(400) && waited < Duration::from_secs(5),
            "gave up after {waited:?}"
        );
    });
    assert!(
        osd.seen().len() > 2,
        "the read was retried: {}",
        osd.seen().len()
    );
}

#[test]
fn wrong_target_refreshes_the_map_and_retries_a_bounded_number_of_times() {
    let osd = FakeOsd::start(|req, n| match n {
        0 => Action::Error(Status::WrongTarget),
        _ => Action::Reply(ok_object(object_ops(req))),
    });
    let stubborn = FakeOsd::start(|_, _| Action::Error(Status::WrongTarget));
    carmine_reactor::block_on(async {
        let c = Client::connect(&[osd.addr], ClientConfig::default())
            .await
            .unwrap();
        c.write(1, "obj", 0, Bytes::from_static(b"x"))
            .await
            .unwrap();
        let c = Client::connect(&[stubborn.addr], ClientConfig::default())
            .await
            .unwrap();
        let err = c
            .write(1, "obj", 0, Bytes::from_static(b"x"))
            .await
            .unwrap_err();
        assert_eq!(err.status(), Some(Status::WrongTarget));
    });
    assert_eq!(osd.seen().len(), 2);
    let retries = ClientConfig::default().retries_max as usize;
    assert_eq!(stubborn.seen().len(), retries + 1, "bounded retries");
}

#[test]
fn requests_carry_the_client_instance_and_fences_name_it() {
    let osd = FakeOsd::start(|req, _| match req {
        Request::Fence { .. } => Action::Reply(Response::Fenced),
        other => Action::Reply(ok_object(object_ops(other))),
    });
    let (a_id, b_id) = carmine_reactor::block_on(async {
        let a = Client::connect(&[osd.addr], ClientConfig::default())
            .await
            .unwrap();
        let b = Client::connect(&[osd.addr], ClientConfig::default())
            .await
            .unwrap();
        assert_ne!(a.instance(), 0, "0 is the anonymous client");
        assert_ne!(a.instance(), b.instance());
        a.write(1, "obj", 0, Bytes::from_static(b"x"))
            .await
            .unwrap();
        b.fence(a.instance()).await.unwrap();
        (a.instance(), b.instance())
    });
    let seen = osd.seen();
    match &seen[..] {
        [Request::Object(w), Request::Fence { client }] => {
            assert_eq!(w.client, a_id);
            assert_eq!(*client, a_id);
            assert_ne!(*client, b_id);
        }
        other => panic!("unexpected requests {other:?}"),
    }
}

/// Clients of one process's reactor threads speaking as one instance (one image lock, one
/// fence) must still never send two requests with the same id: an OSD would answer the
/// second from its log as a retry of the first, and never apply it.
#[test]
fn clients_sharing_an_instance_number_their_requests_apart() {
    use carmine_client::SharedInstance;
    let osd = FakeOsd::start(|req, _| Action::Reply(ok_object(object_ops(req))));
    carmine_reactor::block_on(async {
        let shared = |lane| ClientConfig {
            instance: Some(SharedInstance { id: 0x77, lane }),
            ..ClientConfig::default()
        };
        let a = Client::connect(&[osd.addr], shared(0)).await.unwrap();
        let b = Client::connect(&[osd.addr], shared(1)).await.unwrap();
        assert_eq!((a.instance(), b.instance()), (0x77, 0x77));
        for c in [&a, &b, &a, &b] {
            c.write(1, "obj", 0, Bytes::from_static(b"x"))
                .await
                .unwrap();
        }
        let anonymous = ClientConfig {
            instance: Some(SharedInstance { id: 0, lane: 2 }),
            ..ClientConfig::default()
        };
        assert!(Client::connect(&[osd.addr], anonymous).await.is_err());
    });
    let ids: Vec<(u64, u64)> = osd
        .seen()
        .iter()
        .filter_map(|r| match r {
            Request::Object(w) => Some((w.client, w.tid)),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 4);
    let unique: std::collections::BTreeSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), 4, "request ids repeated: {ids:?}");
}

#[test]
fn a_fence_that_an_osd_refuses_fails() {
    let osd = FakeOsd::start(|_, _| Action::Error(Status::Busy));
    carmine_reactor::block_on(async {
        let c = Client::connect(&[osd.addr], ClientConfig::default())
            .await
            .unwrap();
        let err = c.fence(42).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::Busy));
    });
}

#[test]
fn a_request_to_an_osd_gone_silent_fails_over_once_the_map_marks_it_down() {
    // osd.0 takes the write and never answers; the cluster then marks it down and osd.1
    // takes its PGs. The client must not wait on the silent connection for TCP to give up.
    let silent = FakeOsd::start(|_, _| Action::Silent);
    let heir = FakeOsd::start(|req, _| Action::Reply(ok_object(object_ops(req))));
    let mut moved = OsdMap::single_osd(vec![heir.addr], 8);
    moved.epoch = 2;
    moved.osds[0].id = 1;
    let mut gone = moved.osds[0].clone();
    gone.id = 0;
    gone.up = false;
    gone.reactors = vec![silent.addr];
    moved.osds.insert(0, gone);
    let waited = carmine_reactor::block_on(async {
        let c = Client::connect(&[silent.addr, heir.addr], cfg(Duration::from_secs(30)))
            .await
            .unwrap();
        silent.set_map(&moved);
        heir.set_map(&moved);
        let t = Instant::now();
        carmine_reactor::timeout(
            Duration::from_secs(10),
            c.write(1, "obj", 0, Bytes::from_static(b"x")),
        )
        .await
        .expect("the write waited on the silent OSD")
        .unwrap();
        t.elapsed()
    });
    assert_eq!(silent.seen().len(), 1, "sent to the silent OSD once");
    assert_eq!(heir.seen().len(), 1, "then to the new primary");
    match (&silent.seen()[0], &heir.seen()[0]) {
        (Request::Object(a), Request::Object(b)) => {
            assert_eq!((a.client, a.tid), (b.client, b.tid), "the same request");
            assert_eq!(b.epoch, 2, "routed by the new map");
        }
        other => panic!("unexpected requests {other:?}"),
    }
    // A tick to notice, a connect timeout for the probe: about 2 s.
    assert!(
        waited < Duration::from_secs(5),
        "failed over after {waited:?}"
    );
}

#[test]
fn a_connection_silent_for_the_retry_timeout_is_given_up() {
    let silent = FakeOsd::start(|_, _| Action::Silent);
    let (err, waited) = carmine_reactor::block_on(async {
        let c = Client::connect(&[silent.addr], cfg(Duration::from_secs(1)))
            .await
            .unwrap();
        let t = Instant::now();
        let err = carmine_reactor::timeout(Duration::from_secs(10), c.read(1, "obj", 0, 1))
            .await
            .expect("the read waited forever on a silent OSD")
            .unwrap_err();
        (err, t.elapsed())
    });
    assert!(
        matches!(err, ClientError::TimedOut { .. }) && err.in_doubt(),
        "expected TimedOut, got {err}"
    );
    assert_eq!(
        silent.seen().len(),
        1,
        "not resent: it may still be applied there"
    );
    // A tick to notice, the probe: about 2 s (without the watchdog: never).
    assert!(waited < Duration::from_secs(8), "gave up after {waited:?}");
}
