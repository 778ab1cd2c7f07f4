//! Map epochs at run time: a running OSD takes newer maps, serves the PGs they give it and
//! stops serving those they take away, and never serves a client at a newer epoch by its
//! older one.

use bytes::Bytes;
use carmine_client::{Client, ClientConfig, Connection};
use carmine_cluster::{OsdInfo, OsdMap, Pool};
use carmine_osd::{Osd, OsdConfig, StoreConfig};
use carmine_proto::{ObjectRequest, OsdOp, Request, Response, Status};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn free_addr() -> SocketAddr {
    carmine_testkit::free_addr()
}

/// osd.0 (running here) and osd.1 (only in the map), one reactor each.
fn two_osd_map() -> OsdMap {
    OsdMap {
        epoch: 1,
        osds: vec![
            OsdInfo::new(0, "a", vec![free_addr()]),
            OsdInfo::new(1, "b", vec![free_addr()]),
        ],
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
    }
}

fn start(map: &OsdMap) -> Osd {
    Osd::start(OsdConfig::in_memory(0, map.clone(), 64 << 20)).unwrap()
}

/// An object whose PG is placed on `osd` in `map`.
fn object_on(map: &OsdMap, osd: u32) -> (String, u32) {
    let pool = &map.pools[0];
    (0..)
        .map(|i| format!("o{i}"))
        .map(|o| (o.clone(), map.object_pg(pool, &o)))
        .find(|(_, pg)| map.pg_placement(*pg, 1)[0] == osd)
        .map(|(o, pg)| (o, pg.seed))
        .unwrap()
}

fn stat(oid: &str, seed: u32, epoch: u32) -> Request {
    Request::Object(ObjectRequest {
        pool: 1,
        pg_seed: seed,
        epoch,
        client: 0,
        tid: 0,
        oid: oid.into(),
        ops: vec![OsdOp::Stat],
    })
}

async fn served_epoch(conn: &Connection) -> u32 {
    match conn.call(&Request::GetMap).await.unwrap() {
        Response::Map { encoded } => OsdMap::decode(encoded).unwrap().epoch,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_running_osd_takes_the_pgs_a_newer_map_gives_it_and_drops_those_it_takes() {
    let map1 = two_osd_map();
    let mut osd = start(&map1);
    let addr = map1.osds[0].reactors[0];
    let (theirs, theirs_seed) = object_on(&map1, 1);
    let (mine, mine_seed) = object_on(&map1, 0);
    // Epoch 2: osd.1 is out, so its PGs are osd.0's.
    let mut map2 = map1.clone();
    map2.epoch = 2;
    map2.osds[1].in_ = false;
    map2.osds[1].up = false;
    carmine_reactor::block_on(async {
        let conn = Connection::open(addr, 4).await.unwrap();
        let err = conn.call(&stat(&theirs, theirs_seed, 1)).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::WrongTarget));
        assert_eq!(served_epoch(&conn).await, 1);
    });
    osd.apply_map(map2.clone()).unwrap();
    assert_eq!(osd.epoch(), 2);
    carmine_reactor::block_on(async {
        let conn = Connection::open(addr, 4).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(2);
        while served_epoch(&conn).await < 2 {
            assert!(Instant::now() < deadline, "the reactor never took epoch 2");
            carmine_reactor::sleep(Duration::from_millis(5)).await;
        }
        // The gained PG is served (its collection was created): the object is absent, not
        // a wrong target.
        let err = conn.call(&stat(&theirs, theirs_seed, 2)).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::ObjectNotFound), "{err}");
        // A client routing by the newer map writes and reads through it.
        let c = Client::connect(&[addr], ClientConfig::default())
            .await
            .unwrap();
        assert_eq!(c.map().epoch, 2);
        c.write(1, &theirs, 0, Bytes::from_static(b"moved"))
            .await
            .unwrap();
        assert_eq!(c.read(1, &theirs, 0, 0).await.unwrap(), &b"moved"[..]);
        c.write(1, &mine, 0, Bytes::from_static(b"stays"))
            .await
            .unwrap();
    });
    // Epoch 3: osd.1 is back in; the PG goes back to it and osd.0 stops serving it.
    let mut map3 = map2.clone();
    map3.epoch = 3;
    map3.osds[1].in_ = true;
    map3.osds[1].up = true;
    osd.apply_map(map3).unwrap();
    // An older map than the one it has is ignored.
    osd.apply_map(map1.clone()).unwrap();
    assert_eq!(osd.epoch(), 3);
    carmine_reactor::block_on(async {
        let conn = Connection::open(addr, 4).await.unwrap();
        let err = conn.call(&stat(&theirs, theirs_seed, 3)).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::WrongTarget), "{err}");
        let ok = conn.call(&stat(&mine, mine_seed, 3)).await.unwrap();
        assert!(matches!(ok, Response::Object { .. }));
    });
    osd.shutdown().unwrap();
}

#[test]
fn a_request_from_a_newer_epoch_waits_for_the_reactor_to_catch_up() {
    let map1 = two_osd_map();
    let mut osd = start(&map1);
    let addr = map1.osds[0].reactors[0];
    let (mine, seed) = object_on(&map1, 0);
    // Nobody hands it epoch 2: the request is refused after the wait, never served by the
    // older epoch.
    let started = Instant::now();
    carmine_reactor::block_on(async {
        let conn = Connection::open(addr, 4).await.unwrap();
        let err = conn.call(&stat(&mine, seed, 2)).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::WrongTarget));
        assert!(err.to_string().contains("behind the client's 2"), "{err}");
    });
    assert!(started.elapsed() >= Duration::from_secs(1), "it did wait");
    // Epoch 2 takes osd.0's PG away; it arrives while the request waits: the request is
    // answered by epoch 2 (wrong target), not by epoch 1 (served).
    let mut map2 = map1.clone();
    map2.epoch = 2;
    map2.osds[0].in_ = false;
    let handed = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        osd.apply_map(map2).unwrap();
        osd
    });
    carmine_reactor::block_on(async {
        let conn = Connection::open(addr, 4).await.unwrap();
        let t = Instant::now();
        let err = conn.call(&stat(&mine, seed, 2)).await.unwrap_err();
        assert_eq!(err.status(), Some(Status::WrongTarget));
        assert!(err.to_string().contains("at epoch 2"), "{err}");
        assert!(
            t.elapsed() < Duration::from_millis(1500),
            "{:?}",
            t.elapsed()
        );
    });
    handed.join().unwrap().shutdown().unwrap();
}

/// Pipelined writes to one object, the first half sent while the reactor is behind the
/// client's epoch, the second just after it catches up: they apply in the order they were
/// sent, so the object ends with the last one (native store: requests run concurrently).
#[test]
fn writes_waiting_for_an_epoch_apply_in_the_order_they_were_sent() {
    use carmine_nativestore::{FileDevice, NativeConfig, SyncMode};
    let device = std::env::temp_dir().join(format!("carmine-epochs-{}", std::process::id()));
    let f = std::fs::File::create(&device).unwrap();
    f.set_len(512 << 20).unwrap();
    drop(f);
    carmine_reactor::block_on(async {
        let dev = FileDevice::open(&device, SyncMode::ProcessCrashOnly)
            .await
            .unwrap();
        carmine_nativestore::mkfs(&dev, 1, 32 << 20).await.unwrap();
    });
    let addr = free_addr();
    let map1 = OsdMap::single_osd(vec![addr], 8);
    let mut osd = Osd::start(OsdConfig {
        store: StoreConfig::Native {
            device: device.clone(),
            config: NativeConfig::default(),
            sync: SyncMode::ProcessCrashOnly,
        },
        ..OsdConfig::in_memory(0, map1.clone(), 0)
    })
    .unwrap();
    let pg = map1.object_pg(&map1.pools[0], "o");
    let write = |i: u32| {
        Request::Object(ObjectRequest {
            pool: 1,
            pg_seed: pg.seed,
            epoch: 2,
            client: 0,
            tid: 0,
            oid: "o".into(),
            ops: vec![OsdOp::Write {
                off: 0,
                data: Bytes::from(i.to_le_bytes().to_vec()),
            }],
        })
    };
    let mut map2 = map1.clone();
    map2.epoch = 2;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let handed = std::thread::spawn(move || {
        rx.recv().unwrap();
        osd.apply_map(map2).unwrap();
        osd
    });
    carmine_reactor::block_on(async {
        let conn = Connection::open(addr, 256).await.unwrap();
        // The first 32 wait for epoch 2.
        let reqs_a: Vec<Request> = (0..32).map(write).collect();
        let reqs_b: Vec<Request> = (32..64).map(write).collect();
        let first: Vec<_> = reqs_a.iter().map(|r| conn.call(r)).collect();
        let first = futures::future::join_all(first);
        let second = async {
            carmine_reactor::sleep(Duration::from_millis(100)).await;
            tx.send(()).unwrap();
            // Until the reactor has epoch 2, then at once the next 32.
            let probe = Connection::open(addr, 1).await.unwrap();
            while served_epoch(&probe).await < 2 {
                carmine_reactor::sleep(Duration::from_micros(200)).await;
            }
            futures::future::join_all(reqs_b.iter().map(|r| conn.call(r))).await
        };
        let (a, b) = futures::join!(first, second);
        for r in a.into_iter().chain(b) {
            assert!(matches!(r, Ok(Response::Object { .. })), "{r:?}");
        }
        let read = Request::Object(ObjectRequest {
            pool: 1,
            pg_seed: pg.seed,
            epoch: 2,
            client: 0,
            tid: 0,
            oid: "o".into(),
            ops: vec![OsdOp::Read { off: 0, len: 4 }],
        });
        match conn.call(&read).await.unwrap() {
            Response::Object { outputs } => match &outputs[..] {
                [carmine_proto::OpOutput::Data(d)] => {
                    assert_eq!(
                        u32::from_le_bytes(d[..4].try_into().unwrap()),
                        63,
                        "the last write must win"
                    )
                }
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    });
    handed.join().unwrap().shutdown().unwrap();
    let _ = std::fs::remove_file(&device);
}
