//! Replicated pools on OSDs in this process: writes reach every copy before they are
//! acknowledged, a PG goes on with one OSD gone, refuses writes below `min_size`, an OSD
//! that comes back empty is filled from the others in the background while its PGs serve
//! (objects a client waits for first), and scrubs find copies that differ, which repairs
//! rewrite.

use bytes::Bytes;
use carmine_client::{Client, ClientError};
use carmine_cluster::OsdMap;
use carmine_mapstore::LocalPgHistory;
use carmine_osd::{Osd, OsdConfig, RecoveryConfig, ScrubSchedule};
use carmine_pg::envelope::{Body, ObjectCopy, PeerMessage};
use carmine_pg::Version;
use carmine_proto::auth::AuthKey;
use carmine_proto::{encode_frame, FrameKind, Opcode};
use carmine_proto::{OpOutput, OsdOp, ScrubMode, Status};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::*;

#[test]
fn copies_survive_the_loss_of_osds_and_an_empty_osd_is_filled_again() {
    log_if_asked();
    let _serial = one_at_a_time();
    let dir = TempDir::new("replication");
    let mut map = three_osd_map(2);
    let mut osds: Vec<Option<Osd>> = (0..3).map(|id| Some(start(id, &map, dir.path()))).collect();
    const N: usize = 24;
    wait_settled(&map, dir.path());
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..N {
            write(&c, i, 1).await.unwrap();
        }
        for i in 0..N {
            check(&c, i, 1).await;
        }
    });

    // osd.0 goes away with its memory: every PG goes on with the other two copies.
    osds[0].take().unwrap().shutdown().unwrap();
    next(&mut map, |m| m.osds[0].up = false);
    publish(&mut osds, &map, dir.path());
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..N {
            check(&c, i, 1).await;
        }
        // Degraded writes: two copies, min_size 2.
        for i in 0..N / 2 {
            write(&c, i, 2).await.unwrap();
        }
    });

    // osd.0 comes back empty (a new disk): it is filled (the PGs settle once it is).
    osds[0] = Some(start(0, &map, dir.path()));
    next(&mut map, |m| m.osds[0].up = true);
    publish(&mut osds, &map, dir.path());
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..N {
            check(&c, i, if i < N / 2 { 2 } else { 1 }).await;
        }
        for i in N / 2..N {
            write(&c, i, 3).await.unwrap();
        }
    });

    // osd.1 goes: two copies left.
    osds[1].take().unwrap().shutdown().unwrap();
    next(&mut map, |m| m.osds[1].up = false);
    publish(&mut osds, &map, dir.path());
    let expected = |i: usize| if i < N / 2 { 2 } else { 3 };
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..N {
            check(&c, i, expected(i)).await;
        }
    });

    // osd.2 goes too: one copy is below min_size, so writes wait and then fail; nothing is
    // accepted with one copy. (A write in flight when the epoch changed would be in doubt:
    // applied on some copies maybe, and found by its retry. This one comes after.)
    osds[2].take().unwrap().shutdown().unwrap();
    next(&mut map, |m| m.osds[2].up = false);
    publish(&mut osds, &map, dir.path());
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_millis(800)).await;
        let err = write(&c, 0, 9).await.unwrap_err();
        assert!(
            matches!(&err, ClientError::Unavailable { last, .. } if last.status() == Some(Status::PgInactive)),
            "{err}"
        );
    });

    // With min_size 1, osd.0 alone serves: it holds every write, those it missed while it was
    // away included — recovery filled it.
    next(&mut map, |m| m.pools[0].min_size = 1);
    publish(&mut osds, &map, dir.path());
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..N {
            check(&c, i, expected(i)).await;
        }
    });
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}

/// Hands `msg` to the reactor at `addr` over a connection authenticated as `entity`: how the
/// test changes a copy behind its PG's back (as `osd.N`, the primary), or tries to.
async fn forge(addr: SocketAddr, key: &AuthKey, entity: &str, msg: &PeerMessage) {
    let mut frame = bytes::BytesMut::new();
    encode_frame(&mut frame, FrameKind::Request, Opcode::Peer, 1, 0, |b| {
        msg.encode(b)
    });
    let mut s = carmine_reactor::TcpStream::connect(addr).await.unwrap();
    carmine_client::handshake_as(&mut s, addr, key, entity)
        .await
        .unwrap();
    let (res, _) = carmine_reactor::io::write_all(&mut s, frame).await;
    res.unwrap();
}

#[test]
fn scrub_finds_copies_changed_behind_the_pgs_back_and_repair_rewrites_them() {
    let _serial = one_at_a_time();
    let dir = TempDir::new("scrub");
    let map = three_osd_map(1);
    let key = AuthKey::from_bytes([7; 32]);
    let mut osds: Vec<Osd> = (0..3)
        .map(|id| start_keyed(id, &map, dir.path(), Some(key.clone())))
        .collect();
    wait_settled(&map, dir.path());
    const N: usize = 16;
    let pool = &map.pools[0];
    let placed = |oid: &str| {
        let pg = map.object_pg(pool, oid);
        let acting = map.pg_osds(pg, pool.size);
        (pg, acting[0], acting[1])
    };
    let reactor = |osd: u32| map.osd(osd).unwrap().reactors[0];
    let push = |oid: &str, pg, from, version, copy| PeerMessage {
        from,
        from_inc: 1,
        to_inc: 0,
        pg,
        body: Body::Push {
            epoch: map.epoch,
            token: 1,
            oid: oid.into(),
            version,
            copy,
        },
    };
    carmine_reactor::block_on(async {
        let c = keyed_client(&map, Duration::from_secs(20), Some(key.clone())).await;
        for i in 0..N {
            write(&c, i, 1).await.unwrap();
        }
        // Clean to begin with; a deep scrub counts every object once.
        let mut objects = 0;
        for seed in 0..pool.pg_num {
            for mode in [ScrubMode::Light, ScrubMode::Deep] {
                let r = c.scrub(1, seed, mode).await.unwrap();
                assert_eq!((r.findings_total, r.acting.len()), (0, 3), "{r:#?}");
                objects += r.objects * (mode == ScrubMode::Deep) as u64;
            }
        }
        assert_eq!(objects, N as u64);

        // A replica's obj3 becomes another write's copy: the scrub names the version it
        // should have.
        let (pg3, primary3, replica3) = placed("obj3");
        let copy = |data: Bytes| {
            Some(ObjectCopy {
                data,
                ..Default::default()
            })
        };
        let stale = push(
            "obj3",
            pg3,
            primary3,
            Version::new(1, 999),
            copy(data(3, 7)),
        );
        // Neither a client nor another OSD may speak for the primary.
        let other = (0..3).find(|o| *o != primary3 && *o != replica3).unwrap();
        forge(reactor(replica3), &key, "client.admin", &stale).await;
        forge(reactor(replica3), &key, &format!("osd.{other}"), &stale).await;
        carmine_reactor::sleep(Duration::from_millis(300)).await;
        let r = c.scrub(1, pg3.seed, ScrubMode::Deep).await.unwrap();
        assert_eq!(r.findings_total, 0, "a forged push was taken: {r:#?}");
        let as_primary = format!("osd.{primary3}");
        forge(reactor(replica3), &key, &as_primary, &stale).await;
        let r = findings(&c, pg3.seed, 1).await;
        let f = &r.findings[0];
        assert_eq!((f.oid.as_str(), f.osd), ("obj3", replica3));
        let want = f.what.rsplit("want ").next().unwrap();
        let want: Version = want.parse().expect(&f.what);

        // Now the right version with one byte flipped: only a deep scrub sees it. And a
        // stray object beside it.
        let mut bad = data(3, 1).to_vec();
        bad[100] ^= 1;
        let flipped = push("obj3", pg3, primary3, want, copy(bad.into()));
        forge(reactor(replica3), &key, &as_primary, &flipped).await;
        let stray = push("stray", pg3, primary3, want, copy(Bytes::from_static(b"x")));
        forge(reactor(replica3), &key, &as_primary, &stray).await;
        let r = findings(&c, pg3.seed, 2).await;
        let mut what: Vec<(&str, &str)> = r
            .findings
            .iter()
            .map(|f| (f.oid.as_str(), f.what.as_str()))
            .collect();
        what.sort();
        assert_eq!(
            what,
            vec![
                ("obj3", "data checksum differs"),
                ("stray", "stray: the PG holds no such object")
            ]
        );
        let light = c.scrub(1, pg3.seed, ScrubMode::Light).await.unwrap();
        assert_eq!(light.findings_total, 1, "only the stray: {light:#?}");

        // A replica loses obj5.
        let (pg5, primary5, replica5) = placed("obj5");
        let lost = push("obj5", pg5, primary5, Version::ZERO, None);
        forge(reactor(replica5), &key, &format!("osd.{primary5}"), &lost).await;
        let expect5 = if pg5 == pg3 { 3 } else { 1 };
        let r = findings(&c, pg5.seed, expect5).await;
        assert!(
            r.findings
                .iter()
                .any(|f| f.oid == "obj5" && f.osd == replica5 && f.what == "missing"),
            "{r:#?}"
        );

        // Repair rewrites every bad copy and checks again; then every PG is clean, every
        // object reads back, and the PGs take writes.
        let mut damaged = vec![pg3.seed, pg5.seed];
        damaged.dedup();
        for seed in damaged {
            let r = c.scrub(1, seed, ScrubMode::Repair).await.unwrap();
            assert!(r.findings_total > 0, "{r:#?}");
            assert_eq!(r.unrepaired(), 0, "{r:#?}");
        }
        for seed in 0..pool.pg_num {
            let r = c.scrub(1, seed, ScrubMode::Deep).await.unwrap();
            assert_eq!(r.findings_total, 0, "pg seed {seed}: {r:#?}");
        }
        for i in 0..N {
            check(&c, i, 1).await;
            write(&c, i, 2).await.unwrap();
            check(&c, i, 2).await;
        }
    });
    // A new epoch that changes no acting set continues every interval: the replicas
    // activated in the old epoch still answer scrubs.
    let mut map = map.clone();
    next(&mut map, |_| {});
    for o in &mut osds {
        o.apply_map(map.clone()).unwrap();
    }
    carmine_reactor::block_on(async {
        let c = keyed_client(&map, Duration::from_secs(5), Some(key.clone())).await;
        for seed in 0..map.pools[0].pg_num {
            let r = c.scrub(1, seed, ScrubMode::Light).await.unwrap();
            assert_eq!((r.epoch, r.findings_total), (map.epoch, 0), "{r:#?}");
        }
    });
    for o in osds {
        o.shutdown().unwrap();
    }
}

/// The sum over `osds`' reactors of one of their counters.
#[test]
fn scheduled_deep_scrubs_find_a_bad_copy_on_their_own() {
    let _serial = one_at_a_time();
    let dir = TempDir::new("scheduled-scrub");
    let map = three_osd_map(1);
    let key = AuthKey::from_bytes([9; 32]);
    let schedule = ScrubSchedule {
        light: None,
        deep: Some(Duration::from_millis(300)),
    };
    let osds: Vec<Osd> = (0..3)
        .map(|id| start_with(id, &map, dir.path(), Some(key.clone()), schedule))
        .collect();
    wait_settled(&map, dir.path());
    let pool = &map.pools[0];
    let pg = map.object_pg(pool, "obj3");
    let acting = map.pg_osds(pg, pool.size);
    carmine_reactor::block_on(async {
        let c = keyed_client(&map, Duration::from_secs(20), Some(key.clone())).await;
        for i in 0..8 {
            write(&c, i, 1).await.unwrap();
        }
        let stale = PeerMessage {
            from: acting[0],
            from_inc: 1,
            to_inc: 0,
            pg,
            body: Body::Push {
                epoch: map.epoch,
                token: 1,
                oid: "obj3".into(),
                version: Version::new(1, 999),
                copy: Some(ObjectCopy::default()),
            },
        };
        let replica = map.osd(acting[1]).unwrap().reactors[0];
        forge(replica, &key, &format!("osd.{}", acting[0]), &stale).await;
        // Nobody asks: the primary's schedule finds it.
        let deadline = Instant::now() + Duration::from_secs(20);
        while total(&osds, |m| m.pgs_inconsistent()) != 1 {
            assert!(
                Instant::now() < deadline,
                "no scheduled scrub found the bad copy"
            );
            carmine_reactor::sleep(Duration::from_millis(50)).await;
        }
        assert!(total(&osds, |m| m.deep_scrubs()) > 0);
        // A repair (which may first meet a scheduled scrub of the PG in progress) clears it.
        let deadline = Instant::now() + Duration::from_secs(20);
        let r = loop {
            match c.scrub(1, pg.seed, ScrubMode::Repair).await {
                Ok(r) => break r,
                Err(e) if e.status() == Some(Status::Busy) && Instant::now() < deadline => {
                    carmine_reactor::sleep(Duration::from_millis(20)).await
                }
                Err(e) => panic!("repair: {e}"),
            }
        };
        assert_eq!((r.findings_total, r.unrepaired()), (1, 0), "{r:#?}");
        assert_eq!(total(&osds, |m| m.pgs_inconsistent()), 0);
        check(&c, 3, 1).await;
    });
    for o in osds {
        o.shutdown().unwrap();
    }
}

/// An OSD that restarts faster than the map notices (no new epoch) comes back as a member of
/// the same interval, empty: it answers the primary's writes with `NotActive`, the primary
/// sends it the interval's history, and it copies every object from the others while the
/// client keeps all of them in flight. The writes wait for it (it is in the acting set) and
/// then go on; every copy ends up the same.
#[test]
fn an_osd_restarted_within_its_interval_catches_up_while_writes_go_on() {
    log_if_asked();
    let _serial = one_at_a_time();
    let dir = TempDir::new("restart-in-interval");
    let map = three_osd_map(1);
    let mut osds: Vec<Option<Osd>> = (0..3).map(|id| Some(start(id, &map, dir.path()))).collect();
    const N: usize = 16;
    wait_settled(&map, dir.path());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let round = Arc::new(std::sync::atomic::AtomicU8::new(1));
    // A writer overwrites every object, round after round, all in flight at once.
    let writer = {
        let (map, stop, round) = (map.clone(), stop.clone(), round.clone());
        std::thread::spawn(move || {
            carmine_reactor::block_on(async move {
                let c = client(&map, Duration::from_secs(20)).await;
                let mut r = 1u8;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    r = r.wrapping_add(1).max(1);
                    let t = Instant::now();
                    let all = futures::future::join_all((0..N).map(|i| write(&c, i, r))).await;
                    for (i, res) in all.into_iter().enumerate() {
                        res.unwrap_or_else(|e| panic!("round {r}, obj{i}: {e}"));
                    }
                    assert!(
                        t.elapsed() < Duration::from_secs(15),
                        "round {r} took {:?}: the PGs are wedged",
                        t.elapsed()
                    );
                    round.store(r, std::sync::atomic::Ordering::Relaxed);
                }
                r
            })
        })
    };
    let rounds_done = |n: u8| {
        let from = round.load(std::sync::atomic::Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(30);
        while round
            .load(std::sync::atomic::Ordering::Relaxed)
            .wrapping_sub(from)
            < n
        {
            assert!(!writer.is_finished(), "the writer stopped");
            assert!(Instant::now() < deadline, "writes do not go on");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    rounds_done(3);
    // osd.2 restarts empty, and the map never says it was gone.
    osds[2].take().unwrap().shutdown().unwrap();
    osds[2] = Some(start(2, &map, dir.path()));
    rounds_done(20);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let last = writer.join().unwrap();
    // Every copy holds the last round: the primaries read theirs, and a deep scrub compares
    // them all.
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..N {
            check(&c, i, last).await;
        }
        for seed in 0..map.pools[0].pg_num {
            // No finding, on all three copies.
            let report = findings(&c, seed, 0).await;
            assert_eq!(report.acting.len(), 3, "pg {seed}: {report:?}");
        }
    });
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}

/// Objects of the background-recovery test: 256 KiB each, different per object and round.
fn big(i: usize, round: u8) -> Bytes {
    Bytes::from(
        (0..256 << 10)
            .map(|b: usize| (b / 4096 + i * 7 + round as usize * 31) as u8)
            .collect::<Vec<u8>>(),
    )
}

#[test]
fn a_copy_that_comes_back_empty_is_refilled_in_the_background_while_its_pgs_serve() {
    log_if_asked();
    let _serial = one_at_a_time();
    let dir = TempDir::new("background-recovery");
    let mut map = three_osd_map(1);
    // 1 MiB/s: the 16 MiB below would take ~16 s to copy back at that pace.
    let slow = RecoveryConfig {
        rate: Some(1 << 20),
        busy_rate: None,
        ..Default::default()
    };
    let start = |id: u32, map: &OsdMap| {
        start_recovering(id, map, dir.path(), None, Default::default(), slow)
    };
    let mut osds: Vec<Option<Osd>> = (0..3).map(|id| Some(start(id, &map))).collect();
    const N: usize = 64;
    wait_settled(&map, dir.path());
    let obj = |i: usize| format!("big{i}");
    let put = |c: &Client, i: usize, round: u8| {
        let (c, oid) = (c.clone(), obj(i));
        async move {
            c.execute(
                1,
                &oid,
                vec![OsdOp::WriteFull {
                    data: big(i, round),
                }],
            )
            .await
            .map(|_| ())
        }
    };
    let get = |c: &Client, i: usize| {
        let (c, oid) = (c.clone(), obj(i));
        async move {
            match &c
                .execute(1, &oid, vec![OsdOp::Read { off: 0, len: 0 }])
                .await
                .unwrap_or_else(|e| panic!("reading {oid}: {e}"))[..]
            {
                [OpOutput::Data(d)] => d.clone(),
                other => panic!("{other:?}"),
            }
        }
    };
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..N {
            put(&c, i, 1).await.unwrap();
        }
    });

    // osd.0 goes with its memory, and comes back empty.
    osd0_comes_back_empty(&mut osds, &mut map, dir.path(), |m| start(0, m));

    // Its PGs serve at once: every object reads back, and half are overwritten (each write
    // waits for osd.0 to hold its object, which it fetches first, whatever the rate).
    let began = Instant::now();
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..N {
            assert_eq!(get(&c, i).await, big(i, 1), "{} of round 1", obj(i));
        }
        for i in (0..N).step_by(2) {
            put(&c, i, 2).await.unwrap();
        }
    });
    let served_in = began.elapsed();
    // Served while recovery was still going on: the copy still lacked objects.
    std::thread::sleep(Duration::from_millis(300));
    let lacking: u64 = osds
        .iter()
        .flatten()
        .flat_map(|o| o.metrics_sources())
        .map(|r| r.metrics.objects_to_recover())
        .sum();
    assert!(
        lacking > 0,
        "osd.0 was refilled in {served_in:?}, before the reads and writes ended: \
         the test shows nothing of background recovery"
    );
    eprintln!(
        "served {N} reads and {} writes in {served_in:?} with {lacking} objects still to recover",
        N / 2
    );

    // It completes: the PGs settle on the three copies.
    wait_settled(&map, dir.path());
    let recovered: u64 = osds
        .iter()
        .flatten()
        .flat_map(|o| o.metrics_sources())
        .map(|r| r.metrics.recovered_objects())
        .sum();
    assert!(recovered >= N as u64, "{recovered} objects recovered");

    // osd.0 alone (min_size 1) holds every object, the overwritten ones at round 2.
    only_osd0_left(&mut osds, &mut map, dir.path());
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..N {
            let round = if i % 2 == 0 { 2 } else { 1 };
            assert_eq!(
                get(&c, i).await,
                big(i, round),
                "{} of round {round}",
                obj(i)
            );
        }
    });
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}

/// The name of the `i`th object written by [`one_pg_with_osd0_back_empty`].
fn big_name(i: usize) -> String {
    format!("big{i}")
}

/// Three OSDs recovering with `recovery`, a pool of one PG, `n` objects of 256 KiB written
/// ([`big_name`], [`big`] of round 1); then osd.0 goes and comes back empty, its new map
/// handed out (not waited for).
fn one_pg_with_osd0_back_empty(
    dir: &std::path::Path,
    recovery: RecoveryConfig,
    n: usize,
) -> (Vec<Option<Osd>>, OsdMap) {
    let mut map = three_osd_map(1);
    map.pools[0].pg_num = 1;
    let start =
        |id: u32, map: &OsdMap| start_recovering(id, map, dir, None, Default::default(), recovery);
    let mut osds: Vec<Option<Osd>> = (0..3).map(|id| Some(start(id, &map))).collect();
    wait_settled(&map, dir);
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..n {
            c.execute(1, &big_name(i), vec![OsdOp::WriteFull { data: big(i, 1) }])
                .await
                .unwrap();
        }
    });
    osd0_comes_back_empty(&mut osds, &mut map, dir, |m| start(0, m));
    (osds, map)
}

/// A metric of osd.0's, summed over its reactors.
fn osd0_sum(osds: &[Option<Osd>], f: fn(&carmine_osd::ReactorMetrics) -> u64) -> u64 {
    let osd0 = osds[0].as_ref().expect("osd.0 runs");
    osd0.metrics_sources().iter().map(|r| f(&r.metrics)).sum()
}

#[test]
fn one_pg_recovers_several_objects_at_once_and_never_more_than_its_reactor_allows() {
    log_if_asked();
    let _serial = one_at_a_time();
    let dir = TempDir::new("recovery-max-active");
    // One PG: before, its objects came back one after the other, whatever the reactor had.
    const MAX_ACTIVE: usize = 3;
    const N: usize = 48;
    let (mut osds, mut map) = one_pg_with_osd0_back_empty(
        dir.path(),
        RecoveryConfig {
            rate: None,
            busy_rate: None,
            max_active: MAX_ACTIVE,
            ..Default::default()
        },
        N,
    );
    let obj = big_name;
    let sum = |f: fn(&carmine_osd::ReactorMetrics) -> u64| osd0_sum(&osds, f);
    let deadline = Instant::now() + Duration::from_secs(30);
    while sum(carmine_osd::ReactorMetrics::recovered_objects) < N as u64 {
        assert!(
            Instant::now() < deadline,
            "osd.0 recovered {} of {N} objects in 30 s",
            sum(carmine_osd::ReactorMetrics::recovered_objects)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Objects fetched or being stored at the same moment, the most there were.
    let most = sum(carmine_osd::ReactorMetrics::recoveries_active_most);
    eprintln!("at most {most} objects recovered at once");
    assert!(most >= 2, "one PG's objects were recovered one at a time");
    assert!(
        most <= MAX_ACTIVE as u64,
        "{most} objects recovered at once, past the bound of {MAX_ACTIVE}"
    );
    // It completes, and what came back is what was written.
    wait_settled(&map, dir.path());
    only_osd0_left(&mut osds, &mut map, dir.path());
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..N {
            let got = c
                .execute(1, &obj(i), vec![OsdOp::Read { off: 0, len: 0 }])
                .await
                .unwrap();
            assert!(
                matches!(&got[..], [OpOutput::Data(d)] if *d == big(i, 1)),
                "{} read back wrong",
                obj(i)
            );
        }
    });
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}

/// Writes to several objects a copy lacks, all at once, while its recovery slots are held by
/// background copies that the rate holds back: the objects clients wait for are fetched side
/// by side, past the bound, up to as many again as it allows — not a slot's worth at a time
/// (a copy back on a new disk under random writes fetched them so while the writes waited).
#[test]
fn objects_clients_wait_for_are_fetched_side_by_side_past_the_bound() {
    log_if_asked();
    let _serial = one_at_a_time();
    let dir = TempDir::new("urgent-side-by-side");
    // One slot, and a budget of one byte a second: the background takes one object, then
    // waits for ever, holding the slot. (Enough writes that the worker past the bound is
    // still at them when the one in the slot sees them: it looks every 10 ms.)
    const N: usize = 30;
    const WAITED: usize = 24;
    const MAX_ACTIVE: usize = 1;
    let (osds, map) = one_pg_with_osd0_back_empty(
        dir.path(),
        RecoveryConfig {
            rate: Some(1),
            busy_rate: None,
            max_active: MAX_ACTIVE,
            ..Default::default()
        },
        N,
    );
    let obj = big_name;
    let sum = |f: fn(&carmine_osd::ReactorMetrics) -> u64| osd0_sum(&osds, f);
    // The background's one object (on the first second's budget), then nothing more.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sum(carmine_osd::ReactorMetrics::objects_to_recover) < (N - 1) as u64 {
        assert!(Instant::now() < deadline, "osd.0 never took the history");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300));
    let before = sum(carmine_osd::ReactorMetrics::recovered_objects);
    assert!(
        before <= 1,
        "{before} objects recovered at one byte a second"
    );
    // Writes at once, each to an object osd.0 lacks: each waits for osd.0 to fetch it.
    let took = carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        // (Its first request finds its way to the OSDs, a restarted one included.)
        c.execute(1, &obj(0), vec![OsdOp::Stat]).await.unwrap();
        let began = Instant::now();
        let writes = (N - WAITED..N).map(|i| {
            let c = &c;
            async move {
                c.execute(1, &obj(i), vec![OsdOp::WriteFull { data: big(i, 2) }])
                    .await
                    .unwrap()
            }
        });
        futures::future::join_all(writes).await;
        began.elapsed()
    });
    let most = sum(carmine_osd::ReactorMetrics::recoveries_active_most);
    eprintln!(
        "{WAITED} writes to objects osd.0 lacked took {took:?}; at most {most} fetched at once"
    );
    // Before, the PG's worker took them, one at a time.
    assert!(
        most > MAX_ACTIVE as u64,
        "objects clients waited for were fetched {most} at a time, behind the slots"
    );
    // Past the bound, as many again at most: each is a copy in memory.
    assert!(
        most <= 2 * MAX_ACTIVE as u64,
        "{most} objects fetched at once, with {MAX_ACTIVE} slots"
    );
    // What was written is what reads back. (osd.0 could not serve alone: it still lacks the
    // other objects, which no other OSD would be left to send.)
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in N - WAITED..N {
            let got = c
                .execute(1, &obj(i), vec![OsdOp::Read { off: 0, len: 0 }])
                .await
                .unwrap();
            assert!(
                matches!(&got[..], [OpOutput::Data(d)] if *d == big(i, 2)),
                "{} read back wrong",
                obj(i)
            );
        }
    });
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}

/// The sum over `osds`' reactors of the objects their PGs cannot find.
fn unfound(osds: &[Option<Osd>]) -> u64 {
    osds.iter()
        .flatten()
        .flat_map(|o| o.metrics_sources())
        .map(|r| r.metrics.objects_unfound())
        .sum()
}

/// The sum over `osds`' reactors of the PGs waiting as incomplete.
fn incomplete(osds: &[Option<Osd>]) -> u64 {
    osds.iter()
        .flatten()
        .flat_map(|o| o.metrics_sources())
        .map(|r| r.metrics.pgs_incomplete())
        .sum()
}

/// The sum over `osds`' reactors of the PGs waiting for down OSDs.
fn down(osds: &[Option<Osd>]) -> u64 {
    osds.iter()
        .flatten()
        .flat_map(|o| o.metrics_sources())
        .map(|r| r.metrics.pgs_down())
        .sum()
}

/// Waits up to 10 s for `count(osds)` to be `want`.
async fn until_counted(
    osds: &[Option<Osd>],
    what: &str,
    count: fn(&[Option<Osd>]) -> u64,
    want: u64,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(osds) != want {
        assert!(
            Instant::now() < deadline,
            "{} PGs counted {what}, not {want}",
            count(osds)
        );
        carmine_reactor::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads `obj{i}` and expects the PG to refuse it as inactive (after the client's retries).
async fn refused_as_inactive(c: &Client, i: usize) {
    let got = c
        .execute(1, &format!("obj{i}"), vec![OsdOp::Read { off: 0, len: 0 }])
        .await;
    assert!(
        matches!(&got, Err(ClientError::Unavailable { last, .. })
            if last.status() == Some(Status::PgInactive)),
        "obj{i} was served by a PG that waits for a copy: {got:?}"
    );
}

#[test]
fn objects_whose_every_holder_lost_its_disk_are_reported_unfound_and_never_served_empty() {
    log_if_asked();
    let _serial = one_at_a_time();
    let dir = TempDir::new("unfound");
    let mut map = three_osd_map(1);
    // osd.2 comes back to copy nothing in the background (one byte a second).
    let start = |id: u32, map: &OsdMap, rate: Option<u64>| {
        start_recovering(
            id,
            map,
            dir.path(),
            None,
            Default::default(),
            RecoveryConfig {
                rate,
                busy_rate: None,
                ..Default::default()
            },
        )
    };
    let mut osds: Vec<Option<Osd>> = (0..3).map(|id| Some(start(id, &map, None))).collect();
    const N: usize = 16;
    wait_settled(&map, dir.path());
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..N {
            write(&c, i, 1).await.unwrap();
        }
    });
    // osd.2 loses its disk and comes back empty; its PGs serve while it lacks everything.
    osds[2].take().unwrap().shutdown().unwrap();
    next(&mut map, |m| m.osds[2].up = false);
    publish(&mut osds, &map, dir.path());
    osds[2] = Some(start(2, &map, Some(1)));
    next(&mut map, |m| m.osds[2].up = true);
    hand_out(&mut osds, &map);
    let deadline = Instant::now() + Duration::from_secs(10);
    let lacking = |o: &Osd| -> u64 {
        o.metrics_sources()
            .iter()
            .map(|r| r.metrics.objects_to_recover())
            .sum()
    };
    let recovered = |o: &Osd| -> u64 {
        o.metrics_sources()
            .iter()
            .map(|r| r.metrics.recovered_objects())
            .sum()
    };
    // Every PG's history, not just the first one's: a PG that had not activated on osd.2
    // when the other two lose their disks has no copy left that even names its objects (it
    // waits as incomplete: the next test).
    while lacking(osds[2].as_ref().unwrap()) + recovered(osds[2].as_ref().unwrap()) < N as u64 {
        assert!(
            Instant::now() < deadline,
            "osd.2 never took every PG's history"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Then the two OSDs that hold the data lose their disks too, and come back empty. (At
    // its rate, osd.2 fetched at most the one object its first second's budget allowed.)
    let fetched = recovered(osds[2].as_ref().unwrap());
    assert!(
        fetched <= 1,
        "osd.2 fetched {fetched} objects at one byte a second"
    );
    let lost = N as u64 - fetched;
    for id in [0, 1] {
        osds[id].take().unwrap().shutdown().unwrap();
    }
    next(&mut map, |m| {
        m.osds[0].up = false;
        m.osds[1].up = false;
        m.pools[0].min_size = 1;
    });
    hand_out(&mut osds, &map);
    for id in [0, 1] {
        osds[id as usize] = Some(start(id, &map, None));
    }
    next(&mut map, |m| {
        m.osds[0].up = true;
        m.osds[1].up = true;
    });
    hand_out(&mut osds, &map);
    // osd.2's copy names every object and holds none, and no OSD holds them: the PGs wait
    // and say how many objects they cannot find, rather than serve them empty. (Within
    // seconds here; one CI run of 2026-11-25 still had 5 of 15 reported after 10 s, not
    // reproduced in isolation: the limit is generous, and the time it took is printed.)
    let began = Instant::now();
    let deadline = began + Duration::from_secs(30);
    while unfound(&osds) != lost {
        assert!(
            Instant::now() < deadline,
            "{} objects reported unfound, {lost} lost",
            unfound(&osds)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "{lost} objects reported unfound after {:?}",
        began.elapsed()
    );
    // A read is refused, or — in a PG none of whose objects is unfound (the one object
    // osd.2 fetched may be alone in its PG) — answered with the right bytes; never empty.
    let served = carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_millis(800)).await;
        let mut served = 0;
        for i in 0..N {
            let got = c
                .execute(1, &format!("obj{i}"), vec![OsdOp::Read { off: 0, len: 0 }])
                .await;
            match &got {
                Err(ClientError::Unavailable { last, .. })
                    if last.status() == Some(Status::PgInactive) => {}
                Ok(out) if matches!(&out[..], [OpOutput::Data(d)] if *d == data(i, 1)) => {
                    served += 1
                }
                other => panic!("obj{i}: {other:?}"),
            }
        }
        served
    });
    assert!(
        served <= fetched,
        "{served} objects served, but osd.2 held only {fetched}"
    );
    // The operator gives the lost objects up (`carmine pg mark-unfound-lost`): their PGs go
    // active without them; the lost ones read as absent, the others as written, and a lost
    // object can be written again.
    let pg_num = map.pools[0].pg_num;
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(10)).await;
        let mut given_up = 0;
        for seed in 0..pg_num {
            match c.mark_unfound_lost(1, seed).await {
                Ok(n) => given_up += n,
                Err(e) if e.status() == Some(Status::InvalidArgument) => {}
                Err(e) => panic!("pg 1.{seed:x}: {e}"),
            }
        }
        assert_eq!(given_up, lost, "objects given up");
        let deadline = Instant::now() + Duration::from_secs(20);
        let (mut absent, mut intact) = (0, 0);
        for i in 0..N {
            loop {
                let got = c
                    .execute(1, &format!("obj{i}"), vec![OsdOp::Read { off: 0, len: 0 }])
                    .await;
                match &got {
                    Err(e) if e.status() == Some(Status::ObjectNotFound) => absent += 1,
                    Ok(out) if matches!(&out[..], [OpOutput::Data(d)] if *d == data(i, 1)) => {
                        intact += 1
                    }
                    Err(ClientError::Unavailable { last, .. })
                        if last.status() == Some(Status::PgInactive)
                            && Instant::now() < deadline =>
                    {
                        continue
                    }
                    other => panic!("obj{i} after giving up: {other:?}"),
                }
                break;
            }
        }
        assert_eq!(
            (absent, intact),
            (lost, fetched),
            "(absent, intact) objects"
        );
        for i in 0..N {
            write(&c, i, 2).await.unwrap();
        }
        for i in 0..N {
            let got = c
                .execute(1, &format!("obj{i}"), vec![OsdOp::Read { off: 0, len: 0 }])
                .await
                .unwrap();
            assert!(
                matches!(&got[..], [OpOutput::Data(d)] if *d == data(i, 2)),
                "obj{i}"
            );
        }
    });
    // The gauge follows at the OSDs' next PG-state pass.
    let deadline = Instant::now() + Duration::from_secs(10);
    while unfound(&osds) != 0 {
        assert!(
            Instant::now() < deadline,
            "{} unfound objects left after giving them up",
            unfound(&osds)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}

/// An object whose copy — data and omap — is larger than one frame: recovery sends it to a
/// copy that came back empty in parts (it used to refuse it, and the PG never healed).
#[test]
fn an_object_larger_than_a_frame_with_its_omap_is_recovered_in_parts() {
    log_if_asked();
    let _serial = one_at_a_time();
    let dir = TempDir::new("recovery-in-parts");
    let mut map = three_osd_map(1);
    let mut osds: Vec<Option<Osd>> = (0..3).map(|id| Some(start(id, &map, dir.path()))).collect();
    wait_settled(&map, dir.path());
    let data = Bytes::from(
        (0..15usize << 20)
            .map(|b| (b / 4096 + b % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    // 80 values of 64 KiB: 5 MiB of omap, so the copy is ~20 MiB against a 16.25 MiB frame.
    let kvs: Vec<(Bytes, Bytes)> = (0..80u8)
        .map(|k| {
            (
                Bytes::from(format!("key{k:03}")),
                Bytes::from(vec![k; 64 << 10]),
            )
        })
        .collect();
    assert!(data.len() + 80 * (64 << 10) > carmine_proto::FRAME_PAYLOAD_MAX as usize);
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        c.execute(1, "huge", vec![OsdOp::WriteFull { data: data.clone() }])
            .await
            .unwrap();
        for chunk in kvs.chunks(40) {
            c.execute(
                1,
                "huge",
                vec![OsdOp::OmapSet {
                    kvs: chunk.to_vec(),
                }],
            )
            .await
            .unwrap();
        }
    });

    // osd.0 goes with its memory and comes back empty: its PG of "huge" settles on three
    // copies only once osd.0 holds the object again.
    osd0_comes_back_empty(&mut osds, &mut map, dir.path(), |m| start(0, m, dir.path()));
    wait_settled(&map, dir.path());

    // osd.0 alone (min_size 1) holds it whole.
    only_osd0_left(&mut osds, &mut map, dir.path());
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        let out = c
            .execute(1, "huge", vec![OsdOp::Read { off: 0, len: 0 }])
            .await
            .unwrap();
        let [OpOutput::Data(got)] = &out[..] else {
            panic!("{out:?}")
        };
        assert!(got == &data, "the recovered data differs");
        let keys: Vec<Bytes> = kvs.iter().map(|(k, _)| k.clone()).collect();
        let out = c
            .execute(1, "huge", vec![OsdOp::OmapGetVals { keys }])
            .await
            .unwrap();
        let [OpOutput::Omap { entries, .. }] = &out[..] else {
            panic!("{out:?}")
        };
        assert_eq!(entries.len(), kvs.len());
        assert!(entries == &kvs, "the recovered omap differs");
    });
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}

/// A PG of 300K objects, whose listing (~19 MiB) passes a frame: a copy that comes back empty
/// is sent the listing in parts at activation and learns what it must fetch. Slow (a minute
/// or two): `cargo test --release -p carmine-osd --test replication -- --ignored`.
#[test]
#[ignore = "slow: 300K objects; run by hand with --ignored"]
fn a_pg_whose_listing_passes_a_frame_peers_with_it_in_parts() {
    use futures::StreamExt;
    log_if_asked();
    let _serial = one_at_a_time();
    let dir = TempDir::new("big-pg");
    let mut map = three_osd_map(1);
    map.pools[0].pg_num = 1;
    let start = |id: u32, map: &OsdMap| {
        Osd::start(OsdConfig {
            reactor_cpus: vec![None],
            pg_history: Some(Arc::new(LocalPgHistory::new(dir.path()))),
            ..OsdConfig::in_memory(id, map.clone(), 2 << 30)
        })
        .unwrap()
    };
    let mut osds: Vec<Option<Osd>> = (0..3).map(|id| Some(start(id, &map))).collect();
    wait_settled(&map, dir.path());
    const N: usize = 300_000;
    // Names as long as a volume's data objects: ~63 bytes of listing each.
    let name = |i: usize| format!("carmine_data.0123456789abcdef.{i:016x}");
    let began = Instant::now();
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(30)).await;
        futures::stream::iter(0..N)
            .map(|i| {
                let c = c.clone();
                async move {
                    c.execute(
                        1,
                        name(i),
                        vec![OsdOp::Write {
                            off: 0,
                            data: Bytes::from_static(b"x"),
                        }],
                    )
                    .await
                    .unwrap()
                }
            })
            .buffer_unordered(256)
            .for_each(|_| async {})
            .await;
    });
    eprintln!("{N} objects written in {:?}", began.elapsed());

    osd0_comes_back_empty(&mut osds, &mut map, dir.path(), |m| start(0, m));
    // The empty copy took the activation (its listing in parts): it knows it lacks them all.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let lacking: u64 = osds[0]
            .as_ref()
            .unwrap()
            .metrics_sources()
            .iter()
            .map(|r| r.metrics.objects_to_recover())
            .sum();
        let recovered: u64 = osds[0]
            .as_ref()
            .unwrap()
            .metrics_sources()
            .iter()
            .map(|r| r.metrics.recovered_objects())
            .sum();
        if lacking + recovered >= N as u64 {
            eprintln!("osd.0 lacks {lacking}, recovered {recovered}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "osd.0 never took the PG's listing: lacks {lacking}, recovered {recovered}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(30)).await;
        for i in [0, N / 2, N - 1] {
            let out = c
                .execute(1, name(i), vec![OsdOp::Read { off: 0, len: 0 }])
                .await
                .unwrap();
            assert!(matches!(&out[..], [OpOutput::Data(d)] if &d[..] == b"x"));
        }
    });
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}

/// Every OSD that held the PGs' objects loses its disk before the third copy took any
/// history: peering hears only empty copies, which vouch for no interval they were in, so the
/// PGs wait instead of going active empty — reads are refused, never answered "absent" —
/// until the operator gives the lost writes up; then the objects read as absent.
#[test]
fn pgs_whose_every_copy_came_back_empty_wait_for_the_operator() {
    log_if_asked();
    let _serial = one_at_a_time();
    let dir = TempDir::new("all-lost");
    let mut map = three_osd_map(1);
    let mut osds: Vec<Option<Osd>> = (0..3).map(|id| Some(start(id, &map, dir.path()))).collect();
    const N: usize = 16;
    wait_settled(&map, dir.path());
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..N {
            write(&c, i, 1).await.unwrap();
        }
    });
    osds[2].take().unwrap().shutdown().unwrap();
    next(&mut map, |m| m.osds[2].up = false);
    publish(&mut osds, &map, dir.path());
    // osd.0 and osd.1 lose their disks while osd.2 is still away; all three come back empty.
    for id in [0, 1] {
        osds[id].take().unwrap().shutdown().unwrap();
    }
    next(&mut map, |m| {
        m.osds[0].up = false;
        m.osds[1].up = false;
    });
    hand_out(&mut osds, &map);
    for id in 0..3 {
        osds[id as usize] = Some(start(id, &map, dir.path()));
    }
    next(&mut map, |m| {
        for o in &mut m.osds {
            o.up = true;
        }
    });
    hand_out(&mut osds, &map);
    std::thread::sleep(Duration::from_secs(2));
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_millis(800)).await;
        for i in 0..N {
            refused_as_inactive(&c, i).await;
        }
        // Every PG counts as incomplete (status says HEALTH_ERR), and none as unfound: their
        // copies name no object.
        let pgs = map.pools[0].pg_num as u64;
        until_counted(&osds, "incomplete", incomplete, pgs).await;
        assert_eq!(unfound(&osds), 0);
        // The operator gives them up: every PG goes active without them.
        let c = client(&map, Duration::from_secs(10)).await;
        for seed in 0..map.pools[0].pg_num {
            match c.mark_unfound_lost(1, seed).await {
                Ok(_) => {}
                Err(e) => panic!("pg 1.{seed:x}: {e}"),
            }
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for i in 0..N {
            loop {
                let got = c
                    .execute(1, &format!("obj{i}"), vec![OsdOp::Read { off: 0, len: 0 }])
                    .await;
                match &got {
                    Err(e) if e.status() == Some(Status::ObjectNotFound) => break,
                    _ => {
                        assert!(Instant::now() < deadline, "obj{i}: {got:?}");
                        carmine_reactor::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }
        while incomplete(&osds) != 0 {
            assert!(Instant::now() < deadline, "PGs still counted incomplete");
            carmine_reactor::sleep(Duration::from_millis(50)).await;
        }
    });
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}

#[test]
fn a_pg_waiting_for_an_osd_whose_disk_is_gone_goes_on_once_it_is_declared_lost() {
    log_if_asked();
    let _serial = one_at_a_time();
    let dir = TempDir::new("declared-lost");
    let mut map = three_osd_map(1);
    let mut osds: Vec<Option<Osd>> = (0..3).map(|id| Some(start(id, &map, dir.path()))).collect();
    const N: usize = 16;
    wait_settled(&map, dir.path());
    // osd.2 goes away; the PGs settle on osd.0 and osd.1, which alone take round 2.
    osds[2].take().unwrap().shutdown().unwrap();
    next(&mut map, |m| m.osds[2].up = false);
    publish(&mut osds, &map, dir.path());
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(20)).await;
        for i in 0..N {
            write(&c, i, 2).await.unwrap();
        }
    });
    // osd.0 loses its disk and osd.1 never comes back; osd.2 returns (empty: a memory store).
    for id in [0, 1] {
        osds[id].take().unwrap().shutdown().unwrap();
    }
    next(&mut map, |m| {
        m.osds[0].up = false;
        m.osds[1].up = false;
    });
    hand_out(&mut osds, &map);
    for id in [0, 2] {
        osds[id as usize] = Some(start(id, &map, dir.path()));
    }
    next(&mut map, |m| {
        m.osds[0].up = true;
        m.osds[2].up = true;
    });
    hand_out(&mut osds, &map);
    carmine_reactor::block_on(async {
        // Every PG waits for osd.1, the only one that may hold round 2: "down", not
        // incomplete (osd.1 may come back with it), and a give-up does not pass it.
        let pgs = u64::from(map.pools[0].pg_num);
        until_counted(&osds, "down", down, pgs).await;
        assert_eq!(incomplete(&osds), 0);
        let c = client(&map, Duration::from_millis(800)).await;
        for i in 0..N {
            refused_as_inactive(&c, i).await;
        }
        let c = client(&map, Duration::from_secs(10)).await;
        for seed in 0..map.pools[0].pg_num {
            let _ = c.mark_unfound_lost(1, seed).await;
        }
        carmine_reactor::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            down(&osds),
            pgs,
            "a give-up passed an OSD that may come back"
        );
    });
    // The operator declares osd.1 lost (`carmine osd lost 1`): down, out, lost in this epoch.
    next(&mut map, |m| {
        let epoch = m.epoch;
        let o = &mut m.osds[1];
        o.lost_at = epoch;
        o.in_ = false;
    });
    hand_out(&mut osds, &map);
    carmine_reactor::block_on(async {
        // Every member of the interval has answered now: the PGs are incomplete, and wait
        // for the operator's give-up, which lets them go on without round 2.
        let pgs = u64::from(map.pools[0].pg_num);
        until_counted(&osds, "incomplete", incomplete, pgs).await;
        assert_eq!(down(&osds), 0);
        let c = client(&map, Duration::from_millis(800)).await;
        refused_as_inactive(&c, 0).await;
        let c = client(&map, Duration::from_secs(10)).await;
        for seed in 0..map.pools[0].pg_num {
            c.mark_unfound_lost(1, seed)
                .await
                .unwrap_or_else(|e| panic!("pg 1.{seed:x}: {e}"));
        }
        until_counted(&osds, "incomplete", incomplete, 0).await;
        for i in 0..N {
            let got = c
                .execute(1, &format!("obj{i}"), vec![OsdOp::Read { off: 0, len: 0 }])
                .await;
            assert!(
                matches!(&got, Err(e) if e.status() == Some(Status::ObjectNotFound)),
                "obj{i}: {got:?}"
            );
            write(&c, i, 3).await.unwrap();
            check(&c, i, 3).await;
        }
    });
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}

/// A write whose replica is gone while the map still has it up (nobody marked it down) is
/// answered "in doubt" once the ack wait is over, so its client gives up within its own
/// patience instead of waiting forever; once the map moves on, the PG serves again.
#[test]
fn a_write_whose_replica_vanished_unnoticed_is_answered_in_doubt_not_held_forever() {
    let _serial = one_at_a_time();
    log_if_asked();
    let dir = TempDir::new("ack-wait");
    let mut map = three_osd_map(1);
    let mut osds = start_tuned(&map, dir.path(), |c| OsdConfig {
        write_ack_wait: Duration::from_millis(500),
        ..c
    });
    wait_settled(&map, dir.path());
    // An object whose primary is not osd.2, the OSD that goes.
    let oid = object_not_led_by(&map, 2, "w");
    let body = Bytes::from(vec![7u8; 4096]);
    // Active first (a new primary waits out its members' earlier leases).
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(10)).await;
        c.execute(1, &oid, vec![OsdOp::WriteFull { data: body.clone() }])
            .await
            .unwrap();
    });
    osds[2].take().unwrap().shutdown().unwrap();
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(2)).await;
        let started = Instant::now();
        let put = c.execute(1, &oid, vec![OsdOp::WriteFull { data: body.clone() }]);
        let err = carmine_reactor::timeout(Duration::from_secs(15), put)
            .await
            .expect("a write its replica never acknowledged held its client for 15 s")
            .unwrap_err();
        eprintln!("after {:?}: {err}", started.elapsed());
        assert!(err.to_string().contains("in doubt"), "{err}");
    });
    let timeouts: u64 = osds
        .iter()
        .flatten()
        .flat_map(|o| o.metrics_sources())
        .map(|r| r.metrics.write_ack_timeouts())
        .sum();
    assert!(timeouts >= 1, "no write counted as timed out");
    // The map notices: the PG peers without osd.2 and takes writes again.
    next(&mut map, |m| m.osds[2].up = false);
    publish(&mut osds, &map, dir.path());
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(10)).await;
        c.execute(1, &oid, vec![OsdOp::WriteFull { data: body.clone() }])
            .await
            .unwrap();
        assert_eq!(c.read(1, &oid, 0, 0).await.unwrap(), body);
    });
    for o in osds.into_iter().flatten() {
        o.shutdown().unwrap();
    }
}

/// A scrub holds back the writes to the objects of the chunk it compares, and only those.
/// Here an object that sorts first (so it is in the first chunk only, with seven objects of
/// 1 MiB that make that chunk long) is written over and over while a deep scrub walks its PG
/// chunk by chunk: exactly one of those writes waits (the one that meets the first chunk),
/// the others go on while later chunks are compared, and the scrub finds nothing amiss.
/// (A scrub that held the whole PG per chunk let about one write through in all.)
#[test]
fn a_scrub_holds_back_only_the_writes_to_the_chunk_it_compares() {
    let _serial = one_at_a_time();
    log_if_asked();
    let dir = TempDir::new("scrub-range");
    let map = three_osd_map(1);
    let no_schedule = ScrubSchedule {
        light: None,
        deep: None,
    };
    let osds: Vec<Osd> = (0..3)
        .map(|id| start_with(id, &map, dir.path(), None, no_schedule))
        .collect();
    wait_settled(&map, dir.path());
    let pool = &map.pools[0];
    let first = "!first";
    let pg = map.object_pg(pool, first);
    let others: Vec<String> = (0..10_000)
        .map(|i| format!("o{i}"))
        .filter(|oid| map.object_pg(pool, oid) == pg)
        .take(200)
        .collect();
    let beside_first: Vec<String> = (0..10_000)
        .map(|i| format!("!g{i}"))
        .filter(|oid| map.object_pg(pool, oid) == pg)
        .take(7)
        .collect();
    let small = Bytes::from(vec![5u8; 256 << 10]);
    let big = Bytes::from(vec![6u8; 1 << 20]);
    carmine_reactor::block_on(async {
        let c = client(&map, Duration::from_secs(10)).await;
        let sized = others
            .iter()
            .map(|o| (o.as_str(), &small))
            .chain([(first, &small)])
            .chain(beside_first.iter().map(|o| (o.as_str(), &big)));
        for (oid, data) in sized {
            let data = data.clone();
            c.execute(1, oid, vec![OsdOp::WriteFull { data }])
                .await
                .unwrap();
        }
        let done = std::cell::Cell::new(false);
        let writes = std::cell::Cell::new(0u64);
        let scrub = async {
            let r = c.scrub(1, pg.seed, ScrubMode::Deep).await;
            done.set(true);
            r
        };
        let writer = async {
            while !done.get() {
                let data = Bytes::from(vec![writes.get() as u8; 4096]);
                c.execute(1, first, vec![OsdOp::WriteFull { data }])
                    .await
                    .unwrap();
                writes.set(writes.get() + 1);
            }
        };
        let (report, ()) = futures::join!(scrub, writer);
        let report = report.unwrap();
        assert_eq!(report.findings_total, 0, "{report:#?}");
        assert_eq!(report.objects, others.len() as u64 + 8);
        let held = total(&osds, |m| m.writes_held_by_scrub());
        eprintln!(
            "{} writes to {first} during a deep scrub of {} objects; {held} waited for it",
            writes.get(),
            report.objects
        );
        assert!(writes.get() >= 3, "the scrub ended before the writes began");
        assert_eq!(
            held, 1,
            "writes to {first} that waited for the scrub's chunks"
        );
    });
    for o in osds {
        o.shutdown().unwrap();
    }
}
